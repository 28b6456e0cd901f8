"""Connecting to a Ray cluster, and what one worker slot of it is (a GPU, or a CPU where the
cluster has no GPU)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "RAY_MISSING",
    "ClusterError",
    "SlotPlan",
    "connected",
    "require_ray",
    "slot_plan",
    "slot_placement",
]

RAY_MISSING = 'Ray is not installed; install the extra: pip install "flashtune[ray]"'


class ClusterError(RuntimeError):
    """The cluster cannot be reached or used (no ray, a wrong address, no slot)."""


def require_ray() -> ModuleType:
    """The ray module; ClusterError saying how to install it when it is missing."""
    try:
        import ray
    except ImportError:
        raise ClusterError(RAY_MISSING) from None
    return ray


@contextlib.contextmanager
def connected(address: str) -> Iterator[ModuleType]:
    """Ray, connected to the cluster at `address` for the duration of the block:
    'local' starts a cluster of this machine alone, 'auto' joins the one `ray start` runs
    here (or $RAY_ADDRESS), 'host:port' (or 'ray://host:port') a remote head node.
    A session the caller already opened (a notebook, the tests) is used and left open."""
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    _check_reachable(address)
    try:
        # Worker output would tear through the progress display: a worker's errors come back
        # in its traces and exceptions instead.
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"--ray {address}: cannot connect to a Ray cluster: {exc}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """ClusterError when a 'host:port' address does not accept a connection: Ray itself
    retries an unreachable head for minutes before it gives up."""
    if address in ("local", "auto"):
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--ray {address}: expected 'local', 'auto' or 'host:port'")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ClusterError(
            f"--ray {address}: no Ray head node answers there ({exc}); on the head node, "
            "`ray start --head` prints the address to use"
        ) from None


@dataclass(frozen=True)
class SlotPlan:
    """How many worker actors the cluster holds and what each reserves."""

    count: int
    on_gpu: bool

    def actor_options(self) -> dict[str, Any]:
        # One GPU each where there are GPUs (Ray then makes it the actor's only visible one);
        # else one CPU each, so that a CPU cluster runs as many workers as it has cores.
        return {"num_gpus": 1, "num_cpus": 0} if self.on_gpu else {"num_cpus": 1}


def slot_plan(ray: ModuleType, limit: int | None = None) -> SlotPlan:
    """One slot per GPU of the cluster; one per CPU when it has no GPU; at most `limit`."""
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    count, on_gpu = (gpus, True) if gpus else (int(resources.get("CPU", 0)), False)
    if limit is not None:
        count = min(count, limit)
    if count < 1:
        raise ClusterError(f"the Ray cluster has no GPU and no CPU to run on: {resources}")
    return SlotPlan(count, on_gpu)


def slot_placement(ray: ModuleType) -> dict[str, Any]:
    """Where the calling actor runs: its Ray node id and its GPU's index on that node (None
    on a CPU slot); the host name and GPU name are in `platform.snapshot` already."""
    gpu_ids = ray.get_gpu_ids()
    index: int | str | None = None
    if gpu_ids:  # an index, or a UUID where the node names its GPUs (MIG) that way
        index = int(gpu_ids[0]) if str(gpu_ids[0]).isdigit() else str(gpu_ids[0])
    return {"node_id": ray.get_runtime_context().get_node_id(), "gpu_index": index}

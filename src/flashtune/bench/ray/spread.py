"""Jobs spread over a Ray cluster's GPUs of one kind, one actor per GPU, each job function
running with a file of its slot's own (`flashtune tune --ray`: an autotune cache per GPU,
merged by the caller with the existing merge).

The job function is passed by reference (a module-level function of an installed module),
so the layers above bench (the CLI) hand their work to the cluster without this module
importing them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashtune.bench.ray.connect import ClusterError, connected, slot_placement, slot_plan

__all__ = ["SlotOutcome", "SpreadActor", "one_kind", "spread_jobs"]

# A job function: (its jobs, the device to run them on, the slot's file) -> a summary.
JobFunction = Callable[[list[Any], str, Path], dict[str, Any]]


@dataclass
class SlotOutcome:
    """What one slot did: where it ran, its file's text afterwards, the job function's
    summary; `error` instead when the slot (or its node) was lost."""

    environment: dict[str, Any]
    jobs: list[Any]
    text: str | None = None
    summary: dict[str, Any] | None = None
    error: str | None = None


class SpreadActor:
    """One GPU (or CPU) slot running job functions (run as a Ray actor)."""

    def __init__(self) -> None:
        import ray

        from flashtune import platform

        self.placement = slot_placement(ray)
        self.device = "cuda" if self.placement["gpu_index"] is not None else "cpu"
        self.env = {**platform.snapshot(self.device), **self.placement}

    def environment(self) -> dict[str, Any]:
        return self.env

    def run(self, fn: JobFunction, jobs: list[Any], text: str | None) -> tuple[str | None, Any]:
        """fn(jobs, device, file) with the file holding `text` first; -> (its text, summary)."""
        path = Path(tempfile.mkdtemp(prefix="flashtune-spread-")) / "slot.json"
        if text:
            path.write_text(text)
        summary = fn(jobs, self.device, path)
        return (path.read_text() if path.exists() else None), summary


def one_kind(environments: Sequence[dict[str, Any]]) -> str:
    """The one GPU model of the slots; ClusterError naming the kinds when there are several
    (a tuned config holds for one GPU model)."""
    kinds: dict[str, int] = {}
    for env in environments:
        kind = str(env.get("hardware"))
        kinds[kind] = kinds.get(kind, 0) + 1
    if len(kinds) > 1:
        found = ", ".join(f"{n} x {kind}" for kind, n in sorted(kinds.items()))
        raise ClusterError(
            f"the cluster's slots are of several kinds ({found}); results of one kind are "
            "only valid for that kind: run on a cluster (or a Ray namespace) of one GPU model"
        )
    return next(iter(kinds))


def spread_jobs(
    address: str,
    fn: JobFunction,
    jobs: Sequence[Any],
    text: str | None = None,
    slots: int | None = None,
) -> list[SlotOutcome]:
    """Run `fn` over `jobs` on the cluster at `address`: jobs dealt round-robin to one actor
    per GPU (per CPU without GPUs; at most `slots`), each starting from a file holding
    `text`. A lost slot's outcome carries the error; the others' results are kept."""
    with connected(address) as ray:
        plan = slot_plan(ray, slots)
        count = min(plan.count, max(len(jobs), 1))
        remote = ray.remote(SpreadActor).options(**plan.actor_options())
        actors = [remote.remote() for _ in range(count)]
        try:
            envs = ray.get([a.environment.remote() for a in actors])
            one_kind(envs)
            shares = [list(jobs[i::count]) for i in range(count)]
            refs = [a.run.remote(fn, share, text) for a, share in zip(actors, shares, strict=True)]
            outcomes = []
            for env, share, ref in zip(envs, shares, refs, strict=True):
                try:
                    out_text, summary = ray.get(ref)
                    outcomes.append(SlotOutcome(env, share, out_text, summary))
                except ray.exceptions.RayError as exc:
                    where = f"{env.get('host')}/gpu{env.get('gpu_index')}"
                    error = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                    outcomes.append(SlotOutcome(env, share, error=f"{where}: {error}"))
            return outcomes
        finally:
            for actor in actors:
                ray.kill(actor)

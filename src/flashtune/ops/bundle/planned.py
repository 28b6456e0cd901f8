"""FlashInfer's planned wrappers as bundled entries: plan once in a setup phase, time run().

Also the page-table move a plan-free entry makes under apply (`on_device_of`) and
FlashInfer's shared float workspace (`flashinfer_workspace`).
"""

from __future__ import annotations

import hashlib
import inspect
import weakref
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["flashinfer_workspace", "last_page_len_and_scale", "on_device_of", "with_setup"]

_WORKSPACE_BYTES = 128 * 2**20
_workspaces: dict[torch.device, torch.Tensor] = {}


def flashinfer_workspace(device: torch.device) -> torch.Tensor:
    """FlashInfer's float workspace (its recommended 128 MB): one per device, shared by every
    wrapper and reused across calls, as serving engines do (see below)."""
    if device not in _workspaces:
        _workspaces[device] = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _workspaces[device]


def on_device_of(q: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """The page-table tensors on q's device. Under apply, a solution gets the arguments a
    planned wrapper was given, and FlashInfer's wrappers take the page table on the host
    (engines pass it so: plan() needs its lengths there); the plan-free kernels read it on
    the device. A no-op for tensors already there (the benchmark's case). Inside a CUDA-graph
    capture a host-to-device copy is not allowed (and would invalidate the capture): it
    raises before any copy, so apply falls back to the op's own path, which the capture can
    record."""
    moved = [t for t in tensors if t.device != q.device]
    if moved and q.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "the page table is on the host during a CUDA-graph capture: this plan-free "
            "solution cannot copy it to the device there"
        )
    return [t.to(q.device, non_blocking=True) for t in tensors]


def last_page_len_and_scale(
    kv_indptr: torch.Tensor, kv_last_page_len: Any, sm_scale: Any
) -> tuple[torch.Tensor, Any]:
    """(kv_last_page_len, sm_scale) of a paged entry called with both, or with sm_scale alone
    where the definition is at page size 1 and lists no kv_last_page_len (FlashInfer-Trace's
    ps1 definitions): called by position, that sm_scale arrives in kv_last_page_len's place.
    Every page of size 1 is full, so each last page holds one token (the fill of supply's
    page-size-1 layout)."""
    if sm_scale is None:
        kv_last_page_len, sm_scale = None, kv_last_page_len
    if sm_scale is None:
        raise TypeError("sm_scale is required")
    if kv_last_page_len is None:
        n = kv_indptr.shape[0] - 1
        kv_last_page_len = torch.ones(n, dtype=torch.int32, device=kv_indptr.device)
    return kv_last_page_len, sm_scale


# FlashInfer's attention wrappers split a call into plan() (host work from the index inputs:
# it reads indptr on the host, so it syncs) and run() (the kernels). Its users plan once per
# batch and run many times (every layer of a step reuses the plan), so each adapter below has
# a `setup`: the harness calls `entry.setup(*args)` once per input set outside the timed
# region, gets a runner that only calls run(), and times the runner. The runner reads the
# float inputs (q, K/V) at call time; the index inputs it runs with are those given to setup
# (the harness keeps them unchanged). Calling an entry directly still plans and runs.
#
# Memory: every wrapper holds its own plan in FlashInfer's internal int workspace (8 MB on the
# device plus 8 MB pinned on the host; the paged prefill wrapper adds 64 MB of page-offset
# buffers), while the 128 MB float workspace is scratch that run() fills and reads within one
# call, so one per device is shared by all wrappers, as serving engines do (sglang shares one
# global float workspace across all its FlashInfer wrappers). Setup memoizes the planned
# wrapper by the index inputs' content: the harness's cold-L2 copies of one workload carry
# identical index tensors, so they share one plan, like the layers of one batch in serving.
# A memo entry lives as long as a runner that uses it.


class _Planned:
    """A planned FlashInfer wrapper (a holder, so the memo can refer to it weakly)."""

    __slots__ = ("wrapper", "__weakref__")

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper


_plans: weakref.WeakValueDictionary[tuple, _Planned] = weakref.WeakValueDictionary()


def _plan_key(name: str, args: tuple) -> tuple:
    """What a plan depends on: the index (integer) tensors' content, every tensor's dtype,
    shape and device, and the scalars. Float tensors' values are not part of it: run() reads
    them at call time."""
    key: list[Any] = [name]
    for a in args:
        if isinstance(a, torch.Tensor):
            meta = (str(a.dtype), tuple(a.shape), str(a.device))
            if a.dtype.is_floating_point or a.dtype.is_complex:
                key.append(meta)
            else:  # setup is outside the timed region: the host copy's sync costs nothing there
                raw = a.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy()
                key.append((*meta, hashlib.blake2b(raw.tobytes(), digest_size=16).digest()))
        else:
            key.append((type(a).__name__, a))
    return tuple(key)


def with_setup(name: str, doc: str, plan: Callable[..., Any], run: Callable[..., Any]):
    """The entry point `name`, with plan's parameters: plan(*args) -> a planned wrapper,
    run(wrapper, *args) -> the outputs. Called directly, it plans and runs; `entry.setup(*args)`
    plans once (memoized by `_plan_key`) and returns a runner that only runs."""
    signature = inspect.signature(plan)

    def positional(args: tuple, kwargs: dict) -> tuple:
        if not kwargs:
            return args
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()  # a keyword after a defaulted parameter left out stays in place
        return bound.args

    def entry(*args: Any, **kwargs: Any) -> Any:
        args = positional(args, kwargs)
        return run(plan(*args), *args)

    def setup(*args: Any, **kwargs: Any) -> Callable[..., Any]:
        args = positional(args, kwargs)
        key = _plan_key(name, args)
        planned = _plans.get(key)
        if planned is None:
            planned = _Planned(plan(*args))
            _plans[key] = planned
            device = next(a.device for a in args if isinstance(a, torch.Tensor))
            if device.type == "cuda":  # plan()'s host-to-device copies are asynchronous
                torch.cuda.synchronize(device)

        def runner(*call_args: Any, **call_kwargs: Any) -> Any:
            return run(planned.wrapper, *positional(call_args, call_kwargs))

        return runner

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = doc
    entry.__signature__ = signature  # type: ignore[attr-defined]
    setup.__name__, setup.__qualname__ = "setup", f"{name}.setup"
    setup.__signature__ = signature  # type: ignore[attr-defined]
    entry.setup = setup  # type: ignore[attr-defined]
    return entry

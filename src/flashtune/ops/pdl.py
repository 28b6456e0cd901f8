"""Programmatic dependent launch (PDL): whether a kernel launch uses it.

With PDL (Hopper and later, CUDA), a kernel launched right behind another in the same stream
may start before that one has finished: its programs wait for the earlier grid's memory with
`tl.extra.cuda.gdc_wait()` before their first load, and each program tells the next kernel
it may start with `gdc_launch_dependents()`. What overlaps is the launch and the prologue,
which matters for the short, back-to-back kernels of a decode step (norm, activation).

FlashInfer's norms and activations take `enable_pdl` (None: on where the device supports
it). flashtune accepts the same argument; None follows `PDL_BY_DEFAULT`, on since session 22:
in a CUDA graph (how serving engines replay a decode step) a chain of 8 back-to-back kernels
ran 1.12-1.68x faster a kernel with PDL (H200, benchmarks/bench_elementwise.py --pdl --quick:
silu_and_mul 9.77 -> 5.81 us at 1 token, 16.98 -> 15.12 at 64; bench_norm.py --pdl --quick:
RMSNorm 12.48 -> 9.42 us at batch 1, 14.06 -> 9.99 at 64; FlashInfer 0.7.2's own chains
1.14-1.32x). Eager launches, bound by the host, ran 5-15% slower with it: pass
enable_pdl=False there. The interpreter and CPU tensors never use it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from flashtune import platform

__all__ = ["PDL_BY_DEFAULT", "use_pdl", "launch_options"]

# What enable_pdl=None means on a device that supports PDL (measured above).
PDL_BY_DEFAULT = True


def use_pdl(device: torch.device, enable_pdl: bool | None) -> bool:
    """Whether a launch on `device` uses PDL: asked for (or None and PDL_BY_DEFAULT), a CUDA
    device of compute capability 9.0 or later, and not Triton's interpreter."""
    if enable_pdl is not None and not isinstance(enable_pdl, bool):
        raise TypeError(f"enable_pdl must be a bool or None, got {type(enable_pdl).__name__}")
    wanted = PDL_BY_DEFAULT if enable_pdl is None else enable_pdl
    if not wanted or device.type != "cuda" or platform.triton_interpret():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _supports_pdl(index)


@functools.lru_cache(maxsize=16)
def _supports_pdl(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def launch_options(pdl: bool) -> dict[str, Any]:
    """Extra keyword arguments of a Triton launch: `launch_pdl` only when used (a compile
    option: a kernel launched with it is a separate compiled variant)."""
    return {"launch_pdl": True} if pdl else {}

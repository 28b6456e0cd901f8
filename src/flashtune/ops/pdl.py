"""Programmatic dependent launch (PDL): whether a kernel launch uses it.

With PDL (Hopper and later, CUDA), a kernel launched right behind another in the same stream
may start before that one has finished: its programs wait for the earlier grid's memory with
`tl.extra.cuda.gdc_wait()` before their first load, and each program tells the next kernel
it may start with `gdc_launch_dependents()`. What overlaps is the launch and the prologue,
which matters for the short, back-to-back kernels of a decode step (norm, activation).

FlashInfer's norms and activations take `enable_pdl` (None: on where the device supports
it). flashtune accepts the same argument; None follows `PDL_BY_DEFAULT`, which stays off
until benchmarks/bench_norm.py --pdl / bench_elementwise.py --pdl show a gain on the GPU.
The interpreter and CPU tensors never use it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from flashtune import platform

__all__ = ["PDL_BY_DEFAULT", "use_pdl", "launch_options"]

# What enable_pdl=None means on a device that supports PDL. Off until measured (see above).
PDL_BY_DEFAULT = False


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

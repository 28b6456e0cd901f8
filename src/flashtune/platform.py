"""Device detection and the environment snapshot recorded with every measurement.

Nothing here initializes CUDA at import time; `snapshot()` only touches CUDA when torch says
a device is available, and works (reporting "cpu") on a machine without a GPU.
"""

from __future__ import annotations

import functools
import os
import platform as _py_platform
import subprocess
from typing import Any

import torch

__all__ = [
    "has_cuda",
    "default_device",
    "device_name",
    "compute_capability",
    "snapshot",
    "triton_interpret",
    "kernels_available",
]


def has_cuda() -> bool:
    """True when torch sees at least one CUDA device (no context is created)."""
    return torch.cuda.is_available()


def default_device() -> torch.device:
    return torch.device("cuda") if has_cuda() else torch.device("cpu")


def triton_interpret() -> bool:
    """True when Triton kernels run in its interpreter on CPU tensors (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernels_available(device: torch.device | str) -> bool:
    """Whether a Triton kernel can run on tensors of `device` in this process."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return True
    return dev.type == "cpu" and triton_interpret() and _triton_version() is not None


def device_name(device: torch.device | str | None = None) -> str:
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return "cpu"


def compute_capability(device: torch.device | str | None = None) -> tuple[int, int] | None:
    dev = torch.device(device) if device is not None else default_device()
    if dev.type != "cuda":
        return None
    return torch.cuda.get_device_capability(dev)


@functools.lru_cache(maxsize=1)
def _triton_version() -> str | None:
    try:
        import triton
    except Exception:  # triton is optional off Linux
        return None
    return str(triton.__version__)


@functools.lru_cache(maxsize=1)
def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def _flashtune_version() -> str:
    from flashtune import __version__

    return __version__


def snapshot(device: torch.device | str | None = None) -> dict[str, Any]:
    """The environment a measurement was taken in: hardware and library versions."""
    dev = torch.device(device) if device is not None else default_device()
    info: dict[str, Any] = {
        "hardware": device_name(dev),
        "device": str(dev),
        "python": _py_platform.python_version(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "cuda": torch.version.cuda,
        "flashtune": _flashtune_version(),
        "host": _py_platform.node(),
    }
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(
            compute_capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            driver=_driver_version(),
        )
    else:
        info.update(compute_capability=None, sm_count=None, memory_gib=None, driver=None)
    return info

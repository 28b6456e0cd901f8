"""flashtune: fast, autotuned Triton kernels for LLM inference.

Importing flashtune never touches CUDA or compiles anything; ops and the tuner are loaded on
first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public names loaded lazily so that `import flashtune` stays cheap and CUDA-free.
_LAZY = {
    "autotune": "flashtune.tune",
    "load_configs": "flashtune.tune",
    "capture": "flashtune.capture",
    "CaptureConfig": "flashtune.capture",
    "apply": "flashtune.apply",
    "enable_apply": "flashtune.apply",
    "Dataset": "flashtune.data",
    "Definition": "flashtune.data",
    "Solution": "flashtune.data",
    "Workload": "flashtune.data",
    "Trace": "flashtune.data",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flashtune' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

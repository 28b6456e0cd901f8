"""Workload capture: record the shapes (and index tensors) a real program runs.

    with flashtune.capture(dataset="my-dataset", configs={"gemm": CaptureConfig("dump_none")}):
        model.generate(...)

or FLASHTUNE_CAPTURE=1 (with FLASHTUNE_DATASET) for every schema'd op of the process.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from flashtune.capture.api import Capturer, capture, observe
from flashtune.capture.policies import DUMP_POLICIES, FILTER_POLICIES, CaptureConfig
from flashtune.capture.writer import CaptureWriter, flush_all

__all__ = [
    "DUMP_POLICIES",
    "FILTER_POLICIES",
    "CaptureConfig",
    "CaptureWriter",
    "Capturer",
    "capture",
    "flush_all",
    "observe",
]


class _CallableModule(types.ModuleType):
    """Importing this package sets the attribute `flashtune.capture` to the package itself,
    hiding the lazily exported function of the same name: calling the package calls it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return capture(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

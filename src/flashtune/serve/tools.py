"""The agent tools of the service: compute-sanitizer and Nsight Compute on a submission.

Each runs one sandboxed call of the solution (bench/probe.py) on the service's first device,
holding the evaluator's device lock: a profile or a sanitizer run must not share the GPU
with a benchmark run's timing (nor with another tool). The verdicts come from
`flashtune.bench.sanitizer` and `flashtune.bench.nsight`, the same functions `flashtune
tool` and `flashtune run --sanitize` use.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

from flashtune.bench.nsight import NcuResult, ncu_summary
from flashtune.bench.sanitizer import SANITIZER_TOOLS, SanitizeResult, sanitize
from flashtune.data.dataset import Dataset
from flashtune.data.models import Definition, Solution, Workload
from flashtune.data.synth import resolve_axes, torch_dtype
from flashtune.serve.tasks import Evaluator, SubmissionError

__all__ = ["ToolRunner", "pick_workload"]


def _size(definition: Definition, workload: Workload) -> int:
    """Input bytes of `workload` (0 when its axes do not resolve)."""
    try:
        axes = resolve_axes(definition, workload)
    except ValueError:
        return 0
    return sum(
        math.prod(axes.get(a, 1) for a in spec.shape) * torch_dtype(spec.dtype).itemsize
        for spec in definition.inputs.values()
        if spec.shape is not None
    )


def pick_workload(dataset: Dataset, definition: Definition, uuid: str | None) -> Workload:
    """The workload `uuid` of `definition`, or its smallest valid one (by input bytes)."""
    valid = []
    for record in dataset.workloads_for(definition.name):
        try:
            record.workload.check_against(definition)
        except ValueError:
            continue
        valid.append(record.workload)
    if uuid is not None:
        for workload in valid:
            if workload.uuid == uuid:
                return workload
        raise SubmissionError(f"{definition.name} has no valid workload {uuid!r}", status=404)
    if not valid:
        raise SubmissionError(f"{definition.name} has no valid workload", status=404)
    return min(valid, key=lambda w: _size(definition, w))


class ToolRunner:
    """compute-sanitizer and ncu on the evaluator's first device and dataset."""

    def __init__(self, evaluator: Evaluator, timeout: float = 900.0) -> None:
        self.evaluator = evaluator
        self.timeout = timeout

    @property
    def device(self) -> str:
        return self.evaluator.settings.devices[0]

    def _lock(self) -> Any:
        # Off a GPU the tools answer "unavailable" at once: no need to wait for a run.
        if self.device.startswith("cuda"):
            return self.evaluator.device_lock
        return contextlib.nullcontext()

    def _target(self, solution: Solution, workload: str | None) -> tuple[Definition, Workload]:
        definition = self.evaluator.definitions().get(solution.definition)
        if definition is None:
            raise SubmissionError(f"no definition named {solution.definition!r}", status=404)
        return definition, pick_workload(self.evaluator.dataset, definition, workload)

    def sanitize(
        self, solution: Solution, workload: str | None, tools: Sequence[str] | None
    ) -> SanitizeResult:
        definition, chosen = self._target(solution, workload)
        with self._lock():
            return sanitize(
                definition,
                chosen,
                solution,
                self.device,
                roots=[str(r) for r in self.evaluator.settings.datasets],
                tools=tuple(tools or SANITIZER_TOOLS),
                timeout=self.timeout,
            )

    def ncu(self, solution: Solution, workload: str | None) -> NcuResult:
        definition, chosen = self._target(solution, workload)
        with self._lock():
            return ncu_summary(
                definition,
                chosen,
                solution,
                self.device,
                roots=[str(r) for r in self.evaluator.settings.datasets],
                timeout=self.timeout,
            )

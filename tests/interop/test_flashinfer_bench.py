"""Interop with the real FlashInfer-Bench package (its data layer only: `pip install --no-deps
flashinfer-bench==0.1.2 docstring-parser`, as the README's test command does). Each test skips,
saying why, where the package cannot be imported."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from flashtune.data import Dataset, Definition, EvaluationStatus, Solution, Trace

fib = pytest.importorskip(
    "flashinfer_bench.data",
    reason="flashinfer-bench is not installed (pip install --no-deps "
    "flashinfer-bench==0.1.2 docstring-parser)",
)

DEFINITION: dict[str, Any] = {
    "name": "scale_h4",
    "op_type": "scale",
    "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 4}},
    "inputs": {"x": {"shape": ["n", "h"], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
    "reference": "import torch\n\ndef run(x):\n    return x * 2\n",
}
# FlashInfer-Bench's own form: no destination_passing_style, so destination-passing (its default).
DPS_SOLUTION: dict[str, Any] = {
    "name": "scale_dps",
    "definition": "scale_h4",
    "author": "fib",
    "spec": {"language": "python", "target_hardware": ["cpu"], "entry_point": "main.py::run"},
    "sources": [{"path": "main.py", "content": "def run(x, y):\n    y.copy_(x * 2)\n"}],
}


def _workload(uuid: str, n: int) -> dict[str, Any]:
    return {"uuid": uuid, "axes": {"n": n}, "inputs": {"x": {"type": "random"}}}


def _passed(uuid: str, n: int, error: float = 0.0) -> dict[str, Any]:
    return {
        "definition": "scale_h4",
        "workload": _workload(uuid, n),
        "solution": "scale_dps",
        "evaluation": {
            "status": "PASSED",
            "environment": {"hardware": "cpu", "libs": {"torch": "2"}},
            "timestamp": "t",
            "correctness": {"max_relative_error": error, "max_absolute_error": error},
            "performance": {"latency_ms": 1.0, "reference_latency_ms": 2.0, "speedup_factor": 2.0},
        },
    }


def _fib_counts(root: Path) -> dict[str, int]:
    ts = fib.TraceSet.from_path(str(root))
    return {
        "definitions": len(ts.definitions),
        "solutions": sum(len(v) for v in ts.solutions.values()),
        "workloads": sum(len(v) for v in ts.workloads.values()),
        "traces": sum(len(v) for v in ts.traces.values()),
    }


def _written_by_fib(root: Path, flat: bool) -> None:
    """A dataset written with FlashInfer-Bench's own writers: flat files (its example sets and
    tests) or what TraceSet.add_workload_traces / add_traces write (<op_type>/<def>.jsonl)."""
    definition = fib.Definition.model_validate(DEFINITION)
    fib.save_json_file(definition, root / "definitions" / "scale_h4.json")
    fib.save_json_file(fib.Solution.model_validate(DPS_SOLUTION), root / "solutions" / "s.json")
    workloads = [
        fib.Trace(definition="scale_h4", workload=fib.Workload.model_validate(_workload(u, n)))
        for u, n in (("a", 1), ("b", 3))
    ]
    traces = [fib.Trace.model_validate(_passed("a", 1)), fib.Trace.model_validate(_passed("b", 3))]
    if flat:
        fib.save_jsonl_file(workloads, root / "workloads" / "scale_h4.jsonl")
        fib.save_jsonl_file(traces, root / "traces" / "scale_h4.jsonl")
    else:
        ts = fib.TraceSet.from_path(str(root))
        ts.add_workload_traces(workloads)
        ts.add_traces(traces)


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "add_traces"])
def test_flashtune_reads_what_flashinfer_bench_writes(tmp_path: Path, flat: bool) -> None:
    _written_by_fib(tmp_path, flat)
    ds = Dataset(tmp_path)
    assert ds.load_all() == []
    assert (
        ds.counts()
        == _fib_counts(tmp_path)
        == {
            "definitions": 1,
            "solutions": 1,
            "workloads": 2,
            "traces": 2,
        }
    )
    (solution,) = ds.solutions_for("scale_h4")
    assert solution.spec.destination_passing_style  # FlashInfer-Bench's default when absent


def test_flashinfer_bench_reads_what_flashtune_writes(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    definition = Definition.model_validate(DEFINITION)
    ds.add_definition(definition)
    ds.add_solution(Solution.model_validate(DPS_SOLUTION))
    ds.add_workloads(definition, [Trace.model_validate(_passed("a", 1)).workload])
    ds.append_trace(Trace.model_validate(_passed("a", 1, error=math.inf)), author="fib")
    skipped = _passed("a", 1)
    skipped["evaluation"] |= {"status": "SKIPPED", "correctness": None, "performance": None}
    ds.append_trace(Trace.model_validate(skipped), author="fib")

    # The SKIPPED triple is kept beside traces/, where FlashInfer-Bench does not look.
    assert _fib_counts(tmp_path) == {"definitions": 1, "solutions": 1, "workloads": 1, "traces": 1}
    statuses = sorted(t.evaluation.status for t in Dataset(tmp_path).traces_for("scale_h4"))
    assert statuses == [EvaluationStatus.PASSED, EvaluationStatus.SKIPPED]
    ts = fib.TraceSet.from_path(str(tmp_path))
    assert ts.summary()["passed"] == 1
    (trace,) = ts.traces["scale_h4"]
    assert math.isinf(trace.evaluation.correctness.max_relative_error)


def test_non_finite_floats_are_written_as_flashinfer_bench_writes_them() -> None:
    theirs = fib.Correctness(max_relative_error=math.inf, max_absolute_error=math.nan)
    record = _passed("a", 1)
    record["evaluation"]["correctness"] = json.loads(theirs.model_dump_json())
    line = json.dumps(record)
    ours = Trace.model_validate_json(line)
    assert ours.evaluation is not None and ours.evaluation.correctness is not None
    assert math.isnan(ours.evaluation.correctness.max_absolute_error or 0.0)
    assert ours.to_json() == line  # "NaN" / "Infinity", strict JSON, same bytes


def test_flashtune_runs_flashinfer_bench_destination_passing_solution(tmp_path: Path) -> None:
    from flashtune.bench.runner import RunOptions, run_benchmark

    _written_by_fib(tmp_path / "fib", flat=True)
    out = tmp_path / "out"
    result = run_benchmark(RunOptions(datasets=[tmp_path / "fib"], out=out), progress=False)
    assert [t.evaluation.status for t in result.traces if t.evaluation] == [
        EvaluationStatus.PASSED
    ] * 2
    # flashtune's traces of that run load in FlashInfer-Bench, with their counts.
    ts = fib.TraceSet.from_path(str(out))
    assert sum(len(v) for v in ts.traces.values()) == 2
    assert ts.summary()["passed"] == 2

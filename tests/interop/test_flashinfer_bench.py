"""Interop with the real FlashInfer-Bench package (its data layer only: `pip install --no-deps
flashinfer-bench==0.1.2 docstring-parser`, as the README's test command does). Each test skips,
saying why, where the package cannot be imported."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from flashtune.cli import bundled_dataset
from flashtune.data import (
    Correctness,
    Dataset,
    Definition,
    EvaluationStatus,
    Performance,
    Solution,
    Trace,
    metrics_for_status,
)

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


def test_flashinfer_bench_reads_the_correctness_extensions() -> None:
    # rel_norm_error and the element-wise atol/rtol (what apply re-judges PASSED traces by)
    # are fields FlashInfer-Bench does not know: it reads the record, and its own figures.
    record = _passed("a", 1, error=1.0)
    record["evaluation"]["correctness"] |= {
        "matched_ratio": 0.9995,
        "rel_norm_error": 3e-3,
        "row_rel_norm_error": 7e-3,
        "atol": 1.6e-2,
        "rtol": math.inf,
    }
    ours = Trace.model_validate(record)
    line = ours.to_json()
    theirs = fib.Trace.model_validate_json(line)
    assert theirs.evaluation is not None and theirs.evaluation.correctness is not None
    assert theirs.evaluation.correctness.max_absolute_error == 1.0
    back = Trace.model_validate_json(line).evaluation
    assert back is not None and back.correctness is not None
    assert (back.correctness.atol, back.correctness.rtol) == (1.6e-2, math.inf)
    assert back.correctness.row_rel_norm_error == 7e-3


def test_flashtune_runs_flashinfer_bench_destination_passing_solution(tmp_path: Path) -> None:
    from flashtune.bench.runner import RunOptions, run_benchmark

    _written_by_fib(tmp_path / "fib", flat=True)
    # A language flashtune does not build loads, and its triples are SKIPPED saying why.
    tilelang = DPS_SOLUTION | {"name": "scale_tilelang"}
    tilelang["spec"] = DPS_SOLUTION["spec"] | {"language": "tilelang"}
    fib.save_json_file(fib.Solution.model_validate(tilelang), tmp_path / "fib/solutions/t.json")
    out = tmp_path / "out"
    result = run_benchmark(RunOptions(datasets=[tmp_path / "fib"], out=out), progress=False)
    by_solution: dict[str | None, list[Any]] = {}
    for t in result.traces:
        assert t.evaluation is not None
        by_solution.setdefault(t.solution, []).append(t.evaluation)
    assert [e.status for e in by_solution["scale_dps"]] == [EvaluationStatus.PASSED] * 2
    assert [e.status for e in by_solution["scale_tilelang"]] == [EvaluationStatus.SKIPPED] * 2
    assert "flashtune does not build tilelang solutions" in (
        by_solution["scale_tilelang"][0].reason or ""
    )
    # flashtune's traces of that run load in FlashInfer-Bench, with their counts, their
    # harness signatures (a top-level extension field) included.
    assert all(t.signature and t.signature["mac"] for t in result.traces)
    ts = fib.TraceSet.from_path(str(out))
    assert sum(len(v) for v in ts.traces.values()) == 2
    assert ts.summary()["passed"] == 2


def test_flashinfer_bench_loads_the_bundled_dataset() -> None:
    """Every bundled definition, solution and workload, with flashtune's counts; solution
    names unique across definitions (its TraceSet refuses a repeated one)."""
    ours = Dataset(bundled_dataset())
    assert ours.load_all() == []
    assert _fib_counts(bundled_dataset()) == ours.counts()
    for solution in ours.all_solutions():
        fib.Solution.model_validate(solution.to_dict())


def _fib_report(command: str, root: Path, caplog: pytest.LogCaptureFixture) -> str:
    """Run FlashInfer-Bench's `report <command> --local <root>`; its log output."""
    import argparse
    import logging

    from flashinfer_bench.cli import main as fib_cli

    caplog.clear()
    with caplog.at_level(logging.INFO):
        getattr(fib_cli, command)(argparse.Namespace(local=[root], hub=False))
    return caplog.text


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CPU `flashtune run` of the bundled dataset: a norm (flashtune and FlashInfer
    SKIPPED here, torch PASSED) and a sampling op (torch's, checked by distribution)."""
    from flashtune.bench.runner import RunOptions, run_benchmark

    out = tmp_path_factory.mktemp("run")
    # The sampling op: one workload of torch's solution (its PASSED trace is what
    # FlashInfer-Bench reads; flashtune's Triton sampler would run seconds in the interpreter
    # for a SKIPPED trace, and the norm's run has those).
    runs = (("rmsnorm_h4096", None, None), ("top_k_sampling_from_probs_*", "torch@*", 1))
    for definitions, solutions, workloads in runs:
        opts = RunOptions(
            datasets=[bundled_dataset()],
            out=out,
            definitions=definitions,
            solutions=solutions,
            max_workloads=workloads,
        )
        run_benchmark(opts, progress=False)
    return out


def test_flashinfer_bench_reads_a_cpu_run(cpu_run: Path, caplog: pytest.LogCaptureFixture) -> None:
    traces = Dataset(cpu_run).all_traces()
    statuses = {t.evaluation.status for t in traces if t.evaluation}
    assert statuses == {EvaluationStatus.PASSED, EvaluationStatus.SKIPPED}
    passed = [t for t in traces if t.evaluation and t.evaluation.status is EvaluationStatus.PASSED]
    # Both ops' torch traces: the deterministic norm's and the sampling op's.
    assert {t.definition for t in passed} == {"rmsnorm_h4096", "top_k_sampling_from_probs_v128256"}

    # The deterministic op's traces record the element-wise tolerance they were judged by.
    norms = [t for t in passed if t.definition == "rmsnorm_h4096"]
    assert norms and all(
        t.evaluation.correctness and t.evaluation.correctness.atol is not None for t in norms
    )

    ts = fib.TraceSet.from_path(str(cpu_run))  # raises on any record it does not accept
    theirs = [t for v in ts.traces.values() for t in v]
    assert sorted((t.solution, t.workload.uuid) for t in theirs) == sorted(
        (t.solution, t.workload.uuid) for t in passed
    )
    for trace in theirs:  # library versions where FlashInfer-Bench reads them
        assert trace.evaluation.environment.libs["torch"] == torch.__version__
    summary = _fib_report("summary", cpu_run, caplog)
    assert f"'passed': {len(passed)}" in summary and "'failed': 0" in summary


def test_flashinfer_bench_reports_on_the_bundled_dataset_with_a_run(
    cpu_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ds"
    shutil.copytree(bundled_dataset(), root)
    shutil.copytree(cpu_run / "traces", root / "traces")
    _fib_report("summary", root, caplog)
    best = _fib_report("best", root, caplog)
    assert "Best solution for rmsnorm_h4096:" in best
    assert "- Solution: torch@rmsnorm_h4096" in best


@pytest.mark.parametrize("status", list(EvaluationStatus), ids=lambda s: s.value)
def test_metrics_follow_flashinfer_bench_rule(status: EvaluationStatus) -> None:
    """What flashtune's benchmark records for each status (metrics_for_status) is what
    FlashInfer-Bench accepts, and flashtune's own validation agrees on the rest."""
    measured = (
        Correctness(max_absolute_error=0.5, max_relative_error=None),
        Performance(latency_ms=1.0, speedup_factor=None),
    )
    correctness, performance = metrics_for_status(status, *measured)
    record = _passed("a", 1)
    record["evaluation"] |= {
        "status": status.value,
        "correctness": correctness.to_dict() if correctness else None,
        "performance": performance.to_dict() if performance else None,
    }
    line = Trace.model_validate(record).to_json()
    if status is EvaluationStatus.SKIPPED:  # not a FlashInfer-Bench status: kept in skipped/
        return
    fib.Trace.model_validate_json(line)
    for field, figures in (("correctness", correctness), ("performance", performance)):
        if figures is None:  # the metrics the status must not carry are refused, as there
            wrong = json.loads(line)
            wrong["evaluation"][field] = {}
            with pytest.raises(ValueError, match=f"must not include {field}"):
                Trace.model_validate(wrong)

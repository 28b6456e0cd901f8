"""Interop with the real FlashInfer-Bench package: the installed release (its data layer only:
`pip install --no-deps flashinfer-bench==0.1.2 docstring-parser`, as the README's test command
does) and, the same tests in a child process, its pinned current source
(test_flashinfer_bench_head.py). Each test skips, saying why, where the package cannot be
imported, and fails there under FLASHTUNE_REQUIRE_INTEROP=1 (CI)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from _ecafa9c import write_ecafa9c
from _fib import fib_is_head, import_fib
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
from flashtune.ops.bundle.supply import reference_solution

fib = import_fib()
HEAD = fib_is_head()
_HEAD_ONLY = "FlashInfer-Bench 0.1.2 has no validate; its pinned source has (the HEAD run)"

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


def _fib_summary(ts: Any) -> dict[str, int]:
    """TraceSet.summary()'s counts: a dict in 0.1.2, a TraceSetSummary in its current source
    (which scores every author against the one solution of author "baseline")."""
    summary = ts.summary()
    if isinstance(summary, dict):
        return {k: summary[k] for k in ("total", "passed", "failed")}
    return {"total": summary.total, "passed": summary.passed, "failed": summary.failed}


def _summary_counts(log: str) -> dict[str, int]:
    """The counts `report summary` logs: "{'total': 3, 'passed': 3, ...}" (0.1.2) or
    "Traces: 3 total, 3 passed, 0 failed" (current source)."""
    import re

    found = {k: int(v) for k, v in re.findall(r"'(total|passed|failed)': (\d+)", log)}
    found |= {k: int(v) for v, k in re.findall(r"(\d+) (total|passed|failed)\b", log)}
    assert set(found) == {"total", "passed", "failed"}, log
    return found


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
    # Its baseline (the author its current summary scores against): the reference, as a
    # solution of its own.
    baseline = reference_solution(Definition.model_validate(DEFINITION)).to_dict()
    fib.save_json_file(fib.Solution.model_validate(baseline), root / "solutions" / "base.json")
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
            "solutions": 2,
            "workloads": 2,
            "traces": 2,
        }
    )
    (solution,) = ds.solutions_for("scale_h4", "scale_dps")
    assert solution.spec.destination_passing_style  # FlashInfer-Bench's default when absent


def test_flashinfer_bench_reads_what_flashtune_writes(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    definition = Definition.model_validate(DEFINITION)
    ds.add_definition(definition)
    ds.add_solution(Solution.model_validate(DPS_SOLUTION))
    ds.add_solution(reference_solution(definition))  # its baseline, as `solutions add` writes
    ds.add_workloads(definition, [Trace.model_validate(_passed("a", 1)).workload])
    ds.append_trace(Trace.model_validate(_passed("a", 1, error=math.inf)), author="fib")
    skipped = _passed("a", 1)
    skipped["evaluation"] |= {"status": "SKIPPED", "correctness": None, "performance": None}
    ds.append_trace(Trace.model_validate(skipped), author="fib")

    # The SKIPPED triple is kept beside traces/, where FlashInfer-Bench does not look.
    assert _fib_counts(tmp_path) == {"definitions": 1, "solutions": 2, "workloads": 1, "traces": 1}
    statuses = sorted(t.evaluation.status for t in Dataset(tmp_path).traces_for("scale_h4"))
    assert statuses == [EvaluationStatus.PASSED, EvaluationStatus.SKIPPED]
    ts = fib.TraceSet.from_path(str(tmp_path))
    assert _fib_summary(ts)["passed"] == 1
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
    # A TileLang solution loads, and on the CPU its triples are SKIPPED saying why.
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
    assert [e.status for e in by_solution["reference@scale_h4"]] == [EvaluationStatus.PASSED] * 2
    assert [e.status for e in by_solution["scale_tilelang"]] == [EvaluationStatus.SKIPPED] * 2
    assert "no CUDA device for a tilelang solution" in (
        by_solution["scale_tilelang"][0].reason or ""
    )
    # flashtune's traces of that run load in FlashInfer-Bench, with their counts, their
    # harness signatures (a top-level extension field) included.
    assert all(t.signature and t.signature["mac"] for t in result.traces)
    ts = fib.TraceSet.from_path(str(out))
    assert sum(len(v) for v in ts.traces.values()) == 4
    assert _fib_summary(ts)["passed"] == 4


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
    summary = _summary_counts(_fib_report("summary", cpu_run, caplog))
    assert summary["passed"] == len(passed) and summary["failed"] == 0


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


# --------------------------------------------------------------------------- its Python API


def _written_by_fib_api(root: Path) -> None:
    """A dataset made as a FlashInfer-Bench user makes one: its models (AxisVar(),
    AxisConst(value=...): written without "type"), its writers (save_json_file, TraceSet's
    add_workload_traces / add_traces, its blob writer), every input kind (random, scalar,
    safetensors)."""
    definition = fib.Definition(
        name="axpy_h4",
        op_type="axpy",
        axes={"n": fib.AxisVar(), "h": fib.AxisConst(value=4)},
        inputs={
            "x": fib.TensorSpec(shape=["n", "h"], dtype="float32"),
            "idx": fib.TensorSpec(shape=["n"], dtype="int32"),
            "alpha": fib.TensorSpec(shape=None, dtype="float32"),
        },
        outputs={"y": fib.TensorSpec(shape=["n", "h"], dtype="float32")},
        reference="import torch\n\ndef run(x, idx, alpha):\n    return x * alpha\n",
    )
    fib.save_json_file(definition, root / "definitions" / "axpy" / "axpy_h4.json")

    def solution(name: str, author: str) -> Any:
        return fib.Solution(
            name=name,
            definition="axpy_h4",
            author=author,
            spec=fib.BuildSpec(
                language="python", target_hardware=["cpu"], entry_point="main.py::run"
            ),
            sources=[
                fib.SourceFile(
                    path="main.py", content="def run(x, idx, alpha, y):\n    y.copy_(x * alpha)\n"
                )
            ],
        )

    for name, author in (("axpy_ref", "baseline"), ("axpy_mine", "me")):
        fib.save_json_file(
            solution(name, author),
            root / "solutions" / author / "axpy" / "axpy_h4" / f"{name}.json",
        )
    ts = fib.TraceSet.from_path(str(root))
    workloads = []
    for uuid, n in (("w1", 2), ("w2", 5)):
        inputs: dict[str, Any] = {"x": fib.RandomInput(), "alpha": fib.ScalarInput(value=0.5)}
        if hasattr(ts, "add_workload_blob_tensor"):  # its current source: its blob writer
            path = ts.add_workload_blob_tensor(
                "axpy_h4", uuid, {"idx": torch.arange(n, dtype=torch.int32)}
            )
            inputs["idx"] = fib.SafetensorsInput(path=path, tensor_key="idx")
        else:  # 0.1.2 writes no blobs: the index is random there
            inputs["idx"] = fib.RandomInput()
        workload = fib.Workload(uuid=uuid, axes={"n": n}, inputs=inputs)
        workloads.append(fib.Trace(definition="axpy_h4", workload=workload))
    ts.add_workload_traces(workloads)
    evaluation = _passed("w1", 2)["evaluation"]
    ts.add_traces(
        [
            fib.Trace.model_validate(
                {**_passed(w.workload.uuid, w.workload.axes["n"]), "definition": "axpy_h4"}
                | {"workload": w.workload.model_dump(), "solution": s, "evaluation": evaluation}
            )
            for w in workloads
            for s in ("axpy_ref", "axpy_mine")
        ]
    )


def test_flashtune_reads_what_the_flashinfer_bench_api_writes(tmp_path: Path) -> None:
    _written_by_fib_api(tmp_path)
    definition_text = (tmp_path / "definitions" / "axpy" / "axpy_h4.json").read_text()
    assert '"type"' not in definition_text  # what its writer leaves out, flashtune infers
    ds = Dataset(tmp_path)
    assert ds.load_all() == []
    assert ds.counts() == _fib_counts(tmp_path)
    assert ds.counts() == {"definitions": 1, "solutions": 2, "workloads": 2, "traces": 4}
    assert ds.definition("axpy_h4").const_axes == {"h": 4}
    inputs = ds.workloads_for("axpy_h4")[1].workload.inputs
    assert set(inputs) == {"x", "idx", "alpha"}


# --------------------------------------------------------------------------- its current source
# Its `validate` and the summary that scores authors against "baseline" exist in its current
# source only: test_flashinfer_bench_head.py runs this file under it.


def _validate(root: Path, checks: list[str] | None = None) -> dict[str, list[str]]:
    """{definition: its error messages} from FlashInfer-Bench's validate (CPU checks)."""
    import tempfile

    from flashinfer_bench.data.validate import CPU_CHECKS, validate_dataset

    checks = CPU_CHECKS if checks is None else checks

    # Its report files go to a folder of their own (by default it writes <root>/reports/,
    # which would be inside the installed package for the bundled dataset).
    with tempfile.TemporaryDirectory() as reports:
        report = validate_dataset(
            str(root),
            checks=checks,
            disable_gpu=True,
            output_folder=reports,
            outputs=["json"],
        )
    errors: dict[str, list[str]] = {}
    for name, definition in report.definitions.items():
        for check in checks:
            result = getattr(definition, check)
            for message in result.messages if result else []:
                if message.level == "error":
                    errors.setdefault(name, []).append(f"{check}: {message.message}")
    assert len(report.definitions) == len(Dataset(root).definitions)
    return errors


@pytest.mark.skipif(not HEAD, reason=_HEAD_ONLY)
def test_head_validates_the_bundled_dataset_without_errors() -> None:
    assert _validate(bundled_dataset()) == {}


@pytest.mark.skipif(not HEAD, reason=_HEAD_ONLY)
def test_head_summary_report_and_validate_pass_on_a_cpu_run(
    cpu_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`flashtune run`'s --out is a whole dataset: HEAD's summary scores the authors against
    the torch baseline (author "baseline"), its report runs, its validate finds no error."""
    ts = fib.TraceSet.from_path(str(cpu_run))
    summary = ts.summary()
    assert summary.passed == summary.total - summary.failed and summary.passed > 0
    assert _summary_counts(_fib_report("summary", cpu_run, caplog))["passed"] == summary.passed
    assert "Best solution for rmsnorm_h4096" in _fib_report("best", cpu_run, caplog)
    assert _validate(cpu_run) == {}
    baselines = [s for v in ts.solutions.values() for s in v if s.author == "baseline"]
    assert {s.name.split("@")[0] for s in baselines} == {"torch"}


@pytest.mark.skipif(not HEAD, reason=_HEAD_ONLY)
def test_head_visualize_does_to_ours_what_it_does_to_its_own(
    cpu_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its `report visualize` reads evaluations as dicts and calls a TraceSet method its
    source no longer has (get_best_op), so at this commit it fails on any dataset with a
    trace or a definition, its own as well as ours: the outcome must be the same for both."""

    def outcome(root: Path) -> str:
        try:
            _fib_report("visualize", root, caplog)
        except Exception as exc:  # noqa: BLE001 - the outcome compared is the exception's kind
            return type(exc).__name__
        return "passed"

    _written_by_fib_api(tmp_path)
    assert outcome(cpu_run) == outcome(tmp_path)


@pytest.mark.skipif(not HEAD, reason=_HEAD_ONLY)
def test_head_validates_the_solutions_flashtune_supplies(tmp_path: Path) -> None:
    """`flashtune solutions add` on the 156 FlashInfer-Trace definitions at ecafa9c: HEAD's
    validate finds no error in their layout, definitions or solutions."""
    from flashtune.cli.solutions import write_supplied
    from flashtune.ops.bundle.supply import KINDS

    root = write_ecafa9c(tmp_path)
    found = write_supplied(Dataset(root).definitions.values(), root, KINDS)
    assert sum(len(s.solutions) for s in found) > 300
    assert _validate(root, checks=["layout", "definition", "solution"]) == {}

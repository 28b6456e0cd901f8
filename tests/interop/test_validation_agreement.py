"""Validation agreement with the real FlashInfer-Bench (0.1.2, its data layer): each case is a
one-file dataset (a definition, a solution or a trace line), judged by FlashInfer-Bench's
models and by flashtune's `validate` (Dataset.load_all). The cases mirror its models' rules
(the installed package ships no test data). They agree, except where DIFFERENCES says
otherwise: each difference is listed in docs/compatibility.md, and where flashtune is the
stricter one its error says why."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from _fib import import_fib
from flashtune.data import Dataset

fib = import_fib()

DOCS = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"

DEFINITION: dict[str, Any] = {
    "name": "scale_h4",
    "op_type": "scale",
    "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 4}},
    "inputs": {"x": {"shape": ["n", "h"], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
    "reference": "import torch\n\ndef run(x):\n    return x * 2\n",
}
SOLUTION: dict[str, Any] = {
    "name": "scale_dps",
    "definition": "scale_h4",
    "author": "fib",
    "spec": {"language": "python", "target_hardware": ["cpu"], "entry_point": "main.py::run"},
    "sources": [{"path": "main.py", "content": "def run(x, y):\n    y.copy_(x * 2)\n"}],
}
TRACE: dict[str, Any] = {
    "definition": "scale_h4",
    "workload": {"uuid": "w1", "axes": {"n": 2}, "inputs": {"x": {"type": "random"}}},
    "solution": "scale_dps",
    "evaluation": {
        "status": "PASSED",
        "environment": {"hardware": "cpu", "libs": {"torch": "2.5"}},
        "timestamp": "2026-01-01T00:00:00",
        "correctness": {"max_relative_error": 0.0, "max_absolute_error": 0.0},
        "performance": {"latency_ms": 1.0, "reference_latency_ms": 2.0, "speedup_factor": 2.0},
    },
}
BASE = {"definition": DEFINITION, "solution": SOLUTION, "trace": TRACE}


def _edit(kind: str, *changes: tuple[str, Any]) -> tuple[str, dict[str, Any]]:
    """The base record of `kind` with each (dotted path, value) set; a value of DELETE
    removes the key."""
    record = copy.deepcopy(BASE[kind])
    for path, value in changes:
        *parents, last = path.split(".")
        target = record
        for key in parents:
            target = target[key]
        if value is DELETE:
            del target[last]
        else:
            target[last] = value
    return kind, record


DELETE = object()
NO_METRICS = (("evaluation.correctness", DELETE), ("evaluation.performance", DELETE))

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # definitions
    "definition ok": _edit("definition"),
    "const axis 0": _edit("definition", ("axes.h.value", 0)),
    "const axis negative": _edit("definition", ("axes.h.value", -1)),
    "const axis without value": _edit("definition", ("axes.h", {"type": "const"})),
    "axis of unknown type": _edit("definition", ("axes.n", {"type": "dyn"})),
    "dtype float64": _edit("definition", ("inputs.x.dtype", "float64")),
    "dtype float4_e2m1": _edit("definition", ("inputs.x.dtype", "float4_e2m1")),
    "dtype unknown": _edit("definition", ("inputs.x.dtype", "float7")),
    "scalar input": _edit("definition", ("inputs.eps", {"shape": None, "dtype": "float32"})),
    "0-d input": _edit("definition", ("inputs.s", {"shape": [], "dtype": "float32"})),
    "shape names an undeclared axis": _edit("definition", ("outputs.y.shape", ["n", "w"])),
    "reference without run": _edit("definition", ("reference", "def forward(x):\n    return x\n")),
    "reference run = lambda": _edit("definition", ("reference", "run = lambda x: x\n")),
    "reference async def run": _edit(
        "definition", ("reference", "async def run(x):\n    return x\n")
    ),
    "reference does not parse": _edit("definition", ("reference", "def run(x:\n")),
    "reference empty": _edit("definition", ("reference", "")),
    "input and output share a name": _edit(
        "definition", ("outputs.x", {"shape": ["n"], "dtype": "float32"})
    ),
    "name empty": _edit("definition", ("name", "")),
    "op_type empty": _edit("definition", ("op_type", "")),
    "outputs missing": _edit("definition", ("outputs", DELETE)),
    "empty tag": _edit("definition", ("tags", ["ok", ""])),
    "constraint ok": _edit("definition", ("constraints", ["n >= 1"])),
    "constraint does not parse": _edit("definition", ("constraints", ["n >= "])),
    "constraint names no axis or input": _edit("definition", ("constraints", ["n <= max_n"])),
    "constraint runs code": _edit("definition", ("constraints", ["__import__('os') == 0"])),
    "name with a path separator": _edit("definition", ("name", "a/b")),
    "unknown field kept": _edit("definition", ("website", "https://example.org")),
    # solutions
    "solution ok": _edit("solution"),
    "no sources": _edit("solution", ("sources", [])),
    "importable entry point without sources": _edit(
        "solution", ("spec.entry_point", "mypkg.kernels:run"), ("sources", DELETE)
    ),
    "entry point without ::": _edit("solution", ("spec.entry_point", "main.py")),
    "entry point with two ::": _edit("solution", ("spec.entry_point", "main.py::a::b")),
    "language torch": _edit("solution", ("spec.language", "torch")),
    "language tilelang": _edit("solution", ("spec.language", "tilelang")),
    "language unknown": _edit("solution", ("spec.language", "rust")),
    "target_hardware empty": _edit("solution", ("spec.target_hardware", [])),
    "target_hardware missing": _edit("solution", ("spec.target_hardware", DELETE)),
    "empty dependency": _edit("solution", ("spec.dependencies", [""])),
    "binding tvm-ffi": _edit("solution", ("spec.binding", "tvm-ffi")),
    "binding unknown": _edit("solution", ("spec.binding", "pybind")),
    "absolute source path": _edit(
        "solution", ("sources", [*SOLUTION["sources"], {"path": "/etc/x.py", "content": "x"}])
    ),
    "source path with ..": _edit(
        "solution", ("sources", [*SOLUTION["sources"], {"path": "../x.py", "content": "x"}])
    ),
    "duplicate source paths": _edit("solution", ("sources", SOLUTION["sources"] * 2)),
    "entry file not among the sources": _edit("solution", ("spec.entry_point", "other.py::run")),
    "empty source content": _edit(
        "solution", ("sources", [*SOLUTION["sources"], {"path": "util.py", "content": ""}])
    ),
    "solution name empty": _edit("solution", ("name", "")),
    "solution name with a path separator": _edit("solution", ("name", "a/b")),
    # traces
    "trace ok": _edit("trace"),
    "PASSED without correctness": _edit("trace", ("evaluation.correctness", DELETE)),
    "PASSED without performance": _edit("trace", ("evaluation.performance", DELETE)),
    "INCORRECT_NUMERICAL with performance": _edit(
        "trace", ("evaluation.status", "INCORRECT_NUMERICAL")
    ),
    "INCORRECT_NUMERICAL without correctness": _edit(
        "trace", ("evaluation.status", "INCORRECT_NUMERICAL"), *NO_METRICS
    ),
    "INCORRECT_SHAPE with correctness": _edit(
        "trace", ("evaluation.status", "INCORRECT_SHAPE"), ("evaluation.performance", DELETE)
    ),
    "RUNTIME_ERROR with performance {}": _edit(
        "trace",
        ("evaluation.status", "RUNTIME_ERROR"),
        ("evaluation.correctness", DELETE),
        ("evaluation.performance", {}),
    ),
    "COMPILE_ERROR without metrics": _edit(
        "trace", ("evaluation.status", "COMPILE_ERROR"), *NO_METRICS
    ),
    "status unknown": _edit("trace", ("evaluation.status", "FLAKY"), *NO_METRICS),
    "negative latency": _edit("trace", ("evaluation.performance.latency_ms", -1.0)),
    "negative speedup": _edit("trace", ("evaluation.performance.speedup_factor", -1.0)),
    "negative error": _edit("trace", ("evaluation.correctness.max_relative_error", -0.5)),
    "NaN error": _edit("trace", ("evaluation.correctness.max_absolute_error", "NaN")),
    "environment without hardware": _edit("trace", ("evaluation.environment.hardware", DELETE)),
    "environment hardware empty": _edit("trace", ("evaluation.environment.hardware", "")),
    "environment libs not strings": _edit("trace", ("evaluation.environment.libs", {"torch": 2})),
    "timestamp empty": _edit("trace", ("evaluation.timestamp", "")),
    "negative workload axis": _edit("trace", ("workload.axes.n", -2)),
    "workload without uuid": _edit("trace", ("workload.uuid", DELETE)),
    "workload without inputs": _edit("trace", ("workload.inputs", DELETE)),
    "safetensors input without tensor_key": _edit(
        "trace", ("workload.inputs.x", {"type": "safetensors", "path": "blob/x.safetensors"})
    ),
    "scalar input not a number": _edit(
        "trace", ("workload.inputs.x", {"type": "scalar", "value": "abc"})
    ),
    "input of unknown type": _edit("trace", ("workload.inputs.x", {"type": "zeros"})),
    "trace definition empty": _edit("trace", ("definition", "")),
}

# Where flashtune's verdict differs on purpose: case -> the line of docs/compatibility.md
# that lists it, and for a case flashtune refuses, the words of its error that say why.
DIFFERENCES: dict[str, tuple[str, str | None]] = {
    # flashtune is stricter
    "constraint names no axis or input": (
        "name only axes and inputs",
        "flashtune evaluates constraints",
    ),
    "constraint runs code": ("never runs a constraint as code", "rather than running"),
    "name with a path separator": ("must be one path component", "names a dataset file"),
    "solution name with a path separator": (
        "must be one path component",
        "names a dataset file",
    ),
    # flashtune is more lenient
    "dtype float64": ("dtypes `float64` and `uint8`", None),
    "importable entry point without sources": ("`package.module:function` entry points", None),
    "language torch": ("language `torch`", None),
    "target_hardware empty": ("An absent or empty `target_hardware`", None),
    "target_hardware missing": ("An absent or empty `target_hardware`", None),
    "empty source content": ("empty source content", None),
    "workload without inputs": ("a workload without `inputs`", None),
    "environment without hardware": ("an environment without `hardware`", None),
}


def _fib_accepts(kind: str, record: dict[str, Any]) -> bool:
    model = {"definition": fib.Definition, "solution": fib.Solution, "trace": fib.Trace}[kind]
    try:
        model.model_validate_json(json.dumps(record))
    except ValueError:
        return False
    return True


def _flashtune_errors(root: Path, kind: str, record: dict[str, Any]) -> list[str]:
    """flashtune's `validate` of a dataset holding the record (beside the base definition
    when the record is a solution or a trace)."""
    text = json.dumps(record)
    if kind == "definition":
        stem = record.get("name") if "/" not in str(record.get("name")) else "case"
        path = root / "definitions" / f"{stem or 'case'}.json"
    else:
        (root / "definitions").mkdir(parents=True)
        (root / "definitions" / "scale_h4.json").write_text(json.dumps(DEFINITION))
        folder = "solutions" if kind == "solution" else "traces"
        path = root / folder / ("case.json" if kind == "solution" else "scale_h4.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return [str(e) for e in Dataset(root).load_all()]


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 50
    assert set(DIFFERENCES) <= set(CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_validate_agrees_with_flashinfer_bench(case: str, tmp_path: Path) -> None:
    kind, record = CASES[case]
    theirs = _fib_accepts(kind, record)
    errors = _flashtune_errors(tmp_path, kind, record)
    ours = not errors
    if case not in DIFFERENCES:
        assert ours == theirs, f"FlashInfer-Bench accepts: {theirs}; flashtune: {errors}"
        return
    documented, why = DIFFERENCES[case]
    assert ours != theirs, f"{case!r} agrees now: drop it from DIFFERENCES and the docs"
    assert documented in DOCS.read_text(), f"docs/compatibility.md does not list {case!r}"
    if why is not None:
        assert any(why in e for e in errors), errors

"""Issue 12, the data layer: datasets come from strangers. Each test plants one attack as a
real file or model and checks it is refused, with a message naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import save_file
from typer.testing import CliRunner

from flashtune.cli import app
from flashtune.data import (
    ConstraintError,
    ConstraintNotAllowed,
    Dataset,
    Definition,
    InputError,
    Solution,
    Trace,
    Workload,
    check_constraint,
    check_constraints,
    evaluate_constraint,
    synthesize_inputs,
)
from flashtune.data.constraints import MAX_INT_BITS

# ----------------------------------------------------------------------------- fixtures

DEFINITION = {
    "name": "rows_h4",
    "op_type": "rows",
    "axes": {
        "batch_size": {"type": "var"},
        "len_indptr": {"type": "var"},
        "total": {"type": "var"},
        "h": {"type": "const", "value": 4},
    },
    "constraints": ["len_indptr == batch_size + 1", "total == indptr[-1].item()"],
    "inputs": {
        "x": {"shape": ["batch_size", "h"], "dtype": "float32"},
        "indptr": {"shape": ["len_indptr"], "dtype": "int32"},
    },
    "outputs": {"y": {"shape": ["batch_size", "h"], "dtype": "float32"}},
    "reference": "def run(x, indptr):\n    return x\n",
}
AXES = {"batch_size": 1, "len_indptr": 2, "total": 3}

SOLUTION = {
    "name": "mine",
    "definition": "rows_h4",
    "author": "alice",
    "spec": {"language": "python", "target_hardware": [], "entry_point": "main.py::run"},
    "sources": [{"path": "main.py", "content": "def run(x, indptr):\n    return x\n"}],
}


def _raw(**changes: object) -> dict:
    return json.loads(json.dumps(DEFINITION)) | changes


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _write_definition(root: Path, **changes: object) -> Path:
    raw = _raw(**changes)
    return _write(root / "definitions" / "rows" / f"{raw['name']}.json", json.dumps(raw))


def _write_workload(root: Path, inputs: dict, axes: dict | None = None) -> Path:
    record = {
        "definition": "rows_h4",
        "solution": None,
        "workload": {"uuid": "w1", "axes": axes or AXES, "inputs": inputs},
        "evaluation": None,
    }
    return _write(root / "workloads" / "rows" / "rows_h4.jsonl", json.dumps(record) + "\n")


def _blob_input(key: str = "x") -> dict:
    return {"type": "safetensors", "path": "blob/rows_h4/w1.safetensors", "tensor_key": key}


def _save_blob(root: Path, **tensors: torch.Tensor) -> Path:
    path = root / "blob" / "rows_h4" / "w1.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


def _errors(root: Path) -> list[str]:
    return [str(e) for e in Dataset(root).load_all()]


def _validate(root: Path) -> str:
    """`flashtune validate ROOT`: must exit 1; its output with whitespace removed (rich
    wraps long lines)."""
    result = CliRunner().invoke(app, ["validate", str(root)])
    assert result.exit_code == 1, result.output
    return "".join(result.output.split())


def _squeezed(text: str) -> str:
    return "".join(text.split())


@pytest.fixture
def ds_root(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    _write_definition(root)
    return root


# ----------------------------------------------------------------------------- 1. constraints


def _attacks(marker: Path) -> list[str]:
    return [
        f"torch.os.system('touch {marker}') == 0",
        f"__import__('os').system('touch {marker}') == 0",
        "().__class__.__bases__[0].__subclasses__() == 0",
        "x.__class__ == 0",
        "len.__self__ == 0",
        "x.numpy() == 0",
        "x.sum() == 0",
        "(lambda: 1)() == 1",
        "[i for i in x] == 0",
        "max(x, key=len) == 0",
        "open('/etc/passwd') == 0",
        "'a' * 3 == 0",
        "total == (total := 3)",
        "len(*x) == 0",
        "x @ x == 0",
        "total << 10 == 0",
        "total if total else total",
        "total is total",
        "None == total",
    ]


def test_constraint_code_is_refused_at_validation(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    for attack in _attacks(marker):
        raw = _raw(constraints=[attack])
        with pytest.raises(ValidationError, match="is not allowed") as info:
            Definition.model_validate(raw)
        assert attack in str(info.value) or repr(attack) in str(info.value)
    assert not marker.exists()


def test_constraint_code_is_never_run_by_synthesis(tmp_path: Path) -> None:
    """A Definition that skipped validation (model_construct) still cannot run code."""
    marker = tmp_path / "PWNED"
    good = Definition.model_validate(_raw())
    workload = Workload(uuid="w", axes=AXES, inputs={})
    for attack in _attacks(marker):
        forged = good.model_copy(update={"constraints": [attack]})
        with pytest.raises(ConstraintError, match="not allowed|does not parse"):
            synthesize_inputs(forged, workload)
    assert not marker.exists()


def test_validate_names_file_and_constraint_without_running_it(
    tmp_path: Path, ds_root: Path
) -> None:
    marker = tmp_path / "PWNED"
    attack = f"torch.os.system('touch {marker}') == 0"
    bad = _write_definition(ds_root, name="evil", constraints=[attack])
    (error,) = _errors(ds_root)
    assert str(bad) in error and repr(attack) in error and "is not allowed" in error
    out = _validate(ds_root)
    assert _squeezed(str(bad)) in out and _squeezed(repr(attack)) in out
    assert not marker.exists()


def test_huge_power_is_refused_before_it_is_computed() -> None:
    # 9 ** 9 ** 9 ** 9 would not finish: the refusal names the size limit it would exceed.
    definition = Definition.model_validate(_raw(constraints=["total == 9 ** 9 ** 9 ** 9"]))
    with pytest.raises(ConstraintError, match=f"exceeds {MAX_INT_BITS} bits"):
        synthesize_inputs(definition, Workload(uuid="w", axes=AXES, inputs={}))


def test_list_repetition_is_refused() -> None:
    with pytest.raises(TypeError, match="arithmetic on a list"):
        evaluate_constraint("len([0] * 1000000000000) == 0", {})


@pytest.mark.parametrize(
    "text", ["(" * 300 + "1" + ")" * 300, "-" * 2000 + "1", "x\x00 == 1", "1 == " * 400 + "1"]
)
def test_hostile_shapes_of_text_are_refused_not_crashing(text: str) -> None:
    with pytest.raises(ConstraintNotAllowed):
        check_constraint(text, {"x"})


def test_allowed_constructs_evaluate() -> None:
    x = torch.tensor([0, 2, 5], dtype=torch.int32)
    values = {"x": x, "n": 3, "total": 5}
    cases = {
        "n == x.shape[0]": True,
        "total == x[-1].item()": True,
        "all(x[1:] >= x[:-1])": True,
        "0 <= x < 6": True,  # chained, element-wise on tensors
        "0 < x": False,  # x[0] == 0
        "sum(x > 0) == 2": True,
        "len(x) == n and not n == 4 or False": True,
        "~(x < 0)": True,
        "n // 2 + n % 2 * 2 ** 3 - abs(-1) == 8": True,
        "min(n, total) == 3 and max([n, total]) == 5 and int(1.0) == 1": True,
        "any([n == 1, n == 3])": True,
        "(x >= 0) & (x <= total)": True,
    }
    from flashtune.data.constraints import holds

    for expr, want in cases.items():
        assert holds(evaluate_constraint(expr, values)) is want, expr


def test_every_corpus_constraint_passes_the_checker(trace_corpus: Path) -> None:
    roots = [trace_corpus, Path(__file__).resolve().parents[2] / "src/flashtune/dataset"]
    seen = 0
    for root in roots:
        for path in (root / "definitions").rglob("*.json"):
            raw = json.loads(path.read_text())
            names = set(raw["axes"]) | set(raw["inputs"])
            for expr in raw.get("constraints", []):
                check_constraint(expr, names)
                seen += 1
    assert seen > 0


def test_check_constraints_still_reports_unsatisfied() -> None:
    d = Definition.model_validate(_raw())
    inputs = {"x": torch.zeros(1, 4), "indptr": torch.tensor([0, 2], dtype=torch.int32)}
    with pytest.raises(ConstraintError, match=r"total == indptr\[-1\]\.item\(\)"):
        check_constraints(d, {**AXES, "h": 4}, inputs)


# ----------------------------------------------------------------------------- 2. path names

BAD_NAMES = [
    "../../../../tmp/ESCAPED",
    "a/b",
    "..",
    ".",
    "",
    "/abs",
    "a\\b",
    "C:",
    "x\x00y",
    "x\ny",
    "x\x7f",
]


@pytest.mark.parametrize("field", ["author", "name", "definition"])
@pytest.mark.parametrize("value", BAD_NAMES, ids=repr)
def test_solution_names_must_be_path_components(field: str, value: str) -> None:
    with pytest.raises(ValidationError, match=field):
        Solution.model_validate(SOLUTION | {field: value})


@pytest.mark.parametrize("field", ["name", "op_type"])
@pytest.mark.parametrize("value", BAD_NAMES, ids=repr)
def test_definition_names_must_be_path_components(field: str, value: str) -> None:
    with pytest.raises(ValidationError, match=field):
        Definition.model_validate(_raw(**{field: value}))


def test_trace_definition_must_be_a_path_component() -> None:
    with pytest.raises(ValidationError, match="definition"):
        Trace.model_validate({"definition": "../x", "workload": {"uuid": "w", "axes": {}}})


def test_ordinary_names_still_load() -> None:
    for name in ["gqa_paged_decode_h32_kv8_d128_ps1", "silu-and.mul_v2", "flash infer"]:
        solution = Solution.model_validate(SOLUTION | {"author": name, "name": name})
        assert (solution.author, solution.name) == (name, name)


def test_trace_with_escaping_author_is_not_written_outside(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ds = Dataset(out)
    ds.add_definition(Definition.model_validate(_raw()))
    trace = Trace.model_validate({"definition": "rows_h4", "workload": {"uuid": "w", "axes": AXES}})
    with pytest.raises(ValueError, match=r"solution\.author '\.\./\.\./escaped'"):
        ds.append_trace(trace, author="../../escaped")
    assert not (tmp_path / "escaped").exists()
    assert [p for p in tmp_path.rglob("*.jsonl")] == []


def test_dataset_defends_against_models_that_skipped_validation(tmp_path: Path) -> None:
    ds = Dataset(tmp_path / "out")
    evil = Solution.model_validate(SOLUTION).model_copy(update={"author": "../../ESCAPED"})
    with pytest.raises(ValueError, match="solution.author"):
        ds.add_solution(evil)
    definition = Definition.model_validate(_raw()).model_copy(update={"op_type": "../.."})
    with pytest.raises(ValueError, match="definition.op_type"):
        ds.add_definition(definition)
    with pytest.raises(ValueError, match="definition.op_type"):
        ds.add_workloads(definition, [])
    with pytest.raises(ValueError, match="definition"):
        ds.traces_for("../x")
    assert list(tmp_path.rglob("*.json*")) == []


def test_validate_rejects_solution_with_escaping_author(ds_root: Path) -> None:
    solution = SOLUTION | {"author": "../../../../tmp/ESCAPED"}
    bad = _write(
        ds_root / "solutions" / "x" / "rows" / "rows_h4" / "mine.json", json.dumps(solution)
    )
    (error,) = _errors(ds_root)
    assert str(bad) in error and "[author]" in error and "ESCAPED" in error
    out = _validate(ds_root)
    assert _squeezed(str(bad)) in out and "[author]" in out


# ----------------------------------------------------------------------------- 3. blob shapes


def _blob_workload(inputs: dict, axes: dict | None = None) -> Workload:
    return Workload(uuid="w1", axes=axes or AXES, inputs=inputs)


def test_blob_with_extra_rows_is_an_input_error(ds_root: Path) -> None:
    blob = _save_blob(ds_root, x=torch.randn(3, 4))  # 3 rows, but batch_size=1
    definition = Definition.model_validate(_raw())
    with pytest.raises(InputError) as info:
        synthesize_inputs(definition, _blob_workload({"x": _blob_input()}), blob_root=ds_root)
    message = str(info.value)
    for needle in (str(blob), "'x'", "'batch_size'", "size 3", "expected 1"):
        assert needle in message, message
    assert isinstance(info.value, ValueError)


def test_blob_with_wrong_rank_or_dtype_is_an_input_error(ds_root: Path) -> None:
    definition = Definition.model_validate(_raw())
    workload = _blob_workload({"x": _blob_input()})
    _save_blob(ds_root, x=torch.randn(4))
    with pytest.raises(InputError, match="1 dimensions"):
        synthesize_inputs(definition, workload, blob_root=ds_root)
    _save_blob(ds_root, x=torch.randn(1, 4, dtype=torch.float64))
    with pytest.raises(InputError, match="dtype torch.float64, expected float32"):
        synthesize_inputs(definition, workload, blob_root=ds_root)


def test_matching_blob_loads(ds_root: Path) -> None:
    x = torch.randn(1, 4)
    _save_blob(ds_root, x=x)
    definition = Definition.model_validate(_raw())
    got = synthesize_inputs(definition, _blob_workload({"x": _blob_input()}), blob_root=ds_root)
    assert torch.equal(got["x"], x)


def test_garbage_blob_is_an_input_error(ds_root: Path) -> None:
    path = _write(ds_root / "blob" / "rows_h4" / "w1.safetensors", "\x10" + "\x00" * 7 + "junk!")
    definition = Definition.model_validate(_raw())
    with pytest.raises(InputError, match="not a readable safetensors file") as info:
        synthesize_inputs(definition, _blob_workload({"x": _blob_input()}), blob_root=ds_root)
    assert str(path) in str(info.value)


def test_validate_reports_blob_shape_mismatch(ds_root: Path) -> None:
    blob = _save_blob(ds_root, x=torch.randn(3, 4))
    bad = _write_workload(ds_root, {"x": _blob_input()})
    (error,) = _errors(ds_root)
    for needle in (
        str(bad),
        str(blob),
        "inputs.x",
        "[3, 4]",
        "expected [1, 4]",
        "axis 'batch_size' is 3",
    ):
        assert needle in error, error


# ----------------------------------------------------------------------------- 4. validate


def test_validate_reports_garbage_blob_header(ds_root: Path) -> None:
    blob = _write(ds_root / "blob" / "rows_h4" / "w1.safetensors", "\xff" * 8 + "garbage")
    bad = _write_workload(ds_root, {"x": _blob_input()})
    (error,) = _errors(ds_root)
    assert str(bad) in error and str(blob) in error and "not a readable safetensors" in error
    out = _validate(ds_root)
    assert _squeezed(str(blob)) in out


def test_validate_reports_missing_tensor_key(ds_root: Path) -> None:
    _save_blob(ds_root, y=torch.randn(1, 4))
    _write_workload(ds_root, {"x": _blob_input()})
    (error,) = _errors(ds_root)
    assert "no tensor 'x'" in error


def test_validate_reports_negative_const_axis(ds_root: Path) -> None:
    axes = _raw()["axes"] | {"h": {"type": "const", "value": -4}}
    bad = _write_definition(ds_root, name="negative", axes=axes)
    (error,) = _errors(ds_root)
    assert str(bad) in error and "axes.h.value" in error and "non-negative" in error
    out = _validate(ds_root)
    assert _squeezed(str(bad)) in out and "axes.h.value" in out


def test_zero_const_axis_loads_as_in_flashinfer_bench(ds_root: Path) -> None:
    axes = _raw()["axes"] | {"h": {"type": "const", "value": 0}}
    _write_definition(ds_root, name="empty", axes=axes)
    assert _errors(ds_root) == []


def test_axes_without_type_load_as_flashinfer_bench_writes_them(ds_root: Path) -> None:
    """FlashInfer-Bench's Python API (AxisVar(), AxisConst(value=N)) saves axes without a
    "type": a value makes a const axis, none a var axis; the definition's workloads stay
    attached to it."""
    from flashtune.data import Dataset

    raw = _raw()
    untyped = {
        name: {k: v for k, v in axis.items() if k != "type"} for name, axis in raw["axes"].items()
    }
    _write_definition(ds_root, axes=untyped)
    _save_blob(ds_root, x=torch.randn(1, 4))
    _write_workload(ds_root, {"x": _blob_input()})
    assert _errors(ds_root) == []
    ds = Dataset(ds_root)
    d = ds.definition(raw["name"])
    assert d.const_axes == {n: a["value"] for n, a in raw["axes"].items() if a["type"] == "const"}
    assert set(d.var_axes) == {n for n, a in raw["axes"].items() if a["type"] == "var"}
    assert len(ds.workloads_for(raw["name"])) == 1


def test_matching_blob_validates_clean(ds_root: Path) -> None:
    _save_blob(ds_root, x=torch.randn(1, 4))
    _write_workload(ds_root, {"x": _blob_input()})
    assert _errors(ds_root) == []


# ~3 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
@pytest.mark.slow
def test_flashtune_run_reports_a_blob_that_does_not_fit_as_an_input_error(
    ds_root: Path, tmp_path: Path
) -> None:
    from flashtune.bench.evaluate import BenchConfig
    from flashtune.bench.runner import RunOptions, run_benchmark

    _write_definition(ds_root)
    _write(ds_root / "solutions" / "alice" / "rows" / "rows_h4" / "mine.json", json.dumps(SOLUTION))
    blob = _save_blob(ds_root, x=torch.randn(3, 4), indptr=torch.tensor([0, 3], dtype=torch.int32))
    _write_workload(ds_root, {"x": _blob_input(), "indptr": _blob_input("indptr")})
    opts = RunOptions(
        datasets=[ds_root],
        out=tmp_path / "out",
        devices=["cpu"],
        config=BenchConfig(warmup=1, iterations=2, trials=1),
    )
    result = run_benchmark(opts, progress=False)
    (trace,) = result.traces
    assert trace.evaluation.status.value == "INCORRECT_SHAPE"  # not PASSED as batch 1
    reason = trace.evaluation.reason
    for needle in ("workload input error", str(blob), "'batch_size'", "size 3"):
        assert needle in reason, reason

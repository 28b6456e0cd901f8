"""Every validation error, planted as a real malformed file: a message naming the file (and
line / field) and the problem, while the rest of the dataset still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _examples import GOOD_DEFINITION
from flashtune.cli import app
from flashtune.data import Dataset


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _definition(root: Path, **changes: object) -> Path:
    d = json.loads(json.dumps(GOOD_DEFINITION))
    d.update(changes)
    return _write(root / "definitions" / "scale" / f"{d['name']}.json", json.dumps(d))


def _errors(root: Path) -> list[str]:
    ds = Dataset(root)
    ds.load_all()
    # The good definition always loads, whatever else is broken.
    assert "scale_h8" in ds.definitions
    return [str(e) for e in ds.errors]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    _definition(tmp_path)
    return tmp_path


def _only(errors: list[str], path: Path, *needles: str) -> None:
    assert len(errors) == 1, errors
    assert str(path) in errors[0]
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_malformed_json(root: Path) -> None:
    bad = _write(root / "definitions" / "scale" / "broken.json", '{"name": "broken", ')
    _only(_errors(root), bad, "malformed JSON")


def test_duplicate_keys(root: Path) -> None:
    text = json.dumps(GOOD_DEFINITION | {"name": "dup"})[:-1] + ', "name": "dup2"}'
    bad = _write(root / "definitions" / "scale" / "dup.json", text)
    _only(_errors(root), bad, "duplicate key 'name'")


def test_unknown_dtype(root: Path) -> None:
    inputs = {"x": {"shape": ["n", "h"], "dtype": "float7"}}
    bad = _definition(root, name="bad_dtype", inputs=inputs)
    _only(_errors(root), bad, "inputs.x.dtype")


def test_missing_reference(root: Path) -> None:
    d = dict(GOOD_DEFINITION, name="no_ref")
    del d["reference"]
    bad = _write(root / "definitions" / "scale" / "no_ref.json", json.dumps(d))
    _only(_errors(root), bad, "[reference]", "Field required")


def test_reference_does_not_parse(root: Path) -> None:
    bad = _definition(root, name="bad_ref", reference="def run(x:\n  return x")
    _only(_errors(root), bad, "reference does not parse")


def test_reference_without_run(root: Path) -> None:
    bad = _definition(root, name="no_run", reference="def forward(x):\n    return x\n")
    _only(_errors(root), bad, "must define a top-level function `def run(...)`")


def test_shape_names_undeclared_axis(root: Path) -> None:
    bad = _definition(
        root, name="bad_axis", outputs={"y": {"shape": ["n", "w"], "dtype": "float32"}}
    )
    _only(_errors(root), bad, "outputs.y.shape names axis 'w'")


def test_input_and_output_share_a_name(root: Path) -> None:
    bad = _definition(root, name="shared", outputs={"x": {"shape": ["n", "h"], "dtype": "float32"}})
    _only(_errors(root), bad, "both input and output", "'x'")


def test_constraint_does_not_parse(root: Path) -> None:
    bad = _definition(root, name="bad_constraint", constraints=["n >= "])
    _only(_errors(root), bad, "constraint [0]", "does not parse")


def test_constraint_names_unknown_thing(root: Path) -> None:
    bad = _definition(root, name="unknown_name", constraints=["n == m + 1"])
    _only(_errors(root), bad, "'m'")


@pytest.mark.parametrize("path", ["/etc/passwd.py", "../escape.py", "a/../../b.py"])
def test_unsafe_solution_source_path(root: Path, path: str) -> None:
    solution = {
        "name": "evil",
        "definition": "scale_h8",
        "author": "x",
        "spec": {"language": "python", "target_hardware": [], "entry_point": "main.py::run"},
        "sources": [
            {"path": path, "content": "def run(x): return x"},
            {"path": "main.py", "content": ""},
        ],
    }
    bad = _write(
        root / "solutions" / "x" / "scale" / "scale_h8" / "evil.json", json.dumps(solution)
    )
    _only(_errors(root), bad, "unsafe source path")


def test_solution_entry_file_missing(root: Path) -> None:
    solution = {
        "name": "lost",
        "definition": "scale_h8",
        "author": "x",
        "spec": {"language": "python", "target_hardware": [], "entry_point": "main.py::run"},
        "sources": [{"path": "other.py", "content": "def run(x): return x"}],
    }
    bad = _write(
        root / "solutions" / "x" / "scale" / "scale_h8" / "lost.json", json.dumps(solution)
    )
    _only(_errors(root), bad, "'main.py' is not among the sources")


def _workload_line(axes: dict, inputs: dict | None = None, definition: str = "scale_h8") -> str:
    record = {
        "definition": definition,
        "solution": None,
        "workload": {"uuid": "w1", "axes": axes, "inputs": inputs or {"x": {"type": "random"}}},
        "evaluation": None,
    }
    return json.dumps(record)


def test_workload_names_unknown_axis(root: Path) -> None:
    bad = _write(
        root / "workloads" / "scale" / "scale_h8.jsonl", _workload_line({"n": 4, "zz": 3}) + "\n"
    )
    _only(_errors(root), bad, "unknown axes ['zz']")


def test_workload_leaves_var_axis_unset(root: Path) -> None:
    bad = _write(root / "workloads" / "scale" / "scale_h8.jsonl", _workload_line({}) + "\n")
    _only(_errors(root), bad, "var axes ['n']", "not set")


def test_workload_contradicts_const_axis(root: Path) -> None:
    bad = _write(
        root / "workloads" / "scale" / "scale_h8.jsonl", _workload_line({"n": 2, "h": 9}) + "\n"
    )
    _only(_errors(root), bad, "fixes it to 8")


def test_blob_path_outside_root(root: Path) -> None:
    inputs = {"x": {"type": "safetensors", "path": "../../secret.safetensors", "tensor_key": "x"}}
    bad = _write(
        root / "workloads" / "scale" / "scale_h8.jsonl", _workload_line({"n": 2}, inputs) + "\n"
    )
    _only(_errors(root), bad, "escapes the dataset root")


def test_corrupt_jsonl_line_names_line_and_keeps_others(root: Path) -> None:
    good = _workload_line({"n": 2})
    bad = _write(root / "workloads" / "scale" / "scale_h8.jsonl", f"{good}\n{{not json\n{good}\n")
    errors = _errors(root)
    _only(errors, bad, ":2:", "malformed JSON")
    assert len(Dataset(root).workloads_for("scale_h8")) == 2


def test_validate_cli_lists_every_error_and_exits_1(root: Path) -> None:
    _definition(root, name="bad_one", reference="oops(")
    _definition(root, name="bad_two", inputs={"x": {"shape": ["q"], "dtype": "float32"}})
    result = CliRunner().invoke(app, ["validate", str(root)])
    assert result.exit_code == 1
    assert "bad_one.json" in result.output and "bad_two.json" in result.output
    assert "2 error(s)" in result.output


def test_validate_cli_ok_exits_0(root: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(root)])
    assert result.exit_code == 0, result.output
    assert "1 definitions" in result.output

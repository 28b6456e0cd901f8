"""No silent mistakes: a selection that selects nothing, a path that is not a dataset, a GPU
that is not there, a definition hidden by another, a missing blob, an interruption."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _examples import GOOD_DEFINITION
from flashtune.cli import app, bundled_dataset
from flashtune.cli.common import missing_blobs, shadowed_definitions
from flashtune.cli.run_checks import Counted
from flashtune.data import Dataset, Definition, Workload

runner = CliRunner()
WIDE = {"COLUMNS": "300"}


def _scale_dataset(root: Path, reference: str | None = None) -> Path:
    ds = Dataset(root)
    fields = GOOD_DEFINITION if reference is None else GOOD_DEFINITION | {"reference": reference}
    d = Definition.model_validate(fields)
    ds.add_definition(d)
    ds.add_workloads(d, [Workload(uuid="w0", axes={"n": 1}, inputs={})])
    return root


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--definitions", "nosuch", "selects none of the"),
        ("--op-type", "nosuch", "selects none of the"),
        ("--solutions", "nosuch", "matches none of the solutions"),
    ],
)
def test_run_that_selects_nothing_says_so(flag: str, value: str, says: str) -> None:
    result = runner.invoke(app, ["run", flag, value, "-q"], env=WIDE)
    assert result.exit_code == 1, result.output
    assert says in result.stderr and repr(value) in result.stderr
    assert "triples" not in result.stdout  # no empty table, no "nothing to do"


def test_run_without_solutions_names_the_bundled_baselines(tmp_path: Path) -> None:
    src = next((bundled_dataset() / "definitions").rglob("rmsnorm_h4096.json"))
    target = tmp_path / "public" / "definitions" / "rmsnorm" / src.name
    target.parent.mkdir(parents=True)
    shutil.copy(src, target)
    public = str(tmp_path / "public")
    result = runner.invoke(app, ["run", "-d", public, "--no-bundled-solutions", "-q"], env=WIDE)
    assert result.exit_code == 1, result.output
    assert "no solutions for the 1 selected definitions" in result.stderr
    assert "leave out --no-bundled-solutions" in result.stderr
    assert "torch@rmsnorm_h4096" in result.stderr
    # By default they attach (same contract): what is missing now is a workload to run.
    result = runner.invoke(app, ["run", "-d", public, "-q"], env=WIDE)
    assert result.exit_code == 1, result.output
    assert "have no workloads in" in result.stderr and "no solutions" not in result.stderr


def test_run_on_a_gpu_that_is_not_there_names_what_is_visible() -> None:
    result = runner.invoke(app, ["run", "--devices", "99", "-q"], env=WIDE)
    assert result.exit_code == 2, result.output
    assert "cuda:99 not visible" in result.stderr and "visible: " in result.stderr
    assert "Traceback" not in result.output


def test_validate_refuses_a_folder_that_is_not_a_dataset(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(tmp_path)], env=WIDE)
    assert result.exit_code == 1 and "not a dataset" in result.stderr


def test_list_that_matches_nothing_fails(tmp_path: Path) -> None:
    root = _scale_dataset(tmp_path / "ds")
    result = runner.invoke(app, ["list", "definitions", "-d", str(root), "--name", "typo"])
    assert result.exit_code == 1
    assert "no definitions" in result.stderr and "'typo'" in result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["list", "definitions"],
        ["list", "traces"],
        ["report", "summary"],
        ["apply", "show"],
        ["run"],
    ],
)
def test_a_folder_that_is_not_a_dataset_is_refused(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "notes").mkdir()
    result = runner.invoke(app, [*command, "-d", str(tmp_path / "notes")], env=WIDE)
    assert result.exit_code == 2
    assert "not a dataset" in result.stderr


def test_shadowed_definition_warns_with_both_paths(tmp_path: Path) -> None:
    first = _scale_dataset(tmp_path / "a")
    second = _scale_dataset(tmp_path / "b", reference="import torch\n\ndef run(x):\n    return x\n")
    (message,) = shadowed_definitions([first, second])
    assert "scale_h8" in message and "reference" in message
    assert str(first / "definitions" / "scale" / "scale_h8.json") in message
    assert str(second / "definitions" / "scale" / "scale_h8.json") in message
    result = runner.invoke(
        app, ["list", "definitions", "-d", str(first), "-d", str(second)], env=WIDE
    )
    assert result.exit_code == 0 and "warning" in result.stderr and "differs" in result.stderr
    same = _scale_dataset(tmp_path / "c")
    assert shadowed_definitions([first, same]) == []  # identical: nothing to say


def _dataset_with_missing_blob(root: Path) -> Path:
    ds = Dataset(_scale_dataset(root))
    d = ds.definition("scale_h8")
    blob = {"type": "safetensors", "path": "blob/x.safetensors", "tensor_key": "x"}
    ds.add_workloads(
        d, [Workload.model_validate({"uuid": "w1", "axes": {"n": 2}, "inputs": {"x": blob}})]
    )
    return root


def test_validate_reports_missing_blobs(tmp_path: Path) -> None:
    root = _dataset_with_missing_blob(tmp_path / "ds")
    (found,) = missing_blobs(Dataset(root), Dataset(root).definitions.values())
    assert (found.workload, found.input) == ("w1", "x")
    result = runner.invoke(app, ["validate", str(root)], env=WIDE)
    assert result.exit_code == 0, result.output  # absent blobs are synthesized, not errors
    assert "1 safetensors input(s) of 1 workload(s) have no blob file" in result.output
    assert str(root / "blob" / "x.safetensors") in result.output


def test_run_says_it_synthesizes_missing_blobs(tmp_path: Path) -> None:
    root = _dataset_with_missing_blob(tmp_path / "ds")
    sol = {
        "name": "mine",
        "definition": "scale_h8",
        "author": "me",
        "spec": {"language": "python", "target_hardware": ["cpu"], "entry_point": "main.py::run"},
        "sources": [{"path": "main.py", "content": "def run(x):\n    return x * 2\n"}],
    }
    path = root / "solutions" / "me" / "scale" / "scale_h8" / "mine.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(sol))
    # --devices 99 stops the run before any worker starts, after the note.
    result = runner.invoke(app, ["run", "-d", str(root), "--devices", "99", "-q"], env=WIDE)
    assert result.exit_code == 2, result.output
    assert "have no blob file: they are synthesized" in result.stderr


def test_ctrl_c_says_how_far_and_how_to_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    import flashtune.bench.runner as runner_module

    def interrupted(opts, console=None, progress=True, on_trace=None, on_start=None, pool=None):
        on_start(5)
        for _ in range(2):
            on_trace(None)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner_module, "run_benchmark", interrupted)
    result = runner.invoke(
        app, ["run", "--devices", "cpu", "--definitions", "rmsnorm_h4096", "-q"], env=WIDE
    )
    assert result.exit_code == 130
    assert "interrupted by SIGINT after 2 of 5 triples" in result.stderr
    assert "`flashtune run --resume` continues" in result.stderr


def test_counted_message_without_a_total() -> None:
    count = Counted()
    assert "by SIGTERM after 0 triples" in count.interrupted_message(Path("out"), "SIGTERM")

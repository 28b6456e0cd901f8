"""The dataset commands of the CLI on a small dataset made here."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from _examples import GOOD_DEFINITION
from flashtune.cli import app
from flashtune.data import Dataset, Definition, Workload

runner = CliRunner()


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    ds = Dataset(tmp_path)
    for name, op in [("scale_h8", "scale"), ("scale_h16", "scale"), ("other_h8", "other")]:
        d = Definition.model_validate(GOOD_DEFINITION | {"name": name, "op_type": op})
        ds.add_definition(d)
        ds.add_workloads(
            d, [Workload(uuid=f"{name}-w{i}", axes={"n": i + 1}, inputs={}) for i in range(2)]
        )
    return tmp_path


def test_list_definitions_filters(dataset: Path) -> None:
    result = runner.invoke(
        app,
        ["list", "definitions", "-d", str(dataset), "--op-type", "scale"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert (
        "scale_h8" in result.output
        and "scale_h16" in result.output
        and "other_h8" not in result.output
    )
    assert "2 definitions" in result.output


def test_list_workloads_by_name_glob(dataset: Path) -> None:
    result = runner.invoke(
        app, ["list", "workloads", "-d", str(dataset), "--name", "*_h8"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "4 workloads" in result.output
    assert "scale_h8-w1" in result.output and "scale_h16-w0" not in result.output


def test_list_rejects_unknown_kind(dataset: Path) -> None:
    result = runner.invoke(app, ["list", "things", "-d", str(dataset)])
    assert result.exit_code == 2
    assert "kind must be one of" in result.stderr


def test_validate_missing_folder(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(tmp_path / "nope")], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert "no such folder" in result.stderr

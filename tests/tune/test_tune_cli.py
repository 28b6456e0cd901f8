"""`flashtune tune` and `flashtune tune merge`, mounted the way flashtune's CLI mounts them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from flashtune.cli.tune import app as tune_app
from flashtune.tune.cache_file import current_metadata, read_cache_file

root = typer.Typer()
root.add_typer(tune_app, name="tune")


@root.command()
def version() -> None:  # a second command, so `tune` stays a subcommand as in flashtune's CLI
    typer.echo("0")


runner = CliRunner()


def write(path: Path, entries: dict, **meta: str) -> None:
    doc = {"_metadata": dict(current_metadata(), **meta)}
    doc.update({str(k): v for k, v in entries.items()})
    path.write_text(json.dumps(doc))


def test_merge_agreeing_files(tmp_path: Path) -> None:
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "out.json"
    k1, k2, k3 = (("gemm", "R", ((m, 8),)) for m in (1, 2, 4))
    write(a, {k1: ["R", 1], k2: ["R", [64, [2, 3]]]}, gpu_name="*")
    write(b, {k2: ["R", 5], k3: ["R", 2]})
    result = runner.invoke(root, ["tune", "merge", str(a), str(b), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "3 configs" in result.output and "1 conflicting" in result.output
    merged = read_cache_file(out)
    assert merged.status == "ok"
    assert merged.entries == {k1: ("R", 1), k2: ("R", 5), k3: ("R", 2)}
    assert merged.metadata["gpu_name"] == current_metadata()["gpu_name"]  # wildcard resolved


def test_merge_refuses_other_environment_and_corrupt_files(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    write(a, {("gemm", "R", ((1, 8),)): ["R", 1]})
    write(b, {("gemm", "R", ((2, 8),)): ["R", 1]}, torch_version="0.0")
    c.write_text("{")
    out = tmp_path / "out.json"
    result = runner.invoke(root, ["tune", "merge", str(a), str(b), "-o", str(out)])
    assert result.exit_code == 1 and "torch_version" in result.output
    result = runner.invoke(root, ["tune", "merge", str(a), str(c), "-o", str(out)])
    assert result.exit_code == 1 and "corrupt" in result.output
    assert not out.exists()


def test_tune_validates_its_options() -> None:
    result = runner.invoke(root, ["tune", "--ops", "gemm,nope", "--device", "cpu"])
    assert result.exit_code == 2 and "nope" in result.output
    result = runner.invoke(root, ["tune", "--model", "gpt-9", "--device", "cpu"])
    assert result.exit_code == 2 and "gpt-9" in result.output
    result = runner.invoke(root, ["tune", "--help"])
    assert result.exit_code == 0 and "merge" in result.output and "--ops" in result.output
    assert "--budget" in result.output and "--session-budget" in result.output
    result = runner.invoke(root, ["tune", "--ops", "gemm", "--device", "cpu", "--budget", "0"])
    assert result.exit_code == 2 and "--budget" in result.output


def test_merge_fills_new_metadata_fields_and_merges_the_decision_records(tmp_path: Path) -> None:
    from flashtune.tune.store import decisions_path

    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "out.json"
    write(a, {("gemm", "R", ((1, 8),)): ["R", 1]})
    doc = json.loads(a.read_text())
    del doc["_metadata"]["device_capability"]  # a file written before the field existed
    a.write_text(json.dumps(doc))
    write(b, {("gemm", "R", ((2, 8),)): ["R", 2]}, device_capability="9.0")
    decisions_path(a).write_text(json.dumps({"k1": {"kind": "tuned"}, "k2": {"kind": "x"}}))
    decisions_path(b).write_text(json.dumps({"k2": {"kind": "default-kept"}}))
    result = runner.invoke(root, ["tune", "merge", str(a), str(b), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["_metadata"]["device_capability"] == "9.0"
    assert json.loads(decisions_path(out).read_text()) == {
        "k1": {"kind": "tuned"},
        "k2": {"kind": "default-kept"},
    }
    # Another device's file is refused, naming the field.
    c = tmp_path / "c.json"
    write(c, {}, device_capability="10.0")
    result = runner.invoke(root, ["tune", "merge", str(b), str(c), "-o", str(out)])
    assert result.exit_code == 1 and "device_capability" in result.output


@pytest.mark.cuda
def test_tune_gemm_on_gpu(tmp_path: Path) -> None:
    cache = tmp_path / "cfg.json"
    result = runner.invoke(
        root,
        [
            "tune",
            "--ops",
            "gemm",
            "--model",
            "llama-3.1-8b",
            "--max-tokens",
            "4",
            "--cache",
            str(cache),
            "--budget",
            "20",
        ],
    )
    assert result.exit_code == 0, result.output
    assert len(read_cache_file(cache).entries) >= 3 * 4  # 3 buckets x 4 linear layers

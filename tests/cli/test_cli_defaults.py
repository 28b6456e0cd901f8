"""One default dataset rule for every command; read-only commands never write; after
--resume the closing table covers the whole results folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from _gemm_traces import gemm_trace
from flashtune.bench.runner import RunOptions, RunResult
from flashtune.cli import app, bundled_dataset
from flashtune.cli.common import RESULTS, dataset_roots, default_dataset
from flashtune.cli.run_checks import closing_traces
from flashtune.data import Dataset, Trace

runner = CliRunner()
WIDE = {"COLUMNS": "300"}
H100 = {"hardware": "NVIDIA H100 80GB HBM3", "torch": "2.x", "triton": "3.6"}


def _trace(solution: str, m: int, environment: dict[str, Any] = H100) -> Trace:
    return gemm_trace(
        solution,
        m,
        1.0,
        environment=environment,
        reference_latency=2.0,
        method=None,
        ref_method=None,
    )


def test_default_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLASHTUNE_DATASET", raising=False)
    assert dataset_roots(None) == [bundled_dataset()]
    RESULTS.mkdir()
    assert dataset_roots(None) == [bundled_dataset(), RESULTS]
    assert dataset_roots(None, with_results=False) == [bundled_dataset()]  # what `run` reads
    monkeypatch.setenv("FLASHTUNE_DATASET", str(tmp_path / "mine"))
    assert default_dataset() == tmp_path / "mine"
    assert dataset_roots(None) == [tmp_path / "mine", RESULTS]
    assert dataset_roots([Path("x")]) == [Path("x")]  # -d wins


def test_list_traces_reads_a_results_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLASHTUNE_DATASET", raising=False)
    ds = Dataset(RESULTS)
    for m in (1, 2, 3):
        ds.append_trace(_trace("mine", m), author="me")
    by_flag = runner.invoke(app, ["list", "traces", "-d", str(RESULTS)], env=WIDE)
    assert by_flag.exit_code == 0, by_flag.output
    assert "3 traces" in by_flag.output
    by_default = runner.invoke(app, ["list", "traces"], env=WIDE)  # ./flashtune-results
    assert by_default.exit_code == 0 and "3 traces" in by_default.output


def test_apply_show_writes_nothing(tmp_path: Path) -> None:
    ds = Dataset(tmp_path / "res")
    ds.append_trace(_trace("mine", 1), author="me")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = runner.invoke(app, ["apply", "show", "-d", str(tmp_path / "res")], env=WIDE)
    assert result.exit_code in (0, 1), result.output
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not (tmp_path / "res" / "apply_table.json").exists()


def test_apply_show_of_a_missing_folder_fails(tmp_path: Path) -> None:
    result = runner.invoke(app, ["apply", "show", "-d", str(tmp_path / "nope")], env=WIDE)
    assert result.exit_code == 2 and "no such folder" in result.stderr


def test_resume_table_covers_the_results_folder(tmp_path: Path) -> None:
    out = tmp_path / "res"
    ds = Dataset(out)
    for m in (1, 2, 3):  # an earlier run, same environment
        ds.append_trace(_trace("mine", m), author="me")
    ds.append_trace(_trace("mine", 4, {**H100, "hardware": "NVIDIA A100"}), author="me")
    now = _trace("mine", 3)  # what this --resume run measured
    ds.append_trace(now, author="me")
    result = RunResult(
        traces=[now], out=out, seconds=1.0, total=1, resumed=2, load_errors=[], environment=H100
    )
    opts = RunOptions(datasets=[out], out=out, resume=True)
    kept, other = closing_traces(result, opts)
    assert sorted(t.workload.uuid for t in kept) == ["w1", "w2", "w3", "w3"]
    assert other == 1  # the A100 trace: another environment, counted, not shown
    fresh = RunOptions(datasets=[out], out=out, resume=False)
    assert closing_traces(result, fresh) == ([now], 0)

"""benchmarks/bench_bundled.py headline: one figure from rows of runs made in parts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _row(op, n, solution, ms, commit, method="cuda_graph", started="2026-11-24T06:00:00"):
    return {
        "op": op,
        "shape": {"n": n},
        "solution": solution,
        "latency_ms": ms,
        "timing_method": method,
        "commit": commit,
        "run_started": started,
    }


@pytest.fixture()
def bench_bundled(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delenv("OUT", raising=False)
    import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    sys.modules.pop("bench_bundled", None)
    import bench_bundled

    return bench_bundled


def test_headline_takes_each_definition_from_the_last_named_commit_that_ran_it(
    bench_bundled, tmp_path, capsys
):
    rows = [
        # "norm" ran at both commits: only the later one's ratios count (2x, not 4x).
        _row("norm", 1, "flashtune", 1.0, "aaa"),
        _row("norm", 1, "flashinfer", 4.0, "aaa"),
        _row("norm", 1, "flashtune", 1.0, "bbb"),
        _row("norm", 1, "flashinfer", 2.0, "bbb"),
        # "attn" ran at the first commit only; its torch pair is timed differently.
        _row("attn", 1, "flashtune", 1.0, "aaa"),
        _row("attn", 1, "flashinfer", 8.0, "aaa"),
        _row("attn", 1, "torch", 50.0, "aaa", method="device_sync"),
        # an unnamed commit is left out
        _row("norm", 2, "flashtune", 1.0, "ccc"),
        _row("norm", 2, "flashinfer", 100.0, "ccc"),
    ]
    (tmp_path / "bundled_run.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench_bundled.headline(["aaa", "bbb"])
    out = capsys.readouterr().out
    assert "attn" in out and "norm" in out
    lines = (tmp_path / "bundled_run.jsonl").read_text().splitlines()
    head = json.loads(lines[-1])
    assert head["op"] == "bundled_headline"
    assert head["runs_by_definition"]["norm"]["commit"] == "bbb"
    assert head["runs_by_definition"]["attn"]["commit"] == "aaa"
    assert head["pairs_vs_flashinfer"] == 2
    assert head["speedup_vs_flashinfer_geomean"] == pytest.approx(4.0)  # sqrt(2 * 8)
    assert head["pairs_vs_torch"] == 0 and head["excluded_timing_differs"] == {"torch": 1}


def test_headline_names_commits_by_abbreviation(bench_bundled, tmp_path):
    rows = [
        _row("norm", 1, "flashtune", 1.0, "9e87e73a6f45"),  # rows carry the full hash
        _row("norm", 1, "flashinfer", 3.0, "9e87e73a6f45"),
        _row("attn", 1, "flashtune", 1.0, "caa1f15"),  # or an abbreviation
        _row("attn", 1, "flashinfer", 3.0, "caa1f15"),
    ]
    (tmp_path / "bundled_run.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench_bundled.headline(["caa1f15ab", "9e87e73"])
    head = json.loads((tmp_path / "bundled_run.jsonl").read_text().splitlines()[-1])
    # each definition names its run by the commit as its rows spell it
    assert head["runs_by_definition"]["norm"]["commit"] == "9e87e73a6f45"
    assert head["runs_by_definition"]["attn"]["commit"] == "caa1f15"
    assert head["pairs_vs_flashinfer"] == 2
    assert head["speedup_vs_flashinfer_geomean"] == pytest.approx(3.0)


def test_sampling_summary_from_rows(tmp_path, monkeypatch, capsys):
    """bench_sampling --summary: geomeans of one commit's rows, pairs timed alike only."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    sys.modules.pop("bench_sampling", None)
    import bench_sampling

    def row(op, batch, solution, ms, timing="cuda_graph", commit="abc1234ff"):
        shape = {"batch_size": batch, "vocab_size": 1000, "logit_scale": 8.0}
        return {"op": op, "shape": shape, "solution": solution, "latency_ms": ms,
                "timing": timing, "commit": commit, "hbm_read_fraction": 0.5}  # fmt: skip

    rows = [
        row("top_p", 1, "flashtune", 1.0),
        row("top_p", 1, "flashinfer", 2.0),
        row("top_p", 1, "torch", 10.0),
        row("top_k", 1, "flashtune", 1.0),
        row("top_k", 1, "flashinfer", 8.0),
        row("top_k", 1, "torch", 50.0, timing="cuda_event"),  # timed differently: left out
        row("top_p", 1, "flashinfer", 100.0, commit="other"),  # another commit: left out
    ]
    (tmp_path / "sampling.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench_sampling.summarize_rows("abc1234", ["top_p", "top_k"], [8.0])
    out = capsys.readouterr().out
    assert "overall vs flashinfer: 4.00x over 2 shapes" in out  # sqrt(2 * 8)
    assert "overall vs torch: 10.00x over 1 shapes timed alike (1 excluded" in out
    assert "| top_k | 1000 | 1000 / 8000 / 50000 |" in out  # us

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

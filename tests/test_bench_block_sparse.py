"""benchmarks/bench_block_sparse.py runs its code path on CPU (tiny shapes, interpreter)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow  # the interpreter runs 6 attention calls with their timing
def test_quick_grid_checks_times_and_writes_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delenv("OUT", raising=False)
    import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    sys.modules.pop("bench_block_sparse", None)
    import bench_block_sparse

    bench_block_sparse.main(["--quick", "--device", "cpu"])
    rows = [json.loads(line) for line in (tmp_path / "block_sparse.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["op"] == "block_sparse"]
    # 2 block sizes x (density 0.7: flashtune; density 1.0: flashtune and its dense prefill)
    assert sorted((r["shape"]["R"], r["shape"]["density"], r["solution"]) for r in timed) == [
        (1, 0.7, "flashtune"),
        (1, 1.0, "flashtune"),
        (1, 1.0, "flashtune_dense"),
        (16, 0.7, "flashtune"),
        (16, 1.0, "flashtune"),
        (16, 1.0, "flashtune_dense"),
    ]
    assert all(r["latency_ms"] > 0 for r in timed)
    assert "vs its dense prefill" in capsys.readouterr().out

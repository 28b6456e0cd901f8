"""The tuner's GEMM search, replayed on the picks of the newest recorded H200 sweep
(benchmarks/replay_search.py): with today's cost model, priors, prune_slack, patience and
patience_band, every shape's winner would still be timed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "benchmarks" / "results" / "tune.jsonl"


def _load():
    spec = importlib.util.spec_from_file_location(
        "replay_search", ROOT / "benchmarks" / "replay_search.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _fresh_tuner():
    from flashtune.tune import AutoTuner

    AutoTuner.get().clear()
    yield
    AutoTuner.get().clear()


def test_every_recorded_winner_is_still_timed() -> None:
    from flashtune.ops.gemm.launch import GEMM_TUNING

    replay = _load()
    run, picks = replay.sweep_picks(ROWS, None)
    out = replay.replay(picks, GEMM_TUNING)
    assert out["shapes"] >= 60 and out["triton_winners"] >= 30, run
    assert out["missed"] == [], f"sweep {run}: winners the search would not time"
    # Pruning still pays: fewer candidates timed than offered (about 47 a shape).
    assert out["mean_timed"] < 40


def test_a_narrow_band_misses_winners_the_cost_model_ties() -> None:
    import dataclasses

    from flashtune.ops.gemm.launch import GEMM_TUNING

    replay = _load()
    _, picks = replay.sweep_picks(ROWS, None)
    narrow = replay.replay(picks, dataclasses.replace(GEMM_TUNING, patience_band=0.0))
    assert (
        narrow["missed"] and narrow["mean_timed"] < replay.replay(picks, GEMM_TUNING)["mean_timed"]
    )


def test_regret_is_timed_in_paired_rounds_and_one_pick_is_one_kernel(monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location(
        "bench_tune", ROOT / "benchmarks" / "bench_tune.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    drift = iter(range(100))
    timed: list[str] = []

    def fake_retime(runner, tactic, A, B) -> float:
        # The machine slows down over the rounds; the slow pick costs 10% more throughout.
        timed.append(runner)
        return (1.0 + next(drift) / 10) * (1.1 if runner == "slow" else 1.0)

    monkeypatch.setattr(bench, "retime", fake_retime)
    runners = {"slow": "slow", "fast": "fast"}
    times = bench.paired_retimes([("slow", 1), ("fast", 2), ("fast", 2)], runners, None, None, 3)
    assert timed == ["slow", "fast"] * 3  # the shared pick timed once a round
    assert bench.paired_ratio(times[("fast", 2)], times[("fast", 2)]) == 1.0
    # Paired by round the drift cancels mostly: close to the 10% the slow pick costs.
    assert 1.0 < bench.paired_ratio(times[("slow", 1)], times[("fast", 2)]) < 1.15

"""The tuner's pick is confirmed: the fastest few tactics (and the default) are timed again in
turns, and a tactic that only won by one lucky measurement loses the pick."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tune_helpers as H  # noqa: E402

from flashtune.timing import Timing  # noqa: E402
from flashtune.tune import (  # noqa: E402
    DynamicDim,
    TuningConfig,
    autotune,
    choose_one,
    profiling,
)
from flashtune.tune.selection import confirm_pick  # noqa: E402

DEFAULT = -1


def test_a_lucky_first_measurement_loses_the_pick() -> None:
    # Tactic 3 measured 1.0 once but takes 3.0; tactic 2 takes 1.5 every time.
    again = {3: [3.0, 3.1], 2: [1.5, 1.5], 5: [2.5, 2.4], DEFAULT: [4.0, 4.0]}
    calls: list[Any] = []

    def time_once(index: int, tactic: Any) -> float:
        calls.append(tactic)
        return again[tactic].pop(0)

    results = [(0, DEFAULT, 4.0), (0, 3, 1.0), (0, 2, 1.5), (0, 5, 2.5), (0, 9, 9.0)]
    pick, medians = confirm_pick(results, time_once, top=3, rounds=2)
    assert pick == (0, 2, 1.5)
    # The three fastest and the default, in turns, twice; tactic 9 is not timed again.
    assert calls == [3, 2, 5, DEFAULT] * 2
    assert medians == {(0, 3): 3.05, (0, 2): 1.5, (0, 5): 2.45, (0, DEFAULT): 4.0}


def test_no_rounds_or_one_candidate_keeps_the_first_measurements() -> None:
    def never(index: int, tactic: Any) -> float:
        raise AssertionError("not timed again")

    results = [(0, DEFAULT, 2.0), (0, 1, 1.0)]
    assert confirm_pick(results, never, top=3, rounds=0) == ((0, 1, 1.0), {})
    assert confirm_pick(results[:1], never, top=3, rounds=2) == ((0, DEFAULT, 2.0), {})
    assert confirm_pick([], never, top=3, rounds=2) == (None, {})


def test_a_finalist_failing_now_is_dropped() -> None:
    def time_once(index: int, tactic: Any) -> float | None:
        return None if tactic == 1 else 2.0

    pick, medians = confirm_pick([(0, DEFAULT, 3.0), (0, 1, 1.0)], time_once, top=1, rounds=2)
    assert pick == (0, DEFAULT, 2.0) and set(medians) == {(0, DEFAULT)}
    assert confirm_pick([(0, 1, 1.0), (1, 4, 2.0)], lambda i, t: None, 2, 2) == (None, {})


class NoisyRunner(H.FakeRunner):
    """Tactic 1 is the fastest on its first timing only (a lucky measurement)."""

    COSTS = {-1: 5.0, 1: 2.0, 2: 1.5}


def test_the_tuner_keeps_the_tactic_that_is_fast_when_timed_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tuner = H.install_fresh_tuner(monkeypatch, tmp_path)
    seen: Counter = Counter()

    def noisy_measure(fn: Any, args: Sequence[Any], **kwargs: Any) -> Timing:
        timing = H.fake_measure(fn, args, **kwargs)
        _, tactic = fn.args
        seen[tactic] += 1
        t = 1.0 if tactic == 1 and seen[tactic] == 1 else timing.median_ms
        return Timing(t, t, t, 0.0, t, 1)

    monkeypatch.setattr(profiling, "_measure", noisy_measure)
    config = TuningConfig(dynamic_dims=(DynamicDim(0, 0),), cold_l2=False, guard_rounds=0)
    with autotune():
        runner, tactic = choose_one("noisy", [NoisyRunner()], config, [torch.randn(8, 4)])
    assert tactic == 2
    # Every tactic once, then the three finalists (all of them here) twice each.
    assert seen == {-1: 3, 1: 3, 2: 3}
    (timings,) = tuner.timings.values()
    assert timings[("NoisyRunner", 1)] == 2.0 and timings[("NoisyRunner", 2)] == 1.5

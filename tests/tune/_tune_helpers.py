"""Runners with controlled timing (a fake clock) and worker functions for the autotuner
tests; a module of its own so that spawned processes can import it."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from flashtune.timing import Timing
from flashtune.tune import DynamicDim, TunableRunner, TuningConfig

# The fake clock: runners advance it by their tactic's cost; the fake timer reads it.
_clock = threading.local()
# (runner, tactic, shape) -> number of times a tactic was timed
TIMED: Counter = Counter()
_timed_lock = threading.Lock()


def fake_measure(fn: Any, args: Sequence[Any], **kwargs: Any) -> Timing:
    """Stands in for flashtune.timing.measure: one call, timed on the fake clock."""
    _clock.now = 0.0
    fn(*args)
    t = _clock.now
    runner, tactic = fn.args  # functools.partial(_call, runner, tactic)
    with _timed_lock:
        TIMED[(runner.name, tactic, tuple(args[0].shape))] += 1
    return Timing(t, t, t, 0.0, t, 1)


class FakeRunner(TunableRunner):
    """y = 2x. COSTS[tactic] is the fake time of a tactic; BROKEN tactics raise, WRONG ones
    return a wrong result."""

    COSTS: dict[Any, float] = {-1: 5.0, 0: 3.0, 1: 1.0, 2: 2.0}
    BROKEN: frozenset = frozenset()
    WRONG: frozenset = frozenset()

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Any]:
        return [t for t in self.COSTS if t != -1]

    def forward(self, inputs: Sequence[Any], tactic: Any = -1) -> torch.Tensor:
        if tactic in self.BROKEN:
            raise RuntimeError(f"tactic {tactic} is broken")
        _clock.now = getattr(_clock, "now", 0.0) + self.COSTS[tactic]
        y = inputs[0] * 2
        return y + 1 if tactic in self.WRONG else y


class OtherRunner(FakeRunner):
    COSTS = {-1: 4.0, 7: 0.5}


class CompoundRunner(FakeRunner):
    COSTS = {-1: 5.0, (64, (2, 3)): 1.0, (128, (4, 1)): 2.0}


# The fake clock never varies: no confirmation or guard rounds, so every tactic is timed
# exactly once (test_confirmation.py and test_search.py cover them).
CONFIG = TuningConfig(
    dynamic_dims=(DynamicDim(0, 0),), cold_l2=False, confirm_rounds=0, guard_rounds=0
)


def use_fake_clock() -> None:
    from flashtune.tune import profiling

    profiling._measure = fake_measure


def tune_shapes(path: str, rows: Sequence[int], barrier: Any = None, event: Any = None) -> None:
    """Worker: tune `rows` (M values) of op "fake" into `path`, optionally waiting on a
    barrier before the context exits (so that several processes save at once) or setting an
    event once tuned."""
    use_fake_clock()
    from flashtune.tune import autotune, choose_one

    with autotune(True, cache=path):
        for m in rows:
            choose_one("fake", [FakeRunner()], CONFIG, [torch.randn(m, 4)])
        if event is not None:
            event.set()
        if barrier is not None:
            barrier.wait(timeout=120)


def install_fresh_tuner(monkeypatch: Any, tmp_path: Any) -> Any:
    """A new AutoTuner singleton for one test, the fake clock, and no bundled configs."""
    from flashtune.tune import AutoTuner, profiling, store

    tuner = AutoTuner()
    tuner.show_progress = False
    monkeypatch.setattr(AutoTuner, "_instance", tuner)
    monkeypatch.setattr(profiling, "_measure", fake_measure)
    monkeypatch.setattr(store, "BUNDLED_DIR", tmp_path / "no-bundled")
    monkeypatch.setenv("FLASHTUNE_AUTOTUNE_LOAD_BUNDLED", "0")
    TIMED.clear()
    return tuner

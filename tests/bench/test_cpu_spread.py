"""CPU timing with a stated spread: the median's distribution-free interval, sampling until it
is narrow enough (or a budget runs out), for the reference (timing.measure_robust) and for a
solution's checked samples (checked_timing.WorkerSamples)."""

from __future__ import annotations

import itertools
import random
import statistics
import time
from typing import Any

import pytest
import torch

from flashtune import timing
from flashtune.bench.checked_timing import WorkerSamples, interval_text, timing_from_samples
from flashtune.bench.config import BenchConfig
from flashtune.timing import TimingPolicy, measure_robust, median_ci, relative_spread


def test_median_ci_is_the_order_statistics_of_the_binomial() -> None:
    xs = [float(x) for x in range(1, 11)]
    assert median_ci(xs) == (2.0, 9.0)  # n = 10: x(2), x(9) (97.9%)
    assert median_ci(list(range(1, 101))) == (40, 61)  # n = 100: the textbook ranks
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # n < 6: no 95% interval, [min, max]
    with pytest.raises(ValueError):
        median_ci([])


def test_median_ci_covers_the_median_of_a_skewed_distribution() -> None:
    # Exponential samples (a CPU timing's long right tail): the interval holds the true
    # median ln 2 in at least 95% of 2000 draws of 12 samples (seeded: the same every run).
    rng = random.Random(7)
    hits = 0
    for _ in range(2000):
        low, high = median_ci([rng.expovariate(1.0) for _ in range(12)])
        hits += low <= 0.6931 <= high
    assert hits / 2000 >= 0.95


class _FakeClock:
    """The timer's clock, advanced only by the timed function (by the next of `steps`)."""

    def __init__(self, steps: list[float]) -> None:
        self.now = 0.0
        self.steps = itertools.cycle(steps)

    def __call__(self) -> float:
        return self.now

    def call(self, *args: Any) -> None:
        self.now += next(self.steps) / 1e3


def _measure(
    monkeypatch: pytest.MonkeyPatch,
    steps: list[float],
    spread: float | None = None,
    spread_seconds: float = 0.0,
) -> timing.Timing:
    clock = _FakeClock(steps)
    monkeypatch.setattr(timing, "_clock", clock)
    args = [torch.zeros(1)]
    policy = TimingPolicy(
        warmup=0,
        repetitions=3,
        trial_ms=0.0,
        trials=1,
        max_seconds=60.0,
        spread=spread,
        spread_seconds=spread_seconds,
    )
    return measure_robust(clock.call, args, policy)


def test_cpu_timing_samples_until_the_interval_is_narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    steady = _measure(monkeypatch, [1.0], spread=0.05, spread_seconds=10.0)
    assert steady.repetitions == 3 and steady.relative_spread == pytest.approx(0.0)  # at once
    # Every other call descheduled (1 ms, 50 ms): the median's interval never narrows, so
    # sampling stops at the time budget (10 s of fake time), with the spread stated.
    noisy = _measure(monkeypatch, [1.0, 50.0], spread=0.05, spread_seconds=1.0)
    assert noisy.repetitions > 3 and noisy.relative_spread is not None
    assert noisy.relative_spread > 0.05
    # Mostly steady, rare outliers: more samples pin the median down.
    mixed = _measure(monkeypatch, [40.0] + [1.0] * 7, spread=0.05, spread_seconds=10.0)
    assert mixed.median_ms == pytest.approx(1.0) and mixed.repetitions > 3
    assert mixed.relative_spread is not None and mixed.relative_spread < 1e-9
    # Without a spread target: the old fixed count.
    assert _measure(monkeypatch, [1.0, 50.0]).repetitions == 3


class _Workload:
    floats: list[str] = []

    def sample_seed(self, solution: str, k: int) -> int:
        return k

    def case(self, sample_seed: int, index: int) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {}


def _samples(cpu: bool = True, interpret: bool = False, **cfg: Any) -> WorkerSamples:
    config = BenchConfig(**cfg).for_device(torch.device("cpu" if cpu else "cuda"))
    samples = WorkerSamples(_Workload(), config, "s", None, cpu=cpu, interpret=interpret)
    samples.started = time.monotonic()
    return samples


def test_worker_samples_stop_when_the_spread_is_stated() -> None:
    s = _samples()
    s.times_ms = [1.0, 1.0]
    assert s.more()  # under 3 whatever the caps
    s.times_ms = [1.0] * 9
    assert s.more()  # under `iterations` (10)
    s.times_ms = [1.0] * 10
    assert not s.more()  # narrow: done
    s.times_ms = [1.0, 3.0] * 10
    assert s.more()  # wide: go on
    s.times_ms = [1.0, 3.0] * 100
    assert not s.more()  # max_samples
    s.times_ms = [1.0, 3.0] * 10
    s.started -= 60.0
    assert not s.more()  # spread_seconds spent
    s.times_ms = [1.0, 3.0]
    assert s.more()  # but never fewer than 3


def test_worker_samples_in_the_interpreter_check_without_timing() -> None:
    s = _samples(interpret=True, interpreter_samples=2)
    assert s.floor == 1 and s.wanted == 2
    assert s.more()
    s.times_ms = [5.0]
    assert s.more()
    s.started -= 60.0  # interpreter_seconds spent: the one sample is enough
    assert not s.more()


def test_gpu_samples_keep_their_fixed_count() -> None:
    s = _samples(cpu=False)
    s.times_ms = [1.0, 3.0] * 10
    assert s.more()  # 20 of 30, however wide
    s.times_ms = [1.0, 3.0] * 15
    assert not s.more()


def test_timing_from_samples_states_the_interval() -> None:
    samples = [1.0, 1.1, 0.9, 1.0, 5.0, 1.0, 1.05, 0.95, 1.0, 1.0]
    t = timing_from_samples(samples, 1, "cpu", 1)
    assert t.median_ms == statistics.median(samples) == 1.0
    assert t.interval == median_ci(samples) == (0.95, 1.1)
    assert t.relative_spread == relative_spread(samples) == pytest.approx(0.1)
    assert "±10.0%" in interval_text(t, 0.05) and "noisy" in interval_text(t, 0.05)
    assert "noisy" not in interval_text(t, 0.2)


def test_input_sets_on_a_gpu_are_capped_by_free_memory(monkeypatch):
    from flashtune.bench.checked_timing import sets_that_fit

    # 100 GiB free: a quarter is over the 1 GiB cap, so sets of 256 MiB fit four times and a
    # 17 GB set of MoE weights only once (never zero); the CPU keeps what it asked for.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 << 30, 141 << 30))
    gpu = torch.device("cuda", 0)
    assert sets_that_fit(256 << 20, gpu, 8) == 4
    assert sets_that_fit(17 << 30, gpu, 4) == 1
    assert sets_that_fit(1 << 20, gpu, 3) == 3
    assert sets_that_fit(17 << 30, torch.device("cpu"), 4) == 4

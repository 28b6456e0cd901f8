"""The timer: statistics, cold-L2 copies, CPU and GPU paths."""

from __future__ import annotations

import gc
import time

import pytest
import torch

from flashtune import timing
from flashtune.timing import (
    Timing,
    TimingPolicy,
    clone_inputs,
    copies_for_cold_l2,
    measure,
    measure_robust,
)


def test_cpu_measure_statistics() -> None:
    calls = []
    t = measure(lambda a: (calls.append(1), time.sleep(0.001)), [1], warmup=2, repetitions=9)
    assert len(calls) == 11 and t.repetitions == 9
    assert 0.9 <= t.min_ms <= t.median_ms <= t.max_ms
    assert t.iqr_ms >= 0 and t.min_ms <= t.mean_ms <= t.max_ms


def test_measure_stops_at_max_seconds() -> None:
    t = measure(lambda: time.sleep(0.02), [], warmup=0, repetitions=1000, max_seconds=0.05)
    assert t.repetitions < 10


def test_measure_rotates_explicit_input_sets() -> None:
    seen = []
    sets = [[torch.full((2,), float(i))] for i in range(3)]
    measure(lambda a: seen.append(float(a[0])), [], warmup=0, repetitions=6, input_sets=sets)
    assert seen == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]


def test_cold_l2_copies_and_clones() -> None:
    big = torch.empty(64 * 2**20, dtype=torch.uint8)
    assert copies_for_cold_l2([big], torch.device("cpu")) == 2
    assert copies_for_cold_l2([torch.empty(16)], torch.device("cpu")) == 64
    a = torch.randn(3, 4).T
    cloned = clone_inputs([a, 5])
    assert cloned[1] == 5 and cloned[0].stride() == a.stride() and cloned[0] is not a


@pytest.mark.cuda
@pytest.mark.parametrize("graph", [False, True])
def test_gpu_measure(graph: bool) -> None:
    x = torch.randn(4096, 4096, device="cuda")
    t = measure(lambda a: a @ a, [x], warmup=3, repetitions=10, use_cuda_graph=graph)
    assert 0 < t.min_ms <= t.median_ms


# --------------------------------------------------------------------------- measure_robust


def test_robust_cpu_method_trials_and_minimum_time() -> None:
    calls = []
    policy = TimingPolicy(warmup=3, repetitions=4, trials=3, trial_ms=0)
    t = measure_robust(lambda a: calls.append(1), [torch.ones(2)], policy)
    assert t.method == "cpu" and t.fallback is None
    assert len(calls) == 3 + 3 * 4 and t.repetitions == 12
    assert len(t.trial_medians_ms) == 3 and t.min_ms <= t.median_ms <= t.max_ms
    # trial_ms is a minimum: 1 ms calls need ~20 samples to fill 20 ms
    policy = TimingPolicy(warmup=0, repetitions=2, trials=1, trial_ms=20)
    t = measure_robust(lambda: time.sleep(0.001), [], policy)
    assert t.repetitions >= 10
    assert t.trial_spread_ms == 0.0


class _FakeCalls:
    """Stands in for timing.CallRotation: a capture that succeeds or raises, no GPU needed."""

    def __init__(self, capturable: bool) -> None:
        self.capturable, self.stream, self.warmups, self.captured = capturable, None, 0, []

    def warm_up(self, calls: int, min_ms: float, max_seconds: float) -> float:
        self.warmups += 1
        return 0.01  # ms per call, as the eager warm-up would measure it

    def capture(self, calls: int) -> object:
        if not self.capturable:
            raise timing.CaptureError("RuntimeError: operation not permitted when capturing")
        self.captured.append(calls)
        return object()


def _robust_with_fakes(
    monkeypatch, capturable: bool, method: str = "auto", replay_ms: float = 1.0
) -> tuple:
    fake = _FakeCalls(capturable)
    monkeypatch.setattr(timing, "CallRotation", lambda fn, sets: fake)
    monkeypatch.setattr(timing, "_replay_ms", lambda graph, stream, replays=3: replay_ms)

    def sample(kind):
        def fn(*args, **kw):
            return Timing(0.01, 0.01, 0.01, 0.0, 0.01, 10, method=kind, calls_per_sample=args[1])

        return fn

    monkeypatch.setattr(timing, "_sample_graph", sample("cuda_graph"))
    monkeypatch.setattr(timing, "_sample_device_wide", sample("device_sync"))
    policy = TimingPolicy(method=method, warmup=1, repetitions=10, trials=3)
    t = timing._measure_robust_gpu(lambda: None, [[]], policy)
    return t, fake


def test_robust_gpu_prefers_a_graph(monkeypatch) -> None:
    t, fake = _robust_with_fakes(monkeypatch, capturable=True)
    assert t.method == "cuda_graph" and t.fallback is None
    # 0.01 ms per call from the warm-up -> 100 calls make a ~1 ms replay
    assert fake.captured == [100] and t.calls_per_sample == 100
    assert len(t.trial_medians_ms) == 3
    # a replay much shorter than 1 ms (the warm-up estimate included host time): recapture
    t, fake = _robust_with_fakes(monkeypatch, capturable=True, replay_ms=0.1)
    assert fake.captured == [100, 1000] and t.calls_per_sample == 1000


def test_robust_gpu_falls_back_to_device_wide_timing_when_capture_fails(monkeypatch) -> None:
    t, fake = _robust_with_fakes(monkeypatch, capturable=False)
    assert t.method == "device_sync" and "not permitted" in t.fallback
    assert fake.warmups == 2  # warmed up again after the failed capture
    assert t.calls_per_sample == 100  # events also time ~1 ms samples of back-to-back calls


def test_robust_gpu_forced_methods(monkeypatch) -> None:
    with pytest.raises(timing.CaptureError):
        _robust_with_fakes(monkeypatch, capturable=False, method="cuda_graph")
    t, fake = _robust_with_fakes(monkeypatch, capturable=True, method="cuda_events")
    assert t.method == "device_sync" and fake.captured == [] and t.fallback is None


def _syncs(a: torch.Tensor) -> torch.Tensor:
    """Not capturable: reads a value on the host."""
    return a * float(a.sum().item())


@pytest.mark.cuda
def test_gpu_robust_graph_and_fallback_leave_a_sane_context() -> None:
    x = torch.randn(1024, 1024, device="cuda")
    t = measure_robust(lambda a: a @ a, [x], TimingPolicy(trials=2, trial_ms=20))
    assert t.method == "cuda_graph" and t.calls_per_sample >= 1 and 0 < t.median_ms
    assert t.calls_per_sample * t.median_ms >= 0.5  # one replay lasts ~1 ms
    default = torch.cuda.current_stream()
    t = measure_robust(_syncs, [x], TimingPolicy(trials=2, trial_ms=20))
    assert t.method == "device_sync" and t.fallback
    assert torch.cuda.current_stream() == default and not torch.cuda.is_current_stream_capturing()
    with pytest.raises(timing.CaptureError):
        measure(_syncs, [x], warmup=1, repetitions=3, use_cuda_graph=True)
    assert torch.cuda.current_stream() == default
    # the context still works, graphs included
    assert (
        measure_robust(lambda a: a + 1, [x], TimingPolicy(trials=1, trial_ms=5)).method
        == "cuda_graph"
    )
    torch.testing.assert_close((x + 1).sum(), x.sum() + x.numel())


def _syncs_after_a_big_temporary(a: torch.Tensor) -> torch.Tensor:
    big = torch.empty(1 << 30, dtype=torch.uint8, device=a.device)  # 1 GiB, allocated in capture
    big.fill_(1)
    return a + float(big[:1].float().sum().item())  # a host sync: the capture fails


@pytest.mark.cuda
def test_gpu_failed_capture_gives_its_memory_back() -> None:
    # A capture that fails to end used to keep every block it allocated reserved for the
    # life of the process (torch never released the graph's pool), beyond empty_cache.
    x = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    for _ in range(3):
        with pytest.raises(timing.CaptureError):
            measure(_syncs_after_a_big_temporary, [x], warmup=1, repetitions=1, use_cuda_graph=True)
    # The last CaptureError's traceback (a reference cycle through the capture's frame)
    # still holds the 1 GiB temporary: collect it, as the benchmark worker does.
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() - before < (256 << 20)
    # and graphs still capture and replay afterwards
    assert (
        measure_robust(lambda a: a * 2, [x], TimingPolicy(trials=1, trial_ms=5)).method
        == "cuda_graph"
    )

"""The timer: statistics, cold-L2 copies, CPU and GPU paths."""

from __future__ import annotations

import time

import pytest
import torch

from flashtune.timing import clone_inputs, copies_for_cold_l2, measure


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

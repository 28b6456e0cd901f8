"""The one timer used by the autotuner and the benchmark runner.

Both use `measure`, so a tactic that wins tuning also wins the benchmark. On a GPU it:
- warms up (compilation, module load, allocator) outside the timed region;
- rotates through several copies of the inputs, more bytes than the L2 holds, so no timed
  call finds its inputs cache-resident (cold L2);
- times with CUDA events, optionally replaying a CUDA graph of many calls so that
  launch-bound kernels are not measured as launch overhead;
- reports the median and the spread (min, max, interquartile range) over repetitions.
On the CPU it times with `time.perf_counter` with the same statistics.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["Timing", "measure", "l2_bytes", "clone_inputs", "copies_for_cold_l2"]

# An L2 size to assume when the device cannot tell us (H100: 50 MB, H200: 60 MB).
_DEFAULT_L2_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Timing:
    """Latency statistics of one measured callable, in milliseconds."""

    median_ms: float
    min_ms: float
    max_ms: float
    iqr_ms: float
    mean_ms: float
    repetitions: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return _DEFAULT_L2_BYTES
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or _DEFAULT_L2_BYTES)


def _tensor_bytes(args: Sequence[Any]) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


def clone_inputs(args: Sequence[Any]) -> list[Any]:
    """A copy of `args` with every tensor cloned (same strides), non-tensors shared."""
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def copies_for_cold_l2(args: Sequence[Any], device: torch.device, max_copies: int = 64) -> int:
    """How many input copies to rotate through so that each timed call misses the L2."""
    nbytes = max(_tensor_bytes(args), 1)
    # Twice the L2: LRU-ish replacement keeps some of the last sets resident.
    return max(1, min(max_copies, math.ceil(2 * l2_bytes(device) / nbytes)))


def _stats(samples_ms: list[float]) -> Timing:
    samples_ms = sorted(samples_ms)
    n = len(samples_ms)
    q1 = samples_ms[n // 4]
    q3 = samples_ms[(3 * n) // 4] if n > 1 else samples_ms[0]
    return Timing(
        median_ms=statistics.median(samples_ms),
        min_ms=samples_ms[0],
        max_ms=samples_ms[-1],
        iqr_ms=q3 - q1,
        mean_ms=statistics.fmean(samples_ms),
        repetitions=n,
    )


def measure(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    warmup: int = 10,
    repetitions: int = 50,
    cold_l2: bool = True,
    use_cuda_graph: bool = False,
    calls_per_graph: int = 20,
    input_sets: Sequence[Sequence[Any]] | None = None,
    max_seconds: float = 10.0,
) -> Timing:
    """Time `fn(*args)` and return latency statistics per call (milliseconds).

    input_sets: explicit input copies to rotate through (e.g. with freshly randomized
    values); by default `args` is cloned as often as cold L2 needs on a GPU.
    max_seconds: repetitions stop early once this much time has been spent, so one very
    slow candidate cannot stall tuning.
    """
    device = _device_of(args)
    if input_sets is None:
        copies = copies_for_cold_l2(args, device) if (cold_l2 and device.type == "cuda") else 1
        input_sets = [list(args)] + [clone_inputs(args) for _ in range(copies - 1)]
    if device.type != "cuda":
        return _measure_cpu(fn, input_sets, warmup, repetitions, max_seconds)
    if use_cuda_graph:
        return _measure_graph(fn, input_sets, warmup, repetitions, calls_per_graph, max_seconds)
    return _measure_events(fn, input_sets, warmup, repetitions, max_seconds)


def _device_of(args: Sequence[Any]) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def _measure_cpu(fn, input_sets, warmup, repetitions, max_seconds) -> Timing:
    for i in range(warmup):
        fn(*input_sets[i % len(input_sets)])
    samples = []
    deadline = time.perf_counter() + max_seconds
    for i in range(repetitions):
        start = time.perf_counter()
        fn(*input_sets[i % len(input_sets)])
        samples.append((time.perf_counter() - start) * 1e3)
        if time.perf_counter() > deadline:
            break
    return _stats(samples)


def _measure_events(fn, input_sets, warmup, repetitions, max_seconds) -> Timing:
    for i in range(warmup):
        fn(*input_sets[i % len(input_sets)])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    deadline = time.perf_counter() + max_seconds
    done = 0
    for i in range(repetitions):
        args = input_sets[i % len(input_sets)]
        starts[i].record()
        fn(*args)
        ends[i].record()
        done += 1
        if i % 8 == 7:
            torch.cuda.synchronize()  # keep the host within a few calls of the device
            if time.perf_counter() > deadline:
                break
    torch.cuda.synchronize()
    return _stats([s.elapsed_time(e) for s, e in zip(starts[:done], ends[:done], strict=True)])


def _measure_graph(fn, input_sets, warmup, repetitions, calls_per_graph, max_seconds) -> Timing:
    # Warm up on a side stream, as graph capture requires.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(max(warmup, 1)):
            fn(*input_sets[i % len(input_sets)])
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls_per_graph):
            fn(*input_sets[i % len(input_sets)])
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    deadline = time.perf_counter() + max_seconds
    for _ in range(repetitions):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / calls_per_graph)
        if time.perf_counter() > deadline:
            break
    return _stats(samples)

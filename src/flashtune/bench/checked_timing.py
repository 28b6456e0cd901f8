"""Timing in which every timed call is a checked call.

A solution is timed in *samples*. Before each sample the sandbox writes fresh random values,
drawn from a seed the worker sends only then, into the float inputs of every input set (the
same tensors, so plans and captured graphs stay valid), fills every output with the same
poison, and makes the L2 cold; the sample then calls the solution once per set (a CUDA graph
of those calls when it can be captured), timed; and the outputs of every call of the sample
go to the worker, which compares each with the reference for that sample's values before it
sends the next seed. So:

- no call is distinguishable from another: the first call, the timed calls and the checked
  calls are the same calls, with the same output treatment and the same harness frames;
- no timed call goes unchecked, and none reuses inputs a solution has seen before (a cache
  keyed by identity, address or sampled values misses; a table built offline cannot know
  values drawn from the operating system's entropy at run time);
- the solution sees a sample's values only when the sample is about to run.

This module holds what both sides share: how set seeds derive from a sample seed, how many
sets a sample calls, the sandbox's sampler, and how the worker turns checked samples into a
Timing. The worker draws the seeds and owns the verdict (bench/evaluate.py).
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from flashtune.timing import CallRotation, EmptyGraphError, Timing, l2_bytes

__all__ = [
    "MAX_SETS",
    "CheckedSampler",
    "derive_seed",
    "sets_per_sample",
    "timing_from_samples",
]

# Calls (= distinct input sets) per sample. Each set costs the worker a reference per sample,
# so the count stays small; a sample of 32 calls of a 2 us kernel lasts 64 us, which CUDA
# events resolve to about 1%, and the median over samples does the rest.
MAX_SETS = 32
# The input sets of a sample together use at most this much device memory.
_MAX_SET_BYTES = 1 << 30

_clock = time.perf_counter
# Bound before any solution is imported (a solution may replace torch's names in its process).
_gpu_sleep = torch.cuda._sleep
_fill = torch._C.TensorBase.fill_


def derive_seed(*parts: object) -> int:
    """A 62-bit seed from its parts (the run's seed, names, indices): the worker and the
    sandbox derive the same set seeds from a sample seed; nobody can derive a sample seed
    without the run's seed, which the sandbox never receives."""
    text = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 2


def sets_per_sample(
    per_call_ms: float, set_bytes: int, device: torch.device, target_sample_ms: float, cpu_sets: int
) -> int:
    """How many calls (each on its own input set) one sample makes: enough for a sample of
    about `target_sample_ms` on a GPU, at most MAX_SETS and _MAX_SET_BYTES (a quarter of the
    free memory at most); `cpu_sets` on the CPU."""
    if device.type != "cuda":
        return max(1, cpu_sets)
    wanted = math.ceil(target_sample_ms / per_call_ms) if per_call_ms > 0 else MAX_SETS
    free, _ = torch.cuda.mem_get_info(device)
    by_memory = min(_MAX_SET_BYTES, free // 4) // max(set_bytes, 1)
    return int(max(1, min(wanted, MAX_SETS, by_memory)))


class CheckedSampler:
    """Times samples of one call per input set, on the sets the caller refreshes between
    samples. `calls[i]()` calls the solution on set i and returns its result."""

    def __init__(
        self, calls: Sequence[Callable[[], Any]], device: torch.device, method: str
    ) -> None:
        self.calls, self.device = list(calls), device
        self.n = len(self.calls)
        self.method = "cpu" if device.type != "cuda" else "device_sync"
        self.fallback: str | None = None
        self.results: list[Any] = [None] * self.n
        self._graph: Any = None
        self._rotation: CallRotation | None = None
        self._flush: torch.Tensor | None = None
        if device.type == "cuda":
            # Written between samples so that every sample starts with a cold L2 (each set is
            # called once per sample, so its first touch is a miss).
            self._flush = torch.empty(2 * l2_bytes(device), dtype=torch.uint8, device=device)
            if method in ("auto", "cuda_graph"):
                self._capture(method)

    def _capture(self, method: str) -> None:
        index = {id(c): i for i, c in enumerate(self.calls)}

        def call(marker: Callable[[], Any]) -> Any:
            return self.calls[index[id(marker)]]()

        rotation = CallRotation(call, [[c] for c in self.calls])
        rotation.touched = self.n  # every set has had eager calls (warm-up, first call)
        try:
            graph = rotation.capture(self.n)
        except EmptyGraphError:  # its work ran outside the capture: an error, never a time
            raise
        except Exception as exc:  # noqa: BLE001 - CaptureError: time eagerly instead
            if method == "cuda_graph":
                raise
            self.fallback = str(exc)
            return
        self._graph, self._rotation = graph, rotation
        self.method = "cuda_graph"
        self.results = [rotation.results.get(i) for i in range(self.n)]
        with torch.cuda.stream(rotation.stream):
            graph.replay()  # the first replay uploads the graph
        torch.cuda.synchronize(self.device)

    def flush(self, k: int) -> None:
        if self._flush is not None:
            _fill(self._flush, k & 0xFF)
            torch.cuda.synchronize(self.device)

    def sample(self) -> float:
        """One timed sample; milliseconds per call."""
        if self._graph is not None and self._rotation is not None:
            stream = self._rotation.stream
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                # Keep the GPU busy while the host submits the graph: the start event then
                # marks when the GPU reaches the graph, not when the host got there.
                _gpu_sleep(20_000)
                start.record(stream)
                self._graph.replay()
                end.record(stream)
            end.synchronize()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end) / self.n
        if self.device.type == "cuda":
            # Bracketed by device-wide synchronizations: work on any stream counts.
            torch.cuda.synchronize(self.device)
            t0 = _clock()
            results = [c() for c in self.calls]
            torch.cuda.synchronize(self.device)
            elapsed = _clock() - t0
        else:
            t0 = _clock()
            results = [c() for c in self.calls]
            elapsed = _clock() - t0
        self.results = results
        return elapsed * 1e3 / self.n


def timing_from_samples(
    samples_ms: Sequence[float], trials: int, method: str, calls_per_sample: int
) -> Timing:
    """The worker's Timing from the checked samples: samples split into `trials` consecutive
    groups; the latency is the median of the groups' medians."""
    samples = [float(s) for s in samples_ms]
    if not samples:
        raise ValueError("no checked sample")
    trials = max(1, min(trials, len(samples)))
    size = math.ceil(len(samples) / trials)
    groups = [samples[i : i + size] for i in range(0, len(samples), size)]
    medians = tuple(statistics.median(g) for g in groups)
    ordered = sorted(samples)
    n = len(ordered)
    iqr = ordered[(3 * n) // 4] - ordered[n // 4] if n > 1 else 0.0
    return Timing(
        median_ms=statistics.median(medians),
        min_ms=ordered[0],
        max_ms=ordered[-1],
        iqr_ms=iqr,
        mean_ms=statistics.fmean(samples),
        repetitions=n,
        method=method,
        calls_per_sample=calls_per_sample,
        trial_medians_ms=medians,
    )

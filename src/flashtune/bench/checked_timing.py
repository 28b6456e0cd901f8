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
sets a sample calls, the sandbox's sampler, the worker's side of the samples (its seeds, its
inputs, when to stop) and how the worker turns checked samples into a Timing. The worker
owns the verdict (bench/evaluate.py).
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import torch

from flashtune.bench.config import BenchConfig
from flashtune.timing import (
    CI_CONFIDENCE,
    CallRotation,
    EmptyGraphError,
    Timing,
    l2_bytes,
    median_ci,
    relative_spread,
)

__all__ = [
    "MAX_SETS",
    "CheckedSampler",
    "SampledWorkload",
    "WorkerSamples",
    "derive_seed",
    "interval_text",
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
    return sets_that_fit(set_bytes, device, min(wanted, MAX_SETS))


def sets_that_fit(set_bytes: int, device: torch.device, wanted: int) -> int:
    """At most `wanted` input sets of `set_bytes` each, and on a GPU no more than fit in
    _MAX_SET_BYTES (a quarter of the free memory at most); always at least one. A set of
    MoE weights can be 17 GB: four of them, held while the solution's sandbox (another
    process) draws its own, ran a 141 GB GPU out of memory (H200, 2026-11-29)."""
    if device.type != "cuda":
        return max(1, wanted)
    free, _ = torch.cuda.mem_get_info(device)
    by_memory = min(_MAX_SET_BYTES, free // 4) // max(set_bytes, 1)
    return int(max(1, min(wanted, by_memory)))


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
    groups; the latency is the median of the groups' medians; its interval is the
    distribution-free 95% interval of the median of all samples (`timing.median_ci`),
    widened to contain the latency."""
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
    median = statistics.median(medians)
    low, high = median_ci(ordered)
    return Timing(
        median_ms=median,
        min_ms=ordered[0],
        max_ms=ordered[-1],
        iqr_ms=iqr,
        mean_ms=statistics.fmean(samples),
        repetitions=n,
        method=method,
        calls_per_sample=calls_per_sample,
        trial_medians_ms=medians,
        ci_low_ms=min(low, median),
        ci_high_ms=max(high, median),
    )


class SampledWorkload(Protocol):
    """What `WorkerSamples` needs of the worker's workload (bench/workload_inputs.py)."""

    floats: list[str]

    def sample_seed(self, solution: str, k: int) -> int: ...

    def case(self, sample_seed: int, index: int) -> tuple[dict[str, Any], dict[str, Any]]: ...


class WorkerSamples:
    """The worker's side of the timed samples: it draws each sample's seed, makes that
    sample's inputs and reference outputs before the sample runs (on the CPU it writes the
    values into the sandbox's shared sets itself), checks every call of the sample (through
    its caller), keeps the per-call times it will report, and says when to stop (`more`).

    `interpret`: the solution runs in Triton's interpreter (bench/interpreter.py): its
    samples are checks only, `cfg.interpreter_samples` of them within
    `cfg.interpreter_seconds`, at least one; `draws` is the number of draws of a sampling op
    (the worker sets it when it answers the first call)."""

    def __init__(
        self,
        wl: SampledWorkload,
        cfg: BenchConfig,
        solution: str,
        shared: list[dict[str, Any]] | None = None,
        cpu: bool = False,
        interpret: bool = False,
    ) -> None:
        self.wl, self.cfg, self.solution, self.shared = wl, cfg, solution, shared
        self.cpu, self.interpret = cpu, interpret
        budget = cfg.budget()
        self.trials = budget.trials
        if interpret:
            self.wanted, self.floor = max(1, cfg.interpreter_samples), 1
        else:
            self.wanted = max(1, budget.trials * budget.iterations)
            self.floor = min(3, self.wanted)
        self.draws = cfg.sampling_draws
        self.sets = 0
        self.method = ""
        self.fallback: str | None = None
        self.times_ms: list[float] = []
        self.cases: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (inputs, reference)
        self.started = 0.0
        self.spent = 0.0  # seconds of the worker's own work for the samples
        self.launches: Any = None  # the interpreter's kernel launches, as the sandbox counted

    def ready(self, payload: dict) -> int:
        sets, method = payload.get("sets"), payload.get("method")
        limit = len(self.shared) if self.shared is not None else MAX_SETS
        if type(sets) is not int or not 1 <= sets <= limit:
            raise ValueError(f"input sets per sample: {sets!r}")
        if method not in ("cuda_graph", "device_sync", "cpu"):
            raise ValueError(f"timing method {method!r}")
        fallback = payload.get("fallback")
        self.sets, self.method = sets, method
        self.fallback = fallback if isinstance(fallback, str) else None
        self.started = time.monotonic()
        return self.next_sample()

    def next_sample(self) -> int:
        """Make the next sample's inputs and reference outputs; return what the sandbox
        needs to run it: the sample seed, or (shared sets, the values already written into
        them) the sample's number only."""
        k = len(self.times_ms)
        seed = self.wl.sample_seed(self.solution, k)
        self.cases = [self.wl.case(seed, i) for i in range(self.sets)]
        if self.shared is None:
            return seed
        for target, (inputs, _) in zip(self.shared, self.cases, strict=False):
            for name in self.wl.floats:
                target[name].copy_(inputs[name])
        return k

    def more(self) -> bool:
        """Another sample? At least `floor` (3; 1 in the interpreter) whatever the caps.
        Then on a GPU until the budget's samples are checked; on a CPU until the median's
        95% interval is within `cfg.spread_target` of it (and at least `iterations`
        samples), `cfg.max_samples`, or `cfg.spread_seconds`; either way no further once the
        time cap is spent or the worker's own checking (inputs and reference runs: one per
        timed call) has cost `cfg.max_check_seconds`."""
        n = len(self.times_ms)
        if n < self.floor:
            return True
        elapsed = time.monotonic() - self.started
        if self.interpret:
            return n < self.wanted and elapsed < self.cfg.interpreter_seconds
        cap = self.cfg.max_seconds * max(1, self.trials)
        if elapsed >= cap or self.spent >= self.cfg.max_check_seconds:
            return False
        if not self.cpu:
            return n < self.wanted
        if n >= self.cfg.max_samples or elapsed >= self.cfg.spread_seconds:
            return False
        return n < self.wanted or relative_spread(self.times_ms) > self.cfg.spread_target

    def timing(self) -> Timing:
        timing = timing_from_samples(self.times_ms, self.trials, self.method, self.sets)
        return replace(timing, fallback=self.fallback)


def interval_text(timing: Timing, target: float | None = None) -> str:
    """'median 0.2 ms, 95% interval [0.19, 0.22] ms (±6.2%) over 40 samples', and
    '(noisy: above the ±5% target)' when the spread exceeds `target` (for the trace's log).
    Below 6 samples the interval is [min, max], of confidence 1 - 2^(1 - n) (75% at 3)."""
    spread, interval, n = timing.relative_spread, timing.interval, timing.repetitions
    text = f"median {timing.median_ms:.5g} ms"
    if spread is None or interval is None:
        return f"{text} over {n} samples (no interval)"
    level = CI_CONFIDENCE if n >= 6 else 1 - 2.0 ** (1 - n)
    text += (
        f", {level:.0%} interval [{interval[0]:.5g}, {interval[1]:.5g}] ms (±{spread:.1%}) "
        f"over {n} samples"
    )
    if target is not None and spread > target:
        text += f" (noisy: above the ±{target:.0%} target)"
    return text

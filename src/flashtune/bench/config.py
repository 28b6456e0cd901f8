"""How the benchmark evaluates: the settings every solution of a run is measured by."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

import torch

__all__ = ["BenchConfig", "TimingBudget", "cpu_threads"]

T = TypeVar("T")
_METHODS = ("auto", "cuda_graph", "cuda_events")


@dataclass(frozen=True)
class BenchConfig:
    """How to evaluate. None fields take the device's default (`for_device`).

    warmup / iterations: minimum warm-up calls and timed samples per trial; on a GPU the
    time minimums `warmup_ms` / `trial_ms` usually dominate (see timing.measure_robust for
    what each fixes). timing_method: "auto" (a CUDA graph when the solution can be
    captured, else CUDA events), or force "cuda_graph" / "cuda_events". The same settings
    apply to every solution of a workload; only the reference is timed more briefly.
    """

    warmup: int | None = None
    iterations: int | None = None
    trials: int | None = None
    input_sets: int | None = None
    warmup_ms: float | None = None
    trial_ms: float | None = None
    target_sample_ms: float = 1.0
    timing_method: str = "auto"
    atol: float | None = None
    rtol: float | None = None
    max_rel_norm: float | None = None
    max_abs: float | None = None
    # The run's seed (every input derives from it); None: drawn from the operating system
    # when the run starts (bench/runner.py), so no solution can know its inputs in advance.
    seed: int | None = None
    sampling_draws: int = 0  # draws of a stochastic op's check; 0: the device's default
    max_seconds: float = 10.0  # per trial, so one slow solution cannot stall the run
    reference_max_seconds: float = 3.0
    # The worker's own work for one solution's timed samples: each timed call costs it an
    # input synthesis and a reference run, and a slow reference (a Python loop over
    # requests) would otherwise cost minutes per solution. Past it the samples stop (at
    # least 3 are taken); the trace's performance says how many were.
    max_check_seconds: float = 8.0
    # A solution's import, setup and first call: where JIT compilers (Triton, FlashInfer's
    # nvcc builds of 15-60 s a kernel) do their work. It gets its own limit, so a cold
    # compile cache is not charged to the run's `timeout`, which starts after it.
    first_call_timeout: float = 900.0
    # ... as long as they make progress: a first call that for `hang_timeout` seconds in a
    # row runs no child process (a compiler) and uses (almost) no CPU is hanging, and is
    # killed then (bench/sandbox.py's HangWatch; 0: never). The bundled dataset's first
    # calls on the CPU took 0.3 s at most (2 cores), and a compile uses a CPU or a child.
    hang_timeout: float = 60.0
    # CPU timing (the GPU's fixed 3 x 10 samples are steady to a few percent): samples go on
    # past `iterations` until the median's 95% interval (timing.median_ci) lies within
    # `spread_target` of it, for at most `spread_seconds` of one solution's samples (worker's
    # checks included) or `max_samples`; the reference by the same rule, for at most
    # `reference_spread_seconds`. Four CPU runs of 5 samples once measured one torch rmsnorm
    # at 0.23, 0.27, 44 and 120 ms.
    spread_target: float = 0.05
    spread_seconds: float = 1.0
    reference_spread_seconds: float = 0.5
    max_samples: int = 200
    # Intra-op threads of the CPU's timed calls (warm-up and samples), the solution's (in
    # its sandbox) and the reference's (in the worker) alike; 0: torch's default. The other
    # calls (first call, checks, draws) keep torch's default. One: a two-thread op waits at
    # its barrier for a thread that another process holds off its core, 44-52 ms a call on
    # the shared two-core machine (measured: a 0.07 ms rmsnorm reference ran at 48 ms for
    # whole bursts of calls with two threads, never above 1.5 ms with one).
    cpu_threads: int = 1
    # A Triton solution on a CPU runs in Triton's interpreter (bench/interpreter.py): checked,
    # not timed. After its first call it gets `interpreter_samples` checked samples of new
    # values within `interpreter_seconds` (at least one) and, for a sampling op, that many
    # seconds of draws at the first call's pace, at least `interpreter_min_draws` (at most
    # `sampling_draws`): a draw of a 128k-token sampling kernel takes 0.25-1.5 s there.
    interpreter_samples: int = 1
    interpreter_seconds: float = 6.0
    interpreter_min_draws: int = 8

    def for_device(self, device: torch.device) -> BenchConfig:
        """Fill unset fields. CPU defaults are small: the CPU run of the bundled dataset must
        finish in minutes on two cores: at least 10 checked samples of one call (fewer when
        `spread_seconds` runs out first, 3 at least), each costing the worker a reference
        call, more while the spread is above `spread_target`. GPU defaults: >= 25
        ms of warm-up, 3 trials of 10 checked samples (~1 ms each; bench/checked_timing.py);
        `input_sets` and `trial_ms` size the reference's own timing.
        Sampling checks draw 1000 times on a GPU, 200 on the CPU: a sort-based draw over a
        128k vocabulary takes 2-40 ms there (1000 draws of solution and reference took 99 s a
        workload), and 200 is what the edge test of bench/sampling_support.py needs to catch
        a top-(k-1), top-(p - 0.1) or argmax sampler at batch 1 in most input sets (with 20
        it caught a top-(k-1) sampler in none; docs/evaluation.md, "Sampling")."""
        gpu = device.type == "cuda"
        return replace(
            self,
            warmup=_or(self.warmup, 10 if gpu else 1),
            iterations=_or(self.iterations, 10),
            trials=_or(self.trials, 3 if gpu else 1),
            input_sets=_or(self.input_sets, 4 if gpu else 1),
            warmup_ms=_or(self.warmup_ms, 25.0 if gpu else 0.0),
            trial_ms=_or(self.trial_ms, 100.0 if gpu else 0.0),
            sampling_draws=self.sampling_draws or (1000 if gpu else 200),
        )

    def method(self) -> Literal["auto", "cuda_graph", "cuda_events"]:
        """`timing_method`, checked: a typo must not silently mean "auto"."""
        if self.timing_method not in _METHODS:
            raise ValueError(
                f"timing_method {self.timing_method!r}: expected one of {', '.join(_METHODS)}"
            )
        return self.timing_method  # type: ignore[return-value]  # checked just above

    def budget(self) -> TimingBudget:
        """The timing fields, all set (after `for_device`)."""
        fields = (self.warmup, self.iterations, self.trials, self.warmup_ms, self.trial_ms)
        if None in fields or self.input_sets is None:
            raise ValueError("BenchConfig.budget() needs for_device() first")
        return TimingBudget(
            warmup=int(self.warmup or 0),
            iterations=int(self.iterations or 0),
            trials=int(self.trials or 0),
            input_sets=int(self.input_sets),
            warmup_ms=float(self.warmup_ms or 0.0),
            trial_ms=float(self.trial_ms or 0.0),
        )


@dataclass(frozen=True)
class TimingBudget:
    """BenchConfig's timing fields once the device's defaults are filled in."""

    warmup: int
    iterations: int
    trials: int
    input_sets: int
    warmup_ms: float
    trial_ms: float


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


@contextmanager
def cpu_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to `threads` inside, restored after (0: unchanged): the
    CPU's timed calls run with `BenchConfig.cpu_threads`."""
    before = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if threads > 0:
            torch.set_num_threads(before)

"""Evaluate the solutions of one (definition, workload): correctness, then timing.

Runs inside a worker process (bench/worker.py). For each workload:
1. synthesize the inputs (seeded) and run the reference: its outputs and its latency are
   the baseline shared by all the workload's solutions;
2. for each solution: requirements (else SKIPPED), build (else COMPILE_ERROR), one call on a
   private copy of the inputs (RUNTIME_ERROR on an exception), outputs checked for shape,
   dtype and values, inputs checked for writes;
3. timing with `flashtune.timing.measure_robust`, rotating through `input_sets` distinct,
   freshly synthesized input sets (so inputs change between timed calls) plus clones for a
   cold L2: a CUDA graph of many calls for everything that can be captured (the reference
   and baselines included), CUDA events for what cannot; time-based warm-up and samples;
   median over trials. `Performance.timing_method` says which method was used;
4. one more call on fresh inputs, checked again: catches solutions that memoize results.
Each step yields ("start", solution name) before it begins and ("trace", Trace) when done,
so the parent can attribute a crash or a timeout to the solution that caused it.
"""

from __future__ import annotations

import contextlib
import io
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import torch

from flashtune.bench.build import (
    BuildError,
    MissingRequirement,
    build_solution,
    check_requirements,
    solution_hash,
)
from flashtune.bench.correctness import (
    Verdict,
    compare_outputs,
    distribution_check,
    inputs_modified,
    is_stochastic,
)
from flashtune.data.models import (
    Definition,
    Evaluation,
    EvaluationStatus,
    Performance,
    Solution,
    Trace,
    Workload,
)
from flashtune.data.reference import compile_reference, outputs_as_dict
from flashtune.data.synth import resolve_axes, synthesize_inputs, torch_dtype
from flashtune.timing import Timing, clone_inputs, copies_for_cold_l2, measure_robust

__all__ = ["BenchConfig", "Event", "evaluate_workload", "make_trace", "LOG_LIMIT"]

LOG_LIMIT = 4000  # characters of log kept per Evaluation (the tail: where errors are)


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
    seed: int = 0
    sampling_draws: int = 1000
    max_seconds: float = 10.0  # per trial, so one slow solution cannot stall the run
    reference_max_seconds: float = 3.0

    def for_device(self, device: torch.device) -> BenchConfig:
        """Fill unset fields. CPU defaults are small: the CPU run of the bundled dataset must
        finish in minutes on two cores, and CPU timings are indicative only. GPU defaults:
        >= 25 ms of warm-up, 3 trials of >= 100 ms of samples each (~1 ms per sample)."""
        gpu = device.type == "cuda"
        defaults = {
            "warmup": 10 if gpu else 1,
            "iterations": 10 if gpu else 5,
            "trials": 3 if gpu else 1,
            "input_sets": 4 if gpu else 2,
            "warmup_ms": 25.0 if gpu else 0.0,
            "trial_ms": 100.0 if gpu else 0.0,
        }
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})


Event = tuple[str, Any]  # ("start", solution name | "reference") or ("trace", Trace)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _bounded(text: str) -> str:
    return text if len(text) <= LOG_LIMIT else "...\n" + text[-LOG_LIMIT:]


def make_trace(
    definition: str,
    workload: Workload,
    solution: Solution,
    status: EvaluationStatus,
    environment: Mapping[str, Any],
    reason: str | None = None,
    log: str = "",
    verdict: Verdict | None = None,
    performance: Performance | None = None,
) -> Trace:
    """A Trace for one evaluated triple (also used by the parent for TIMEOUT / crashes)."""
    evaluation = Evaluation(
        status=status,
        environment=dict(environment),
        timestamp=_now(),
        log=_bounded(log),
        reason=reason,
        correctness=verdict.correctness if verdict else None,
        performance=performance,
        solution_hash=solution_hash(solution),
    )
    return Trace(
        definition=definition, workload=workload, solution=solution.name, evaluation=evaluation
    )


# --------------------------------------------------------------------------- calling


def _args(definition: Definition, inputs: Mapping[str, Any]) -> list[Any]:
    return [inputs[name] for name in definition.inputs]


def _clone(inputs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _alloc_outputs(definition: Definition, axes: Mapping[str, int], device: torch.device):
    return [
        torch.empty(
            tuple(axes[a] for a in spec.shape or ()), dtype=torch_dtype(spec.dtype), device=device
        )
        for spec in definition.outputs.values()
    ]


class _Caller:
    """Calls a solution the way its spec says (returning outputs or destination passing)."""

    def __init__(
        self, definition: Definition, fn: Callable[..., Any], dps: bool, axes, device
    ) -> None:
        self.definition, self.fn, self.dps = definition, fn, dps
        self.axes, self.device = axes, device

    def args(self, inputs: Mapping[str, Any]) -> list[Any]:
        args = _args(self.definition, inputs)
        if self.dps:
            args += _alloc_outputs(self.definition, self.axes, self.device)
        return args

    def outputs(self, args: Sequence[Any], result: Any) -> dict[str, Any]:
        if self.dps:
            return dict(
                zip(self.definition.outputs, args[len(self.definition.inputs) :], strict=False)
            )
        return outputs_as_dict(self.definition, result)

    def call(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        args = self.args(inputs)
        result = self.fn(*args)
        _sync(self.device)
        return self.outputs(args, result)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cold_l2_sets(sets: list[list[Any]], device: torch.device) -> list[list[Any]]:
    """On a GPU, add clones of the distinct input sets until their bytes exceed twice the L2
    (timing.copies_for_cold_l2), so no timed call finds its inputs cache-resident."""
    if device.type != "cuda":
        return sets
    need = copies_for_cold_l2(sets[0], device)
    base = len(sets)
    while len(sets) < need:
        sets.append(clone_inputs(sets[len(sets) % base]))
    return sets


def _time(
    fn: Callable[..., Any],
    input_sets: list[list[Any]],
    cfg: BenchConfig,
    device,
    *,
    reference=False,
) -> Timing:
    """Time `fn` over the input sets with `timing.measure_robust` (median of trials; the
    Timing carries the method, the trial medians and any capture fallback).

    Every solution of a workload gets the same policy and the same time budgets, whatever
    its latency: a graph when capturable, else events. The reference is timed briefly (one
    trial, a smaller budget): it is a readable baseline, often slow (Python loops)."""
    input_sets = _cold_l2_sets(input_sets, device)
    if reference:
        return measure_robust(
            fn, input_sets[0], input_sets=input_sets, method=cfg.timing_method,  # type: ignore[arg-type]
            warmup=min(cfg.warmup, 2), warmup_ms=min(cfg.warmup_ms, 10.0),
            repetitions=min(cfg.iterations, 3), trial_ms=min(cfg.trial_ms, 30.0), trials=1,
            target_sample_ms=cfg.target_sample_ms, max_seconds=cfg.reference_max_seconds,
        )  # fmt: skip
    return measure_robust(
        fn, input_sets[0], input_sets=input_sets, method=cfg.timing_method,  # type: ignore[arg-type]
        warmup=cfg.warmup, warmup_ms=cfg.warmup_ms, repetitions=cfg.iterations,
        trial_ms=cfg.trial_ms, trials=cfg.trials, target_sample_ms=cfg.target_sample_ms,
        max_seconds=cfg.max_seconds,
    )  # fmt: skip


# --------------------------------------------------------------------------- the workload


class _Workload:
    """Inputs and reference results of one workload, shared by its solutions."""

    def __init__(
        self, definition: Definition, workload: Workload, cfg: BenchConfig, device, blob_root
    ):
        self.definition, self.workload, self.cfg, self.device = definition, workload, cfg, device
        self.blob_root = blob_root
        self.axes = resolve_axes(definition, workload)
        self.reference = compile_reference(definition)
        self.inputs = self.synth(cfg.seed)
        self.ref_outputs = self.run_reference(self.inputs)
        self._timing_sets: list[dict[str, Any]] | None = None
        self._fresh: tuple[dict[str, Any], dict[str, Any]] | None = None

    def synth(self, seed: int) -> dict[str, Any]:
        return synthesize_inputs(
            self.definition, self.workload, device=self.device, seed=seed, blob_root=self.blob_root
        )

    def run_reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        with torch.no_grad():
            out = outputs_as_dict(self.definition, self.reference(**_clone(inputs)))
        _sync(self.device)
        return out

    def timing_sets(self) -> list[dict[str, Any]]:
        if self._timing_sets is None:
            n = max(1, self.cfg.input_sets)
            self._timing_sets = [self.inputs] + [
                self.synth(self.cfg.seed + 1 + i) for i in range(n - 1)
            ]
        return self._timing_sets

    def fresh(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Inputs never seen during correctness or timing, and the reference's outputs."""
        if self._fresh is None:
            inputs = self.synth(self.cfg.seed + 10_007)
            self._fresh = (inputs, self.run_reference(inputs))
        return self._fresh

    def reference_timing(self) -> Timing:
        sets = [_args(self.definition, _clone(s)) for s in self.timing_sets()]
        with torch.no_grad():
            return _time(self.reference, sets, self.cfg, self.device, reference=True)


def evaluate_workload(
    definition: Definition,
    workload: Workload,
    solutions: Sequence[Solution],
    cfg: BenchConfig,
    device: torch.device,
    environment: Mapping[str, Any],
    blob_root: Any = None,
    baselines: Sequence[str] = (),
    baseline_latency: tuple[str, float] | None = None,
) -> Iterator[Event]:
    """Evaluate `solutions` (baselines first) on one workload; yield start/trace events."""
    cfg = cfg.for_device(device)
    yield ("start", "reference")
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            wl = _Workload(definition, workload, cfg, device, blob_root)
            ref_timing = wl.reference_timing()
    except Exception as exc:  # noqa: BLE001 - a failing reference fails its workload only
        reason = f"reference failed: {type(exc).__name__}: {exc}"
        text = log.getvalue() + traceback.format_exc()
        for sol in solutions:
            yield (
                "trace",
                make_trace(
                    definition.name, workload, sol, EvaluationStatus.RUNTIME_ERROR,
                    environment, reason, text,
                ),
            )  # fmt: skip
        return
    best = baseline_latency
    best_method: str | None = None  # unknown for a baseline timed in an earlier task
    for sol in solutions:
        yield ("start", sol.name)
        trace = _evaluate_one(definition, workload, sol, wl, ref_timing, best, cfg, environment)
        perf = trace.evaluation.performance if trace.evaluation else None
        method = getattr(perf, "timing_method", None) if perf is not None else None
        if (
            sol.name in baselines
            and perf is not None
            and (best is None or perf.latency_ms < best[1])
        ):
            best, best_method = (sol.name, perf.latency_ms), method
            perf.baseline_solution, perf.baseline_latency_ms = sol.name, perf.latency_ms
            perf.speedup_vs_baseline = 1.0
        elif perf is not None and best is not None and best_method not in (None, method):
            # A graph-timed and an event-timed result differ by the launch gaps too.
            trace.evaluation.log += (
                f"timing: {method} here but {best_method} for the baseline {best[0]}: "
                "the speedup mixes timing methods\n"
            )
        yield ("trace", trace)


def _evaluate_one(
    definition: Definition,
    workload: Workload,
    sol: Solution,
    wl: _Workload,
    ref: Timing,
    baseline: tuple[str, float] | None,
    cfg: BenchConfig,
    environment: Mapping[str, Any],
) -> Trace:
    device = wl.device
    log = io.StringIO()

    def trace(status, reason=None, verdict=None, performance=None, tb: bool = False) -> Trace:
        text = log.getvalue() + (traceback.format_exc() if tb else "")
        return make_trace(
            definition.name, workload, sol, status, environment, reason, text, verdict, performance
        )

    try:
        check_requirements(sol, device)
    except MissingRequirement as exc:
        return trace(EvaluationStatus.SKIPPED, str(exc))
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            fn = build_solution(sol)
        except MissingRequirement as exc:
            return trace(EvaluationStatus.SKIPPED, str(exc))
        except BuildError as exc:
            log.write(exc.log)
            return trace(EvaluationStatus.COMPILE_ERROR, str(exc))
        caller = _Caller(definition, fn, sol.spec.destination_passing_style, wl.axes, device)
        stochastic = is_stochastic(definition)

        # 1. correctness on a private copy of the inputs
        inputs = _clone(wl.inputs)
        try:
            with torch.no_grad():
                outputs = caller.call(inputs)
        except Exception as exc:  # noqa: BLE001 - the solution's failure is the result
            return trace(EvaluationStatus.RUNTIME_ERROR, f"{type(exc).__name__}: {exc}", tb=True)
        if stochastic:
            verdict = _shape_dtype(definition, wl.ref_outputs, outputs)
        else:
            verdict = compare_outputs(definition, wl.ref_outputs, outputs, cfg.atol, cfg.rtol)
        if verdict.status is not EvaluationStatus.PASSED:
            return trace(verdict.status, verdict.reason, verdict)
        changed = inputs_modified(wl.inputs, inputs)
        if changed:
            return trace(
                EvaluationStatus.INCORRECT_NUMERICAL,
                f"wrote into its input(s) {', '.join(changed)}: inputs must stay unchanged",
                verdict,
            )

        # 2. timing over rotating input sets
        try:
            sets = [caller.args(_clone(s)) for s in wl.timing_sets()]
            with torch.no_grad():
                timing = _time(fn, sets, cfg, device)
        except Exception as exc:  # noqa: BLE001
            return trace(
                EvaluationStatus.RUNTIME_ERROR,
                f"while timing: {type(exc).__name__}: {exc}",
                tb=True,
            )
        del sets

        # 3. check again on fresh inputs (a memoizing solution fails here)
        fresh_inputs, fresh_ref = wl.fresh()
        try:
            with torch.no_grad():
                if stochastic:
                    again = distribution_check(
                        definition,
                        lambda: caller.call(_clone(fresh_inputs)),
                        lambda: wl.run_reference(fresh_inputs),
                        draws=cfg.sampling_draws,
                    )
                else:
                    again = compare_outputs(
                        definition, fresh_ref, caller.call(_clone(fresh_inputs)), cfg.atol, cfg.rtol
                    )
        except Exception as exc:  # noqa: BLE001
            return trace(
                EvaluationStatus.RUNTIME_ERROR,
                f"on fresh inputs after timing: {type(exc).__name__}: {exc}",
                tb=True,
            )
        if again.status is not EvaluationStatus.PASSED:
            reason = f"on fresh inputs after timing: {again.reason}"
            if not stochastic:
                reason += " (results cached between calls?)"
            return trace(again.status, reason, again)
        if stochastic:
            verdict = again

    ref_ms = ref.median_ms
    performance = Performance(
        latency_ms=timing.median_ms,
        latency_spread_ms=timing.iqr_ms,
        reference_latency_ms=ref_ms,
        speedup_factor=ref_ms / timing.median_ms if timing.median_ms > 0 else None,
        # Extra fields (the model keeps unknown fields): how the numbers were obtained, so
        # a report can tell graph-timed from event-timed results and judge their stability.
        timing_method=timing.method,
        timing_trials_ms=list(timing.trial_medians_ms),
        timing_calls_per_sample=timing.calls_per_sample,
        reference_timing_method=ref.method,
    )
    if baseline is not None:
        performance.baseline_solution, performance.baseline_latency_ms = baseline
        performance.speedup_vs_baseline = (
            baseline[1] / timing.median_ms if timing.median_ms > 0 else None
        )
    log.write(
        f"timing: {timing.method}, {timing.calls_per_sample} call(s)/sample, "
        f"{timing.repetitions} samples over {len(timing.trial_medians_ms)} trial(s), "
        f"trial medians (ms) {', '.join(f'{t:.5g}' for t in timing.trial_medians_ms)}\n"
    )
    if timing.fallback:
        log.write(f"timing: not capturable into a CUDA graph ({timing.fallback})\n")
    return trace(EvaluationStatus.PASSED, None, verdict, performance)


def _shape_dtype(
    definition: Definition, reference: Mapping[str, Any], actual: Mapping[str, Any]
) -> Verdict:
    for name, spec in definition.outputs.items():
        out, ref = actual.get(name), reference[name]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
            shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return Verdict(
                EvaluationStatus.INCORRECT_SHAPE,
                f"output {name!r} is {shape}, expected shape {list(ref.shape)}",
            )
        if out.dtype != torch_dtype(spec.dtype):
            return Verdict(
                EvaluationStatus.INCORRECT_DTYPE,
                f"output {name!r} has dtype {out.dtype}, expected {spec.dtype}",
            )
    return Verdict(EvaluationStatus.PASSED)

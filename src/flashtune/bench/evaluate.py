"""Evaluate the solutions of one (definition, workload): correctness, then timing.

Runs inside a worker process (bench/worker.py). For each workload:
1. synthesize the inputs (seeded) and run the reference: its outputs and its latency are
   the baseline shared by all the workload's solutions (bench/workload_inputs.py);
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
import math
import os
import pickle
import secrets
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, replace
from datetime import datetime, timezone
from typing import Any

import torch

from flashtune.bench.build import MissingRequirement, check_requirements, solution_hash
from flashtune.bench.checked_timing import WorkerSamples, interval_text
from flashtune.bench.config import BenchConfig
from flashtune.bench.correctness import (
    Verdict,
    compare_outputs,
    distribution_check,
    inputs_modified,
    shape_dtype_verdict,
)
from flashtune.bench.interpreter import draws_for, interpreted, interpreted_outcome
from flashtune.bench.sampling_support import outputs_outside_support
from flashtune.bench.sandbox import (
    HangWatch,
    Sandbox,
    SandboxDied,
    SandboxJob,
    SandboxPool,
    SandboxTimeout,
)
from flashtune.bench.workload_inputs import ReferenceResult, WorkloadInputs
from flashtune.data.models import (
    Definition,
    Evaluation,
    EvaluationStatus,
    Performance,
    Solution,
    Trace,
    Workload,
    metrics_for_status,
)
from flashtune.data.reference import outputs_as_dict
from flashtune.data.synth import InputError
from flashtune.timing import Timing, tensor_bytes

__all__ = ["BenchConfig", "Event", "evaluate_workload", "make_trace", "LOG_LIMIT"]

LOG_LIMIT = 4000  # characters of log kept per Evaluation (the tail: where errors are)


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
    correctness, performance = metrics_for_status(
        status, verdict.correctness if verdict else None, performance
    )
    evaluation = Evaluation(
        status=status,
        environment=dict(environment),
        timestamp=_now(),
        log=_bounded(log),
        reason=reason,
        correctness=correctness,
        performance=performance,
        solution_hash=solution_hash(solution),
    )
    return Trace(
        definition=definition, workload=workload, solution=solution.name, evaluation=evaluation
    )


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
    timeout: float = 300.0,
    pool: SandboxPool | None = None,
) -> Iterator[Event]:
    """Evaluate `solutions` (baselines first) on one workload; yield start/trace events.
    Each solution runs in a sandbox process of its own (bench/sandbox.py), killed after
    `timeout` seconds. With a `pool` (the worker's), a solution's sandbox serves its next
    workloads too; without one, the sandboxes end with this workload."""
    if pool is None:
        with SandboxPool() as own:
            yield from evaluate_workload(
                definition,
                workload,
                solutions,
                cfg,
                device,
                environment,
                blob_root,
                baselines,
                baseline_latency,
                timeout,
                own,
            )
        return
    cfg = cfg.for_device(device)
    if cfg.seed is None:  # called outside a run (bench/runner.py draws the run's seed)
        cfg = replace(cfg, seed=secrets.randbits(62))
    yield ("start", "reference")
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            wl = WorkloadInputs(definition, workload, cfg, device, blob_root)
            ref_timing = wl.reference_timing()
        # The reference's temporaries (gigabytes for long prefills) go back to the device
        # before the solutions' sandboxes, other processes, allocate theirs.
        if device.type == "cuda":
            torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 - a failing reference fails its workload only
        status = EvaluationStatus.RUNTIME_ERROR
        reason = f"reference failed: {type(exc).__name__}: {exc}"
        if device.type == "cuda" and isinstance(exc, torch.cuda.OutOfMemoryError):
            reason += f" [{_device_memory_note(device)}]"
        if isinstance(exc, InputError):
            status, reason = EvaluationStatus.INCORRECT_SHAPE, f"workload input error: {exc}"
        text = log.getvalue() + traceback.format_exc()
        for sol in solutions:
            yield (
                "trace",
                make_trace(definition.name, workload, sol, status, environment, reason, text),
            )
        return
    best = baseline_latency
    best_method: str | None = None  # unknown for a baseline timed in an earlier task
    for sol in solutions:
        yield ("start", sol.name)
        trace = _evaluate_one(
            definition, workload, sol, wl, ref_timing, best, cfg, environment, timeout, pool
        )
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
            # A graph-timed and a synchronized-wall-timed result are not like for like.
            perf.speedup_vs_baseline = None
            assert trace.evaluation is not None  # it has a performance
            trace.evaluation.log += (
                f"timing: {method} here but {best_method} for the baseline {best[0]}: "
                "no speedup over it (timing differs)\n"
            )
        yield ("trace", trace)


_STATUS_FROM_CHILD = {
    "SKIPPED": EvaluationStatus.SKIPPED,
    "COMPILE_ERROR": EvaluationStatus.COMPILE_ERROR,
    "RUNTIME_ERROR": EvaluationStatus.RUNTIME_ERROR,
    "TAMPERED": EvaluationStatus.RUNTIME_ERROR,
}


class _FirstCallTimeout(RuntimeError):
    """A solution's import, setup and first call outlasted cfg.first_call_timeout."""


class _Failed(Exception):
    def __init__(self, status: EvaluationStatus, reason: str, verdict: Verdict | None = None):
        super().__init__(reason)
        self.status, self.reason, self.verdict = status, reason, verdict


# A workload needs the device to itself when what it still needs (a sample's values in the
# worker, the sandbox's own set and values, the reference's peak on a sample) would take
# more than this share of the free memory.
_ROOM_SHARE = 0.5


def _needs_the_device(wl: WorkloadInputs) -> bool:
    """Whether `wl` needs most of the device's free memory, so idle sandboxes must give
    theirs back first (one run lost a workload to an out-of-memory in the reference: 87 GB
    in the worker, 33 in the sandbox, 13 in two idle ones)."""
    if wl.device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(wl.device)
    need = 3 * tensor_bytes(wl.sets[0].values()) + wl.reference_peak
    return need > _ROOM_SHARE * free


def _device_memory_note(device: torch.device) -> str:
    """One line on the worker's CUDA memory when a reference runs out of it: whether the
    allocator cache (reserved but unallocated) or live tensors hold it, and its settings."""
    stats = torch.cuda.memory_stats(device)
    gib = 1 << 30
    reserved = stats.get("reserved_bytes.all.current", 0) / gib
    allocated = stats.get("allocated_bytes.all.current", 0) / gib
    free, total = torch.cuda.mem_get_info(device)
    return (
        f"worker memory: {allocated:.1f} GiB allocated, {reserved:.1f} GiB reserved, "
        f"{free / gib:.1f} of {total / gib:.1f} GiB free on the device, "
        f"{stats.get('num_alloc_retries', 0)} allocation retries, "
        f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r}"
    )


def _evaluate_one(
    definition: Definition,
    workload: Workload,
    sol: Solution,
    wl: WorkloadInputs,
    ref: Timing,
    baseline: tuple[str, float] | None,
    cfg: BenchConfig,
    environment: Mapping[str, Any],
    timeout: float,
    pool: SandboxPool,
) -> Trace:
    log = io.StringIO()

    def trace(status, reason=None, verdict=None, performance=None) -> Trace:
        return make_trace(
            definition.name,
            workload,
            sol,
            status,
            environment,
            reason,
            log.getvalue(),
            verdict,
            performance,
        )

    try:
        interpret = interpreted(definition, sol, wl.device)  # a Triton solution on a CPU
        check_requirements(sol, wl.device, interpret=interpret)
    except MissingRequirement as exc:  # no process needed to know it
        return trace(EvaluationStatus.SKIPPED, str(exc))
    spec: dict[str, Any] = {
        "solution": sol.to_json(),
        "device": _indexed(wl.device),
        # The run's seed stays in the worker: with it a solution could derive every sample's
        # values before the sample runs.
        "config": asdict(replace(cfg, seed=0)),
        "roots": wl.roots(),
    }
    if interpret:  # its own kind of sandbox (a spawned process), never shared with others
        spec["interpret"] = True
    shared = None
    if wl.device.type == "cpu":
        # Shared memory: the child works on these very tensors, and the worker writes each
        # sample's values into them itself (nothing large is synthesized twice or sent back
        # by value, and the child never sees a seed).
        shared = [_shared_clone(x) for x in wl.sets]
    job = SandboxJob(
        definition=definition.to_json(),
        workload=workload.to_json(),
        seed=wl.seed,
        stochastic=wl.stochastic,
        shared_sets=shared,
        fixed=wl.fixed,
    )
    if wl.fixed:
        gb = tensor_bytes(wl.sets[0].values()) / 1e9
        log.write(
            f"inputs {', '.join(wl.fixed)} ({gb:.0f} GB a set) keep "
            "their first values in every sample: per-sample values do not fit the device "
            "(flashtune.bench.fixed_inputs)\n"
        )
    failure: tuple[EvaluationStatus, str, Verdict | None] | None = None
    if _needs_the_device(wl):
        ended = pool.close_idle(keep=spec)
        if ended:
            log.write(f"sandbox: {ended} idle sandbox(es) ended to make room for its inputs\n")
    sandbox = pool.get(spec)
    if sandbox.jobs:
        log.write(f"sandbox: reused (job {sandbox.jobs + 1} of this process)\n")
    try:
        sandbox.start(job)
        verdict, samples, marks = _drive(sandbox, definition, wl, cfg, timeout, sol.name, interpret)
    except _Failed as exc:
        failure = (exc.status, exc.reason, exc.verdict)
    except _FirstCallTimeout as exc:  # the hang rule's reason, else the long limit's
        why = str(exc) or (
            f"{sol.name} did not finish its import, setup and first call (where kernels "
            f"compile) within {cfg.first_call_timeout:g} s; its process was killed"
        )
        failure = (EvaluationStatus.TIMEOUT, why, None)
    except SandboxTimeout:
        why = (
            f"{sol.name} ran past the {timeout:g} s timeout after its first call; its "
            "process was killed"
        )
        failure = (EvaluationStatus.TIMEOUT, why, None)
    except SandboxDied as exc:
        failure = (EvaluationStatus.RUNTIME_ERROR, str(exc), None)
    except (ValueError, pickle.UnpicklingError, TypeError, KeyError, AttributeError) as exc:
        why = f"malformed message from the sandbox: {exc}"
        failure = (EvaluationStatus.RUNTIME_ERROR, why, None)
    except BaseException:
        pool.discard(sandbox)
        raise
    log.write(sandbox.log())
    if failure is not None:
        pool.discard(sandbox)  # it may be stuck, or hold a broken CUDA context
        if interpret:  # a failure there may be the interpreter's: say where it ran
            failure = (failure[0], f"in Triton's interpreter (CPU): {failure[1]}", failure[2])
        return trace(*failure)
    if wl.fixed:  # it held a set too large to idle beside the next workload's
        pool.discard(sandbox)
    else:
        pool.release(sandbox)
    if marks:
        log.write("sandbox: " + ", ".join(f"{k} by {v:.3f} s" for k, v in marks.items()) + "\n")
    if interpret:  # SKIPPED with a correctness: "correct, not timed" (bench/interpreter.py)
        reason, text, checked = interpreted_outcome(samples, verdict, wl.stochastic)
        log.write(text)
        return trace(EvaluationStatus.SKIPPED, reason, checked)
    timing = samples.timing()

    ref_ms = ref.median_ms
    performance = Performance(
        latency_ms=timing.median_ms,
        latency_spread_ms=timing.iqr_ms,
        reference_latency_ms=ref_ms,
        speedup_factor=ref_ms / timing.median_ms if timing.median_ms > 0 else None,
        # Extra fields (the model keeps unknown fields): how the numbers were obtained, so
        # a report can tell graph-timed from wall-timed results and judge their stability.
        timing_method=timing.method,
        timing_trials_ms=list(timing.trial_medians_ms),
        timing_calls_per_sample=timing.calls_per_sample,
        # every one of these samples' calls was checked (bench/checked_timing.py)
        timing_checked_samples=timing.repetitions,
        reference_timing_method=ref.method,
        latency_ci_ms=timing.interval,
        reference_latency_ci_ms=ref.interval,
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
    for who, t in (("solution", timing), ("reference", ref)):
        log.write(f"timing: {who} {interval_text(t, cfg.spread_target)}\n")
    if timing.fallback:
        log.write(f"timing: not capturable into a CUDA graph ({timing.fallback})\n")
    return trace(EvaluationStatus.PASSED, None, verdict, performance)


def _shared_clone(inputs: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: v.clone().share_memory_() if isinstance(v, torch.Tensor) else v
        for k, v in inputs.items()
    }


def _indexed(device: torch.device) -> str:
    """'cuda' -> 'cuda:<current>': the sandbox must use the worker's GPU."""
    index: int | None = device.index  # None for a bare "cuda" (torch's stubs say int)
    if device.type == "cuda" and index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def _drive(
    sandbox: Sandbox,
    definition: Definition,
    wl: WorkloadInputs,
    cfg: BenchConfig,
    timeout: float,
    solution: str,
    interpret: bool = False,
) -> tuple[Verdict, WorkerSamples, dict[str, float]]:
    """Follow the sandbox's messages to the end; check every output it sends. Returns the
    verdict, the samples (their timing: `.timing()`) and the child's phase times; raises
    _Failed with the first failure. Until the first call's outputs arrive the limit is
    cfg.first_call_timeout (import, setup, compilation), then `timeout` for the rest
    (checks, timing); the worker's own time spent checking is not charged to the solution."""
    deadline = time.monotonic() + cfg.first_call_timeout
    watch = HangWatch(sandbox, cfg.hang_timeout)  # a first call that hangs ends sooner
    verdict: Verdict | None = None
    phases: set[str] = set()
    marks: dict[str, float] = {}
    cpu = wl.device.type != "cuda"
    samples = WorkerSamples(wl, cfg, solution, sandbox.job.shared_sets, cpu, interpret)
    while True:
        wait = max(0.0, deadline - time.monotonic())
        try:
            kind, payload = sandbox.receive(wait if "first" in phases else watch.wait(wait))
        except SandboxTimeout:
            if "first" in phases:
                raise
            if time.monotonic() >= deadline:
                raise _FirstCallTimeout from None
            if watch.hanging():
                raise _FirstCallTimeout(watch.reason(solution)) from None
            continue
        if kind == "status":
            status = _STATUS_FROM_CHILD.get(payload.get("status"), EvaluationStatus.RUNTIME_ERROR)
            reason = str(payload.get("reason"))
            if payload.get("status") == "TAMPERED":
                reason = f"tampering: {reason}"
            raise _Failed(status, reason)
        if kind == "outputs":
            if not isinstance(payload, dict):
                raise ValueError("an outputs message that is not a record")
            phase = payload.get("phase")
            checking = time.monotonic()
            if phase == "first" and "first" not in phases:
                deadline = time.monotonic() + timeout
            reply: int | None = None
            if phase == "ready":
                if "ready" in phases:
                    raise ValueError("a second 'ready'")
                reply = samples.ready(payload)
            elif phase == "sample":
                verdict = _check_sample(definition, wl, cfg, samples, payload) or verdict
                reply = samples.next_sample() if samples.more() else None
            else:
                verdict = _check_phase(definition, wl, cfg, phase, payload, samples) or verdict
                if phase == "first" and interpret and wl.stochastic:
                    # The interpreter draws for a bounded time (bench/interpreter.py).
                    samples.draws = reply = draws_for(
                        payload.get("call_s"),
                        cfg.interpreter_seconds,
                        cfg.interpreter_min_draws,
                        cfg.sampling_draws,
                    )
            phases.add(str(phase))
            spent = time.monotonic() - checking
            deadline += spent
            if phase in ("ready", "sample"):
                samples.spent += spent
            sandbox.ack(reply)
        elif kind == "done":
            got = payload.get("phases_s") if isinstance(payload, dict) else None
            if isinstance(got, dict):
                marks = {str(k): v for k, v in got.items() if isinstance(v, float)}
            if isinstance(payload, dict):
                samples.launches = payload.get("launches")
            break
        else:
            raise ValueError(f"unknown message {kind!r}")
    needed = {"first", "ready", "sample", "inputs"} | ({"draws"} if wl.stochastic else set())
    if not needed <= phases or verdict is None or len(samples.times_ms) < samples.floor:
        missing = sorted(needed - phases) or ["samples"]
        raise _Failed(
            EvaluationStatus.RUNTIME_ERROR,
            f"the solution's process ended before the harness finished ({', '.join(missing)})",
        )
    return verdict, samples, marks


def _unstacked_draws(payload: dict, count: int) -> list[Any]:
    """The sandbox's draws, one entry per draw: sent as a list, or stacked per output
    (sandbox_child.stack_draws) and split here."""
    if "stacked" not in payload:
        return list(payload.get("draws") or [])
    stacked, n = payload["stacked"], payload.get("count")
    tensors = list(stacked.values()) if isinstance(stacked, dict) else [stacked]
    if n != count or not all(isinstance(t, torch.Tensor) and len(t) == n for t in tensors):
        raise ValueError(f"stacked draws: expected {count} draws of each output")
    if isinstance(stacked, dict):
        return [{k: v[i] for k, v in stacked.items()} for i in range(n)]
    return [stacked[i] for i in range(n)]


def _check_sample(
    definition: Definition,
    wl: WorkloadInputs,
    cfg: BenchConfig,
    samples: WorkerSamples,
    payload: dict,
) -> Verdict | None:
    """One timed sample: its time, and the outputs of every one of its calls, each against
    the reference on the values that call was given."""
    k, ms = payload.get("k"), payload.get("ms")
    if not samples.cases or k != len(samples.times_ms):
        raise ValueError(f"sample {k!r} out of order")
    if not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms <= 0:
        raise ValueError(f"sample time {ms!r}")
    entries = payload.get("sets")
    if not isinstance(entries, list) or [e.get("index") for e in entries] != list(
        range(samples.sets)
    ):
        raise ValueError(f"sample {k}: expected the outputs of {samples.sets} calls, in order")
    verdict: Verdict | None = None
    if samples.shared is not None:  # shared sets cost nothing to read: inputs first
        for target, (pristine, expected) in zip(samples.shared, samples.cases, strict=False):
            _inputs_unchanged(wl, cfg, pristine, expected, target, f"in timed sample {k + 1}: ")
    for entry, (inputs, expected) in zip(entries, samples.cases, strict=True):
        where = f"timed call {entry['index'] + 1} of {samples.sets} in sample {k + 1}"
        got = entry.get("outputs")
        try:
            verdict = _judge(definition, wl, cfg, expected, got, where, inputs) or verdict
        except _Failed as exc:
            exc.reason += (
                " (each timed call gets new input values: a result cached by tensor identity, "
                "address or values is stale, and work that left the timed call is lost)"
            )
            raise
    samples.times_ms.append(float(ms))
    return verdict


def _judge(
    definition: Definition,
    wl: WorkloadInputs,
    cfg: BenchConfig,
    expected: Mapping[str, Any],
    got: Any,
    where: str,
    inputs: Mapping[str, Any],
) -> Verdict:
    """Compare one call's outputs with the reference's (a sampling call's: shape, dtype and
    support); raise _Failed when they differ."""
    prefix = f"{where}: " if where else ""
    try:
        outputs = outputs_as_dict(definition, got)
    except ValueError as exc:
        raise _Failed(EvaluationStatus.INCORRECT_SHAPE, f"{prefix}{exc}") from None
    if wl.stochastic:
        v = shape_dtype_verdict(definition, expected, outputs)
        problem = (
            outputs_outside_support(outputs, inputs)
            if v.status is EvaluationStatus.PASSED
            else None
        )
        if problem is not None:
            v = Verdict(EvaluationStatus.INCORRECT_NUMERICAL, problem)
    else:
        v = _compare(definition, expected, outputs, cfg, inputs)
    if v.status is not EvaluationStatus.PASSED:
        raise _Failed(v.status, f"{prefix}{v.reason}", v)
    return v


def _compare(
    definition: Definition,
    expected: Mapping[str, Any],
    got: Mapping[str, Any],
    cfg: BenchConfig,
    inputs: Mapping[str, Any] | None = None,
) -> Verdict:
    """compare_outputs under the run's tolerances: one place for the outputs and the
    destination buffers alike."""
    return compare_outputs(
        definition,
        expected,
        got,
        cfg.atol,
        cfg.rtol,
        max_rel_norm=cfg.max_rel_norm,
        max_abs=cfg.max_abs,
        inputs=inputs,
    )


def _inputs_unchanged(
    wl: WorkloadInputs,
    cfg: BenchConfig,
    pristine: Mapping[str, Any],
    expected: Mapping[str, Any],
    got: Any,
    when: str,
) -> None:
    """The inputs after the solution's calls: unchanged, except the destination buffers the
    reference writes into, which must hold what the reference left there."""
    if not isinstance(got, dict) or set(got) != set(pristine):
        raise ValueError("the inputs sent back do not name the definition's inputs")
    got = {
        k: v.to(pristine[k].device) if isinstance(v, torch.Tensor) else v for k, v in got.items()
    }
    changed = [name for name in inputs_modified(pristine, got) if name not in wl.written]
    if changed:
        raise _Failed(
            EvaluationStatus.INCORRECT_NUMERICAL,
            f"{when}wrote into its input(s) {', '.join(changed)}: inputs must stay unchanged",
        )
    if not wl.written:
        return
    assert isinstance(expected, ReferenceResult), "the reference's results come from run_reference"
    v = _compare(wl.written_definition, expected.inputs_after, {k: got[k] for k in wl.written}, cfg)
    if v.status is not EvaluationStatus.PASSED:
        raise _Failed(
            v.status,
            f"{when}the reference writes into {', '.join(wl.written)}; the solution left "
            f"other values there: {v.reason}",
        )


def _check_phase(
    definition: Definition,
    wl: WorkloadInputs,
    cfg: BenchConfig,
    phase: Any,
    payload: dict,
    samples: WorkerSamples,
) -> Verdict | None:
    """The untimed phases: the first call, a stochastic op's draws, the inputs after the
    last sample."""
    if phase == "draws":
        draws = iter(_unstacked_draws(payload, samples.draws))
        reference_draws = iter(wl.reference_draws(samples.draws))
        dist = distribution_check(
            definition,
            lambda: outputs_as_dict(definition, next(draws)),
            lambda: next(reference_draws),
            draws=samples.draws,
            inputs=wl.sets[0],
        )
        if dist.status is not EvaluationStatus.PASSED:
            raise _Failed(dist.status, dist.reason or "", dist)
        return dist
    entries = payload.get("sets")
    if not isinstance(entries, list):
        raise ValueError(f"phase {phase!r} without sets")
    if phase == "first":
        if len(entries) != 1 or entries[0].get("index") != 0:
            raise ValueError("the first call is on input set 0")
        got = entries[0].get("inputs")
        if got is None and samples.shared is not None:
            got = samples.shared[0]
        _inputs_unchanged(wl, cfg, wl.sets[0], wl.first_ref, got, "")
        return _judge(definition, wl, cfg, wl.first_ref, entries[0].get("outputs"), "", wl.sets[0])
    if phase == "inputs":
        if [e.get("index") for e in entries] != list(range(len(samples.cases))):
            raise ValueError("the inputs after the last sample, for every set")
        for entry, (pristine, expected) in zip(entries, samples.cases, strict=True):
            got = entry.get("inputs")
            if got is None and samples.shared is not None:  # the worker reads them itself
                got = samples.shared[entry["index"]]
            _inputs_unchanged(wl, cfg, pristine, expected, got, "in the timed calls: ")
        return None
    raise ValueError(f"unknown phase {phase!r}")

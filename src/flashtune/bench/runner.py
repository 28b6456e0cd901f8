"""Run every selected (definition, solution, workload) triple of a dataset and record Traces.

Work is grouped by (definition, workload), so the reference runs once per workload, and the
groups are spread over one worker per device (threads feed the workers from one queue).
Each Trace is appended to ``<out>/traces/<author>/<op_type>/<definition>.jsonl`` as soon as
it arrives (one whole, flushed line), so a run killed at any point keeps everything that
finished; `resume` skips triples already traced for the same solution content hash (which
covers the module files of importable entry points), environment (hardware and library
versions) and code (`code_key`: the git tree of the checkout, else the hash of flashtune's
sources).

Every trace's environment carries the code provenance (`platform.code_provenance`, taken in
the worker's snapshot) and the run's own start time, `run_started`, stamped here. Then this
process, the runner (never a worker, never a sandbox), signs it with this user's key
(`flashtune.data.signing.sign_trace`): apply trusts no other trace, and `--resume` counts
only traces whose signature verifies, so a line appended or edited by anything else (a
solution under benchmark, a hand) is measured again rather than believed. Traces are
written only inside `out`: a symbolic link under its traces/ or skipped/ that leads outside
stops the run before it starts (`UnsafePathError`), and each append refuses links on its
way (`flashtune.data.io.append_line`).

Workload caps: a run without --max-workloads or --all is a quick one. On a CPU only the
`CPU_WORKLOAD_CAP` smallest workloads of each definition run (by input bytes): CPU numbers are
a smoke test of the harness and the solutions, not a benchmark. On GPUs `GPU_WORKLOAD_CAP`
workloads of each definition run, spread over its sizes (the smallest and the largest), so
a first run answers sooner and still covers each definition's range;
`all_workloads` (--all) runs every workload, `max_workloads` the N smallest.

Where the tasks run is a `WorkerPool`: `LocalPool` (one worker per device of this host, the
default) or a Ray cluster's (`flashtune.bench.ray.RayPool`, one worker actor per GPU); the
selection, --resume and the trace files are this module's either way.
"""

from __future__ import annotations

import fnmatch
import math
import queue
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from flashtune.bench.build import solution_hash
from flashtune.bench.evaluate import BenchConfig, make_trace
from flashtune.bench.export import export_ran
from flashtune.bench.isolation import harden_harness
from flashtune.bench.progress import RunProgress
from flashtune.bench.worker import Task, Worker, WorkerError
from flashtune.data.dataset import Dataset
from flashtune.data.io import LoadError, UnsafePathError
from flashtune.data.models import Definition, EvaluationStatus, Solution, Trace, Workload
from flashtune.data.signing import (
    TRACES,
    SigningKeyError,
    sign_trace,
    trace_signature_problem,
    user_key,
)
from flashtune.data.synth import resolve_axes

__all__ = [
    "RunOptions",
    "RunResult",
    "WorkerPool",
    "LocalPool",
    "run_benchmark",
    "CPU_WORKLOAD_CAP",
    "GPU_WORKLOAD_CAP",
    "workload_cap",
    "environment_key",
    "code_key",
]

CPU_WORKLOAD_CAP = 2
# Two, the smallest and the largest: on an H100 the first piped quick run with three took
# 13 s to list its 255 triples and projected 29 minutes after 79 s (block-sparse first).
GPU_WORKLOAD_CAP = 2
_ENV_KEYS = ("hardware", "torch", "triton", "cuda", "flashtune")


@dataclass
class RunOptions:
    """What `flashtune run` was asked to do."""

    datasets: list[Path]
    out: Path
    definitions: str | None = None
    solutions: str | None = None
    op_type: str | None = None
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    timeout: float = 300.0
    config: BenchConfig = field(default_factory=BenchConfig)
    resume: bool = False
    baseline: str = "torch*"
    max_workloads: int | None = None
    all_workloads: bool = False  # --all: no quick cap
    autotune: bool = False
    autotune_cache: Path | None = None
    # Datasets read for their solutions only: they run on the definitions of `datasets` whose
    # contract they were written for (Dataset's solution_sources); their workloads do not run.
    solutions_from: list[Path] = field(default_factory=list)
    # Exactly these (definition, solution) pairs, when set: `flashtune serve` runs the
    # submissions of a batch, and no solution of the dataset beside them.
    only: frozenset[tuple[str, str]] | None = None
    # --sanitize: compute-sanitizer's memcheck on one call of every (solution, workload)
    # before it is timed (bench/sanitizer.py); one that does not pass is RUNTIME_ERROR.
    sanitize: bool = False


@dataclass
class RunResult:
    traces: list[Trace]
    out: Path
    seconds: float
    total: int
    resumed: int
    load_errors: list[LoadError]
    environment: dict[str, Any]
    workload_cap: int | None = None
    # How the capped workloads were picked: "the smallest" or "spread over sizes".
    workload_pick: str = "the smallest"
    # The pool's closing lines: a cluster's triples per node and its lost workers (empty
    # for a local run).
    pool_notes: list[str] = field(default_factory=list)
    # Traces that could not be written (kept in `traces`), and why: the run failed.
    write_errors: list[str] = field(default_factory=list)
    # Why the traces are not signed (no key: apply will not trust them), else None.
    unsigned: str | None = None


def environment_key(environment: dict[str, Any]) -> tuple[Any, ...]:
    """What must match for an earlier trace to count on --resume."""
    return tuple(environment.get(k) for k in _ENV_KEYS)


def code_key(environment: dict[str, Any]) -> tuple[Any, ...]:
    """Which code measured (the `code` of `platform.code_provenance`), for --resume: the git
    tree and dirty flag where there is a tree, else the hash of flashtune's sources.

    Uncommitted edits inside a dirty tree do not change it (a shared working tree is edited
    all the time); the kernels a solution runs are covered by `solution_hash` instead (the
    module files of importable entry points, all of flashtune's sources for its own). A
    trace without provenance matches no run that has it: code of unknown origin is
    measured again."""
    code = environment.get("code")
    if not isinstance(code, dict):
        return (None, None)
    if code.get("tree"):
        return (code["tree"], code.get("dirty"))
    return (None, code.get("files"))


def _input_bytes(definition: Definition, workload: Workload) -> int:
    from flashtune.data.synth import torch_dtype

    try:
        axes = resolve_axes(definition, workload)
    except ValueError:
        return 0
    total = 0
    for spec in definition.inputs.values():
        if spec.shape is None:
            continue
        n = math.prod(axes.get(a, 1) for a in spec.shape)
        total += n * torch_dtype(spec.dtype).itemsize
    return total


def workload_cap(opts: RunOptions, cpu_only: bool) -> tuple[int | None, bool]:
    """(workloads per definition, None: all; whether they spread over the sizes rather than
    being the smallest) for this run."""
    if opts.max_workloads is not None:
        return opts.max_workloads, False
    if opts.all_workloads:
        return None, False
    return (CPU_WORKLOAD_CAP, False) if cpu_only else (GPU_WORKLOAD_CAP, True)


def _spread(items: list[Workload], n: int) -> list[Workload]:
    """`n` of `items` (sorted by size) evenly spaced from the first to the last."""
    if len(items) <= n:
        return items
    if n == 1:
        return items[:1]
    picks = sorted({round(i * (len(items) - 1) / (n - 1)) for i in range(n)})
    return [items[i] for i in picks]


def _select(
    ds: Dataset, opts: RunOptions, cap: int | None, spread: bool = False
) -> list[tuple[Definition, Workload, list[Solution]]]:
    groups = []
    for definition in ds.find_definitions(opts.op_type, opts.definitions):
        solutions = ds.solutions_for(definition.name, opts.solutions)
        if opts.only is not None:
            solutions = [s for s in solutions if (definition.name, s.name) in opts.only]
        if not solutions:
            continue
        # Baselines first, so every other solution's speedup over them is known.
        solutions = sorted(
            solutions, key=lambda s: (not fnmatch.fnmatchcase(s.name, opts.baseline), s.name)
        )
        workloads = []
        for record in ds.workloads_for(definition.name):
            try:
                record.workload.check_against(definition)
            except ValueError:
                continue  # reported by `flashtune validate`
            workloads.append(record.workload)
        if cap is not None:
            workloads = sorted(workloads, key=lambda w: _input_bytes(definition, w))
            workloads = _spread(workloads, cap) if spread else workloads[:cap]
        for workload in workloads:
            groups.append((definition, workload, solutions))
    return groups


class WorkerPool(Protocol):
    """Where a run's tasks are evaluated: the devices of this host (`LocalPool`) or a Ray
    cluster's GPUs (flashtune.bench.ray). The runner selects the tasks and writes every
    trace; a pool only evaluates, and hands each trace to `record` as it arrives."""

    per_node: bool  # progress shows per-node counts (a pool that spans machines)

    def start(self, options: dict[str, Any]) -> list[dict[str, Any]]:
        """Start the workers (`options`: what `worker._worker_main` takes); -> each worker's
        environment (`platform.snapshot`)."""
        ...

    def cpu_only(self) -> bool:
        """Whether every worker runs on a CPU (the run then gets the CPU workload cap)."""
        ...

    def execute(
        self,
        tasks: list[Task],
        timeout: float,
        record: Callable[[Trace], None],
        display: RunProgress,
    ) -> None:
        """Evaluate every task; every solution of every task gets exactly one `record`ed trace."""
        ...

    def stop(self) -> None:
        """Stop the workers (they save their autotune caches)."""
        ...

    def abort(self) -> None:
        """The run is stopping (a signal, a failure): kill every worker and what it started,
        now, from the main thread while `execute` may still be running in others."""
        ...

    def notes(self) -> list[str]:
        """Closing lines about the workers (a cluster: triples per node, lost workers)."""
        ...


class LocalPool:
    """One worker process per device of this host, fed by one thread each from one queue."""

    per_node = False

    def __init__(self, devices: Sequence[str], autotune_cache: Path | None = None) -> None:
        self.devices = list(devices)
        self.autotune_cache = autotune_cache
        self.workers: list[Worker] = []

    def start(self, options: dict[str, Any]) -> list[dict[str, Any]]:
        for i, device in enumerate(self.devices):
            worker_options = dict(options)
            if options.get("autotune") and self.autotune_cache is not None:
                cache = self.autotune_cache
                if len(self.devices) > 1:  # one file per worker; `flashtune tune merge` them
                    cache = cache.with_name(f"{cache.stem}.{i}{cache.suffix}")
                worker_options["autotune_cache"] = str(cache)
            self.workers.append(Worker(device, worker_options))
        _start_all(self.workers)
        return [w.environment for w in self.workers]

    def cpu_only(self) -> bool:
        return all(d == "cpu" for d in self.devices)

    def execute(
        self,
        tasks: list[Task],
        timeout: float,
        record: Callable[[Trace], None],
        display: RunProgress,
    ) -> None:
        work: queue.Queue[Task] = queue.Queue()
        for task in tasks:
            work.put(task)
        fallback = self.workers[0].environment

        def failure(task: Task, sol: Solution, status: EvaluationStatus, why: str) -> Trace:
            env = next((w.environment for w in self.workers if w.environment), fallback)
            return make_trace(task.definition.name, task.workload, sol, status, env, why, why)

        def feed(worker: Worker) -> None:
            while not worker.aborted:
                try:
                    task = work.get_nowait()
                except queue.Empty:
                    return
                display.working_on(worker.device, task.definition.name)
                try:
                    worker.run(task, timeout, record, failure)
                except WorkerError as exc:  # the device cannot host a worker any more
                    for sol in task.solutions:
                        record(failure(task, sol, EvaluationStatus.RUNTIME_ERROR, str(exc)))

        feeders = [threading.Thread(target=feed, args=(w,), daemon=True) for w in self.workers]
        for thread in feeders:
            thread.start()
        _join(feeders)

    def stop(self) -> None:
        for w in self.workers:
            w.stop()

    def abort(self) -> None:
        for w in self.workers:
            w.abort()

    def notes(self) -> list[str]:
        return []


def run_benchmark(
    opts: RunOptions,
    console: Any = None,
    progress: bool = True,
    on_trace: Callable[[Trace], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    pool: WorkerPool | None = None,
) -> RunResult:
    """Evaluate the selected triples of `opts.datasets` on `pool` (default: `opts.devices` of
    this host); return the traces. `on_start` gets the number of triples to evaluate once it
    is known (before the first).

    Whatever interrupts it (a stop signal's exception in the caller's main thread, at any
    moment, a failure to start), the pool is aborted before the exception goes on: every
    worker process and what it started are killed, and no trace is recorded from then on
    (a triple cut short by the stop is not a result; `--resume` runs it again). What was
    recorded before stays in the trace files."""
    if pool is None:
        pool = LocalPool(opts.devices, opts.autotune_cache)
    stopped = threading.Event()
    try:
        return _run(opts, console, progress, on_trace, on_start, pool, stopped)
    except BaseException:
        stopped.set()  # first: the failures the kill below causes are not recorded
        pool.abort()
        raise


def _run(
    opts: RunOptions,
    console: Any,
    progress: bool,
    on_trace: Callable[[Trace], None] | None,
    on_start: Callable[[int], None] | None,
    pool: WorkerPool,
    stopped: threading.Event,
) -> RunResult:
    # The runner holds the trace files: no solution may ptrace it or write its memory.
    harden_harness()
    started = time.perf_counter()
    run_started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out = opts.out.expanduser().resolve()
    roots: list[Path] = []
    for root in [out, *(Path(d).expanduser().resolve() for d in opts.datasets)]:
        if root not in roots:
            roots.append(root)
    source = Dataset([Path(d) for d in opts.datasets], solution_sources=opts.solutions_from)
    sink = Dataset(roots)  # writes go to `out`; definitions come from the sources
    escaping = sink.links_leading_outside()
    if escaping:
        raise UnsafePathError(
            f"--out {out}: refusing to write traces through a symbolic link that leads "
            f"outside it: {'; '.join(escaping[:3])}"
            + (f" (and {len(escaping) - 3} more)" if len(escaping) > 3 else "")
        )
    # Inputs no one can predict: the run's seed comes from the operating system unless the
    # user names one (--seed) to reproduce a run; every trace records it.
    config = opts.config
    if config.seed is None:
        config = replace(config, seed=secrets.randbits(62))
    worker_options: dict[str, Any] = {
        "config": {k: v for k, v in vars(config).items()},
        "roots": [str(Path(d).expanduser().resolve()) for d in opts.datasets],
        "autotune": opts.autotune,
        "run_started": run_started,  # for platform.snapshot(device, run_started)
    }
    display = RunProgress(0, console, progress, per_node=pool.per_node)
    display.say(f"starting the workers; traces go to {out / 'traces'}")
    environments = pool.start(worker_options)
    environment = {**environments[0], "run_started": run_started}
    cap, spread = workload_cap(opts, pool.cpu_only())
    groups = _select(source, opts, cap, spread)

    # --resume: what is already traced for this content, environment and code
    done_keys: set[tuple[Any, ...]] = set()
    hashes: dict[int, str] = {}  # one solution_hash per solution object, not per workload

    def content(s: Solution) -> str:
        if id(s) not in hashes:
            hashes[id(s)] = solution_hash(s)
        return hashes[id(s)]

    # This user's key, read here in the runner (workers are spawned, never forked from it).
    key: bytes | None = None
    unsigned: str | None = None
    try:
        key = user_key(TRACES)
    except SigningKeyError as exc:
        unsigned = f"traces are not signed ({exc}): apply will not trust them"

    if opts.resume:
        # A triple traced on any GPU model of this pool counts (a cluster may hold several),
        # if its trace is this user's own (its signature verifies): a forged or edited line
        # must not make --resume skip a real measurement.
        keys = {(environment_key(env), code_key(env)) for env in environments}
        for name in sorted({g[0].name for g in groups}):
            for t in sink.traces_for(name):
                ev = t.evaluation
                if ev is None or t.solution is None:
                    continue
                if trace_signature_problem(t, key) is not None:
                    continue
                if (environment_key(ev.environment), code_key(ev.environment)) in keys:
                    done_keys.add(
                        (
                            t.definition,
                            t.solution,
                            t.workload.uuid,
                            getattr(ev, "solution_hash", None),
                        )
                    )
    tasks: list[Task] = []
    total = resumed = 0
    for definition, workload, solutions in groups:
        todo = [
            s
            for s in solutions
            if (definition.name, s.name, workload.uuid, content(s)) not in done_keys
        ]
        resumed += len(solutions) - len(todo)
        if todo:
            baselines = [s.name for s in todo if fnmatch.fnmatchcase(s.name, opts.baseline)]
            tasks.append(Task(definition, workload, todo, baselines))
            total += len(todo)
    load_errors = source.errors + sink.errors
    if on_start is not None:  # the CLI's "interrupted after N of M" needs M
        on_start(total)

    authors = {(d.name, s.name): s.author for d, _, sols in groups for s in sols}
    traces: list[Trace] = []
    write_errors: list[str] = []
    lock = threading.Lock()

    def record(trace: Trace) -> None:
        if stopped.is_set():
            return
        if trace.evaluation is not None:  # the run's start, whatever the worker put there
            trace.evaluation.environment = {
                **trace.evaluation.environment,
                "run_started": run_started,
                "input_seed": config.seed,
            }
        if key is not None:  # last: the signature covers everything above
            sign_trace(trace, key)
        with lock:
            try:
                sink.append_trace(
                    trace, author=authors.get((trace.definition, trace.solution or ""), "unknown")
                )
            except OSError as exc:  # a link swapped in since the check, a full disk
                write_errors.append(f"{trace.definition} {trace.solution}: {exc}")
            traces.append(trace)
        display.finished(trace)
        if on_trace is not None:
            on_trace(trace)

    per_definition: dict[str, int] = {}
    for task in tasks:
        name = task.definition.name
        per_definition[name] = per_definition.get(name, 0) + len(task.solutions)
    display.expect(total, per_definition)
    if opts.sanitize:  # before any timing: the gate's runs must not share the device
        tasks = _sanitize_gate(tasks, opts, environment, record)
    with display:
        pool.execute(tasks, opts.timeout, record, display)
    pool.stop()
    # --out as a whole dataset (definitions, solutions, workloads beside the traces), as
    # FlashInfer-Bench reads one: bench/export.py.
    write_errors += export_ran(source, out, traces)
    return RunResult(
        traces=traces,
        out=out,
        seconds=time.perf_counter() - started,
        total=total,
        resumed=resumed,
        load_errors=load_errors,
        environment=environment,
        workload_cap=cap,
        workload_pick="spread over sizes" if spread else "the smallest",
        pool_notes=pool.notes(),
        write_errors=write_errors,
        unsigned=unsigned,
    )


def _sanitize_gate(
    tasks: list[Task],
    opts: RunOptions,
    environment: dict[str, Any],
    record: Callable[[Trace], None],
) -> list[Task]:
    """Run memcheck on one sandboxed call of each task's solutions, on the run's first
    device; record a solution that does not pass ("fail", or "error": a gate never passes
    what it could not check) as RUNTIME_ERROR with the findings, and drop it from the task."""
    from flashtune.bench.sanitizer import find_compute_sanitizer, sanitize, unavailable_reason

    device = opts.devices[0]
    why = unavailable_reason(device, find_compute_sanitizer())
    if why is not None:  # the CLI checks first; a library caller gets the same refusal
        raise ValueError(f"--sanitize: compute-sanitizer is not available: {why}")
    roots = [str(Path(d).expanduser().resolve()) for d in opts.datasets]
    kept: list[Task] = []
    for task in tasks:
        clean = []
        for sol in task.solutions:
            result = sanitize(
                task.definition, task.workload, sol, device, roots=roots, tools=("memcheck",)
            )
            if result.verdict == "pass":
                clean.append(sol)
                continue
            reason = result.reason()
            record(
                make_trace(
                    task.definition.name,
                    task.workload,
                    sol,
                    EvaluationStatus.RUNTIME_ERROR,
                    environment,
                    reason,
                    reason,
                )
            )
        if clean:
            kept.append(replace(task, solutions=clean))
    return kept


def _start_all(workers: Sequence[Worker]) -> None:
    errors: list[BaseException] = []

    def start(w: Worker) -> None:
        try:
            w.start()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    # Daemons: a stop signal must not wait for a start to end (the abort kills the worker).
    threads = [threading.Thread(target=start, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    _join(threads)
    if errors:
        for w in workers:
            w.kill()
        raise errors[0]


def _join(threads: Sequence[threading.Thread]) -> None:
    """Join, waking twice a second: a signal that the kernel hands to another thread of
    this process runs its handler (a stop) only when the main thread wakes."""
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)

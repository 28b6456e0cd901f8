"""Submissions as tasks: a bounded queue and the thread that evaluates them.

Every submission is evaluated by `flashtune run`'s own runner (`bench.runner.run_benchmark`):
the same selection of workloads, the same worker per device, the same sandbox per solution,
the same checks and timing, the same signed traces appended to the service's `out` folder.
Nothing here decides a verdict; this module only says which solutions run together.

Why batches: starting a run costs seconds (a worker per device, its sandbox probe: 6-13 s
on this project's loaded two-core CPU machine), its triples cost milliseconds each for a
cheap op. The evaluator thread therefore takes every queued submission (up to `batch_size`)
into one run; each run draws its own input seed from the operating system, as `flashtune
run` does. Two submissions with the same (definition, solution name) never share a run (the
second waits for the next), so every trace belongs to exactly one task.

One run at a time: runs share the devices, and timing on a device that another run uses is
not timing. `device_lock` is held while a run goes; the agent tools (compute-sanitizer,
Nsight Compute) take it too.
"""

from __future__ import annotations

import collections
import shutil
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from flashtune.bench.config import BenchConfig
from flashtune.bench.isolation import harden_harness
from flashtune.bench.runner import LocalPool, RunOptions, RunResult, WorkerPool, run_benchmark
from flashtune.data.dataset import Dataset
from flashtune.data.models import Definition, EvaluationStatus, Solution, Trace

__all__ = [
    "EvaluationSettings",
    "Evaluator",
    "QueueFull",
    "ServeTask",
    "SubmissionError",
    "TaskState",
    "verdict_of",
]


class TaskState(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"  # evaluated: its traces say the verdict
    FAILED = "failed"  # the service could not evaluate it (no trace): `error` says why
    CANCELLED = "cancelled"


TERMINAL = frozenset({TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED})


class SubmissionError(ValueError):
    """A submission the service refuses (HTTP 404/409/422): `status` is the HTTP code."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class QueueFull(SubmissionError):
    """The queue holds `max_queue` submissions already (HTTP 429)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=429)


def verdict_of(traces: Sequence[Trace]) -> str | None:
    """One word for a gate: "PASSED" when every trace passed, else the status of the first
    trace that did not (None: no trace, nothing was evaluated)."""
    if not traces:
        return None
    for trace in traces:
        status = trace.evaluation.status if trace.evaluation else None
        if status != EvaluationStatus.PASSED:
            return status.value if status is not None else "UNKNOWN"
    return EvaluationStatus.PASSED.value


@dataclass
class ServeTask:
    """One submission and what became of it."""

    id: str
    solution: Solution
    state: TaskState = TaskState.QUEUED
    submitted: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    traces: list[Trace] = field(default_factory=list)
    error: str | None = None
    cancel_requested: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.solution.definition, self.solution.name)

    @property
    def verdict(self) -> str | None:
        return verdict_of(self.traces) if self.state == TaskState.DONE else None

    def summary(self, with_traces: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "task_id": self.id,
            "state": self.state.value,
            "definition": self.solution.definition,
            "solution": self.solution.name,
            "verdict": self.verdict,
            "submitted": self.submitted,
            "started": self.started,
            "finished": self.finished,
            "error": self.error,
        }
        if with_traces:
            out["traces"] = [t.model_dump(mode="json", exclude_none=True) for t in self.traces]
        return out


@dataclass(frozen=True)
class EvaluationSettings:
    """How submissions are evaluated: `flashtune run`'s options, fixed for the service."""

    datasets: list[Path]
    out: Path
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    timeout: float = 300.0
    config: BenchConfig = field(default_factory=BenchConfig)
    max_workloads: int | None = None
    all_workloads: bool = False
    # A Ray cluster's address ('auto', 'host:port', 'local'; docs/ray.md): every run goes to
    # its workers, one a GPU (`devices` is unused), as `flashtune run --ray` runs.
    ray: str | None = None


class Evaluator:
    """The queue, the tasks and the evaluating thread.

    `max_queue`: queued (not yet running) submissions beyond which `submit` raises QueueFull;
    `batch_size`: submissions per run; `keep_finished`: finished tasks kept for their
    owners to read (the oldest go first); `run`: the runner (tests pass a wrapper)."""

    def __init__(
        self,
        settings: EvaluationSettings,
        max_queue: int = 64,
        batch_size: int = 64,
        keep_finished: int = 1000,
        run: Callable[..., RunResult] = run_benchmark,
    ) -> None:
        if max_queue < 1 or batch_size < 1:
            raise ValueError("max_queue and batch_size must be at least 1")
        self.settings = settings
        self.max_queue = max_queue
        self.batch_size = batch_size
        self.keep_finished = keep_finished
        self._run = run
        self.dataset = Dataset(settings.datasets)
        self.tasks: dict[str, ServeTask] = {}
        self._queue: collections.deque[ServeTask] = collections.deque()
        self._finished: collections.deque[str] = collections.deque()
        self._cond = threading.Condition()
        self.device_lock = threading.Lock()
        self._running: list[ServeTask] = []
        self._pool: WorkerPool | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.batches = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        # The service holds the token and the queue: like `flashtune run`'s runner, no other
        # process of this user may ptrace it or read its memory.
        harden_harness()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="flashtune-serve-evaluator", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking work; abort a run in progress (its workers and sandboxes are killed)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            pool = self._pool
        if pool is not None:
            pool.abort()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ requests
    def definitions(self) -> dict[str, Definition]:
        return self.dataset.definitions

    def submit(self, solution: Solution) -> ServeTask:
        """Queue `solution`; -> its task. Raises SubmissionError (unknown definition, a name
        the dataset's own solutions use) or QueueFull."""
        if solution.definition not in self.dataset.definitions:
            raise SubmissionError(
                f"definition {solution.definition!r} is not in the service's dataset "
                "(GET /definitions lists them)",
                status=404,
            )
        if any(s.name == solution.name for s in self.dataset.solutions_for(solution.definition)):
            raise SubmissionError(
                f"solution name {solution.name!r} is taken by the dataset's own solution of "
                f"{solution.definition}; name yours differently",
                status=409,
            )
        task = ServeTask(id=uuid.uuid4().hex, solution=solution)
        with self._cond:
            if self._stopping:
                raise SubmissionError("the service is stopping", status=503)
            if len(self._queue) >= self.max_queue:
                raise QueueFull(
                    f"the queue is full ({self.max_queue} submissions waiting); retry later"
                )
            self.tasks[task.id] = task
            self._queue.append(task)
            self._cond.notify_all()
        return task

    def tasks_in(self, state: TaskState | None = None) -> list[ServeTask]:
        """The tasks kept, oldest first (`state`: only those in it)."""
        with self._cond:
            return [t for t in self.tasks.values() if state is None or t.state == state]

    def get(self, task_id: str) -> ServeTask | None:
        with self._cond:
            return self.tasks.get(task_id)

    def wait(self, task_id: str, seconds: float) -> ServeTask | None:
        """The task once it is finished, or after `seconds` whatever its state."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while True:
                task = self.tasks.get(task_id)
                remaining = deadline - time.monotonic()
                if task is None or task.state in TERMINAL or remaining <= 0:
                    return task
                self._cond.wait(remaining)

    def cancel(self, task_id: str) -> ServeTask | None:
        """Cancel a task: a queued one leaves the queue at once; a running one is marked and
        its traces are dropped from its answer when its run ends, and when every task of
        the running batch is cancelled the run is aborted (its workers killed: the run's
        `out` then holds RUNTIME_ERROR traces saying the run stopped). A finished task stays
        as it is."""
        abort: WorkerPool | None = None
        with self._cond:
            task = self.tasks.get(task_id)
            if task is None or task.state in TERMINAL:
                return task
            task.cancel_requested = True
            if task.state == TaskState.QUEUED:
                self._queue.remove(task)
                self._finish(task, TaskState.CANCELLED)
            elif self._running and all(t.cancel_requested for t in self._running):
                abort = self._pool
        if abort is not None:
            abort.abort()
        return task

    def counts(self) -> dict[str, int]:
        with self._cond:
            states = collections.Counter(t.state.value for t in self.tasks.values())
            return {s.value: states.get(s.value, 0) for s in TaskState}

    # ------------------------------------------------------------------ the evaluating thread
    def _finish(self, task: ServeTask, state: TaskState, error: str | None = None) -> None:
        """(under the lock) a terminal state; the oldest finished tasks are forgotten."""
        task.state = state
        task.error = error
        task.finished = time.time()
        self._finished.append(task.id)
        while len(self._finished) > self.keep_finished:
            self.tasks.pop(self._finished.popleft(), None)
        self._cond.notify_all()

    def _next_batch(self) -> list[ServeTask]:
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return []
            batch: list[ServeTask] = []
            keys: set[tuple[str, str]] = set()
            for task in list(self._queue):
                if len(batch) >= self.batch_size:
                    break
                if task.key in keys:
                    continue  # same definition and name: the next run
                keys.add(task.key)
                batch.append(task)
            for task in batch:
                self._queue.remove(task)
                task.state = TaskState.RUNNING
                task.started = time.time()
            self._running = batch
            self._cond.notify_all()
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if not batch:
                return
            try:
                with self.device_lock:
                    traces, error = self._evaluate(batch)
            except BaseException:  # noqa: BLE001 - the service must outlive any run
                traces, error = [], traceback.format_exc(limit=5)
            with self._cond:
                by_key: dict[tuple[str, str], list[Trace]] = {}
                for trace in traces:
                    by_key.setdefault((trace.definition, trace.solution or ""), []).append(trace)
                for task in batch:
                    task.traces = by_key.get(task.key, [])
                    if task.cancel_requested:
                        task.traces = []
                        self._finish(task, TaskState.CANCELLED)
                    elif error is not None:
                        self._finish(task, TaskState.FAILED, error)
                    elif not task.traces:
                        self._finish(
                            task,
                            TaskState.FAILED,
                            "no workload of its definition could run (none is valid for it)",
                        )
                    else:
                        self._finish(task, TaskState.DONE)
                self._running = []
                self._pool = None
                self.batches += 1

    def _evaluate(self, batch: list[ServeTask]) -> tuple[list[Trace], str | None]:
        """One run of `flashtune run`'s runner over the batch's solutions."""
        s = self.settings
        # The batch's solutions as a dataset of their own, attached to the service's dataset
        # the way `flashtune run --solutions-from` attaches one (the definition is copied
        # beside them: a solution source is matched by its definitions' contract).
        folder = Path(tempfile.mkdtemp(prefix="flashtune-serve-batch-"))
        try:
            source = Dataset(folder)
            for name in sorted({t.solution.definition for t in batch}):
                source.add_definition(self.dataset.definition(name))
            for task in batch:
                source.add_solution(task.solution)
            options = RunOptions(
                datasets=list(s.datasets),
                out=s.out,
                devices=list(s.devices),
                timeout=s.timeout,
                config=s.config,
                max_workloads=s.max_workloads,
                all_workloads=s.all_workloads,
                solutions_from=[folder],
                only=frozenset(t.key for t in batch),
            )
            pool: WorkerPool
            if s.ray is None:
                pool = LocalPool(options.devices)
            else:
                from flashtune.bench.ray import RayPool

                pool = RayPool(s.ray)
            with self._cond:
                if all(t.cancel_requested for t in batch):
                    return [], None
                self._pool = pool
            result = self._run(options, progress=False, pool=pool)
            problems = [str(e) for e in result.load_errors if str(folder) in str(e)]
            if result.write_errors:  # the traces exist but not on disk: say so, keep them
                problems += result.write_errors
            return result.traces, ("; ".join(problems) if problems and not result.traces else None)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

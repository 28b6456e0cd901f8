"""`RayPool`: the runner's tasks evaluated by one long-lived worker actor per GPU of a Ray
cluster (one per CPU on a cluster without GPUs).

Each actor holds the local runner's `Worker` on its device: the same worker process,
sandboxes, timeouts, statuses and checks as `flashtune run` on one host. A task (one
workload of one definition with its solutions) goes to one actor, which computes the
reference once and streams each solution's trace back as soon as it has it (a Ray streaming
generator); the driver records it (the runner is the only writer of trace files). A free
actor takes the next task of the definition it ran last when there is one, so a definition's
references and built solutions stay warm on the node that has them.

A lost actor (killed, its node gone): what it streamed is kept; the task's remaining
solutions are re-queued once, and recorded as RUNTIME_ERROR with the reason when they are
lost a second time. The lost slot gets one replacement actor, wherever the cluster has room.
"""

from __future__ import annotations

import queue
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from flashtune.bench.evaluate import make_trace
from flashtune.bench.progress import RunProgress
from flashtune.bench.ray.connect import connected, slot_placement, slot_plan
from flashtune.bench.worker import Task, Worker, WorkerError, faster_baseline
from flashtune.data.io import atomic_write_text
from flashtune.data.models import EvaluationStatus, Solution, Trace

__all__ = ["RayPool", "SlotActor", "STARTUP_TIMEOUT_S"]

# Ray starts an actor's process, which imports torch and starts its worker process: tens of
# seconds on a cold node. A replacement that is not up by then is given up.
STARTUP_TIMEOUT_S = 300.0
_STOP_TIMEOUT_S = 60.0


class SlotActor:
    """One worker slot of the cluster (run as a Ray actor): the local runner's `Worker` on
    the actor's GPU, or on the CPU of a slot without one."""

    def __init__(self, options: dict[str, Any], autotune_cache_text: str | None) -> None:
        import ray

        options = dict(options)
        self.cache_path: Path | None = None
        if options.get("autotune") and autotune_cache_text is not None:
            # The driver's cache file is on the driver's disk: its text travels, and this
            # node's copy comes back at `stop`.
            folder = Path(tempfile.mkdtemp(prefix="flashtune-autotune-"))
            self.cache_path = folder / "autotune.json"
            if autotune_cache_text:
                self.cache_path.write_text(autotune_cache_text)
            options["autotune_cache"] = str(self.cache_path)
        self.placement = slot_placement(ray)
        # Ray makes the actor's one GPU the only visible one.
        device = "cuda:0" if self.placement["gpu_index"] is not None else "cpu"
        self.worker = Worker(device, options)
        self.worker.start()
        self.env = {**self.worker.environment, **self.placement}

    def environment(self) -> dict[str, Any]:
        return self.env

    def run(self, task: Task, timeout: float) -> Iterator[str]:
        """Evaluate `task` as a local run does; yield each solution's trace (JSON) as soon as
        the worker has it. Called with Ray's streaming generator protocol."""
        out: queue.Queue[Trace | WorkerError | None] = queue.Queue()

        def evaluate() -> None:
            try:
                self.worker.run(task, timeout, out.put, self.failure)
            except WorkerError as exc:  # the device cannot host a worker any more
                out.put(exc)
            finally:
                out.put(None)

        threading.Thread(target=evaluate, daemon=True).start()
        traced: set[str] = set()
        while (item := out.get()) is not None:
            if isinstance(item, WorkerError):
                for sol in task.solutions:
                    if sol.name not in traced:
                        trace = self.failure(task, sol, EvaluationStatus.RUNTIME_ERROR, str(item))
                        yield trace.to_json()
                continue
            if item.evaluation is not None:  # where it ran, beside the worker's snapshot
                item.evaluation.environment = {**item.evaluation.environment, **self.placement}
            traced.add(item.solution or "")
            yield item.to_json()

    def failure(self, task: Task, sol: Solution, status: EvaluationStatus, why: str) -> Trace:
        return make_trace(task.definition.name, task.workload, sol, status, self.env, why, why)

    def stop(self) -> str | None:
        """Stop the worker (it saves its autotune cache); -> that cache's text, if any."""
        self.worker.stop()
        if self.cache_path is not None and self.cache_path.exists():
            return self.cache_path.read_text()
        return None


@dataclass
class _Slot:
    index: int
    actor: Any
    environment: dict[str, Any]
    last_definition: str | None = None
    replaced: bool = False

    @property
    def host(self) -> str:
        return str(self.environment.get("host", "?"))

    @property
    def label(self) -> str:
        gpu = self.environment.get("gpu_index")
        return f"{self.host}/{'gpu' + str(gpu) if gpu is not None else f'cpu{self.index}'}"


@dataclass
class _Work:
    task: Task
    attempt: int = 0  # 1: re-queued after its actor was lost
    hardware: str | None = None  # where a carried baseline latency was measured


class _Board:
    """The tasks still to run, shared by the slots' feeder threads. A slot waits while
    another still has a task in flight (it may come back re-queued); `take` returns None
    once nothing is queued or in flight."""

    def __init__(self, tasks: list[Task]) -> None:
        self.items: deque[_Work] = deque(_Work(t) for t in tasks)
        self.in_flight = 0
        self.cond = threading.Condition()

    def take(self, prefer: str | None) -> _Work | None:
        with self.cond:
            while True:
                if self.items:
                    index = next(
                        (i for i, w in enumerate(self.items) if w.task.definition.name == prefer),
                        0,
                    )
                    work = self.items[index]
                    del self.items[index]
                    self.in_flight += 1
                    return work
                if self.in_flight == 0:
                    return None
                self.cond.wait()

    def put_back(self, work: _Work) -> None:
        with self.cond:
            self.items.append(work)
            self.cond.notify_all()

    def finished(self) -> None:
        with self.cond:
            self.in_flight -= 1
            self.cond.notify_all()

    def idle(self) -> bool:
        with self.cond:
            return not self.items and self.in_flight == 0

    def drain(self) -> list[_Work]:
        with self.cond:
            left = list(self.items)
            self.items.clear()
            return left


class RayPool:
    """The runner's `WorkerPool` on a Ray cluster (`address`: see `connect.connected`).
    `slots` caps the number of worker actors (default: every GPU, else every CPU)."""

    per_node = True

    def __init__(
        self, address: str, autotune_cache: Path | None = None, slots: int | None = None
    ) -> None:
        self.address = address
        self.autotune_cache = autotune_cache
        self.slot_limit = slots
        self.slots: list[_Slot] = []
        self.on_gpu = False
        self._session: Any = None
        self._ray: ModuleType | None = None
        self._remote: Any = None
        self._options: dict[str, Any] = {}
        self._notes: list[str] = []
        self._done: dict[str, int] = {}  # host -> triples the workers there streamed back
        self._failed: dict[str, int] = {}
        self._lock = threading.Lock()
        self._aborted = False

    # lifecycle -----------------------------------------------------------------
    def start(self, options: dict[str, Any]) -> list[dict[str, Any]]:
        self._session = connected(self.address)
        ray = self._ray = self._session.__enter__()
        try:
            plan = slot_plan(ray, self.slot_limit)
            self.on_gpu = plan.on_gpu
            self._remote = ray.remote(SlotActor).options(**plan.actor_options())
            self._options = options
            actors = [self._spawn(i) for i in range(plan.count)]
            try:
                envs = ray.get([a.environment.remote() for a in actors], timeout=STARTUP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - any start failure ends the run
                for actor in actors:
                    ray.kill(actor)
                raise WorkerError(f"worker actors did not start on the cluster: {exc}") from None
        except BaseException:
            self._session.__exit__(None, None, None)
            raise
        self.slots = [_Slot(i, a, env) for i, (a, env) in enumerate(zip(actors, envs, strict=True))]
        return envs

    def _spawn(self, index: int) -> Any:
        return self._remote.remote(self._options, self._cache_text(index))

    def _cache_file(self, index: int) -> Path | None:
        """The driver-side autotune cache of slot `index`: one file per slot, as a local run
        with several devices writes (merge them with `flashtune tune merge`)."""
        cache = self.autotune_cache
        if cache is None or not self._options.get("autotune"):
            return None
        return cache.with_name(f"{cache.stem}.{index}{cache.suffix}")

    def _cache_text(self, index: int) -> str | None:
        path = self._cache_file(index)
        if path is None:
            return None
        return path.read_text() if path.exists() else ""

    def cpu_only(self) -> bool:
        return not self.on_gpu

    def stop(self) -> None:
        ray = self._ray
        if ray is None:
            return
        stops = [(s, s.actor.stop.remote()) for s in self.slots]
        for slot, ref in stops:
            try:
                text = ray.get(ref, timeout=_STOP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - a lost actor has nothing to save
                self._note(f"{slot.label}: worker did not stop cleanly: {_first_line(exc)}")
                text = None
            path = self._cache_file(slot.index)
            if text and path is not None:
                atomic_write_text(path, text)
            ray.kill(slot.actor)
        self.slots = []
        if self._session is not None:
            self._session.__exit__(None, None, None)
            self._session = None
        self._ray = None

    def abort(self) -> None:
        """Kill the worker actors now, without waiting (each actor's worker then kills its
        sandboxes: its lifeline to the actor's process closes), and replace none of them."""
        self._aborted = True
        ray = self._ray
        if ray is None:
            return
        for slot in self.slots:
            try:
                ray.kill(slot.actor)
            except Exception:  # noqa: BLE001 - a lost actor is what abort wants
                pass

    def notes(self) -> list[str]:
        """Triples and failures per node, then what happened to the workers."""
        with self._lock:
            per_node = [
                f"{host}: {done} triple(s), {self._failed.get(host, 0)} not passed"
                for host, done in sorted(self._done.items())
            ]
            return per_node + self._notes

    def _count(self, host: str, trace: Trace) -> None:
        status = trace.evaluation.status if trace.evaluation else None
        with self._lock:
            self._done[host] = self._done.get(host, 0) + 1
            if status not in (EvaluationStatus.PASSED, EvaluationStatus.SKIPPED):
                self._failed[host] = self._failed.get(host, 0) + 1

    def _note(self, text: str) -> None:
        with self._lock:
            self._notes.append(text)

    # running -------------------------------------------------------------------
    def execute(
        self,
        tasks: list[Task],
        timeout: float,
        record: Callable[[Trace], None],
        display: RunProgress,
    ) -> None:
        board = _Board(tasks)
        feeders = [
            threading.Thread(
                target=self._feed, args=(slot, board, timeout, record, display), daemon=True
            )
            for slot in self.slots
        ]
        for thread in feeders:
            thread.start()
        for thread in feeders:
            thread.join()
        left = board.drain()
        if left:
            why = "no worker left on the cluster to run it (see the lost workers above)"
            self._note(f"{sum(len(w.task.solutions) for w in left)} triple(s): {why}")
            env = self.slots[0].environment
            for work in left:
                for sol in work.task.solutions:
                    record(_failure(work.task, sol, env, why))

    def _feed(
        self,
        slot: _Slot,
        board: _Board,
        timeout: float,
        record: Callable[[Trace], None],
        display: RunProgress,
    ) -> None:
        assert self._ray is not None
        ray = self._ray
        while True:
            work = board.take(slot.last_definition)
            if work is None:
                return
            task = work.task
            if work.hardware not in (None, slot.environment.get("hardware")):
                # The carried baseline latency was measured on another GPU model.
                task.baseline_latency = None
            slot.last_definition = task.definition.name
            display.working_on(slot.label, task.definition.name)
            traced: set[str] = set()
            baseline = task.baseline_latency
            try:
                for ref in slot.actor.run.remote(task, timeout):
                    trace = Trace.model_validate_json(ray.get(ref))
                    record(trace)
                    self._count(slot.host, trace)
                    traced.add(trace.solution or "")
                    baseline = faster_baseline(baseline, trace, task.baselines)
            except (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError) as exc:
                # the actor (or its node) is gone
                pending = [s for s in task.solutions if s.name not in traced]
                self._lost(slot, work, pending, baseline, _first_line(exc), board, record)
                display.worker_lost(slot.host)
                board.finished()
                if not self._replace(slot, board):
                    return
                continue
            except ray.exceptions.RayError as exc:  # the actor raised: this task's failure
                why = f"worker actor on {slot.label}: {_first_line(exc)}"
                for sol in task.solutions:
                    if sol.name not in traced:
                        record(_failure(task, sol, slot.environment, why))
            board.finished()

    def _lost(
        self,
        slot: _Slot,
        work: _Work,
        pending: list[Solution],
        baseline: tuple[str, float] | None,
        reason: str,
        board: _Board,
        record: Callable[[Trace], None],
    ) -> None:
        """Re-queue the lost actor's in-flight solutions once; record them the second time."""
        task = work.task
        what = f"{len(pending)} in-flight triple(s) of {task.definition.name}"
        if not pending:
            self._note(f"{slot.label}: worker lost ({reason}); nothing was in flight")
        elif work.attempt == 0:
            self._note(f"{slot.label}: worker lost ({reason}); {what} re-queued")
            again = Task(task.definition, task.workload, pending, task.baselines, baseline)
            board.put_back(_Work(again, 1, slot.environment.get("hardware")))
        else:
            self._note(f"{slot.label}: worker lost ({reason}); {what} lost twice: RUNTIME_ERROR")
            why = f"worker lost twice (last on {slot.label}): {reason}"
            for sol in pending:
                record(_failure(task, sol, slot.environment, why))

    def _replace(self, slot: _Slot, board: _Board) -> bool:
        """Start one replacement actor for a lost slot; False when it is not worth waiting
        for (the work is done, the slot was replaced before, it does not start in time)."""
        assert self._ray is not None
        ray = self._ray
        ray.kill(slot.actor)  # unavailable is not always dead: make sure it holds nothing
        if slot.replaced or self._aborted:
            return False
        slot.replaced = True
        actor = self._spawn(slot.index)
        ready = actor.environment.remote()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and not board.idle():
            done, _ = ray.wait([ready], timeout=1.0)
            if not done:
                continue
            try:
                slot.environment = ray.get(ready)
            except ray.exceptions.RayError as exc:
                self._note(f"{slot.label}: replacement worker failed: {_first_line(exc)}")
                break
            slot.actor = actor
            slot.last_definition = None
            self._note(f"{slot.label}: replacement worker started")
            return True
        ray.kill(actor)
        return False


def _failure(task: Task, sol: Solution, environment: dict[str, Any], why: str) -> Trace:
    status = EvaluationStatus.RUNTIME_ERROR
    return make_trace(task.definition.name, task.workload, sol, status, environment, why, why)


def _first_line(exc: BaseException) -> str:
    """A Ray error in one line: its first line, and its last where Ray says the cause there
    ("The actor is dead because it was killed by `ray.kill`.")."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if len(lines) > 1 and ":" not in lines[-1].split(" ")[0]:
        return f"{lines[0]} {lines[-1]}"
    return lines[0]

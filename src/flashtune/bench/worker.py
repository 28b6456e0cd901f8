"""One long-lived worker process per device, and the parent's handle on it.

The worker is spawned (never forked: CUDA does not survive a fork), imports torch once and
keeps built solutions and compiled references across tasks, which keeps the harness cheap
(100 triples of a trivial op in seconds). A task is one (definition, workload) with its
solutions; the worker streams ("start", name) and ("trace", json) messages back.

Each solution runs in a sandbox process of its own (bench/sandbox.py) that the worker
starts, times out and kills; the worker itself only runs references and checks. The parent
attributes failures of the worker to the solution that was running:
- the process dies (segfault, abort, illegal memory access): RUNTIME_ERROR, new worker;
- no message within `timeout` seconds of a solution's start: TIMEOUT, the worker is
  killed and replaced;
- between tasks a health check (a ping that runs a tiny op and a device synchronize) must
  answer, else the worker is replaced.
The remaining solutions of an interrupted task go to the new worker.

Nothing of a worker outlives its run, however the runner ends: the worker leads a process
group of its own (a terminal's Ctrl-C and hangup, and `timeout`'s signal to the group, go to
the runner alone, which ends the workers itself: `Worker.abort`); on SIGTERM, SIGINT or
SIGHUP, and when the runner dies (SIGKILL included: its end of the worker's lifeline pipe
closes), the worker kills every process below it, its sandboxes and what they started, and
exits.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flashtune.data.models import Definition, EvaluationStatus, Solution, Trace, Workload

__all__ = [
    "Task",
    "Worker",
    "WorkerError",
    "default_devices",
    "faster_baseline",
    "parse_devices",
]

_STARTUP_TIMEOUT_S = 120.0
_PING_TIMEOUT_S = 30.0
_SANDBOX_GRACE_S = 60.0


class WorkerError(RuntimeError):
    """The worker could not be started or stopped answering."""


@dataclass
class Task:
    """One workload of one definition, with the solutions still to evaluate."""

    definition: Definition
    workload: Workload
    solutions: list[Solution]
    baselines: list[str] = field(default_factory=list)
    baseline_latency: tuple[str, float] | None = None

    def payload(self) -> dict[str, Any]:
        return {
            "definition": self.definition.to_json(),
            "workload": self.workload.to_json(),
            "solutions": [s.to_json() for s in self.solutions],
            "baselines": list(self.baselines),
            "baseline_latency": self.baseline_latency,
        }


def faster_baseline(
    baseline: tuple[str, float] | None, trace: Trace, baselines: list[str]
) -> tuple[str, float] | None:
    """The (name, latency) the remaining solutions of a task compare to, after `trace`: the
    fastest baseline traced so far (a task resumed elsewhere carries it along)."""
    perf = trace.evaluation.performance if trace.evaluation else None
    if trace.solution in baselines and perf is not None and trace.solution is not None:
        if baseline is None or perf.latency_ms < baseline[1]:
            return (trace.solution, perf.latency_ms)
    return baseline


# --------------------------------------------------------------------------- worker side


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _stay_with_runner(lifeline: Any) -> None:
    """End this worker and everything below it when the run ends, whatever ends it (the
    module's docstring). A thread does it, not a signal handler: the main thread may be in
    a long call (a reference on a big CPU workload) when the signal comes."""
    import contextlib

    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    for signum in _STOP_SIGNALS:
        # A handler, so the signal does not kill this process before the thread below has
        # killed the sandboxes (their children would be left to init); the C-level handler
        # writes the signal's number to the wakeup fd whatever the main thread is doing.
        signal.signal(signum, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    # Blocked in the fork server this worker comes from (bench/sandbox.py); pending ones
    # arrive now, to the handlers above.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    watcher = threading.Thread(
        target=_end_with_run, args=(wake_r, lifeline), name="flashtune-stop-watch", daemon=True
    )
    watcher.start()


def _end_with_run(wake_r: int, lifeline: Any) -> None:
    from flashtune.bench import process_tree

    exit_code = 1  # the runner is gone: no one reads it
    watched: list[Any] = [wake_r] if lifeline is None else [wake_r, lifeline]
    while exit_code == 1:
        ready = mpc.wait(watched)
        if lifeline is not None and lifeline in ready:
            break
        stop = [n for n in os.read(wake_r, 64) if n in _STOP_SIGNALS]
        if stop:
            exit_code = 128 + stop[0]
    process_tree.kill_descendants(os.getpid())
    os._exit(exit_code)


def _worker_main(conn: Any, device_str: str, options: dict[str, Any], lifeline: Any = None) -> None:
    """Entry point of the worker process. `lifeline`: the reading end of a pipe whose
    writing end only the runner holds (it ends the worker when it closes)."""
    import contextlib

    _stay_with_runner(lifeline)
    if "environ" in options:  # the runner's environment, not the fork server's
        os.environ.clear()
        os.environ.update(options["environ"])
    # Seen on an H100: references of 8k-token prefill allocate 2-8 GB temporaries of varying
    # sizes; with fixed segments the worker's cache fragmented into 53 GB reserved but
    # unusable, and the next reference (and the sandboxes) ran out of memory. Expandable
    # segments remap freed memory instead. Set before CUDA starts (the sandboxes inherit it);
    # a user's own setting wins.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

    from flashtune.bench import isolation, process_tree

    # Out of the solutions' reach: not dumpable (no ptrace, no /proc/<pid>/mem), and the
    # adopter of whatever a dead sandbox left running (killed as the sandboxes close).
    isolation.harden_harness()
    process_tree.become_reaper()

    import torch

    from flashtune import platform
    from flashtune.bench.evaluate import BenchConfig, evaluate_workload
    from flashtune.bench.sandbox import SandboxPool, probe_isolation
    from flashtune.data.dataset import Dataset

    # The worker is a daemon of the runner (it dies with it), but it starts one sandbox
    # process per solution, which multiprocessing forbids daemons; the worker kills each
    # sandbox itself (bench/sandbox.py), so none outlives it.
    mp.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    device = torch.device(device_str)
    if device.type == "cuda":
        if os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True":
            # In case the allocator read its settings before the variable was set (the fork
            # server imported torch first). torch 2.11 deprecates the CUDA-specific setter
            # for the accelerator-generic one; either is private API, hence the getattr.
            setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
            if setter is None:
                setter = torch.cuda.memory._set_allocator_settings
            setter("expandable_segments:True")
        torch.cuda.set_device(device)
    cfg = BenchConfig(**options.get("config", {}))
    blob_root = Dataset(options["roots"]) if options.get("roots") else None
    stack = contextlib.ExitStack()
    if options.get("autotune"):
        try:
            from flashtune.tune import autotune

            stack.enter_context(autotune(True, cache=options.get("autotune_cache")))
        except ImportError:  # the tuner is optional: the run goes on untuned
            pass
    environment = platform.snapshot(device)
    # How every sandbox of this worker is isolated (each one must report the same).
    environment["sandbox"] = probe_isolation()
    conn.send(("ready", environment))
    # One sandbox per solution code, reused across workloads and definitions (a few stay
    # alive, least recently used first to go); all closed when the worker stops.
    pool = stack.enter_context(SandboxPool())
    with stack:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            kind = msg[0]
            if kind == "stop":
                break
            if kind == "ping":
                try:
                    x = torch.ones(8, device=device)
                    ok = float((x + x).sum().item()) == 16.0
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    conn.send(("pong", ok, ""))
                except Exception as exc:  # noqa: BLE001 - an unhealthy device is the answer
                    conn.send(("pong", False, f"{type(exc).__name__}: {exc}"))
                continue
            if kind == "task":
                p = msg[1]
                definition = Definition.model_validate_json(p["definition"])
                workload = Workload.model_validate_json(p["workload"])
                solutions = [Solution.model_validate_json(s) for s in p["solutions"]]
                baseline = tuple(p["baseline_latency"]) if p["baseline_latency"] else None
                try:
                    for event, value in evaluate_workload(
                        definition,
                        workload,
                        solutions,
                        cfg,
                        device,
                        environment,
                        blob_root=blob_root,
                        baselines=p["baselines"],
                        baseline_latency=baseline,
                        timeout=float(p.get("timeout", 300.0)),
                        pool=pool,
                    ):
                        conn.send((event, value.to_json() if event == "trace" else value))
                        if event == "trace":
                            _release_memory(device)
                except Exception:  # noqa: BLE001 - report, then let the parent decide
                    conn.send(("error", traceback.format_exc()))
                _release_memory(device)
                conn.send(("done", None))


def _release_memory(device: Any) -> None:
    """Give back what one solution left behind before the next one runs.

    Seen on an H200: after a torch baseline hit an out-of-memory error inside graph capture,
    the CUDA-graph pools and cached blocks it left (kept alive by the exception's frames)
    filled the 140 GB card, and every later solution of the run failed or fell back from
    graph timing. Collecting cycles frees the frames; empty_cache returns cached blocks."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- parent side


def _describe_exit(code: int | None) -> str:
    from flashtune.bench.sandbox import describe_exit

    return describe_exit(code, "worker process")


class Worker:
    """The parent's handle on one worker process for one device."""

    def __init__(self, device: str, options: dict[str, Any]) -> None:
        self.device = device
        self.options = options
        self.environment: dict[str, Any] = {}
        self.process: Any = None
        self.conn: Any = None
        self.restarts = 0
        self._lifeline: Any = None  # the writing end, held here only (`_worker_main`)
        self._lock = threading.Lock()
        self.aborted = False

    # lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        from flashtune.bench.sandbox import forkserver_context, main_hidden

        # A fork of the sandboxes' fork server (torch and flashtune imported, CUDA never
        # touched) starts in milliseconds where a spawned interpreter takes seconds. It
        # gets this process's environment as it is now, not as it was when the server
        # started.
        ctx = forkserver_context()
        parent, child = ctx.Pipe(duplex=True)
        lifeline, self._lifeline = ctx.Pipe(duplex=False)
        options = {**self.options, "environ": dict(os.environ)}
        self.process = ctx.Process(
            target=_worker_main,
            args=(child, self.device, options, lifeline),
            name=f"flashtune-worker-{self.device}",
            daemon=True,
        )
        self.conn = parent
        with self._lock:  # against `abort` from another thread: it kills what started
            if not self.aborted:
                with main_hidden():
                    self.process.start()
        child.close()
        lifeline.close()
        if self.process.pid is None:
            self.process = None
            self.kill()
            raise WorkerError(f"worker for {self.device}: the run is stopping")
        if not parent.poll(_STARTUP_TIMEOUT_S):
            self.kill()
            raise WorkerError(f"worker for {self.device} did not start in {_STARTUP_TIMEOUT_S} s")
        try:
            kind, env = parent.recv()
        except (EOFError, OSError):
            code = self.process.exitcode if self.process else None
            self.kill()
            raise WorkerError(f"worker for {self.device}: {_describe_exit(code)}") from None
        self.environment = env

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            from flashtune.bench.process_tree import kill_tree

            # SIGKILL (a hung kernel ignores politer signals) to the worker and, first,
            # everything below it: its sandboxes, and what they left behind (the worker
            # adopts their orphans), which would otherwise outlive it.
            kill_tree(self.process.pid)
        if self.process is not None:
            self.process.join(10)
        if self.conn is not None:
            self.conn.close()
        if self._lifeline is not None:
            self._lifeline.close()
        self.process, self.conn, self._lifeline = None, None, None

    def abort(self) -> None:
        """The run is stopping (a signal): SIGKILL the worker's whole tree now, from any
        thread, and never start it again. The thread feeding it then sees it die (and gets
        WorkerError if it tries to restart it); nothing it records counts any more."""
        with self._lock:
            self.aborted = True
            process = self.process
        pid = process.pid if process is not None else None
        if pid is not None:
            from flashtune.bench.process_tree import kill_tree

            kill_tree(pid)

    def restart(self) -> None:
        self.kill()
        self.restarts += 1
        self.start()

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            self.conn.send(("stop", None))
            self.process.join(30)  # lets the autotune context save its cache file
        except (OSError, BrokenPipeError):
            pass
        self.kill()

    def healthy(self) -> tuple[bool, str]:
        if self.process is None or not self.process.is_alive():
            return False, _describe_exit(self.process.exitcode if self.process else None)
        try:
            self.conn.send(("ping", None))
            if not self.conn.poll(_PING_TIMEOUT_S):
                return False, "no answer to the health check"
            _, ok, why = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            return False, _describe_exit(self.process.exitcode)
        return bool(ok), why or ""

    # running -------------------------------------------------------------------
    def run(
        self,
        task: Task,
        timeout: float,
        on_trace: Callable[[Trace], None],
        make_failure: Callable[[Task, Solution, EvaluationStatus, str], Trace],
    ) -> None:
        """Run `task` to the end, whatever its solutions do; every solution gets one trace."""
        pending = list(task.solutions)
        baseline = task.baseline_latency
        while pending:
            if self.process is None:
                self.start()
            sub = Task(task.definition, task.workload, pending, task.baselines, baseline)
            outcome = self._run_once(sub, timeout, on_trace)
            done, current, failure = outcome
            pending = [s for s in pending if s.name not in done]
            for trace in done.values():
                baseline = faster_baseline(baseline, trace, task.baselines)
            if failure is None:
                ok, why = self.healthy()
                if not ok:
                    self.restart()
                if pending:  # the worker finished without covering some solutions
                    for sol in pending:
                        on_trace(
                            make_failure(
                                task,
                                sol,
                                EvaluationStatus.RUNTIME_ERROR,
                                "worker ended the task without evaluating it",
                            )
                        )
                break
            status, why = failure
            self.restart()
            if current == "reference":
                for sol in pending:
                    on_trace(make_failure(task, sol, status, f"reference: {why}"))
                break
            victim = next((s for s in pending if s.name == current), None)
            if victim is not None:
                on_trace(make_failure(task, victim, status, why))
                pending.remove(victim)

    def first_call_timeout(self) -> float:
        """The sandboxes' limit on a solution's import, setup and first call (BenchConfig)."""
        from flashtune.bench.config import BenchConfig

        config = self.options.get("config") or {}
        return float(config.get("first_call_timeout", BenchConfig.first_call_timeout))

    def _run_once(self, task: Task, timeout: float, on_trace: Callable[[Trace], None]):
        """-> (traces done by name, solution running at the end, (status, why) | None)."""
        done: dict[str, Trace] = {}
        current = "reference"
        try:
            self.conn.send(("task", {**task.payload(), "timeout": timeout}))
        except (OSError, BrokenPipeError):
            return done, current, (EvaluationStatus.RUNTIME_ERROR, _describe_exit(None))
        # The worker kills a solution's sandbox itself and reports TIMEOUT (after the first
        # call's own limit plus `timeout`); this deadline only catches a worker that hangs
        # (its reference, or the worker itself).
        limit = timeout + self.first_call_timeout() + _SANDBOX_GRACE_S
        deadline = time.monotonic() + limit
        while True:
            remaining = deadline - time.monotonic()
            try:
                ready = self.conn.poll(max(remaining, 0))
            except (EOFError, OSError):
                ready = True
            if not ready:
                what = "the reference" if current == "reference" else current
                return (
                    done,
                    current,
                    (
                        EvaluationStatus.TIMEOUT,
                        f"{what} ran past the {timeout:g} s timeout; its worker was killed",
                    ),
                )
            try:
                kind, value = self.conn.recv()
            except (EOFError, OSError):
                self.process.join(5)
                return (
                    done,
                    current,
                    (
                        EvaluationStatus.RUNTIME_ERROR,
                        f"{_describe_exit(self.process.exitcode)} while running "
                        f"{'the reference' if current == 'reference' else current}",
                    ),
                )
            if kind == "start":
                current = value
                deadline = time.monotonic() + limit
            elif kind == "trace":
                trace = Trace.model_validate_json(value)
                done[trace.solution or ""] = trace
                on_trace(trace)
            elif kind == "error":
                return done, current, (EvaluationStatus.RUNTIME_ERROR, value[-2000:])
            elif kind == "done":
                return done, current, None


def default_devices() -> list[str]:
    """Every visible GPU, or the CPU when there is none."""
    import torch

    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


def parse_devices(spec: str | None) -> list[str]:
    """'0,1' -> ['cuda:0', 'cuda:1']; 'cpu' -> ['cpu']; None -> default_devices()."""
    if not spec:
        return default_devices()
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if part.isdigit():
            out.append(f"cuda:{part}")
        elif part == "cpu" or part.startswith("cuda"):
            out.append(part)
        else:
            raise ValueError(f"--devices: {part!r} is neither a GPU index, 'cuda:N' nor 'cpu'")
    return out

"""Run a solution in a process of its own: the sandbox (the worker's side of it).

A benchmarked solution is untrusted code. The worker (bench/worker.py) holds what must stay
out of its reach: the reference outputs, the checker, the verdicts and every other
solution. Each solution therefore runs in a child process of its own (bench/sandbox_child.py),
forked from a fork server that has imported torch and flashtune but never touched CUDA and
never held a solution. The process serves the solution's workloads one job at a time, under
every definition that names the same code (SandboxPool), and only while each job ends
cleanly: a failure, a timeout or tampering ends it, and the next workload gets a new one.

- the child synthesizes the workload's inputs itself (same seeds, same code as the worker,
  so the same values), imports the solution, calls it, times it with the harness's timer
  and sends back what the worker checks: outputs, and the inputs after the calls;
- the worker compares them with the reference outputs it computed, decides the verdict and
  kills the child's whole process tree when the solution is done;
- nothing the solution patches (the clock, torch, the checker), scans (frames, `gc`) or
  leaves behind (threads, children, GPU state) reaches another solution.

The child also runs under the operating system's sandbox (bench/isolation.py: namespaces,
Landlock, seccomp), entered before anything else, with a private scratch folder made here
and removed when it closes; its first message reports the isolation it got.

Messages from the child are decoded without unpickling code (bench/messages.py resolves no
global at all): tensors travel as plain descriptions, CPU tensors by value, CUDA tensors as
CUDA IPC handles that the worker opens and copies at once while the child waits.

The order of the child's work, and what each step catches:
1. requirements (SKIPPED), build (COMPILE_ERROR); a snapshot of the functions the harness
   relies on (time.*, torch, torch.cuda, Tensor methods, the timer) is taken before the
   solution is imported and compared after each step: a replaced one is TAMPERING;
2. the solution's optional `setup` (e.g. a FlashInfer plan) runs once per input set, outside
   the timed region, by the same rule for every solution;
3. one call on input set 0, destination outputs filled with NaN: outputs and inputs are
   checked (a solution must not write into its inputs);
4. timing over rotating input sets (`flashtune.timing.measure_robust`);
5. after timing, with what was timed still alive (the CUDA graph, or the same callables):
   outputs filled with NaN, one more replay/call per set, and every set's outputs and
   inputs checked: a graph that lost its work to another stream, a solution that scribbles
   on its inputs on later calls, one that returns stale results, all fail here;
6. new float values written into set 0's input tensors in place (same tensors, same
   addresses; index tensors unchanged), outputs NaN, one more replay/call: an identity
   cache, or work done in `setup` instead of the timed call, returns stale values.

Cost: a fork of the server plus, on a GPU, a CUDA context and the solution's module loads,
once per solution (not per workload): about 0.05 s on the CPU and 0.2-0.6 s on an H100
(a FlashInfer module's first load, 20-40 s in our GPU image, is paid once per process too).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from multiprocessing import forkserver
from typing import Any

from flashtune.bench import entry_points, isolation, process_tree, sandbox_child
from flashtune.bench.messages import decode_message, loads
from flashtune.bench.sandbox_child import (
    SandboxJob,
    SandboxSpec,
    child_main,
    descendants,
    float_input_names,
)
from flashtune.ops import family_packages

__all__ = [
    "SandboxSpec",
    "SandboxJob",
    "Sandbox",
    "SandboxPool",
    "SandboxDied",
    "SandboxTimeout",
    "float_input_names",
    "describe_exit",
    "forkserver_context",
    "main_hidden",
    "probe_isolation",
    "HangWatch",
]

_LOG_LIMIT = 8000


def describe_exit(code: int | None, who: str) -> str:
    """'<who> died with SIGSEGV' and the like, from a multiprocessing exit code."""
    if code is None:
        return f"{who} stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{who} died with {name}"
    return f"{who} exited with code {code}"


class SandboxDied(RuntimeError):
    """The child exited or was killed before it finished."""


class SandboxTimeout(RuntimeError):
    """The child did not answer within the solution's time limit."""


# What the fork server imports once (never CUDA): the child, the bundled entry points and
# every op family package (found on disk), so a child starts without importing them again.
_PRELOAD = (sandbox_child.__name__, entry_points.__name__, *family_packages())
_CONTEXT: Any = None
_CONTEXT_LOCK = threading.Lock()


def forkserver_context() -> Any:
    """A fork server that has imported the harness, torch and flashtune's ops (never CUDA):
    a child starts as a fork of it in milliseconds."""
    global _CONTEXT
    with _CONTEXT_LOCK:
        if _CONTEXT is None:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(list(_PRELOAD))
            # Started now rather than by the first child, with the mark that makes it make
            # itself non-dumpable as it imports its preloads (bench/isolation.py), and with
            # a terminal's SIGINT and SIGHUP blocked: sent to the whole foreground process
            # group, they would interrupt its imports with a traceback (it ignores SIGINT
            # only once they are done). It keeps them blocked; the runner stops the run, and
            # its children (a worker, a sandbox) unblock them.
            with isolation.marked_for_forkserver(), _terminal_signals_blocked():
                forkserver.ensure_running()
            _CONTEXT = ctx
        return _CONTEXT


_TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def _terminal_signals_blocked() -> Iterator[None]:
    """SIGINT and SIGHUP blocked in this thread (the processes it starts inherit the mask;
    in this process they go to another thread, pending ones when the block ends)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _TERMINAL_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def main_hidden() -> Iterator[None]:
    """Start a child without it importing the parent's `__main__` (multiprocessing would
    re-run a user's script, pytest or the CLI in every child): the child needs only the
    modules the fork server preloaded and the target's own module."""
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if hasattr(main, k)}
    try:
        for k in saved:
            setattr(main, k, None) if k == "__spec__" else delattr(main, k)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


class Sandbox:
    """The worker's handle on one child evaluating one solution, one workload (job) at a
    time."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.jobs = 0
        self._log_offset = 0
        # A sandbox for Triton's interpreter is spawned, a fresh interpreter: the fork
        # server has imported flashtune's kernels without it (bench/interpreter.py).
        ctx: Any = mp.get_context("spawn") if spec.interpret else forkserver_context()
        parent, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=child_main, args=(child, spec), name="flashtune-sandbox", daemon=False
        )
        with main_hidden():
            self.process.start()
        child.close()
        self.conn = parent
        # The child's first message says how it is isolated (bench/isolation.py), sent before
        # any of the solution exists. A sandbox weaker than the worker's probe found this
        # platform to be (what every trace claims) is not used: `broken` says why.
        self.isolation: dict[str, Any] = {}
        self.broken: str | None = None
        try:
            kind, report = self.receive(_REPORT_TIMEOUT_S)
        except (SandboxDied, SandboxTimeout, ValueError, TypeError) as exc:
            kind, report = "", f"{type(exc).__name__}: {exc}"
        if kind != "isolation" or not isinstance(report, dict):
            self.broken = f"the sandbox did not report its isolation ({str(report)[:300]})"
        elif "error" in report:
            self.broken = str(report["error"])[:500]
        else:
            self.isolation = report
            short = isolation.weaker(report, _EXPECTED) if _EXPECTED is not None else []
            if short:
                self.broken = "the sandbox is less isolated than this worker's probe: " + (
                    "; ".join(short)
                )
        if self.broken is not None:
            process_tree.kill_tree(self.process.pid)

    def start(self, job: SandboxJob) -> None:
        """Send the next workload. Only to a child that finished its last job ("done"): it
        is then waiting for this message, so the send cannot block on a busy child."""
        if self.broken is not None:
            raise SandboxDied(self.broken)
        self.job = job
        self.jobs += 1
        try:
            # Shared CPU tensors' memory goes over this connection, not through a unix
            # socket the sandbox would connect to (it may make none: bench/isolation.py).
            isolation.send_with_fds(self.conn, job)
        except (OSError, BrokenPipeError):
            raise SandboxDied(self._exit_text()) from None

    def receive(self, timeout: float) -> tuple[str, Any]:
        """The next message; SandboxTimeout / SandboxDied when there is none."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxTimeout(f"no answer within {timeout:g} s")
            ready = mpc.wait([self.conn, self.process.sentinel], remaining)
            if self.conn in ready:
                try:
                    data = self.conn.recv_bytes()
                except (EOFError, OSError):
                    raise SandboxDied(self._exit_text()) from None
                kind, payload = loads(data)
                if not isinstance(kind, str):
                    raise ValueError("malformed message from the sandbox")
                return kind, decode_message(kind, payload)
            if self.process.sentinel in ready:
                # Messages sent just before exiting are still in the pipe.
                if self.conn.poll(0):
                    continue
                raise SandboxDied(self._exit_text())

    def ack(self, data: int | None = None) -> None:
        """Let the child go on; `data` is the next sample's seed, or None."""
        with contextlib.suppress(OSError, BrokenPipeError):
            isolation.send_with_fds(self.conn, ("ack", data))

    def _exit_text(self) -> str:
        self.process.join(2)
        return describe_exit(self.process.exitcode, "the solution's process")

    def log(self) -> str:
        """What the child wrote since the last call (its tail, at most _LOG_LIMIT bytes)."""
        try:
            with open(self.spec.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(self._log_offset, size - _LOG_LIMIT))
                self._log_offset = size
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _signal_tree(self, signum: int) -> None:
        pid = self.process.pid
        if pid is None:
            return
        for p in [pid, *descendants(pid)]:
            with contextlib.suppress(OSError):
                os.kill(p, signum)

    def activity(self) -> tuple[float, int]:
        """(CPU seconds used so far by the child and the live processes below it, their
        children's reaped ones included; how many programs it runs: live processes below it
        with another command line than its own, such as a compiler, not a fork of itself),
        from /proc: what `HangWatch` calls progress."""
        pid = self.process.pid
        if pid is None:
            return 0.0, 0
        cpu, running = 0.0, 0
        own = _cmdline(pid)
        for p in [pid, *descendants(pid)]:
            fields = process_tree.stat_fields(p)
            if fields is None or len(fields) < 15 or fields[0] in ("Z", "X"):  # dead, unreaped
                continue
            cpu += sum(int(x) for x in fields[11:15]) / _CLOCK_TICKS  # utime .. cstime
            # Not a fork of itself: the interpreter's sandbox runs in one (sandbox_child.py).
            running += p != pid and _cmdline(p) != own
        return cpu, running

    def pause(self) -> None:
        """Stop the child and everything it started (SIGSTOP) until `resume`."""
        self._signal_tree(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_tree(signal.SIGCONT)

    def close(self) -> None:
        """Kill the child and everything it started; remove its log."""
        pid = self.process.pid
        if pid is not None:
            for _ in range(3):  # children may fork while we kill: a few rounds
                victims = descendants(pid)
                for p in [pid, *victims]:
                    with contextlib.suppress(OSError):
                        os.kill(p, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                if not victims:
                    break
        self.process.join(10)
        with contextlib.suppress(OSError):
            self.conn.close()
        with contextlib.suppress(OSError):
            os.unlink(self.spec.log_path)
        # What its processes left behind after it died (orphans the worker adopted), and
        # its scratch folder (builds, caches, temporary files).
        process_tree.reap_strays()
        if self.spec.scratch:
            _remove_tree(self.spec.scratch)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# The hang rule's idea of working: a solution using at least this share of one CPU.
# A process that sleeps, waits on a lock or on a pipe uses none (measured: 0.00 s of CPU
# over 10 s for `time.sleep`, with torch imported); Triton's compile, a torch call on
# the CPU and a GPU synchronization (CUDA spins while it waits) use a whole CPU.
_BUSY_SHARE = 0.05
_WATCH_EVERY_S = 1.0


class HangWatch:
    """The first call's hang rule (docs/evaluation.md, "Time limits"). A solution's import,
    setup and first call get cfg.first_call_timeout, as long as they make progress: while
    its process runs a child process (a compiler: Triton's ptxas, nvcc, ninja, gcc), or its
    processes use CPU (Triton's own compile in-process, a slow first call on the CPU). One
    that does neither for `bound` seconds in a row is hanging (a deadlock, a sleep, a wait
    on something that never comes) and is killed then, not after the long limit."""

    def __init__(
        self, sandbox: Sandbox, bound: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sandbox, self.bound, self.clock = sandbox, bound, clock  # bound <= 0: no rule
        now = clock()
        self.progress_at = now
        self.sampled = (now, sandbox.activity()[0] if bound > 0 else 0.0)

    def wait(self, remaining: float) -> float:
        """How long to wait for the sandbox's next message (`remaining`: until the first
        call's limit) before the next look at its processes."""
        return min(remaining, _WATCH_EVERY_S, self.bound / 4) if self.bound > 0 else remaining

    def hanging(self) -> bool:
        """Look at the processes now: True once they made no progress for `bound` s."""
        if self.bound <= 0:
            return False
        now = self.clock()
        cpu, children = self.sandbox.activity()
        then, cpu_then = self.sampled
        self.sampled = (now, cpu)
        if children or cpu - cpu_then >= _BUSY_SHARE * (now - then):
            self.progress_at = now
        return now - self.progress_at >= self.bound

    def reason(self, solution: str) -> str:
        return (
            f"{solution} hung in its import, setup or first call: for {self.bound:g} s it "
            f"was not compiling (no child process such as a compiler) and used under "
            f"{_BUSY_SHARE:.0%} of a CPU; its process was killed (--hang-timeout)"
        )


def _remove_tree(path: str) -> None:
    """rm -rf, also of folders the solution made unreadable to its owner (chmod 000)."""

    def retry(function: Any, target: str, *_: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
        with contextlib.suppress(OSError):
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target, ignore_errors=True)
            else:
                function(target)

    # rmtree follows no symbolic link; `onerror` is `onexc` from Python 3.12 on.
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)


def open_sandbox(spec_without_log: dict[str, Any]) -> Sandbox:
    fd, log_path = tempfile.mkstemp(prefix="flashtune-sandbox-", suffix=".log")
    os.close(fd)
    # The sandbox's private folder, the only one it may write (bench/isolation.py).
    scratch = tempfile.mkdtemp(prefix="flashtune-scratch-")
    spec = SandboxSpec(**spec_without_log, log_path=log_path, scratch=scratch)
    return Sandbox(spec)


_REPORT_TIMEOUT_S = 120.0
# What every sandbox of this process must report (`probe_isolation`); None: not probed.
_EXPECTED: dict[str, Any] | None = None


def probe_isolation() -> dict[str, Any]:
    """How a sandbox is isolated here: one started for nothing but its report (the same
    code path as any other). Every later sandbox of this process must report the same, or
    it is not used (`Sandbox.broken`); the worker puts this report in every trace's
    environment ("sandbox")."""
    global _EXPECTED
    spec = {"solution": "{}", "device": "cpu", "config": {}, "roots": ()}
    probe = open_sandbox(spec)
    try:
        if probe.broken is not None:
            raise RuntimeError(f"the isolation probe failed: {probe.broken}")
        report = dict(probe.isolation)
    finally:
        probe.close()
    _EXPECTED = report
    return report


class SandboxPool:
    """The worker's live sandboxes, one per solution code, kept across workloads and
    definitions: a process is reused only after a job it finished cleanly (a failure, a
    timeout or a kill ends it), and at most `size` stay alive (least recently used go)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._live: dict[str, Sandbox] = {}

    @staticmethod
    def key(spec_without_log: Mapping[str, Any]) -> str:
        """Solutions with the same code (spec and sources; not their names or definitions)
        on the same device, config and dataset roots share a process."""
        solution = json.loads(spec_without_log["solution"])
        code = {k: solution.get(k) for k in ("spec", "sources")}
        rest = {k: v for k, v in spec_without_log.items() if k != "solution"}
        return json.dumps([code, rest], sort_keys=True, default=list)

    def get(self, spec_without_log: dict[str, Any]) -> Sandbox:
        key = self.key(spec_without_log)
        sandbox = self._live.pop(key, None)
        if sandbox is not None and sandbox.process.is_alive():
            sandbox.resume()
        else:
            if sandbox is not None:
                sandbox.close()
            sandbox = open_sandbox(spec_without_log)
        self._live[key] = sandbox  # most recently used last
        while len(self._live) > self.size:
            self._live.pop(next(iter(self._live))).close()
        return sandbox

    def release(self, sandbox: Sandbox) -> None:
        """A job ended cleanly: the sandbox waits, stopped, for its solution's next workload.
        Stopped, it cannot spend CPU time (threads, children) while another solution is
        timed."""
        sandbox.pause()

    def discard(self, sandbox: Sandbox) -> None:
        """End a sandbox: its last job did not finish cleanly, or held too much memory to
        idle beside the next one."""
        for key, live in list(self._live.items()):
            if live is sandbox:
                del self._live[key]
        sandbox.close()

    def close_idle(self, keep: Mapping[str, Any] | None = None) -> int:
        """End every idle sandbox but the one for `keep` (a spec, as `get` takes): before a
        workload whose input sets need most of the device, since each idle process holds a
        CUDA context and what its last job left (one kept 16 GB beside a 61 GB MoE set, and
        the next sandbox's set no longer fit a 141 GB H200). Returns how many ended."""
        spare = self.key(keep) if keep is not None else None
        ended = 0
        for key in [k for k in self._live if k != spare]:
            self._live.pop(key).close()
            ended += 1
        return ended

    def close(self) -> None:
        for live in self._live.values():
            live.close()
        self._live.clear()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

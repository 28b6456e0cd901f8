"""The sandbox's child: one process per solution code, serving one workload (job) at a time.

It receives a job, synthesizes the workload's inputs (or, on the CPU, works on the worker's
shared-memory copies), calls the solution, times it with the harness's timer and sends back
what the worker checks; see bench/sandbox.py for the order of the work and what each step
catches. Everything here runs beside untrusted code: the worker trusts nothing it says
beyond plain data (bench/messages.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch

from flashtune.bench import isolation, messages, process_tree
from flashtune.bench.messages import encode
from flashtune.bench.tamper import harness_spaces, snapshot, tampered

__all__ = ["SandboxSpec", "SandboxJob", "child_main", "descendants", "float_input_names"]


@dataclass(frozen=True)
class SandboxSpec:
    """What the child needs for one solution, whatever the workload (trusted, from the
    worker; JSON texts so the child validates them with the same models)."""

    solution: str
    device: str
    config: dict[str, Any]
    roots: tuple[str, ...]
    log_path: str
    # The sandbox's private folder (bench/isolation.py): the only one it may write; made by
    # the worker, removed when the sandbox closes.
    scratch: str = ""
    # Run Triton in its interpreter (a Triton solution on a CPU: checked, not timed;
    # bench/interpreter.py). Only in a process that has imported no kernel yet (a spawned
    # one, not a fork of the server): TRITON_INTERPRET works when a kernel is decorated.
    interpret: bool = False


@dataclass(frozen=True)
class SandboxJob:
    """One workload for a sandbox's solution (sent by the worker; trusted). The definition
    travels with the job: one solution's code often serves several definitions (the same
    entry point for rmsnorm_h4096 and rmsnorm_h8192), and one process serves them all.

    `seed` makes input set i's index tensors and first values (`derive_seed(seed, i)`); the
    values of each timed sample come from a seed the worker sends only when the sample is
    about to run (bench/checked_timing.py)."""

    definition: str
    workload: str
    seed: int
    stochastic: bool
    # CPU only: the worker's input sets in shared memory. The child calls the solution on
    # these very tensors, and the worker writes each sample's values into them before it
    # lets the sample run: the child synthesizes nothing and sends no input back.
    shared_sets: list[dict[str, Any]] | None = None
    # Weights that keep their first values in every sample (bench/fixed_inputs.py).
    fixed: tuple[str, ...] = ()


def float_input_names(inputs: Mapping[str, Any]) -> list[str]:
    """The inputs rewritten in place by the swap check: floating-point tensors (values), not
    index tensors (a plan made from them stays valid)."""
    return [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]


# The C methods themselves, bound before any solution is imported.
_fill = torch._C.TensorBase.fill_
_copy = torch._C.TensorBase.copy_
_get_threads, _set_threads = torch.get_num_threads, torch.set_num_threads


def _poison(t: torch.Tensor) -> None:
    if t.is_floating_point():
        _fill(t, float("nan"))
    elif t.dtype == torch.bool:
        _fill(t, True)
    else:
        _fill(t, -1 if t.dtype != torch.uint8 else 255)


def _poison_all(value: Any) -> None:
    if isinstance(value, torch.Tensor):
        _poison(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _poison_all(v)
    elif isinstance(value, Mapping):
        for v in value.values():
            _poison_all(v)


class _Child:
    def __init__(self, conn: Any, spec: SandboxSpec) -> None:
        self.conn, self.spec = conn, spec
        self.pid = os.getpid()
        self.started = time.perf_counter()
        self.marks: dict[str, float] = {}  # phase -> seconds since start (for the log)

    def mark(self, phase: str) -> None:
        self.marks[phase] = round(time.perf_counter() - self.started, 4)

    # ---------------------------------------------------------------- talking
    def send(self, kind: str, payload: Any = None) -> None:
        if os.getpid() != self.pid:  # a fork made by the solution: it may not speak
            os._exit(0)
        sys.stdout.flush()
        sys.stderr.flush()
        self.conn.send_bytes(pickle.dumps((kind, encode(payload))))

    def send_and_wait(self, kind: str, payload: Any) -> Any:
        """Send, wait for the worker's ("ack", data) and return data (the next sample's
        seed, or None)."""
        self.send(kind, payload)
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            reply = None
        if not (isinstance(reply, tuple) and len(reply) == 2 and reply[0] == "ack"):
            self.linger()  # the worker has its verdict: nothing more to do
        return reply[1]

    def linger(self) -> NoReturn:
        """Wait to be killed. Exiting by itself would orphan the solution's children before
        the worker has found them (they are found as this process's descendants); if the
        worker is gone, kill them here."""
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            while True:
                self.conn.recv()
        except (EOFError, OSError):
            pass
        for pid in descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        os._exit(0)

    def status(self, status: str, reason: str) -> None:
        self.send("status", {"status": status, "reason": reason})

    # ---------------------------------------------------------------- the work
    def serve(self) -> None:
        """Receive the first job, import the solution, then run jobs until the worker stops
        sending them (it kills this process). One process per solution: the CUDA context,
        the import and the compiled kernels serve every workload of the solution; the
        snapshot taken before the import guards them all."""
        from flashtune.bench.build import (
            BuildError,
            MissingRequirement,
            build_solution,
            check_requirements,
        )
        from flashtune.bench.config import BenchConfig
        from flashtune.data.dataset import Dataset
        from flashtune.data.models import Solution

        job = self.next_job()
        spec = self.spec
        self.device = torch.device(spec.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.cuda.init()
        self.cfg = BenchConfig(**spec.config)
        self.blob_root = Dataset([Path(r) for r in spec.roots]) if spec.roots else None
        sol = Solution.model_validate_json(spec.solution)
        self.dps = sol.spec.destination_passing_style
        self.mark("cuda init" if self.device.type == "cuda" else "start")
        self.spaces = harness_spaces(sys.modules[__name__], messages)
        self.before = snapshot(self.spaces)
        try:
            check_requirements(sol, self.device, interpret=spec.interpret)
            self.fn = build_solution(sol)
        except MissingRequirement as exc:
            self.status("SKIPPED", str(exc))
            self.linger()
        except BuildError as exc:
            sys.stderr.write(exc.log)
            self.status("COMPILE_ERROR", str(exc))
            self.linger()
        self.check_tamper("import")
        self.mark("import")
        while True:
            done: dict[str, Any] = {"phases_s": self.marks}
            if spec.interpret:
                from flashtune.bench.interpreter import count_launches

                with count_launches() as launches:
                    self.run_job(job)
                done["launches"] = dict(launches)
            else:
                self.run_job(job)
            # An idle sandbox must not keep the GPU memory its job cached: several stay
            # alive, and the worker's next reference and the next sandbox need the room.
            if self.device.type == "cuda":
                _free_device_memory(self.device)
            self.send("done", done)
            job = self.next_job()
            self.marks, self.started = {}, time.perf_counter()

    def next_job(self) -> SandboxJob:
        try:
            job = self.conn.recv()
        except (EOFError, OSError):
            job = None
        if not isinstance(job, SandboxJob):
            self.linger()
        return job

    def check_tamper(self, step: str) -> None:
        changed = tampered(self.before, self.spaces)
        if changed:
            self.status(
                "TAMPERED",
                f"{step}: the solution replaced harness functions: {', '.join(changed[:8])}",
            )
            self.linger()

    def run_job(self, job: SandboxJob) -> None:
        from flashtune.bench.checked_timing import (
            CheckedSampler,
            derive_seed,
            sets_per_sample,
        )
        from flashtune.data.models import Definition, Workload
        from flashtune.data.synth import resolve_axes, synthesize_inputs, torch_dtype
        from flashtune.timing import tensor_bytes

        definition = Definition.model_validate_json(job.definition)
        device, cfg, fn = self.device, self.cfg, self.fn
        workload = Workload.model_validate_json(job.workload)
        axes = resolve_axes(definition, workload)
        dps = self.dps
        names = list(definition.inputs)
        out_names = list(definition.outputs)

        def synth(seed: int, fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
            return synthesize_inputs(
                definition, workload, device=device, seed=seed, blob_root=self.blob_root,
                fixed=fixed,
            )  # fmt: skip

        def args_of(inputs: Mapping[str, Any]) -> list[Any]:
            args = [inputs[n] for n in names]
            if dps:
                for o in definition.outputs.values():
                    shape = tuple(axes[a] for a in o.shape or ())
                    args.append(torch.empty(shape, dtype=torch_dtype(o.dtype), device=device))
            return args

        def outputs_of(args: Sequence[Any], result: Any) -> Any:
            if dps:
                return dict(zip(out_names, args[len(names) :], strict=False))
            return result

        shared = job.shared_sets

        def inputs_of(args: Sequence[Any]) -> dict[str, Any] | None:
            if shared is not None:  # the worker reads its shared tensors itself
                return None
            return dict(zip(names, args[: len(names)], strict=False))

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        setup = getattr(fn, "setup", None)
        arg_sets: list[list[Any]] = []
        runners: list[Callable[..., Any]] = []

        def add_set() -> None:
            if shared is not None:
                inputs = dict(shared[len(arg_sets)])
            else:
                inputs = synth(derive_seed(job.seed, len(arg_sets)))
            args = args_of(inputs)
            arg_sets.append(args)
            runners.append(setup(*args) if callable(setup) else fn)

        add_set()
        sync()
        self.check_tamper("inputs")
        self.mark("inputs")
        self.check_tamper("setup")

        # 1. The first call, on set 0 (it compiles and loads): checked like every other.
        args0 = arg_sets[0]
        _poison_all(args0[len(names) :])
        called = time.perf_counter()
        with torch.no_grad():
            result = runners[0](*args0)
        sync()
        call_s = time.perf_counter() - called
        self.check_tamper("first call")
        self.mark("setup + first call")
        first = {"index": 0, "outputs": outputs_of(args0, result), "inputs": inputs_of(args0)}
        # The worker answers with the number of draws a sampling op makes (fewer in the
        # interpreter, sized from this call's time); None: cfg.sampling_draws.
        wanted = self.send_and_wait(
            "outputs", {"phase": "first", "sets": [first], "call_s": call_s}
        )
        del result, first

        if job.stochastic:
            draws = []
            count = wanted if isinstance(wanted, int) and wanted > 0 else cfg.sampling_draws
            with torch.no_grad():
                for _ in range(count):
                    draws.append(outputs_of(args0, runners[0](*args0)))
                    if dps:  # the next draw must not overwrite this one
                        draws[-1] = {k: v.clone() for k, v in draws[-1].items()}
            sync()
            stacked = stack_draws(draws)
            if stacked is not None:
                message = {"phase": "draws", "stacked": stacked, "count": len(draws)}
            else:
                message = {"phase": "draws", "draws": draws}
            self.send_and_wait("outputs", message)
            del draws, stacked, message

        # 2. Warm-up on set 0, which also sizes the samples. On the CPU the warm-up and the
        # samples run with cfg.cpu_threads intra-op threads (BenchConfig.cpu_threads).
        threads = _get_threads()
        if device.type != "cuda" and cfg.cpu_threads > 0:
            _set_threads(cfg.cpu_threads)
        budget = cfg.budget()
        per_call_ms = 0.0  # sizes GPU samples only; nothing to warm in the interpreter
        if not self.spec.interpret:
            with torch.no_grad():
                per_call_ms = _warm_up(
                    lambda: runners[0](*args0),
                    budget.warmup,
                    budget.warmup_ms,
                    cfg.max_seconds,
                    sync,
                )
        set_bytes = tensor_bytes(args0)
        n = sets_per_sample(per_call_ms, set_bytes, device, cfg.target_sample_ms, budget.input_sets)
        while len(arg_sets) < n:
            add_set()
        with torch.no_grad():
            for i in range(1, n):  # an eager call on each set before any capture
                runners[i](*arg_sets[i])
        sync()
        self.check_tamper("setup")
        calls = [_bound(runners[i], arg_sets[i]) for i in range(n)]
        with torch.no_grad():
            sampler = CheckedSampler(calls, device, cfg.method())
        self.check_tamper("capture")
        floats = [
            k for k in float_input_names(dict(zip(names, args0, strict=False)))
            if k not in job.fixed
        ]  # fmt: skip

        # 3. Samples: fresh values, same poison, cold L2, timed, every call checked.
        seed = self.send_and_wait(
            "outputs",
            {
                "phase": "ready",
                "sets": n,
                "method": sampler.method,
                "fallback": sampler.fallback,
            },
        )
        k = 0
        while isinstance(seed, int):
            for i, args in enumerate(arg_sets):
                if shared is None:  # on the CPU the worker has written the values
                    fixed = {k: args[names.index(k)] for k in job.fixed}
                    fresh = synth(derive_seed(seed, i), fixed)
                    for name in floats:
                        _copy(args[names.index(name)], fresh[name])
                    del fresh
                _poison_all(args[len(names) :])
            for r in sampler.results:
                _poison_all(r)
            sampler.flush(k)
            with torch.no_grad():
                ms = sampler.sample()
            self.check_tamper("timing")
            sets = [
                {"index": i, "outputs": outputs_of(arg_sets[i], sampler.results[i])}
                for i in range(n)
            ]
            seed = self.send_and_wait(
                "outputs", {"phase": "sample", "k": k, "ms": ms, "sets": sets}
            )
            del sets
            k += 1
        # 4. The inputs as the last sample left them: a solution must not write into them.
        sets = [{"index": i, "inputs": inputs_of(arg_sets[i])} for i in range(n)]
        self.send_and_wait("outputs", {"phase": "inputs", "sets": sets})
        _set_threads(threads)
        self.mark("timing + checks")
        del sampler, calls, sets


def _bound(runner: Callable[..., Any], args: Sequence[Any]) -> Callable[[], Any]:
    def call() -> Any:
        return runner(*args)

    return call


def _warm_up(
    call: Callable[[], Any], calls: int, min_ms: float, max_seconds: float, sync: Callable[[], None]
) -> float:
    """At least `calls` calls and `min_ms` of wall time; wall milliseconds per call (an upper
    bound of the device time)."""
    calls = max(calls, 1)
    start = time.perf_counter()
    deadline = start + max_seconds
    done = 0
    while True:
        call()
        done += 1
        if done % 4 == 0 or done >= calls:
            sync()
            now = time.perf_counter()
            if now > deadline or (done >= calls and (now - start) * 1e3 >= min_ms):
                break
    return (time.perf_counter() - start) * 1e3 / done


def _free_device_memory(device: torch.device) -> None:
    """Return the cached blocks; collect reference cycles (a graph or an exception's frames
    holding tensors) only when that did not free them: a collection costs tens of ms.
    Blocks sent to the worker (CUDA IPC) are freed only once the worker let go of them and
    ipc_collect runs: without it an idle sandbox kept the inputs it sent back (GBs)."""
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    if torch.cuda.memory_reserved(device) > _IDLE_RESERVE_LIMIT:
        gc.collect()
        torch.cuda.empty_cache()


_IDLE_RESERVE_LIMIT = 256 << 20  # bytes an idle sandbox may keep reserved


def _become_group_leader() -> None:
    """Own process group and session, and reap orphans: the worker kills the whole tree."""
    with contextlib.suppress(OSError):
        os.setsid()
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    # Blocked in the fork server it comes from (bench/sandbox.py); a solution and what it
    # starts get the signal mask of an ordinary process.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGHUP))


def _fork_single_threaded() -> None:
    """Go on in a fork of this process, which waits for it and ends as it ends (exit status
    or signal). A spawned sandbox (Triton's interpreter) has imported torch, which starts a
    thread, and a process of several threads cannot enter a user namespace; a fork has one
    thread, as a fork of the fork server has. The waiting parent holds nothing of the
    solution, and the worker kills it with its tree."""
    pid = os.fork()
    if pid == 0:
        return
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def child_main(conn: Any, spec: SandboxSpec) -> None:
    # The solution's prints and the harness's tracebacks go to a file the worker reads,
    # also when the child dies. Opened first: it lies outside the scratch folder, the only
    # one the sandbox may write once isolated.
    if spec.interpret:  # before any kernel is decorated (the solution's import, later)
        os.environ["TRITON_INTERPRET"] = "1"
        _fork_single_threaded()
    fd = os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # Then the OS-level sandbox, before anything else runs here; its report goes to the
    # worker first (nothing of the solution exists yet, so it can be believed).
    try:
        report: dict[str, Any] = isolation.enter_sandbox(spec.scratch, spec.roots)
    except Exception as exc:  # noqa: BLE001 - reported; the worker will not use this process
        traceback.print_exc()
        report = {"error": f"entering the sandbox failed: {type(exc).__name__}: {exc}"}
    _become_group_leader()
    isolation.set_fd_channel(conn)  # shared CPU tensors arrive through it
    conn.send_bytes(pickle.dumps(("isolation", encode(report))))
    child = _Child(conn, spec)
    if "error" in report:
        child.linger()
    try:
        child.serve()
    except BaseException as exc:  # noqa: BLE001 - the solution's failure is the result
        traceback.print_exc()
        with contextlib.suppress(Exception):
            child.status("RUNTIME_ERROR", f"{type(exc).__name__}: {str(exc)[:500]}")
    child.linger()  # never returns: no atexit handlers, no threads of the solution run on


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, and every process still in its session or group
    (a child that left the tree with setsid() is still found while the sandbox lives)."""
    children: dict[int, list[int]] = {}
    members: list[int] = []
    for entry, ppid, pgrp, session in process_tree.process_table():
        children.setdefault(ppid, []).append(entry)
        if (pgrp == pid or session == pid) and entry != pid:
            members.append(entry)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return sorted(found | set(members))


def stack_draws(draws: list[Any]) -> Any:
    """The draws of a stochastic op as one tensor per output ([draws, ...]), or None where
    they do not stack (the worker then reads the list). A thousand draws sent one by one
    cost a thousand CUDA IPC handles per output; stacked, one."""
    if not draws:
        return None
    first = draws[0]

    def alike(a: Any, b: Any) -> bool:
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.device == b.device
        )

    if isinstance(first, torch.Tensor):
        return torch.stack(draws) if all(alike(d, first) for d in draws) else None
    if isinstance(first, dict) and first:
        if all(isinstance(d, dict) and d.keys() == first.keys() for d in draws) and all(
            alike(d[k], first[k]) for d in draws for k in first
        ):
            return {k: torch.stack([d[k] for d in draws]) for k in first}
    return None

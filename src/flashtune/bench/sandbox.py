"""Run one solution on one workload in a process of its own: the sandbox.

A benchmarked solution is untrusted code. The worker (bench/worker.py) holds what must stay
out of its reach: the reference outputs, the checker, the verdicts and every other
solution. Each (solution, workload) therefore runs in a fresh child process, forked from a
fork server that has imported torch and flashtune but never touched CUDA and never held a
solution:

- the child synthesizes the workload's inputs itself (same seeds, same code as the worker,
  so the same values), imports the solution, calls it, times it with the harness's timer
  and sends back what the worker checks: outputs, and the inputs after the calls;
- the worker compares them with the reference outputs it computed, decides the verdict and
  kills the child's whole process tree when the solution is done;
- nothing the solution patches (the clock, torch, the checker), scans (frames, `gc`) or
  leaves behind (threads, children, GPU state) outlives its own evaluation.

Messages from the child are decoded without unpickling code (`_SafeUnpickler` resolves no
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

Cost: a fork of the server plus, on a GPU, a CUDA context per (solution, workload):
about 0.05 s on the CPU and 0.3-0.6 s on an H100/H200.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import math
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.multiprocessing.reductions as _reductions

__all__ = [
    "SandboxSpec",
    "SandboxJob",
    "Sandbox",
    "SandboxPool",
    "SandboxDied",
    "SandboxTimeout",
    "float_input_names",
    "describe_exit",
]

_LOG_LIMIT = 8000

# --------------------------------------------------------------------------- messages


_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2,
    )
}  # fmt: skip


def _encode(value: Any) -> Any:
    """Tensors -> plain dicts (CPU by value, CUDA as an IPC handle); containers recurse."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        name = str(t.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            return {"__kind__": "unsupported", "type": f"tensor of {t.dtype}"}
        if t.device.type == "cuda":
            _, args = _reductions.reduce_tensor(t)
            (_, size, stride, offset, _, _, device, handle, nbytes, offset_bytes, _,
             rc_handle, rc_offset, ev_handle, ev_sync) = args  # fmt: skip
            return {
                "__kind__": "cuda", "dtype": name, "size": list(size), "stride": list(stride),
                "offset": int(offset), "device": int(device), "handle": handle,
                "nbytes": int(nbytes), "offset_bytes": int(offset_bytes),
                "rc_handle": rc_handle, "rc_offset": int(rc_offset),
                "ev_handle": ev_handle, "ev_sync": bool(ev_sync),
            }  # fmt: skip
        c = t.contiguous()
        return {
            "__kind__": "cpu",
            "dtype": name,
            "size": list(c.shape),
            "data": c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b"",
        }
    if isinstance(value, Mapping):
        return {"__kind__": "dict", "items": {str(k): _encode(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"__kind__": "list", "items": [_encode(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"__kind__": "unsupported", "type": type(value).__name__}


class _Unsupported:
    """A value the child could not describe (the checker reports its type)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


def _ints(values: Any, what: str) -> list[int]:
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise ValueError(f"malformed tensor description: {what}")
    return values


def _decode(value: Any) -> Any:
    """Inverse of `_encode`, in the worker; CUDA tensors are copied into the worker's memory
    at once (the child's allocation goes away with the child)."""
    if not isinstance(value, dict):
        return value
    kind = value.get("__kind__")
    if kind == "dict":
        return {k: _decode(v) for k, v in value["items"].items()}
    if kind == "list":
        return [_decode(v) for v in value["items"]]
    if kind == "unsupported":
        return _Unsupported(str(value.get("type")))
    dtype = _DTYPES.get(value.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise ValueError(f"malformed tensor description: dtype {value.get('dtype')!r}")
    size = _ints(value.get("size"), "size")
    if kind == "cpu":
        data = value.get("data")
        if not isinstance(data, bytes):
            raise ValueError("malformed tensor description: data")
        numel = math.prod(size)
        if len(data) != numel * torch.empty((), dtype=dtype).element_size():
            raise ValueError("malformed tensor description: data size")
        if numel == 0:
            return torch.empty(size, dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(size)
    if kind == "cuda":
        stride = _ints(value.get("stride"), "stride")
        fields = ("offset", "device", "nbytes", "offset_bytes", "rc_offset")
        if not all(type(value.get(f)) is int for f in fields):
            raise ValueError("malformed tensor description: offsets")
        for f in ("handle", "rc_handle", "ev_handle"):
            if value.get(f) is not None and not isinstance(value.get(f), bytes):
                raise ValueError(f"malformed tensor description: {f}")
        shared = _reductions.rebuild_cuda_tensor(
            torch.Tensor, torch.Size(size), tuple(stride), value["offset"],
            torch.storage.TypedStorage, dtype, value["device"], value["handle"],
            value["nbytes"], value["offset_bytes"], False, value["rc_handle"],
            value["rc_offset"], value["ev_handle"], bool(value.get("ev_sync")),
        )  # fmt: skip
        copy = shared.clone()
        torch.cuda.synchronize(copy.device)
        del shared
        return copy
    raise ValueError(f"malformed message: unknown kind {kind!r}")


class _SafeUnpickler(pickle.Unpickler):
    """Plain data only: the child is untrusted, and unpickling a global can run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the sandbox may not send objects ({module}.{name})")


def _loads(data: bytes) -> Any:
    return _SafeUnpickler(io.BytesIO(data)).load()


# --------------------------------------------------------------------------- tamper check


def _guarded() -> list[tuple[str, Any]]:
    """Namespaces whose functions the harness relies on, by name."""
    import flashtune.timing as timing

    spaces: list[tuple[str, Any]] = [
        ("time", time),
        ("torch", torch),
        ("torch.cuda", torch.cuda),
        ("torch.Tensor", torch.Tensor),
        ("flashtune.timing", timing),
        ("flashtune.bench.sandbox", sys.modules[__name__]),
    ]
    if hasattr(torch.cuda, "Event"):
        spaces += [
            ("torch.cuda.Event", torch.cuda.Event),
            ("torch.cuda.CUDAGraph", torch.cuda.CUDAGraph),
            ("torch.cuda.Stream", torch.cuda.Stream),
        ]
    return spaces


def _is_guarded(value: Any) -> bool:
    """Functions, classes and modules: what a patch replaces (flags and counters change
    legitimately)."""
    return callable(value) or isinstance(value, type(time))


def _snapshot() -> dict[str, dict[str, Any]]:
    return {
        label: {k: v for k, v in list(vars(space).items()) if _is_guarded(v)}
        for label, space in _guarded()
    }


# Namespaces where a new name is tampering too (it shadows an inherited C method, e.g.
# `torch.Tensor.fill_ = ...`); torch and torch.cuda grow lazily loaded names legitimately.
_CLOSED = ("time", "torch.Tensor", "flashtune.timing", "flashtune.bench.sandbox")


def _tampered(before: dict[str, dict[str, Any]]) -> list[str]:
    """Names of guarded functions that were replaced, removed or added since `before`."""
    changed = []
    for label, space in _guarded():
        now = vars(space)
        old = before.get(label, {})
        for k, v in old.items():
            if now.get(k) is not v:
                changed.append(f"{label}.{k}")
        if label in _CLOSED:
            for k, v in list(now.items()):
                if k not in old and _is_guarded(v):
                    changed.append(f"{label}.{k}")
    return changed


# --------------------------------------------------------------------------- the child


@dataclass(frozen=True)
class SandboxSpec:
    """What the child needs for one solution, whatever the workload (trusted, from the
    worker; JSON texts so the child validates them with the same models)."""

    definition: str
    solution: str
    device: str
    config: dict[str, Any]
    roots: tuple[str, ...]
    log_path: str


@dataclass(frozen=True)
class SandboxJob:
    """One workload for a sandbox's solution (sent by the worker; trusted)."""

    workload: str
    seeds: tuple[int, ...]  # one input set per seed; set 0 is the correctness set
    swap_seed: int | None  # float values written into set 0 in place after timing
    stochastic: bool
    # CPU only: the worker's own working copies in shared memory (set i, then the swap
    # values). The child writes into the very tensors the worker checks, and nothing large
    # is synthesized twice or sent back by value. None: the child synthesizes from seeds.
    shared_sets: list[dict[str, Any]] | None = None
    shared_swap: dict[str, Any] | None = None


def float_input_names(inputs: Mapping[str, Any]) -> list[str]:
    """The inputs rewritten in place by the swap check: floating-point tensors (values), not
    index tensors (a plan made from them stays valid)."""
    return [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]


# The C methods themselves, bound before any solution is imported.
_fill = torch._C.TensorBase.fill_
_copy = torch._C.TensorBase.copy_


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
        self.conn.send_bytes(pickle.dumps((kind, _encode(payload))))

    def send_and_wait(self, kind: str, payload: Any) -> None:
        self.send(kind, payload)
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            reply = None
        if reply != "ack":
            self.linger()  # the worker has its verdict: nothing more to do

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
        for pid in _descendants(os.getpid()):
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
        from flashtune.bench.evaluate import BenchConfig
        from flashtune.data.dataset import Dataset
        from flashtune.data.models import Definition, Solution

        job = self.next_job()
        spec = self.spec
        self.device = torch.device(spec.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.cuda.init()
        self.definition = Definition.model_validate_json(spec.definition)
        self.cfg = BenchConfig(**spec.config)
        self.blob_root = Dataset([Path(r) for r in spec.roots]) if spec.roots else None
        sol = Solution.model_validate_json(spec.solution)
        self.dps = sol.spec.destination_passing_style
        self.mark("cuda init" if self.device.type == "cuda" else "start")
        self.before = _snapshot()
        try:
            check_requirements(sol, self.device)
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
            self.run_job(job)
            self.send("done", {"phases_s": self.marks})
            self.marks, self.started = {}, time.perf_counter()
            job = self.next_job()

    def next_job(self) -> SandboxJob:
        try:
            job = self.conn.recv()
        except (EOFError, OSError):
            job = None
        if not isinstance(job, SandboxJob):
            self.linger()
        if self.device_freed is False and torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # the last job's inputs: room for this one's
        self.device_freed = True
        return job

    device_freed: bool | None = None  # None: no job run yet

    def check_tamper(self, step: str) -> None:
        changed = _tampered(self.before)
        if changed:
            self.status(
                "TAMPERED",
                f"{step}: the solution replaced harness functions: {', '.join(changed[:8])}",
            )
            self.linger()

    def run_job(self, job: SandboxJob) -> None:
        from flashtune.data.models import Workload
        from flashtune.data.synth import resolve_axes, synthesize_inputs, torch_dtype

        self.device_freed = False
        definition, device, cfg, fn = self.definition, self.device, self.cfg, self.fn
        workload = Workload.model_validate_json(job.workload)
        axes = resolve_axes(definition, workload)

        def synth(seed: int) -> dict[str, Any]:
            return synthesize_inputs(
                definition, workload, device=device, seed=seed, blob_root=self.blob_root
            )

        shared = job.shared_sets is not None
        if shared:
            sets = [dict(x) for x in job.shared_sets or []]
            swap = job.shared_swap
        else:
            sets = [synth(s) for s in job.seeds]
            swap = synth(job.swap_seed) if job.swap_seed is not None else None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.check_tamper("inputs")
        self.mark("inputs")

        dps = self.dps
        names = list(definition.inputs)
        out_names = list(definition.outputs)

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

        def inputs_of(args: Sequence[Any]) -> dict[str, Any] | None:
            if shared:  # the worker reads its shared tensors itself
                return None
            return dict(zip(names, args[: len(names)], strict=False))

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        arg_sets = [args_of(s) for s in sets]
        setup = getattr(fn, "setup", None)
        runners: list[Callable[..., Any]] = []
        for args in arg_sets:
            runners.append(setup(*args) if callable(setup) else fn)
        sync()
        self.check_tamper("setup")

        # 3. correctness on set 0
        args0 = arg_sets[0]
        _poison_all(args0[len(names) :])
        with torch.no_grad():
            result = runners[0](*args0)
        sync()
        self.check_tamper("first call")
        self.mark("setup + first call")
        first = {"index": 0, "outputs": outputs_of(args0, result), "inputs": inputs_of(args0)}
        self.send_and_wait("outputs", {"phase": "first", "sets": [first]})
        del result, first

        if job.stochastic:
            draws = []
            with torch.no_grad():
                for _ in range(cfg.sampling_draws):
                    draws.append(outputs_of(args0, runners[0](*args0)))
                    if dps:  # the next draw must not overwrite this one
                        draws[-1] = {k: v.clone() for k, v in draws[-1].items()}
            sync()
            self.send_and_wait("outputs", {"phase": "draws", "draws": draws})
            del draws

        # 4. timing, 5./6. checks while the timed work still exists
        from flashtune.timing import cold_l2_sets, measure_robust

        # Timed sets: the distinct sets, then clones for a cold L2 (set i copies set
        # i mod distinct, and is run by that set's runner).
        distinct = len(arg_sets)
        timed = cold_l2_sets(arg_sets, device)
        by_first = {id(args[0]): runners[i % distinct] for i, args in enumerate(timed)}
        if callable(setup):

            def timed_fn(*args: Any) -> Any:
                return by_first[id(args[0])](*args)
        else:
            timed_fn = fn
        calls = _TimedCalls(timed, distinct, len(names), timed_fn, outputs_of, inputs_of, sync)

        def after(replay: Callable[[], None] | None, results: dict[int, Any]) -> None:
            self.check_after_timing(calls, replay, results, swap, names)

        with torch.no_grad():
            timing = measure_robust(
                timed_fn,
                timed[0],
                input_sets=timed,
                method=cfg.timing_method,  # type: ignore[arg-type]
                warmup=cfg.warmup,
                warmup_ms=cfg.warmup_ms,
                repetitions=cfg.iterations,
                trial_ms=cfg.trial_ms,
                trials=cfg.trials,
                target_sample_ms=cfg.target_sample_ms,
                max_seconds=cfg.max_seconds,
                after=after,
            )
        self.check_tamper("timing")
        self.mark("timing + checks")
        self.send("timing", asdict(timing))

    def check_after_timing(
        self,
        calls: _TimedCalls,
        replay: Callable[[], None] | None,
        results: dict[int, Any],
        swap: Mapping[str, Any] | None,
        names: Sequence[str],
    ) -> None:
        timed, distinct = calls.timed, calls.distinct

        def run_all() -> dict[int, Any]:
            for args in timed:
                _poison_all(args[calls.n_inputs :])
            for r in results.values():
                _poison_all(r)
            got: dict[int, Any] = {}
            if replay is not None:
                replay()
                got = {i: calls.outputs_of(timed[i], results[i]) for i in results}
            with torch.no_grad():
                for i in range(distinct):
                    if i not in got:  # not covered by the graph (fewer calls than sets)
                        got[i] = calls.outputs_of(timed[i], calls.fn(*timed[i]))
            calls.sync()
            return got

        got = run_all()
        sets = [
            {
                "index": i % distinct,
                "outputs": got[i] if i < distinct else None,
                "inputs": calls.inputs_of(timed[i]),
            }
            for i in range(len(timed))
        ]
        self.send_and_wait("outputs", {"phase": "timed", "sets": sets})
        del got, sets
        if swap is None:
            return
        for name in float_input_names(swap):
            _copy(timed[0][names.index(name)], swap[name])
        calls.sync()
        got = run_all()
        self.send_and_wait(
            "outputs", {"phase": "swap", "sets": [{"index": 0, "outputs": got[0], "inputs": None}]}
        )


@dataclass(frozen=True)
class _TimedCalls:
    """What was timed, for the checks after timing: the argument lists (distinct sets
    first, then cold-L2 clones), the callable, and how to read outputs and inputs."""

    timed: list[list[Any]]
    distinct: int
    n_inputs: int
    fn: Callable[..., Any]
    outputs_of: Callable[[Sequence[Any], Any], Any]
    inputs_of: Callable[[Sequence[Any]], dict[str, Any] | None]
    sync: Callable[[], None]


def _become_group_leader() -> None:
    """Own process group and session, and reap orphans: the worker kills the whole tree."""
    with contextlib.suppress(OSError):
        os.setsid()
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _child_main(conn: Any, spec: SandboxSpec) -> None:
    _become_group_leader()
    # The solution's prints and the harness's tracebacks go to a file the worker reads,
    # also when the child dies.
    fd = os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    child = _Child(conn, spec)
    try:
        child.serve()
    except BaseException as exc:  # noqa: BLE001 - the solution's failure is the result
        traceback.print_exc()
        with contextlib.suppress(Exception):
            child.status("RUNTIME_ERROR", f"{type(exc).__name__}: {str(exc)[:500]}")
    child.linger()  # never returns: no atexit handlers, no threads of the solution run on


# --------------------------------------------------------------------------- the worker side


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


_CONTEXT: Any = None
_CONTEXT_LOCK = threading.Lock()


def _context() -> Any:
    """A fork server that has imported the harness, torch and flashtune's ops (never CUDA):
    a child starts as a fork of it in milliseconds."""
    global _CONTEXT
    with _CONTEXT_LOCK:
        if _CONTEXT is None:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(
                [
                    __name__,
                    "flashtune.bench.evaluate",
                    "flashtune.dataset.entry_points",
                    "flashtune.ops.norm",
                    "flashtune.ops.activation",
                    "flashtune.ops.rope",
                    "flashtune.ops.gemm",
                    "flashtune.ops.attention",
                ]
            )
            _CONTEXT = ctx
        return _CONTEXT


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid`, and every process still in its session or group
    (a child that left the tree with setsid() is still found while the sandbox lives)."""
    children: dict[int, list[int]] = {}
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) < 4:
            continue
        ppid, pgrp, session = int(fields[1]), int(fields[2]), int(fields[3])
        children.setdefault(ppid, []).append(int(entry))
        if (pgrp == pid or session == pid) and int(entry) != pid:
            members.append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return sorted(found | set(members))


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
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
        ctx = _context()
        parent, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=_child_main, args=(child, spec), name="flashtune-sandbox", daemon=False
        )
        with _main_hidden():
            self.process.start()
        child.close()
        self.conn = parent

    def start(self, job: SandboxJob) -> None:
        """Send the next workload. Only to a child that finished its last job ("done"): it
        is then waiting for this message, so the send cannot block on a busy child."""
        self.job = job
        self.jobs += 1
        try:
            self.conn.send(job)
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
                kind, payload = _loads(data)
                if not isinstance(kind, str):
                    raise ValueError("malformed message from the sandbox")
                return kind, _decode(payload)
            if self.process.sentinel in ready:
                # Messages sent just before exiting are still in the pipe.
                if self.conn.poll(0):
                    continue
                raise SandboxDied(self._exit_text())

    def ack(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send("ack")

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

    def close(self) -> None:
        """Kill the child and everything it started; remove its log."""
        pid = self.process.pid
        if pid is not None:
            for _ in range(3):  # children may fork while we kill: a few rounds
                victims = _descendants(pid)
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


def open_sandbox(spec_without_log: dict[str, Any]) -> Sandbox:
    fd, log_path = tempfile.mkstemp(prefix="flashtune-sandbox-", suffix=".log")
    os.close(fd)
    return Sandbox(SandboxSpec(**spec_without_log, log_path=log_path))


class SandboxPool:
    """The worker's live sandboxes, one per solution, kept across the workloads of a
    definition: a solution's process is reused only after a job it finished cleanly (a
    failure, a timeout or a kill ends it), and at most `size` stay alive."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._live: dict[tuple[Any, ...], Sandbox] = {}

    def get(self, spec_without_log: dict[str, Any]) -> Sandbox:
        key = tuple(
            json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
            for v in (spec_without_log[k] for k in sorted(spec_without_log))
        )
        sandbox = self._live.pop(key, None)
        if sandbox is None or not sandbox.process.is_alive():
            if sandbox is not None:
                sandbox.close()
            sandbox = open_sandbox(spec_without_log)
        self._live[key] = sandbox  # most recently used last
        while len(self._live) > self.size:
            self._live.pop(next(iter(self._live))).close()
        return sandbox

    def discard(self, sandbox: Sandbox) -> None:
        """End a sandbox whose last job did not finish cleanly."""
        for key, live in list(self._live.items()):
            if live is sandbox:
                del self._live[key]
        sandbox.close()

    def keep_only(self, definition: str) -> None:
        """Close the sandboxes of other definitions (the worker moved on)."""
        for key, live in list(self._live.items()):
            if live.spec.definition != definition:
                del self._live[key]
                live.close()

    def close(self) -> None:
        for live in self._live.values():
            live.close()
        self._live.clear()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

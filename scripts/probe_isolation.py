"""Probe the solutions' sandbox (src/flashtune/bench/isolation.py) on a GPU machine: inside it
CUDA, CUDA IPC to the worker, shared CPU tensors and Triton (warm from the shared cache, and
cold) keep working, and the escapes stay blocked. One line per check; exit status 1 if any
check fails.

    PYTHONPATH=$PWD/src python3 scripts/probe_isolation.py

It needs torch with a GPU and Triton, not the rest of flashtune's dependencies. The process
plays the worker (hardened, a fork server that imported torch and hardens itself); each
probe is a child of that fork server that enters the sandbox first, like a solution's
sandbox. Variants widen one Landlock rule (all of /proc, all of /dev writable) to pinpoint
what CUDA needs if the default fails; "off" is FLASHTUNE_SANDBOX=0, the baseline for the
overhead figures.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from multiprocessing import forkserver
from typing import Any

import torch
import triton
import triton.language as tl

from flashtune.bench import isolation, process_tree
from flashtune.bench.messages import decode, encode


@triton.jit
def _add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, tl.load(x + offsets, mask=mask) + tl.load(y + offsets, mask=mask), mask)


@triton.jit
def _mul_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, tl.load(x + offsets, mask=mask) * tl.load(y + offsets, mask=mask), mask)


def _launch(kernel: Any, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    kernel[(triton.cdiv(x.numel(), 1024),)](x, x, out, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
    return out


def _attempt(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the outcome is the answer
        return f"blocked ({type(exc).__name__}: {str(exc)[:80]})"
    return "ALLOWED"


def _widen(variant: str) -> None:
    """Monkeypatch this process (a probe child) for a variant: "proc", "dev" (writable),
    "reads" (all of / readable) widen a Landlock rule; "no-<layer>" skips a layer."""
    confine = isolation.confine
    rules = isolation._landlock_rules
    parts = variant.split("+")

    def widened(scratch: Any, reads: Any, writes: Any, abi: int) -> list[tuple[str, int]]:
        full = confine.landlock_rights(abi)
        extra = [("/proc", full)] if "proc" in parts else []
        extra += [("/dev", full)] if "dev" in parts else []
        extra += [("/", confine.FS_READ)] if "reads" in parts else []
        return rules(scratch, reads, writes, abi) + extra

    def refuse(*_: Any, **__: Any) -> Any:
        raise OSError(1, "skipped by the probe")

    isolation._landlock_rules = widened  # type: ignore[assignment]
    skips = {
        "no-seccomp": "install_seccomp",
        "no-caps": "drop_capabilities",
        "no-userns": "enter_user_namespace",
    }
    for part, name in skips.items():
        if part in parts:
            setattr(confine, name, refuse)
    if "no-landlock" in parts:
        confine.landlock_abi = lambda: 0  # type: ignore[assignment]


def child(conn: Any, scratch: str, variant: str, targets: dict[str, Any]) -> None:
    """A probe sandbox: isolate, then CUDA, IPC, shared memory, Triton, escapes."""
    results: dict[str, Any] = {}
    try:
        if variant == "off":
            os.environ["FLASHTUNE_SANDBOX"] = "0"
        elif variant != "default":
            _widen(variant)
        started = time.perf_counter()
        report = isolation.enter_sandbox(scratch, ())
        isolation.set_fd_channel(conn)
        results["report"] = report
        t = time.perf_counter()
        torch.cuda.init()
        x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        torch.cuda.synchronize()
        results["cuda_init_s"] = round(time.perf_counter() - t, 3)
        results["start_to_cuda_s"] = round(time.perf_counter() - started, 3)
        conn.send_bytes(pickle.dumps(("tensor", encode(x * 2))))  # CUDA IPC to the parent
        conn.recv()  # the parent copied it
        shared = conn.recv()  # a shared CPU tensor, its memory passed as a file descriptor
        results["cpu_shared_sum"] = float(shared.sum())
        t = time.perf_counter()
        warm = _launch(_add_kernel, x)  # compiled by the parent: the shared cache has it
        results["triton_warm_s"] = round(time.perf_counter() - t, 3)
        results["triton_warm_ok"] = bool(torch.equal(warm, x + x))
        t = time.perf_counter()
        cold = _launch(_mul_kernel, x)  # compiled here, into the scratch
        results["triton_cold_s"] = round(time.perf_counter() - t, 3)
        results["triton_cold_ok"] = bool(torch.equal(cold, x * x))
        parent = os.getppid()
        escapes = {
            "write /tmp": lambda: open("/tmp/probe-escape", "w"),
            "write flashtune's sources": lambda: open(
                os.path.join(os.path.dirname(isolation.__file__), "probe-escape.py"), "w"
            ),
            "read the cache's key": lambda: open(targets["key"]).read(),
            "write the shared Triton cache": lambda: open(
                os.path.join(targets["triton"], "probe-escape"), "w"
            ),
            "signal the fork server": lambda: os.kill(parent, 0),
            "signal the worker": lambda: os.kill(targets["worker"], 0),
            "open the worker's /proc/<pid>/mem": lambda: open(
                f"/proc/{targets['worker']}/mem", "rb"
            ),
            "connect to the fork server": lambda: socket.socket(socket.AF_UNIX).connect(
                targets["forkserver"]
            ),
            "TCP to the worker": lambda: socket.create_connection(
                ("127.0.0.1", targets["port"]), timeout=2
            ),
            "write /proc/sys": lambda: open("/proc/sys/kernel/core_pattern", "r+"),
            "read /etc/shadow": lambda: open("/etc/shadow").read(),
        }
        disk = targets.get("disk")
        if disk:
            escapes[f"read the raw disk {disk}"] = lambda: open(disk, "rb").read(512)
        if variant != "off":  # unsandboxed, an escape would really write
            results["escapes"] = {name: _attempt(fn) for name, fn in escapes.items()}
        # The shared caches under overlays: read what is there, write into the scratch.
        results["shared_caches"] = report.get("shared_caches")
        layered = {
            "read a warm FlashInfer build": lambda: open(targets["fi_warm"], "rb").read(),
            "write FlashInfer's cache (into the overlay)": lambda: open(
                os.path.join(os.path.dirname(targets["fi_warm"]), "new.so"), "w"
            ).write("x"),
            "overwrite a shared build (into the overlay)": lambda: open(
                targets["build_victim"], "w"
            ).write("POISON"),
        }
        if variant != "off":
            results["overlays"] = {name: _attempt(fn) for name, fn in layered.items()}
        results["scratch_triton_files"] = sum(
            len(files) for _, _, files in os.walk(os.path.join(scratch, "triton"))
        )
    except BaseException:  # noqa: BLE001 - reported
        results["error"] = traceback.format_exc()[-3000:]
    conn.send_bytes(pickle.dumps(("results", results)))
    conn.recv()


def _print(status: str, name: str, detail: Any = "") -> None:
    print(f"{status:4} {name}: {detail}", flush=True)


def _disk() -> str | None:
    for name in sorted(os.listdir("/sys/block")):
        if not name.startswith(("loop", "ram", "zram")) and os.path.exists(f"/dev/{name}"):
            return f"/dev/{name}"
    return None


def run_probe(ctx: Any, variant: str, targets: dict[str, Any]) -> dict[str, Any] | None:
    scratch = tempfile.mkdtemp(prefix="flashtune-probe-")
    parent_end, child_end = ctx.Pipe(duplex=True)
    process = ctx.Process(target=child, args=(child_end, scratch, variant, targets))
    process.start()
    child_end.close()
    failed = False
    results: dict[str, Any] | None = None
    try:
        while results is None:
            if not parent_end.poll(300):
                _print("FAIL", f"[{variant}] probe", "no answer in 300 s")
                return None
            kind, payload = pickle.loads(parent_end.recv_bytes())
            if kind == "tensor":
                got = decode(payload)
                ok = torch.equal(got, torch.arange(1 << 20, device="cuda").float() * 2)
                _print("PASS" if ok else "FAIL", f"[{variant}] CUDA IPC sandbox -> worker", ok)
                failed |= not ok
                parent_end.send("ack")
                isolation.send_with_fds(parent_end, torch.ones(1000).share_memory_())
            else:
                results = payload
                parent_end.send("done")
    finally:
        process.join(30)
        if process.is_alive():
            process_tree.kill_tree(process.pid)
    results["failed"] = failed
    return results


def report_variant(variant: str, results: dict[str, Any] | None) -> bool:
    """Print the variant's lines; -> whether every check passed."""
    if results is None:
        return False
    if "error" in results:
        _print("FAIL", f"[{variant}] sandbox", results["error"].strip().splitlines()[-1])
        print(results["error"], flush=True)
        return False
    report = results["report"]
    ok = not results["failed"]
    _print("INFO", f"[{variant}] report", isolation.describe(report))
    if report.get("errors"):
        _print("INFO", f"[{variant}] errors", report["errors"])
    _print("INFO", f"[{variant}] enter_sandbox", f"{report['enter_ms']} ms")
    _print("INFO", f"[{variant}] CUDA init in the sandbox", f"{results['cuda_init_s']} s")
    for name in ("cpu_shared_sum", "triton_warm_ok", "triton_cold_ok"):
        good = results[name] == 1000.0 if name == "cpu_shared_sum" else results[name]
        _print("PASS" if good else "FAIL", f"[{variant}] {name}", results[name])
        ok &= bool(good)
    _print(
        "INFO",
        f"[{variant}] Triton warm / cold",
        f"{results['triton_warm_s']} s / "
        f"{results['triton_cold_s']} s; files compiled in the scratch: "
        f"{results['scratch_triton_files']}",
    )
    for name, outcome in results.get("escapes", {}).items():
        good = outcome.startswith("blocked")
        _print("PASS" if good else "FAIL", f"[{variant}] {name}", outcome)
        ok &= good
    if "overlays" in results:
        _print("INFO", f"[{variant}] shared caches", results["shared_caches"])
        for name, outcome in results["overlays"].items():
            _print("PASS" if outcome == "ALLOWED" else "FAIL", f"[{variant}] {name}", outcome)
            ok &= outcome == "ALLOWED"
    return ok


def main() -> int:
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    work = tempfile.mkdtemp(prefix="flashtune-probe-home-")
    os.environ["FLASHTUNE_CACHE_DIR"] = os.path.join(work, "cache")
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(work, "triton"))
    key = os.path.join(work, "cache", "apply", "table.key")
    os.makedirs(os.path.dirname(key))
    with open(key, "w") as f:
        f.write("not for solutions")
    # Shared caches with an entry each: FlashInfer's JIT workspace, flashtune's builds.
    os.environ["FLASHINFER_WORKSPACE_BASE"] = os.path.join(work, "fi")
    fi_warm = os.path.join(work, "fi", ".cache", "flashinfer", "cached_ops", "warm.so")
    build_victim = os.path.join(work, "cache", "build", "victim", "lib.so")
    for path in (fi_warm, build_victim):
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as f:
            f.write("original")
    isolation.harden_harness()
    process_tree.become_reaper()
    _print(
        "INFO",
        "machine",
        f"{os.uname().release}, uid {os.getuid()}, "
        f"torch {torch.__version__}, triton {triton.__version__}",
    )
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "torch", "triton", isolation.__name__])
    with isolation.marked_for_forkserver():
        forkserver.ensure_running()
    torch.cuda.init()
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    _launch(_add_kernel, x)  # into the shared Triton cache: warm for the probes
    before = sorted(os.listdir(os.environ["TRITON_CACHE_DIR"]))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    targets = {
        "key": key,
        "triton": os.environ["TRITON_CACHE_DIR"],
        "worker": os.getpid(),
        "port": listener.getsockname()[1],
        "disk": _disk(),
        "forkserver": forkserver._forkserver._forkserver_address,
        "fi_warm": fi_warm,
        "build_victim": build_victim,
    }
    ok = report_variant("default", run_probe(ctx, "default", targets))
    if not ok:  # which layer or rule does CUDA need?
        variants = sys.argv[1:] or ["proc+dev", "reads", "no-seccomp", "no-caps", "no-landlock"]
        for variant in variants:
            report_variant(variant, run_probe(ctx, variant, targets))
    after = sorted(os.listdir(os.environ["TRITON_CACHE_DIR"]))
    same = before == after
    _print("PASS" if same else "FAIL", "shared Triton cache untouched by the sandboxes", same)
    ok &= same
    with open(build_victim) as f:
        same = f.read() == "original"
    same &= sorted(os.listdir(os.path.dirname(fi_warm))) == ["warm.so"]
    _print("PASS" if same else "FAIL", "shared build and FlashInfer caches untouched", same)
    ok &= same
    report_variant("off", run_probe(ctx, "off", targets))  # the baseline, unsandboxed
    _print("PASS" if ok else "FAIL", "all checks", "")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Helpers shared by the GPU benchmarks: result rows and the measured copy bandwidth."""

from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from flashtune import platform
from flashtune.timing import measure

RESULTS = Path(__file__).resolve().parent / "results"
# This benchmark process's start: every row it writes, through any RowWriter, carries it.
RUN_STARTED = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, Any]:
    snap = platform.snapshot(run_started=RUN_STARTED)
    try:
        import flashinfer

        snap["flashinfer"] = flashinfer.__version__
    except Exception:
        snap["flashinfer"] = None
    return snap


class RowWriter:
    """Appends one JSON line per measurement to benchmarks/results/<name>.jsonl and,
    when $OUT is set (the GPU machine), to $OUT/<name>.jsonl as well."""

    def __init__(self, name: str, environment: dict[str, Any] | None = None) -> None:
        """`environment`: the platform snapshot of the run that measured (a Trace's
        evaluation.environment) when the rows are derived from traces on another machine;
        by default this process's own."""
        self.paths = [RESULTS / f"{name}.jsonl"]
        if os.environ.get("OUT"):
            self.paths.append(Path(os.environ["OUT"]) / f"{name}.jsonl")
        env = environment if environment is not None else versions()
        code = env["code"]
        self.common = {
            "gpu": env["hardware"],
            "versions": {
                k: env.get(k)
                for k in ("torch", "triton", "cuda", "driver", "flashtune", "flashinfer")
            },
            # The measured code, computed by platform.code_provenance (rows written before
            # issue 11 say "unknown"): git tree, commit, dirty flag and the hash of flashtune's
            # sources; "source" says git, env or files. The GPU machine's copy has a stale or
            # no .git: the caller names the commit there (FLASHTUNE_BENCH_COMMIT, passed on by
            # scripts/gpu_session.sh), "source": "env", and "files" is what a checkout of that
            # commit must reproduce. Without either, "commit" is the sources' hash.
            "commit": code["commit"] or f"files:{code['files'][:12]}",
            "code": code,
            "run_started": env["run_started"],
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        for p in self.paths:
            p.parent.mkdir(parents=True, exist_ok=True)

    def write(
        self, op: str, shape: dict[str, Any], solution: str, latency_ms: float | None, **extra: Any
    ) -> dict:
        """Append one row; latency_ms is None for a row that timed nothing (a failed run, a
        summary)."""
        row = {
            "op": op,
            "shape": shape,
            "solution": solution,
            "latency_ms": latency_ms,
            **extra,
            **self.common,
        }
        line = json.dumps(row) + "\n"
        for p in self.paths:
            with open(p, "a") as f:
                f.write(line)
        return row


def fresh_inputs(args: list[Any]) -> list[Any]:
    """The same argument list with new random values in every float tensor (index and other
    tensors cloned, the rest kept): a selection is re-measured on inputs it was not chosen on
    (issue 11: "selection is not measurement")."""
    return [
        (torch.randn_like(a) if a.is_floating_point() else a.clone())
        if isinstance(a, torch.Tensor)
        else a
        for a in args
    ]


class Selection:
    """Selection and measurement in separate processes (issue 11: selection is not
    measurement).

    A benchmark with a tactic sweep runs twice. The first process selects: it times every
    tactic of every shape, keeps each shape's pick and writes no row. It then starts the same
    script again (`measure_in_fresh_process`, with `--picks FILE`); that process measures:
    each shape's pick is timed once on fresh inputs and published as the "tuned" figure, the
    sweep's latency kept beside it as `selection_ms`. Nothing of the selection (its inputs,
    its allocator or L2 state, a lucky sample) reaches the published number."""

    def __init__(self, picks_path: str | None, sweep: bool) -> None:
        self.sweep = sweep
        self.measuring = picks_path is not None
        self.picks: dict[str, dict[str, Any]] = (
            json.loads(Path(picks_path).read_text()) if picks_path else {}
        )

    @property
    def selecting(self) -> bool:
        return self.sweep and not self.measuring

    def record(self, key: str, tactic: Any, selection_ms: float) -> None:
        self.picks[key] = {"tactic": str(tactic), "selection_ms": selection_ms}

    def lookup(self, key: str, tactics: Iterable[Any]) -> tuple[Any, float]:
        """The tactic picked for `key` (matched by its text among `tactics`) and its
        selection-pass latency."""
        entry = self.picks[key]
        for tactic in tactics:
            if str(tactic) == entry["tactic"]:
                return tactic, float(entry["selection_ms"])
        raise KeyError(f"{key}: picked tactic {entry['tactic']!r} is not valid in this process")

    def measure_in_fresh_process(self, script: str) -> None:
        """Run `script` again with this process's arguments plus `--picks`."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "picks.json"
            path.write_text(json.dumps(self.picks))
            print(f"selection done ({len(self.picks)} picks); measuring in a fresh process")
            # Hand the selecting process's cached GPU memory back: the measuring process
            # shares the device (a MoE sweep's input sets had left it 3 GiB of 140).
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            subprocess.run(
                [sys.executable, script, *sys.argv[1:], "--picks", str(path)], check=True
            )


def try_peer(name: str, fn: Callable[[], Any]) -> bool:
    """Run a peer once (JIT compile, correctness); False and a message if it fails."""
    try:
        fn()
        torch.cuda.synchronize()
        return True
    except Exception as exc:
        print(f"  peer {name} unavailable: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        return False


def bench_pdl_chains(
    writer: RowWriter,
    op: str,
    libs: dict[str, Any],
    make_chain: Callable[[Any, bool], Callable[..., Any]],
    cases: Iterable[tuple[str, dict[str, Any], list[Any]]],
    kernels: int,
) -> None:
    """The --pdl benchmark of bench_norm.py and bench_elementwise.py: each chain of `kernels`
    back-to-back kernels timed with enable_pdl False and True, inside a CUDA graph and as eager
    launches, one row per (library, launch mode, pdl).

    libs: solution name -> module with FlashInfer's names (flashtune's ops module, FlashInfer's
    submodule); make_chain(lib, pdl) -> fn(*args); cases: (label printed, shape, args). L2
    stays warm: a chain's data is what its previous kernel just wrote."""
    from flashtune.ops import pdl as P

    if not P.use_pdl(torch.device("cuda"), True):
        print("PDL unsupported here (needs compute capability 9.0+, no interpreter)", flush=True)
        return
    for label, shape, args in cases:
        line = []
        for name, lib in libs.items():
            for graph in (True, False):
                ms = {}
                for pdl in (False, True):
                    fn = make_chain(lib, pdl)
                    if not try_peer(f"{name} pdl={pdl}", lambda fn=fn, args=args: fn(*args)):
                        break
                    ms[pdl] = measure(
                        fn, args, warmup=5, repetitions=30, cold_l2=False, use_cuda_graph=graph
                    ).median_ms
                if len(ms) < 2:
                    continue
                mode = "graph" if graph else "eager"
                for pdl, value in ms.items():
                    writer.write(
                        op,
                        shape,
                        f"{name}_{'pdl' if pdl else 'nopdl'}_{mode}",
                        value,
                        kernels=kernels,
                        pdl=pdl,
                        launch=mode,
                        speedup_of_pdl=round(ms[False] / ms[True], 3),
                    )
                line.append(
                    f"{name}/{mode} {ms[False] * 1e3:7.2f} -> {ms[True] * 1e3:7.2f}us "
                    f"({ms[False] / ms[True]:.3f}x)"
                )
        print(f"pdl chain {label}  " + "  ".join(line), flush=True)


def copy_bandwidth_gbs(nbytes: int = 2 * 2**30) -> float:
    """Read bandwidth of a large reduction (GB/s): a read-heavy kernel, the realistic
    ceiling for memory-bound kernels (torch's copy_ underestimates it)."""
    x = torch.randn(nbytes // 4, device="cuda", dtype=torch.float32)
    t = measure(lambda a: a.sum(), [x], warmup=5, repetitions=30, cold_l2=False)
    return nbytes / (t.median_ms * 1e-3) / 1e9


# The issue-3 GEMM table, shared by bench_gemm.py and bench_tune.py: the (N, K) of the
# corpus gemm definitions (../shared/flashinfer-trace/definitions/gemm/*.json, listed here
# because the GPU machine has no copy of the corpus) at these M, plus a few extra shapes.
GEMM_CORPUS_NK = [
    (10240, 8192),
    (128, 2048),
    (16384, 3072),
    (2048, 4096),
    (2048, 5376),
    (21504, 5376),
    (256, 3072),
    (256, 7168),
    (28672, 4096),
    (3072, 3072),
    (3072, 6144),
    (3072, 8192),
    (34816, 5120),
    (3584, 18944),
    (3584, 3584),
    (37888, 3584),
    (4096, 14336),
    (4096, 4096),
    (4096, 5376),
    (4608, 3584),
    (5120, 17408),
    (5120, 2048),
    (5120, 3072),
    (5120, 5120),
    (5376, 21504),
    (5376, 4096),
    (57344, 8192),
    (6144, 4096),
    (7168, 5120),
    (8192, 28672),
    (8192, 3072),
    (8192, 8192),
]
GEMM_CORPUS_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096)
GEMM_EXTRA_MNK = [(m, 11008, 4096) for m in (1, 17, 32, 256, 512)] + [(1, 1024, 8192)]


def profile_kernels(label: str, fn: Any, args: list[Any], reps: int = 5) -> None:
    """Each kernel's GPU time per call of `fn` (torch.profiler, eager, after a warm-up
    call): where a solution's time goes, beside the graph-timed total."""
    from torch.profiler import ProfilerActivity, profile

    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn(*args)
        torch.cuda.synchronize()
    rows = [(e.device_time_total / reps, e.count / reps, e.key) for e in prof.key_averages()
            if e.device_time_total > 0]  # fmt: skip
    for us, count, name in sorted(rows, reverse=True):
        print(f"  {label:10s} {us:9.1f} us  x{count:g}  {name[:90]}", flush=True)
    print(f"  {label:10s} {sum(r[0] for r in rows):9.1f} us  in all", flush=True)

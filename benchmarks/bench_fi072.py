"""flashtune vs FlashInfer 0.7.2.post1 on Hopper (issue 37), one process, every family.

Run in a shell that sourced scripts/flashinfer072.sh (the GPU machine, `.peer` carried): the
`flashinfer` it imports must be 0.7.x, else the script says so and exits 2.

    source scripts/flashinfer072.sh
    python benchmarks/bench_fi072.py [--only decode prefill sampling norm act] [--quick]
                                     [--budget-s SECONDS]
    bash scripts/gpu_session.sh fi072-bench      # the same in a subshell (FI072_BENCH_ARGS)

Both sides get the same inputs and the same timer (flashtune.timing.measure: cold L2 by
rotating input copies, a CUDA graph of 20 calls, median); FlashInfer is configured as its
users would configure it, planned outside the timed region:

- decode: Llama-3-8B-like GQA (32 query / 8 KV heads, head_dim 128), page 16, bf16 KV,
  batch {1, 16, 64, 256} x KV length {1k, 4k, 16k, 32k} (at most 2^22 KV tokens, 16 GiB).
  The peer is, per shape, the fastest 0.7.2 path that runs on sm_90: the decode wrapper
  with CUDA cores (use_tensor_cores=False: the fa2 decode kernel), with tensor cores
  (backend "fa2", what backend="auto" resolves to for bf16, and "fa3") and XQA
  (flashinfer.decode.xqa_batch_decode_with_kv_cache, where trtllm_batch_decode_with_kv_cache's
  backend="auto" leads on sm_90). flashtune: the planned wrapper (gated) and the plan-free call.
- prefill: paged (page 16, shuffled pages) and ragged, causal, qo_len = kv_len, batch
  {1, 4, 16} x {1k, 2k, 4k, 8k}; the peer's wrapper with backend="fa3" (gated) and "auto".
- sampling: top-k (50), top-p (0.9) and joint top-k/top-p at vocab 128256, batch
  {1, 16, 64, 256}, per-row parameters as device tensors (bench_sampling.py's inputs/checks).
- norm: rmsnorm and fused_add_rmsnorm, bf16, hidden {2048, 4096, 5120, 8192} x batch
  {256, 1024, 4096, 16384}, inputs above 1 MiB only (bench_norm.py's shape bench).
- act: silu_and_mul [T, 2d] -> [T, d], d {11008, 14336}, T {64, 1024, 4096, 16384}, inputs
  above 1 MiB only (bench_elementwise.py's shape bench).

Each peer path runs in its own try/except: a JIT build failure (FlashInfer compiles each CUDA
module on first use, 15-60 s) is printed and that path is left out of the rest of the run if
it never worked; a peer whose output disagrees with flashtune's is printed and not timed.
Prints per-shape ratios (peer latency / flashtune's) and each family's geomean, min and the
issue-37 gate; rows go to benchmarks/results/fi072_<family>.jsonl (and $OUT), each naming
the peer and its version (`peer`, `peer_version`, plus the versions every row carries).
--quick: a few shapes a family. --budget-s: a deadline checked before every shape; past it
the run stops cleanly with the summaries of what was measured (a shape under way finishes,
and its JIT builds with it: leave a minute or two of margin below the call's limit).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter, Selection, copy_bandwidth_gbs  # noqa: E402

FAMILIES = ("decode", "prefill", "sampling", "norm", "act")
PEER_SERIES = "0.7"

# Decode grid (bench_decode.py's model: HQ=32, HK=8, D=128, bf16).
DECODE_PAGE = 16
DECODE_BATCHES = (1, 16, 64, 256)
DECODE_KV_LENS = (1024, 4096, 16384, 32768)
DECODE_MAX_TOKENS = 2**22  # 16 GiB of bf16 KV at 8 heads x 128
DECODE_QUICK = ((1, 8192), (16, 4096), (64, 16384), (256, 1024))
# Prefill grid (bench_prefill.py's model: HQ=32, HKV=8, D=128, page 16, bf16).
PREFILL_BATCHES = (1, 4, 16)
PREFILL_SEQS = (1024, 2048, 4096, 8192)
PREFILL_QUICK = ((1, 8192), (4, 4096), (16, 1024))
# Sampling.
SAMPLING_OPS = ("top_k", "top_p", "joint")
SAMPLING_VOCAB = 128256
SAMPLING_BATCHES = (1, 16, 64, 256)
SAMPLING_QUICK_BATCHES = (1, 64)
SAMPLING_SCALES = (3.0, 8.0)  # flat (the bundled dataset's draws), peaked (LLM-like)
SAMPLING_QUICK_SCALES = (8.0,)
# Norms and activations: only inputs above this many bytes (the "above 1 MB").
MIN_INPUT_BYTES = 2**20
NORM_HIDDEN = (2048, 4096, 5120, 8192)
NORM_BATCHES = (256, 1024, 4096, 16384)
NORM_QUICK = ((4096,), (1024, 16384))
ACT_D = (11008, 14336)
ACT_TOKENS = (64, 1024, 4096, 16384)
ACT_QUICK = ((14336,), (1024, 16384))

OUTPUT_TOLERANCE = 2e-2  # max |peer - flashtune| of a bf16 attention output to time the peer
XQA_WORKSPACE_BYTES = 256 << 20  # 8 MiB semaphores + scratch, zeroed once (as 0.7.2 asks)


# ----------------------------------------------------------------------------- pure logic


@dataclass(frozen=True)
class Gate:
    """Issue 37's acceptance for one family: flashtune's speedup over the peer (peer
    latency / flashtune's) must have at least `geomean` as geomean (None: no geomean bar)
    and at least `minimum` at every shape."""

    geomean: float | None
    minimum: float

    def describe(self) -> str:
        parts = [f"geomean >= {self.geomean:g}"] if self.geomean is not None else []
        return ", ".join([*parts, f"min >= {self.minimum:g}"])

    def judge(self, ratios: Iterable[float]) -> dict[str, Any]:
        """n, geomean, min and passed (None with no ratio: nothing to judge)."""
        xs = [r for r in ratios if r > 0 and math.isfinite(r)]
        if not xs:
            return {"n": 0, "geomean": None, "min": None, "passed": None}
        geo = geomean(xs)
        low = min(xs)
        ok = low >= self.minimum and (self.geomean is None or geo >= self.geomean)
        return {"n": len(xs), "geomean": geo, "min": low, "passed": ok}


GATES = {
    "decode": Gate(1.05, 0.95),  # vs the best 0.7.2 path per shape
    "prefill_paged": Gate(1.0, 0.9),  # vs backend="fa3"
    "prefill_ragged": Gate(1.0, 0.9),
    "sampling": Gate(None, 1.5),  # every batch
    "norm": Gate(None, 1.0),  # every shape above 1 MB
    "act": Gate(None, 1.0),
}


def geomean(xs: Iterable[float]) -> float:
    vals = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else float("nan")


def peer_version_ok(version: str) -> bool:
    """True for a 0.7.x FlashInfer ("0.7.2.post1"; not "0.70" or "0.2.14")."""
    return version.split(".")[:2] == PEER_SERIES.split(".")


def best_path(times: Mapping[str, tuple[float, str]], method: str) -> tuple[str, float] | None:
    """The fastest peer path among those timed by `method` (name -> (ms, timing method)):
    a ratio only between figures timed alike. None when no path qualifies."""
    alike = {name: ms for name, (ms, how) in times.items() if how == method and ms > 0}
    if not alike:
        return None
    name = min(alike, key=lambda n: (alike[n], n))
    return name, alike[name]


class Deadline:
    """--budget-s: checked before every shape; None never expires."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.end = None if seconds is None else clock() + seconds

    def expired(self) -> bool:
        return self.end is not None and self._clock() >= self.end

    def left_s(self) -> float:
        return float("inf") if self.end is None else self.end - self._clock()


class PathHealth:
    """Which peer paths to still try: a path that failed before it ever worked (a JIT build
    or an unsupported configuration) is dropped for the rest of the run; one that failed
    after working (a shape it cannot run) is kept."""

    def __init__(self) -> None:
        self.worked: set[str] = set()
        self.dropped: dict[str, str] = {}

    def usable(self, name: str) -> bool:
        return name not in self.dropped

    def ok(self, name: str) -> None:
        self.worked.add(name)

    def failed(self, name: str, why: str) -> None:
        if name not in self.worked:
            self.dropped[name] = why


@dataclass
class Tally:
    """One gated comparison: flashtune's speedup per shape, judged by GATES[name]."""

    name: str
    vs: str  # what the ratios are against
    ratios: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    complete: bool = True

    def add(self, label: str, ratio: float) -> None:
        self.labels.append(label)
        self.ratios.append(ratio)

    def verdict(self) -> dict[str, Any]:
        return GATES[self.name].judge(self.ratios)

    def slowest(self) -> str | None:
        if not self.ratios:
            return None
        return self.labels[min(range(len(self.ratios)), key=self.ratios.__getitem__)]


# --------------------------------------------------------------------------- GPU plumbing


class PeerRows:
    """A RowWriter("fi072_<family>") whose every row names the peer and its version; any
    bench helper that takes a writer can take it."""

    def __init__(self, family: str, fi: Any) -> None:
        self.rows = RowWriter(f"fi072_{family}")
        self.peer = {"peer": "flashinfer", "peer_version": fi.__version__}

    def write(
        self, op: str, shape: dict[str, Any], solution: str, latency_ms: float | None, **extra: Any
    ) -> dict:
        return self.rows.write(op, shape, solution, latency_ms, **self.peer, **extra)


@dataclass
class Ctx:
    fi: Any
    quick: bool
    deadline: Deadline
    health: PathHealth = field(default_factory=PathHealth)
    tallies: list[Tally] = field(default_factory=list)
    _bw: float | None = None

    def bandwidth(self) -> float:
        if self._bw is None:
            self._bw = copy_bandwidth_gbs()
            print(f"copy bandwidth {self._bw:.0f} GB/s", flush=True)
        return self._bw

    def out_of_time(self, tallies: Iterable[Tally], where: str) -> bool:
        if not self.deadline.expired():
            return False
        print(f"budget reached: stopping {where}", flush=True)
        for t in tallies:
            t.complete = False
        return True


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _run_peer(
    ctx: Ctx, name: str, build: Callable[[], Callable[..., Any]], args: list[Any], ref: Any
) -> tuple[float, str, float] | None:
    """Build one peer path, check its output against flashtune's, time it: (ms, timing
    method, max abs diff) or None (reason printed)."""
    import bench_decode

    if not ctx.health.usable(name):
        return None
    try:
        fn = build()
        out = fn(*args)
        torch.cuda.synchronize()
        err = _err(out, ref)
        if not err <= OUTPUT_TOLERANCE:
            print(f"  {name}: output differs from flashtune's by {err:.3g}: not timed")
            return None
        ms, how = bench_decode._time_how(fn, args)
    except Exception as exc:  # one path (a JIT build, a plan) must not end the run
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"  peer {name} failed: {why}", flush=True)
        ctx.health.failed(name, why)
        return None
    ctx.health.ok(name)
    return ms, how, err


# --------------------------------------------------------------------------------- decode


def decode_shapes(quick: bool) -> list[tuple[int, int]]:
    if quick:
        return list(DECODE_QUICK)
    return [(b, kv) for b in DECODE_BATCHES for kv in DECODE_KV_LENS if b * kv <= DECODE_MAX_TOKENS]


def dense_block_table(indptr: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """[batch, max pages] int32 page table from CSR pages (XQA's layout; rows padded with
    page 0, past each request's length, never read)."""
    counts = (indptr[1:] - indptr[:-1]).tolist()
    table = torch.zeros(len(counts), max(counts), dtype=torch.int32, device=indices.device)
    for i, n in enumerate(counts):
        start = int(indptr[i])
        table[i, :n] = indices[start : start + n]
    return table


def decode_peer_builders(
    fi: Any, table: tuple[torch.Tensor, ...], kv_lens: list[int], ws: torch.Tensor, xqa_ws: Any
) -> dict[str, Callable[[], Callable[..., Any]]]:
    """Path name -> builder of fn(q, cache) for FlashInfer 0.7.2's sm_90 decode paths."""
    from bench_decode import DT, HK, HQ, D

    def wrapper(tensor_cores: bool, backend: str) -> Callable[[], Callable[..., Any]]:
        def build() -> Callable[..., Any]:
            w = fi.BatchDecodeWithPagedKVCacheWrapper(
                ws, "NHD", use_tensor_cores=tensor_cores, backend=backend
            )
            w.plan(*table, HQ, HK, D, DECODE_PAGE, q_data_type=DT, kv_data_type=DT)
            return lambda q, cache: w.run(q, cache)

        return build

    def xqa() -> Callable[..., Any]:
        from flashinfer.decode import xqa_batch_decode_with_kv_cache

        indptr, indices, _ = table
        block_tables = dense_block_table(indptr, indices)
        seq_lens = torch.tensor(kv_lens, dtype=torch.int32, device="cuda")
        if xqa_ws[0] is None:
            xqa_ws[0] = torch.zeros(XQA_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        scale = 1.0 / math.sqrt(D)

        def run(q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
            return xqa_batch_decode_with_kv_cache(
                q,
                cache,
                xqa_ws[0],
                block_tables,
                seq_lens,
                max(kv_lens),
                bmm1_scale=scale,
                bmm2_scale=1.0,
                kv_layout="NHD",
            )

        return run

    return {
        "flashinfer_cuda_core": wrapper(False, "auto"),
        "flashinfer_tc_fa2": wrapper(True, "fa2"),
        "flashinfer_tc_fa3": wrapper(True, "fa3"),
        "flashinfer_xqa": xqa,
    }


def bench_decode_family(ctx: Ctx) -> None:
    from bench_decode import HK, HQ, D, _ours, _setup, _time_how

    from flashtune.ops.attention.decode.plan_free import paged_decode

    rows = PeerRows("decode", ctx.fi)
    tally = Tally("decode", "best 0.7.2 path")
    ctx.tallies.append(tally)
    per_path: dict[str, list[float]] = {}
    planless_ratios: list[float] = []
    wins: dict[str, int] = {}
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    ws_fi = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    xqa_ws: list[torch.Tensor | None] = [None]
    for b, kv in decode_shapes(ctx.quick):
        if ctx.out_of_time([tally], "decode"):
            break
        lens = [kv] * b
        indptr, indices, last, cache, q = _setup(lens, DECODE_PAGE)
        table = (indptr, indices, last)
        shape = dict(batch=b, kv_len=kv, page_size=DECODE_PAGE, hq=HQ, hk=HK, d=D, kv_dtype="bf16")
        nbytes = 2 * b * kv * HK * D * cache.element_size()
        w = _ours(ws, table, DECODE_PAGE)
        ours = lambda q_, c_, w=w: w.run(q_, c_)  # noqa: E731
        ref = ours(q, cache)
        ms, how = _time_how(ours, [q, cache])
        planless = lambda q_, c_, t=table: paged_decode(q_, c_, *t)  # noqa: E731
        p_err = _err(planless(q, cache), ref)
        p_ms, p_how = _time_how(planless, [q, cache])
        peers: dict[str, tuple[float, str]] = {}
        builders = decode_peer_builders(ctx.fi, table, lens, ws_fi, xqa_ws)
        for name, build in builders.items():
            got = _run_peer(ctx, name, build, [q, cache], ref)
            if got is None:
                continue
            pms, phow, err = got
            peers[name] = (pms, phow)
            rows.write(
                "batch_decode",
                shape,
                name,
                pms,
                timing=phow,
                gbs=nbytes / (pms * 1e-3) / 1e9,
                max_abs_diff_vs_flashtune=err,
                speedup_of_flashtune=pms / ms if phow == how else None,
            )
            if phow == how:
                per_path.setdefault(name, []).append(pms / ms)
        best = best_path(peers, how)
        ratio = best[1] / ms if best else None
        ratio_p = best[1] / p_ms if best and p_how == how else None
        for sol, sms, show, r, extra in (
            ("flashtune", ms, how, ratio, {}),
            ("flashtune_planless", p_ms, p_how, ratio_p, {"max_abs_diff_vs_planned": p_err}),
        ):
            rows.write(
                "batch_decode",
                shape,
                sol,
                sms,
                timing=show,
                gbs=nbytes / (sms * 1e-3) / 1e9,
                best_peer_path=best[0] if best else None,
                best_peer_ms=best[1] if best else None,
                speedup_vs_best_peer=r,
                **extra,
            )
        if best and ratio:
            tally.add(f"b={b} kv={kv}", ratio)
            wins[best[0]] = wins.get(best[0], 0) + 1
        if ratio_p:
            planless_ratios.append(ratio_p)
        cells = "  ".join(
            f"{n.removeprefix('flashinfer_')} {t * 1e3:8.1f}" for n, (t, _) in peers.items()
        )
        print(
            f"decode b={b:4d} kv={kv:6d}  flashtune {ms * 1e3:8.1f} us (plan-free "
            f"{p_ms * 1e3:8.1f})  {cells}  best {best[0] if best else '-'}"
            f"  x{ratio if ratio else float('nan'):.3f}",
            flush=True,
        )
        del cache, q, w, builders
        torch.cuda.empty_cache()
    for name, xs in per_path.items():
        print(f"decode vs {name}: geomean x{geomean(xs):.3f}  min x{min(xs):.3f}  n={len(xs)}")
    if planless_ratios:
        print(
            f"decode plan-free call vs the best path: geomean x{geomean(planless_ratios):.3f}"
            f"  min x{min(planless_ratios):.3f}"
        )
    if wins:
        print(f"decode: best 0.7.2 path per shape {wins}")


# -------------------------------------------------------------------------------- prefill


def prefill_shapes(quick: bool) -> list[tuple[int, int]]:
    if quick:
        return list(PREFILL_QUICK)
    return [(b, s) for s in PREFILL_SEQS for b in PREFILL_BATCHES]


def _graph_ms(fn: Callable[..., Any], args: list[Any]) -> float:
    from bench_prefill import timeit

    return timeit(fn, args, graph=True)


def bench_prefill_family(ctx: Ctx) -> None:
    from bench_prefill import (
        HKV,
        HQ,
        PAGE,
        D,
        causal_flops,
        flashinfer_prefill,
        make_batch,
        ours,
        plan_free_fn,
    )

    rows = PeerRows("prefill", ctx.fi)
    tallies = {m: Tally(f"prefill_{m}", 'backend="fa3"') for m in ("paged", "ragged")}
    ctx.tallies.extend(tallies.values())
    vs_auto: dict[str, list[float]] = {"paged": [], "ragged": []}
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for b, s in prefill_shapes(ctx.quick):
        if ctx.out_of_time(tallies.values(), "prefill"):
            break
        x = make_batch(b, s)
        flops = causal_flops(x["lens"])
        base = dict(batch_size=b, qo_len=s, kv_len=s, num_qo_heads=HQ, num_kv_heads=HKV)
        base.update(head_dim=D, causal=True, dtype="bfloat16")
        for mode in ("paged", "ragged"):
            shape = dict(base, page_size=PAGE) if mode == "paged" else dict(base)
            op = f"prefill_{mode}"
            fn, args = ours(mode, x)
            ref = fn(*args)
            try:
                ms = _graph_ms(fn, args)
            except Exception as exc:
                print(f"{op} b={b} L={s}: flashtune not graph-timed: {exc!r}"[:300])
                continue
            pfn, pargs = plan_free_fn(mode, x)
            p_err = _err(pfn(*pargs), ref)
            p_ms = _graph_ms(pfn, pargs)
            peer_ms: dict[str, float] = {}
            resolved: dict[str, str] = {}
            for backend in ("fa3", "auto"):
                name = f"flashinfer_{backend}"
                if not ctx.health.usable(name):
                    continue
                try:
                    pf, pa, res = flashinfer_prefill(ctx.fi, mode, x, ws, backend)
                    resolved[backend] = res
                    same = [k for k, r in resolved.items() if k != backend and r == res]
                    if same and f"flashinfer_{same[0]}" in peer_ms:
                        # "auto" resolved to a backend already timed: the same kernel.
                        peer_ms[name] = peer_ms[f"flashinfer_{same[0]}"]
                        rows.write(
                            op,
                            shape,
                            name,
                            peer_ms[name],
                            resolved_backend=res,
                            same_as=f"flashinfer_{same[0]}",
                            cuda_graph=True,
                        )
                        continue
                    err = _err(pf(*pa), ref)
                    if not err <= OUTPUT_TOLERANCE:
                        print(f"  {name}: output differs from flashtune's by {err:.3g}")
                        continue
                    pms = _graph_ms(pf, pa)
                except Exception as exc:  # a JIT build failure of one backend
                    why = f"{type(exc).__name__}: {str(exc)[:300]}"
                    print(f"  peer {name} ({mode}) failed: {why}", flush=True)
                    ctx.health.failed(name, why)
                    continue
                ctx.health.ok(name)
                peer_ms[name] = pms
                rows.write(
                    op,
                    shape,
                    name,
                    pms,
                    resolved_backend=res,
                    tflops=flops / pms / 1e9,
                    max_abs_diff_vs_flashtune=err,
                    speedup_of_flashtune=pms / ms,
                    cuda_graph=True,
                )
            fa3 = peer_ms.get("flashinfer_fa3")
            auto = peer_ms.get("flashinfer_auto")
            for sol, sms, extra in (
                ("flashtune", ms, {}),
                ("flashtune_planless", p_ms, {"max_abs_diff_vs_planned": p_err}),
            ):
                rows.write(
                    op,
                    shape,
                    sol,
                    sms,
                    tflops=flops / sms / 1e9,
                    speedup_vs_fa3=fa3 / sms if fa3 else None,
                    speedup_vs_auto=auto / sms if auto else None,
                    auto_resolved_to=resolved.get("auto"),
                    cuda_graph=True,
                    **extra,
                )
            if fa3:
                tallies[mode].add(f"b={b} L={s}", fa3 / ms)
            if auto:
                vs_auto[mode].append(auto / ms)
            print(
                f"{op:14s} b={b:3d} L={s:5d}  flashtune {ms:8.3f} ms {flops / ms / 1e9:6.1f} TF/s"
                f" (plan-free {p_ms:8.3f})  fa3 {fa3 if fa3 else float('nan'):8.3f}"
                f"  auto({resolved.get('auto', '-')}) {auto if auto else float('nan'):8.3f}"
                f"  x{fa3 / ms if fa3 else float('nan'):.3f}",
                flush=True,
            )
        del x
        torch.cuda.empty_cache()
    for mode, xs in vs_auto.items():
        if xs:
            print(f"prefill {mode} vs backend=auto: geomean x{geomean(xs):.3f}  min x{min(xs):.3f}")


# ------------------------------------------------------------------------------- sampling


def bench_sampling_family(ctx: Ctx) -> None:
    import bench_sampling as S

    rows = PeerRows("sampling", ctx.fi)
    tally = Tally("sampling", "flashinfer")
    ctx.tallies.append(tally)
    batches = SAMPLING_QUICK_BATCHES if ctx.quick else SAMPLING_BATCHES
    scales = SAMPLING_QUICK_SCALES if ctx.quick else SAMPLING_SCALES
    for op in SAMPLING_OPS:
        for scale in scales:
            for batch in batches:
                if ctx.out_of_time([tally], "sampling"):
                    return
                torch.manual_seed(0)
                args = S.make_args(batch, SAMPLING_VOCAB, scale)
                allowed = S.support(op, args)
                shape = {"batch_size": batch, "vocab_size": SAMPLING_VOCAB, "logit_scale": scale}
                sols = S.solutions(op, ctx.fi)
                got: dict[str, tuple[float, str]] = {}
                for name in ("flashtune", "flashinfer"):
                    if name == "flashinfer" and not ctx.health.usable(f"flashinfer_{op}"):
                        continue
                    try:
                        S.check(sols[name], args, allowed)
                        got[name] = S.time_ms(sols[name], args)
                    except Exception as exc:
                        why = f"{type(exc).__name__}: {str(exc)[:300]}"
                        print(f"  {op} {shape} {name} failed: {why}", flush=True)
                        rows.write(op, shape, name, None, error=why)
                        if name == "flashinfer":
                            ctx.health.failed(f"flashinfer_{op}", why)
                        continue
                    if name == "flashinfer":
                        ctx.health.ok(f"flashinfer_{op}")
                ours, peer = got.get("flashtune"), got.get("flashinfer")
                alike = ours is not None and peer is not None and ours[1] == peer[1]
                ratio = peer[0] / ours[0] if alike and ours and peer else None
                for name, (ms, how) in got.items():
                    rows.write(
                        op,
                        shape,
                        name,
                        ms,
                        timing=how,
                        bytes=batch * SAMPLING_VOCAB * 4,
                        speedup_of_flashtune=ratio,
                    )
                if ratio:
                    tally.add(f"{op} s={scale:g} B={batch}", ratio)
                cells = "  ".join(f"{n} {ms * 1e3:8.1f} us ({how})" for n, (ms, how) in got.items())
                print(
                    f"sampling {op:6s} s={scale:g} B={batch:4d}  {cells}"
                    f"  x{ratio if ratio else float('nan'):.3f}",
                    flush=True,
                )


# ----------------------------------------------------------------------------- norm / act


def norm_shapes(quick: bool) -> list[tuple[int, int]]:
    hidden, batches = NORM_QUICK if quick else (NORM_HIDDEN, NORM_BATCHES)
    return [(h, b) for h in hidden for b in batches if b * h * 2 > MIN_INPUT_BYTES]


def act_shapes(quick: bool) -> list[tuple[int, int]]:
    ds, tokens = ACT_QUICK if quick else (ACT_D, ACT_TOKENS)
    return [(d, t) for d in ds for t in tokens if t * 2 * d * 2 > MIN_INPUT_BYTES]


def _norm_path(fi: Any) -> str | None:
    """Which 0.7.2 norm kernels run: its CUDA JIT ones, or the CuTe-DSL ones it prefers."""
    try:
        return "cuda_jit" if fi.norm._use_cuda_norm(torch.device("cuda")) else "cute_dsl"
    except Exception:
        return None


def bench_norm_family(ctx: Ctx) -> None:
    import bench_norm

    rows = PeerRows("norm", ctx.fi)
    tally = Tally("norm", "flashinfer")
    ctx.tallies.append(tally)
    bw = ctx.bandwidth()
    path = _norm_path(ctx.fi)
    print(f"flashinfer {ctx.fi.__version__} norm kernels: {path}")
    sel = Selection(None, sweep=False)  # flashtune's default tactic, no sweep
    for op in ("rmsnorm", "fused_add_rmsnorm"):
        for h, b in norm_shapes(ctx.quick):
            if ctx.out_of_time([tally], "norm"):
                return
            torch.manual_seed(0)
            results = bench_norm.bench_shape(op, b, h, ctx.fi, sel)
            by = {r["solution"]: r for r in results if r["solution"] != "flashtune_tuned"}
            shape = {"batch_size": b, "hidden_size": h, "dtype": "bfloat16"}
            peer = by.get("flashinfer", {}).get("latency_ms")
            ours = by["flashtune"]["latency_ms"]
            ratio = peer / ours if peer else None
            for sol, r in by.items():
                gbs = r["bytes"] / (r["latency_ms"] * 1e-3) / 1e9
                extra = {k: v for k, v in r.items() if k not in ("solution", "latency_ms")}
                rows.write(
                    op,
                    shape,
                    sol,
                    r["latency_ms"],
                    gbs=round(gbs, 1),
                    pct_copy_bw=round(100 * gbs / bw, 1),
                    input_bytes=b * h * 2,
                    peer_norm_path=path,
                    speedup_of_flashtune=ratio,
                    cuda_graph=True,
                    **extra,
                )
            if ratio:
                tally.add(f"{op} b={b} h={h}", ratio)
            print(
                f"{op:18s} b={b:6d} h={h:5d}  "
                + " ".join(f"{s}={r['latency_ms'] * 1e3:8.2f}us" for s, r in by.items())
                + f"  x{ratio if ratio else float('nan'):.3f}",
                flush=True,
            )


def bench_act_family(ctx: Ctx) -> None:
    import bench_elementwise

    rows = PeerRows("act", ctx.fi)
    tally = Tally("act", "flashinfer")
    ctx.tallies.append(tally)
    bw = ctx.bandwidth()
    sel = Selection(None, sweep=False)
    for d, t in act_shapes(ctx.quick):
        if ctx.out_of_time([tally], "act"):
            return
        torch.manual_seed(0)
        # Writes its rows (flashtune, flashinfer, torch) through `rows`: peer fields included.
        res = bench_elementwise._silu_shape(rows, bw, ctx.fi, sel, t, d)
        ratio = res["vs_fi"] if res else None
        if ratio:
            tally.add(f"silu_and_mul T={t} d={d}", ratio)
        print(f"silu_and_mul T={t:6d} d={d:6d}  x{ratio if ratio else float('nan'):.3f}")


RUNNERS: dict[str, Callable[[Ctx], None]] = {
    "decode": bench_decode_family,
    "prefill": bench_prefill_family,
    "sampling": bench_sampling_family,
    "norm": bench_norm_family,
    "act": bench_act_family,
}


# ---------------------------------------------------------------------------------- main


def summarize(ctx: Ctx) -> list[dict[str, Any]]:
    """Each tally's geomean, min and gate, printed and written as a summary row."""
    print("\n== flashtune vs FlashInfer", ctx.fi.__version__, "(peer latency / flashtune's)")
    out = []
    for t in ctx.tallies:
        v = t.verdict()
        gate = GATES[t.name]
        state = {True: "PASS", False: "FAIL", None: "n/a"}[v["passed"]]
        if not t.complete:
            state += " (incomplete: budget or error)"
        geo = f"{v['geomean']:.3f}" if v["geomean"] else "-"
        low = f"{v['min']:.3f}" if v["min"] else "-"
        print(
            f"{t.name:15s} vs {t.vs:18s} n={v['n']:3d}  geomean {geo:>6s}  min {low:>6s}"
            f"  [{gate.describe()}]  {state}" + (f"  slowest: {t.slowest()}" if t.ratios else "")
        )
        family = t.name.split("_")[0]
        PeerRows(family, ctx.fi).write(
            f"{t.name}_summary",
            {},
            "flashtune",
            None,
            vs=t.vs,
            n=v["n"],
            geomean=v["geomean"],
            min=v["min"],
            gate=gate.describe(),
            passed=v["passed"],
            complete=t.complete,
            slowest=t.slowest(),
        )
        out.append({"name": t.name, **v, "complete": t.complete})
    if ctx.health.dropped:
        print("peer paths left out (failed before they ever ran):")
        for name, why in ctx.health.dropped.items():
            print(f"  {name}: {why}")
    return out


def load_peer() -> Any:
    """FlashInfer 0.7.x with the submodules the benches call; exits 2 otherwise."""
    try:
        import flashinfer
    except Exception as exc:
        print(
            f"bench_fi072.py: cannot import flashinfer ({type(exc).__name__}: {exc}); "
            "run `source scripts/flashinfer072.sh` first (GPU machine, .peer carried)",
            file=sys.stderr,
        )
        sys.exit(2)
    version = str(getattr(flashinfer, "__version__", "unknown"))
    if not peer_version_ok(version):
        print(
            f"bench_fi072.py: flashinfer here is {version} ({flashinfer.__file__}), not "
            f"{PEER_SERIES}.x: run `source scripts/flashinfer072.sh` in this shell first",
            file=sys.stderr,
        )
        sys.exit(2)
    import flashinfer.activation  # noqa: F401
    import flashinfer.decode  # noqa: F401
    import flashinfer.norm  # noqa: F401
    import flashinfer.sampling  # noqa: F401

    print(f"flashinfer {version} from {flashinfer.__file__}", flush=True)
    return flashinfer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="flashtune vs FlashInfer 0.7.2 (issue 37); run after "
        "`source scripts/flashinfer072.sh`",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        choices=FAMILIES,
        default=list(FAMILIES),
        metavar="FAMILY",
        help=f"families to run, in this order (default: all of {', '.join(FAMILIES)})",
    )
    ap.add_argument("--quick", action="store_true", help="a few shapes a family")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting shapes after this many seconds; summaries still printed and written",
    )
    ap.add_argument(
        "--prefill-head-dim",
        type=int,
        choices=(64, 128, 256),
        default=128,
        help="head_dim of the prefill family's inputs (default 128; the rows name it)",
    )
    opts = ap.parse_args(argv)
    if opts.prefill_head_dim != 128:
        import bench_prefill

        # The prefill family reads bench_prefill's shape constants when it runs.
        bench_prefill.D = opts.prefill_head_dim
    fi = load_peer()
    if not torch.cuda.is_available():
        sys.exit("bench_fi072.py: needs a CUDA GPU")
    cc = torch.cuda.get_device_capability()
    print(f"{torch.cuda.get_device_name()} sm_{cc[0]}{cc[1]}", flush=True)
    if cc != (9, 0):
        print("warning: issue 37's figures are for Hopper (sm_90); this GPU is not one")
    ctx = Ctx(fi=fi, quick=opts.quick, deadline=Deadline(opts.budget_s))
    t0 = time.time()
    for family in dict.fromkeys(opts.only):
        if ctx.deadline.expired():
            print(f"budget reached: {family} not run", flush=True)
            continue
        start, before = time.time(), len(ctx.tallies)
        try:
            RUNNERS[family](ctx)
        except Exception:  # one family's crash must not lose the others' summaries
            traceback.print_exc()
            for t in ctx.tallies[before:]:
                t.complete = False
        print(f"[{family} done in {time.time() - start:.0f} s, {time.time() - t0:.0f} s in all]")
    summarize(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Batch prefill attention on the GPU: flashtune vs FlashInfer, paged and ragged.

Causal, bf16, head_dim 128, 32 query / 8 KV heads, qo_len = kv_len = L for every request.
FLOPs counted (only the unmasked half of the causal square):
    flops = 4 * H_qo * D * sum_b L_b * (L_b + 1) / 2
(2 GEMMs, QK^T and PV, 2 flops per multiply-add.) TFLOP/s = flops / median latency.

    python benchmarks/bench_prefill.py               # the grid, rows to results/prefill.jsonl
    python benchmarks/bench_prefill.py --sweep       # time the tactic space on a few shapes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RowWriter  # noqa: E402

from flashtune.ops.attention.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashtune.ops.attention.prefill.config import PREFILL_TACTICS, PrefillTactic
from flashtune.ops.attention.prefill.launch import TritonPrefillRunner
from flashtune.ops.attention.prefill.plan import default_tactic  # noqa: E402
from flashtune.timing import measure  # noqa: E402

HQ, HKV, D = 32, 8, 128
PAGE = 16
GEMM_PEAK_TFLOPS = 790.0  # bf16 dense GEMM on H100 SXM, the compute floor
SEQS = (512, 1024, 2048, 4096, 8192)
BATCHES = (1, 4, 16)


def causal_flops(lens: list[int]) -> float:
    return 4.0 * HQ * D * sum(n * (n + 1) / 2 for n in lens)


def make_batch(batch: int, seq: int, seed: int = 0) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    lens = [seq] * batch
    total = sum(lens)
    q = torch.randn(total, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    indptr = torch.tensor([0] + [seq * (i + 1) for i in range(batch)], dtype=torch.int32)
    pages_per = math.ceil(seq / PAGE)
    num_pages = pages_per * batch
    # Shuffled pages: a real cache is never laid out in order.
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).int()
    kv_page_indptr = torch.tensor([pages_per * i for i in range(batch + 1)], dtype=torch.int32)
    last = torch.full((batch,), seq - (pages_per - 1) * PAGE, dtype=torch.int32)
    cache = torch.empty(num_pages, 2, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
    for b in range(batch):
        pages = perm[b * pages_per : (b + 1) * pages_per].long().cuda()
        kb = torch.zeros(pages_per * PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
        vb = torch.zeros_like(kb)
        kb[:seq] = k[b * seq : (b + 1) * seq]
        vb[:seq] = v[b * seq : (b + 1) * seq]
        cache[pages, 0] = kb.view(pages_per, PAGE, HKV, D)
        cache[pages, 1] = vb.view(pages_per, PAGE, HKV, D)
    return dict(
        lens=lens,
        q=q,
        k=k,
        v=v,
        qo_indptr=indptr,
        kv_indptr=indptr,
        page_indptr=kv_page_indptr,
        page_indices=perm,
        last=last,
        cache=cache,
    )


def ours(mode: str, x: dict[str, Any], tactic: PrefillTactic | None = None):
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # as FlashInfer's below
    if mode == "paged":
        w = BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(
            x["qo_indptr"],
            x["page_indptr"],
            x["page_indices"],
            x["last"],
            HQ,
            HKV,
            D,
            PAGE,
            causal=True,
            q_data_type=torch.bfloat16,
        )
        if tactic is None:
            fn = lambda q, c: w.run(q, c)  # noqa: E731
            fn.plan = w._plan  # type: ignore[attr-defined]
            return fn, [x["q"], x["cache"]]
        kc, vc = x["cache"][:, 0], x["cache"][:, 1]
    else:
        w = BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        w.plan(x["qo_indptr"], x["kv_indptr"], HQ, HKV, D, causal=True, q_data_type=torch.bfloat16)
        if tactic is None:
            fn = lambda q, k, v: w.run(q, k, v)  # noqa: E731
            fn.plan = w._plan  # type: ignore[attr-defined]
            return fn, [x["q"], x["k"], x["v"]]
        kc, vc = x["k"], x["v"]
    runner, plan = TritonPrefillRunner(), w._plan
    out = torch.empty_like(x["q"])

    def fn(q, k, v):
        return runner.forward((q, k, v, out, None, plan), tactic)

    return fn, [x["q"], kc, vc]


def plan_free_fn(mode: str, x: dict[str, Any]):
    """The plan-free call (work found on the device): the whole call, graph-capturable."""
    from flashtune.ops.attention import paged_prefill, ragged_prefill

    if mode == "paged":
        t = [x[k].cuda() for k in ("qo_indptr", "page_indptr", "page_indices", "last")]
        return (lambda q, c: paged_prefill(q, c, *t, causal=True)), [x["q"], x["cache"]]
    qo, kv = x["qo_indptr"].cuda(), x["kv_indptr"].cuda()
    return (lambda q, k, v: ragged_prefill(q, k, v, qo, kv, causal=True)), [x["q"], x["k"], x["v"]]


def flashinfer_prefill(
    fi: Any, mode: str, x: dict[str, Any], ws: torch.Tensor, backend: str = "auto"
) -> tuple[Any, list[Any], str]:
    """(fn, args, the backend the plan resolved) of FlashInfer's batch prefill wrapper `fi`
    (the module: 0.2.14 or 0.7.2) planned once on `x`, as its users plan it."""
    bf16 = torch.bfloat16
    if mode == "paged":
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
        w.plan(
            x["qo_indptr"].cuda(),
            x["page_indptr"].cuda(),
            x["page_indices"].cuda(),
            x["last"].cuda(),
            HQ,
            HKV,
            D,
            PAGE,
            causal=True,
            q_data_type=bf16,
            kv_data_type=bf16,
        )
        fn: Any = lambda q, c: w.run(q, c)  # noqa: E731
        args = [x["q"], x["cache"]]
    else:
        w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
        w.plan(
            x["qo_indptr"].cuda(),
            x["kv_indptr"].cuda(),
            HQ,
            HKV,
            D,
            causal=True,
            q_data_type=bf16,
            kv_data_type=bf16,
        )
        fn = lambda q, k, v: w.run(q, k, v)  # noqa: E731
        args = [x["q"], x["k"], x["v"]]
    return fn, args, str(getattr(w, "_backend", backend))


def flashinfer_fn(mode: str, x: dict[str, Any]):
    import flashinfer

    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    fn, args, _ = flashinfer_prefill(flashinfer, mode, x, ws)
    return fn, args


def _spin(fn, args, seconds: float = 0.05) -> None:
    """Run `fn` for a while first: the 2026-11-21 run timed the default tactic (always first
    per shape) 5-25% slower than the same tactic as a later candidate on event-timed shapes,
    so every solution now starts from the same busy GPU."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn(*args)
        torch.cuda.synchronize()


def timeit(fn, args, graph: bool = False) -> float:
    """Median ms. graph=True times inside a CUDA graph of many calls, as DESIGN.md asks for
    launch-bound kernels (both solutions get the same treatment)."""
    _spin(fn, args)
    return measure(
        fn, args, warmup=3, repetitions=15, cold_l2=True, use_cuda_graph=graph, max_seconds=2.0
    ).median_ms


# Candidates the per-shape tuning tries (a slice of PREFILL_TACTICS around the sweep winners).
_T = PrefillTactic
TUNE_CANDIDATES = {
    "ragged": [
        _T(128, 128, True, 8, 3),
        _T(128, 128, True, 8, 3, tma=True),
        _T(128, 128, True, 8, 2, tma=True),
        _T(128, 64, True, 8, 3, tma=True),
        _T(128, 64, True, 8, 2, tma=True),
        _T(64, 64, True, 4, 3, tma=True),
        _T(64, 64, True, 4, 2, tma=True),
        _T(64, 128, True, 4, 2, tma=True),
        _T(128, 32, True, 4, 3),
        _T(64, 32, True, 4, 3),
    ],
    "paged": [
        _T(128, 128, True, 8, 3),
        _T(128, 64, True, 4, 3),
        _T(128, 32, True, 4, 3),
        _T(64, 64, True, 4, 3),
        # tma on paged: pages staged into the workspace, then the ragged TMA kernel.
        _T(128, 128, True, 8, 3, tma=True),
        _T(128, 128, True, 8, 2, tma=True),
        _T(128, 64, True, 8, 3, tma=True),
        _T(128, 64, True, 8, 2, tma=True),
        _T(64, 64, True, 4, 3, tma=True),
        _T(64, 64, True, 4, 2, tma=True),
    ],
}


SWEEP_TACTICS = [
    PrefillTactic(bm, bn, pack, w, s)
    for bm, bn, pack, w, s in [
        (128, 64, True, 8, 2),
        (128, 64, True, 8, 3),
        (128, 64, True, 8, 4),
        (128, 64, True, 4, 3),
        (128, 64, False, 8, 3),
        (128, 64, False, 4, 3),
        (128, 128, True, 8, 2),
        (128, 128, True, 8, 3),
        (128, 128, False, 8, 3),
        (128, 128, True, 4, 2),
        (128, 32, True, 8, 3),
        (128, 32, True, 4, 3),
        (64, 64, True, 4, 3),
        (64, 64, True, 4, 4),
        (64, 128, True, 4, 3),
        (64, 64, False, 4, 3),
        (64, 32, True, 4, 3),
    ]
] + [
    PrefillTactic(128, bn, True, w, s, tma=True)
    for bn, w, s in [(64, 8, 3), (128, 8, 3), (128, 8, 2), (64, 4, 3), (32, 4, 3)]
]


def sweep(out_dir: Path | None) -> None:
    results = []
    shapes = [(4, 2048), (1, 8192), (16, 512)]
    for batch, seq in shapes:
        x = make_batch(batch, seq)
        flops = causal_flops(x["lens"])
        for mode in ("ragged", "paged"):
            for t in SWEEP_TACTICS:
                try:
                    fn, args = ours(mode, x, t)
                    ms = timeit(fn, args)
                except Exception as e:  # a tactic that fails to compile is just skipped
                    print(f"  {mode} b{batch} L{seq} {t}: FAILED {type(e).__name__}: {e}"[:300])
                    continue
                tf = flops / ms / 1e9
                results.append(
                    dict(
                        mode=mode, batch=batch, seq=seq, tactic=t.__dict__, latency_ms=ms, tflops=tf
                    )
                )
                print(
                    f"  {mode:6s} b{batch:<3d} L{seq:<5d} {t}  {ms:8.3f} ms {tf:6.1f} TF/s",
                    flush=True,
                )
        del x
        torch.cuda.empty_cache()
    if out_dir is not None:
        (out_dir / "prefill_sweep.json").write_text(json.dumps(results, indent=1))


def grid(seqs: tuple[int, ...], batches: tuple[int, ...], peer: bool, tune: bool = True) -> None:
    writer = RowWriter("prefill")
    fi_ok = peer
    if peer:
        try:
            import flashinfer  # noqa: F401
        except Exception as e:
            print(f"FlashInfer unavailable: {type(e).__name__}: {e}")
            fi_ok = False
    table = []
    plan_free_ratios: list[float | None] = []
    candidates: list[dict[str, Any]] = []  # every tactic timing, for picking defaults
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    for seq in seqs:
        for batch in batches:
            x = make_batch(batch, seq)
            flops = causal_flops(x["lens"])
            shape = dict(
                batch_size=batch,
                qo_len=seq,
                kv_len=seq,
                num_qo_heads=HQ,
                num_kv_heads=HKV,
                head_dim=D,
                causal=True,
                dtype="bfloat16",
            )
            for mode in ("paged", "ragged"):
                shp = dict(shape, page_size=PAGE) if mode == "paged" else dict(shape)
                op = f"prefill_{mode}"
                fn, args = ours(mode, x)
                default_t = str(default_tactic(fn.plan, torch.device("cuda")))
                out = fn(*args)
                graph = timeit(fn, args) < 1.0  # launch-bound: time inside a CUDA graph
                ms = timeit(fn, args, graph)
                tf = flops / ms / 1e9
                # The same default tactic with the tile-global work order, for the record.
                fn.plan.work_order = "tile"  # this plan's work list, in the other order
                tile_ms = timeit(fn, args, graph)
                fn.plan.work_order = "request"
                candidates.append(
                    dict(
                        mode=mode,
                        batch=batch,
                        seq=seq,
                        tactic=default_t,
                        order="tile",
                        ms=tile_ms,
                        default_ms=ms,
                    )
                )
                # Per-shape tuning over the runner's tactics (what the autotuner does).
                best_ms, best_t = ms, "default"
                for t in TUNE_CANDIDATES[mode] if tune else ():
                    try:
                        tfn, targs = ours(mode, x, t)
                        t_out = tfn(*targs)
                        terr = (t_out.float() - out.float()).abs().max().item()
                        if terr > 0.05:
                            print(f"  tactic {t} disagrees with default: {terr}")
                            continue
                        t_ms = timeit(tfn, targs, graph)
                    except Exception as e:
                        print(f"  tactic {t} failed: {type(e).__name__}: {e}"[:300])
                        continue
                    candidates.append(
                        dict(
                            mode=mode,
                            batch=batch,
                            seq=seq,
                            tactic=t.__dict__,
                            ms=t_ms,
                            tflops=flops / t_ms / 1e9,
                            default_ms=ms,
                        )
                    )
                    if t_ms < best_ms:
                        best_ms, best_t = t_ms, str(t)
                if out_dir is not None:
                    (out_dir / "prefill_candidates.json").write_text(json.dumps(candidates))
                fi_ms, err = None, None
                if fi_ok:
                    try:
                        fi, fargs = flashinfer_fn(mode, x)
                        ref = fi(*fargs)
                        err = (out.float() - ref.float()).abs().max().item()
                        try:
                            fi_ms = timeit(fi, fargs, graph)
                        except Exception as e:  # capture unsupported: events for both
                            print(f"FlashInfer graph timing failed ({e}); events for both")
                            fi_ms, ms, best_ms = timeit(fi, fargs), timeit(fn, args), best_ms
                            tf = flops / ms / 1e9
                        writer.write(
                            op,
                            shp,
                            "flashinfer",
                            fi_ms,
                            tflops=flops / fi_ms / 1e9,
                            ratio_to_gemm_peak=flops / fi_ms / 1e9 / GEMM_PEAK_TFLOPS,
                            cuda_graph=graph,
                        )
                    except Exception as e:
                        print(f"FlashInfer failed on {op} {shp}: {type(e).__name__}: {e}"[:400])
                ratio = fi_ms / ms if fi_ms else None
                tuned_ratio = fi_ms / best_ms if fi_ms else None
                pfn, pargs = plan_free_fn(mode, x)
                p_err = (pfn(*pargs).float() - out.float()).abs().max().item()
                p_ms = timeit(pfn, pargs, graph)
                writer.write(
                    op,
                    shp,
                    "flashtune_planless",
                    p_ms,
                    tflops=flops / p_ms / 1e9,
                    speedup_vs_flashinfer=fi_ms / p_ms if fi_ms else None,
                    max_abs_diff_vs_planned=p_err,
                    cuda_graph=graph,
                )
                plan_free_ratios.append(fi_ms / p_ms if fi_ms else None)
                writer.write(
                    op,
                    shp,
                    "flashtune",
                    ms,
                    tflops=tf,
                    tactic=default_t,
                    ratio_to_gemm_peak=tf / GEMM_PEAK_TFLOPS,
                    speedup_vs_flashinfer=ratio,
                    max_abs_diff_vs_flashinfer=err,
                    cuda_graph=graph,
                )
                writer.write(
                    op,
                    shp,
                    "flashtune-tuned",
                    best_ms,
                    tflops=flops / best_ms / 1e9,
                    ratio_to_gemm_peak=flops / best_ms / 1e9 / GEMM_PEAK_TFLOPS,
                    speedup_vs_flashinfer=tuned_ratio,
                    tactic=best_t,
                    cuda_graph=graph,
                )
                table.append((mode, batch, seq, ms, tf, fi_ms, ratio, best_ms, tuned_ratio))
                print(
                    f"{mode:6s} b{batch:<3d} L{seq:<5d} ours {ms:8.3f} ms {tf:6.1f} TF/s  "
                    f"plan-free {p_ms:8.3f} ms  "
                    f"tuned {best_ms:8.3f} ms ({best_t})  "
                    + (
                        f"FI {fi_ms:8.3f} ms {flops / fi_ms / 1e9:6.1f} TF/s  x{ratio:.2f} "
                        f"tuned x{tuned_ratio:.2f} err {err:.3g}"
                        if fi_ms
                        else ""
                    ),
                    flush=True,
                )
            del x
            torch.cuda.empty_cache()
    print("\nmode   batch seq    ours_ms  ours_TF  tuned_TF  FI_ms    FI_TF   x_default x_tuned")
    for mode, b, s, ms, tf, fms, r, bms, tr in table:
        fl = causal_flops([s] * b)
        fi_s = f"{fms:8.3f} {fl / fms / 1e9:7.1f}  {r:5.2f}  {tr:5.2f}" if fms else "-"
        print(f"{mode:6s} {b:5d} {s:5d} {ms:8.3f} {tf:7.1f}  {fl / bms / 1e9:7.1f}  {fi_s}")
    columns = [
        ("default tactic", [r[6] for r in table]),
        ("tuned per shape", [r[8] for r in table]),
        ("plan-free call", plan_free_ratios),
    ]
    for label, column in columns:
        ratios = [r for r in column if r]
        if ratios:
            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            print(
                f"geomean speedup vs FlashInfer ({label}): {geo:.3f} over {len(ratios)} "
                f"shapes (min {min(ratios):.2f}, max {max(ratios):.2f})"
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-tune", action="store_true", help="skip the per-shape tactic search")
    ap.add_argument(
        "--warmup-peer", action="store_true", help="only JIT-build FlashInfer's kernels"
    )
    ap.add_argument("--seqs", type=int, nargs="*", default=list(SEQS))
    ap.add_argument("--batches", type=int, nargs="*", default=list(BATCHES))
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), "tactics in space:", len(PREFILL_TACTICS))
    t0 = time.time()
    if a.warmup_peer:  # run beside the tests so the grid finds FlashInfer compiled
        x = make_batch(1, 512)
        for mode in ("paged", "ragged"):
            fi, fargs = flashinfer_fn(mode, x)
            fi(*fargs)
        torch.cuda.synchronize()
    elif a.sweep:
        sweep(Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    else:
        grid(tuple(a.seqs), tuple(a.batches), not a.no_peer, tune=not a.no_tune)
    print(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

"""Elementwise benchmark (issue 3): silu_and_mul and RoPE vs torch eager and FlashInfer.

- silu_and_mul: [T, 2d] -> [T, d], d in {11008, 14336}, T in {1, 64, 1024, 4096, 16384}, bf16.
- rope (apply_rope_with_cos_sin_cache, out of place and in place): nnz in
  {1, 64, 1024, 8192, 32768}, (Hq, Hk, D, rotary_dim) in {(32, 8, 128, 128) Llama-3.1-8B,
  (48, 8, 128, 64) MiniMax-M2}, bf16, fp32 cos/sin cache of 131072 positions.
Timed like bench_norm.py (cold L2, CUDA graphs); flashtune with its default tactic and the
best of its tactics ("tuned"),
silu_and_mul launched with programmatic dependent launch as its callers get it (ops/pdl.py:
on from Hopper since session 22), as FlashInfer's calls get their own default. Bytes count what must move: input read + output written (the
rotary part only for in-place rope) + positions + the cos/sin rows read.
Writes benchmarks/results/activation.jsonl and rope.jsonl (and $OUT); prints tables.
Usage: python benchmarks/bench_elementwise.py [--quick] [--no-sweep]
       python benchmarks/bench_elementwise.py --pdl [--quick]

--pdl: programmatic dependent launch instead (ops/pdl.py): a chain of PDL_CHAIN
silu_and_mul kernels, each reading what the one before wrote (two buffers in turn), with enable_pdl False and True, in a CUDA graph and as eager launches; FlashInfer's
likewise. Rows go to benchmarks/results/activation_pdl.jsonl.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_norm import geomean, load_flashinfer, time_ms  # noqa: E402
from common import (  # noqa: E402
    RowWriter,
    Selection,
    bench_pdl_chains,
    copy_bandwidth_gbs,
    fresh_inputs,
    try_peer,
)

from flashtune.ops import activation as A  # noqa: E402
from flashtune.ops.activation import config as activation_config  # noqa: E402
from flashtune.ops.activation.launch import GatedActivationRunner  # noqa: E402
from flashtune.ops.activation.reference import silu_and_mul_ref  # noqa: E402
from flashtune.ops.pdl import use_pdl  # noqa: E402
from flashtune.ops.rope import config as rope_config  # noqa: E402
from flashtune.ops.rope.launch import RopeArgs, RopeRunner  # noqa: E402
from flashtune.ops.rope.reference import rope_with_cos_sin_cache_ref  # noqa: E402

PDL_CHAIN = 8


def silu_chain(lib: Any, pdl: bool):
    """fn(a, c): PDL_CHAIN silu_and_mul kernels over two [T, 2d] buffers, each writing the
    first T * d elements of the other (a contiguous [T, d] view), which the next one reads."""

    def chain(a: torch.Tensor, c: torch.Tensor) -> None:
        t, d = a.shape[0], a.shape[1] // 2
        for _ in range(PDL_CHAIN // 2):
            lib.silu_and_mul(a, out=c.view(2, t, d)[0], enable_pdl=pdl)
            lib.silu_and_mul(c, out=a.view(2, t, d)[0], enable_pdl=pdl)

    return chain


def bench_pdl(writer, fi, quick: bool) -> None:
    libs = {"flashtune": A, **({"flashinfer": fi.activation} if fi is not None else {})}

    def cases():
        for d in [14336] if quick else [4096, 14336]:
            for t in [1, 64] if quick else [1, 8, 64, 256, 1024]:
                args = [
                    torch.randn(t, 2 * d, dtype=torch.bfloat16, device="cuda"),
                    torch.randn(t, 2 * d, dtype=torch.bfloat16, device="cuda"),
                ]
                shape = {"num_tokens": t, "hidden_size": d, "dtype": "bfloat16"}
                yield f"t={t:5d} d={d:5d}", shape, args

    bench_pdl_chains(writer, "silu_and_mul_pdl_chain", libs, silu_chain, cases(), PDL_CHAIN)


def _sweep(check, make_fn, tactics, args, sel: Selection, key: str):
    """(default ms, tuned ms, tuned tactic); None in the selection process, which only
    records the pick (common.Selection: a fresh process measures it)."""
    check(make_fn(-1))
    if sel.selecting:
        best_ms, best_t = time_ms(make_fn(-1), args, reps=20), "default"
        for t in tactics:
            check(make_fn(t))
            ms = time_ms(make_fn(t), args, reps=20)
            if ms < best_ms:
                best_ms, best_t = ms, t
        sel.record(key, best_t, best_ms)
        return None
    default_ms = time_ms(make_fn(-1), args)
    if not sel.measuring:
        return default_ms, default_ms, "default"
    # The published "tuned" figure: the pick timed once on fresh inputs in this process,
    # never the sweep's best sample (a minimum over noisy samples is biased low).
    best_t, _ = sel.lookup(key, ["default", *tactics])
    pick = make_fn(best_t if best_t != "default" else -1)
    check(pick)
    return default_ms, time_ms(pick, fresh_inputs(args)), str(best_t)


def _emit(writer, op, shape, bw, nbytes, by: dict[str, float], tactics: dict[str, str]):
    peer = by.get("flashinfer")
    for sol, ms in by.items():
        gbs = nbytes / (ms * 1e-3) / 1e9
        writer.write(
            op,
            shape,
            sol,
            ms,
            gbs=round(gbs, 1),
            pct_copy_bw=round(100 * gbs / bw, 1),
            copy_bw_gbs=round(bw, 1),
            bytes=nbytes,
            speedup_vs_torch=round(by["torch"] / ms, 3),
            speedup_vs_flashinfer=round(peer / ms, 3) if peer else None,
            tactic=tactics.get(sol),
        )
    t = by["flashtune_tuned"]
    gbs = nbytes / (t * 1e-3) / 1e9
    print(
        f"{op:30s} {str(shape):60s} "
        + " ".join(f"{s}={v * 1e3:8.2f}us" for s, v in by.items())
        + f"  {gbs:6.0f} GB/s {100 * gbs / bw:5.1f}% bw  tactic {tactics['flashtune_tuned']}",
        flush=True,
    )
    return {
        "pct": 100 * gbs / bw,
        "vs_torch": by["torch"] / t,
        "vs_fi": peer / t if peer else None,
        "bytes": nbytes,
    }


def bench_silu(writer, bw, fi, quick: bool, sel: Selection) -> list[dict[str, Any]]:
    out = []
    for d in [14336] if quick else [11008, 14336]:
        for t in [1, 4096, 16384] if quick else [1, 64, 1024, 4096, 16384]:
            out.append(_silu_shape(writer, bw, fi, sel, t, d))
    return [row for row in out if row is not None]


def _silu_shape(writer, bw, fi, sel: Selection, t: int, d: int) -> dict[str, Any] | None:
    runner = GatedActivationRunner()
    x = torch.randn(t, 2 * d, dtype=torch.bfloat16, device="cuda")
    ref = silu_and_mul_ref(x)

    def check(fn):
        o = torch.empty(t, d, dtype=x.dtype, device="cuda")
        fn(x, o)
        torch.testing.assert_close(o, ref, atol=3e-2, rtol=3e-2)

    def make(tactic):
        # PDL as flashtune's callers get it (ops/pdl.py's default), as FlashInfer's calls
        # below get theirs.
        return lambda xx, oo: runner.forward([xx, oo, 0, use_pdl(xx.device, None)], tactic)

    args = [x, torch.empty(t, d, dtype=x.dtype, device="cuda")]
    tactics = runner.get_valid_tactics(args, None)
    swept = _sweep(check, make, tactics, args, sel, f"silu/{t}/{d}")
    if swept is None:
        return None
    dms, tms, tt = swept
    by = {"flashtune": dms, "flashtune_tuned": tms}
    if fi is not None:

        def peer(xx, oo):
            return fi.activation.silu_and_mul(xx, out=oo)

        if try_peer("flashinfer.silu_and_mul", lambda: check(peer)):
            by["flashinfer"] = time_ms(peer, args)
    by["torch"] = time_ms(lambda xx, oo: F.silu(xx[:, :d]) * xx[:, d:], args)
    nbytes = 3 * t * d * x.element_size()
    shape = {"num_tokens": t, "d": d, "dtype": "bfloat16"}
    tact = {"flashtune": str(activation_config.default_tactic(d, t)), "flashtune_tuned": tt}
    return _emit(writer, "silu_and_mul", shape, bw, nbytes, by, tact)


def _cos_sin_cache(max_pos: int, rd: int) -> torch.Tensor:
    inv = 1.0 / (1e4 ** (torch.arange(0, rd, 2, device="cuda", dtype=torch.float32) / rd))
    ang = torch.arange(max_pos, device="cuda", dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1)


def bench_rope(writer, bw, fi, quick: bool, sel: Selection) -> list[dict[str, Any]]:
    out = []
    configs = [(32, 8, 128, 128)] if quick else [(32, 8, 128, 128), (48, 8, 128, 64)]
    for hq, hk, d, rd in configs:
        cache = _cos_sin_cache(131072, rd)
        for nnz in [1, 8192] if quick else [1, 64, 1024, 8192, 32768]:
            for inplace in (False, True):
                out.append(_rope_shape(writer, bw, fi, sel, cache, nnz, hq, hk, d, inplace))
    return [row for row in out if row is not None]


def _rope_shape(writer, bw, fi, sel, cache, nnz, hq, hk, d, inplace) -> dict[str, Any] | None:
    runner = RopeRunner()
    rd = cache.shape[1]
    args_c = RopeArgs(rd, False, True)
    q = torch.randn(nnz, hq * d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(nnz, hk * d, dtype=torch.bfloat16, device="cuda")
    pos = torch.randint(0, cache.shape[0], (nnz,), device="cuda")
    qr, kr = rope_with_cos_sin_cache_ref(q, k, cache, pos, d, True)
    moved = rd if inplace else d  # in place, the pass-through part is untouched
    nbytes = 2 * nnz * (hq + hk) * moved * q.element_size() + nnz * (8 + rd * 4)

    def check(fn):
        qq, kk = q.clone(), k.clone()
        res = fn(qq, kk)
        qo, ko = (qq, kk) if inplace else res
        torch.testing.assert_close(qo, qr, atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(ko, kr, atol=3e-2, rtol=3e-2)

    def make(tactic):
        def fn(qq, kk):
            q3, k3 = qq.view(nnz, hq, d), kk.view(nnz, hk, d)
            if inplace:
                qo, ko = q3, k3
            else:
                qo, ko = torch.empty_like(q3), torch.empty_like(k3)
            runner.forward([q3, k3, qo, ko, pos, cache, args_c], tactic)
            return qo.view(nnz, -1), ko.view(nnz, -1)

        return fn

    args = [q.clone(), k.clone()]  # in-place timing mutates them; checks use q and k
    tactics = runner.get_valid_tactics([q.view(nnz, hq, d), k.view(nnz, hk, d)], None)
    swept = _sweep(check, make, tactics, args, sel, f"rope/{nnz}/{hq}/{hk}/{d}/{rd}/{inplace}")
    if swept is None:
        return None
    dms, tms, tt = swept
    by = {"flashtune": dms, "flashtune_tuned": tms}
    if fi is not None:
        name = "apply_rope_with_cos_sin_cache" + ("_inplace" if inplace else "")
        peer_fn = getattr(fi.rope, name)

        def peer(qq, kk):
            return peer_fn(pos, qq, kk, d, cache, True)

        if try_peer(f"flashinfer.{name}", lambda: check(peer)):
            by["flashinfer"] = time_ms(peer, args)

    def torch_eager(qq, kk):
        qo, ko = rope_with_cos_sin_cache_ref(qq, kk, cache, pos, d, True)
        if inplace:
            qq.copy_(qo)
            kk.copy_(ko)
        return qo, ko

    by["torch"] = time_ms(torch_eager, args)
    op = "rope_with_cos_sin_cache" + ("_inplace" if inplace else "")
    shape = {
        "num_tokens": nnz,
        "num_qo_heads": hq,
        "num_kv_heads": hk,
        "head_size": d,
        "rotary_dim": rd,
        "dtype": "bfloat16",
    }
    tact = {"flashtune": str(rope_config.default_tactic(max(hq, hk), rd)), "flashtune_tuned": tt}
    return _emit(writer, op, shape, bw, nbytes, by, tact)


def _summary(name: str, rows: list[dict[str, Any]]) -> None:
    big = [r for r in rows if r["bytes"] > 64e6]
    vs_fi = [r["vs_fi"] for r in rows if r["vs_fi"]]
    print(
        f"{name}: vs torch geomean {geomean([r['vs_torch'] for r in rows]):.2f}x "
        f"(min {min(r['vs_torch'] for r in rows):.2f}); vs FlashInfer geomean "
        f"{geomean(vs_fi):.3f}x; > 64 MB moved: "
        + (
            f"{min(r['pct'] for r in big):.1f}%..{max(r['pct'] for r in big):.1f}% of copy bw"
            if big
            else "n/a"
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--only", choices=["silu", "rope"], default=None)
    ap.add_argument("--pdl", action="store_true", help="PDL on/off chains only")
    ap.add_argument("--picks", help=argparse.SUPPRESS)  # set by Selection's second process
    opts = ap.parse_args()
    if opts.pdl:
        torch.manual_seed(0)
        bench_pdl(RowWriter("activation_pdl"), load_flashinfer(), opts.quick)
        return
    sel = Selection(opts.picks, sweep=not opts.no_sweep)
    torch.manual_seed(0)
    bw = copy_bandwidth_gbs()
    print(f"GPU {torch.cuda.get_device_name()}  copy bandwidth {bw:.0f} GB/s", flush=True)
    fi = load_flashinfer()
    t0 = time.perf_counter()
    silu = rope = []
    if opts.only in (None, "silu"):
        silu = bench_silu(RowWriter("activation"), bw, fi, opts.quick, sel)
    if opts.only in (None, "rope"):
        rope = bench_rope(RowWriter("rope"), bw, fi, opts.quick, sel)
    if sel.selecting:
        sel.measure_in_fresh_process(__file__)
        return
    print(f"\n[{time.perf_counter() - t0:.0f}s]")
    if silu:
        _summary("silu_and_mul", silu)
    if rope:
        _summary("rope", rope)


if __name__ == "__main__":
    main()

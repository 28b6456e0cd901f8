"""Paged decode, the skewed-batch balance test and cascade, vs FlashInfer 0.2.14 (GPU).

    python benchmarks/bench_decode.py [--quick] [--only PART] [--skip PART ...]

PART: grid, skewed, cascade, sweep, variants (issue 14: RoPE fused into decode and fp8 KV
caches, see bench_variants), variant-sweep (every tactic on those shapes). Rows go to benchmarks/results/decode.jsonl and cascade.jsonl
(and $OUT). Every kernel is timed with flashtune.timing.measure (cold L2, CUDA graph of 20
calls, median; plain events for a peer that cannot be captured). KV GB/s counts the K and V
bytes read once; bw_frac divides by copy_bandwidth_gbs().
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter, copy_bandwidth_gbs  # noqa: E402

from flashtune.ops.attention import (  # noqa: E402
    BatchDecodeWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)
from flashtune.ops.attention.decode.plan_free import paged_decode  # noqa: E402
from flashtune.ops.attention.page import build_page_table  # noqa: E402
from flashtune.timing import measure  # noqa: E402
from flashtune.tune import autotune  # noqa: E402

HQ, HK, D = 32, 8, 128
DT = torch.bfloat16


def _time_how(fn, args):
    """(median ms, timing method): a CUDA graph of 20 calls, or plain events for a peer
    that cannot be captured."""
    try:
        t = measure(fn, args, warmup=5, repetitions=30, use_cuda_graph=True)
        return t.median_ms, "cuda_graph"
    except Exception:  # a peer that cannot be captured: plain events
        torch.cuda.synchronize()
        return measure(fn, args, warmup=5, repetitions=30).median_ms, "cuda_events"


def _time(fn, args):
    return _time_how(fn, args)[0]


def _flashinfer():
    try:
        import flashinfer

        return flashinfer
    except Exception as exc:
        print(f"FlashInfer unavailable ({exc!r}); peer recorded as missing")
        return None


def _setup(lens, page_size):
    indptr, indices, last, n_pages = build_page_table(lens, page_size, device="cuda")
    cache = torch.randn(n_pages, 2, page_size, HK, D, dtype=DT, device="cuda")
    q = torch.randn(len(lens), HQ, D, dtype=DT, device="cuda")
    return indptr, indices, last, cache, q


def _ours(ws, table, page_size, heads=(HQ, HK, D), **kw):
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(*table, *heads, page_size, **{"q_data_type": DT, **kw})
    return w


def _peer(fi, ws, table, page_size, tensor_cores, heads=(HQ, HK, D), **kw):
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
    w.plan(*table, *heads, page_size, **{"q_data_type": DT, "kv_data_type": DT, **kw})
    return w


def bench_grid(fi, ws, rows, bw, quick):
    page_sizes = [16] if quick else [1, 16, 64]
    batches = [1, 16, 64, 256]
    kv_lens = [512, 2048, 8192, 32768]
    ratios, ratios_nop = [], []
    for ps in page_sizes:
        for b in batches:
            for kv in kv_lens:
                if b * kv > 2**21 or (quick and b * kv < 2**14):
                    continue
                indptr, indices, last, cache, q = _setup([kv] * b, ps)
                table = (indptr, indices, last)
                nbytes = 2 * b * kv * HK * D * cache.element_size()
                shape = dict(batch=b, kv_len=kv, page_size=ps, hq=HQ, hk=HK, d=D)
                w = _ours(ws, table, ps)
                ms = _time(lambda q_, c_, w=w: w.run(q_, c_), [q, cache])
                # The plan-free call: scheduling on the device, whole call in the graph.
                ms_nop = _time(lambda q_, c_, t=table: paged_decode(q_, c_, *t), [q, cache])
                peer_ms = {}
                if fi is not None:
                    for tc in (True, False):
                        try:
                            pw = _peer(fi, ws_fi, table, ps, tc)
                            peer_ms[tc] = _time(lambda q_, c_, pw=pw: pw.run(q_, c_), [q, cache])
                        except Exception as exc:
                            print(f"flashinfer tc={tc} failed: {exc!r}")
                best_peer = min(peer_ms.values()) if peer_ms else None
                ratio = best_peer / ms if best_peer else None
                ratio_nop = best_peer / ms_nop if best_peer else None
                if ratio:
                    ratios.append(ratio)
                    ratios_nop.append(ratio_nop)
                gbs = nbytes / (ms * 1e-3) / 1e9
                rows.write(
                    "batch_decode",
                    shape,
                    "flashtune",
                    ms,
                    gbs=gbs,
                    bw_frac=gbs / bw,
                    speedup_vs_flashinfer=ratio,
                )
                g2 = nbytes / (ms_nop * 1e-3) / 1e9
                rows.write(
                    "batch_decode",
                    shape,
                    "flashtune_planless",
                    ms_nop,
                    gbs=g2,
                    bw_frac=g2 / bw,
                    speedup_vs_flashinfer=ratio_nop,
                )
                for tc, pms in peer_ms.items():
                    pg = nbytes / (pms * 1e-3) / 1e9
                    name = "flashinfer_tc" if tc else "flashinfer_cuda_core"
                    rows.write("batch_decode", shape, name, pms, gbs=pg, bw_frac=pg / bw)
                print(
                    f"ps={ps:3d} b={b:4d} kv={kv:6d}  ours {ms * 1e3:8.1f} us {gbs:7.0f} GB/s "
                    f"({gbs / bw:4.0%}) plan-free {ms_nop * 1e3:8.1f}  fi_tc {peer_ms.get(True, float('nan')) * 1e3:8.1f} "
                    f"fi_cc {peer_ms.get(False, float('nan')) * 1e3:8.1f}  "
                    f"x{ratio if ratio else float('nan'):.2f}",
                    flush=True,
                )
                del cache
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"geomean speedup vs FlashInfer(best of tc/cc): {geo:.3f}  min {min(ratios):.3f}")
        rows.write(
            "batch_decode_summary",
            {},
            "flashtune",
            0.0,
            geomean_vs_flashinfer=geo,
            min_vs_flashinfer=min(ratios),
            n=len(ratios),
        )
        geo2 = math.exp(sum(math.log(r) for r in ratios_nop) / len(ratios_nop))
        print(f"plan-free: geomean {geo2:.3f}  min {min(ratios_nop):.3f}")
        rows.write(
            "batch_decode_summary",
            {},
            "flashtune_planless",
            0.0,
            geomean_vs_flashinfer=geo2,
            min_vs_flashinfer=min(ratios_nop),
            n=len(ratios_nop),
        )


def bench_sweep(ws, rows, bw):
    """Tactics of the decode kernel x the cap on persistent CTAs per SM, planned and
    plan-free, on shapes where FlashInfer leads (until the autotuner picks per shape)."""
    from flashtune.ops.attention.decode.config import DecodeLaunch, DecodeTactic

    tactics = [
        (64, 4, 3),
        (64, 4, 2),
        (64, 4, 4),
        (32, 4, 3),
        (32, 4, 4),
        (32, 2, 4),
        (128, 4, 2),
        (128, 8, 3),
        (64, 8, 3),
    ]
    shapes = (
        (16, 64, 512),
        (16, 64, 2048),
        (16, 64, 8192),
        (16, 16, 8192),
        (16, 16, 32768),
        (16, 256, 2048),
        (1, 64, 2048),
        (16, 1, 8192),
    )
    for ps, b, kv in shapes:
        indptr, indices, last, cache, q = _setup([kv] * b, ps)
        table = (indptr, indices, last)
        nbytes = 2 * b * kv * HK * D * cache.element_size()
        shape = dict(batch=b, kv_len=kv, page_size=ps, hq=HQ, hk=HK, d=D)
        line = []
        for bn, nw, ns in tactics:
            for cap in (4, 8):
                # Passed to plan() and to the plan-free call: no module state to restore.
                launch = DecodeLaunch(DecodeTactic(bn, nw, ns), max_ctas_per_sm=cap)
                try:
                    w = _ours(ws, table, ps, launch=launch)
                    ms = _time(lambda q_, c_, w=w: w.run(q_, c_), [q, cache])
                    ms_nop = _time(
                        lambda q_, c_, t=table, how=launch: paged_decode(q_, c_, *t, launch=how),
                        [q, cache],
                    )
                except Exception as exc:
                    line.append(f"{bn}/{nw}/{ns}/c{cap}: fail {type(exc).__name__}")
                    continue
                tag = f"bn{bn}_w{nw}_s{ns}_cap{cap}"
                for name, t in (("flashtune", ms), ("flashtune_planless", ms_nop)):
                    g = nbytes / (t * 1e-3) / 1e9
                    rows.write(
                        "batch_decode_tactic_sweep",
                        shape,
                        f"{name}_{tag}",
                        t,
                        gbs=g,
                        bw_frac=g / bw,
                    )
                line.append(f"{bn}/{nw}/{ns}/c{cap}: {ms * 1e3:.1f}/{ms_nop * 1e3:.1f}")
        print(f"sweep ps={ps} b={b} kv={kv} (planned/plan-free us): " + "  ".join(line), flush=True)
        del cache


def bench_merge_sweep(ws, rows, bw):
    """The fused merge (DecodeTactic.fused_merge: split tiles merged by their last chunk in
    the attention kernel, no merge kernel) against the merge kernel, where the merge launch
    weighs most: small batches of short requests, where XQA leads."""
    from flashtune.ops.attention.decode.config import DecodeLaunch, DecodeTactic

    for b, kv in ((1, 1024), (16, 1024), (16, 4096), (64, 1024), (1, 16384)):
        indptr, indices, last, cache, q = _setup([kv] * b, 16)
        table = (indptr, indices, last)
        nbytes = 2 * b * kv * HK * D * cache.element_size()
        shape = dict(batch=b, kv_len=kv, page_size=16, hq=HQ, hk=HK, d=D)
        line = []
        for bn, nw, ns in ((64, 4, 2), (64, 4, 3), (32, 4, 3)):
            for fused in (False, True):
                launch = DecodeLaunch(DecodeTactic(bn, nw, ns, fused_merge=fused))
                try:
                    w = _ours(ws, table, 16, launch=launch)
                    ms = _time(lambda q_, c_, w=w: w.run(q_, c_), [q, cache])
                except Exception as exc:
                    line.append(f"{bn}/{nw}/{ns}{'/fm' if fused else ''}: {type(exc).__name__}")
                    continue
                g = nbytes / (ms * 1e-3) / 1e9
                tag = f"bn{bn}_w{nw}_s{ns}" + ("_fused_merge" if fused else "")
                host = w._planner.plan.host
                chunks = int(host.merge_info[:, 1].max()) if host.merge_info.size else 0
                rows.write("batch_decode_merge_sweep", shape, f"flashtune_{tag}", ms, gbs=g,
                           bw_frac=g / bw, split=host.has_split, max_chunks=chunks)  # fmt: skip
                line.append(f"{bn}/{nw}/{ns}{'/fm' if fused else ''}: {ms * 1e3:.1f} ({chunks})")
        print(f"merge-sweep b={b} kv={kv} (us): " + "  ".join(line), flush=True)
        del cache


def bench_skewed(ws, rows, bw):
    lens = [32768] + [512] * 63
    indptr, indices, last, cache, q = _setup(lens, 16)
    table = (indptr, indices, last)
    nbytes = 2 * sum(lens) * HK * D * cache.element_size()
    res = {}
    for name, kw in (("balanced", {}), ("no_split", {"disable_split_kv": True})):
        w = _ours(ws, table, 16, **kw)
        res[name] = _time(lambda q_, c_, w=w: w.run(q_, c_), [q, cache])
    # The plan-free call: the split scheduled on the device from the same page table.
    # "planless": the name of the recorded series (benchmarks/results/decode.jsonl)
    res["planless"] = _time(lambda q_, c_: paged_decode(q_, c_, *table), [q, cache])
    speedup = res["no_split"] / res["balanced"]
    shape = dict(batch=64, kv_lens="1x32768+63x512", page_size=16, hq=HQ, hk=HK, d=D)
    for name, ms in res.items():
        gbs = nbytes / (ms * 1e-3) / 1e9
        rows.write(
            "batch_decode_skewed",
            shape,
            f"flashtune_{name}",
            ms,
            gbs=gbs,
            bw_frac=gbs / bw,
            balanced_speedup=speedup,
        )
    print(
        f"skewed: balanced {res['balanced'] * 1e3:.1f} us, no split "
        f"{res['no_split'] * 1e3:.1f} us -> x{speedup:.2f}; plan-free "
        f"{res['planless'] * 1e3:.1f} us"
    )


def bench_cascade(ws, rows, bw, fi):
    batch, prefix, suffix, ps = 64, 16384, 512, 16
    n_prefix, n_suffix = prefix // ps, suffix // ps
    n_pages = n_prefix + batch * n_suffix
    cache = torch.randn(n_pages, 2, ps, HK, D, dtype=DT, device="cuda")
    q = torch.randn(batch, HQ, D, dtype=DT, device="cuda")
    i32 = dict(dtype=torch.int32, device="cuda")
    prefix_pages = torch.arange(n_prefix, **i32)
    suffix_pages = torch.arange(n_prefix, n_pages, **i32).view(batch, n_suffix)
    # Plain decode: every request's table lists the prefix pages, then its own.
    flat = torch.cat([prefix_pages.expand(batch, -1), suffix_pages], dim=1).reshape(-1)
    indptr = torch.arange(batch + 1, **i32) * (n_prefix + n_suffix)
    last = torch.full((batch,), ps, **i32)
    plain = _ours(ws, (indptr, flat, last), ps)
    t_plain = _time(lambda q_, c_: plain.run(q_, c_), [q, cache])
    casc = MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
    casc.plan(
        [torch.tensor([0, batch], **i32), torch.arange(batch + 1, **i32)],
        [torch.tensor([0, n_prefix], **i32), torch.arange(batch + 1, **i32) * n_suffix],
        [prefix_pages, suffix_pages.reshape(-1)],
        [torch.tensor([ps], **i32), last],
        HQ,
        HK,
        D,
        ps,
        q_data_type=DT,
    )
    t_casc = _time(lambda q_, c_: casc.run(q_, c_), [q, cache])
    ref = plain.run(q, cache)
    err = (casc.run(q, cache).float() - ref.float()).abs().max().item()
    shape = dict(batch=batch, prefix=prefix, suffix=suffix, page_size=ps, hq=HQ, hk=HK, d=D)
    t_fi = None
    if fi is not None:
        try:
            pw = _peer(fi, ws_fi, (indptr, flat, last), ps, True)
            t_fi = _time(lambda q_, c_: pw.run(q_, c_), [q, cache])
            rows.write("cascade_decode", shape, "flashinfer_tc_plain_decode", t_fi)
        except Exception as exc:
            print(f"flashinfer plain decode failed: {exc!r}")
    rows.write("cascade_decode", shape, "flashtune_plain_decode", t_plain)
    rows.write(
        "cascade_decode",
        shape,
        "flashtune_cascade",
        t_casc,
        speedup_vs_plain=t_plain / t_casc,
        max_abs_err_vs_plain=err,
        speedup_vs_flashinfer_plain=(t_fi / t_casc) if t_fi else None,
    )
    print(
        f"cascade: plain {t_plain * 1e3:.1f} us, cascade {t_casc * 1e3:.1f} us -> "
        f"x{t_plain / t_casc:.2f} (max err {err:.3g}); fi plain {t_fi}"
    )


# --only variants (issue 14): RoPE fused into decode, and fp8 KV caches, at these shapes (bf16
# queries), leaving out those whose K and V exceed MAX_KV_BYTES.
VARIANT_BATCHES = (1, 16, 64, 256)
VARIANT_KV_LENS = (1024, 4096, 16384)
VARIANT_PAGE_SIZE = 16
E5M2_BATCHES = (64,)  # float8_e5m2: a subset; float8_e4m3fn: every shape
K_SCALE, V_SCALE = 0.5, 0.7  # fp8: every solution runs with these
MAX_KV_BYTES = 8 * 2**30
AGREE_TOL = 2e-2  # flashtune's and FlashInfer's outputs (bf16, inputs of scale 1)
# kind -> (the row that carries it, numerator, denominator, field), latencies timed alike.
VARIANT_RATIOS = {
    "rope": [
        ("flashtune", "flashtune", "flashtune_plain", "rope_overhead"),
        ("flashinfer", "flashinfer", "flashinfer_plain", "rope_overhead"),
    ],
    "fp8": [
        ("flashtune", "flashinfer", "flashtune", "speedup_vs_flashinfer"),
        ("flashtune_tuned", "flashinfer", "flashtune_tuned", "speedup_vs_flashinfer"),
    ],
}
# kind -> (flashtune's solution, FlashInfer's of the same plan): outputs compared.
VARIANT_AGREE = {
    "rope": [("flashtune", "flashinfer"), ("flashtune_plain", "flashinfer_plain")],
    "fp8": [("flashtune", "flashinfer"), ("flashtune_tuned", "flashinfer")],
}


def _tuned_on_first_call(fn):
    """fn, autotuned by its first call (flashtune.autotune), then run with the tuned tactic:
    whether the default tactic leaves speed behind (fp8 tiles move half the bytes of bf16)."""
    tuned = []

    def call(q, cache):
        if tuned:
            return fn(q, cache)
        with autotune(True):
            out = fn(q, cache)
        tuned.append(True)
        return out

    return call


def variant_case(
    kind,
    batch,
    kv_len,
    *,
    kv_dtype=None,
    page_size=VARIANT_PAGE_SIZE,
    heads=(HQ, HK, D),
    q_dtype=DT,
    device="cuda",
    fi=None,
    tune=True,
):
    """One shape of --only variants: fresh random inputs and every solution planned, nothing
    timed (it runs on CPU under the interpreter too).

    kind "rope": a q_dtype cache; decode planned with pos_encoding_mode="ROPE_LLAMA"
    ("flashtune", "flashinfer") and "NONE" ("flashtune_plain", "flashinfer_plain").
    kind "fp8": a kv_dtype cache under q_dtype queries, run with k_scale=K_SCALE and
    v_scale=V_SCALE ("flashtune", "flashinfer"), and with `tune` "flashtune_tuned" (autotuned
    by its first call).
    Returns dict(q, cache, table, nbytes: K and V bytes, solutions: name ->
    {use_tensor_cores: fn(q, cache)}): flashtune's under None; FlashInfer's, when `fi` is
    given, under True and False (bench_grid's two peers).
    """
    hq, hk, d = heads
    kv_dtype = kv_dtype or q_dtype
    indptr, indices, last, n_pages = build_page_table([kv_len] * batch, page_size, device=device)
    table = (indptr, indices, last)
    q = torch.randn(batch, hq, d, dtype=q_dtype, device=device)
    cache = torch.randn(n_pages, 2, page_size, hk, d, dtype=q_dtype, device=device).to(kv_dtype)
    if kind == "rope":
        plans, run_kw = {"": {"pos_encoding_mode": "ROPE_LLAMA"}, "_plain": {}}, {}
    else:
        plans, run_kw = {"": {"kv_data_type": kv_dtype}}, {"k_scale": K_SCALE, "v_scale": V_SCALE}
    ws_bytes = 128 << 20 if torch.device(device).type == "cuda" else 4 << 20
    solutions = {}
    for suffix, kw in plans.items():
        kw = {"q_data_type": q_dtype, **kw}
        # A workspace per wrapper: all are planned before any runs, and a plan lives there.
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=device)
        w = _ours(ws, table, page_size, heads, **kw)
        solutions["flashtune" + suffix] = {None: functools.partial(w.run, **run_kw)}
        if kind == "fp8" and tune:
            ws = torch.empty(ws_bytes, dtype=torch.uint8, device=device)
            wt = _ours(ws, table, page_size, heads, **kw)
            run = _tuned_on_first_call(functools.partial(wt.run, **run_kw))
            solutions["flashtune_tuned"] = {None: run}
        for tc in (True, False) if fi is not None else ():
            try:
                ws = torch.empty(ws_bytes, dtype=torch.uint8, device=device)
                pw = _peer(fi, ws, table, page_size, tc, heads, **{"kv_data_type": kv_dtype, **kw})
            except Exception as exc:  # JIT or an unsupported combination: the peer is left out
                print(f"  flashinfer{suffix} tc={tc} plan: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            peer = functools.partial(pw.run, **run_kw)
            solutions.setdefault("flashinfer" + suffix, {})[tc] = peer
    nbytes = 2 * batch * kv_len * hk * d * cache.element_size()
    return dict(q=q, cache=cache, table=table, nbytes=nbytes, solutions=solutions)


def _time_case(case):
    """Run and time every solution of `case`: (name -> dict(ms, how, out, tc), name -> error
    of those that failed). FlashInfer's: the faster use_tensor_cores, graph-timed first."""
    args = [case["q"], case["cache"]]
    got, errors = {}, {}
    for name, by_tc in case["solutions"].items():
        for tc, fn in by_tc.items():
            try:
                out = fn(*args)
                ms, how = _time_how(fn, args)
            except Exception as exc:  # a failing solution is recorded, not fatal
                errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(f"  {name} tc={tc}: {errors[name][:200]}", flush=True)
                continue
            rank = (how != "cuda_graph", ms)
            if name not in got or rank < (got[name]["how"] != "cuda_graph", got[name]["ms"]):
                got[name] = dict(ms=ms, how=how, out=out, tc=tc)
    return got, {name: err for name, err in errors.items() if name not in got}


def bench_variants(fi, rows, bw):
    """Issue 14: RoPE fused into decode (rope_overhead = ROPE_LLAMA / NONE, flashtune's and
    FlashInfer's own; target <= 1.05) and fp8-KV decode vs FlashInfer's (speedup_vs_flashinfer
    = FlashInfer's latency / flashtune's). A ratio only of two latencies timed the same way;
    flashtune's outputs are compared with FlashInfer's of the same plan."""
    grid = [(b, kv) for b in VARIANT_BATCHES for kv in VARIANT_KV_LENS]
    cases = [("rope", DT, b, kv) for b, kv in grid]
    cases += [("fp8", torch.float8_e4m3fn, b, kv) for b, kv in grid]
    cases += [("fp8", torch.float8_e5m2, b, kv) for b in E5M2_BATCHES for kv in VARIANT_KV_LENS]
    ratios, excluded = {}, {}  # (op, row, field, kv dtype) -> ratios / pairs timed differently
    print("variants: latency (* = timed with events, not a graph), KV GB/s (fraction of copy bw)")
    for kind, kv_dtype, b, kv in cases:
        kv_name = str(kv_dtype).removeprefix("torch.")
        if 2 * b * kv * HK * D * kv_dtype.itemsize > MAX_KV_BYTES:
            print(f"{kind} {kv_name} b={b} kv={kv}: K and V over {MAX_KV_BYTES >> 30} GiB, skipped")
            continue
        op = f"decode_{kind}"
        case = variant_case(kind, b, kv, kv_dtype=kv_dtype, fi=fi)
        got, errors = _time_case(case)
        shape = dict(batch=b, kv_len=kv, page_size=VARIANT_PAGE_SIZE, hq=HQ, hk=HK, d=D)
        shape.update(q_dtype=str(DT).removeprefix("torch."), kv_dtype=kv_name)
        if kind == "fp8":
            shape.update(k_scale=K_SCALE, v_scale=V_SCALE)
        extra = {name: {} for name in got}
        notes = []
        for row, num, den, field in VARIANT_RATIOS[kind]:
            if num not in got or den not in got:
                continue
            key = (op, row, field, kv_name)
            if got[num]["how"] != got[den]["how"]:
                excluded[key] = excluded.get(key, 0) + 1
                notes.append(f"{row} {field} n/a (timing differs)")
                continue
            extra[row][field] = got[num]["ms"] / got[den]["ms"]
            ratios.setdefault(key, []).append(extra[row][field])
            notes.append(f"{row} {field} {extra[row][field]:.3f}")
        for ours, peer in VARIANT_AGREE[kind]:
            if ours in got and peer in got:
                a, p = got[ours]["out"].float(), got[peer]["out"].float()
                diff = (a - p).abs().max().item()
                agree = torch.allclose(a, p, atol=AGREE_TOL, rtol=AGREE_TOL)
                extra[ours].update(max_abs_diff_vs_flashinfer=diff, agrees_with_flashinfer=agree)
                notes.append(f"{ours} vs fi max diff {diff:.2g}{'' if agree else ' MISMATCH'}")
        cells = []
        for name, g in got.items():
            gbs = case["nbytes"] / (g["ms"] * 1e-3) / 1e9
            tc = {} if g["tc"] is None else {"use_tensor_cores": g["tc"]}
            stats = dict(timing=g["how"], gbs=gbs, bw_frac=gbs / bw, **tc, **extra[name])
            rows.write(op, shape, name, g["ms"], **stats)
            mark = "" if g["how"] == "cuda_graph" else "*"
            cells.append(f"{name} {g['ms'] * 1e3:.1f}{mark} us {gbs:.0f} ({gbs / bw:.0%})")
        for name, err in errors.items():
            rows.write(op, shape, name, None, error=err)
        print(f"{kind} {kv_name} b={b} kv={kv}: " + "  ".join(cells), flush=True)
        if notes:
            print("    " + "; ".join(notes), flush=True)
        del case, got
    print("variants geomeans (ratios of latencies timed alike):")
    for key in sorted(set(ratios) | set(excluded)):
        op, row, field, kv_name = key
        xs, n_out = ratios.get(key, []), excluded.get(key, 0)
        geo = math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None
        goal = " (target <= 1.05)" if (row, field) == ("flashtune", "rope_overhead") else ""
        shown = f"{geo:.3f} (min {min(xs):.3f}, max {max(xs):.3f})" if xs else "n/a"
        print(
            f"  {op} {row} {field} [{kv_name} KV]: geomean {shown} over {len(xs)} shapes, "
            f"{n_out} excluded (timing differs){goal}"
        )
        rows.write(
            f"{op}_summary",
            {"kv_dtype": kv_name},
            row,
            None,
            field=field,
            geomean=geo,
            min=min(xs, default=None),
            max=max(xs, default=None),
            n=len(xs),
            excluded_timing_differs=n_out,
        )


def bench_variant_sweep(rows, bw):
    """Every tactic of the decode kernel on the variants' shapes, for plain bf16, fused RoPE
    and an fp8 (e4m3) cache: which tactic the defaults should pick per variant. Each tactic
    is fixed through plan(launch=...), so nothing is autotuned; the default (no launch) is
    timed in the same loop."""
    from flashtune.ops.attention.decode.config import DecodeLaunch, DecodeTactic

    kinds = [("plain", DT, {}), ("rope", DT, {"pos_encoding_mode": "ROPE_LLAMA"})]
    kinds += [("fp8", torch.float8_e4m3fn, {"kv_data_type": torch.float8_e4m3fn})]
    shapes = [(b, kv) for b in VARIANT_BATCHES for kv in (1024, 16384)]
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    for kind, kv_dtype, plan_kw in kinds:
        run_kw = {"k_scale": K_SCALE, "v_scale": V_SCALE} if kind == "fp8" else {}
        best_over_default, wins = [], {}
        for b, kv in shapes:
            if 2 * b * kv * HK * D * kv_dtype.itemsize > MAX_KV_BYTES:
                continue
            indptr, indices, last, _ = build_page_table([kv] * b, VARIANT_PAGE_SIZE, device="cuda")
            table = (indptr, indices, last)
            n_pages = int(indptr[-1])
            cache = torch.randn(n_pages, 2, VARIANT_PAGE_SIZE, HK, D, dtype=DT, device="cuda")
            cache = cache.to(kv_dtype)
            q = torch.randn(b, HQ, D, dtype=DT, device="cuda")
            nbytes = 2 * b * kv * HK * D * kv_dtype.itemsize
            times = {}
            for tactic in [None, *DecodeTactic.space(D)]:
                launch = None if tactic is None else DecodeLaunch(tactic)
                try:
                    w = _ours(ws, table, VARIANT_PAGE_SIZE, launch=launch, **plan_kw)
                    times[tactic] = _time(functools.partial(w.run, **run_kw), [q, cache])
                except Exception as exc:  # a tactic that does not fit: left out
                    print(f"  {kind} b={b} kv={kv} {tactic}: {type(exc).__name__}: {exc!s:.120}")
            if None not in times:
                continue
            default = times.pop(None)
            best = min(times, key=times.get)
            best_over_default.append(times[best] / default)
            wins[best] = wins.get(best, 0) + 1
            gbs = nbytes / (times[best] * 1e-3) / 1e9
            shape = dict(batch=b, kv_len=kv, page_size=VARIANT_PAGE_SIZE, hq=HQ, hk=HK, d=D)
            shape.update(kind=kind, kv_dtype=str(kv_dtype).removeprefix("torch."))
            for tactic, ms in times.items():
                rows.write("decode_variant_sweep", shape, str(tactic), ms)
            rows.write("decode_variant_sweep", shape, "default", default)
            top = sorted(times, key=times.get)[:3]
            cells = "  ".join(
                f"{t.block_n}/{t.num_warps}/{t.num_stages} {times[t] * 1e3:.1f}" for t in top
            )
            print(
                f"{kind} b={b} kv={kv}: default {default * 1e3:.1f} us, best {cells} us "
                f"({gbs / bw:.0%} of bw)",
                flush=True,
            )
        if best_over_default:
            geo = math.exp(sum(map(math.log, best_over_default)) / len(best_over_default))
            print(f"{kind}: best/default geomean {geo:.3f}; wins {wins}", flush=True)


def main() -> None:
    global ws_fi
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    parts = ["grid", "skewed", "cascade", "sweep", "variants", "variant-sweep", "merge-sweep"]
    ap.add_argument("--only", choices=parts, default=None)
    ap.add_argument("--skip", choices=parts, nargs="*", default=[])
    args = ap.parse_args()
    t0 = time.time()
    bw = copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw:.0f} GB/s")
    fi = _flashinfer()
    ws = torch.empty(128 * 2**20, dtype=torch.uint8, device="cuda")
    ws_fi = torch.empty(128 * 2**20, dtype=torch.uint8, device="cuda")
    rows = RowWriter("decode")
    for part, fn in (
        ("grid", lambda: bench_grid(fi, ws, rows, bw, args.quick)),
        ("skewed", lambda: bench_skewed(ws, rows, bw)),
        ("cascade", lambda: bench_cascade(ws, RowWriter("cascade"), bw, fi)),
        ("sweep", lambda: bench_sweep(ws, rows, bw)),
        ("variants", lambda: bench_variants(fi, rows, bw)),
        ("variant-sweep", lambda: bench_variant_sweep(rows, bw)),
        ("merge-sweep", lambda: bench_merge_sweep(ws, rows, bw)),
    ):
        if (args.only and args.only != part) or part in args.skip:
            continue
        try:
            fn()
        except Exception:
            traceback.print_exc()
        print(f"[{part} done at {time.time() - t0:.0f} s]", flush=True)


ws_fi: torch.Tensor | None = None

if __name__ == "__main__":
    main()

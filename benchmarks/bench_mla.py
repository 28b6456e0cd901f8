"""MLA (DeepSeek's absorbed attention over a paged latent cache) vs FlashInfer 0.2.14 (GPU).

    python benchmarks/bench_mla.py [--only PART ...] [--quick]

PART: decode (16 heads, the FlashInfer-Trace h16 shapes: batch x KV length x page size),
sweep (every tactic at a few decode shapes: what the default should be), mtp (2 and 4 query
tokens per request, causal), prefill (causal, queries over a cached prefix), fp8 (an e4m3
latent cache, per-tensor scales). Rows go to benchmarks/results/mla.jsonl (and $OUT). Every
call is timed with flashtune.timing.measure (cold L2, a CUDA graph of 20 calls, median);
both wrappers are planned once outside the timed region. GB/s counts the ckv + kpe bytes
read once; bw_frac divides by copy_bandwidth_gbs().
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter, copy_bandwidth_gbs  # noqa: E402

from flashtune.ops.mla import BatchMLAPagedAttentionWrapper, MLALaunch  # noqa: E402
from flashtune.ops.mla.config import MLATactic  # noqa: E402
from flashtune.ops.mla.launch import SPLIT_TACTIC, MLAHopperPrefillRunner  # noqa: E402
from flashtune.timing import measure  # noqa: E402

H, DC, DP = 16, 512, 64
DT = torch.bfloat16
SCALE = 1.0 / math.sqrt(128 + 64)


def _time(fn, args):
    try:
        return measure(fn, args, warmup=5, repetitions=30, use_cuda_graph=True).median_ms
    except Exception:  # a peer that cannot be captured: plain events
        torch.cuda.synchronize()
        return measure(fn, args, warmup=5, repetitions=30).median_ms


def _flashinfer():
    try:
        import flashinfer.mla

        return flashinfer
    except Exception as exc:
        print(f"FlashInfer unavailable ({exc!r}); peer recorded as missing")
        return None


def _case(batch, kv_len, qo_len, page_size, kv_dtype=DT):
    """Tensors and the plan arguments of `batch` requests of kv_len tokens (shuffled pages)."""
    pages = -(-kv_len // page_size)
    num_pages = batch * pages
    kv_indices = torch.randperm(num_pages, device="cuda").to(torch.int32)
    kv_indptr = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * pages
    qo_indptr = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * qo_len
    kv_lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    ckv = torch.randn(num_pages, page_size, DC, device="cuda").to(kv_dtype)
    kpe = torch.randn(num_pages, page_size, DP, device="cuda").to(kv_dtype)
    q_nope = torch.randn(batch * qo_len, H, DC, dtype=DT, device="cuda")
    q_pe = torch.randn(batch * qo_len, H, DP, dtype=DT, device="cuda")
    table = (qo_indptr, kv_indptr, kv_indices, kv_lens)
    return table, [q_nope, q_pe, ckv, kpe]


def _plan(w, table, page_size, causal, kv_dtype=DT, **kw):
    w.plan(*table, H, DC, DP, page_size, causal, SCALE, DT, kv_dtype, **kw)
    return w


def _kv_bytes(batch, kv_len, kv_dtype=DT):
    return batch * kv_len * (DC + DP) * torch.tensor([], dtype=kv_dtype).element_size()


class Bench:
    def __init__(self, writer: RowWriter, fi, gluon: bool = True) -> None:
        self.with_gluon = gluon
        self.writer = writer
        self.fi = fi
        self.ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        self.fi_ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        self.compiled: dict[str, str] = {}
        self.bw = copy_bandwidth_gbs()
        print(f"read bandwidth {self.bw:.0f} GB/s", flush=True)

    def one(self, part, batch, kv_len, qo_len, page_size, causal=True, kv_dtype=DT, **kw):
        table, args = _case(batch, kv_len, qo_len, page_size, kv_dtype)
        shape = dict(batch=batch, kv_len=kv_len, qo_len=qo_len, page_size=page_size,
                     heads=H, causal=causal, kv_dtype=str(kv_dtype))  # fmt: skip
        w = _plan(BatchMLAPagedAttentionWrapper(self.ws), table, page_size, causal, kv_dtype)
        fp8 = kv_dtype == torch.float8_e4m3fn
        run_kw = dict(ckv_scale=0.5, kpe_scale=0.5) if fp8 else {}
        ours = _time(lambda a, b, c, d: w.run(a, b, c, d, **run_kw), args)
        nbytes = _kv_bytes(batch, kv_len, kv_dtype)
        gbs = nbytes / (ours * 1e-3) / 1e9
        self.writer.write(
            f"mla_{part}", shape, "flashtune", ours, kv_gbs=gbs, bw_frac=gbs / self.bw
        )
        peer = None
        if self.fi is not None and not fp8:  # 0.2.14's MLA has no fp8 scales
            try:
                fw = self.fi.mla.BatchMLAPagedAttentionWrapper(self.fi_ws, backend="auto")
                _plan(fw, table, page_size, causal)
                o_fi = fw.run(*args)
                o_ft = w.run(*args)
                err = (o_fi.float() - o_ft.float()).abs().max().item()
                peer = _time(lambda a, b, c, d: fw.run(a, b, c, d), args)
                self.writer.write(f"mla_{part}", shape, "flashinfer", peer, max_abs_diff=err)
            except Exception as exc:
                print(f"  flashinfer failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        line = f"{part:8s} b{batch:<4d} kv{kv_len:<6d} qo{qo_len:<3d} ps{page_size:<3d} "
        line += f"flashtune {ours * 1e3:8.1f} us ({gbs:6.0f} GB/s, {gbs / self.bw:4.0%})"
        if peer is not None:
            line += f"  flashinfer {peer * 1e3:8.1f} us  speedup {peer / ours:5.2f}x"
        print(line, flush=True)
        if not fp8 and self.with_gluon:
            self.gluon(part, shape, w, args, peer)

    def gluon(self, part, shape, w, args, peer) -> None:
        """The Gluon sm_90 runner (mla/hopper.py) at each of its tactics (0, 1 on
        multi-token plans; 2, split-KV, also at decode), called the way the wrapper calls it
        (staging and the merge included), whether or not it is admitted to the wrapper's
        path or the tuner's space; checked against the wrapper's output first."""
        q_nope = args[0]
        plan = w._planner.plan
        out = torch.empty_like(q_nope)
        lse = torch.empty(q_nope.shape[:2], dtype=torch.float32, device=q_nope.device)
        runner = MLAHopperPrefillRunner()
        inputs = [*args, plan, out, lse]
        tactics = [0, 1] if runner.qualifies(inputs) else []
        tactics += [SPLIT_TACTIC] if runner._split_ok(inputs) else []
        if not tactics:
            return
        expect = w.run(*args).float()
        for tactic in tactics:
            try:
                o = runner.forward([*args, plan, out, lse], tactic).float()
                err = (o - expect).abs().max().item()
                ms = _time(
                    lambda a, b, c, d, t=tactic: runner.forward([a, b, c, d, plan, out, lse], t),
                    args,
                )
            except Exception as exc:
                print(f"  gluon tactic {tactic} failed: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            label = "flashtune_gluon" + {0: "", 1: "_overlap", SPLIT_TACTIC: "_split"}[tactic]
            self.writer.write(f"mla_{part}", shape, label, ms, max_abs_diff=err)
            vs = f"  vs flashinfer {peer / ms:5.2f}x" if peer is not None else ""
            print(f"  {label:24s} {ms * 1e3:8.1f} us  max|diff| {err:.3g}{vs}", flush=True)

    def chunks(self, batch, kv_len, page_size, splits) -> None:
        """Decode at one shape with each forced KV chunk (None: the plan's own), the default
        tactic: the time, the grid and the most chunks a tile."""
        table, args = _case(batch, kv_len, 1, page_size)
        shape = dict(batch=batch, kv_len=kv_len, qo_len=1, page_size=page_size, heads=H,
                     kv_dtype=str(DT))  # fmt: skip
        line = []
        for split in splits:
            w = _plan(BatchMLAPagedAttentionWrapper(self.ws), table, page_size, True,
                      fixed_split_size=split)  # fmt: skip
            ms = _time(lambda a, b, c, d, w=w: w.run(a, b, c, d), args)
            plan = w._planner.plan
            info = plan.host.merge_info
            chunks = int(info[:, 1].max()) if info.size else 0
            label = f"flashtune_chunk{split or 'auto'}"
            self.writer.write("mla_sweep_chunk", shape, label, ms, grid=plan.grid_ctas,
                              max_chunks=chunks, kv_chunk=plan.host.kv_chunk_size)  # fmt: skip
            line.append(f"{split or 'auto'}({plan.host.kv_chunk_size}, {chunks}x, "
                        f"{plan.grid_ctas} ctas): {ms * 1e3:.1f}")  # fmt: skip
        print(f"sweep-chunk b{batch} kv{kv_len} (us): " + "  ".join(line), flush=True)

    def sweep(self, batch, kv_len, page_size, qo_len=1, tactics=None, block_m=None,
              kv_dtype=DT):  # fmt: skip
        """Every tactic (and 1 or 2 CTAs an SM) at one shape, with what each compiled to
        (registers a thread, spills, shared memory)."""
        from flashtune.ops.mla.kernels import mla_paged_kernel

        table, args = _case(batch, kv_len, qo_len, page_size, kv_dtype)
        shape = dict(batch=batch, kv_len=kv_len, qo_len=qo_len, page_size=page_size, heads=H,
                     kv_dtype=str(kv_dtype))  # fmt: skip
        fixed = MLALaunch(block_m=block_m)
        default = _plan(BatchMLAPagedAttentionWrapper(self.ws), table, page_size, True, kv_dtype,
                        launch=fixed)  # fmt: skip
        block_m = default._planner.plan.block_m
        run_kw = dict(ckv_scale=0.5, kpe_scale=0.5) if kv_dtype != DT else {}
        base = default._planner.plan.default_tactic
        results = []
        for tactic in tactics or MLATactic.space(block_m, kv_dtype.itemsize):
            # 8 warps take more than half the register file: one CTA an SM whatever we ask.
            for ctas in (1, 2) if tactic.num_warps == 4 else (1,):
                launch = MLALaunch(tactic=tactic, max_ctas_per_sm=ctas, block_m=block_m)
                w = _plan(BatchMLAPagedAttentionWrapper(self.ws), table, page_size, True,
                          kv_dtype, launch=launch)  # fmt: skip
                before = _compiled(mla_paged_kernel)
                try:
                    ms = _time(lambda a, b, c, d, w=w: w.run(a, b, c, d, **run_kw), args)
                except Exception as exc:  # out of shared memory, ...
                    print(f"  {tactic}: {type(exc).__name__}", flush=True)
                    continue
                new = [k for i, k in _compiled(mla_paged_kernel).items() if i not in before]
                meta = ""
                if new:
                    k = new[0]
                    meta = f"regs {k.n_regs} spills {k.n_spills} smem {k.metadata.shared}"
                    self.compiled[f"{tactic}{block_m}{kv_dtype}"] = meta
                meta = self.compiled.get(f"{tactic}{block_m}{kv_dtype}", meta)
                grid = w._planner.plan.grid_ctas
                results.append((ms, tactic, ctas))
                label = f"flashtune_{tactic}_ctas{ctas}_m{block_m}"
                self.writer.write("mla_sweep", shape, label, ms, block_m=block_m, compiled=meta,
                                  grid=grid)  # fmt: skip
                print(f"  {tactic} ctas/SM {ctas} (grid {grid}): {ms * 1e3:.1f} us  [{meta}]",
                      flush=True)  # fmt: skip
        results.sort(key=lambda r: r[0])
        print(f"sweep b{batch} kv{kv_len} ps{page_size} qo{qo_len} (block_m {block_m}, default "
              f"{base}): best " +  # fmt: skip
              ", ".join(f"{t.block_n}/{t.num_warps}/{t.num_stages}"
                        f"{'r' if t.reload_q else ''}{'/dv' + str(t.dv_split) if t.dv_split > 1 else ''}"
                        f"{'/fm' if t.fused_merge else ''}{'/ps' if t.p_scratch else ''}"
                        f"x{c} {ms * 1e3:.1f}" for ms, t, c in results[:5]),  # fmt: skip
              flush=True)  # fmt: skip


def _compiled(kernel) -> dict[int, object]:
    """The kernel's compiled variants on the current device, by id."""
    found: dict[int, object] = {}
    for cache in getattr(kernel, "device_caches", {}).values():
        for k in cache[0].values():
            found[id(k)] = k
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", default=["decode", "mtp", "prefill", "fp8"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--full-sweep", action="store_true", help="every tactic in the sweep")
    parser.add_argument(
        "--no-gluon", action="store_true", help="leave out the Gluon sm_90 runner's tactics"
    )
    args = parser.parse_args()
    fi = _flashinfer()
    bench = Bench(RowWriter("mla"), fi, gluon=not args.no_gluon)
    batches = (1, 16, 64, 128) if not args.quick else (1, 64)
    lens = (1024, 4096, 16384) if not args.quick else (4096,)
    for part in args.only:
        try:
            if part == "decode":
                for ps in (1, 64):
                    for b in batches:
                        for n in lens:
                            bench.one("decode", b, n, 1, ps)
            elif part == "sweep":
                few = [MLATactic(bn, nw, ns) for bn in (32, 64) for nw in (4, 8) for ns in (2, 3)]
                for b, n, ps in ((128, 8192, 64), (16, 4096, 64), (1, 16384, 64)):
                    bench.sweep(b, n, ps, tactics=None if args.full_sweep else few)
            elif part == "sweep-reload":
                few = [
                    MLATactic(bn, 8, ns, rq)
                    for bn in (32, 64)
                    for ns in (2, 3)
                    for rq in (False, True)
                ]
                bench.sweep(32, 4096, 64, qo_len=4, tactics=few, block_m=64)
                bench.sweep(4, 4096, 64, qo_len=1024, tactics=few, block_m=64)
                bench.sweep(32, 4096, 64, qo_len=2, tactics=few, block_m=32)
            elif part == "sweep-mtp":
                few = [MLATactic(bn, nw, ns) for bn in (32, 64) for nw in (8, 16) for ns in (2, 3)]
                for block_m in (32, 64):
                    bench.sweep(32, 4096, 64, qo_len=4, tactics=few, block_m=block_m)
            elif part == "sweep-prefill":
                few = [MLATactic(bn, nw, ns) for bn in (32, 64) for nw in (8, 16) for ns in (2, 3)]
                bench.sweep(4, 4096, 64, qo_len=1024, tactics=few, block_m=64)
            elif part == "sweep-split":
                # The output columns over one or two programs (MLATactic.dv_split), prefill
                # and MTP at 64 rows, q kept or reloaded.
                fits = MLATactic.space(64)  # 32/8/3 and 64/8/2 split in two do not
                few = [
                    t
                    for bn, ns in ((32, 2), (32, 3), (64, 2))
                    for rq in (False, True)
                    for dv in (1, 2)
                    if (t := MLATactic(bn, 8, ns, rq, dv)) in fits
                ]
                bench.sweep(4, 4096, 64, qo_len=1024, tactics=few, block_m=64)
                bench.sweep(1, 8192, 64, qo_len=4096, tactics=few, block_m=64)
                bench.sweep(32, 4096, 64, qo_len=4, tactics=few, block_m=64)
            elif part == "sweep-scratch":
                # P through a scratch tile (MLATactic.p_scratch: the score MMA once a KV
                # tile, not once a warpgroup, but the KV loads unpipelined) against the
                # prefill and MTP defaults' family, at 64 rows.
                few = [
                    MLATactic(bn, 8, 2, rq, p_scratch=ps)
                    for bn in (32, 64)
                    for rq in (False, True)
                    for ps in (False, True)
                ]
                bench.sweep(4, 4096, 64, qo_len=1024, tactics=few, block_m=64)
                bench.sweep(1, 8192, 64, qo_len=4096, tactics=few, block_m=64)
                bench.sweep(32, 4096, 64, qo_len=4, tactics=few, block_m=64)
            elif part == "sweep-merge":
                # Split tiles merged in the attention kernel (MLATactic.fused_merge) or by the
                # merge kernel, where the merge launch weighs most: small batch, short KV.
                few = [
                    MLATactic(64, 8, ns, fused_merge=fm) for ns in (2, 3) for fm in (False, True)
                ]
                for b, n in ((16, 1024), (64, 1024), (16, 4096), (1, 16384)):
                    bench.sweep(b, n, 64, tactics=few)
            elif part == "sweep-chunk":
                # The plan's KV chunk (fixed_split_size) against its own choice, at the
                # batches between the latency regime (fine chunks) and a full grid.
                for b, n in ((8, 1024), (16, 1024), (16, 4096), (32, 1024), (64, 1024), (64, 4096)):
                    bench.chunks(b, n, 64, (None, 64, 128, 256, 512))
            elif part == "sweep-fp8":
                few = [MLATactic(bn, nw, ns) for bn in (64, 128) for nw in (8, 16) for ns in (2, 3)]
                bench.sweep(128, 8192, 64, tactics=few, kv_dtype=torch.float8_e4m3fn)
            elif part == "mtp":
                for qo in (2, 4):
                    for b, n in ((1, 8192), (64, 4096)):
                        bench.one("mtp", b, n, qo, 64)
            elif part == "prefill":
                for b, n, qo in ((1, 8192, 4096), (4, 4096, 1024), (16, 2048, 256)):
                    bench.one("prefill", b, n, qo, 64)
            elif part == "fp8":
                for b, n in ((1, 16384), (64, 4096), (128, 4096)):
                    bench.one("fp8", b, n, 1, 64, kv_dtype=torch.float8_e4m3fn)
            else:
                print(f"unknown part {part}")
        except Exception:
            traceback.print_exc()


if __name__ == "__main__":
    main()

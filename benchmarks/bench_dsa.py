"""DSA (DeepSeek-V3.2's sparse attention) on the GPU: flashtune's Triton kernels vs a
straightforward torch implementation, and vs FlashInfer's sparse MLA where it runs here.

    python benchmarks/bench_dsa.py [--only PART ...] [--quick]

PART: attention (sparse MLA, 16 heads, 512 + 64, topk 2048, page sizes 1 and 64: tokens x
cache size), indexer (64 heads of 128, fp8 keys in pages of 64, topk 2048: batch x request
length), sweep (every tactic of the attention and the indexer at a few shapes). Rows go to
benchmarks/results/dsa.jsonl (and $OUT). Every call is timed with flashtune.timing.measure
(cold L2, a CUDA graph of 20 calls, median). The torch peers are what one writes in plain
PyTorch: gather the selected rows, bf16 matmuls, fp32 softmax (attention); gather each
request's pages, dequantize, matmul, ReLU, weighted sum, torch.topk, map to slots (indexer).
Bytes floor: the bytes the op must read at least (the selected latent rows; every token's
fp8 key and scale), over `copy_bandwidth_gbs()` (bw_frac: the fraction of it reached).
FlashInfer: its sparse MLA is trtllm-gen's decode (SM100) and an SM120 kernel; on Hopper it
has none, and the rows say so (solution "flashinfer", latency null).
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

from flashtune.ops.dsa import dsa_sparse_attention, dsa_topk_indexer, pack_index_cache  # noqa: E402
from flashtune.ops.dsa.config import (  # noqa: E402
    ATTENTION_CANDIDATES,
    INDEXER_CANDIDATES,
)
from flashtune.ops.dsa.launch import run_indexer, run_sparse_attention  # noqa: E402
from flashtune.timing import measure  # noqa: E402

H, DC, DP, TOPK = 16, 512, 64, 2048
IH, ID, IPS = 64, 128, 64  # the indexer's heads, head dim, page size
DT = torch.bfloat16
SCALE = 1.0 / math.sqrt(128 + 64)


def _time(fn, args):
    try:
        return measure(fn, args, warmup=5, repetitions=30, use_cuda_graph=True).median_ms
    except Exception:  # a peer that cannot be captured: plain events
        torch.cuda.synchronize()
        return measure(fn, args, warmup=5, repetitions=30).median_ms


def flashinfer_sparse_mla() -> tuple[object | None, str]:
    """FlashInfer's sparse MLA if this GPU runs one, else None and why not."""
    try:
        import flashinfer
    except Exception as exc:
        return None, f"flashinfer not importable ({type(exc).__name__})"
    major, minor = torch.cuda.get_device_capability()
    version = getattr(flashinfer, "__version__", "?")
    decode = getattr(
        getattr(flashinfer, "decode", None), "trtllm_batch_decode_with_kv_cache_mla", None
    )
    if decode is None:
        return None, f"flashinfer {version} has no trtllm_batch_decode_with_kv_cache_mla"
    if major != 10 and (major, minor) != (12, 0):
        return None, (
            f"flashinfer {version}: sparse MLA is trtllm-gen (SM100) / SM120 only; this GPU is "
            f"SM{major}{minor}"
        )
    return decode, f"flashinfer {version}"


# --------------------------------------------------------------------------- torch peers


def torch_sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    """Plain PyTorch: gather the selected rows, bf16 matmuls (fp32 accumulate), fp32 softmax."""
    ckv = ckv_cache.reshape(-1, ckv_cache.shape[-1])
    kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])
    valid = sparse_indices >= 0
    idx = torch.where(valid, sparse_indices, 0).long()
    kc, kp = ckv[idx], kpe[idx]  # [T, topk, Dc], [T, topk, Dp]
    logits = (q_nope @ kc.transpose(1, 2)).float() + (q_pe @ kp.transpose(1, 2)).float()
    logits = (logits * sm_scale).masked_fill(~valid[:, None, :], -math.inf)
    lse = torch.logsumexp(logits, -1)
    p = torch.exp(logits - lse[..., None]).nan_to_num(0.0)
    return (p.to(q_nope.dtype) @ kc), lse / math.log(2.0)


def torch_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk=TOPK):
    """Plain PyTorch, batched (no host sync): gather every request's pages of fp8 keys and
    scales, dequantize to bf16, matmul, ReLU, weighted head sum, mask past seq_len, topk."""
    num_pages, page_size, _, width = k_index_cache_fp8.shape
    d = width - 4
    raw = k_index_cache_fp8.view(torch.uint8).view(num_pages, page_size * width)
    values = raw[:, : page_size * d].view(torch.float8_e4m3fn).view(num_pages, page_size, d)
    scales = raw[:, page_size * d :].view(torch.float32)  # [P, page_size]
    pages = block_table.long()  # [B, M]
    k = values[pages].to(torch.bfloat16)  # [B, M, ps, d]
    batch = pages.shape[0]
    k = k.view(batch, -1, d)
    s = scales[pages].view(batch, -1)  # [B, M * ps]
    logits = (q_index_fp8.to(torch.bfloat16) @ k.transpose(1, 2)).float() * s[:, None, :]
    logits = (torch.relu(logits) * weights[:, :, None]).sum(1)  # [B, M * ps]
    pos = torch.arange(logits.shape[1], device=logits.device)
    logits = logits.masked_fill(pos[None, :] >= seq_lens[:, None], -math.inf)
    best = torch.topk(logits, min(topk, logits.shape[1]), dim=1).indices
    slots = torch.gather(pages, 1, best // page_size) * page_size + best % page_size
    return torch.where(best < seq_lens[:, None], slots, -1).to(torch.int32)


# --------------------------------------------------------------------------- cases


def attention_case(tokens: int, cache_tokens: int, page_size: int):
    """Queries, a cache of cache_tokens latent rows, each token's 2048 distinct slots."""
    num_pages = -(-cache_tokens // page_size)
    slots = num_pages * page_size
    q_nope = torch.randn(tokens, H, DC, dtype=DT, device="cuda")
    q_pe = torch.randn(tokens, H, DP, dtype=DT, device="cuda")
    ckv = torch.randn(num_pages, page_size, DC, dtype=DT, device="cuda")
    kpe = torch.randn(num_pages, page_size, DP, dtype=DT, device="cuda")
    idx = torch.rand(tokens, slots, device="cuda").argsort(1)[:, :TOPK].to(torch.int32)
    return [q_nope, q_pe, ckv, kpe, idx, SCALE]


def indexer_case(batch: int, seq_len: int):
    """batch requests of seq_len tokens in shuffled pages of 64 (fp8 keys, random scales)."""
    pages = -(-seq_len // IPS)
    num_pages = batch * pages
    table = torch.randperm(num_pages, device="cuda").to(torch.int32).view(batch, pages)
    keys = torch.randn(num_pages, IPS, ID, device="cuda") * torch.rand(
        num_pages, IPS, 1, device="cuda"
    )
    q = torch.randn(batch, IH, ID, device="cuda").to(torch.float8_e4m3fn)
    weights = torch.randn(batch, IH, device="cuda") / 8
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device="cuda")
    return [q, pack_index_cache(keys), weights, seq_lens, table]


class Bench:
    def __init__(self, writer: RowWriter) -> None:
        self.writer = writer
        self.bw = copy_bandwidth_gbs()
        self.fi, self.fi_why = flashinfer_sparse_mla()
        print(
            f"read bandwidth {self.bw:.0f} GB/s; FlashInfer sparse MLA: {self.fi_why}", flush=True
        )

    def attention(self, tokens: int, cache_tokens: int, page_size: int) -> None:
        args = attention_case(tokens, cache_tokens, page_size)
        shape = dict(tokens=tokens, cache_tokens=cache_tokens, page_size=page_size, heads=H,
                     head_dim_ckv=DC, head_dim_kpe=DP, topk=TOPK)  # fmt: skip
        out, lse = dsa_sparse_attention(*args)
        ref_out, ref_lse = torch_sparse_attention(*args)
        err = (out.float() - ref_out.float()).abs().max().item()
        lse_err = (lse - ref_lse).abs().max().item()
        ours = _time(dsa_sparse_attention, args)
        peer = _time(torch_sparse_attention, args)
        nbytes = tokens * TOPK * (DC + DP) * 2 + 2 * tokens * H * (DC + DP) * 2
        gbs = nbytes / (ours * 1e-3) / 1e9
        floor_ms = nbytes / (self.bw * 1e9) * 1e3
        common = dict(bytes=nbytes, floor_ms=floor_ms)
        self.writer.write("dsa_sparse_attention", shape, "flashtune", ours, gbs=gbs,
                          bw_frac=gbs / self.bw, speedup_vs_torch=peer / ours, **common)  # fmt: skip
        self.writer.write("dsa_sparse_attention", shape, "torch", peer,
                          max_abs_diff=err, lse_max_abs_diff=lse_err, **common)  # fmt: skip
        self.writer.write("dsa_sparse_attention", shape, "flashinfer", None, note=self.fi_why)
        print(f"attention t{tokens:<5d} cache{cache_tokens:<7d} ps{page_size:<3d} flashtune "
              f"{ours * 1e3:8.1f} us ({gbs:5.0f} GB/s, {gbs / self.bw:4.0%}, floor "
              f"{floor_ms * 1e3:.1f} us)  torch {peer * 1e3:8.1f} us  {peer / ours:5.2f}x  "
              f"(max diff {err:.3g}, lse {lse_err:.2g})", flush=True)  # fmt: skip

    def indexer(self, batch: int, seq_len: int) -> None:
        args = indexer_case(batch, seq_len)
        shape = dict(batch=batch, seq_len=seq_len, heads=IH, head_dim=ID, page_size=IPS, topk=TOPK)
        ours_idx = dsa_topk_indexer(*args)
        peer_idx = torch_indexer(*args)
        # Sets, not sequences (ties may order differently): the share of the peer's picks ours has.
        overlap = _overlap(ours_idx, peer_idx)
        ours = _time(dsa_topk_indexer, args)
        peer = _time(torch_indexer, args)
        nbytes = batch * seq_len * (ID + 4) + batch * seq_len * 4 + batch * TOPK * 4
        gbs = nbytes / (ours * 1e-3) / 1e9
        floor_ms = nbytes / (self.bw * 1e9) * 1e3
        common = dict(bytes=nbytes, floor_ms=floor_ms)
        self.writer.write("dsa_topk_indexer", shape, "flashtune", ours, gbs=gbs,
                          bw_frac=gbs / self.bw, speedup_vs_torch=peer / ours, **common)  # fmt: skip
        self.writer.write("dsa_topk_indexer", shape, "torch", peer, set_overlap=overlap, **common)
        print(f"indexer b{batch:<4d} len{seq_len:<7d} flashtune {ours * 1e3:8.1f} us ({gbs:5.0f} "
              f"GB/s, {gbs / self.bw:4.0%})  torch {peer * 1e3:8.1f} us  {peer / ours:5.2f}x  "
              f"(set overlap {overlap:.4f})", flush=True)  # fmt: skip

    def sweep(self) -> None:
        """Every tactic at a decode and a prefill shape of each op."""
        for tokens, ps in ((1, 64), (64, 64), (512, 1)):
            args = attention_case(tokens, 65536, ps)
            shape = dict(tokens=tokens, cache_tokens=65536, page_size=ps, topk=TOPK)
            results = []
            for t in ATTENTION_CANDIDATES:
                try:
                    ms = _time(lambda *a, t=t: run_sparse_attention(*a, tactic=t), args)
                except Exception as exc:
                    print(f"  {t}: {type(exc).__name__}", flush=True)
                    continue
                results.append((ms, t))
                self.writer.write("dsa_sparse_attention_sweep", shape, f"flashtune_{t}", ms)
            results.sort(key=lambda r: r[0])
            print(f"sweep attention t{tokens} ps{ps}: " + ", ".join(
                f"{t.block_n}/{t.num_warps}/{t.num_stages}/p{t.programs_per_sm} {ms * 1e3:.1f}"
                for ms, t in results[:5]), flush=True)  # fmt: skip
        for batch, seq_len in ((1, 65536), (64, 8192)):
            args = indexer_case(batch, seq_len)
            shape = dict(batch=batch, seq_len=seq_len, topk=TOPK)
            results = []
            for t in INDEXER_CANDIDATES:
                try:
                    ms = _time(lambda *a, t=t: run_indexer(*a, topk=TOPK, tactic=t), args)
                except Exception as exc:
                    print(f"  {t}: {type(exc).__name__}", flush=True)
                    continue
                results.append((ms, t))
                self.writer.write("dsa_topk_indexer_sweep", shape, f"flashtune_{t}", ms)
            results.sort(key=lambda r: r[0])
            print(f"sweep indexer b{batch} len{seq_len}: " + ", ".join(
                f"{t.block_n}/{t.num_warps}/{t.num_stages} {ms * 1e3:.1f}"
                for ms, t in results[:5]), flush=True)  # fmt: skip


def _overlap(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    hits = total = 0
    for a, b in zip(ours.tolist(), theirs.tolist(), strict=True):
        sa, sb = {x for x in a if x >= 0}, {x for x in b if x >= 0}
        hits += len(sa & sb)
        total += max(len(sb), 1)
    return hits / total


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--only", nargs="*", default=["attention", "indexer"])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    bench = Bench(RowWriter("dsa"))
    tokens = (1, 8, 64, 512) if args.quick else (1, 4, 16, 64, 128, 512, 2048)
    lens = (8192, 65536) if args.quick else (4096, 16384, 65536, 131072)
    batches = (1, 64) if args.quick else (1, 16, 64, 128)
    for part in args.only:
        try:
            if part == "attention":
                for ps in (1, 64):
                    for t in tokens:
                        bench.attention(t, 65536, ps)
            elif part == "indexer":
                for b in batches:
                    for n in lens:
                        if b * n <= 128 * 65536:  # the torch peer's gather: <= 2 GB of bf16 keys
                            bench.indexer(b, n)
            elif part == "sweep":
                bench.sweep()
            else:
                print(f"unknown part {part}")
        except Exception:
            traceback.print_exc()


if __name__ == "__main__":
    main()

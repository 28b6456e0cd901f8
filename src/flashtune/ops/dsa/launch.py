"""Host side of DSA: input checks, output allocation, launches (kernels.py, topk.py).

The indexer runs in two phases: the Triton kernel writes every row's fp32 scores over its
request's tokens ([B, max_num_pages * page_size], -inf past seq_len), then a select picks
the best topk and maps positions to cache slots. The default select is topk.py's
multi-program radix select (slots in no particular order, then -1): torch.topk runs a row
in one or a few CTAs, and at decode (a few rows of up to 128k scores) it cost several
times the score pass. `SelectTactic(method="torch")` keeps torch.topk (best first) as the
fallback and the comparison.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton

from flashtune import platform
from flashtune.ops.dsa.cache import index_cache_views
from flashtune.ops.dsa.config import (
    DEFAULT_ATTENTION,
    DEFAULT_INDEXER,
    AttentionTactic,
    IndexerTactic,
    splits_for,
)
from flashtune.ops.dsa.kernels import (
    LOG2E,
    dsa_attention_kernel,
    indexer_logits_kernel,
    merge_splits_kernel,
)
from flashtune.ops.dsa.topk import DEFAULT_SELECT, SelectTactic, radix_topk_slots

__all__ = ["indexer_logits", "run_indexer", "run_sparse_attention", "select_topk"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_FP8 = (torch.float8_e4m3fn,)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check(
    name: str, t: Any, rank: int, dtypes: tuple[torch.dtype, ...], device: torch.device | None
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        names = " or ".join(_name(d) for d in dtypes)
        raise TypeError(f"{name} must be {names}, got {_name(t.dtype)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the queries' device)")
    return t


def _same(name: str, got: object, want: object, what: str) -> None:
    if got != want:
        raise ValueError(f"{name}: {what} is {got}, expected {want}")


def _pow2(name: str, value: int) -> None:
    if value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16 (a Triton tile), got {value}")


# --------------------------------------------------------------------------- indexer


def indexer_logits(
    q: torch.Tensor,
    values: torch.Tensor,
    scales: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    tactic: IndexerTactic = DEFAULT_INDEXER,
) -> torch.Tensor:
    """Each row's scores over its request's tokens: [B, max_num_pages * page_size] fp32,
    -inf past seq_len. values [num_pages, page_size, D] (fp8, or any float: the tests' stand-in
    for a cache of another layout) and scales [num_pages, page_size] float32 may be strided."""
    batch, heads, head_dim = q.shape
    page_size = values.shape[1]
    max_len = block_table.shape[1] * page_size
    logits = torch.empty(batch, max_len, dtype=torch.float32, device=q.device)
    if batch == 0 or max_len == 0:
        return logits
    if values.stride(2) != 1 or q.stride(2) != 1:
        raise ValueError("the keys' and queries' last dimension must be contiguous")
    chunk = max(tactic.chunk, tactic.block_n)
    grid = (batch, triton.cdiv(max_len, chunk))
    indexer_logits_kernel[grid](
        q, values, scales, weights, seq_lens, block_table, logits, max_len, heads,
        q.stride(0), q.stride(1), values.stride(0), values.stride(1), scales.stride(0),
        scales.stride(1), weights.stride(0), block_table.stride(0), logits.stride(0),
        D=head_dim, PAGE_SIZE=page_size, BLOCK_H=max(16, triton.next_power_of_2(heads)),
        BLOCK_N=tactic.block_n, CHUNK=chunk, num_warps=tactic.num_warps,
        num_stages=tactic.num_stages,
    )  # fmt: skip
    return logits


def select_topk(
    logits: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    topk: int,
    select: SelectTactic = DEFAULT_SELECT,
) -> torch.Tensor:
    """The min(topk, seq_len) best positions of each row as cache slots (page * page_size +
    offset), then -1. select.method "radix" (the default): in no particular order, ties at
    the k-th score to the lowest positions; "torch": torch.topk's, best first."""
    if select.method == "radix":
        return radix_topk_slots(logits, seq_lens, block_table, page_size, topk, select)
    if select.method != "torch":
        raise ValueError(f"select.method must be 'radix' or 'torch', got {select.method!r}")
    batch, max_len = logits.shape
    out = torch.full((batch, topk), -1, dtype=torch.int32, device=logits.device)
    k = min(topk, max_len)
    if batch == 0 or k == 0:
        return out
    pos = torch.topk(logits, k, dim=1, sorted=True).indices  # [B, k] int64
    page = torch.gather(block_table, 1, pos // page_size).to(torch.int64)
    slots = page * page_size + pos % page_size
    valid = pos < seq_lens.to(torch.int64)[:, None]
    out[:, :k] = torch.where(valid, slots, -1).to(torch.int32)
    return out


def run_indexer(
    q_index_fp8: torch.Tensor,
    k_index_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    topk: int,
    tactic: IndexerTactic = DEFAULT_INDEXER,
    select: SelectTactic = DEFAULT_SELECT,
) -> torch.Tensor:
    """Check the indexer's inputs (see ops.dsa.dsa_topk_indexer), then score and select."""
    q = _check("q_index_fp8", q_index_fp8, 3, (*_FP8, *_FLOATS), None)
    dev = q.device
    batch, heads, head_dim = q.shape
    values, scales = index_cache_views(k_index_cache_fp8)
    if k_index_cache_fp8.device != dev:
        raise ValueError(f"k_index_cache_fp8 is on {k_index_cache_fp8.device}, expected {dev}")
    _same("k_index_cache_fp8", k_index_cache_fp8.shape[3], head_dim + 4, "its last dimension")
    _pow2("index_head_dim (q_index_fp8.shape[2])", head_dim)
    _check("weights", weights, 2, (torch.float32,), dev)
    _same("weights", tuple(weights.shape), (batch, heads), "the shape")
    _check("seq_lens", seq_lens, 1, (torch.int32,), dev)
    _same("seq_lens", seq_lens.shape[0], batch, "the length")
    _check("block_table", block_table, 2, (torch.int32,), dev)
    _same("block_table", block_table.shape[0], batch, "the row count")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be a positive int, got {topk!r}")
    if weights.stride(1) != 1 or seq_lens.stride(0) != 1 or block_table.stride(1) != 1:
        raise ValueError("weights, seq_lens and block_table must be contiguous in their last dim")
    logits = indexer_logits(q, values, scales, weights, seq_lens, block_table, tactic)
    return select_topk(logits, seq_lens, block_table, values.shape[1], topk, select)


# --------------------------------------------------------------------------- sparse attention


def _scale(sm_scale: Any) -> float:
    if isinstance(sm_scale, torch.Tensor):
        if sm_scale.numel() != 1:
            raise ValueError(f"sm_scale must be a scalar, got shape {tuple(sm_scale.shape)}")
        return float(sm_scale.item())
    if not isinstance(sm_scale, (int, float)) or isinstance(sm_scale, bool):
        raise TypeError(f"sm_scale must be a float, got {type(sm_scale).__name__}")
    value = float(sm_scale)
    if not math.isfinite(value):
        raise ValueError(f"sm_scale must be finite, got {value}")
    return value


def run_sparse_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    sm_scale: float | torch.Tensor,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    tactic: AttentionTactic = DEFAULT_ATTENTION,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check the inputs (see ops.dsa.dsa_sparse_attention), then launch; returns (out, lse).
    num_splits: how many splits of each token's slots (None: `config.splits_for`)."""
    qn = _check("q_nope", q_nope, 3, (torch.float16, torch.bfloat16), None)
    dev = qn.device
    tokens, heads, d_ckv = qn.shape
    qp = _check("q_pe", q_pe, 3, (qn.dtype,), dev)
    _same("q_pe", tuple(qp.shape[:2]), (tokens, heads), "[num_tokens, num_heads]")
    d_kpe = qp.shape[2]
    # The caches in q's dtype: an fp8 latent cache needs its scales, which no DSA contract has.
    ckv = _check("ckv_cache", ckv_cache, 3, (qn.dtype,), dev)
    kpe = _check("kpe_cache", kpe_cache, 3, (qn.dtype,), dev)
    _same("ckv_cache", ckv.shape[2], d_ckv, "head_dim_ckv (its last dimension)")
    _same("kpe_cache", kpe.shape[2], d_kpe, "head_dim_kpe (its last dimension)")
    _same("kpe_cache", tuple(kpe.shape[:2]), tuple(ckv.shape[:2]), "[num_pages, page_size]")
    idx = _check("sparse_indices", sparse_indices, 2, (torch.int32,), dev)
    _same("sparse_indices", idx.shape[0], tokens, "the row count")
    _pow2("head_dim_ckv", d_ckv)
    _pow2("head_dim_kpe", d_kpe)
    for name, t in (("q_nope", qn), ("q_pe", qp), ("ckv_cache", ckv), ("kpe_cache", kpe)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous")
    if idx.stride(1) != 1:
        raise ValueError("sparse_indices' last dimension must be contiguous")
    scale = _scale(sm_scale)
    topk, page_size = idx.shape[1], ckv.shape[1]
    if out is None:
        out = torch.empty_like(qn)
    else:
        _check("out", out, 3, (qn.dtype,), dev)
        _same("out", tuple(out.shape), tuple(qn.shape), "the shape")
    if lse is None:
        lse = torch.empty(tokens, heads, dtype=torch.float32, device=dev)
    else:
        _check("lse", lse, 2, (torch.float32,), dev)
        _same("lse", tuple(lse.shape), (tokens, heads), "the shape")
    if out.stride(2) != 1 or lse.stride(1) != 1:
        raise ValueError("out's and lse's last dimensions must be contiguous")
    if tokens == 0 or heads == 0:
        return out, lse
    block_n = tactic.block_n
    if num_splits is None:
        sms = platform.device_limits(dev).sm_count
        num_splits = splits_for(tokens, topk, tactic, sms)
    chunk = triton.cdiv(triton.cdiv(max(topk, 1), num_splits), block_n) * block_n
    splits = max(1, triton.cdiv(topk, chunk))
    block_h = min(max(16, triton.next_power_of_2(heads)), 32)
    grid = (tokens, splits, triton.cdiv(heads, block_h))
    if splits == 1:
        o, ls = out, lse
        o_strides = (out.stride(0), 0, out.stride(1))
        l_strides = (lse.stride(0), 0)
    else:
        o = torch.empty(tokens, splits, heads, d_ckv, dtype=torch.float32, device=dev)
        ls = torch.empty(tokens, splits, heads, dtype=torch.float32, device=dev)
        o_strides = (o.stride(0), o.stride(1), o.stride(2))
        l_strides = (ls.stride(0), ls.stride(1))
    dsa_attention_kernel[grid](
        qn, qp, ckv, kpe, idx, o, ls, topk, chunk, heads, scale * LOG2E,
        qn.stride(0), qn.stride(1), qp.stride(0), qp.stride(1), ckv.stride(0), ckv.stride(1),
        kpe.stride(0), kpe.stride(1), idx.stride(0), *o_strides, *l_strides,
        D_CKV=d_ckv, D_KPE=d_kpe, PAGE_SIZE=page_size, BLOCK_H=block_h, BLOCK_N=block_n,
        num_warps=tactic.num_warps, num_stages=tactic.num_stages,
    )  # fmt: skip
    if splits > 1:
        merge_splits_kernel[(tokens, heads)](
            o, ls, out, lse, splits, heads, out.stride(0), out.stride(1), lse.stride(0),
            D=d_ckv, BLOCK_S=max(2, triton.next_power_of_2(splits)), num_warps=4,
        )  # fmt: skip
    return out, lse

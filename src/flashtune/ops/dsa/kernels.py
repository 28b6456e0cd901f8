"""Triton kernels of DSA (private; launch.py calls them).

`indexer_logits_kernel`: the indexer's scores, one program per (query row, BLOCK_N of its
request's tokens). The row's H heads are one [H, D] tile against a [BLOCK_N, D] tile of
gathered keys (pages from the block table): an fp8 x fp8 MMA when both are e4m3, then each
token's scale, ReLU, and the head-weighted sum. Tokens past the row's seq_len score -inf.

`dsa_attention_kernel`: sparse MLA attention, one program per (query token, split of its
topk slots, head block). Each BLOCK_N slots gather [BLOCK_N, Dc] ckv and [BLOCK_N, Dp] kpe
rows once for all the block's heads (the latent is key and value: the same tile is the
second MMA's operand); -1 slots read nothing and weigh nothing. With one split it writes the
output and base-2 LSE; with several, fp32 partial (output, LSE) per split that
`merge_splits_kernel` combines.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashtune.ops.attention.tile_dtype import as_q_dtype
from flashtune.ops.mla.softmax import softmax_step

__all__ = ["LOG2E", "dsa_attention_kernel", "indexer_logits_kernel", "merge_splits_kernel"]

LOG2E = 1.4426950408889634


@triton.jit
def _in_dtype(x, dtype: tl.constexpr):
    """x as an MMA operand of `dtype` (q's): as it is when it has it already (fp8 keys under
    fp8 queries stay fp8: an fp8 x fp8 MMA), else through as_q_dtype."""
    if x.dtype == dtype:
        return x
    else:
        return as_q_dtype(x, dtype)


@triton.jit
def indexer_logits_kernel(
    q_ptr,  # [B, H, D] fp8 e4m3 (or a float type)
    k_ptr,  # [num_pages, page_size, D] fp8: the packed cache's values (strided view)
    ks_ptr,  # [num_pages, page_size] fp32: the packed cache's scales (strided view)
    w_ptr,  # [B, H] fp32
    seq_lens_ptr,  # [B] int32
    bt_ptr,  # [B, max_num_pages] int32
    logits_ptr,  # [B, max_len] fp32
    max_len,
    num_heads,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_sp,
    stride_st,
    stride_wb,
    stride_btb,
    stride_lb,
    D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNK: tl.constexpr,  # tokens per program: CHUNK // BLOCK_N tiles, q loaded once
):
    b = tl.program_id(0).to(tl.int64)
    chunk_start = tl.program_id(1) * CHUNK
    # A seq_len past the block table's pages reads only the pages it has (as the reference).
    seq_len = tl.minimum(tl.load(seq_lens_ptr + b), max_len)
    offs_n = tl.arange(0, BLOCK_N)
    chunk_end = tl.minimum(chunk_start + CHUNK, max_len)
    scored_end = tl.minimum(chunk_end, seq_len)
    if chunk_start < scored_end:
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, D)
        h_ok = offs_h < num_heads
        q = tl.load(
            q_ptr + b * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :],
            mask=h_ok[:, None],
            other=0.0,
        )
        w = tl.load(w_ptr + b * stride_wb + offs_h, mask=h_ok, other=0.0)
        for start in range(chunk_start, scored_end, BLOCK_N):
            pos = start + offs_n
            in_seq = pos < scored_end
            page = tl.load(bt_ptr + b * stride_btb + pos // PAGE_SIZE, mask=in_seq, other=0)
            page = page.to(tl.int64)
            slot = pos % PAGE_SIZE
            k = tl.load(
                k_ptr + page[:, None] * stride_kp + slot[:, None] * stride_kt + offs_d[None, :],
                mask=in_seq[:, None],
                other=0.0,
            )
            scale = tl.load(ks_ptr + page * stride_sp + slot * stride_st, mask=in_seq, other=0.0)
            s = tl.dot(q, tl.trans(_in_dtype(k, q.dtype)))  # [BLOCK_H, BLOCK_N] fp32
            # The scale before the ReLU: relu(s * x) = s * relu(x) holds for s >= 0 only.
            s = tl.maximum(s * scale[None, :], 0.0)
            logit = tl.where(in_seq, tl.sum(s * w[:, None], 0), -float("inf"))
            tl.store(logits_ptr + b * stride_lb + pos, logit, mask=pos < chunk_end)
    # The chunk's tokens past seq_len (all of them when it starts there) score -inf.
    tail = tl.maximum(scored_end, chunk_start)
    for start in range(tail, chunk_end, BLOCK_N):
        pos = start + offs_n
        tl.store(
            logits_ptr + b * stride_lb + pos,
            tl.full([BLOCK_N], -float("inf"), dtype=tl.float32),
            mask=pos < chunk_end,
        )


@triton.jit
def dsa_attention_kernel(
    q_nope_ptr,  # [T, H, D_CKV]
    q_pe_ptr,  # [T, H, D_KPE]
    ckv_ptr,  # [num_pages, page_size, D_CKV]
    kpe_ptr,  # [num_pages, page_size, D_KPE]
    idx_ptr,  # [T, topk] int32 slots, -1: padding
    o_ptr,  # SPLIT: [T, S, H, D_CKV] fp32; else [T, H, D_CKV] in the output's dtype
    lse_ptr,  # SPLIT: [T, S, H] fp32; else [T, H] fp32
    topk,
    chunk,  # slots per split (a multiple of BLOCK_N)
    num_heads,
    qk_scale,  # sm_scale * log2(e)
    stride_qnt,
    stride_qnh,
    stride_qpt,
    stride_qph,
    stride_cp,
    stride_ct,
    stride_kp,
    stride_kt,
    stride_it,
    stride_ot,
    stride_os,
    stride_oh,
    stride_lt,
    stride_ls,
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    offs_h = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < num_heads
    offs_c = tl.arange(0, D_CKV)
    offs_k = tl.arange(0, D_KPE)
    offs_n = tl.arange(0, BLOCK_N)
    qn = tl.load(
        q_nope_ptr + t * stride_qnt + offs_h[:, None] * stride_qnh + offs_c[None, :],
        mask=h_ok[:, None],
        other=0.0,
    )
    qp = tl.load(
        q_pe_ptr + t * stride_qpt + offs_h[:, None] * stride_qph + offs_k[None, :],
        mask=h_ok[:, None],
        other=0.0,
    )
    q_dtype = q_nope_ptr.dtype.element_ty
    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D_CKV], dtype=tl.float32)
    start = split * chunk
    end = tl.minimum(start + chunk, topk)
    # Slots are loaded one tile ahead (loop-carried), so a tile's row gathers need not wait
    # for its slot load (as MLA's kernel does with its page ids).
    idx_next = tl.load(
        idx_ptr + t * stride_it + start + offs_n, mask=start + offs_n < end, other=-1
    )
    for j in range(start, end, BLOCK_N):
        idx = idx_next
        ahead = j + BLOCK_N + offs_n
        idx_next = tl.load(idx_ptr + t * stride_it + ahead, mask=ahead < end, other=-1)
        valid = idx >= 0
        slot = tl.where(valid, idx, 0).to(tl.int64)
        page = slot // PAGE_SIZE
        row = slot % PAGE_SIZE
        # Padding slots read nothing (other=0) and are masked out of the softmax below.
        c = tl.load(
            ckv_ptr + page[:, None] * stride_cp + row[:, None] * stride_ct + offs_c[None, :],
            mask=valid[:, None],
            other=0.0,
        )
        kp = tl.load(
            kpe_ptr + page[:, None] * stride_kp + row[:, None] * stride_kt + offs_k[None, :],
            mask=valid[:, None],
            other=0.0,
        )
        c = _in_dtype(c, q_dtype)
        s = tl.dot(qn, tl.trans(c))
        s = tl.dot(qp, tl.trans(_in_dtype(kp, q_dtype)), s)
        prob, alpha, m_i, l_i = softmax_step(s * qk_scale, valid[None, :], m_i, l_i)
        acc = acc * alpha[:, None] + tl.dot(prob.to(q_dtype), c)
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), -float("inf"))
    tl.store(
        o_ptr + t * stride_ot + split * stride_os + offs_h[:, None] * stride_oh + offs_c[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=h_ok[:, None],
    )
    tl.store(lse_ptr + t * stride_lt + split * stride_ls + offs_h, lse, mask=h_ok)


@triton.jit
def merge_splits_kernel(
    po_ptr,  # [T, S, H, D] fp32, contiguous
    plse_ptr,  # [T, S, H] fp32, contiguous
    o_ptr,  # [T, H, D]
    lse_ptr,  # [T, H] fp32
    num_splits,
    num_heads,
    stride_ot,
    stride_oh,
    stride_lt,
    D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """One program per (token, head): out = sum_s 2^(lse_s - lse) o_s, lse = log2 sum 2^lse_s."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D)
    s_ok = offs_s < num_splits
    plse = tl.load(
        plse_ptr + (t * num_splits + offs_s) * num_heads + h, mask=s_ok, other=-float("inf")
    )
    m = tl.max(plse, 0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    w = tl.exp2(plse - m_safe)  # 0 for empty splits
    total = tl.sum(w, 0)
    po = tl.load(
        po_ptr + ((t * num_splits + offs_s[:, None]) * num_heads + h) * D + offs_d[None, :],
        mask=s_ok[:, None],
        other=0.0,
    )
    out = tl.sum(po * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    lse = tl.where(total > 0, m_safe + tl.log2(tl.where(total > 0, total, 1.0)), -float("inf"))
    tl.store(o_ptr + t * stride_ot + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty))
    tl.store(lse_ptr + t * stride_lt + h, lse)

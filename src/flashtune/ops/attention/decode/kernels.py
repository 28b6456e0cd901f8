"""Triton kernels of paged decode attention (the planned wrappers and the plan-free call).

`decode_item` computes one work item (see ops/attention/scheduler.py): a query tile of one request against
one chunk of its KV, for one KV head, with the query heads of the group (and, for several
query tokens, the tokens) packed into the rows of one MMA tile. `paged_attn_kernel` runs the
items a plan dealt to each persistent CTA; decode/plan_free.py finds its items on the device and
calls `decode_item` itself.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashtune.ops.attention.merge import merge_split_tile
from flashtune.ops.attention.rotary import (
    ROPE_TABLE_ROWS,
    load_rotated,
    rope_frequencies,
    rotate_by,
    rotate_halves,
)
from flashtune.ops.attention.tile_dtype import as_q_dtype

__all__ = ["LOG2E", "decode_item", "paged_attn_kernel"]

_TABLE_ROWS = tl.constexpr(ROPE_TABLE_ROWS)

LOG2E = 1.4426950408889634


@triton.jit
def _tanh(x):
    # tanh through exp2 (portable to the interpreter); saturates correctly at +-inf.
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * 1.4426950408889634)) + 1.0)


@triton.jit
def decode_item(
    q_ptr,
    k_base,  # K pointer offset by the KV head
    v_base,  # V pointer offset by the KV head
    kv_indices_ptr,
    o_ptr,
    lse_ptr,
    po_ptr,
    plse_ptr,
    kvh,
    qo_start,  # first query token of the request
    qo_len,
    row_start,  # first packed row of this query tile
    page_base,  # offset of the request's pages in kv_indices
    kv_start,
    kv_end,
    kv_len,
    out_row,  # -1: write the final output; else the first partial row of this chunk
    stride_qt,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_vp,
    stride_vt,
    stride_ot,
    stride_oh,
    num_qo_heads,
    qk_scale,
    soft_cap,
    window_left,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    ROPE: tl.constexpr,  # ROPE_LLAMA: rotate q and k as loaded (rotary.py)
    rope_rcp_scale,
    rope_log2_theta,
    # ROPE, HEAD_DIM == BLOCK_D (else unused): the rotation of each row offset in a block
    # ([BLOCK_N, HEAD_DIM / 2], q's dtype) and of a whole block ([HEAD_DIM / 2], fp32).
    in_block_cos,
    in_block_sin,
    block_cos,
    block_sin,
    FUSED_MERGE: tl.constexpr = False,  # the last chunk of a split tile merges its partials
    merge_info_ptr=None,  # FUSED_MERGE: [total_qo, 3] int32 (first partial row, count, stride)
    counter_ptr=None,  # FUSED_MERGE: int32 arrival counters, zero between launches
):
    """One work item: a query tile of one request against KV [kv_start, kv_end)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    # Packed rows: (query token, head within the group); see scheduler.WORK_FIELDS.
    p = row_start + offs_m
    qi = p // GROUP
    head = kvh * GROUP + p % GROUP
    row_ok = p < qo_len * GROUP
    tok = (qo_start + qi).to(tl.int64)
    q_pos = kv_len - qo_len + qi
    q_dtype = q_ptr.dtype.element_ty  # the MMAs' operand type (an fp8 cache's tiles too)
    # RoPE on a power-of-two head_dim works on the halves of q and K ([R, D/2] each) and
    # rotates by relative positions: the score of key t is (R(q_pos) q)' (R(t) k) = (R(q_pos
    # - start) q)' (R(t - start) k) for the block starting at `start`. K rows are rotated by
    # their offset in the block and q by q_pos - start, turned back by one block's rotation
    # each block (fp32), both from rotary.rope_table (float64 on the host). The loop keeps no
    # sin/cos (the SFU work was the cost of fused RoPE in decode), only 2 packed FMAs a K
    # pair; the in-block table is rounded to q's dtype for them (2^-9 relative in bf16,
    # within the rounding of the rotated K tile itself).
    HALVES: tl.constexpr = ROPE and HEAD_DIM == BLOCK_D
    HALF: tl.constexpr = HEAD_DIM // 2
    offs_h = tl.arange(0, BLOCK_D // 2)  # = HALF where HALVES
    if HALVES:
        freq = rope_frequencies(offs_h, rope_rcp_scale, rope_log2_theta, HEAD_DIM)
        q_rows = q_ptr + tok * stride_qt + head * stride_qh
        q1, q2 = rotate_halves(
            tl.load(q_rows[:, None] + offs_h[None, :], mask=row_ok[:, None], other=0.0),
            tl.load(q_rows[:, None] + HALF + offs_h[None, :], mask=row_ok[:, None], other=0.0),
            q_pos - kv_start,
            freq,
        )  # fp32, loop-carried
    elif ROPE:
        q = load_rotated(
            q_ptr + tok * stride_qt + head * stride_qh,
            offs_d,
            row_ok[:, None] & d_ok[None, :],
            q_pos,
            rope_rcp_scale,
            rope_log2_theta,
            HEAD_DIM,
        ).to(q_dtype)
    else:
        q = tl.load(
            q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
            mask=row_ok[:, None] & d_ok[None, :],
            other=0.0,
        )

    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Page ids are loaded one block ahead (loop-carried): otherwise each block waits for
    # its index load before its K/V copies can start, a full memory latency per block
    # (page size 1 reads a fresh 256 B of indices per block: 73% of HBM bandwidth).
    t_next = kv_start + offs_n
    page_next = tl.load(
        kv_indices_ptr + page_base + t_next // PAGE_SIZE, mask=t_next < kv_end, other=0
    )
    for start in range(kv_start, kv_end, BLOCK_N):
        t = start + offs_n
        t_ok = t < kv_end
        page = page_next.to(tl.int64)
        t_next = t + BLOCK_N
        page_next = tl.load(
            kv_indices_ptr + page_base + t_next // PAGE_SIZE, mask=t_next < kv_end, other=0
        )
        in_page = t % PAGE_SIZE
        kv_mask = t_ok[:, None] & d_ok[None, :]
        if HALVES:
            k_rows = (k_base + page * stride_kp + in_page * stride_kt)[:, None] + offs_h[None, :]
            k1, k2 = rotate_by(
                as_q_dtype(tl.load(k_rows, mask=t_ok[:, None], other=0.0), q_dtype),
                as_q_dtype(tl.load(k_rows + HALF, mask=t_ok[:, None], other=0.0), q_dtype),
                in_block_cos,
                in_block_sin,
            )  # in q's dtype, as the table
            s = tl.dot(q1.to(q_dtype), tl.trans(k1))
            s = tl.dot(q2.to(q_dtype), tl.trans(k2), s)  # [BLOCK_M, BLOCK_N] fp32
            q1, q2 = rotate_by(q1, q2, block_cos[None, :], -block_sin[None, :])
        else:
            if ROPE:
                k_rows = k_base + page * stride_kp + in_page * stride_kt
                k = load_rotated(
                    k_rows, offs_d, kv_mask, t, rope_rcp_scale, rope_log2_theta, HEAD_DIM
                )
            else:
                k = tl.load(
                    k_base
                    + page[:, None] * stride_kp
                    + in_page[:, None] * stride_kt
                    + offs_d[None, :],
                    mask=kv_mask,
                    other=0.0,
                )
            # An fp8 cache's tiles become q's dtype here (a no-op when the cache has it).
            s = tl.dot(q, tl.trans(as_q_dtype(k, q_dtype)))  # [BLOCK_M, BLOCK_N] fp32
        if SOFT_CAP:
            s = soft_cap * _tanh(s * qk_scale)
        else:
            s = s * qk_scale
        valid = t_ok[None, :]
        if CAUSAL:
            valid = valid & (t[None, :] <= q_pos[:, None])
        if WINDOW:
            valid = valid & (t[None, :] >= q_pos[:, None] - window_left)
        s = tl.where(valid, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        prob = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(prob, 1)
        v = tl.load(
            v_base + page[:, None] * stride_vp + in_page[:, None] * stride_vt + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(prob.to(q_dtype), as_q_dtype(v, q_dtype))
        m_i = m_new

    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), -float("inf"))
    st_mask = row_ok[:, None] & d_ok[None, :]
    if out_row < 0:
        tl.store(
            o_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=st_mask,
        )
        tl.store(lse_ptr + tok * num_qo_heads + head, lse, mask=row_ok)
    else:
        prow = (out_row + qi).to(tl.int64) * num_qo_heads + head
        tl.store(po_ptr + prow[:, None] * HEAD_DIM + offs_d[None, :], out, mask=st_mask)
        tl.store(plse_ptr + prow, lse, mask=row_ok)
        if FUSED_MERGE:
            merge_split_tile(
                o_ptr, lse_ptr, po_ptr, plse_ptr, merge_info_ptr, counter_ptr,
                qo_start + row_start // GROUP, kvh * GROUP + row_start % GROUP, qo_start + qi,
                head, tok, st_mask, offs_d, stride_ot, stride_oh, num_qo_heads,
                HEAD_DIM, BLOCK_D, 1, 0, BLOCK_M,
            )  # fmt: skip


@triton.jit
def paged_attn_kernel(
    q_ptr,  # [total_qo, H_qo, D]
    k_ptr,  # [num_pages, page_size, H_kv, D] logical (strided: NHD or HND storage)
    v_ptr,  # [num_pages, page_size, H_kv, D] logical
    kv_indices_ptr,  # [nnz_pages] int32
    work_indptr_ptr,  # [num_ctas + 1] int32
    work_ptr,  # [num_work, 8] int32 (scheduler.WORK_FIELDS)
    o_ptr,  # [total_qo, H_qo, D]
    lse_ptr,  # [total_qo, H_qo] fp32
    po_ptr,  # [num_partial_rows, H_qo, D] fp32
    plse_ptr,  # [num_partial_rows, H_qo] fp32
    stride_qt,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    num_qo_heads,
    qk_scale,  # sm_scale * log2(e), or sm_scale / soft_cap with SOFT_CAP
    soft_cap,  # soft_cap * log2(e) with SOFT_CAP
    window_left,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    # ROPE_LLAMA; off by default (the default specialization is unchanged).
    ROPE: tl.constexpr = False,
    rope_rcp_scale=1.0,
    rope_log2_theta=13.287712379549449,
    rope_rows_ptr=None,  # ROPE: rotary.rope_table in q's dtype
    rope_block_ptr=None,  # ROPE: rotary.rope_table in fp32
    FUSED_MERGE: tl.constexpr = False,  # split tiles merged by their last chunk (no merge kernel)
    merge_info_ptr=None,  # FUSED_MERGE: [total_qo, 3] int32
    counter_ptr=None,  # FUSED_MERGE: int32 arrival counters, zero between launches
):
    cta = tl.program_id(0)
    kvh = tl.program_id(1)
    w_begin = tl.load(work_indptr_ptr + cta)
    w_end = tl.load(work_indptr_ptr + cta + 1)
    k_base = k_ptr + kvh * stride_kh
    v_base = v_ptr + kvh * stride_vh
    if ROPE and HEAD_DIM == BLOCK_D:
        # rotary.rope_table [2, ROPE_TABLE_ROWS, HEAD_DIM / 2]: cos, sin; rows 0..BLOCK_N-1
        # are the offsets in a block (loaded in q's dtype: no conversion waits for them
        # before the first K block), row BLOCK_N one whole block.
        HALF: tl.constexpr = HEAD_DIM // 2
        SIN: tl.constexpr = _TABLE_ROWS * HALF
        offs_h = tl.arange(0, HALF)
        cell = tl.arange(0, BLOCK_N)[:, None] * HALF + offs_h[None, :]
        in_block_cos = tl.load(rope_rows_ptr + cell)
        in_block_sin = tl.load(rope_rows_ptr + SIN + cell)
        block_cos = tl.load(rope_block_ptr + BLOCK_N * HALF + offs_h)
        block_sin = tl.load(rope_block_ptr + SIN + BLOCK_N * HALF + offs_h)
    else:
        in_block_cos = 0.0
        in_block_sin = 0.0
        block_cos = 0.0
        block_sin = 0.0
    for w in range(w_begin, w_end):
        item = work_ptr + w * 8
        decode_item(
            q_ptr,
            k_base,
            v_base,
            kv_indices_ptr,
            o_ptr,
            lse_ptr,
            po_ptr,
            plse_ptr,
            kvh,
            tl.load(item + 0),
            tl.load(item + 1),
            tl.load(item + 2),
            tl.load(item + 3),
            tl.load(item + 4),
            tl.load(item + 5),
            tl.load(item + 6),
            tl.load(item + 7),
            stride_qt,
            stride_qh,
            stride_kp,
            stride_kt,
            stride_vp,
            stride_vt,
            stride_ot,
            stride_oh,
            num_qo_heads,
            qk_scale,
            soft_cap,
            window_left,
            GROUP,
            HEAD_DIM,
            BLOCK_D,
            PAGE_SIZE,
            BLOCK_M,
            BLOCK_N,
            SOFT_CAP,
            CAUSAL,
            WINDOW,
            ROPE,
            rope_rcp_scale,
            rope_log2_theta,
            in_block_cos,
            in_block_sin,
            block_cos,
            block_sin,
            FUSED_MERGE,
            merge_info_ptr,
            counter_ptr,
        )

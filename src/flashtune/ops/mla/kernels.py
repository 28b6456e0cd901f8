"""Triton kernels of paged MLA attention (absorbed form: one latent KV "head" shared by
every query head).

`mla_item` computes one work item (the layout of `flashtune.ops.attention.scheduler`): a
tile of BLOCK_M packed rows (query token p // H, head p % H) of one request against one
chunk of its KV. Each KV tile is loaded once, [BLOCK_N, D_CKV] of ckv and [BLOCK_N, D_KPE]
of kpe, and serves every row of the tile: the scores are q_nope . ckv^T + q_pe . kpe^T and
the output accumulates p . ckv, the same ckv tile as the second MMA's operand (the latent
vector is both key and value). Split items write fp32 partial (output, LSE) rows that
`flashtune.ops.attention.merge.merge_partials` combines.

`mla_paged_kernel` runs the items a host plan dealt to each persistent CTA;
`mla_planless_kernel` finds its item on the device from the page table (no plan).
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashtune.ops.attention.merge import merge_split_tile
from flashtune.ops.attention.tile_dtype import as_q_dtype
from flashtune.ops.mla.softmax import softmax_step

__all__ = ["LOG2E", "SCALE_NONE", "SCALE_TENSOR", "SCALE_GROUPS", "mla_item", "mla_paged_kernel"]

LOG2E = 1.4426950408889634

# How an fp8 cache is scaled back (SCALE_MODE): not at all; one scale for ckv and one for
# kpe, applied to the fp32 scores and output; a ckv scale per token and 128 channels,
# applied to the tile as it is converted to q's dtype.
SCALE_NONE = 0
SCALE_TENSOR = 1
SCALE_GROUPS = 2


@triton.jit
def _cache_rows(ptr, page, slot, stride_page, stride_slot, off, t_ok, TILE_IN_PAGE: tl.constexpr):
    """The cache rows of a KV tile at (page, slot), [BLOCK_N, columns]. Masked rows read as
    0: a page's unused slots may hold anything (NaN included).

    TILE_IN_PAGE: page and slot are scalars (the tile's page, its first slot) and `off` the
    tile's offsets (row x stride_slot + column), computed once before the KV loop: one
    scalar base a tile. Else page and slot are [BLOCK_N] (each row's) and `off` the columns."""
    if TILE_IN_PAGE:
        base = ptr + (page.to(tl.int64) * stride_page + slot.to(tl.int64) * stride_slot)
        tile = tl.load(base + off, mask=t_ok[:, None], other=0.0)
    else:
        rows = ptr + page[:, None] * stride_page + slot[:, None] * stride_slot
        tile = tl.load(rows + off[None, :], mask=t_ok[:, None], other=0.0)
    return tile


@triton.jit
def mla_item(
    q_nope_ptr,  # [total_q, H, D_CKV]
    q_pe_ptr,  # [total_q, H, D_KPE]
    ckv_ptr,  # [num_pages, page_size, D_CKV]
    kpe_ptr,  # [num_pages, page_size, D_KPE]
    scale_ptr,  # SCALE_GROUPS: [num_pages, page_size, D_CKV // 128] fp32
    kv_indices_ptr,  # [nnz_pages] int32
    o_ptr,  # [total_q, H, D_CKV]
    lse_ptr,  # [total_q, H] fp32
    po_ptr,  # [num_partial_rows, H, D_CKV] fp32
    plse_ptr,  # [num_partial_rows, H] fp32
    qo_start,  # first query token (row of q) of the request
    qo_len,
    row_start,  # first packed row of this tile
    page_base,  # offset of the request's pages in kv_indices
    kv_start,
    kv_end,
    kv_len,  # the request's KV length: its queries sit at kv_len - qo_len + i
    out_row,  # -1: write the final output; else the first partial row of this chunk
    stride_qnt,
    stride_qnh,
    stride_qpt,
    stride_qph,
    stride_cp,
    stride_ct,
    stride_kp,
    stride_kt,
    stride_sp,
    stride_st,
    stride_ot,
    stride_oh,
    num_heads,
    qk_scale,  # sm_scale * log2(e)
    ckv_scale,
    kpe_scale,
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,  # 0: no rotary part
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    RELOAD_Q: tl.constexpr,  # load q for every KV tile (L2 hits) instead of keeping it live
    DV_SPLIT: tl.constexpr = 1,  # programs sharing the item, each its D_CKV // DV_SPLIT columns
    part=0,  # this program's share of the output columns (0 .. DV_SPLIT - 1)
    FUSED_MERGE: tl.constexpr = False,  # the last chunk of a split tile merges its partials
    merge_info_ptr=None,  # FUSED_MERGE: [total_q, 3] int32 (first partial row, count, stride)
    counter_ptr=None,  # FUSED_MERGE: int32 arrival counters, zero between launches
    P_SCRATCH: tl.constexpr = False,  # probabilities reach the output MMA through memory
    p_scratch_ptr=None,  # P_SCRATCH: this program's [BLOCK_M, BLOCK_N] tile in q's dtype
    a_scratch_ptr=None,  # P_SCRATCH: this program's [BLOCK_M] fp32 rescale factors
    TILE_IN_PAGE: tl.constexpr = False,  # every KV tile lies in one page (`tile_in_page`)
):
    """One work item: a tile of packed rows of one request against KV [kv_start, kv_end).

    DV_SPLIT > 1: the item's output columns are dealt to DV_SPLIT programs; each computes the
    scores in full (all D_CKV + D_KPE dims) and accumulates only its columns of p . ckv,
    reading them again from the tile just loaded (L1/L2 hits). The accumulator shrinks by
    DV_SPLIT (64 rows x 512 fp32 is 128 registers a thread at 8 warps: Triton spills), for
    DV_SPLIT - 1 more score MMAs. Every part writes the same LSE.

    P_SCRATCH: the scores' MMAs are not chained to the output's, so Triton spreads their
    [BLOCK_M, BLOCK_N] over the warpgroups instead of giving each warpgroup all of it. A
    result feeding another dot makes Triton place all warps along M (its flash-attention
    layout); at 64 rows and 8 warps that is two warpgroups each forming the whole score
    tile, the score MMA (576 deep) done twice at N = 32. Here the q_pe product is added
    after scaling (not accumulated into the q_nope one), and P and the rescale factors reach
    the output MMA through a per-program scratch tile in global memory (L1/L2), between
    CTA barriers.

    TILE_IN_PAGE: the caller guarantees BLOCK_N divides PAGE_SIZE and kv_start, so a tile's
    rows are consecutive slots of one page: one page id a tile (a scalar load) and a scalar
    base added to offsets computed before the loop, instead of a page id, a slot and a
    64-bit address for each row of each tile (the cost of the page-size-1 layout, paid at
    every page size)."""
    DV: tl.constexpr = D_CKV // DV_SPLIT
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, D_CKV)
    offs_v = part * DV + tl.arange(0, DV)  # the output columns of this program
    p = row_start + offs_m
    rows = qo_len * num_heads
    row_ok = p < rows
    qi = p // num_heads
    head = p % num_heads
    tok = (qo_start + qi).to(tl.int64)
    q_pos = kv_len - qo_len + qi
    q_dtype = q_nope_ptr.dtype.element_ty  # the MMAs' operand type (an fp8 cache's tiles too)
    qn = tl.load(
        q_nope_ptr + tok[:, None] * stride_qnt + head[:, None] * stride_qnh + offs_c[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    if D_KPE > 0:
        offs_k = tl.arange(0, D_KPE)
        qp = tl.load(
            q_pe_ptr + tok[:, None] * stride_qpt + head[:, None] * stride_qph + offs_k[None, :],
            mask=row_ok[:, None],
            other=0.0,
        )
    kv_hi = kv_end
    if CAUSAL:
        # The tile's last query sees keys up to kv_len - qo_len + its index: later KV blocks
        # are masked for every row, so they are not read at all.
        last_qi = (tl.minimum(row_start + BLOCK_M, rows) - 1) // num_heads
        kv_hi = tl.minimum(kv_end, kv_len - qo_len + last_qi + 1)

    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DV], dtype=tl.float32)
    # Page ids are loaded one block ahead (loop-carried), so a block's cache loads need not
    # wait for its index load (as in the GQA decode kernel).
    if TILE_IN_PAGE:
        # the page id of a tile is a scalar, loaded one tile ahead
        page_next = tl.load(
            kv_indices_ptr + page_base + kv_start // PAGE_SIZE, mask=kv_start < kv_hi, other=0
        )
        c_off = offs_n[:, None] * stride_ct + offs_c[None, :]
        if D_KPE > 0:
            k_off = offs_n[:, None] * stride_kt + tl.arange(0, D_KPE)[None, :]
        if DV_SPLIT > 1:
            v_off = offs_n[:, None] * stride_ct + offs_v[None, :]
    else:
        t_next = kv_start + offs_n
        page_next = tl.load(
            kv_indices_ptr + page_base + t_next // PAGE_SIZE, mask=t_next < kv_hi, other=0
        )
        c_off = offs_c
        if D_KPE > 0:
            k_off = offs_k
        if DV_SPLIT > 1:
            v_off = offs_v
    for start in range(kv_start, kv_hi, BLOCK_N):
        t = start + offs_n
        t_ok = t < kv_hi
        if TILE_IN_PAGE:
            page = page_next
            page_next = tl.load(
                kv_indices_ptr + page_base + (start + BLOCK_N) // PAGE_SIZE,
                mask=start + BLOCK_N < kv_hi,
                other=0,
            )
            slot = start % PAGE_SIZE
        else:
            page = page_next.to(tl.int64)
            t_next = t + BLOCK_N
            page_next = tl.load(
                kv_indices_ptr + page_base + t_next // PAGE_SIZE, mask=t_next < kv_hi, other=0
            )
            slot = (t % PAGE_SIZE).to(tl.int64)
        c = _cache_rows(ckv_ptr, page, slot, stride_cp, stride_ct, c_off, t_ok, TILE_IN_PAGE)
        if SCALE_MODE == 2:
            GROUPS: tl.constexpr = D_CKV // 128
            offs_g = tl.arange(0, GROUPS)
            if TILE_IN_PAGE:
                s_off = offs_n[:, None] * stride_st + offs_g[None, :]
            else:
                s_off = offs_g
            sc = _cache_rows(scale_ptr, page, slot, stride_sp, stride_st, s_off, t_ok, TILE_IN_PAGE)
            c3 = tl.reshape(c.to(tl.float32), (BLOCK_N, GROUPS, 128)) * sc[:, :, None]
            c = tl.reshape(c3, (BLOCK_N, D_CKV)).to(q_dtype)
        else:
            # An fp8 cache's tile becomes q's dtype here (a no-op when the cache has it).
            c = as_q_dtype(c, q_dtype)
        if RELOAD_Q:
            qn = tl.load(
                q_nope_ptr
                + tok[:, None] * stride_qnt
                + head[:, None] * stride_qnh
                + offs_c[None, :],
                mask=row_ok[:, None],
                other=0.0,
            )
        s = tl.dot(qn, tl.trans(c))  # [BLOCK_M, BLOCK_N] fp32
        if SCALE_MODE == 1:
            s = s * ckv_scale
        if P_SCRATCH:
            s = s * qk_scale
        if D_KPE > 0:
            kp = _cache_rows(kpe_ptr, page, slot, stride_kp, stride_kt, k_off, t_ok, TILE_IN_PAGE)
            kp = as_q_dtype(kp, q_dtype)
            if RELOAD_Q:
                qp = tl.load(
                    q_pe_ptr
                    + tok[:, None] * stride_qpt
                    + head[:, None] * stride_qph
                    + offs_k[None, :],
                    mask=row_ok[:, None],
                    other=0.0,
                )
            if P_SCRATCH:
                # scaled before the add: an add of a plain dot would be folded back into
                # the dot's accumulator (chaining the two products again)
                pe_scale = qk_scale * kpe_scale if SCALE_MODE != 0 else qk_scale
                s = s + tl.dot(qp, tl.trans(kp)) * pe_scale
            elif SCALE_MODE == 0:
                s = tl.dot(qp, tl.trans(kp), s)
            else:
                s = s + tl.dot(qp, tl.trans(kp)) * kpe_scale
        if not P_SCRATCH:
            s = s * qk_scale
        valid = t_ok[None, :]
        if CAUSAL:
            valid = valid & (t[None, :] <= q_pos[:, None])
        prob, alpha, m_i, l_i = softmax_step(s, valid, m_i, l_i)
        if DV_SPLIT == 1:
            cv = c
        else:
            # This program's columns of the same rows (no scales: DV_SPLIT > 1 takes
            # SCALE_MODE 0 or 1, whose ckv scale applies to the output).
            cv = _cache_rows(ckv_ptr, page, slot, stride_cp, stride_ct, v_off, t_ok, TILE_IN_PAGE)
            cv = as_q_dtype(cv, q_dtype)
        if P_SCRATCH:
            tile = offs_m[:, None] * BLOCK_N + offs_n[None, :]
            tl.store(p_scratch_ptr + tile, prob.to(q_dtype))
            tl.store(a_scratch_ptr + offs_m, alpha)
            tl.debug_barrier()  # every warp's part written (a CTA barrier orders memory)
            prob = tl.load(p_scratch_ptr + tile, cache_modifier=".cg")
            alpha = tl.load(a_scratch_ptr + offs_m, cache_modifier=".cg")
            acc = acc * alpha[:, None] + tl.dot(prob, cv)
            tl.debug_barrier()  # read by every warp before the next tile overwrites it
        else:
            acc = acc * alpha[:, None] + tl.dot(prob.to(q_dtype), cv)

    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    if SCALE_MODE == 1:
        out = out * ckv_scale
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), -float("inf"))
    if out_row < 0:
        tl.store(
            o_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_v[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )
        tl.store(lse_ptr + tok * num_heads + head, lse, mask=row_ok)
    else:
        prow = (out_row + qi).to(tl.int64) * num_heads + head
        tl.store(po_ptr + prow[:, None] * D_CKV + offs_v[None, :], out, mask=row_ok[:, None])
        tl.store(plse_ptr + prow, lse, mask=row_ok)
        if FUSED_MERGE:
            merge_split_tile(
                o_ptr, lse_ptr, po_ptr, plse_ptr, merge_info_ptr, counter_ptr,
                qo_start + row_start // num_heads, row_start % num_heads, qo_start + qi, head,
                tok, row_ok[:, None], offs_v, stride_ot, stride_oh, num_heads,
                D_CKV, D_CKV // DV_SPLIT, DV_SPLIT, part, BLOCK_M,
            )  # fmt: skip


@triton.jit
def mla_paged_kernel(
    q_nope_ptr,  # [total_q, H, D_CKV]
    q_pe_ptr,  # [total_q, H, D_KPE]
    ckv_ptr,  # [num_pages, page_size, D_CKV]
    kpe_ptr,  # [num_pages, page_size, D_KPE]
    scale_ptr,  # SCALE_GROUPS: [num_pages, page_size, D_CKV // 128] fp32
    kv_indices_ptr,  # [nnz_pages] int32
    work_indptr_ptr,  # [num_ctas + 1] int32
    work_ptr,  # [num_work, 8] int32 (scheduler.WORK_FIELDS)
    o_ptr,  # [total_q, H, D_CKV]
    lse_ptr,  # [total_q, H] fp32
    po_ptr,  # [num_partial_rows, H, D_CKV] fp32
    plse_ptr,  # [num_partial_rows, H] fp32
    stride_qnt,
    stride_qnh,
    stride_qpt,
    stride_qph,
    stride_cp,
    stride_ct,
    stride_kp,
    stride_kt,
    stride_sp,
    stride_st,
    stride_ot,
    stride_oh,
    num_heads,
    qk_scale,
    ckv_scale,
    kpe_scale,
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    RELOAD_Q: tl.constexpr = False,
    DV_SPLIT: tl.constexpr = 1,  # the grid's second dimension: parts of the output columns
    FUSED_MERGE: tl.constexpr = False,  # split tiles merged by their last chunk (no merge kernel)
    merge_info_ptr=None,  # FUSED_MERGE: [total_q, 3] int32
    counter_ptr=None,  # FUSED_MERGE: int32 arrival counters, zero between launches
    P_SCRATCH: tl.constexpr = False,  # mla_item's: P through a scratch tile a program
    p_scratch_ptr=None,  # P_SCRATCH: [grid programs, BLOCK_M * BLOCK_N] in q's dtype
    a_scratch_ptr=None,  # P_SCRATCH: [grid programs, BLOCK_M] fp32
    TILE_IN_PAGE: tl.constexpr = False,  # mla_item's: every KV tile inside one page
):
    cta = tl.program_id(0)
    part = tl.program_id(1)
    if P_SCRATCH:
        program = (cta * tl.num_programs(1) + part).to(tl.int64)
        p_scratch_ptr += program * (BLOCK_M * BLOCK_N)
        a_scratch_ptr += program * BLOCK_M
    w_begin = tl.load(work_indptr_ptr + cta)
    w_end = tl.load(work_indptr_ptr + cta + 1)
    for w in range(w_begin, w_end):
        item = work_ptr + w * 8
        mla_item(
            q_nope_ptr,
            q_pe_ptr,
            ckv_ptr,
            kpe_ptr,
            scale_ptr,
            kv_indices_ptr,
            o_ptr,
            lse_ptr,
            po_ptr,
            plse_ptr,
            tl.load(item + 0),
            tl.load(item + 1),
            tl.load(item + 2),
            tl.load(item + 3),
            tl.load(item + 4),
            tl.load(item + 5),
            tl.load(item + 6),
            tl.load(item + 7),
            stride_qnt,
            stride_qnh,
            stride_qpt,
            stride_qph,
            stride_cp,
            stride_ct,
            stride_kp,
            stride_kt,
            stride_sp,
            stride_st,
            stride_ot,
            stride_oh,
            num_heads,
            qk_scale,
            ckv_scale,
            kpe_scale,
            D_CKV,
            D_KPE,
            PAGE_SIZE,
            BLOCK_M,
            BLOCK_N,
            CAUSAL,
            SCALE_MODE,
            RELOAD_Q,
            DV_SPLIT,
            part,
            FUSED_MERGE,
            merge_info_ptr,
            counter_ptr,
            P_SCRATCH,
            p_scratch_ptr,
            a_scratch_ptr,
            TILE_IN_PAGE,
        )


# batch and chunk vary with every call: not specialized (Triton would compile a variant for
# values equal to 1 and for multiples of 16), they only bound loops and offsets.
@triton.jit(do_not_specialize=["batch", "chunk"])
def mla_planless_kernel(
    q_nope_ptr,  # [total_q, H, D_CKV]
    q_pe_ptr,  # [total_q, H, D_KPE]
    ckv_ptr,  # [num_pages, page_size, D_CKV]
    kpe_ptr,  # [num_pages, page_size, D_KPE]
    scale_ptr,  # SCALE_GROUPS: [num_pages, page_size, D_CKV // 128] fp32
    qo_indptr_ptr,  # [B + 1] int32 (read when not DECODE)
    kv_indptr_ptr,  # [B + 1] int32
    last_ptr,  # [B] int32 (read when HAS_LAST; else every page is full)
    kv_indices_ptr,  # [nnz_pages] int32
    o_ptr,  # [total_q, H, D_CKV]
    lse_ptr,  # [total_q, H] fp32
    po_ptr,  # DECODE: [programs, H, D_CKV] fp32, partial row j belongs to program j
    plse_ptr,  # DECODE: [programs, H] fp32
    merge_info_ptr,  # DECODE: [B, 3] int32: (first partial row, count or 0, stride 1)
    batch,
    chunk,  # DECODE: KV tokens per chunk
    stride_qnt,
    stride_qnh,
    stride_qpt,
    stride_qph,
    stride_cp,
    stride_ct,
    stride_kp,
    stride_kt,
    stride_sp,
    stride_st,
    stride_ot,
    stride_oh,
    num_heads,
    qk_scale,
    ckv_scale,
    kpe_scale,
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,
    CAUSAL: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    DECODE: tl.constexpr,  # one query per request, KV split in chunks; else one item a tile
    HAS_LAST: tl.constexpr,
    RELOAD_Q: tl.constexpr = False,
):
    """DECODE: program (j, i) runs chunk j of the flattened (request, chunk) list for the
    request's head tile i. Else: program j runs tile j of the flattened (request, query
    tile) list over the request's whole (causally trimmed) KV."""
    j = tl.program_id(0)
    tile = tl.program_id(1)
    offs_b = tl.arange(0, BLOCK_B)
    # Find the request whose items cover program j: item counts of every request, prefix
    # summed; each quantity of the owner is picked out of the block with a masked sum.
    before = 0
    req = -1
    first = 0
    n_req = 0
    kv_len = 0
    page_base = 0
    qo_start = 0
    qo_len = 0
    for b0 in range(0, batch, BLOCK_B):
        idx = b0 + offs_b
        ok = idx < batch
        p0 = tl.load(kv_indptr_ptr + idx, mask=ok, other=0)
        p1 = tl.load(kv_indptr_ptr + idx + 1, mask=ok, other=0)
        if HAS_LAST:
            last = tl.load(last_ptr + idx, mask=ok, other=0)
            length = tl.where(p1 > p0, (p1 - p0 - 1) * PAGE_SIZE + last, 0)
        else:
            length = (p1 - p0) * PAGE_SIZE
        if DECODE:
            n = tl.where(ok, tl.maximum(tl.cdiv(length, chunk), 1), 0)
        else:
            q0 = tl.load(qo_indptr_ptr + idx, mask=ok, other=0)
            q1 = tl.load(qo_indptr_ptr + idx + 1, mask=ok, other=0)
            n = tl.where(ok, tl.cdiv((q1 - q0) * num_heads, BLOCK_M), 0)
        incl = tl.cumsum(n, 0) + before
        hit = ok & (incl - n <= j) & (j < incl)
        req += tl.sum(tl.where(hit, idx + 1, 0))
        first += tl.sum(tl.where(hit, incl - n, 0))
        n_req += tl.sum(tl.where(hit, n, 0))
        kv_len += tl.sum(tl.where(hit, length, 0))
        page_base += tl.sum(tl.where(hit, p0, 0))
        if not DECODE:
            qo_start += tl.sum(tl.where(hit, q0, 0))
            qo_len += tl.sum(tl.where(hit, q1 - q0, 0))
        before += tl.sum(n)
    if req >= 0:
        c = j - first
        if DECODE:
            kv_start = c * chunk
            kv_end = tl.minimum(kv_start + chunk, kv_len)
            out_row = tl.where(n_req > 1, j, -1)
            if (tile == 0) & (c == 0):
                info = merge_info_ptr + req * 3
                tl.store(info, first)
                tl.store(info + 1, tl.where(n_req > 1, n_req, 0))
                tl.store(info + 2, 1)
            qo_start = req
            qo_len = 1
            row_start = tile * BLOCK_M
        else:
            kv_start = 0
            kv_end = kv_len
            out_row = -1
            row_start = c * BLOCK_M
        mla_item(
            q_nope_ptr,
            q_pe_ptr,
            ckv_ptr,
            kpe_ptr,
            scale_ptr,
            kv_indices_ptr,
            o_ptr,
            lse_ptr,
            po_ptr,
            plse_ptr,
            qo_start,
            qo_len,
            row_start,
            page_base,
            kv_start,
            kv_end,
            kv_len,
            out_row,
            stride_qnt,
            stride_qnh,
            stride_qpt,
            stride_qph,
            stride_cp,
            stride_ct,
            stride_kp,
            stride_kt,
            stride_sp,
            stride_st,
            stride_ot,
            stride_oh,
            num_heads,
            qk_scale,
            ckv_scale,
            kpe_scale,
            D_CKV,
            D_KPE,
            PAGE_SIZE,
            BLOCK_M,
            BLOCK_N,
            CAUSAL,
            SCALE_MODE,
            RELOAD_Q,
        )

"""Triton kernel of batch prefill attention (FlashAttention-2 style), paged or ragged KV.

One program computes one *work item* (a request and a tile of its query tokens) for one
*head group*: PACK query heads that share a KV head. Rows of the query tile are
(token, head) pairs, token-major: row r is token r // PACK, head r % PACK, so with PACK equal
to the GQA group size every K/V tile loaded is used by all the heads that read it.

Inside a program the KV range is walked in three segments: masked tiles at the left edge
(sliding window), unmasked tiles in the middle (no mask arithmetic at all), masked tiles at
the right edge (causal diagonal, the KV boundary). Tiles that a causal or window mask fully
hides are never visited. Softmax is online, in base 2: sm_scale * log2(e) is folded into one
multiply, so the LSE comes out in base 2 as FlashInfer returns it.

Work items come from one of two places. The planned wrappers (prefill/launch.py) pass WORK, a list
built on the host. With DEVICE_WORK (prefill/plan_free.py) each program finds its own item
from the indptr arrays: the tile count of every request, prefix summed in registers, names
the request that owns the program's item; programs past the last item do nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashtune.ops.attention.rotary import load_rotated
from flashtune.ops.attention.tile_dtype import as_q_dtype

__all__ = ["prefill_kernel", "device_item"]


@triton.jit
def _tile_step(
    acc,
    m_i,
    l_i,
    q,
    k_base,  # K pointer offset by the KV head
    v_base,  # V pointer offset by the KV head
    kv_indices_ptr,  # pages of this request (paged) or unused
    kv_tok0,  # first KV token of this request (ragged) or 0
    start,  # first KV position of this tile
    q_pos,  # [BLOCK_M] query position in the request (token index)
    offs_d,
    kv_len,
    qo_len,
    delta,  # kv_len - qo_len: bottom-right alignment of causal and window masks
    window_left,
    qk_scale,  # sm_scale * log2(e), or the pre-tanh scale with soft-cap
    soft_cap_log2,  # soft_cap * log2(e) (soft-cap only)
    mask_ptr,  # custom mask of this request, [qo_len, kv_len] flattened (uint8)
    stride_kp,
    stride_ks,
    stride_vp,
    stride_vs,
    kv_head,
    PAGE_SIZE: tl.constexpr,
    PAGED: tl.constexpr,
    USE_TMA: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    CUSTOM_MASK: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROPE: tl.constexpr,  # rotate K at its positions (pointer loads only, never with TMA)
    rope_rcp_scale,
    rope_log2_theta,
    ALIBI: tl.constexpr,
    alibi,  # [BLOCK_M] each row's ALiBi slope, pre-multiplied (see prefill_kernel)
):
    offs_n = start + tl.arange(0, BLOCK_N)
    if USE_TMA:
        # k_base / v_base are 2-D [total_kv, H * D] tensor descriptors here (ragged only);
        # rows past this request belong to the next one (or are zero-filled past the tensor)
        # and are masked below like any position >= kv_len.
        pass
    elif PAGED:
        if PAGE_SIZE % BLOCK_N == 0:
            # The tile lies in one page: one index load, contiguous rows.
            page = tl.load(kv_indices_ptr + start // PAGE_SIZE).to(tl.int64)
            slot = (start % PAGE_SIZE) + tl.arange(0, BLOCK_N)
            k_rows = page * stride_kp + slot * stride_ks
            v_rows = page * stride_vp + slot * stride_vs
        else:
            if MASKED:
                page = tl.load(kv_indices_ptr + offs_n // PAGE_SIZE, mask=offs_n < kv_len, other=0)
            else:
                page = tl.load(kv_indices_ptr + offs_n // PAGE_SIZE)
            page = page.to(tl.int64)
            slot = offs_n % PAGE_SIZE
            k_rows = page * stride_kp + slot * stride_ks
            v_rows = page * stride_vp + slot * stride_vs
    else:
        tok = (kv_tok0 + offs_n).to(tl.int64)
        k_rows = tok * stride_kp
        v_rows = tok * stride_vp
    if MASKED:
        in_kv = offs_n < kv_len
    if USE_TMA:
        k = k_base.load([kv_tok0 + start, kv_head * HEAD_DIM])
    elif ROPE:
        k_ok = (offs_n < kv_len)[:, None]
        k = load_rotated(
            k_base + k_rows, offs_d, k_ok, offs_n, rope_rcp_scale, rope_log2_theta, HEAD_DIM
        )
    else:
        k_ptrs = k_base + k_rows[:, None] + offs_d[None, :]
        if MASKED:
            k = tl.load(k_ptrs, mask=in_kv[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
    # An fp8 cache's tiles become q's dtype here (a no-op when the cache has it); so does
    # a rotated (fp32) K.
    qk = tl.dot(q, tl.trans(as_q_dtype(k, q.dtype)))  # [BLOCK_M, BLOCK_N], fp32
    if ALIBI:
        # FlashInfer's bias: slope * (key position - query index in the request); the
        # launch folds the scale this logit gets next into `alibi`.
        bias = alibi[:, None] * (offs_n[None, :] - q_pos[:, None]).to(tl.float32)
    if SOFT_CAP:
        # cap * tanh(x * sm_scale / cap), tanh through exp2 (no tanh in tl); the log2(e) of
        # the base-2 softmax rides on the outer multiply.
        x = qk * qk_scale
        if ALIBI:
            x = x + bias
        e = tl.exp2(x * 2.8853900817779268)  # exp(2x)
        qk = (1.0 - 2.0 / (e + 1.0)) * soft_cap_log2
        scale = 1.0
    elif ALIBI:
        qk = qk * qk_scale + bias
        scale = 1.0
    else:
        # The scale is applied inside the exp2 argument (one FMA per logit) below.
        scale = qk_scale
    if MASKED:
        keep = in_kv[None, :] & (q_pos[:, None] >= 0)
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= q_pos[:, None] + delta)
        if WINDOW:
            keep = keep & (offs_n[None, :] + window_left >= q_pos[:, None] + delta)
        if CUSTOM_MASK:
            m_off = q_pos.to(tl.int64)[:, None] * kv_len + offs_n[None, :]
            cm = tl.load(mask_ptr + m_off, mask=keep & (q_pos[:, None] < qo_len), other=0)
            keep = keep & (cm != 0)
        qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * scale)
        # A row that has seen only masked logits keeps m = -inf: shift by 0 to avoid inf-inf.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * scale)
        m_use = m_new
    p = tl.exp2(qk * scale - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if USE_TMA:
        v = v_base.load([kv_tok0 + start, kv_head * HEAD_DIM])
    else:
        v_ptrs = v_base + v_rows[:, None] + offs_d[None, :]
        if MASKED:
            v = tl.load(v_ptrs, mask=in_kv[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
    acc = tl.dot(p.to(q.dtype), as_q_dtype(v, q.dtype), acc)
    return acc, m_new, l_i


@triton.jit
def _host_item(WORK, item, PAGED: tl.constexpr):
    """Fields of work item `item` from the host-built list (see prefill_kernel's WORK)."""
    w = WORK + item * 8
    req = tl.load(w)
    tok0 = tl.load(w + 1)
    qo_start = tl.load(w + 2)
    qo_len = tl.load(w + 3)
    kv_len = tl.load(w + 4)
    if PAGED:
        kv_off = tl.load(w + 5)
    else:
        kv_off = tl.load(w + 6)
    return req, tok0, qo_start, qo_len, kv_len, kv_off


@triton.jit
def device_item(
    item,
    QO_INDPTR,  # [batch + 1] int32
    KV_INDPTR,  # [batch + 1] int32: pages (INDPTR_PAGE_SIZE > 0) or tokens
    KV_LAST_PAGE_LEN,  # [batch] int32 (read when INDPTR_PAGE_SIZE > 0)
    batch,
    TOKENS: tl.constexpr,  # query tokens per tile
    INDPTR_PAGE_SIZE: tl.constexpr,
    PAGED: tl.constexpr,  # KV offset in pages (in-loop page gather) rather than tokens
    CAUSAL: tl.constexpr,
    BLOCK_B: tl.constexpr,  # requests scanned per step
):
    """The same fields as _host_item, found on the device: item j belongs to the request
    whose tiles (cdiv(qo_len, TOKENS) each, requests in order) cover j. The owner's values
    are picked out of each block of requests with masked sums (at most one lane hits).
    An item past the last tile gets req -1 and empty lengths, so its program does nothing."""
    offs_b = tl.arange(0, BLOCK_B)
    before = 0  # tiles of the requests of earlier steps
    req = -1
    t_first = 0  # the owner's first item
    n_req = 0  # the owner's tile count
    qo_start = 0
    qo_len = 0
    kv_len = 0
    kv_p0 = 0
    for b0 in range(0, batch, BLOCK_B):
        idx = b0 + offs_b
        ok = idx < batch
        q0 = tl.load(QO_INDPTR + idx, mask=ok, other=0)
        q1 = tl.load(QO_INDPTR + idx + 1, mask=ok, other=0)
        k0 = tl.load(KV_INDPTR + idx, mask=ok, other=0)
        k1 = tl.load(KV_INDPTR + idx + 1, mask=ok, other=0)
        if INDPTR_PAGE_SIZE > 0:
            last = tl.load(KV_LAST_PAGE_LEN + idx, mask=ok, other=0)
            length = tl.where(k1 > k0, (k1 - k0 - 1) * INDPTR_PAGE_SIZE + last, 0)
        else:
            length = k1 - k0
        q_n = tl.maximum(q1 - q0, 0)
        n = tl.where(ok, tl.cdiv(q_n, TOKENS), 0)
        incl = tl.cumsum(n, 0) + before
        hit = ok & (incl - n <= item) & (item < incl)
        req += tl.sum(tl.where(hit, idx + 1, 0))
        t_first += tl.sum(tl.where(hit, incl - n, 0))
        n_req += tl.sum(tl.where(hit, n, 0))
        qo_start += tl.sum(tl.where(hit, q0, 0))
        qo_len += tl.sum(tl.where(hit, q_n, 0))
        kv_len += tl.sum(tl.where(hit, length, 0))
        kv_p0 += tl.sum(tl.where(hit, k0, 0))
        before += tl.sum(n)
    c = item - t_first
    if CAUSAL:
        # Heaviest first, as the host plan orders them: under a causal mask the last query
        # tiles see the most keys, so they take the lowest items (start first).
        c = n_req - 1 - c
    # Items past the end: first token 0 of an empty request, so every row is masked off.
    tok0 = tl.where(n_req > 0, c * TOKENS, 0)
    if PAGED:
        kv_off = kv_p0
    elif INDPTR_PAGE_SIZE > 0:
        # Staged pages: request b's tokens start at kv_indptr[b] * page_size.
        kv_off = kv_p0 * INDPTR_PAGE_SIZE
    else:
        kv_off = kv_p0
    return req, tok0, qo_start, qo_len, kv_len, kv_off


# batch (the plan-free launch's request count) varies with every call: not specialized
# (Triton would compile a variant for batch 1 and for multiples of 16); it only bounds the
# request search.
@triton.jit(do_not_specialize=["batch"])
def prefill_kernel(
    Q,  # [total_q, num_qo_heads, HEAD_DIM]
    K,  # paged: [num_pages, PAGE_SIZE, num_kv_heads, HEAD_DIM] (strided); ragged: [total_kv, H, D]
    V,  # same as K
    O,  # [total_q, num_qo_heads, HEAD_DIM]
    LSE,  # [total_q, num_qo_heads] float32 (written when RETURN_LSE)
    # [num_items, 8] int32, one row per tile: (request, first query token of the tile,
    # qo_start, qo_len, kv_len, KV offset in pages (paged), KV offset in tokens (ragged or
    # staged pages), 0). Everything a program needs in one cache line: one load round trip
    # instead of two dependent ones (work item, then the request's indptr entries).
    WORK,
    KV_INDICES,  # [nnz_pages] int32 (paged)
    MASK,  # [sum(qo_len * kv_len)] uint8 custom mask (CUSTOM_MASK)
    MASK_INDPTR,  # [batch + 1] int64 offsets into MASK
    qk_scale,
    soft_cap_log2,
    window_left,
    stride_qt,
    stride_qh,
    stride_kp,  # page stride (paged) or token stride (ragged)
    stride_ks,  # slot-in-page stride (paged)
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    NUM_HEAD_GROUPS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,  # num_qo_heads // num_kv_heads
    PACK: tl.constexpr,  # query heads per program (GROUP_SIZE or 1)
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGED: tl.constexpr,
    USE_TMA: tl.constexpr,  # K, V: 2-D descriptors [total_kv, H * D], block [BLOCK_N, D]
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    CUSTOM_MASK: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    # DEVICE_WORK: WORK is not read; each program finds its item from the indptr arrays
    # (device_item). Defaults keep the planned launch (prefill/launch.py) unchanged.
    DEVICE_WORK: tl.constexpr = False,
    QO_INDPTR=None,  # [batch + 1] int32 (DEVICE_WORK)
    KV_INDPTR=None,  # [batch + 1] int32: pages (INDPTR_PAGE_SIZE > 0) or tokens
    KV_LAST_PAGE_LEN=None,  # [batch] int32 (INDPTR_PAGE_SIZE > 0)
    batch=0,
    INDPTR_PAGE_SIZE: tl.constexpr = 0,  # tokens per page of KV_INDPTR; 0: KV_INDPTR counts tokens
    BLOCK_B: tl.constexpr = 16,
    # ROPE_LLAMA (rotary.py): q and k rotated as loaded; off by default (same code as before).
    ROPE: tl.constexpr = False,
    rope_rcp_scale=1.0,
    rope_log2_theta=13.287712379549449,
    # ALiBi (FlashInfer's pos_encoding_mode="ALIBI"): per query head slopes [num_qo_heads]
    # float32, times alibi_scale (log2(e), or sm_scale / soft_cap under a soft-cap).
    ALIBI: tl.constexpr = False,
    ALIBI_SLOPES=None,
    alibi_scale=1.0,
):
    TOKENS: tl.constexpr = BLOCK_M // PACK  # query tokens per tile
    pid = tl.program_id(0)
    item = pid // NUM_HEAD_GROUPS
    hg = pid % NUM_HEAD_GROUPS
    if DEVICE_WORK:
        req, tok0, qo_start, qo_len, kv_len, kv_off = device_item(
            item,
            QO_INDPTR,
            KV_INDPTR,
            KV_LAST_PAGE_LEN,
            batch,
            TOKENS,
            INDPTR_PAGE_SIZE,
            PAGED,
            CAUSAL,
            BLOCK_B,
        )
    else:
        req, tok0, qo_start, qo_len, kv_len, kv_off = _host_item(WORK, item, PAGED)
    delta = kv_len - qo_len
    head0 = hg * PACK  # first query head of this program
    kv_head = head0 // GROUP_SIZE

    rows = tl.arange(0, BLOCK_M)
    tok = tok0 + rows // PACK
    head = head0 + rows % PACK
    row_ok = (rows < TOKENS * PACK) & (tok < qo_len)
    # Rows outside the tile get position -1 so masked tiles drop them entirely.
    q_pos = tl.where(row_ok, tok, -1)
    offs_d = tl.arange(0, HEAD_DIM)
    alibi = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ALIBI:
        alibi = tl.load(ALIBI_SLOPES + head, mask=row_ok, other=0.0) * alibi_scale
    q_rows = (qo_start + tok).to(tl.int64) * stride_qt + head * stride_qh
    if ROPE:
        # Queries sit at the last qo_len positions of the request's KV.
        q = load_rotated(
            Q + q_rows,
            offs_d,
            row_ok[:, None],
            tok + delta,
            rope_rcp_scale,
            rope_log2_theta,
            HEAD_DIM,
        ).to(Q.dtype.element_ty)
    else:
        q = tl.load(Q + q_rows[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    # KV range this tile can see, in positions of the request.
    last_tok = tl.minimum(tok0 + TOKENS, qo_len) - 1
    hi = kv_len
    if CAUSAL:
        hi = tl.minimum(kv_len, last_tok + delta + 1)
    lo = 0
    if WINDOW:
        lo = tl.maximum(0, tok0 + delta - window_left)
        lo = (lo // BLOCK_N) * BLOCK_N
    # Tiles in [full_lo, full_hi) need no mask: inside the KV, left of every row's diagonal,
    # right of every row's window edge.
    if CUSTOM_MASK:
        full_lo = lo
        full_hi = lo
    else:
        full_hi = kv_len
        if CAUSAL:
            full_hi = tl.minimum(full_hi, tok0 + delta + 1)
        full_hi = tl.maximum(lo, (full_hi // BLOCK_N) * BLOCK_N)
        full_lo = lo
        if WINDOW:
            # Window edge of the last row: every row keeps kv >= its edge.
            edge = tl.maximum(0, last_tok + delta - window_left)
            full_lo = tl.minimum(full_hi, tl.cdiv(edge, BLOCK_N) * BLOCK_N)

    if USE_TMA:
        k_base = K
        v_base = V
    else:
        k_base = K + kv_head * stride_kh
        v_base = V + kv_head * stride_vh
    kv_indices_ptr = KV_INDICES + kv_off
    mask_ptr = MASK
    if CUSTOM_MASK:
        mask_ptr = MASK + tl.load(MASK_INDPTR + req)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    for start in range(lo, full_lo, BLOCK_N):
        acc, m_i, l_i = _tile_step(
            acc,
            m_i,
            l_i,
            q,
            k_base,
            v_base,
            kv_indices_ptr,
            kv_off,
            start,
            q_pos,
            offs_d,
            kv_len,
            qo_len,
            delta,
            window_left,
            qk_scale,
            soft_cap_log2,
            mask_ptr,
            stride_kp,
            stride_ks,
            stride_vp,
            stride_vs,
            kv_head,
            PAGE_SIZE,
            PAGED,
            USE_TMA,
            HEAD_DIM,
            True,
            CAUSAL,
            WINDOW,
            CUSTOM_MASK,
            SOFT_CAP,
            BLOCK_N,
            ROPE,
            rope_rcp_scale,
            rope_log2_theta,
            ALIBI,
            alibi,
        )
    for start in range(full_lo, full_hi, BLOCK_N):
        acc, m_i, l_i = _tile_step(
            acc,
            m_i,
            l_i,
            q,
            k_base,
            v_base,
            kv_indices_ptr,
            kv_off,
            start,
            q_pos,
            offs_d,
            kv_len,
            qo_len,
            delta,
            window_left,
            qk_scale,
            soft_cap_log2,
            mask_ptr,
            stride_kp,
            stride_ks,
            stride_vp,
            stride_vs,
            kv_head,
            PAGE_SIZE,
            PAGED,
            USE_TMA,
            HEAD_DIM,
            False,
            CAUSAL,
            WINDOW,
            CUSTOM_MASK,
            SOFT_CAP,
            BLOCK_N,
            ROPE,
            rope_rcp_scale,
            rope_log2_theta,
            ALIBI,
            alibi,
        )
    for start in range(full_hi, hi, BLOCK_N):
        acc, m_i, l_i = _tile_step(
            acc,
            m_i,
            l_i,
            q,
            k_base,
            v_base,
            kv_indices_ptr,
            kv_off,
            start,
            q_pos,
            offs_d,
            kv_len,
            qo_len,
            delta,
            window_left,
            qk_scale,
            soft_cap_log2,
            mask_ptr,
            stride_kp,
            stride_ks,
            stride_vp,
            stride_vs,
            kv_head,
            PAGE_SIZE,
            PAGED,
            USE_TMA,
            HEAD_DIM,
            True,
            CAUSAL,
            WINDOW,
            CUSTOM_MASK,
            SOFT_CAP,
            BLOCK_N,
            ROPE,
            rope_rcp_scale,
            rope_log2_theta,
            ALIBI,
            alibi,
        )

    # Rows that saw no KV at all (empty request, fully masked row) give 0 and LSE -inf.
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    o_rows = (qo_start + tok).to(tl.int64) * stride_ot + head * stride_oh
    tl.store(
        O + o_rows[:, None] + offs_d[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None]
    )
    if RETURN_LSE:
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        l_rows = (qo_start + tok).to(tl.int64) * stride_lt + head * stride_lh
        tl.store(LSE + l_rows, lse, mask=row_ok)

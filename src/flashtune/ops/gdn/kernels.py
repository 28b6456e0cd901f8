"""GDN's Triton kernels (private): the token recurrence (decode, MTP) and the chunked
prefill (chunk of 64 tokens in the WY/UT form, then a pass carrying the state across chunks).

Math (per value head; state S [V, K], k-last; G the in-chunk cumulative log decay, gamma =
exp(G)): within a chunk starting from S0, the state after token i is
gamma_i S0 + sum_{j<=i} (gamma_i / gamma_j) u_j k_j^T, where the corrected values u solve
(I + A) U = diag(beta) V - diag(beta gamma) K S0^T with A[i, j] = beta_i (gamma_i / gamma_j)
k_i . k_j (j < i). With T = (I + A)^-1 (forward substitution), W = T diag(beta gamma) K and
U0 = T diag(beta) V, U = U0 - W S0^T; the outputs are scale (gamma_i q_i S0^T + sum_{j<=i}
(gamma_i / gamma_j) (q_i . k_j) u_j) and the state leaving the chunk gamma_L S0 + sum_j
(gamma_L / gamma_j) u_j k_j^T. `_chunk_prepare_kernel` computes W, U0, the masked decayed
Q K^T (P) and G for every chunk in parallel; `_chunk_state_kernel` walks each sequence's
chunks in order with the state tile in registers.

Only differences of G are exponentiated where they can grow (j <= i: ratios <= 1); gamma
itself only shrinks, so nothing overflows however strong the decay.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["CHUNK", "SUB"]

CHUNK = 64  # the prefill chunk: tokens per WY block (a chunk never straddles two sequences)
SUB = 16  # its diagonal blocks, inverted by forward substitution (the rest by a series)


@triton.jit
def _log_decay(a, dt_bias, neg_a):
    """log g = -exp(A_log) * softplus(a + dt_bias) (softplus linear above 20, as torch's)."""
    x = a + dt_bias
    soft = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    return neg_a * soft


@triton.jit
def _dot_inputs(a, b, PRECISION: tl.constexpr):
    """a @ b of the inputs as loaded: half-precision operands on tensor cores (their products
    are exact in the float32 accumulator), float32 ones (l2-normalized q/k) at PRECISION."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, input_precision=PRECISION)
    return tl.dot(a, b)


@triton.jit
def _recurrent_kernel(
    q_ptr,  # [B, T, H, K]  contiguous
    k_ptr,  # [B, T, H, K]  contiguous
    v_ptr,  # [B, T, HV, V] contiguous
    a_ptr,  # [B, T, HV]    contiguous (RAW_GATES: a; else log g, float32)
    b_ptr,  # [B, T, HV]    contiguous (RAW_GATES: b; else beta, float32)
    a_log_ptr,  # [HV] float32
    dt_bias_ptr,  # [HV]
    state_ptr,  # [P, HV, V, K] float32 (strides below: a k-major view works)
    new_state_ptr,  # [P', HV, V, K] float32 (may be state_ptr: in place)
    out_ptr,  # [B, T, HV, V] contiguous
    inter_ptr,  # [*, T, HV, V, K] float32 contiguous, or a dummy
    read_idx_ptr,  # [B] int: the slot each request reads (HAS_READ_IDX)
    write_idx_ptr,  # [B] int: the slot it writes (HAS_WRITE_IDX, else the read slot)
    scale,
    T,
    s_n,
    s_h,
    s_v,
    s_k,
    n_n,
    n_h,
    n_v,
    n_k,
    HV: tl.constexpr,
    GROUP: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_STATE: tl.constexpr,
    HAS_READ_IDX: tl.constexpr,
    HAS_WRITE_IDX: tl.constexpr,
    WRITE_STATE: tl.constexpr,
    HAS_INTER: tl.constexpr,
    INTER_BY_SLOT: tl.constexpr,
    L2NORM: tl.constexpr,
    RAW_GATES: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_h = tl.program_id(1)
    i_v = tl.program_id(2)
    i_hq = i_h // GROUP
    offs_v = i_v * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, K)
    mask_v = offs_v < V
    H = HV // GROUP
    if HAS_READ_IDX:
        slot = tl.load(read_idx_ptr + i_b).to(tl.int64)
    else:
        slot = i_b.to(tl.int64)
    valid = slot >= 0  # a negative slot is padding: nothing is read or written
    slot = tl.maximum(slot, 0)
    if HAS_WRITE_IDX:
        wslot = tl.load(write_idx_ptr + i_b).to(tl.int64)
    else:
        wslot = slot
    tile = offs_v[:, None] * s_v + offs_k[None, :] * s_k
    m2 = mask_v[:, None] & valid
    if HAS_STATE:
        s = tl.load(state_ptr + slot * s_n + i_h * s_h + tile, mask=m2, other=0.0)
    else:
        s = tl.zeros([BV, K], dtype=tl.float32)
    neg_a = -tl.exp(tl.load(a_log_ptr + i_h).to(tl.float32))
    dtb = tl.load(dt_bias_ptr + i_h).to(tl.float32)
    for t in range(T):
        row = i_b.to(tl.int64) * T + t
        q = tl.load(q_ptr + (row * H + i_hq) * K + offs_k).to(tl.float32)
        k = tl.load(k_ptr + (row * H + i_hq) * K + offs_k).to(tl.float32)
        if L2NORM:
            q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6)
            k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
        v = tl.load(v_ptr + (row * HV + i_h) * V + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + row * HV + i_h).to(tl.float32)
        beta = tl.load(b_ptr + row * HV + i_h).to(tl.float32)
        if RAW_GATES:
            a = _log_decay(a, dtb, neg_a)
            beta = tl.sigmoid(beta)
        s = s * tl.exp(a)
        u = beta * (v - tl.sum(s * k[None, :], 1))
        s = s + u[:, None] * k[None, :]
        o = tl.sum(s * q[None, :], 1) * scale
        tl.store(
            out_ptr + (row * HV + i_h) * V + offs_v,
            o.to(out_ptr.dtype.element_ty),
            mask=mask_v & valid,
        )
        if HAS_INTER:
            if INTER_BY_SLOT:
                which = slot
            else:
                which = i_b.to(tl.int64)
            base = ((which * T + t) * HV + i_h) * V * K
            tl.store(inter_ptr + base + offs_v[:, None] * K + offs_k[None, :], s, mask=m2)
    if WRITE_STATE:
        wtile = offs_v[:, None] * n_v + offs_k[None, :] * n_k
        tl.store(new_state_ptr + wslot * n_n + i_h * n_h + wtile, s, mask=m2 & (wslot >= 0))


@triton.jit
def _chunk_prepare_kernel(
    q_ptr,  # [T, H, K]  contiguous
    k_ptr,  # [T, H, K]  contiguous
    v_ptr,  # [T, HV, V] contiguous
    a_ptr,  # [T, HV] (RAW_GATES: a; else log g, float32)
    b_ptr,  # [T, HV] (RAW_GATES: b; else beta, float32)
    a_log_ptr,  # [HV] float32
    dt_bias_ptr,  # [HV]
    chunk_start_ptr,  # [NC] int32: first token of each chunk
    chunk_len_ptr,  # [NC] int32: its tokens (<= C)
    w_ptr,  # [T, HV, K] float32 out: W rows
    u_ptr,  # [T, HV, V] float32 out: U0 rows
    p_ptr,  # [T, HV, C] float32 out: decayed, causal q . k within the chunk
    g_ptr,  # [T, HV] float32 out: cumulative log decay within the chunk
    HV: tl.constexpr,
    GROUP: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    C: tl.constexpr,
    SUB: tl.constexpr,
    PRECISION: tl.constexpr,
    RAW_GATES: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    i_hq = i_h // GROUP
    H = HV // GROUP
    start = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    length = tl.load(chunk_len_ptr + i_c)
    offs_c = tl.arange(0, C)
    offs_k = tl.arange(0, K)
    offs_v = tl.arange(0, V)
    m = offs_c < length
    rows = start + offs_c
    kk = tl.load(
        k_ptr + (rows[:, None] * H + i_hq) * K + offs_k[None, :], mask=m[:, None], other=0.0
    )
    qq = tl.load(
        q_ptr + (rows[:, None] * H + i_hq) * K + offs_k[None, :], mask=m[:, None], other=0.0
    )
    vv = tl.load(
        v_ptr + (rows[:, None] * HV + i_h) * V + offs_v[None, :], mask=m[:, None], other=0.0
    )
    neg_a = -tl.exp(tl.load(a_log_ptr + i_h).to(tl.float32))
    dtb = tl.load(dt_bias_ptr + i_h).to(tl.float32)
    a = tl.load(a_ptr + rows * HV + i_h, mask=m, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + rows * HV + i_h, mask=m, other=0.0).to(tl.float32)
    if RAW_GATES:
        a = _log_decay(a, dtb, neg_a)
        beta = tl.sigmoid(beta)
    gl = tl.where(m, a, 0.0)
    beta = tl.where(m, beta, 0.0)
    G = tl.cumsum(gl, 0)
    diff = G[:, None] - G[None, :]
    strict = offs_c[:, None] > offs_c[None, :]
    causal = offs_c[:, None] >= offs_c[None, :]
    ratio = tl.exp(tl.where(causal, diff, 0.0))
    kkt = _dot_inputs(kk, tl.trans(kk), PRECISION)
    A = tl.where(strict, beta[:, None] * ratio * kkt, 0.0)
    # T = (I + A)^-1. A = D + L: D its SUB x SUB diagonal blocks, L the rest (strictly block
    # lower). (I + D)^-1 by forward substitution in every block at once (row r of a block is
    # e_r - sum_{j<r} D[r, j] Td[j, :]: SUB - 1 steps, not C - 1), then
    # (I + A)^-1 = (I + M)^-1 Td with M = Td L, nilpotent: I - M + M^2 - ... (Horner).
    blk = offs_c // SUB
    pos = offs_c % SUB
    same = blk[:, None] == blk[None, :]
    Td = tl.where(offs_c[:, None] == offs_c[None, :], 1.0, 0.0)
    Ad = tl.where(same, A, 0.0)
    for i in range(1, SUB):
        rows_i = tl.where(pos[:, None] == i, Ad, 0.0)
        Td = Td - tl.dot(rows_i, Td, input_precision=PRECISION)
    M = tl.dot(Td, tl.where(same, 0.0, A), input_precision=PRECISION)
    Tm = Td
    for _ in range(C // SUB - 1):
        Tm = Td - tl.dot(M, Tm, input_precision=PRECISION)
    kb = kk.to(tl.float32) * (beta * tl.exp(G))[:, None]
    W = tl.dot(Tm, kb, input_precision=PRECISION)
    U = tl.dot(Tm, vv.to(tl.float32) * beta[:, None], input_precision=PRECISION)
    P = tl.where(causal, ratio * _dot_inputs(qq, tl.trans(kk), PRECISION), 0.0)
    tl.store(w_ptr + (rows[:, None] * HV + i_h) * K + offs_k[None, :], W, mask=m[:, None])
    tl.store(u_ptr + (rows[:, None] * HV + i_h) * V + offs_v[None, :], U, mask=m[:, None])
    tl.store(p_ptr + (rows[:, None] * HV + i_h) * C + offs_c[None, :], P, mask=m[:, None])
    tl.store(g_ptr + rows * HV + i_h, G, mask=m)


@triton.jit
def _chunk_state_kernel(
    q_ptr,  # [T, H, K]  contiguous
    k_ptr,  # [T, H, K]  contiguous
    w_ptr,  # [T, HV, K] float32
    u_ptr,  # [T, HV, V] float32
    p_ptr,  # [T, HV, C] float32
    g_ptr,  # [T, HV]    float32
    cu_ptr,  # [N + 1] int: cu_seqlens
    state_ptr,  # [N, HV, V, K] float32 initial state (HAS_STATE; strides below)
    new_state_ptr,  # [N, HV, V, K] float32 out (strides below)
    out_ptr,  # [T, HV, V] contiguous
    scale,
    s_n,
    s_h,
    s_v,
    s_k,
    n_n,
    n_h,
    n_v,
    n_k,
    HV: tl.constexpr,
    GROUP: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    HAS_STATE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_h = tl.program_id(1)
    i_v = tl.program_id(2)
    i_hq = i_h // GROUP
    H = HV // GROUP
    offs_c = tl.arange(0, C)
    offs_k = tl.arange(0, K)
    offs_v = i_v * BV + tl.arange(0, BV)
    bos = tl.load(cu_ptr + i_n).to(tl.int32)
    eos = tl.load(cu_ptr + i_n + 1).to(tl.int32)
    if HAS_STATE:
        tile = offs_v[:, None] * s_v + offs_k[None, :] * s_k
        s = tl.load(state_ptr + i_n.to(tl.int64) * s_n + i_h * s_h + tile)
    else:
        s = tl.zeros([BV, K], dtype=tl.float32)
    for start in range(bos, eos, C):
        length = tl.minimum(eos - start, C)
        m = offs_c < length
        rows = (offs_c + start).to(tl.int64)
        W = tl.load(
            w_ptr + (rows[:, None] * HV + i_h) * K + offs_k[None, :], mask=m[:, None], other=0.0
        )
        U0 = tl.load(
            u_ptr + (rows[:, None] * HV + i_h) * V + offs_v[None, :], mask=m[:, None], other=0.0
        )
        P = tl.load(
            p_ptr + (rows[:, None] * HV + i_h) * C + offs_c[None, :], mask=m[:, None], other=0.0
        )
        G = tl.load(g_ptr + rows * HV + i_h, mask=m, other=0.0)
        g_last = tl.sum(tl.where(offs_c == length - 1, G, 0.0), 0)
        qq = tl.load(
            q_ptr + (rows[:, None] * H + i_hq) * K + offs_k[None, :], mask=m[:, None], other=0.0
        )
        kk = tl.load(
            k_ptr + (rows[:, None] * H + i_hq) * K + offs_k[None, :], mask=m[:, None], other=0.0
        )
        st = tl.trans(s)  # [K, BV]
        U = U0 - tl.dot(W, st, input_precision=PRECISION)  # [C, BV]
        o = tl.exp(G)[:, None] * tl.dot(qq.to(tl.float32), st, input_precision=PRECISION)
        o = (o + tl.dot(P, U, input_precision=PRECISION)) * scale
        tl.store(out_ptr + (rows[:, None] * HV + i_h) * V + offs_v[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=m[:, None])  # fmt: skip
        r = tl.where(m, tl.exp(g_last - G), 0.0)
        s = s * tl.exp(g_last) + tl.dot(
            tl.trans(U * r[:, None]), kk.to(tl.float32), input_precision=PRECISION
        )
    s = tl.where(eos > bos, s, 0.0)  # the contract's: an empty sequence's state is zeros
    ntile = offs_v[:, None] * n_v + offs_k[None, :] * n_k
    tl.store(new_state_ptr + i_n.to(tl.int64) * n_n + i_h * n_h + ntile, s)

"""The RoPE Triton kernel (launch.py launches it).

Program (token, block of BLOCK_H heads), q heads first, then k heads; cos/sin for the token
are loaded from a cache or computed once per program and shared by its heads. Computed
frequencies follow FlashInfer's kernel, Llama 3.1's scaling included:

    f_j = rope_theta ** (-2j / rotary_dim)
    s_j = clamp(f_j * smooth_a + smooth_b, 0, 1)
    f_j = (1 - s_j) * f_j / rope_scale + s_j * f_j,      angle = pos * f_j

smooth_a = smooth_b = 0 is plain RoPE with positions divided by rope_scale;
`launch.llama31_smoothing` gives Llama 3.1's (high frequencies unscaled, low ones divided by
rope_scale, a linear blend between).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__: list[str] = []


@triton.jit
def _rope_kernel(
    Q,  # [nnz, Hq, D] (strides sq_t, sq_h, 1)
    K,  # [nnz, Hk, D] (strides sk_t, sk_h, 1)
    QO,  # [nnz, Hq, D] output (may alias Q)
    KO,  # [nnz, Hk, D] output (may alias K)
    POS,  # [nnz] int32/int64 positions
    CS,  # [max_pos, RD] fp32 cos | sin (FROM_CACHE only)
    Hq,
    Hk,
    D,
    half,  # rotary_dim // 2
    max_pos,
    sq_t,
    sq_h,
    sk_t,
    sk_h,
    sqo_t,
    sqo_h,
    sko_t,
    sko_h,
    s_cs,
    log2_theta,
    rcp_scale,
    smooth_a,
    smooth_b,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    INTERLEAVE: tl.constexpr,
    FROM_CACHE: tl.constexpr,
    COPY_PASS: tl.constexpr,
    SMOOTH: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    q_blocks = tl.cdiv(Hq, BLOCK_H)
    if hb < q_blocks:
        h0 = hb * BLOCK_H
        n_heads = Hq
        src = Q + t * sq_t
        dst = QO + t * sqo_t
        s_h = sq_h
        d_h = sqo_h
    else:
        h0 = (hb - q_blocks) * BLOCK_H
        n_heads = Hk
        src = K + t * sk_t
        dst = KO + t * sko_t
        s_h = sk_h
        d_h = sko_h
    heads = h0 + tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    jm = j < half
    mask = (heads < n_heads)[:, None] & jm[None, :]

    pos = tl.load(POS + t)
    if FROM_CACHE:
        # Out-of-range positions read nothing (cos = sin = 0) rather than stray memory.
        ok = (pos >= 0) & (pos < max_pos)
        cs = CS + pos.to(tl.int64) * s_cs
        cos = tl.load(cs + j, mask=jm & ok, other=0.0).to(tl.float32)
        sin = tl.load(cs + half + j, mask=jm & ok, other=0.0).to(tl.float32)
    else:
        inv_freq = tl.exp2(-(2.0 * j.to(tl.float32) / (2 * half)) * log2_theta)
        if SMOOTH:
            smooth = tl.minimum(tl.maximum(inv_freq * smooth_a + smooth_b, 0.0), 1.0)
            angle = pos.to(tl.float32) * (
                (1.0 - smooth) * (inv_freq * rcp_scale) + smooth * inv_freq
            )
        else:
            angle = (pos.to(tl.float32) * rcp_scale) * inv_freq
        cos = tl.cos(angle)
        sin = tl.sin(angle)
    cos = cos[None, :]
    sin = sin[None, :]

    row_s = heads.to(tl.int64)[:, None] * s_h
    row_d = heads.to(tl.int64)[:, None] * d_h
    if INTERLEAVE:
        i1 = 2 * j[None, :]
        i2 = i1 + 1
    else:
        i1 = j[None, :]
        i2 = i1 + half
    x1 = tl.load(src + row_s + i1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + row_s + i2, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    tl.store(dst + row_d + i1, o1.to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + row_d + i2, o2.to(dst.dtype.element_ty), mask=mask)

    if COPY_PASS:
        p = 2 * half + tl.arange(0, BLOCK_PASS)
        pmask = (heads < n_heads)[:, None] & (p < D)[None, :]
        xp = tl.load(src + row_s + p[None, :], mask=pmask, other=0.0)
        tl.store(dst + row_d + p[None, :], xp, mask=pmask)

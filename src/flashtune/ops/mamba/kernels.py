"""The selective state update's Triton kernel (launch.py launches it).

One program per (head_dim tile, batch row, head): the state tile [BLOCK_D, dstate] of the
row's slot is read once, decayed and fed in fp32, written back in place, and reduced against
C for the output. The op is bound by the state's bytes (read + write of
nheads * head_dim * dstate elements per row; x, dt, B, C, z and the output are a few percent
of it), so the kernel's job is to stream the tile at HBM rate: dstate is the contiguous,
vectorized dimension, BLOCK_D only sets how many programs share a head (more programs for
small batches, fewer and longer ones for large).

A with one value per head (Mamba-2's layout: strides (1, 0, 0), TIE_A) computes one decay
per channel instead of one exp per state element.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__: list[str] = []


@triton.jit
def _ssu_kernel(
    STATE,  # [slots, nheads, dim, dstate] updated in place (last dimension contiguous)
    X,  # [batch, nheads, dim]
    DT,  # [batch, nheads, dim] (strides may be 0 on dim: one dt per head)
    A,  # [nheads, dim, dstate] fp32 (strides (1, 0, 0) when TIE_A)
    Bm,  # [batch, ngroups, dstate]
    Cm,  # [batch, ngroups, dstate]
    Dv,  # [nheads, dim] (HAS_D only)
    Z,  # [batch, nheads, dim] (HAS_Z only)
    DT_BIAS,  # [nheads, dim] (HAS_DT_BIAS only)
    SLOTS,  # [batch] int32/int64 slot read (and written) per row (HAS_SLOTS only)
    DST,  # [batch] slot written per row (HAS_DST only)
    OUT,  # [batch, nheads, dim]
    dim,
    dstate,
    ratio,  # nheads // ngroups: heads sharing one B / C group
    pad_slot_id,
    s_st0,
    s_st1,
    s_st2,
    s_x0,
    s_x1,
    s_x2,
    s_dt0,
    s_dt1,
    s_dt2,
    s_a0,
    s_a1,
    s_a2,
    s_b0,
    s_b1,
    s_c0,
    s_c1,
    s_d0,
    s_d1,
    s_z0,
    s_z1,
    s_z2,
    s_db0,
    s_db1,
    s_o0,
    s_o1,
    s_o2,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    TIE_A: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    HAS_DST: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    WRITE_STATE: tl.constexpr,
):
    pid_d = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    g = h // ratio
    if HAS_SLOTS:
        slot = tl.load(SLOTS + b).to(tl.int64)
    else:
        slot = b
    live = slot != pad_slot_id

    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_s = tl.arange(0, BLOCK_S)
    mask_d = offs_d < dim
    mask_s = offs_s < dstate
    tile = (mask_d[:, None] & mask_s[None, :]) & live
    state_ptrs = STATE + slot * s_st0 + h * s_st1 + offs_d[:, None] * s_st2 + offs_s[None, :]
    # The state first: the one big load, in flight while the small vectors arrive.
    st = tl.load(state_ptrs, mask=tile, other=0.0).to(tl.float32)

    x = tl.load(X + b * s_x0 + h * s_x1 + offs_d * s_x2, mask=mask_d, other=0.0).to(tl.float32)
    dt = tl.load(DT + b * s_dt0 + h * s_dt1 + offs_d * s_dt2, mask=mask_d, other=0.0)
    dt = dt.to(tl.float32)
    if HAS_DT_BIAS:
        bias = tl.load(DT_BIAS + h * s_db0 + offs_d * s_db1, mask=mask_d, other=0.0)
        dt += bias.to(tl.float32)
    if SOFTPLUS:
        # torch's softplus: log(1 + e^x), and x itself above 20 (where they agree in fp32).
        dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
    Bv = tl.load(Bm + b * s_b0 + g * s_b1 + offs_s, mask=mask_s, other=0.0).to(tl.float32)
    Cv = tl.load(Cm + b * s_c0 + g * s_c1 + offs_s, mask=mask_s, other=0.0).to(tl.float32)
    if TIE_A:
        a = tl.load(A + h * s_a0).to(tl.float32)
        dA = tl.exp(dt * a)[:, None]  # [BLOCK_D, 1]
    else:
        a_ptrs = A + h * s_a0 + offs_d[:, None] * s_a1 + offs_s[None, :] * s_a2
        a = tl.load(a_ptrs, mask=mask_d[:, None] & mask_s[None, :], other=0.0)
        dA = tl.exp(dt[:, None] * a.to(tl.float32))

    st = st * dA + (dt * x)[:, None] * Bv[None, :]
    if WRITE_STATE:
        if HAS_DST:
            dst = tl.load(DST + b).to(tl.int64)
            dst_ptrs = STATE + dst * s_st0 + h * s_st1 + offs_d[:, None] * s_st2
            dst_ptrs += offs_s[None, :]
            keep = tile & (dst != pad_slot_id)
            tl.store(dst_ptrs, st.to(STATE.dtype.element_ty), mask=keep)
        else:
            tl.store(state_ptrs, st.to(STATE.dtype.element_ty), mask=tile)

    y = tl.sum(st * Cv[None, :], axis=1)  # [BLOCK_D]
    if HAS_D:
        dv = tl.load(Dv + h * s_d0 + offs_d * s_d1, mask=mask_d, other=0.0).to(tl.float32)
        y += x * dv
    if HAS_Z:
        z = tl.load(Z + b * s_z0 + h * s_z1 + offs_d * s_z2, mask=mask_d, other=0.0)
        z = z.to(tl.float32)
        y *= z * tl.sigmoid(z)
    y = tl.where(live, y, 0.0)  # a pad row's output is zeros
    tl.store(OUT + b * s_o0 + h * s_o1 + offs_d * s_o2, y.to(OUT.dtype.element_ty), mask=mask_d)

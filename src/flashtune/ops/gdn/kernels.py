"""GDN's Triton kernels (private): the token recurrence (decode, MTP) and the chunked
prefill (chunks of 64 tokens in the WY/UT form, three kernels).

Math (per value head; state S [V, K], k-last; G the in-chunk cumulative log decay, gamma =
exp(G)): within a chunk starting from S0, the state after token i is
gamma_i S0 + sum_{j<=i} (gamma_i / gamma_j) u_j k_j^T, where the corrected values u solve
(I + A) U = diag(beta) V - diag(beta gamma) K S0^T with A[i, j] = beta_i (gamma_i / gamma_j)
k_i . k_j (j < i). With T = (I + A)^-1, W = T diag(beta gamma) K and U0 = T diag(beta) V,
U = U0 - W S0^T; the outputs are scale (gamma_i q_i S0^T + sum_{j<=i} (gamma_i / gamma_j)
(q_i . k_j) u_j) and the state leaving the chunk gamma_L S0 + sum_j (gamma_L / gamma_j)
u_j k_j^T.

The prefill splits this the way the fast published implementations do, so that only the
part that must be sequential is (four kernels, all but 3. parallel over chunks):
1. `_chunk_solve_kernel`, per (chunk, value head): G, A as one [C, K] x [K, C] tensor-core
   product (its 16 x 16 blocks then split out of the register tile), T = (I + A)^-1
   blockwise (the four 16 x 16 diagonal blocks inverted, then merged: small float32
   products), stored by rows [T, HV, C] in the intermediates' dtype (fla's solve_tril);
2. `_chunk_wu_kernel`, per (chunk, value head): W and U0 as one [C, C] x [C, 64] tensor-core
   product per 64 columns of K and V (T the A operand of every one);
3. `_chunk_state_kernel`, per (sequence, value head, V tile): the state in float32
   registers (two K halves, k-major: both products then take it as a plain operand), per
   chunk only U = U0 - W S0^T (stored) and the state update; each chunk's entering state is
   stored for 4.;
4. `_chunk_output_kernel`, per (chunk, value head, V tile), all in parallel: the outputs from
   the entering state, U and the chunk's q k^T.
1. and 2. were one kernel that formed W and U0 block row by block row from T's ten blocks
(twenty 16-row products, k and v held throughout: 255 registers and spills on sm_90); T's
round trip (C values a row, 16 MB at 4096 tokens x 32 heads in bf16) buys one product each.
Products take their operands in the intermediates' dtype (`w_ptr`'s): the input's half type
(bf16/fp16, tensor cores, float32 accumulation: fla's choice) or float32 at PRECISION
("tf32", or "ieee" exact: the checking path). The state itself always accumulates in float32.

Only differences of G are exponentiated where they can grow (j <= i: ratios <= 1); gamma
itself only shrinks, so nothing overflows however strong the decay.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["CHUNK", "SUB"]

CHUNK = 64  # the prefill chunk: tokens per WY block (a chunk never straddles two sequences)
SUB = 16  # its diagonal blocks, inverted by a factorized series (then merged: 4 per chunk)


@triton.jit
def _log_decay(a, dt_bias, neg_a):
    """log g = -exp(A_log) * softplus(a + dt_bias) (softplus linear above 20, as torch's)."""
    x = a + dt_bias
    soft = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    return neg_a * soft


@triton.jit
def _mm(a, b, PRECISION: tl.constexpr):
    """a @ b, float32 accumulation: half-precision operands on tensor cores (their products
    are exact in the accumulator), float32 ones at PRECISION ("tf32" or "ieee")."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, input_precision=PRECISION)
    return tl.dot(a, b)


@triton.jit
def _token_inputs(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, row, i_h, i_hq, offs_k, offs_v, mask_v, present,
    H, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
):  # fmt: skip
    """Token `row`'s q, k, v rows and gate inputs of this program's heads, as stored
    (zeros where not `present`: the token past a request's last)."""
    q = tl.load(q_ptr + (row * H + i_hq) * K + offs_k, mask=present, other=0.0)
    k = tl.load(k_ptr + (row * H + i_hq) * K + offs_k, mask=present, other=0.0)
    v = tl.load(v_ptr + (row * HV + i_h) * V + offs_v, mask=mask_v & present, other=0.0)
    a = tl.load(a_ptr + row * HV + i_h, mask=present, other=0.0)
    b = tl.load(b_ptr + row * HV + i_h, mask=present, other=0.0)
    return q, k, v, a, b


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
    ZERO_PAD: tl.constexpr,  # padding requests' output rows written as zeros (else left alone)
    L2NORM: tl.constexpr,
    RAW_GATES: tl.constexpr,
    PREFETCH: tl.constexpr = False,  # load token t + 1 during token t (several tokens)
):
    # One flat grid, V tiles fastest, then heads, then requests: programs that run together
    # stream neighbouring rows of one state (a request's heads are contiguous), which the
    # (batch, head, tile) grid, request fastest, did not. fla-core orders its grid this way
    # and decoded 7-10% faster at every tile shape we tried (H200, 2026-11-29).
    pid = tl.program_id(0)
    NV: tl.constexpr = (V + BV - 1) // BV
    i_v = pid % NV
    i_h = (pid // NV) % HV
    i_b = pid // (NV * HV)
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
    # Each token's inputs are loaded one token ahead (the loads of token t + 1 issued
    # before token t's arithmetic): a program is one serial chain over its tokens, and at
    # several tokens (MTP) the chain's load latency, not the bandwidth, bounded it.
    # (PREFETCH: several tokens; one token keeps the registers the next would take.)
    row0 = i_b.to(tl.int64) * T
    if PREFETCH:
        q_n, k_n, v_n, a_n, b_n = _token_inputs(
            q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, row0, i_h, i_hq, offs_k, offs_v, mask_v, True,
            H, HV, K, V,
        )  # fmt: skip
    for t in range(T):
        row = row0 + t
        if PREFETCH:
            q, k, v, a, beta = q_n, k_n, v_n, a_n, b_n
            q_n, k_n, v_n, a_n, b_n = _token_inputs(
                q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, row + 1, i_h, i_hq, offs_k, offs_v, mask_v,
                t + 1 < T, H, HV, K, V,
            )  # fmt: skip
        else:
            q, k, v, a, beta = _token_inputs(
                q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, row, i_h, i_hq, offs_k, offs_v, mask_v,
                True, H, HV, K, V,
            )  # fmt: skip
        q = q.to(tl.float32)
        k = k.to(tl.float32)
        if L2NORM:
            q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6)
            k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
        v = v.to(tl.float32)
        a = a.to(tl.float32)
        beta = beta.to(tl.float32)
        if RAW_GATES:
            a = _log_decay(a, dtb, neg_a)
            beta = tl.sigmoid(beta)
        s = s * tl.exp(a)
        u = beta * (v - tl.sum(s * k[None, :], 1))
        s = s + u[:, None] * k[None, :]
        o = tl.sum(s * q[None, :], 1) * scale
        # Padding rows: zeros where the output is the call's own (no memset before), else
        # left alone.
        out_mask = mask_v & valid
        if ZERO_PAD:
            out_mask = mask_v
        tl.store(
            out_ptr + (row * HV + i_h) * V + offs_v,
            tl.where(valid, o, 0.0).to(out_ptr.dtype.element_ty),
            mask=out_mask,
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


# --------------------------------------------------------------------------- chunked prefill


@triton.jit
def _chunk_table_kernel(
    cu_ptr,  # [N + 1] int: cu_seqlens
    start_ptr,  # [SLOTS] int32 out: each chunk slot's first token
    len_ptr,  # [SLOTS] int32 out: its tokens (0: an unused slot)
    first_ptr,  # [N] int32 out: each sequence's first slot (written by program 0)
    N,
    SLOTS,
    C: tl.constexpr,
    BS: tl.constexpr,
    BN: tl.constexpr,
):
    # launch.chunk_table's table in one launch (it was ~15 small torch kernels, ~30 us a
    # call on an H200): a program owns BS slots and walks the sequences BN at a time,
    # carrying the slots used so far; slot s belongs to the sequence whose slot range
    # [first, first + chunks) holds it, at most one, so sums over the block select it
    # (int32: token counts below 2^31).
    pid = tl.program_id(0)
    s = pid * BS + tl.arange(0, BS)
    start = tl.zeros([BS], dtype=tl.int32)
    length = tl.zeros([BS], dtype=tl.int32)
    base = tl.zeros([], dtype=tl.int32)
    for n0 in range(0, N, BN):
        i = n0 + tl.arange(0, BN)
        mi = i < N
        lo = tl.load(cu_ptr + i, mask=mi, other=0).to(tl.int32)
        hi = tl.load(cu_ptr + i + 1, mask=mi, other=0).to(tl.int32)
        chunks = (hi - lo + C - 1) // C
        ends = tl.cumsum(chunks, 0) + base
        first = ends - chunks
        if pid == 0:
            tl.store(first_ptr + i, first, mask=mi)
        hit = (s[:, None] >= first[None, :]) & (s[:, None] < ends[None, :])
        at = lo[None, :] + (s[:, None] - first[None, :]) * C
        start += tl.sum(tl.where(hit, at, 0), 1)
        length += tl.sum(tl.where(hit, tl.minimum(hi[None, :] - at, C), 0), 1)
        base += tl.sum(chunks, 0)
    m = s < SLOTS
    tl.store(start_ptr + s, start, mask=m)
    tl.store(len_ptr + s, length, mask=m)


@triton.jit
def _block_gates(
    a_ptr, b_ptr, start, r0, length, i_h, neg_a, dtb,
    HV: tl.constexpr, SUB: tl.constexpr, RAW_GATES: tl.constexpr,
):  # fmt: skip
    """(log g, beta) of a chunk's rows r0 .. r0 + SUB, zeros past its length (so padding
    rows neither decay nor write)."""
    offs = r0 + tl.arange(0, SUB)
    m = offs < length
    rows = start + offs
    a = tl.load(a_ptr + rows * HV + i_h, mask=m, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + rows * HV + i_h, mask=m, other=0.0).to(tl.float32)
    if RAW_GATES:
        a = _log_decay(a, dtb, neg_a)
        beta = tl.sigmoid(beta)
    return tl.where(m, a, 0.0), tl.where(m, beta, 0.0)


@triton.jit
def _block_cols(
    ptr, start, r0, length, head, c0,
    NH: tl.constexpr, D: tl.constexpr, SUB: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """Columns c0 .. c0 + BC of a chunk's rows r0 .. r0 + SUB of a [T, NH, D] tensor at
    `head` (zeros past its end)."""
    offs = r0 + tl.arange(0, SUB)
    cols = c0 + tl.arange(0, BC)
    ptrs = ptr + ((start + offs)[:, None] * NH + head) * D + cols[None, :]
    return tl.load(ptrs, mask=(offs < length)[:, None], other=0.0)


@triton.jit
def _block_rows(ptr, start, r0, length, head, NH: tl.constexpr, D: tl.constexpr, SUB: tl.constexpr):
    """A chunk's rows r0 .. r0 + SUB of a [T, NH, D] tensor at `head` (zeros past its end)."""
    return _block_cols(ptr, start, r0, length, head, 0, NH, D, SUB, D)


@triton.jit
def _kkt_blocks(k_ptr, start, length, head, DT, NH: tl.constexpr, K: tl.constexpr,
                SUB: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """The ten lower blocks k_a . k_b (b <= a, SUB rows each) of a chunk's [4 SUB, K] keys,
    as SUB x SUB products over BK columns at a time: small per-warp MMAs that need no
    split of a big register tile (the one-product form's layout change)."""
    z = tl.zeros([SUB, SUB], dtype=tl.float32)
    a00, a10, a11, a20, a21, a22, a30, a31, a32, a33 = z, z, z, z, z, z, z, z, z, z
    for i in tl.static_range(K // BK):
        c0 = i * BK
        k0 = _block_cols(k_ptr, start, 0, length, head, c0, NH, K, SUB, BK).to(DT)
        k1 = _block_cols(k_ptr, start, SUB, length, head, c0, NH, K, SUB, BK).to(DT)
        k2 = _block_cols(k_ptr, start, 2 * SUB, length, head, c0, NH, K, SUB, BK).to(DT)
        k3 = _block_cols(k_ptr, start, 3 * SUB, length, head, c0, NH, K, SUB, BK).to(DT)
        t0, t1, t2 = tl.trans(k0), tl.trans(k1), tl.trans(k2)
        a00 += _mm(k0, t0, PRECISION)
        a10 += _mm(k1, t0, PRECISION)
        a11 += _mm(k1, t1, PRECISION)
        a20 += _mm(k2, t0, PRECISION)
        a21 += _mm(k2, t1, PRECISION)
        a22 += _mm(k2, t2, PRECISION)
        a30 += _mm(k3, t0, PRECISION)
        a31 += _mm(k3, t1, PRECISION)
        a32 += _mm(k3, t2, PRECISION)
        a33 += _mm(k3, tl.trans(k3), PRECISION)
    return a00, a10, a11, a20, a21, a22, a30, a31, a32, a33


@triton.jit
def _scale_block(x, beta_a, g_a, g_b, DIAGONAL: tl.constexpr):
    """beta_i (gamma_i / gamma_j) x_ij of a block of A (rows a, columns b); a diagonal
    block keeps its strictly lower part (the exponent masked first: above the diagonal it
    could overflow, and inf * 0 is nan)."""
    if DIAGONAL:
        offs = tl.arange(0, x.shape[0])
        strict = offs[:, None] > offs[None, :]
        ratio = tl.exp(tl.where(strict, g_a[:, None] - g_b[None, :], 0.0))
        return tl.where(strict, x * (beta_a[:, None] * ratio), 0.0)
    # b < a: G only decreases along the chunk (padding rows hold it), so the ratio is <= 1
    return x * (beta_a[:, None] * tl.exp(g_a[:, None] - g_b[None, :]))


@triton.jit
def _split_rows(x):
    """[i, j, a_hi, a_lo] -> the four [i, j] blocks of row block a = 2 a_hi + a_lo, a = 0..3."""
    lo0, lo1 = tl.split(x)  # a_lo
    r0, r2 = tl.split(lo0)  # a_hi
    r1, r3 = tl.split(lo1)
    return r0, r1, r2, r3


@triton.jit
def _inv_unit_lower(A, eye, PRECISION: tl.constexpr):
    """(I + A)^-1 of a strictly lower SUB x SUB block (SUB = 16: A^16 = 0), as the exact
    factorization of its Neumann series, (I - A)(I + A^2)(I + A^4)(I + A^8): six small
    products instead of forward substitution's 15 dependent row steps, each of which costs
    cross-warp reductions and layout changes through shared memory (measured on an H200:
    the substitution made this kernel ~9 us of SM time per chunk)."""
    a2 = _mm(A, A, PRECISION)
    a4 = _mm(a2, a2, PRECISION)
    a8 = _mm(a4, a4, PRECISION)
    t = _mm(eye - A, eye + a2, PRECISION)
    t = _mm(t, eye + a4, PRECISION)
    return _mm(t, eye + a8, PRECISION)


@triton.jit
def _store_t_block(
    ptr, x, start, r0, c0, length, head, HV: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr
):
    """T's block of rows r0 .. r0 + SUB, columns c0 .. c0 + SUB into a [T, HV, C] tensor."""
    offs = tl.arange(0, SUB)
    rows = start + r0 + offs
    ptrs = ptr + (rows[:, None] * HV + head) * C + (c0 + offs)[None, :]
    tl.store(ptrs, x.to(ptr.dtype.element_ty), mask=(r0 + offs < length)[:, None])


@triton.jit
def _one_product_a(
    k_ptr, a_ptr, b_ptr, g_ptr, start, length, i_h, i_hq, neg_a, dtb, DT,
    HV: tl.constexpr, H: tl.constexpr, K: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr,
    PRECISION: tl.constexpr, RAW_GATES: tl.constexpr,
):  # fmt: skip
    """G stored, and A's ten lower SUB x SUB blocks from ONE [C, K] x [K, C] tensor-core
    product (one warpgroup MMA at 4 warps: each warp holds 16 rows of k and of A), the
    decays and beta elementwise in float32, the exponent masked first (above the diagonal
    G_i - G_j > 0 could overflow, and inf * 0 is nan), then split into blocks."""
    lg, beta = _block_gates(a_ptr, b_ptr, start, 0, length, i_h, neg_a, dtb, HV, C, RAW_GATES)
    G = tl.cumsum(lg, 0)
    offs_c = tl.arange(0, C)
    tl.store(g_ptr + (start + offs_c) * HV + i_h, G, mask=offs_c < length)
    kc = _block_rows(k_ptr, start, 0, length, i_hq, H, K, C).to(DT)
    strict = offs_c[:, None] > offs_c[None, :]
    ratio = tl.exp(tl.where(strict, G[:, None] - G[None, :], 0.0))
    A = tl.where(strict, _mm(kc, tl.trans(kc), PRECISION) * (beta[:, None] * ratio), 0.0)
    # Its 16 x 16 blocks: [C, C] -> [i, j, a, b] (row block a, column block b) -> split the
    # block indices bit by bit (Triton cannot slice a register tile; this is one layout
    # change through shared memory, then register moves).
    A4 = tl.permute(tl.reshape(A, (4, SUB, 4, SUB)), (1, 3, 0, 2))  # [i, j, a, b]
    A6 = tl.reshape(A4, (SUB, SUB, 2, 2, 2, 2))  # [i, j, a_hi, a_lo, b_hi, b_lo]
    Ab0, Ab1 = tl.split(A6)  # b_lo
    A_b0_0, A_b0_1 = tl.split(Ab0)  # b_hi: b = 0, 2
    A_b1_0, A_b1_1 = tl.split(Ab1)  # b = 1, 3
    A00, A10, A20, A30 = _split_rows(A_b0_0)  # column block 0
    _, A11, A21, A31 = _split_rows(A_b1_0)
    _, _, A22, A32 = _split_rows(A_b0_1)
    _, _, _, A33 = _split_rows(A_b1_1)
    return A00, A10, A11, A20, A21, A22, A30, A31, A32, A33


@triton.jit
def _block_decay(
    a_ptr, b_ptr, g_ptr, start, r0, length, i_h, neg_a, dtb, carry,
    HV: tl.constexpr, SUB: tl.constexpr, RAW_GATES: tl.constexpr,
):  # fmt: skip
    """Rows r0 .. r0 + SUB of a chunk: their cumulative log decay G (from `carry`, the log
    decay of the rows before them), stored, their beta, and the carry past them."""
    lg, beta = _block_gates(a_ptr, b_ptr, start, r0, length, i_h, neg_a, dtb, HV, SUB, RAW_GATES)
    G = tl.cumsum(lg, 0) + carry
    offs = r0 + tl.arange(0, SUB)
    tl.store(g_ptr + (start + offs) * HV + i_h, G, mask=offs < length)
    return G, beta, carry + tl.sum(lg, 0)


@triton.jit
def _blockwise_a(
    k_ptr, a_ptr, b_ptr, g_ptr, start, length, i_h, i_hq, neg_a, dtb, DT,
    HV: tl.constexpr, H: tl.constexpr, K: tl.constexpr, SUB: tl.constexpr, BK: tl.constexpr,
    PRECISION: tl.constexpr, RAW_GATES: tl.constexpr,
):  # fmt: skip
    """`_one_product_a`'s G and blocks, each block its own SUB x SUB products
    (`_kkt_blocks`), the gates per row block (G carried across them)."""
    G0, be0, c0 = _block_decay(
        a_ptr, b_ptr, g_ptr, start, 0, length, i_h, neg_a, dtb, 0.0, HV, SUB, RAW_GATES
    )
    G1, be1, c1 = _block_decay(
        a_ptr, b_ptr, g_ptr, start, SUB, length, i_h, neg_a, dtb, c0, HV, SUB, RAW_GATES
    )
    G2, be2, c2 = _block_decay(
        a_ptr, b_ptr, g_ptr, start, 2 * SUB, length, i_h, neg_a, dtb, c1, HV, SUB, RAW_GATES
    )
    G3, be3, _ = _block_decay(
        a_ptr, b_ptr, g_ptr, start, 3 * SUB, length, i_h, neg_a, dtb, c2, HV, SUB, RAW_GATES
    )
    a00, a10, a11, a20, a21, a22, a30, a31, a32, a33 = _kkt_blocks(
        k_ptr, start, length, i_hq, DT, H, K, SUB, BK, PRECISION
    )
    return (
        _scale_block(a00, be0, G0, G0, True),
        _scale_block(a10, be1, G1, G0, False),
        _scale_block(a11, be1, G1, G1, True),
        _scale_block(a20, be2, G2, G0, False),
        _scale_block(a21, be2, G2, G1, False),
        _scale_block(a22, be2, G2, G2, True),
        _scale_block(a30, be3, G3, G0, False),
        _scale_block(a31, be3, G3, G1, False),
        _scale_block(a32, be3, G3, G2, False),
        _scale_block(a33, be3, G3, G3, True),
    )


@triton.jit
def _chunk_solve_kernel(
    k_ptr,  # [T, H, K]  contiguous
    a_ptr,  # [T, HV] (RAW_GATES: a; else log g, float32)
    b_ptr,  # [T, HV] (RAW_GATES: b; else beta, float32)
    a_log_ptr,  # [HV] float32
    dt_bias_ptr,  # [HV]
    chunk_start_ptr,  # [NC] int32: first token of each chunk
    chunk_len_ptr,  # [NC] int32: its tokens (<= C; 0: an unused slot)
    t_ptr,  # [T, HV, C] out: T = (I + A)^-1 by rows, its block lower part (its dtype: DT)
    g_ptr,  # [T, HV] float32 out: cumulative log decay within the chunk
    HV: tl.constexpr,
    GROUP: tl.constexpr,
    K: tl.constexpr,
    C: tl.constexpr,
    SUB: tl.constexpr,
    PRECISION: tl.constexpr,
    RAW_GATES: tl.constexpr,
    BLOCKWISE: tl.constexpr = False,  # A's blocks by `_blockwise_a` (else `_one_product_a`)
    BK: tl.constexpr = 64,  # BLOCKWISE's columns of k a step
    INV_PRECISION: tl.constexpr = "ieee",  # the diagonal blocks' inverses (PRECISION: merges)
):
    # Four row blocks of SUB tokens, written out: Triton cannot slice a register tile, and
    # T's blocks are what the inversion and the merges work on. Only T leaves (rounded to
    # DT, as fla's solve_tril output is); `_chunk_wu_kernel` forms W and U0 from it with
    # one product each. Keeping the W / U0 products out of this kernel took k's blocks, v
    # and twenty block products out of its registers (it spilled at 255 registers).
    tl.static_assert(C == 4 * SUB)
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    i_hq = i_h // GROUP
    H = HV // GROUP
    DT = t_ptr.dtype.element_ty
    start = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    length = tl.load(chunk_len_ptr + i_c)
    if length == 0:  # an unused slot
        return
    neg_a = -tl.exp(tl.load(a_log_ptr + i_h).to(tl.float32))
    dtb = tl.load(dt_bias_ptr + i_h).to(tl.float32)
    if BLOCKWISE:
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _blockwise_a(
            k_ptr, a_ptr, b_ptr, g_ptr, start, length, i_h, i_hq, neg_a, dtb, DT,
            HV, H, K, SUB, BK, PRECISION, RAW_GATES,
        )  # fmt: skip
    else:
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _one_product_a(
            k_ptr, a_ptr, b_ptr, g_ptr, start, length, i_h, i_hq, neg_a, dtb, DT,
            HV, H, K, C, SUB, PRECISION, RAW_GATES,
        )  # fmt: skip
    offs = tl.arange(0, SUB)
    # The diagonal blocks' inverses in float32 at INV_PRECISION (four independent chains).
    tl.static_assert(SUB == 16)
    eye = tl.where(offs[:, None] == offs[None, :], 1.0, 0.0)
    T00 = _inv_unit_lower(A00, eye, INV_PRECISION)
    T11 = _inv_unit_lower(A11, eye, INV_PRECISION)
    T22 = _inv_unit_lower(A22, eye, INV_PRECISION)
    T33 = _inv_unit_lower(A33, eye, INV_PRECISION)
    _store_t_block(t_ptr, T00, start, 0, 0, length, i_h, HV, C, SUB)
    _store_t_block(t_ptr, T11, start, SUB, SUB, length, i_h, HV, C, SUB)
    _store_t_block(t_ptr, T22, start, 2 * SUB, 2 * SUB, length, i_h, HV, C, SUB)
    _store_t_block(t_ptr, T33, start, 3 * SUB, 3 * SUB, length, i_h, HV, C, SUB)
    # The blocks below: T_ab = -T_aa sum_{b <= c < a} A_ac T_cb (from (I + A) T = I), small
    # float32 products at PRECISION (T's accuracy feeds every W and U0 row).
    T10 = -_mm(T11, _mm(A10, T00, PRECISION), PRECISION)
    T21 = -_mm(T22, _mm(A21, T11, PRECISION), PRECISION)
    T32 = -_mm(T33, _mm(A32, T22, PRECISION), PRECISION)
    _store_t_block(t_ptr, T10, start, SUB, 0, length, i_h, HV, C, SUB)
    _store_t_block(t_ptr, T21, start, 2 * SUB, SUB, length, i_h, HV, C, SUB)
    _store_t_block(t_ptr, T32, start, 3 * SUB, 2 * SUB, length, i_h, HV, C, SUB)
    T20 = -_mm(T22, _mm(A20, T00, PRECISION) + _mm(A21, T10, PRECISION), PRECISION)
    T31 = -_mm(T33, _mm(A31, T11, PRECISION) + _mm(A32, T21, PRECISION), PRECISION)
    _store_t_block(t_ptr, T20, start, 2 * SUB, 0, length, i_h, HV, C, SUB)
    _store_t_block(t_ptr, T31, start, 3 * SUB, SUB, length, i_h, HV, C, SUB)
    T30 = -_mm(
        T33,
        _mm(A30, T00, PRECISION) + _mm(A31, T10, PRECISION) + _mm(A32, T20, PRECISION),
        PRECISION,
    )
    _store_t_block(t_ptr, T30, start, 3 * SUB, 0, length, i_h, HV, C, SUB)


@triton.jit
def _chunk_wu_kernel(
    k_ptr,  # [T, H, K]  contiguous
    v_ptr,  # [T, HV, V] contiguous
    b_ptr,  # [T, HV] (RAW_GATES: b; else beta, float32)
    t_ptr,  # [T, HV, C] DT: T's block lower rows (`_chunk_solve_kernel`'s)
    g_ptr,  # [T, HV] float32: cumulative log decay within the chunk
    chunk_start_ptr,  # [NC] int32
    chunk_len_ptr,  # [NC] int32
    w_ptr,  # [T, HV, K] out: W = T diag(beta gamma) K (DT)
    u_ptr,  # [T, HV, V] out: U0 = T diag(beta) V (DT)
    HV: tl.constexpr,
    GROUP: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    C: tl.constexpr,
    SUB: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
    RAW_GATES: tl.constexpr,
):
    # One [C, C] x [C, BK] (and [C, BV]) tensor-core product per tile: T is the A operand of
    # every one, loaded once; the scaled rows are formed in float32 and rounded to DT (fla's
    # rounding), the products accumulate in float32.
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    i_hq = i_h // GROUP
    H = HV // GROUP
    DT = w_ptr.dtype.element_ty
    start = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    length = tl.load(chunk_len_ptr + i_c)
    if length == 0:  # an unused slot
        return
    offs_c = tl.arange(0, C)
    m = offs_c < length
    rows = start + offs_c
    beta = tl.load(b_ptr + rows * HV + i_h, mask=m, other=0.0).to(tl.float32)
    if RAW_GATES:
        beta = tl.sigmoid(beta)
    beta = tl.where(m, beta, 0.0)
    G = tl.load(g_ptr + rows * HV + i_h, mask=m, other=0.0)
    # Only T's block lower part was written (the blocks above the diagonal are zeros).
    lower = (offs_c[None, :] // SUB) <= (offs_c[:, None] // SUB)
    t_rows = t_ptr + (rows[:, None] * HV + i_h) * C + offs_c[None, :]
    t = tl.load(t_rows, mask=m[:, None] & lower, other=0.0)
    kscale = beta * tl.exp(G)  # G <= 0: gamma <= 1
    for i in tl.static_range(K // BK):
        offs_k = i * BK + tl.arange(0, BK)
        kr = tl.load(k_ptr + (rows[:, None] * H + i_hq) * K + offs_k[None, :], mask=m[:, None],
                     other=0.0)  # fmt: skip
        x = (kr.to(tl.float32) * kscale[:, None]).to(DT)
        w = _mm(t, x, PRECISION)
        tl.store(w_ptr + (rows[:, None] * HV + i_h) * K + offs_k[None, :], w.to(DT),
                 mask=m[:, None])  # fmt: skip
    for i in tl.static_range(V // BV):
        offs_v = i * BV + tl.arange(0, BV)
        uv = (rows[:, None] * HV + i_h) * V + offs_v[None, :]
        vr = tl.load(v_ptr + uv, mask=m[:, None], other=0.0)
        y = (vr.to(tl.float32) * beta[:, None]).to(DT)
        tl.store(u_ptr + uv, _mm(t, y, PRECISION).to(DT), mask=m[:, None])


@triton.jit
def _chunk_state_kernel(
    k_ptr,  # [T, H, K]  contiguous
    w_ptr,  # [T, HV, K] W (DT: its dtype)
    u_ptr,  # [T, HV, V] U0 (DT)
    g_ptr,  # [T, HV]    float32
    cu_ptr,  # [N + 1] int: cu_seqlens
    first_chunk_ptr,  # [N] int: each sequence's first chunk slot (chunk_table's order)
    state_ptr,  # [N, HV, V, K] float32 initial state (HAS_STATE; strides below)
    new_state_ptr,  # [N, HV, V, K] float32 out (strides below)
    h_ptr,  # [NC, HV, K, V] DT out: the state entering each chunk, k-major
    vn_ptr,  # [T, HV, V] DT out: U = U0 - W S^T, the corrected values
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
    KH: tl.constexpr,
    HAS_STATE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # The state is held transposed, [K, BV] (k-major), in two K halves of KH (one, KH = K,
    # where a half would be under the 16 a product needs): W S^T then takes it as the B
    # operand and the update K^T U adds to it, neither transposing the float32 tile; halves
    # keep each product's tiles (and live registers) smaller.
    SPLIT: tl.constexpr = KH < K
    i_n = tl.program_id(0)
    i_h = tl.program_id(1)
    i_v = tl.program_id(2)
    i_hq = i_h // GROUP
    H = HV // GROUP
    DT = w_ptr.dtype.element_ty
    offs_c = tl.arange(0, C)
    offs_k = tl.arange(0, KH)
    offs_v = i_v * BV + tl.arange(0, BV)
    bos = tl.load(cu_ptr + i_n).to(tl.int64)
    eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
    first = tl.load(first_chunk_ptr + i_n).to(tl.int64)
    s1 = tl.zeros([KH, BV], dtype=tl.float32)
    s2 = tl.zeros([KH, BV], dtype=tl.float32)
    if HAS_STATE:
        base = state_ptr + i_n.to(tl.int64) * s_n + i_h * s_h + offs_v[None, :] * s_v
        s1 = tl.load(base + offs_k[:, None] * s_k)
        if SPLIT:
            s2 = tl.load(base + (KH + offs_k)[:, None] * s_k)
    h_tile = offs_k[:, None] * V + offs_v[None, :]
    for start in range(bos, eos, C):
        length = tl.minimum(eos - start, C)
        m = offs_c < length
        rows = offs_c + start
        hb = h_ptr + ((first + (start - bos) // C) * HV + i_h) * (K * V)
        tl.store(hb + h_tile, s1.to(DT))
        w_rows = w_ptr + (rows[:, None] * HV + i_h) * K + offs_k[None, :]
        w1 = tl.load(w_rows, mask=m[:, None], other=0.0)
        uv = (rows[:, None] * HV + i_h) * V + offs_v[None, :]
        u = tl.load(u_ptr + uv, mask=m[:, None], other=0.0).to(tl.float32)
        u = u - _mm(w1, s1.to(DT), PRECISION)
        if SPLIT:
            tl.store(hb + KH * V + h_tile, s2.to(DT))
            w2 = tl.load(w_rows + KH, mask=m[:, None], other=0.0)
            u = u - _mm(w2, s2.to(DT), PRECISION)
        tl.store(vn_ptr + uv, u.to(DT), mask=m[:, None])
        G = tl.load(g_ptr + rows * HV + i_h, mask=m, other=0.0)
        g_last = tl.load(g_ptr + (start + length - 1) * HV + i_h)
        ud = (u * tl.where(m, tl.exp(g_last - G), 0.0)[:, None]).to(DT)
        k_rows = k_ptr + (rows[:, None] * H + i_hq) * K + offs_k[None, :]
        k1 = tl.load(k_rows, mask=m[:, None], other=0.0).to(DT)
        decay = tl.exp(g_last)
        s1 = s1 * decay + _mm(tl.trans(k1), ud, PRECISION)
        if SPLIT:
            k2 = tl.load(k_rows + KH, mask=m[:, None], other=0.0).to(DT)
            s2 = s2 * decay + _mm(tl.trans(k2), ud, PRECISION)
    s1 = tl.where(eos > bos, s1, 0.0)  # the contract's: an empty sequence's state is zeros
    s2 = tl.where(eos > bos, s2, 0.0)
    nb = new_state_ptr + i_n.to(tl.int64) * n_n + i_h * n_h + offs_v[None, :] * n_v
    tl.store(nb + offs_k[:, None] * n_k, s1)
    if SPLIT:
        tl.store(nb + (KH + offs_k)[:, None] * n_k, s2)


@triton.jit
def _chunk_output_kernel(
    q_ptr,  # [T, H, K]  contiguous
    k_ptr,  # [T, H, K]  contiguous
    g_ptr,  # [T, HV]    float32
    h_ptr,  # [NC, HV, K, V] DT: the state entering each chunk
    vn_ptr,  # [T, HV, V] DT: the corrected values U
    chunk_start_ptr,  # [NC] int32
    chunk_len_ptr,  # [NC] int32
    out_ptr,  # [T, HV, V] contiguous
    scale,
    HV: tl.constexpr,
    GROUP: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    i_v = tl.program_id(2)
    i_hq = i_h // GROUP
    H = HV // GROUP
    DT = vn_ptr.dtype.element_ty
    start = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    length = tl.load(chunk_len_ptr + i_c)
    if length == 0:  # an unused slot
        return
    offs_c = tl.arange(0, C)
    offs_k = tl.arange(0, K)
    offs_v = i_v * BV + tl.arange(0, BV)
    m = offs_c < length
    rows = start + offs_c
    qk_rows = (rows[:, None] * H + i_hq) * K + offs_k[None, :]
    q = tl.load(q_ptr + qk_rows, mask=m[:, None], other=0.0).to(DT)
    k = tl.load(k_ptr + qk_rows, mask=m[:, None], other=0.0).to(DT)
    G = tl.load(g_ptr + rows * HV + i_h, mask=m, other=0.0)
    causal = offs_c[:, None] >= offs_c[None, :]
    ratio = tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0))
    p = tl.where(causal, _mm(q, tl.trans(k), PRECISION) * ratio, 0.0).to(DT)
    hb = h_ptr + (i_c.to(tl.int64) * HV + i_h) * (K * V)
    s = tl.load(hb + offs_k[:, None] * V + offs_v[None, :])  # [K, BV]
    uv = (rows[:, None] * HV + i_h) * V + offs_v[None, :]
    u = tl.load(vn_ptr + uv, mask=m[:, None], other=0.0)
    o = _mm(q, s, PRECISION) * tl.exp(G)[:, None] + _mm(p, u, PRECISION)
    tl.store(out_ptr + uv, (o * scale).to(out_ptr.dtype.element_ty), mask=m[:, None])

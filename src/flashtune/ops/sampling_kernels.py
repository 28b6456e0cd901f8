"""Triton kernels of the sampling family (sampling.py holds the references, schemas and API).

Sorting-free. A program owns ROWS rows; every round is one pass over them:

- A *pass* compares each value with PIVOTS thresholds t[m] at once and gathers, per pivot,
  the sum of the values > t[m] chunk by chunk (BLOCK values a chunk, in row order), their
  count and the smallest of them (`_scan`).
- A *draw* inverts the CDF of the values > low in row order: the chunk from the chunk sums,
  then the token from one re-read of that chunk (`_pick`). Row order, not a layout of the
  kernel's, so the token drawn for a uniform does not depend on the tactic but for the
  rounding of partial sums.
- Truncated sampling (top-k, top-p, min-p, joint) is rejection sampling over a shrinking
  support (FlashInfer's pivot method): draw a candidate c from {p > low}; c belongs to the
  truncated support S iff the values above p_c pass the filter (top-k: fewer than k of
  them; top-p: their mass at most top_p of the row's). A pass checks c together with
  PIVOTS - 1 thresholds between p_c and the smallest value known to be in S (`high`),
  spaced evenly in the values' bit patterns (geometric in value). If c is rejected, low
  rises to the largest rejected pivot and the next candidate is drawn from that pivot's
  chunk sums, already at hand; a candidate >= high is in S without a pass. S is an upper
  set of the row and stays inside {p > low}, so an accepted draw is distributed as p
  restricted to S. Each round narrows [low, high] at least PIVOTS-fold in bit space: at
  most ~32 / log2(PIVOTS) + 1 rounds, typically one or two.
- Exact thresholds (renorm, mask, the top-k stage of top-k-then-top-p) use the same passes
  with the candidate "the smallest value > low" instead of a random one: when it passes,
  S = {p > low} exactly (`_exact_low`).

Randomness: one int64 seed per call, read from a device tensor (drawn from the caller's
torch generator: no host synchronization, and a CUDA graph replays fresh draws); round r of
output row b uses philox(seed, b * MAX_ROUNDS + r), whatever the tactic.

Shapes in comments: R = ROWS, P = PIVOTS, C = NCHUNK (a power of two >= V / BLOCK).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "MAX_ROUNDS",
    "MODE_PLAIN",
    "MODE_TOP_P",
    "MODE_TOP_K",
    "MODE_MIN_P",
    "MODE_JOINT",
    "MODE_TOP_K_FIRST",
    "RENORM_TOP_P",
    "RENORM_TOP_K",
    "MASK_TOP_K",
    "sampling_kernel",
    "logits_sampling_kernel",
    "renorm_kernel",
    "softmax_kernel",
    "chain_speculative_kernel",
]

# Random streams per output row; also the cap on rejection rounds (never reached: see above).
MAX_ROUNDS = 64
_ROUNDS = tl.constexpr(MAX_ROUNDS)

MODE_PLAIN, MODE_TOP_P, MODE_TOP_K, MODE_MIN_P, MODE_JOINT, MODE_TOP_K_FIRST = range(6)
RENORM_TOP_P, RENORM_TOP_K, MASK_TOP_K = range(3)
_INF = tl.constexpr(float("inf"))


# ----------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------


@triton.jit
def _pivots(lo, hi, P: tl.constexpr):
    """[R, P] thresholds per row: lo, then P - 1 more spaced evenly between lo and hi [R] in
    the floats' order-preserving bit patterns (negatives flipped), so geometric in value."""
    k_lo = lo.to(tl.int32, bitcast=True)
    k_lo = tl.where(k_lo < 0, k_lo ^ 0x7FFFFFFF, k_lo).to(tl.int64)
    k_hi = hi.to(tl.int32, bitcast=True)
    k_hi = tl.where(k_hi < 0, k_hi ^ 0x7FFFFFFF, k_hi).to(tl.int64)
    step = tl.arange(0, P).to(tl.int64)
    keys = (k_lo[:, None] + (k_hi - k_lo)[:, None] * step[None, :] // P).to(tl.int32)
    return tl.where(keys < 0, keys ^ 0x7FFFFFFF, keys).to(tl.float32, bitcast=True)


@triton.jit
def _scan(
    base,  # [R] pointers to the rows
    V,
    t,  # [R, P] thresholds
    active,  # [R] rows to read (the others read nothing and report nothing)
    P: tl.constexpr,
    BLOCK: tl.constexpr,
    NCHUNK: tl.constexpr,
    COUNTS: tl.constexpr,
    MINS: tl.constexpr,
):
    """One pass: per row and pivot, the chunk sums [R, P, C] of the values > t, their count
    [R, P] (COUNTS), the smallest of them [R, P] (MINS); and each row's largest value [R]."""
    cols = tl.arange(0, BLOCK)
    chunk_ids = tl.arange(0, NCHUNK)
    R: tl.constexpr = t.shape[0]
    sums = tl.zeros([R, P, NCHUNK], dtype=tl.float32)
    counts = tl.zeros([R, P, BLOCK], dtype=tl.int32)
    mins = tl.full([R, P, BLOCK], _INF, dtype=tl.float32)
    maxs = tl.full([R, BLOCK], -_INF, dtype=tl.float32)
    for c in range(0, tl.cdiv(V, BLOCK)):
        offs = c * BLOCK + cols
        mask = active[:, None] & (offs < V)[None, :]
        x = tl.load(base[:, None] + offs[None, :], mask=mask, other=-_INF).to(tl.float32)
        above = x[:, None, :] > t[:, :, None]
        chunk = tl.sum(tl.where(above, x[:, None, :], 0.0), axis=2)
        sums = tl.where(chunk_ids[None, None, :] == c, chunk[:, :, None], sums)
        if COUNTS:
            counts += above.to(tl.int32)
        if MINS:
            mins = tl.minimum(mins, tl.where(above, x[:, None, :], _INF))
        maxs = tl.maximum(maxs, x)
    return sums, tl.sum(counts, axis=2), tl.min(mins, axis=2), tl.max(maxs, axis=1)


@triton.jit
def _pick(base, V, sums, low, u, active, BLOCK: tl.constexpr, NCHUNK: tl.constexpr):
    """Invert each row's CDF of its values > low [R] at u [R]: (token [R], its value [R]).
    `sums` [R, C]: the chunk sums of those values. Rounding that leaves the target past a
    chunk's last eligible value takes that value (never an ineligible one)."""
    chunk_ids = tl.arange(0, NCHUNK)
    target = u * tl.sum(sums, axis=1)
    cum = tl.cumsum(sums, axis=1)
    first = tl.min(tl.where(cum > target[:, None], chunk_ids[None, :], NCHUNK), axis=1)
    last = tl.max(tl.where(sums > 0.0, chunk_ids[None, :], 0), axis=1)
    c = tl.minimum(first, last)
    target -= tl.sum(tl.where(chunk_ids[None, :] < c[:, None], sums, 0.0), axis=1)
    cols = tl.arange(0, BLOCK)
    offs = c[:, None] * BLOCK + cols[None, :]
    x = tl.load(base[:, None] + offs, mask=active[:, None] & (offs < V), other=0.0)
    x = x.to(tl.float32)
    w = tl.where(x > low[:, None], x, 0.0)
    wcum = tl.cumsum(w, axis=1)
    j = tl.min(tl.where(wcum > target[:, None], cols[None, :], BLOCK), axis=1)
    j = tl.minimum(j, tl.max(tl.where(w > 0.0, cols[None, :], 0), axis=1))
    value = tl.sum(tl.where(cols[None, :] == j[:, None], x, 0.0), axis=1)
    return c * BLOCK + j, value


@triton.jit
def _take(mat, m, P: tl.constexpr):
    """mat[r, m[r]] for mat [R, P] and m [R]."""
    ids = tl.arange(0, P)
    return tl.sum(tl.where(ids[None, :] == m[:, None], mat, 0), axis=1)


@triton.jit
def _take_row(mat, m, P: tl.constexpr):
    """mat[r, m[r], :] for mat [R, P, C] and m [R]."""
    ids = tl.arange(0, P)
    return tl.sum(tl.where(ids[None, :, None] == m[:, None, None], mat, 0.0), axis=1)


@triton.jit
def _rejected_pivot(ok, t, high, P: tl.constexpr):
    """From one pass's verdicts ok [R, P] on thresholds t [R, P]: the largest rejected
    pivot's index [R], and high [R] lowered to the smallest passing pivot above it."""
    ids = tl.arange(0, P)
    m = tl.max(tl.where(ok, 0, ids[None, :]), axis=1)
    above = ok & (ids[None, :] > m[:, None])
    return m, tl.minimum(high, tl.min(tl.where(above, t, _INF), axis=1))


@triton.jit
def _exact_low(
    base,
    V,
    low,
    low_sums,
    v,
    high,
    k,
    limit,
    active,
    P: tl.constexpr,
    BLOCK: tl.constexpr,
    NCHUNK: tl.constexpr,
):
    """Per row, the exact support {x > low} of the filter (fewer than k values above, their
    mass <= limit), from a `low` [R] known to fail it: returns (low [R], its chunk sums
    [R, C]). `v` [R]: the smallest value > low; `high` [R]: a value known to pass."""
    searching = active & (v < high)
    while tl.max(searching.to(tl.int32), axis=0) > 0:
        t = _pivots(v, tl.minimum(high, 3.0e38), P)
        sums, counts, mins, _ = _scan(base, V, t, searching, P, BLOCK, NCHUNK, True, True)
        ok = (counts < k[:, None]) & (tl.sum(sums, axis=2) <= limit[:, None])
        # When the smallest value > low passes, S = {x > low}: that row is done.
        rejected = searching & (_take(ok.to(tl.int32), tl.zeros_like(k), P) == 0)
        m, new_high = _rejected_pivot(ok, t, high, P)
        low = tl.where(rejected, _take(t, m, P), low)
        low_sums = tl.where(rejected[:, None], _take_row(sums, m, P), low_sums)
        v = tl.where(rejected, _take(mins, m, P), v)
        high = tl.where(rejected, new_high, high)
        searching = rejected & (v < high)
    return low, low_sums


@triton.jit
def _row_bases(X, Indices, first, n_rows, stride, HAS_INDICES: tl.constexpr, R: tl.constexpr):
    """The R output rows of this program: (their indices [R], valid [R], input bases [R])."""
    rows = first + tl.arange(0, R)
    valid = rows < n_rows
    if HAS_INDICES:
        src = tl.load(Indices + rows, mask=valid, other=0).to(tl.int64)
    else:
        src = rows.to(tl.int64)
    return rows, valid, X + src * stride


# ----------------------------------------------------------------------------------------------
# Sampling from probabilities
# ----------------------------------------------------------------------------------------------


@triton.jit
def sampling_kernel(
    Probs,  # [rows, V] probabilities (any float dtype), row stride `stride`
    Out,  # [B] int32 samples
    Indices,  # [B] row of Probs for each output (HAS_INDICES)
    Seed,  # [1] int64
    TopK,  # [B] int (K_ARRAY) else top_k_value
    top_k_value,
    TopP,  # [B] float (P_ARRAY) else top_p_value: top_p, or min_p for MODE_MIN_P
    top_p_value,
    B,
    V,
    stride,
    MODE: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    K_ARRAY: tl.constexpr,
    P_ARRAY: tl.constexpr,
    PIVOTS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    NCHUNK: tl.constexpr,
):
    rows, valid, base = _row_bases(
        Probs, Indices, tl.program_id(0) * ROWS, B, stride, HAS_INDICES, ROWS
    )
    seed = tl.load(Seed)
    stream = rows.to(tl.int64) * _ROUNDS
    USE_K: tl.constexpr = (MODE == 2) | (MODE == 4) | (MODE == 5)
    USE_P: tl.constexpr = (MODE == 1) | (MODE == 3) | (MODE == 4) | (MODE == 5)

    k = tl.zeros([ROWS], dtype=tl.int32) + V + 1  # V + 1: no top-k test
    if USE_K:
        if K_ARRAY:
            k = tl.load(TopK + rows, mask=valid, other=0).to(tl.int32)
        else:
            k = tl.zeros([ROWS], dtype=tl.int32) + top_k_value
        k = tl.where((k <= 0) | (k >= V), V + 1, k)  # no filtering, as the references
    param = tl.full([ROWS], 1.0, dtype=tl.float32)
    if USE_P:
        if P_ARRAY:
            param = tl.load(TopP + rows, mask=valid, other=1.0).to(tl.float32)
        else:
            param = tl.zeros([ROWS], dtype=tl.float32) + top_p_value

    zero = tl.zeros([ROWS, 1], dtype=tl.float32)
    sums0, counts0, mins0, pmax = _scan(
        base, V, zero, valid, 1, BLOCK, NCHUNK, MODE == 5, MODE == 5
    )
    low = tl.sum(zero, axis=1)
    low_sums = tl.sum(sums0, axis=1)
    high = pmax  # the largest value always passes
    limit = tl.full([ROWS], _INF, dtype=tl.float32)
    if (MODE == 1) | (MODE == 4):
        limit = tl.where(param >= 1.0, _INF, tl.maximum(param, 0.0) * tl.sum(low_sums, axis=1))
    if MODE == 3:
        # min-p: S = {x >= min_p * max}. A candidate >= that passes; else one pass at the
        # float just below it, whose next candidate is in S.
        high = tl.where(param > 0.0, param * pmax, 0.0)
    if MODE == 5:
        # Top-k first: the exact top-k support, then top-p within it (renormalized).
        search = valid & (tl.sum(counts0, axis=1) >= k)
        low, low_sums = _exact_low(
            base,
            V,
            low,
            low_sums,
            tl.sum(mins0, axis=1),
            high,
            k,
            limit,
            search,
            PIVOTS,
            BLOCK,
            NCHUNK,
        )
        k = tl.zeros([ROWS], dtype=tl.int32) + V + 1
        limit = tl.where(param >= 1.0, _INF, tl.maximum(param, 0.0) * tl.sum(low_sums, axis=1))

    rnd = 0
    token, value = _pick(base, V, low_sums, low, tl.rand(seed, stream), valid, BLOCK, NCHUNK)
    todo = valid & (value < high) & (MODE != 0)
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        if MODE == 3:
            below = high.to(tl.int32, bitcast=True) - 1  # high > 0: bits order like values
            t = (
                tl.zeros([ROWS, PIVOTS], dtype=tl.float32)
                + below.to(tl.float32, bitcast=True)[:, None]
            )
            ok = t >= high[:, None]
            sums, _, _, _ = _scan(base, V, t, todo, PIVOTS, BLOCK, NCHUNK, False, False)
        else:
            t = _pivots(value, high, PIVOTS)
            sums, counts, _, _ = _scan(base, V, t, todo, PIVOTS, BLOCK, NCHUNK, USE_K, False)
            ok = (counts < k[:, None]) & (tl.sum(sums, axis=2) <= limit[:, None])
        # The candidate is t[:, 0]: where it passes, it is in S and the row is done.
        rejected = todo & (_take(ok.to(tl.int32), tl.zeros_like(k), PIVOTS) == 0)
        m, new_high = _rejected_pivot(ok, t, high, PIVOTS)
        low = tl.where(rejected, _take(t, m, PIVOTS), low)
        low_sums = tl.where(rejected[:, None], _take_row(sums, m, PIVOTS), low_sums)
        high = tl.where(rejected, new_high, high)
        rnd += 1
        u = tl.rand(seed, stream + rnd)
        next_token, next_value = _pick(base, V, low_sums, low, u, rejected, BLOCK, NCHUNK)
        token = tl.where(rejected, next_token, token)
        value = tl.where(rejected, next_value, value)
        todo = rejected & (value < high) & (rnd < _ROUNDS - 1)
    tl.store(Out + rows, token.to(tl.int32), mask=valid)


@triton.jit
def logits_sampling_kernel(
    Logits,  # [rows, V] logits (any float dtype), row stride `stride`
    Out,  # [B] int32 samples
    Indices,  # [B] (HAS_INDICES)
    Seed,  # [1] int64
    B,
    V,
    stride,
    HAS_INDICES: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    NCHUNK: tl.constexpr,
):
    """One draw from softmax(logits) in one pass: chunk sums of exp(x - running max), rescaled
    when the max grows, then the chosen chunk's re-read (no probabilities are written)."""
    rows, valid, base = _row_bases(
        Logits, Indices, tl.program_id(0) * ROWS, B, stride, HAS_INDICES, ROWS
    )
    cols = tl.arange(0, BLOCK)
    chunk_ids = tl.arange(0, NCHUNK)
    sums = tl.zeros([ROWS, NCHUNK], dtype=tl.float32)
    m = tl.full([ROWS], -_INF, dtype=tl.float32)
    for c in range(0, tl.cdiv(V, BLOCK)):
        offs = c * BLOCK + cols
        mask = valid[:, None] & (offs < V)[None, :]
        x = tl.load(base[:, None] + offs[None, :], mask=mask, other=-_INF).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        scale = tl.where(m_new == -_INF, 1.0, tl.exp(m - m_new))
        e = tl.where(x == -_INF, 0.0, tl.exp(x - m_new[:, None]))
        chunk = tl.sum(e, axis=1)
        sums = tl.where(chunk_ids[None, :] == c, chunk[:, None], sums * scale[:, None])
        m = m_new
    u = tl.rand(tl.load(Seed), rows.to(tl.int64) * _ROUNDS)
    target = u * tl.sum(sums, axis=1)
    cum = tl.cumsum(sums, axis=1)
    first = tl.min(tl.where(cum > target[:, None], chunk_ids[None, :], NCHUNK), axis=1)
    c = tl.minimum(first, tl.max(tl.where(sums > 0.0, chunk_ids[None, :], 0), axis=1))
    target -= tl.sum(tl.where(chunk_ids[None, :] < c[:, None], sums, 0.0), axis=1)
    offs = c[:, None] * BLOCK + cols[None, :]
    x = tl.load(base[:, None] + offs, mask=valid[:, None] & (offs < V), other=-_INF)
    w = tl.where(x == -_INF, 0.0, tl.exp(x.to(tl.float32) - m[:, None]))
    wcum = tl.cumsum(w, axis=1)
    j = tl.min(tl.where(wcum > target[:, None], cols[None, :], BLOCK), axis=1)
    j = tl.minimum(j, tl.max(tl.where(w > 0.0, cols[None, :], 0), axis=1))
    tl.store(Out + rows, (c * BLOCK + j).to(tl.int32), mask=valid)


# ----------------------------------------------------------------------------------------------
# Renormalization and masking (exact thresholds)
# ----------------------------------------------------------------------------------------------


@triton.jit
def renorm_kernel(
    X,  # [B, V] probabilities (RENORM_*) or logits (MASK_TOP_K), row stride stride_x
    Out,  # [B, V] row stride stride_o
    TopK,  # [B] int (K_ARRAY) else top_k_value
    top_k_value,
    TopP,  # [B] float (P_ARRAY) else top_p_value
    top_p_value,
    B,
    V,
    stride_x,
    stride_o,
    MODE: tl.constexpr,
    K_ARRAY: tl.constexpr,
    P_ARRAY: tl.constexpr,
    PIVOTS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    NCHUNK: tl.constexpr,
):
    rows, valid, base = _row_bases(X, X, tl.program_id(0) * ROWS, B, stride_x, False, ROWS)
    k = tl.zeros([ROWS], dtype=tl.int32) + V + 1
    if MODE != 0:
        if K_ARRAY:
            k = tl.load(TopK + rows, mask=valid, other=0).to(tl.int32)
        else:
            k = tl.zeros([ROWS], dtype=tl.int32) + top_k_value
        k = tl.where((k <= 0) | (k >= V), V + 1, k)
    # Probabilities: zeros are never kept (nor renormalized); logits: -inf never is.
    if MODE == 2:
        start = tl.full([ROWS, 1], -_INF, dtype=tl.float32)
    else:
        start = tl.zeros([ROWS, 1], dtype=tl.float32)
    sums0, counts0, mins0, _ = _scan(base, V, start, valid, 1, BLOCK, NCHUNK, True, True)
    low = tl.sum(start, axis=1)
    low_sums = tl.sum(sums0, axis=1)
    limit = tl.full([ROWS], _INF, dtype=tl.float32)
    if MODE == 0:
        if P_ARRAY:
            p = tl.load(TopP + rows, mask=valid, other=1.0).to(tl.float32)
        else:
            p = tl.zeros([ROWS], dtype=tl.float32) + top_p_value
        limit = tl.where(p >= 1.0, _INF, tl.maximum(p, 0.0) * tl.sum(low_sums, axis=1))
    total = tl.sum(low_sums, axis=1)
    search = valid & ((tl.sum(counts0, axis=1) >= k) | (total > limit))
    high = tl.full([ROWS], _INF, dtype=tl.float32)
    low, low_sums = _exact_low(
        base,
        V,
        low,
        low_sums,
        tl.sum(mins0, axis=1),
        high,
        k,
        limit,
        search,
        PIVOTS,
        BLOCK,
        NCHUNK,
    )
    inv = 1.0 / tl.sum(low_sums, axis=1)
    cols = tl.arange(0, BLOCK)
    out_base = Out + rows.to(tl.int64) * stride_o
    for c in range(0, tl.cdiv(V, BLOCK)):
        offs = c * BLOCK + cols
        mask = valid[:, None] & (offs < V)[None, :]
        x = tl.load(base[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        if MODE == 2:
            y = tl.where(x > low[:, None], x, -_INF)
        else:
            y = tl.where(x > low[:, None], x * inv[:, None], 0.0)
        tl.store(out_base[:, None] + offs[None, :], y.to(Out.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# Softmax with temperature
# ----------------------------------------------------------------------------------------------


@triton.jit
def softmax_kernel(
    X,  # [B, V] logits, row stride stride_x
    Out,  # [B, V] fp32, row stride stride_o
    Temperature,  # [B] (T_ARRAY) else temperature_value
    temperature_value,
    B,
    V,
    stride_x,
    stride_o,
    T_ARRAY: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Online softmax: per column of the chunk grid a running max and sum (no reduction per
    chunk), combined once; then one pass writing exp(x / T - max) / sum."""
    rows, valid, base = _row_bases(X, X, tl.program_id(0) * ROWS, B, stride_x, False, ROWS)
    if T_ARRAY:
        t = tl.load(Temperature + rows, mask=valid, other=1.0).to(tl.float32)
    else:
        t = tl.zeros([ROWS], dtype=tl.float32) + temperature_value
    inv_t = (1.0 / t)[:, None]
    cols = tl.arange(0, BLOCK)
    m = tl.full([ROWS, BLOCK], -_INF, dtype=tl.float32)
    s = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    for c in range(0, tl.cdiv(V, BLOCK)):
        offs = c * BLOCK + cols
        mask = valid[:, None] & (offs < V)[None, :]
        x = tl.load(base[:, None] + offs[None, :], mask=mask, other=-_INF).to(tl.float32)
        x = x * inv_t
        m_new = tl.maximum(m, x)
        scale = tl.where(m_new == -_INF, 1.0, tl.exp(m - m_new))
        s = s * scale + tl.where(x == -_INF, 0.0, tl.exp(x - m_new))
        m = m_new
    m_row = tl.max(m, axis=1)
    s_row = tl.sum(tl.where(m == -_INF, 0.0, s * tl.exp(m - m_row[:, None])), axis=1)
    inv_s = (1.0 / s_row)[:, None]
    out_base = Out + rows.to(tl.int64) * stride_o
    for c in range(0, tl.cdiv(V, BLOCK)):
        offs = c * BLOCK + cols
        mask = valid[:, None] & (offs < V)[None, :]
        x = tl.load(base[:, None] + offs[None, :], mask=mask, other=-_INF).to(tl.float32)
        x = x * inv_t
        y = tl.where(x == -_INF, 0.0, tl.exp(x - m_row[:, None]) * inv_s)
        tl.store(out_base[:, None] + offs[None, :], y, mask=mask)


# ----------------------------------------------------------------------------------------------
# Chain speculative sampling
# ----------------------------------------------------------------------------------------------


@triton.jit
def chain_speculative_kernel(
    Draft,  # [B, N, V] draft probabilities, contiguous
    DraftIds,  # [B, N] int draft tokens, contiguous
    Target,  # [B, N + 1, V] target probabilities, contiguous
    Out,  # [B, N + 1] int32: accepted tokens, then the correction or bonus token, then -1
    Accepted,  # [B] int32, += the tokens accepted when each is considered on its own
    Emitted,  # [B] int32, += the draft tokens emitted
    Seed,  # [1] int64
    N,
    V,
    BLOCK: tl.constexpr,
    NCHUNK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    seed = tl.load(Seed)
    stream = b * _ROUNDS * (N + 1)
    accepted = 0
    emitted = 0
    stop = N  # the first rejected position; N when every draft token is accepted
    for i in range(0, N):
        d = tl.load(DraftIds + b * N + i).to(tl.int64)
        q = tl.load(Draft + (b * N + i) * V + d).to(tl.float32)
        p = tl.load(Target + (b * (N + 1) + i) * V + d).to(tl.float32)
        ok = tl.rand(seed, stream + i) * q < p
        accepted += ok.to(tl.int32)
        if stop == N:
            if ok:
                tl.store(Out + b * (N + 1) + i, d.to(tl.int32))
                emitted += 1
            else:
                stop = i
    # The token at `stop`: drawn from max(target - draft, 0) after a rejection, else the
    # bonus token from the target's last row.
    t_row = Target + (b * (N + 1) + stop) * V
    d_row = Draft + (b * N + tl.minimum(stop, N - 1)) * V
    residual = stop < N
    cols = tl.arange(0, BLOCK)
    chunk_ids = tl.arange(0, NCHUNK)
    sums = tl.zeros([NCHUNK], dtype=tl.float32)
    for c in range(0, tl.cdiv(V, BLOCK)):
        offs = c * BLOCK + cols
        w = tl.load(t_row + offs, mask=offs < V, other=0.0).to(tl.float32)
        q = tl.load(d_row + offs, mask=(offs < V) & residual, other=0.0).to(tl.float32)
        w = tl.maximum(w - q, 0.0)
        sums = tl.where(chunk_ids == c, tl.sum(w, axis=0), sums)
    target = tl.rand(seed, stream + N) * tl.sum(sums, axis=0)
    cum = tl.cumsum(sums, axis=0)
    first = tl.min(tl.where(cum > target, chunk_ids, NCHUNK), axis=0)
    c = tl.minimum(first, tl.max(tl.where(sums > 0.0, chunk_ids, 0), axis=0))
    target -= tl.sum(tl.where(chunk_ids < c, sums, 0.0), axis=0)
    offs = c * BLOCK + cols
    w = tl.load(t_row + offs, mask=offs < V, other=0.0).to(tl.float32)
    q = tl.load(d_row + offs, mask=(offs < V) & residual, other=0.0).to(tl.float32)
    w = tl.maximum(w - q, 0.0)
    wcum = tl.cumsum(w, axis=0)
    j = tl.min(tl.where(wcum > target, cols, BLOCK), axis=0)
    j = tl.minimum(j, tl.max(tl.where(w > 0.0, cols, 0), axis=0))
    tl.store(Out + b * (N + 1) + stop, (c * BLOCK + j).to(tl.int32))
    for i in range(stop + 1, N + 1):
        tl.store(Out + b * (N + 1) + i, -1)
    tl.store(Accepted + b, tl.load(Accepted + b) + accepted)
    tl.store(Emitted + b, tl.load(Emitted + b) + emitted)

"""Building blocks of the sampling kernels (kernels.py, split_kernels.py): a pass over a row's
values against several thresholds, a draw from the values above a threshold, and one round's
verdicts of the rejection and exact-threshold searches. The method is described in
kernels.py. The blocks are the package's own (private names), but for `pick_in_chunk`,
which the tests check on its own.

Shapes in comments: R rows, P thresholds (pivots), C = NCHUNK chunk sums a row (a power of
two >= V / BLOCK).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["pick_in_chunk"]

# Random streams per output row; also the cap on rejection rounds (never reached: see
# kernels.py). Round r of output row b draws philox(seed, b * MAX_ROUNDS + r).
_MAX_ROUNDS = 64
_INF = tl.constexpr(float("inf"))


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
    first_chunk,
    end_chunk,
    PREFETCH: tl.constexpr,
):
    """One pass over chunks [first_chunk, end_chunk) of BLOCK values: per row and
    pivot, the chunk sums [R, P, C] of the values > t (zero outside the range), their count
    [R, P] (COUNTS), the smallest of them [R, P] (MINS); and each row's largest value [R].

    PREFETCH: chunk c + 1 is loaded before chunk c is reduced. The loop's loads are not
    pipelined by the compiler (no cp.async in its PTX), so without it every chunk waits a
    full memory latency, then runs its cross-warp reductions; with it the two overlap, for
    a [R, BLOCK] tile more of registers."""
    cols = tl.arange(0, BLOCK)
    chunk_ids = tl.arange(0, NCHUNK)
    R: tl.constexpr = t.shape[0]
    sums = tl.zeros([R, P, NCHUNK], dtype=tl.float32)
    counts = tl.zeros([R, P, BLOCK], dtype=tl.int32)
    mins = tl.full([R, P, BLOCK], _INF, dtype=tl.float32)
    maxs = tl.full([R, BLOCK], -_INF, dtype=tl.float32)
    ptrs = base[:, None] + cols[None, :]
    if PREFETCH:
        # Kept in the input's dtype: a conversion at the load would wait for it.
        in_range = (first_chunk * BLOCK + cols < V) & (first_chunk < end_chunk)
        mask = active[:, None] & in_range[None, :]
        x_next = tl.load(ptrs + first_chunk * BLOCK, mask=mask, other=-_INF)
    for c in range(first_chunk, end_chunk):
        if PREFETCH:
            x = x_next.to(tl.float32)
            in_range = ((c + 1) * BLOCK + cols < V) & (c + 1 < end_chunk)
            mask = active[:, None] & in_range[None, :]
            x_next = tl.load(ptrs + (c + 1) * BLOCK, mask=mask, other=-_INF)
        else:
            mask = active[:, None] & (c * BLOCK + cols < V)[None, :]
            x = tl.load(ptrs + c * BLOCK, mask=mask, other=-_INF).to(tl.float32)
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
    `sums` [R, C]: the chunk sums of those values. Rounding never yields an ineligible
    value: a target left past a chunk's last eligible value takes that value, one left
    below zero (the prefix sums below are added in another order than cumsum's) the
    chunk's first (seen: 5M draws at vocab 128k, half the values 0, drew zeros)."""
    chunk_ids = tl.arange(0, NCHUNK)
    target = u * tl.sum(sums, axis=1)
    cum = tl.cumsum(sums, axis=1)
    passed = (cum > target[:, None]) & (sums > 0.0)
    first = tl.min(tl.where(passed, chunk_ids[None, :], NCHUNK), axis=1)
    last = tl.max(tl.where(sums > 0.0, chunk_ids[None, :], 0), axis=1)
    c = tl.minimum(first, last)
    target -= tl.sum(tl.where(chunk_ids[None, :] < c[:, None], sums, 0.0), axis=1)
    cols = tl.arange(0, BLOCK)
    offs = c[:, None] * BLOCK + cols[None, :]
    x = tl.load(base[:, None] + offs, mask=active[:, None] & (offs < V), other=0.0)
    x = x.to(tl.float32)
    j = pick_in_chunk(x, low, target, BLOCK)
    value = tl.sum(tl.where(cols[None, :] == j[:, None], x, 0.0), axis=1)
    return c * BLOCK + j, value


@triton.jit
def pick_in_chunk(x, low, target, BLOCK: tl.constexpr):
    """The column [R] of x [R, BLOCK] where the running sum of the values > low first
    exceeds target [R], among those values only: the first of them when target < 0, the
    last when target is past their sum (both from rounding)."""
    cols = tl.arange(0, BLOCK)
    eligible = x > low[:, None]
    w = tl.where(eligible, x, 0.0)
    wcum = tl.cumsum(w, axis=1)
    j = tl.min(tl.where((wcum > target[:, None]) & eligible, cols[None, :], BLOCK), axis=1)
    return tl.minimum(j, tl.max(tl.where(eligible, cols[None, :], 0), axis=1))


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
def _search_round(
    t, sums, counts, mins, low, low_sums, v, high, k, limit, searching, P: tl.constexpr
):
    """One pass's verdicts [R, P] in the search for an exact support (`_exact_low`): where
    the smallest value > low passes, S = {x > low} and the row is done; elsewhere low rises
    to the largest rejected pivot. Returns (low, low_sums, v, high, still searching [R])."""
    ok = (counts < k[:, None]) & (tl.sum(sums, axis=2) <= limit[:, None])
    rejected = searching & (_take(ok.to(tl.int32), tl.zeros_like(k), P) == 0)
    m, new_high = _rejected_pivot(ok, t, high, P)
    low = tl.where(rejected, _take(t, m, P), low)
    low_sums = tl.where(rejected[:, None], _take_row(sums, m, P), low_sums)
    v = tl.where(rejected, _take(mins, m, P), v)
    high = tl.where(rejected, new_high, high)
    return low, low_sums, v, high, rejected & (v < high)


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
    PREFETCH: tl.constexpr,
):
    """Per row, the exact support {x > low} of the filter (fewer than k values above, their
    mass <= limit), from a `low` [R] known to fail it: returns (low [R], its chunk sums
    [R, C]). `v` [R]: the smallest value > low; `high` [R]: a value known to pass."""
    searching = active & (v < high)
    n_chunks = tl.cdiv(V, BLOCK)
    while tl.max(searching.to(tl.int32), axis=0) > 0:
        t = _pivots(v, tl.minimum(high, 3.0e38), P)
        sums, counts, mins, _ = _scan(
            base, V, t, searching, P, BLOCK, NCHUNK, True, True, 0, n_chunks, PREFETCH
        )
        low, low_sums, v, high, searching = _search_round(
            t, sums, counts, mins, low, low_sums, v, high, k, limit, searching, P
        )
    return low, low_sums


@triton.jit
def _candidate_thresholds(value, high, MODE: tl.constexpr, P: tl.constexpr):
    """[R, P] thresholds of a rejection round: the candidate's value, then P - 1 more up to
    `high`. min-p knows its threshold (`high`): every pivot is the float just below it, and
    the next candidate, drawn above that, is in S."""
    t = _pivots(value, high, P)
    if MODE == 3:
        below = high.to(tl.int32, bitcast=True) - 1  # high > 0: bits order like values
        t = tl.zeros_like(t) + below.to(tl.float32, bitcast=True)[:, None]
    return t


@triton.jit
def _candidate_round(
    t, sums, counts, low, low_sums, high, k, limit, todo, MODE: tl.constexpr, P: tl.constexpr
):
    """One rejection round's verdicts on thresholds t [R, P]: the candidate t[:, 0] is in S
    where it passes (the row is done); elsewhere low rises to the largest rejected pivot,
    whose chunk sums the next candidate is drawn from. Returns (rejected [R], low,
    low_sums, high)."""
    if MODE == 3:
        ok = t >= high[:, None]
    else:
        ok = (counts < k[:, None]) & (tl.sum(sums, axis=2) <= limit[:, None])
    rejected = todo & (_take(ok.to(tl.int32), tl.zeros_like(k), P) == 0)
    m, new_high = _rejected_pivot(ok, t, high, P)
    low = tl.where(rejected, _take(t, m, P), low)
    low_sums = tl.where(rejected[:, None], _take_row(sums, m, P), low_sums)
    high = tl.where(rejected, new_high, high)
    return rejected, low, low_sums, high


@triton.jit
def _top_p_limit(param, low_sums):
    """The most mass [R] the values above a kept one may hold: top_p of the row's."""
    return tl.where(param >= 1.0, _INF, tl.maximum(param, 0.0) * tl.sum(low_sums, axis=1))


@triton.jit
def _row_params(
    TopK,
    top_k_value,
    TopP,
    top_p_value,
    rows,
    valid,
    V,
    MODE: tl.constexpr,
    K_ARRAY: tl.constexpr,
    P_ARRAY: tl.constexpr,
):
    """Per row [R]: k (V + 1: no top-k test) and the float parameter (top_p or min_p)."""
    R: tl.constexpr = rows.shape[0]
    USE_K: tl.constexpr = (MODE == 2) | (MODE == 4) | (MODE == 5)
    USE_P: tl.constexpr = (MODE == 1) | (MODE == 3) | (MODE == 4) | (MODE == 5)
    k = tl.zeros([R], dtype=tl.int32) + V + 1
    if USE_K:
        if K_ARRAY:
            k = tl.load(TopK + rows, mask=valid, other=0).to(tl.int32)
        else:
            k = tl.zeros([R], dtype=tl.int32) + top_k_value
        k = tl.where((k <= 0) | (k >= V), V + 1, k)  # no filtering, as the references
    param = tl.full([R], 1.0, dtype=tl.float32)
    if USE_P:
        if P_ARRAY:
            param = tl.load(TopP + rows, mask=valid, other=1.0).to(tl.float32)
        else:
            param = tl.zeros([R], dtype=tl.float32) + top_p_value
    return k, param


@triton.jit
def _first_state(sums0, pmax, param, MODE: tl.constexpr):
    """From the first pass (threshold 0: sums0 [R, 1, C], the row's max [R]): the sampled
    set {x > low = 0}, its chunk sums [R, C], `high` (a value known to be in S) and the
    top-p mass limit [R]."""
    low_sums = tl.sum(sums0, axis=1)
    low = tl.zeros_like(pmax)
    high = pmax  # the largest value always passes
    limit = tl.zeros_like(pmax) + _INF
    if (MODE == 1) | (MODE == 4):
        limit = _top_p_limit(param, low_sums)
    if MODE == 3:
        # min-p: S = {x >= min_p * max}. A candidate >= that passes; else one pass at the
        # float just below it, whose next candidate is in S.
        high = tl.where(param > 0.0, param * pmax, 0.0)
    return low, low_sums, high, limit


@triton.jit
def _enter_sampling(k, limit, param, low_sums, fresh, V, MODE: tl.constexpr):
    """(k, limit) of rows `fresh` as their rejection sampling starts: for top-k-first, top-p
    within the exact top-k support just found (renormalized: its own mass), no top-k test."""
    if MODE == 5:
        k = tl.where(fresh, V + 1, k)
        limit = tl.where(fresh, _top_p_limit(param, low_sums), limit)
    return k, limit


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

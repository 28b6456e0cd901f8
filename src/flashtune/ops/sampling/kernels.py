"""Triton kernels of the sampling family (steps.py holds the building blocks named below;
split_kernels.py the same sampling with a row's passes shared by several programs, for small
batches; launch.py launches them).

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

from flashtune.ops.sampling.split_kernels import SPLIT_DONE, SPLIT_SEARCH, _load_state
from flashtune.ops.sampling.steps import (
    _MAX_ROUNDS,
    _candidate_round,
    _candidate_thresholds,
    _enter_sampling,
    _exact_low,
    _first_state,
    _pick,
    _row_bases,
    _row_params,
    _scan,
)

__all__ = [
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

_ROUNDS = tl.constexpr(_MAX_ROUNDS)

_SEARCH = tl.constexpr(SPLIT_SEARCH)
_DONE = tl.constexpr(SPLIT_DONE)

MODE_PLAIN, MODE_TOP_P, MODE_TOP_K, MODE_MIN_P, MODE_JOINT, MODE_TOP_K_FIRST = range(6)
RENORM_TOP_P, RENORM_TOP_K, MASK_TOP_K = range(3)
_INF = tl.constexpr(float("inf"))


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
    WsF,  # [B, ws_f] float32 split-row workspace (RESUME; see split_first_kernel)
    WsI,  # [B, ws_i] int32 split-row workspace (RESUME)
    ws_f,
    ws_i,
    MODE: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    K_ARRAY: tl.constexpr,
    P_ARRAY: tl.constexpr,
    PIVOTS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    NCHUNK: tl.constexpr,
    RESUME: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """ROWS rows a program, every pass over the whole row. RESUME: the rows the split-row
    kernels left undecided go on from the state they wrote (the others are done)."""
    rows, valid, base = _row_bases(
        Probs, Indices, tl.program_id(0) * ROWS, B, stride, HAS_INDICES, ROWS
    )
    seed = tl.load(Seed)
    stream = rows.to(tl.int64) * _ROUNDS
    USE_K: tl.constexpr = (MODE == 2) | (MODE == 4) | (MODE == 5)
    n_chunks = tl.cdiv(V, BLOCK)
    k, param = _row_params(
        TopK, top_k_value, TopP, top_p_value, rows, valid, V, MODE, K_ARRAY, P_ARRAY
    )
    if RESUME:
        phase, low, high, value, limit, v, high_search, token, rnd, k, low_sums = _load_state(
            WsF + rows.to(tl.int64) * ws_f,
            WsI + rows.to(tl.int64) * ws_i,
            valid,
            n_chunks,
            NCHUNK,
        )
        busy = valid & (phase != _DONE)
        fresh = busy & (phase == _SEARCH)
        if MODE == 5:
            low, low_sums = _exact_low(
                base,
                V,
                low,
                low_sums,
                v,
                high_search,
                k,
                limit,
                fresh,
                PIVOTS,
                BLOCK,
                NCHUNK,
                PREFETCH,
            )
    else:
        zero = tl.zeros([ROWS, 1], dtype=tl.float32)
        sums0, counts0, mins0, pmax = _scan(
            base, V, zero, valid, 1, BLOCK, NCHUNK, MODE == 5, MODE == 5, 0, n_chunks, PREFETCH
        )
        low, low_sums, high, limit = _first_state(sums0, pmax, param, MODE)
        busy = valid
        fresh = valid
        token = tl.zeros([ROWS], dtype=tl.int32)
        value = tl.zeros([ROWS], dtype=tl.float32)
        rnd = tl.zeros([ROWS], dtype=tl.int32)
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
                PREFETCH,
            )
    k, limit = _enter_sampling(k, limit, param, low_sums, fresh, V, MODE)
    first_token, first_value = _pick(
        base, V, low_sums, low, tl.rand(seed, stream), fresh, BLOCK, NCHUNK
    )
    token = tl.where(fresh, first_token.to(tl.int32), token)
    value = tl.where(fresh, first_value, value)
    todo = busy & (value < high) & (MODE != 0)
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        t = _candidate_thresholds(value, high, MODE, PIVOTS)
        sums, counts, _, _ = _scan(
            base, V, t, todo, PIVOTS, BLOCK, NCHUNK, USE_K, False, 0, n_chunks, PREFETCH
        )
        rejected, low, low_sums, high = _candidate_round(
            t, sums, counts, low, low_sums, high, k, limit, todo, MODE, PIVOTS
        )
        rnd = tl.where(rejected, rnd + 1, rnd)
        u = tl.rand(seed, stream + rnd)
        next_token, next_value = _pick(base, V, low_sums, low, u, rejected, BLOCK, NCHUNK)
        token = tl.where(rejected, next_token.to(tl.int32), token)
        value = tl.where(rejected, next_value, value)
        todo = rejected & (value < high) & (rnd < _ROUNDS - 1)
    tl.store(Out + rows, token, mask=busy)


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
    PREFETCH: tl.constexpr,
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
    sums0, counts0, mins0, _ = _scan(
        base, V, start, valid, 1, BLOCK, NCHUNK, True, True, 0, tl.cdiv(V, BLOCK), PREFETCH
    )
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
        PREFETCH,
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

"""Sampling from probabilities with a row's passes split over several programs (small
batches), the same method and draws as sampling_kernel (kernels.py).

At small batch one program a row leaves most SMs idle and each pass is bound by one
program's load latency. Here SPLIT programs (grid (SPLIT, cdiv(B, ROWS))) share each pass
over their ROWS rows (one on a GPU; many in the interpreter, whose cost is per program):
each scans a contiguous range of the chunks and writes its partial statistics; the last
of them to finish (an atomic arrival counter per row group and launch; no program ever
waits on another) combines them, takes the round's decision as sampling_kernel would,
draws the next candidate and writes the rows' state. split_first_kernel runs the first
pass; each split_round_kernel launch runs one more round (a no-op for rows already done);
then sampling_kernel(RESUME) finishes the rare rows still undecided from that state. Same
passes, thresholds and uniforms as sampling_kernel: the same tokens but for the rounding
of partial sums. No host synchronization: the number of launches is fixed.

Workspace per output row. float32 [ws_f]: the state (below), low's chunk sums [C], this
pass's per-pivot chunk sums [P, C], each program's per-pivot minimum [SPLIT, P] and
maximum [SPLIT]. int32 [ws_i], zeroed per call: the state, each program's per-pivot
counts [SPLIT, P], one arrival counter per launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashtune.ops.sampling.steps import (
    _MAX_ROUNDS,
    _candidate_round,
    _candidate_thresholds,
    _enter_sampling,
    _first_state,
    _pick,
    _pivots,
    _row_bases,
    _row_params,
    _scan,
    _search_round,
)

__all__ = [
    "SPLIT_SEARCH",
    "SPLIT_SAMPLE",
    "SPLIT_DONE",
    "SPLIT_STATE_F",
    "SPLIT_STATE_I",
    "split_workspace_widths",
    "split_first_kernel",
    "split_round_kernel",
]

_ROUNDS = tl.constexpr(_MAX_ROUNDS)
_INF = tl.constexpr(float("inf"))
SPLIT_SEARCH, SPLIT_SAMPLE, SPLIT_DONE = range(3)  # a row's phase (int32 column 0)
_SEARCH = tl.constexpr(SPLIT_SEARCH)  # top-k-first, searching the exact top-k support
_SAMPLE = tl.constexpr(SPLIT_SAMPLE)  # a candidate drawn, not yet known to be in S
_DONE = tl.constexpr(SPLIT_DONE)  # sample written
SPLIT_STATE_F = 8  # low, high, value, limit, v, high_search (top-k-first search), spare
SPLIT_STATE_I = 4  # phase, token, round, k
_STATE_F = tl.constexpr(SPLIT_STATE_F)
_STATE_I = tl.constexpr(SPLIT_STATE_I)


def split_workspace_widths(nchunk: int, pivots: int, split: int, launches: int) -> tuple[int, int]:
    """(ws_f, ws_i): the float32 and int32 workspace columns a row needs, each a multiple of
    32 (rows start on their own 128-byte line)."""
    f = SPLIT_STATE_F + nchunk + pivots * nchunk + split * pivots + split
    i = SPLIT_STATE_I + split * pivots + launches
    return -(-f // 32) * 32, -(-i // 32) * 32


@triton.jit
def _load_state(f, i, active, n_chunks, NCHUNK: tl.constexpr):
    """The state of rows f, i [R] (workspace row pointers); inactive rows read as done."""
    phase = tl.load(i + 0, mask=active, other=_DONE)
    busy = active & (phase != _DONE)
    low = tl.load(f + 0, mask=busy, other=0.0)
    high = tl.load(f + 1, mask=busy, other=0.0)
    value = tl.load(f + 2, mask=busy, other=0.0)
    limit = tl.load(f + 3, mask=busy, other=0.0)
    v = tl.load(f + 4, mask=busy, other=0.0)
    high_search = tl.load(f + 5, mask=busy, other=0.0)
    token = tl.load(i + 1, mask=busy, other=0)
    rnd = tl.load(i + 2, mask=busy, other=0)
    k = tl.load(i + 3, mask=busy, other=0)
    chunk_ids = tl.arange(0, NCHUNK)
    low_sums = tl.load(
        f[:, None] + _STATE_F + chunk_ids[None, :],
        mask=busy[:, None] & (chunk_ids < n_chunks)[None, :],
        other=0.0,
    )
    return phase, low, high, value, limit, v, high_search, token, rnd, k, low_sums


@triton.jit
def _store_state(
    f, i, mask, phase, low, high, value, limit, v, high_search, token, rnd, k, low_sums, NCHUNK
):
    """Write the state of rows f, i [R] (workspace row pointers) where `mask`."""
    tl.store(f + 0, low, mask=mask)
    tl.store(f + 1, high, mask=mask)
    tl.store(f + 2, value, mask=mask)
    tl.store(f + 3, limit, mask=mask)
    tl.store(f + 4, v, mask=mask)
    tl.store(f + 5, high_search, mask=mask)
    tl.store(i + 0, phase, mask=mask)
    tl.store(i + 1, token, mask=mask)
    tl.store(i + 2, rnd, mask=mask)
    tl.store(i + 3, k, mask=mask)
    chunk_ids = tl.arange(0, NCHUNK)
    tl.store(f[:, None] + _STATE_F + chunk_ids[None, :], low_sums, mask=mask[:, None])


@triton.jit
def _store_partials(
    f,
    i,
    active,
    s,
    sums,
    counts,
    mins,
    pmax,
    first_chunk,
    end_chunk,
    P: tl.constexpr,
    PIVOTS: tl.constexpr,
    SPLIT: tl.constexpr,
    NCHUNK: tl.constexpr,
):
    """Program s's share of a pass over rows f, i [R] (sums [R, P, C], nonzero on its
    chunks; counts, mins [R, P]; pmax [R]) into the workspace."""
    chunk_ids = tl.arange(0, NCHUNK)
    ids = tl.arange(0, P)
    mine = (chunk_ids >= first_chunk) & (chunk_ids < end_chunk)
    sums_at = f[:, None, None] + _STATE_F + NCHUNK + ids[None, :, None] * NCHUNK
    mask = active[:, None, None] & mine[None, None, :]
    tl.store(sums_at + chunk_ids[None, None, :], sums, mask=mask)
    mins_at = f + _STATE_F + NCHUNK + PIVOTS * NCHUNK
    tl.store(mins_at[:, None] + s * PIVOTS + ids[None, :], mins, mask=active[:, None])
    tl.store(mins_at + SPLIT * PIVOTS + s, pmax, mask=active)
    counts_at = i[:, None] + _STATE_I + s * PIVOTS + ids[None, :]
    tl.store(counts_at, counts, mask=active[:, None])


@triton.jit
def _arrive(counter):
    """Whether this program is the last of the SPLIT sharing its rows' pass to finish it
    (`counter`: their arrival count for this launch; the caller compares with SPLIT - 1).
    The barrier orders every thread's partial stores before the one atomic (release); its
    acquire makes the other programs' partials visible to the last one."""
    tl.debug_barrier()
    return tl.atomic_add(counter, 1, sem="acq_rel")


@triton.jit
def _combine(
    f,
    i,
    active,
    n_chunks,
    P: tl.constexpr,
    PIVOTS: tl.constexpr,
    SPLIT: tl.constexpr,
    NCHUNK: tl.constexpr,
):
    """Rows f, i's whole pass from their SPLIT programs' partials: (sums [R, P, C], counts
    [R, P], mins [R, P], max [R]). Read past L1: other SMs wrote them in this launch."""
    chunk_ids = tl.arange(0, NCHUNK)
    ids = tl.arange(0, P)
    progs = tl.arange(0, SPLIT)
    sums_at = f[:, None, None] + _STATE_F + NCHUNK + ids[None, :, None] * NCHUNK
    sums = tl.load(
        sums_at + chunk_ids[None, None, :],
        mask=active[:, None, None] & (chunk_ids < n_chunks)[None, None, :],
        other=0.0,
        cache_modifier=".cg",
    )
    mins_at = f[:, None, None] + _STATE_F + NCHUNK + PIVOTS * NCHUNK
    mins = tl.load(
        mins_at + progs[None, :, None] * PIVOTS + ids[None, None, :],
        mask=active[:, None, None],
        other=_INF,
        cache_modifier=".cg",
    )
    maxs_at = f[:, None] + _STATE_F + NCHUNK + PIVOTS * NCHUNK + SPLIT * PIVOTS
    maxs = tl.load(
        maxs_at + progs[None, :],
        mask=active[:, None],
        other=-_INF,
        cache_modifier=".cg",
    )
    counts = tl.load(
        i[:, None, None] + _STATE_I + progs[None, :, None] * PIVOTS + ids[None, None, :],
        mask=active[:, None, None],
        other=0,
        cache_modifier=".cg",
    )
    return sums, tl.sum(counts, axis=1), tl.min(mins, axis=1), tl.max(maxs, axis=1)


@triton.jit
def _my_chunks(V, s, BLOCK: tl.constexpr, SPLIT: tl.constexpr):
    """Program s's chunks [first, end) of its rows, and a row's chunk count."""
    n_chunks = tl.cdiv(V, BLOCK)
    per = tl.cdiv(n_chunks, SPLIT)
    first = tl.minimum(s * per, n_chunks)
    return first, tl.minimum(first + per, n_chunks), n_chunks


@triton.jit
def split_first_kernel(
    Probs,
    Out,
    Indices,
    Seed,
    TopK,
    top_k_value,
    TopP,
    top_p_value,
    B,
    V,
    stride,
    WsF,
    WsI,
    ws_f,
    ws_i,
    MODE: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    K_ARRAY: tl.constexpr,
    P_ARRAY: tl.constexpr,
    PIVOTS: tl.constexpr,
    ROWS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK: tl.constexpr,
    NCHUNK: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """sampling_kernel's first pass and first draw (top-k-first: the start of its search),
    ROWS rows shared by SPLIT programs: grid (SPLIT, cdiv(B, ROWS))."""
    s = tl.program_id(0)
    first_row = tl.program_id(1) * ROWS
    rows, valid, base = _row_bases(Probs, Indices, first_row, B, stride, HAS_INDICES, ROWS)
    f = WsF + rows.to(tl.int64) * ws_f
    i = WsI + rows.to(tl.int64) * ws_i
    first_chunk, end_chunk, n_chunks = _my_chunks(V, s, BLOCK, SPLIT)
    zero = tl.zeros([ROWS, 1], dtype=tl.float32)
    sums0, counts0, mins0, pmax = _scan(
        base,
        V,
        zero,
        valid,
        1,
        BLOCK,
        NCHUNK,
        MODE == 5,
        MODE == 5,
        first_chunk,
        end_chunk,
        PREFETCH,
    )
    _store_partials(
        f,
        i,
        valid,
        s,
        sums0,
        counts0,
        mins0,
        pmax,
        first_chunk,
        end_chunk,
        1,
        PIVOTS,
        SPLIT,
        NCHUNK,
    )
    counter = WsI + first_row.to(tl.int64) * ws_i + _STATE_I + SPLIT * PIVOTS
    if _arrive(counter) == SPLIT - 1:
        tl.debug_barrier()
        sums0, counts0, mins0, pmax = _combine(f, i, valid, n_chunks, 1, PIVOTS, SPLIT, NCHUNK)
        k, param = _row_params(
            TopK, top_k_value, TopP, top_p_value, rows, valid, V, MODE, K_ARRAY, P_ARRAY
        )
        low, low_sums, high, limit = _first_state(sums0, pmax, param, MODE)
        v = tl.sum(mins0, axis=1)
        fresh = valid
        if MODE == 5:
            fresh = valid & ((tl.sum(counts0, axis=1) < k) | (v >= high))
        k, limit = _enter_sampling(k, limit, param, low_sums, fresh, V, MODE)
        stream = rows.to(tl.int64) * _ROUNDS
        token, value = _pick(
            base, V, low_sums, low, tl.rand(tl.load(Seed), stream), fresh, BLOCK, NCHUNK
        )
        todo = fresh & (value < high) & (MODE != 0)
        phase = tl.where(fresh, tl.where(todo, _SAMPLE, _DONE), _SEARCH)
        rnd = tl.zeros([ROWS], dtype=tl.int32)
        token = token.to(tl.int32)
        _store_state(
            f, i, valid, phase, low, high, value, limit, v, high, token, rnd, k, low_sums, NCHUNK
        )
        tl.store(Out + rows, token, mask=valid & (phase == _DONE))


@triton.jit
def split_round_kernel(
    Probs,
    Out,
    Indices,
    Seed,
    TopK,
    top_k_value,
    TopP,
    top_p_value,
    B,
    V,
    stride,
    WsF,
    WsI,
    ws_f,
    ws_i,
    launch,  # this launch's arrival counter (1, 2, ...)
    MODE: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    K_ARRAY: tl.constexpr,
    P_ARRAY: tl.constexpr,
    PIVOTS: tl.constexpr,
    ROWS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK: tl.constexpr,
    NCHUNK: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """One round of sampling_kernel's loop (top-k-first: of its search, while searching),
    ROWS rows shared by SPLIT programs: grid (SPLIT, cdiv(B, ROWS)). Where every row is done
    already, a program costs a load."""
    s = tl.program_id(0)
    first_row = tl.program_id(1) * ROWS
    rows, valid, base = _row_bases(Probs, Indices, first_row, B, stride, HAS_INDICES, ROWS)
    f = WsF + rows.to(tl.int64) * ws_f
    i = WsI + rows.to(tl.int64) * ws_i
    busy = valid & (tl.load(i, mask=valid, other=_DONE) != _DONE)
    USE_K: tl.constexpr = (MODE == 2) | (MODE == 4) | (MODE == 5)
    if tl.max(busy.to(tl.int32), axis=0) > 0:
        first_chunk, end_chunk, n_chunks = _my_chunks(V, s, BLOCK, SPLIT)
        phase, low, high, value, limit, v, high_search, token, rnd, k, low_sums = _load_state(
            f, i, busy, n_chunks, NCHUNK
        )
        searching = busy & (phase == _SEARCH)
        t = _candidate_thresholds(value, high, MODE, PIVOTS)
        if MODE == 5:
            t_search = _pivots(v, tl.minimum(high_search, 3.0e38), PIVOTS)
            t = tl.where(searching[:, None], t_search, t)
        sums, counts, mins, pmax = _scan(
            base,
            V,
            t,
            busy,
            PIVOTS,
            BLOCK,
            NCHUNK,
            USE_K,
            MODE == 5,
            first_chunk,
            end_chunk,
            PREFETCH,
        )
        _store_partials(
            f,
            i,
            busy,
            s,
            sums,
            counts,
            mins,
            pmax,
            first_chunk,
            end_chunk,
            PIVOTS,
            PIVOTS,
            SPLIT,
            NCHUNK,
        )
        counter = WsI + first_row.to(tl.int64) * ws_i + _STATE_I + SPLIT * PIVOTS + launch
        if _arrive(counter) == SPLIT - 1:
            tl.debug_barrier()
            sums, counts, mins, _ = _combine(f, i, busy, n_chunks, PIVOTS, PIVOTS, SPLIT, NCHUNK)
            sampling = busy & (phase == _SAMPLE)
            rejected, low_c, low_sums_c, high = _candidate_round(
                t, sums, counts, low, low_sums, high, k, limit, sampling, MODE, PIVOTS
            )
            fresh = tl.zeros_like(sampling)
            still = tl.zeros_like(sampling)
            if MODE == 5:
                low_s, low_sums_s, v, high_search, still = _search_round(
                    t,
                    sums,
                    counts,
                    mins,
                    low,
                    low_sums,
                    v,
                    high_search,
                    k,
                    limit,
                    searching,
                    PIVOTS,
                )
                low_c = tl.where(searching, low_s, low_c)
                low_sums_c = tl.where(searching[:, None], low_sums_s, low_sums_c)
                fresh = searching & ~still
                _, param = _row_params(
                    TopK, top_k_value, TopP, top_p_value, rows, valid, V, MODE, K_ARRAY, P_ARRAY
                )
                k, limit = _enter_sampling(k, limit, param, low_sums_c, fresh, V, MODE)
            low = low_c
            low_sums = low_sums_c
            draw = fresh | rejected
            rnd = tl.where(rejected, rnd + 1, rnd)  # fresh rows draw round 0's uniform
            u = tl.rand(tl.load(Seed), rows.to(tl.int64) * _ROUNDS + rnd)
            next_token, next_value = _pick(base, V, low_sums, low, u, draw, BLOCK, NCHUNK)
            token = tl.where(draw, next_token.to(tl.int32), token)
            value = tl.where(draw, next_value, value)
            todo = draw & (value < high) & (rnd < _ROUNDS - 1)
            phase = tl.where(still, _SEARCH, tl.where(todo, _SAMPLE, _DONE))
            _store_state(
                f,
                i,
                busy,
                phase,
                low,
                high,
                value,
                limit,
                v,
                high_search,
                token,
                rnd,
                k,
                low_sums,
                NCHUNK,
            )
            tl.store(Out + rows, token, mask=busy & (phase == _DONE))

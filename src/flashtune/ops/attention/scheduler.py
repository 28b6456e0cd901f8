"""CPU-side work partitioning for attention over paged KV (the `plan` half of plan/run).

From sequence lengths alone, `plan_work` cuts the attention of a batch into *work items*
(request, query tile, KV range) and deals them to a fixed number of CTAs:
1. long KV ranges are split into chunks, so that a batch with few or skewed sequences
   still keeps every SM busy; the chunk size is picked among a few candidates by the
   makespan the assignment below predicts (fewer chunks means less merge traffic);
2. items are assigned longest-first to the CTA with the least accumulated cost, kept in
   a min-heap (the LPT rule), with cost = qo * query_rows + kv * kv_tokens + fixed;
3. each split request's partial results get contiguous rows in the workspace, merged in
   chunk order by a separate kernel.
Everything is a pure function of its inputs, with ties broken by item index: the same
lengths always give the same plan and the same floating-point reduction order.

A work item is one row of `WorkPlan.work` (int32), with the fields in `WORK_FIELDS`:
    qo_start   first query token of the request (row of q)
    qo_len     number of query tokens of the request
    row_start  first packed row of this tile; packed row p is (token p // group, head p % group)
    page_base  offset of the request's first page in kv_indices (kv_indptr[b])
    kv_start   first KV token of the chunk (position within the request)
    kv_end     one past its last KV token
    kv_len     the request's full KV length (queries sit at positions kv_len - qo_len + i)
    out_row    -1: write the final output; else the first partial row of this chunk
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "WORK_FIELDS",
    "NUM_WORK_FIELDS",
    "CostModel",
    "WorkPlan",
    "lpt_assign",
    "plan_work",
    "max_work_items",
]

WORK_FIELDS = (
    "qo_start",
    "qo_len",
    "row_start",
    "page_base",
    "kv_start",
    "kv_end",
    "kv_len",
    "out_row",
)
NUM_WORK_FIELDS = len(WORK_FIELDS)


@dataclass(frozen=True)
class CostModel:
    """Estimated cost of a work item, in units of one KV token read by one CTA.

    fixed=32: a work item's setup, partial write and merge read cost about as much as
    32 KV tokens (d128 bf16: a token's K+V per head is 512 B; a partial row is 2 KB
    written and read back for a group of 4, plus ~1 us of loop setup at ~40 ns/token).
    """

    qo: float = 1.0
    kv: float = 1.0
    fixed: float = 32.0

    def __call__(self, qo_rows: int, kv_tokens: int) -> float:
        return self.qo * qo_rows + self.kv * kv_tokens + self.fixed


@dataclass(frozen=True)
class WorkPlan:
    """The result of `plan_work`: work items grouped by CTA, and the merge description."""

    num_ctas: int
    work_indptr: np.ndarray  # [num_ctas + 1] int32: CTA c runs items work_indptr[c]:[c+1]
    work: np.ndarray  # [num_work, NUM_WORK_FIELDS] int32
    merge_info: np.ndarray  # [total_qo, 3] int32: (first partial row, count, stride)
    num_partial_rows: int
    kv_chunk_size: int  # 0: no request was split
    cta_cost: np.ndarray  # [num_ctas] float64: estimated cost per CTA

    @property
    def num_work(self) -> int:
        return int(self.work.shape[0])

    @property
    def has_split(self) -> bool:
        return self.num_partial_rows > 0

    @property
    def makespan(self) -> float:
        return float(self.cta_cost.max()) if self.cta_cost.size else 0.0


def lpt_assign(costs: Sequence[float] | np.ndarray, num_ctas: int) -> tuple[np.ndarray, np.ndarray]:
    """Longest-processing-time-first assignment of items to `num_ctas` CTAs.

    Returns (cta of each item, accumulated cost per CTA). Items are taken in order of
    decreasing cost (ties: lower index first) and each goes to the CTA with the least
    accumulated cost (ties: lower CTA index).

    The greedy is evaluated in rounds rather than item by item (a Python heap costs ~0.5 us
    per item, 100+ us at batch 256): with the CTAs sorted by (cost, index), the next k items
    go to the k least loaded CTAs in order, as long as every CTA already used in the round
    ends up strictly more loaded than the next CTA in line, which is exactly when the
    item-by-item greedy would make the same choices. A round stops at the first item where
    that fails; rounds that get short hand the rest to the heap, so the result is always
    the exact LPT assignment.
    """
    if num_ctas < 1:
        raise ValueError(f"num_ctas must be >= 1, got {num_ctas}")
    costs = np.asarray(costs, dtype=np.float64).reshape(-1)
    n = costs.size
    order = np.argsort(-costs, kind="stable")
    sorted_costs = costs[order]
    acc = np.zeros(num_ctas, dtype=np.float64)
    cta_sorted = np.empty(n, dtype=np.int64)
    pos = 0
    if n and sorted_costs[-1] > 0:
        # First round: every CTA is empty, so item i goes to CTA i (positive costs only: an
        # empty CTA that got a zero-cost item would still be first in line).
        pos = min(n, num_ctas)
        cta_sorted[:pos] = np.arange(pos)
        acc[:pos] = sorted_costs[:pos]
    while pos < n:
        k = min(num_ctas, n - pos)
        cand = np.argsort(acc, kind="stable")[:k]
        base = acc[cand]
        new = base + sorted_costs[pos : pos + k]
        m = k
        if k > 1:
            # Item j >= 1 keeps its CTA if every CTA updated before it is now strictly above.
            bad = np.minimum.accumulate(new[:-1]) <= base[1:]
            first = int(bad.argmax())
            if bad[first]:
                m = 1 + first
        cta_sorted[pos : pos + m] = cand[:m]
        acc[cand[:m]] = new[:m]
        pos += m
        if m < 8 and pos < n:
            pos = _lpt_heap(sorted_costs, pos, acc, cta_sorted)
    cta_of = np.empty(n, dtype=np.int64)
    cta_of[order] = cta_sorted
    return cta_of, acc


def _lpt_heap(sorted_costs: np.ndarray, pos: int, acc: np.ndarray, out: np.ndarray) -> int:
    """Item-by-item LPT from `pos` on (a min-heap of CTAs); fills out/acc, returns the end."""
    heap = [(float(a), c) for c, a in enumerate(acc.tolist())]
    heapq.heapify(heap)
    costs = sorted_costs.tolist()
    for i in range(pos, len(costs)):
        a, c = heapq.heappop(heap)
        out[i] = c
        heapq.heappush(heap, (a + costs[i], c))
    for a, c in heap:
        acc[c] = a
    return len(costs)


def max_work_items(num_ctas: int, max_tiles: int) -> int:
    """An upper bound on `plan_work`'s item count: the size of graph-mode work buffers."""
    # Chunks are never shorter than total / (4 * num_ctas), so at most 4 * num_ctas chunk
    # boundaries fall inside requests, plus one item per query tile.
    return 4 * num_ctas + max_tiles


def _align_up(x: int, a: int) -> int:
    return -(-x // a) * a


def _chunks_per_tile(length: np.ndarray, chunk: int, align: int) -> tuple[np.ndarray, np.ndarray]:
    """(number of chunks, chunk step) per tile: near-equal aligned chunks of <= `chunk` tokens."""
    n = np.where(length <= chunk, 1, -(-length // chunk))
    per = -(-length // n)  # ceil(length / n)
    step = np.where(n > 1, -(-per // align) * align, np.maximum(length, 1))
    n = np.where(length > 0, np.maximum(1, -(-length // step)), 1)
    return n, step


def plan_work(
    qo_indptr: Sequence[int] | np.ndarray,
    kv_lens: Sequence[int] | np.ndarray,
    kv_page_indptr: Sequence[int] | np.ndarray,
    num_ctas: int,
    *,
    group_size: int = 1,
    block_m: int = 16,
    kv_starts: Sequence[int] | np.ndarray | None = None,
    split_kv: bool = True,
    kv_chunk_size: int | None = None,
    chunk_align: int = 64,
    min_chunk: int = 256,
    max_work: int | None = None,
    cost: CostModel = CostModel(),
) -> WorkPlan:
    """Partition a batch's attention into work items dealt to `num_ctas` CTAs.

    qo_indptr: [B+1] query token offsets (decode: 0, 1, ..., B).
    kv_lens: [B] KV lengths; kv_page_indptr: [B+1] page offsets into kv_indices.
    group_size: query heads per KV head, packed with the query tokens into tile rows;
    block_m: rows per tile. kv_starts: [B] first KV position that any query may see (a
    sliding window); KV before it is skipped entirely. split_kv=False keeps each tile in
    one item (the unbalanced baseline); kv_chunk_size forces a chunk size.
    max_work: the most items allowed (graph mode's fixed buffers); chunk sizes giving more
    are not considered.

    Vectorized with numpy (no Python loop over requests or items): plan() runs once per
    step and, in the bundled benchmark, once per timed call.
    """
    qo_indptr = np.asarray(qo_indptr, dtype=np.int64)
    kv_lens = np.asarray(kv_lens, dtype=np.int64)
    kv_page_indptr = np.asarray(kv_page_indptr, dtype=np.int64)
    batch = kv_lens.shape[0]
    if qo_indptr.shape != (batch + 1,) or kv_page_indptr.shape != (batch + 1,):
        raise ValueError(
            f"qo_indptr and kv_page_indptr must have {batch + 1} entries (batch {batch}), got "
            f"{qo_indptr.shape[0]} and {kv_page_indptr.shape[0]}"
        )
    if num_ctas < 1 or block_m < 1 or group_size < 1 or chunk_align < 1:
        raise ValueError("num_ctas, block_m, group_size and chunk_align must be >= 1")
    starts = np.zeros(batch, np.int64) if kv_starts is None else np.asarray(kv_starts, np.int64)
    starts = np.minimum(np.maximum(starts, 0), kv_lens)
    total_qo = int(qo_indptr[-1])

    # Tiles: each request's packed rows (qo_len * group) cut into block_m-row tiles.
    qo_lens = qo_indptr[1:] - qo_indptr[:-1]
    rows = qo_lens * group_size
    ntiles = -(-rows // block_m)
    if int(ntiles.max(initial=0)) == 1 and int(ntiles.min(initial=1)) == 1:
        t_req = np.arange(batch)  # decode: one tile per request
        t_row = np.zeros(batch, np.int64)
    else:
        t_req = np.repeat(np.arange(batch), ntiles)
        first_tile = np.cumsum(ntiles) - ntiles
        t_row = (np.arange(t_req.size) - first_tile[t_req]) * block_m
    t_rows = np.minimum(block_m, rows[t_req] - t_row)
    t_ks = starts[t_req]
    t_len = kv_lens[t_req] - t_ks
    total_kv = int(t_len.sum())

    if kv_chunk_size is not None:
        candidates = [max(int(kv_chunk_size), 1)]
    elif not split_kv or total_kv == 0:
        candidates = [1 << 62]
    else:
        base = total_kv / num_ctas
        candidates = sorted(
            {_align_up(max(min_chunk, math.ceil(base / k)), chunk_align) for k in (1, 2, 4)}
        )
        candidates.append(1 << 62)  # no split at all

    # Per candidate: chunks per tile. Candidates giving the same chunk counts give the same
    # items (the step depends only on the count), so each distinct split is scored once,
    # under the index of its largest chunk (ties go to the larger chunk: fewer partials).
    t_max = int(t_len.max(initial=0))
    # One broadcast over the candidates that split something (chunk < longest range).
    cut = [c for c in candidates if c < t_max]
    if cut:
        n_all, step_all = _chunks_per_tile(t_len[None, :], np.array(cut)[:, None], chunk_align)
    splits: list[list] = []  # [candidate index, chunk, n, step]
    for ci, chunk in enumerate(candidates):
        if chunk >= t_max:
            n, step = None, None  # no tile is split
        else:
            n, step = n_all[ci], step_all[ci]  # cut is a prefix: candidates ascend
        prev = splits[-1] if splits else None
        if prev is not None and (
            (n is None and prev[2] is None)
            or (n is not None and prev[2] is not None and np.array_equal(prev[2], n))
        ):
            prev[0], prev[1] = ci, chunk  # n only shrinks as chunks grow: duplicates adjoin
            continue
        splits.append([ci, chunk, n, step])

    # Score the splits by the makespan LPT predicts, most promising first: one whose lower
    # bound (mean CTA cost, or its largest item) cannot beat the best so far is skipped.
    last_ci = len(candidates) - 1
    scored = []
    for ci, chunk, n, step in splits:
        if n is None:
            n = np.ones(t_len.size, np.int64)
            step = np.maximum(t_len, 1)
        num_items = int(n.sum())
        if max_work is not None and num_items > max_work and ci != last_ci:
            continue
        split_tiles = n > 1
        merge = int(n[split_tiles].sum()) * cost.fixed / num_ctas
        total = cost.qo * float((t_rows * n).sum()) + cost.kv * total_kv + cost.fixed * num_items
        first_len = np.minimum(step, t_len)  # a tile's first chunk is its longest
        biggest = float((cost.qo * t_rows + cost.kv * first_len).max(initial=0.0)) + cost.fixed
        bound = max(total / num_ctas, biggest) + merge
        scored.append((bound, -ci, chunk, n, step, merge))
    scored.sort(key=lambda x: (x[0], x[1]))
    best = None
    for bound, neg_ci, chunk, n, step, merge in scored:
        # 1e-9: the bound is a float mean; never skip a candidate that might tie.
        if best is not None and (
            bound * (1 - 1e-9) > best[0] or (bound >= best[0] and -neg_ci < best[1])
        ):
            continue
        # Items: tile i's chunks c = 0..n_i-1 cover [ks + c*step, min(ke, ks + (c+1)*step)).
        num_items = int(n.sum())
        if num_items == n.size:
            i_tile = np.arange(n.size)
            i_c = np.zeros(n.size, np.int64)
        else:
            i_tile = np.repeat(np.arange(n.size), n)
            i_c = np.arange(num_items) - (np.cumsum(n) - n)[i_tile]
        i_s = t_ks[i_tile] + i_c * step[i_tile]
        i_e = np.minimum(kv_lens[t_req[i_tile]], i_s + step[i_tile])
        costs = cost.qo * t_rows[i_tile] + cost.kv * (i_e - i_s) + cost.fixed
        cta_of, cta_cost = lpt_assign(costs, num_ctas)
        score = float(cta_cost.max()) + merge
        # On a tie the larger chunk (the later candidate) wins.
        if best is None or score < best[0] or (score == best[0] and -neg_ci > best[1]):
            best = (score, -neg_ci, chunk, n, i_tile, i_c, i_s, i_e, costs, cta_of, cta_cost)
    assert best is not None
    _, _, chunk, n, i_tile, i_c, i_s, i_e, costs, cta_of, cta_cost = best
    num_work = int(i_tile.size)
    if max_work is not None and num_work > max_work:
        raise ValueError(
            f"the plan needs {num_work} work items but the buffers hold {max_work}; "
            "allocate the wrapper for a larger batch"
        )

    # Partial rows: per split request, n_chunks * qo_len rows, request by request.
    req_chunks = np.ones(batch, dtype=np.int64)
    np.maximum.at(req_chunks, t_req, n)
    split = (req_chunks > 1) & (qo_lens > 0)
    part_rows = np.where(split, req_chunks * qo_lens, 0)
    part_base = np.where(split, np.cumsum(part_rows) - part_rows, -1)
    num_partial = int(part_rows.sum())
    merge_info = np.zeros((total_qo, 3), dtype=np.int32)
    if num_partial:
        tok_req = np.repeat(np.arange(batch), qo_lens)
        tok_in = np.arange(total_qo) - qo_indptr[tok_req]
        sel = split[tok_req]
        r = tok_req[sel]
        merge_info[sel, 0] = part_base[r] + tok_in[sel]
        merge_info[sel, 1] = req_chunks[r]
        merge_info[sel, 2] = qo_lens[r]

    # Items grouped by CTA; within a CTA in LPT order (longest first, ties by index).
    lpt_rank = np.empty(num_work, dtype=np.int64)
    lpt_rank[np.argsort(-costs, kind="stable")] = np.arange(num_work)
    order = np.lexsort((lpt_rank, cta_of))
    req = t_req[i_tile[order]]
    work = np.empty((num_work, NUM_WORK_FIELDS), dtype=np.int32)
    work[:, 0] = qo_indptr[req]
    work[:, 1] = qo_lens[req]
    work[:, 2] = t_row[i_tile[order]]
    work[:, 3] = kv_page_indptr[req]
    work[:, 4] = i_s[order]
    work[:, 5] = i_e[order]
    work[:, 6] = kv_lens[req]
    pb = part_base[req]
    work[:, 7] = np.where(pb < 0, -1, pb + i_c[order] * qo_lens[req])
    counts = np.bincount(cta_of, minlength=num_ctas)
    work_indptr = np.zeros(num_ctas + 1, dtype=np.int32)
    np.cumsum(counts, out=work_indptr[1:])
    return WorkPlan(
        num_ctas=num_ctas,
        work_indptr=work_indptr,
        work=work,
        merge_info=merge_info,
        num_partial_rows=num_partial,
        kv_chunk_size=int(chunk) if num_partial else 0,
        cta_cost=cta_cost,
    )

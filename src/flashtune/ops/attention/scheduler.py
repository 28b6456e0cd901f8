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


def lpt_assign(costs: Sequence[float], num_ctas: int) -> tuple[np.ndarray, np.ndarray]:
    """Longest-processing-time-first assignment of items to `num_ctas` CTAs.

    Returns (cta of each item, accumulated cost per CTA). Items are taken in order of
    decreasing cost (ties: lower index first) and each goes to the CTA with the least
    accumulated cost (ties: lower CTA index), found with a min-heap.
    """
    if num_ctas < 1:
        raise ValueError(f"num_ctas must be >= 1, got {num_ctas}")
    costs = np.asarray(costs, dtype=np.float64)
    order = np.lexsort((np.arange(costs.size), -costs))
    heap = [(0.0, c) for c in range(num_ctas)]
    cta_of = np.empty(costs.size, dtype=np.int64)
    for i in order:
        acc, c = heapq.heappop(heap)
        cta_of[i] = c
        heapq.heappush(heap, (acc + float(costs[i]), c))
    cta_cost = np.zeros(num_ctas, dtype=np.float64)
    np.add.at(cta_cost, cta_of, costs)
    return cta_of, cta_cost


def max_work_items(num_ctas: int, max_tiles: int) -> int:
    """An upper bound on `plan_work`'s item count: the size of graph-mode work buffers."""
    # Chunks are never shorter than total / (4 * num_ctas), so at most 4 * num_ctas chunk
    # boundaries fall inside requests, plus one item per query tile.
    return 4 * num_ctas + max_tiles


def _align_up(x: int, a: int) -> int:
    return -(-x // a) * a


def _build_items(
    tiles: list[tuple[int, ...]],
    chunk: int,
    align: int,
    cost: CostModel,
) -> tuple[list[tuple[int, ...]], list[float], list[int]]:
    """Split each tile's KV range into near-equal aligned chunks of at most `chunk` tokens.

    tiles: (request, qo_start, qo_len, row_start, rows, page_base, kv_start, kv_end, kv_len)
    Returns (items as (request, chunk index, qo_start, qo_len, row_start, page_base,
    kv_start, kv_end, kv_len), their costs, number of chunks per tile).
    """
    items: list[tuple[int, ...]] = []
    costs: list[float] = []
    nchunks: list[int] = []
    for req, qo_start, qo_len, row_start, rows, page_base, ks, ke, kv_len in tiles:
        length = ke - ks
        n = 1 if length <= chunk else math.ceil(length / chunk)
        step = _align_up(math.ceil(length / n), align) if n > 1 else max(length, 1)
        n = max(1, math.ceil(length / step)) if length > 0 else 1
        nchunks.append(n)
        for c in range(n):
            s = ks + c * step
            e = min(ke, s + step)
            items.append((req, c, qo_start, qo_len, row_start, page_base, s, e, kv_len))
            costs.append(cost(rows, e - s))
    return items, costs, nchunks


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

    tiles = []
    for b in range(batch):
        qo_len = int(qo_indptr[b + 1] - qo_indptr[b])
        rows = qo_len * group_size
        for row_start in range(0, rows, block_m):
            tiles.append(
                (
                    b,
                    int(qo_indptr[b]),
                    qo_len,
                    row_start,
                    min(block_m, rows - row_start),
                    int(kv_page_indptr[b]),
                    int(starts[b]),
                    int(kv_lens[b]),
                    int(kv_lens[b]),
                )
            )
    total_kv = sum(t[7] - t[6] for t in tiles)

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

    best = None
    for chunk in candidates:
        items, costs, nchunks = _build_items(tiles, chunk, chunk_align, cost)
        if max_work is not None and len(items) > max_work and chunk != candidates[-1]:
            continue
        cta_of, cta_cost = lpt_assign(costs, num_ctas)
        # Merging reads every partial once more; charge it to the makespan spread evenly.
        merge = sum(n for n in nchunks if n > 1) * cost.fixed / num_ctas
        score = float(cta_cost.max() if cta_cost.size else 0.0) + merge
        # Candidates ascend, so on a tie the larger chunk (fewer partials) wins.
        if best is None or score <= best[0]:
            best = (score, chunk, items, costs, nchunks, cta_of, cta_cost)
    assert best is not None
    _, chunk, items, costs, nchunks, cta_of, cta_cost = best
    if max_work is not None and len(items) > max_work:
        raise ValueError(
            f"the plan needs {len(items)} work items but the buffers hold {max_work}; "
            "allocate the wrapper for a larger batch"
        )

    # Partial rows: per split request, n_chunks * qo_len rows, request by request.
    req_chunks = np.ones(batch, dtype=np.int64)
    for it in items:
        req_chunks[it[0]] = max(req_chunks[it[0]], it[1] + 1)
    merge_info = np.zeros((total_qo, 3), dtype=np.int32)
    part_base = np.full(batch, -1, dtype=np.int64)
    next_row = 0
    for b in range(batch):
        n = int(req_chunks[b])
        qo_len = int(qo_indptr[b + 1] - qo_indptr[b])
        if n > 1 and qo_len > 0:
            part_base[b] = next_row
            q0 = int(qo_indptr[b])
            merge_info[q0 : q0 + qo_len, 0] = next_row + np.arange(qo_len)
            merge_info[q0 : q0 + qo_len, 1] = n
            merge_info[q0 : q0 + qo_len, 2] = qo_len
            next_row += n * qo_len

    # Items grouped by CTA; within a CTA in LPT order (longest first, ties by index).
    lpt_rank = np.empty(len(items), dtype=np.int64)
    lpt_rank[np.lexsort((np.arange(len(items)), -np.asarray(costs)))] = np.arange(len(items))
    order = np.lexsort((lpt_rank, cta_of)) if items else np.zeros(0, np.int64)
    work = np.zeros((len(items), NUM_WORK_FIELDS), dtype=np.int32)
    for row, i in enumerate(order):
        req, c, qo_start, qo_len, row_start, page_base, s, e, kv_len = items[i]
        out_row = -1 if part_base[req] < 0 else int(part_base[req]) + c * qo_len
        work[row] = (qo_start, qo_len, row_start, page_base, s, e, kv_len, out_row)
    counts = np.bincount(cta_of, minlength=num_ctas) if items else np.zeros(num_ctas, np.int64)
    work_indptr = np.zeros(num_ctas + 1, dtype=np.int32)
    work_indptr[1:] = np.cumsum(counts)
    return WorkPlan(
        num_ctas=num_ctas,
        work_indptr=work_indptr,
        work=work,
        merge_info=merge_info,
        num_partial_rows=next_row,
        kv_chunk_size=int(chunk) if next_row else 0,
        cta_cost=cta_cost,
    )

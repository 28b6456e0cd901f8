"""CPU-side work partitioning for attention over paged KV (the `plan` half of plan/run).

From sequence lengths alone, `plan_work` cuts the attention of a batch into *work items*
(request, query tile, KV range) and deals them to a fixed number of CTAs:
1. long KV ranges are split into chunks, so that a batch with few or skewed sequences
   still keeps every SM busy; the chunk size is picked among a few candidates by an
   estimate of their makespan (mean CTA cost, largest item, item granularity, merge
   traffic), and the best two are assigned for real (fewer chunks: less merge traffic);
   when every tile is small next to a CTA's fair share, nothing is split at all;
2. items are assigned longest-first to the CTA with the least accumulated cost (the LPT
   rule), with cost = qo * query_rows + kv * kv_tokens + fixed; many small unsplit items
   are dealt in a serpentine order instead (within 2% of LPT there, far fewer calls);
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
    "SplitRules",
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
class SplitRules:
    """How `plan_work` may cut KV into chunks, and what the plan's buffers hold.

    split_kv=False keeps each tile in one item (the unbalanced baseline); kv_chunk_size
    forces a chunk size; otherwise chunks are multiples of chunk_align of at least
    min_chunk tokens. max_work: the most items allowed (graph mode's fixed buffers); chunk
    sizes giving more are not considered. max_partial_rows: the most partial rows the
    workspace holds; chunk sizes needing more are replaced by the smallest chunk that fits
    (unsplit always fits).
    """

    split_kv: bool = True
    kv_chunk_size: int | None = None
    chunk_align: int = 64
    min_chunk: int = 256
    max_work: int | None = None
    max_partial_rows: int | None = None


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
    order, cta_sorted, acc = _lpt(np.asarray(costs, dtype=np.float64).reshape(-1), num_ctas)
    cta_of = np.empty(order.size, dtype=np.int64)
    cta_of[order] = cta_sorted
    return cta_of, acc


def _lpt(costs: np.ndarray, num_ctas: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`lpt_assign` in LPT order: (items by decreasing cost, CTA of each, cost per CTA)."""
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
    return order, cta_sorted, acc


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


def _snake(costs: np.ndarray, num_ctas: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A serpentine deal, `_lpt`'s outputs: items by decreasing cost go to CTAs 0..C-1, then
    C-1..0, and so on. With many near-equal items (no item above a third of the mean CTA
    load) it is within 2% of LPT on random batches, in 6 numpy calls instead of ~10 per
    round of C items."""
    order = np.argsort(-costs, kind="stable")
    i = np.arange(costs.size)
    lap, j = np.divmod(i, num_ctas)
    cta_sorted = np.where(lap & 1, num_ctas - 1 - j, j)
    acc = np.bincount(cta_sorted, weights=costs[order], minlength=num_ctas).astype(np.float64)
    return order, cta_sorted, acc


def _partial_rows(t_len: np.ndarray, t_qo: np.ndarray, chunk: int, chunk_align: int) -> int:
    """Partial rows of a split into `chunk`-token chunks: every chunk of a split request
    writes one row per query token (t_qo: the request's qo_len on its first tile, else 0)."""
    n, _ = _chunks_per_tile(t_len, chunk, chunk_align)
    return int(t_qo @ np.where(n > 1, n, 0))


def _fit_partial_rows(
    candidates: list[int],
    t_len: np.ndarray,
    t_qo: np.ndarray,
    chunk_align: int,
    max_partial_rows: int,
    forced: bool,
) -> list[int]:
    """The chunk candidates whose partial rows fit in `max_partial_rows`, plus the smallest
    aligned chunk that fits when some did not (more partials than the workspace holds would
    otherwise fail the plan; a coarser split still balances better than none). `forced`: the
    caller fixed the chunk size, so one that does not fit is an error, not replaced."""
    rows = [_partial_rows(t_len, t_qo, c, chunk_align) for c in candidates]
    keep = [c for c, r in zip(candidates, rows, strict=True) if r <= max_partial_rows]
    if len(keep) == len(candidates):
        return candidates
    if forced:
        raise ValueError(
            f"a KV chunk of {candidates[0]} tokens needs {rows[0]} partial rows but the "
            f"workspace (or a CUDA-graph wrapper's fixed buffers) holds {max_partial_rows}; "
            "use a larger split size or workspace"
        )
    # Partial rows only shrink as chunks grow, so the chunks that fit lie above every
    # dropped one: bisect on multiples of the alignment, up to the longest tile (unsplit).
    lo = max(c for c in candidates if c not in keep) // chunk_align + 1
    hi = max(lo, -(-int(t_len.max()) // chunk_align))
    while lo < hi:
        mid = (lo + hi) // 2
        if _partial_rows(t_len, t_qo, mid * chunk_align, chunk_align) <= max_partial_rows:
            hi = mid
        else:
            lo = mid + 1
    fit = lo * chunk_align
    if fit < int(t_len.max()) and fit not in keep:
        keep = sorted([fit, *keep])
    return keep


def max_work_items(num_ctas: int, max_tiles: int) -> int:
    """An upper bound on `plan_work`'s item count: the size of graph-mode work buffers."""
    # Chunks are never shorter than total / (4 * num_ctas), so at most 4 * num_ctas chunk
    # boundaries fall inside requests, plus one item per query tile.
    return 4 * num_ctas + max_tiles


def _align_up(x: int, a: int) -> int:
    return -(-x // a) * a


def _chunks_per_tile(
    length: np.ndarray, chunk: int | np.ndarray, align: int
) -> tuple[np.ndarray, np.ndarray]:
    """(number of chunks, chunk step) per tile: near-equal aligned chunks of <= `chunk` tokens
    (an array of chunk sizes broadcasts: one row per size)."""
    n = np.where(length <= chunk, 1, -(-length // chunk))
    per = -(-length // n)  # ceil(length / n)
    step = np.where(n > 1, -(-per // align) * align, np.maximum(length, 1))
    n = np.where(length > 0, np.maximum(1, -(-length // step)), 1)
    return n, step


_SMALL_TILES = 16  # up to this many tiles, the candidates are ranked in plain Python


def _rank(
    t_len: np.ndarray,
    t_rows: np.ndarray,
    t_cost: np.ndarray,
    t_sum: float,
    t_cost_max: float,
    candidates: list[int],
    num_ctas: int,
    chunk_align: int,
    max_work: int | None,
    cost: CostModel,
) -> list[tuple]:
    """The distinct splits of `plan_work`'s candidates with their makespan estimates:
    (estimate, -candidate index, chunk, n (None: unsplit), step, merge, lower bound)."""
    total_kv = int(t_len.sum())
    t_max = int(t_len.max(initial=0))
    # Per candidate: chunks per tile. Candidates giving the same chunk counts give the same
    # items (the step depends only on the count), so each distinct split is kept once,
    # under its largest chunk (ties go to the larger chunk: fewer partials).
    cut = [c for c in candidates if c < t_max]  # a prefix: candidates ascend
    if cut:
        n_all, step_all = _chunks_per_tile(t_len[None, :], np.array(cut)[:, None], chunk_align)
    splits: list[list] = []  # [candidate index, chunk, n (None: unsplit), step]
    for ci, chunk in enumerate(candidates):
        n, step = (n_all[ci], step_all[ci]) if chunk < t_max else (None, None)
        prev = splits[-1] if splits else None
        if prev is not None and (
            (n is None and prev[2] is None)
            or (n is not None and prev[2] is not None and np.array_equal(prev[2], n))
        ):
            prev[0], prev[1] = ci, chunk  # n only shrinks as chunks grow: duplicates adjoin
            continue
        splits.append([ci, chunk, n, step])

    # Rank the splits by an estimate of their makespan instead of running LPT on each (a
    # numpy call costs ~1 us, an LPT pass tens of them): the largest of the mean CTA cost,
    # the largest item, and a granularity bound (among the k*C + 1 largest items, some CTA
    # gets k + 1 of them), plus the merge traffic. Only the best two are assigned for real
    # (on random batches at 49-66 CTAs, the best of two is within 4% of the best of all
    # candidates, and equal on most). (A [K, T] broadcast over all candidates at once was
    # measured slower: numpy's axis reductions cost more per call.)
    last_ci = len(candidates) - 1
    scored: list[tuple] = []
    for ci, chunk, n, step in splits:
        if len(splits) == 1:
            scored.append((0.0, -ci, chunk, n, step, 0.0, 0.0))  # nothing to choose from
            break
        if n is None:
            num_items, merge = t_len.size, 0.0
            est = max(t_sum / num_ctas, t_cost_max)
            item_cost = t_cost
        else:
            num_items = int(n.sum())
            if max_work is not None and num_items > max_work and ci != last_ci:
                continue
            merge = (num_items - int(np.count_nonzero(n == 1))) * cost.fixed / num_ctas
            total = cost.qo * float(t_rows @ n) + cost.kv * total_kv + cost.fixed * num_items
            first = np.minimum(step, t_len)  # a tile's first chunk is its longest
            biggest = float((cost.qo * t_rows + cost.kv * first).max()) + cost.fixed
            est = max(total / num_ctas, biggest)
            if num_items > num_ctas:
                # Chunks of a tile are near-equal: its mean chunk stands for each of them.
                item_cost = np.repeat(cost.qo * t_rows + cost.kv * t_len / n + cost.fixed, n)
        bound = est + merge  # a true lower bound of the LPT score
        if num_items > num_ctas:
            srt = np.sort(item_cost)[::-1][num_ctas::num_ctas]  # the (kC+1)-th largest
            est = max(est, float((srt * np.arange(2, srt.size + 2)).max()))
        scored.append((est + merge, -ci, chunk, n, step, merge, bound))
    return scored


def _rank_small(
    t_len: list[int],
    t_rows: list[int],
    candidates: list[int],
    num_ctas: int,
    chunk_align: int,
    max_work: int | None,
    cost: CostModel,
) -> list[tuple]:
    """`_rank` for a few tiles, in plain Python (decode at batch 1-16: ~20 numpy calls of
    ~1 us each become list arithmetic). Same estimates, same output."""
    total_kv = sum(t_len)
    t_max = max(t_len)
    last_ci = len(candidates) - 1
    splits: list[list] = []
    n: list[int] | None
    step: list[int] | None
    for ci, chunk in enumerate(candidates):
        if chunk >= t_max:
            n = step = None
        else:
            n, step = [], []
            for length in t_len:
                k = 1 if length <= chunk else -(-length // chunk)
                st = _align_up(-(-length // k), chunk_align) if k > 1 else max(length, 1)
                n.append(max(1, -(-length // st)) if length > 0 else 1)
                step.append(st)
        prev = splits[-1] if splits else None
        if prev is not None and (
            (n is None and prev[2] is None) or (n is not None and prev[2] == n)
        ):
            prev[0], prev[1] = ci, chunk
            continue
        splits.append([ci, chunk, n, step])
    scored: list[tuple] = []
    for ci, chunk, n, step in splits:
        if len(splits) == 1:
            scored.append(
                (
                    0.0,
                    -ci,
                    chunk,
                    None if n is None else np.array(n, np.int64),
                    None if step is None else np.array(step, np.int64),
                    0.0,
                    0.0,
                )
            )
            break
        if n is None:
            n, step = [1] * len(t_len), [max(x, 1) for x in t_len]
            unsplit = True
        else:
            unsplit = False
        num_items = sum(n)
        if not unsplit and max_work is not None and num_items > max_work and ci != last_ci:
            continue
        merge = 0.0 if unsplit else (num_items - n.count(1)) * cost.fixed / num_ctas
        if unsplit:
            t_cost = [
                cost.qo * r + cost.kv * x + cost.fixed for r, x in zip(t_rows, t_len, strict=True)
            ]
            est = max(sum(t_cost) / num_ctas, max(t_cost))
            means = t_cost
        else:
            total = cost.qo * float(sum(r * k for r, k in zip(t_rows, n, strict=True)))
            total += cost.kv * total_kv + cost.fixed * num_items
            biggest = max(
                cost.qo * r + cost.kv * min(st, x)
                for r, st, x in zip(t_rows, step, t_len, strict=True)
            )
            est = max(total / num_ctas, biggest + cost.fixed)
            means = [
                cost.qo * r + cost.kv * x / k + cost.fixed
                for r, x, k in zip(t_rows, t_len, n, strict=True)
            ]
        bound = est + merge
        if num_items > num_ctas:
            # The (kC+1)-th largest item cost, k >= 1, walking the tiles by mean chunk cost.
            ranked = sorted(zip(means, n, strict=True), reverse=True)
            pos, mark, k = 0, num_ctas, 1
            for value, count in ranked:
                pos += count
                while mark < pos and mark < num_items:
                    est = max(est, (k + 1) * value)
                    k += 1
                    mark += num_ctas
        scored.append(
            (
                est + merge,
                -ci,
                chunk,
                None if unsplit else np.array(n, np.int64),
                None if unsplit else np.array(step, np.int64),
                merge,
                bound,
            )
        )
    return scored


def plan_work(
    qo_indptr: Sequence[int] | np.ndarray,
    kv_lens: Sequence[int] | np.ndarray,
    kv_page_indptr: Sequence[int] | np.ndarray,
    num_ctas: int,
    *,
    group_size: int = 1,
    block_m: int = 16,
    kv_starts: Sequence[int] | np.ndarray | None = None,
    rules: SplitRules = SplitRules(),
    cost: CostModel = CostModel(),
) -> WorkPlan:
    """Partition a batch's attention into work items dealt to `num_ctas` CTAs.

    qo_indptr: [B+1] query token offsets (decode: 0, 1, ..., B).
    kv_lens: [B] KV lengths; kv_page_indptr: [B+1] page offsets into kv_indices.
    group_size: query heads per KV head, packed with the query tokens into tile rows;
    block_m: rows per tile. kv_starts: [B] first KV position that any query may see (a
    sliding window); KV before it is skipped entirely. rules: how KV may be split, and the
    limits of the plan's buffers (SplitRules).

    Vectorized with numpy (no Python loop over requests or items): plan() runs once per
    step and, in the bundled benchmark, once per timed call, and each numpy call costs about
    a microsecond, so the code counts calls: the chunk size is chosen by an estimate and
    only the one or two best candidates run the LPT assignment.
    """
    split_kv, kv_chunk_size, chunk_align = rules.split_kv, rules.kv_chunk_size, rules.chunk_align
    min_chunk, max_work, max_partial_rows = rules.min_chunk, rules.max_work, rules.max_partial_rows
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
    total_qo = int(qo_indptr[-1])

    # Tiles: each request's packed rows (qo_len * group) cut into block_m-row tiles.
    qo_lens = qo_indptr[1:] - qo_indptr[:-1]
    rows = qo_lens * group_size
    ntiles = -(-rows // block_m)
    one_tile = batch > 0 and int(rows.max()) <= block_m and int(rows.min()) >= 1
    if one_tile:
        t_req = np.arange(batch)  # decode: one tile per request
        t_row = np.zeros(batch, np.int64)
        t_rows = rows
    else:
        t_req = np.repeat(np.arange(batch), ntiles)
        first_tile = np.cumsum(ntiles) - ntiles
        t_row = (np.arange(t_req.size) - first_tile[t_req]) * block_m
        t_rows = np.minimum(block_m, rows[t_req] - t_row)
    if kv_starts is None:
        t_ks = np.zeros(t_req.size, np.int64)
        t_len = kv_lens[t_req] if not one_tile else kv_lens
    else:
        starts = np.minimum(np.maximum(np.asarray(kv_starts, np.int64), 0), kv_lens)
        t_ks = starts[t_req]
        t_len = kv_lens[t_req] - t_ks
    t_end = t_ks + t_len
    total_kv = int(t_len.sum())
    t_cost = cost.qo * t_rows + cost.kv * t_len + cost.fixed
    t_sum = float(t_cost.sum())
    t_cost_max = float(t_cost.max(initial=0.0))

    no_split = 1 << 62
    # No tile costs more than a third of a CTA's fair share: without a split, any greedy
    # deal is within 4/3 of the mean, and splitting would mostly add items and merge traffic.
    fine_grained = t_len.size >= num_ctas and t_cost_max * num_ctas * 3 <= t_sum
    if kv_chunk_size is not None:
        candidates = [max(int(kv_chunk_size), 1)]
    elif not split_kv or total_kv == 0 or fine_grained:
        candidates = [no_split]
    else:
        base = total_kv / num_ctas
        candidates = sorted(
            {_align_up(max(min_chunk, math.ceil(base / k)), chunk_align) for k in (1, 2, 4)}
        )
        candidates.append(no_split)
    if max_partial_rows is not None and candidates[0] != no_split:
        # Chunks of >= c tokens give a request at most kv_len // c + 1 partial sets of qo_len
        # rows each: when that bound fits, no candidate needs checking (decode, mostly).
        qo_max = 1 if one_tile and total_qo == batch else int(qo_lens.max())
        req_kv = total_kv if one_tile else int(kv_lens.sum())
        if qo_max * (req_kv // candidates[0] + batch) > max_partial_rows:
            t_qo = qo_lens if one_tile else np.where(t_row == 0, qo_lens[t_req], 0)
            candidates = _fit_partial_rows(
                candidates, t_len, t_qo, chunk_align, max_partial_rows, kv_chunk_size is not None
            )

    if len(candidates) > 1 and t_len.size <= _SMALL_TILES:
        scored = _rank_small(
            t_len.tolist(), t_rows.tolist(), candidates, num_ctas, chunk_align, max_work, cost
        )
    else:
        scored = _rank(
            t_len,
            t_rows,
            t_cost,
            t_sum,
            t_cost_max,
            candidates,
            num_ctas,
            chunk_align,
            max_work,
            cost,
        )
    scored.sort(key=lambda x: (x[0], x[1]))  # ties: the larger chunk
    best = None
    for rank, (_, neg_ci, chunk, n, step, merge, bound) in enumerate(scored):
        if rank > 1:
            break
        # The runner-up is skipped when its lower bound (mean CTA cost or largest item, plus
        # merge) cannot beat the best score. 1e-9: never skip one that might tie.
        if best is not None and (
            bound * (1 - 1e-9) > best[0] or (bound >= best[0] and -neg_ci < best[1])
        ):
            break
        if n is None:  # unsplit: one item per tile
            i_tile = i_c = None
            i_s, i_e, costs = t_ks, t_end, t_cost
        else:
            # Tile i's chunks c = 0..n_i-1 cover [ks + c*step, min(ke, ks + (c+1)*step)).
            num_items = int(n.sum())
            i_tile = np.repeat(np.arange(n.size), n)
            i_c = np.arange(num_items) - (np.cumsum(n) - n)[i_tile]
            i_s = t_ks[i_tile] + i_c * step[i_tile]
            i_e = np.minimum(t_end[i_tile], i_s + step[i_tile])
            costs = cost.qo * t_rows[i_tile] + cost.kv * (i_e - i_s) + cost.fixed
        if n is None and fine_grained:
            order, cta_sorted, cta_cost = _snake(costs, num_ctas)
        else:
            order, cta_sorted, cta_cost = _lpt(costs, num_ctas)
        score = float(cta_cost.max(initial=0.0)) + merge
        if best is None or score < best[0] or (score == best[0] and -neg_ci > best[1]):
            best = (score, -neg_ci, chunk, n, i_tile, i_c, i_s, i_e, order, cta_sorted, cta_cost)
    assert best is not None
    _, _, chunk, n, i_tile, i_c, i_s, i_e, order, cta_sorted, cta_cost = best
    num_work = int(order.size)
    if max_work is not None and num_work > max_work:
        raise ValueError(
            f"the plan needs {num_work} work items but the buffers hold {max_work}; "
            "allocate the wrapper for a larger batch"
        )

    # Items grouped by CTA; within a CTA in LPT order (longest first, ties by index): a
    # stable sort of the CTA of each LPT position (a radix sort on 16-bit CTA ids).
    ctas = cta_sorted.astype(np.uint16) if num_ctas <= 1 << 16 else cta_sorted
    item = order[np.argsort(ctas, kind="stable")]
    work_indptr = np.zeros(num_ctas + 1, dtype=np.int32)
    np.cumsum(np.bincount(cta_sorted, minlength=num_ctas), out=work_indptr[1:])
    # The per-request fields, gathered once per item.
    per_req = np.empty((batch, NUM_WORK_FIELDS), dtype=np.int32)
    per_req[:, 0] = qo_indptr[:-1]
    per_req[:, 1] = qo_lens
    per_req[:, 3] = kv_page_indptr[:-1]
    per_req[:, 6] = kv_lens
    tile = item if i_tile is None else i_tile[item]
    work = per_req[t_req[tile]] if not one_tile else per_req[tile]
    work[:, 2] = 0 if one_tile else t_row[tile]
    work[:, 4] = i_s[item]
    work[:, 5] = i_e[item]

    if n is None or int(n.max()) == 1:
        work[:, 7] = -1
        merge_info = np.zeros((total_qo, 3), dtype=np.int32)
        num_partial = 0
    elif one_tile and total_qo == batch:
        # Decode (one query, one tile per request): the general case below, per request.
        assert i_c is not None  # split: every item has its chunk index
        split = n > 1
        part_rows = n * split
        part_base = np.where(split, np.cumsum(part_rows) - part_rows, -1)
        num_partial = int(part_rows.sum())
        merge_info = np.empty((total_qo, 3), dtype=np.int32)
        merge_info[:, 0] = np.where(split, part_base, 0)
        merge_info[:, 1] = part_rows
        merge_info[:, 2] = split
        pb = part_base[tile]
        work[:, 7] = np.where(pb < 0, -1, pb + i_c[item])
    else:
        # Partial rows: per split request, n_chunks * qo_len rows, request by request.
        assert i_c is not None  # split: every item has its chunk index
        req_chunks = n if one_tile else np.ones(batch, dtype=np.int64)
        if not one_tile:
            np.maximum.at(req_chunks, t_req, n)
        split = (req_chunks > 1) & (qo_lens > 0)
        part_rows = np.where(split, req_chunks * qo_lens, 0)
        part_base = np.where(split, np.cumsum(part_rows) - part_rows, -1)
        num_partial = int(part_rows.sum())
        merge_info = np.zeros((total_qo, 3), dtype=np.int32)
        tok_req = np.repeat(np.arange(batch), qo_lens)
        tok_in = np.arange(total_qo) - qo_indptr[tok_req]
        sel = split[tok_req]
        r = tok_req[sel]
        merge_info[sel, 0] = part_base[r] + tok_in[sel]
        merge_info[sel, 1] = req_chunks[r]
        merge_info[sel, 2] = qo_lens[r]
        req = t_req[tile]
        pb = part_base[req]
        work[:, 7] = np.where(pb < 0, -1, pb + i_c[item] * qo_lens[req])
    # _fit_partial_rows kept only the chunks that fit.
    assert max_partial_rows is None or num_partial <= max_partial_rows
    return WorkPlan(
        num_ctas=num_ctas,
        work_indptr=work_indptr,
        work=work,
        merge_info=merge_info,
        num_partial_rows=num_partial,
        kv_chunk_size=int(chunk) if num_partial else 0,
        cta_cost=cta_cost,
    )

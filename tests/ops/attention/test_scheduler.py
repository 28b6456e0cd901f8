"""The CPU scheduler: coverage, determinism, balance and graph-mode bounds."""

from __future__ import annotations

import numpy as np
import pytest

from flashtune.ops.attention.scheduler import SplitRules, lpt_assign, max_work_items, plan_work


def _coverage(plan, kv_lens, qo_indptr, group, block_m, kv_starts=None):
    """Each (tile, KV token) is in exactly one item; merge rows match the split requests."""
    seen: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for row in plan.work:
        qo_start, qo_len, row_start, _, s, e, kv_len, out_row = (int(x) for x in row)
        seen.setdefault((qo_start, row_start), []).append((s, e))
    for b, n in enumerate(kv_lens):
        qo_len = qo_indptr[b + 1] - qo_indptr[b]
        start = 0 if kv_starts is None else kv_starts[b]
        for row_start in range(0, qo_len * group, block_m):
            ranges = sorted(seen.pop((int(qo_indptr[b]), row_start)))
            assert ranges[0][0] == start and ranges[-1][1] == n
            assert all(a[1] == b_[0] for a, b_ in zip(ranges, ranges[1:], strict=False))
    assert not seen


@pytest.mark.parametrize(
    "kv_lens",
    [[512] * 64, [32768] + [512] * 63, [0, 1, 5, 0], [100000], list(range(0, 3000, 37))],
)
def test_plan_covers_every_token_once(kv_lens):
    b = len(kv_lens)
    qo = np.arange(b + 1)
    plan = plan_work(qo, kv_lens, np.zeros(b + 1, np.int64), 33, group_size=4, block_m=16)
    _coverage(plan, kv_lens, qo, 4, 16)
    assert plan.work_indptr[-1] == plan.num_work
    # Partial rows are exactly those of split requests, one per chunk.
    counts = plan.merge_info[:, 1]
    assert plan.num_partial_rows == counts.sum()
    assert all(c != 1 for c in counts)


def test_plan_is_deterministic():
    lens = np.random.default_rng(0).integers(0, 20000, 100)
    a = plan_work(np.arange(101), lens, np.arange(101), 66, group_size=4)
    b = plan_work(np.arange(101), lens, np.arange(101), 66, group_size=4)
    assert np.array_equal(a.work, b.work) and np.array_equal(a.work_indptr, b.work_indptr)
    assert np.array_equal(a.merge_info, b.merge_info)


def test_skewed_batch_is_balanced():
    lens = [32768] + [512] * 63
    qo, ip = np.arange(65), np.zeros(65, np.int64)
    balanced = plan_work(qo, lens, ip, 33, group_size=4)
    unsplit = plan_work(qo, lens, ip, 33, group_size=4, rules=SplitRules(split_kv=False))
    ideal = sum(lens) / 33
    assert balanced.has_split and not unsplit.has_split
    assert balanced.makespan < 1.5 * ideal
    assert unsplit.makespan > 3 * balanced.makespan


def test_uniform_batch_is_not_split():
    lens = [8192] * 256
    plan = plan_work(np.arange(257), lens, np.zeros(257, np.int64), 66, group_size=4)
    assert not plan.has_split and plan.num_work == 256


def test_window_trims_ranges_and_multi_query_tiles():
    lens, starts = [1000, 50, 3000], [900, 0, 2000]
    qo = np.array([0, 40, 41, 43])
    plan = plan_work(qo, lens, np.zeros(4, np.int64), 8, group_size=4, block_m=64, kv_starts=starts)
    _coverage(plan, lens, qo, 4, 64, kv_starts=starts)


def test_max_work_bound_holds():
    rng = np.random.default_rng(1)
    for _ in range(20):
        b = int(rng.integers(1, 300))
        lens = rng.integers(0, 40000, b)
        plan = plan_work(
            np.arange(b + 1),
            lens,
            np.zeros(b + 1, np.int64),
            33,
            group_size=4,
            rules=SplitRules(max_work=max_work_items(33, b)),
        )
        assert plan.num_work <= max_work_items(33, b)


def test_lpt_assign():
    cta, cost = lpt_assign([5, 5, 4, 3, 3, 3], 2)
    assert sorted(cost.tolist()) == [11, 12]
    assert lpt_assign([1, 1, 1], 3)[0].tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        lpt_assign([1], 0)


def _lpt_heap_reference(costs, num_ctas):
    """The item-by-item LPT greedy with a heap: what lpt_assign's rounds must reproduce."""
    import heapq

    costs = np.asarray(costs, dtype=np.float64)
    heap = [(0.0, c) for c in range(num_ctas)]
    cta_of = np.empty(costs.size, dtype=np.int64)
    for i in np.argsort(-costs, kind="stable"):
        acc, c = heapq.heappop(heap)
        cta_of[i] = c
        heapq.heappush(heap, (acc + float(costs[i]), c))
    return cta_of


@pytest.mark.parametrize("kind", ["spread", "few_values", "equal", "with_zeros"])
def test_lpt_rounds_match_the_heap_greedy(kind):
    rng = np.random.default_rng(len(kind))
    for _ in range(40):
        n, ctas = int(rng.integers(0, 300)), int(rng.integers(1, 70))
        costs = {
            "spread": rng.integers(1, 5000, n),
            "few_values": rng.integers(1, 4, n) * 32,
            "equal": np.full(n, 7),
            "with_zeros": rng.integers(0, 3, n),
        }[kind].astype(np.float64)
        cta, acc = lpt_assign(costs, ctas)
        assert np.array_equal(cta, _lpt_heap_reference(costs, ctas))
        assert np.array_equal(acc, np.bincount(cta, weights=costs, minlength=ctas))


def test_long_request_is_spread_over_many_ctas():
    # H100/H200 decode at d128 / 8 KV heads schedules ~49-66 CTAs: a 32k request among
    # 63 short ones must still be split over >= 32 of them, with the CTAs near-balanced.
    lens = [32768] + [512] * 63
    qo, ip = np.arange(65), np.zeros(65, np.int64)
    plan = plan_work(qo, lens, ip, 66, group_size=4, rules=SplitRules(min_chunk=256))
    cta_of_item = np.repeat(np.arange(66), np.diff(plan.work_indptr))
    long_ctas = set(cta_of_item[plan.work[:, 0] == 0].tolist())
    assert len(long_ctas) >= 32
    assert plan.makespan <= 1.3 * plan.cta_cost.mean()


def test_uniform_large_batch_takes_the_no_split_fast_path():
    lens = np.full(256, 2048)
    plan = plan_work(np.arange(257), lens, np.zeros(257, np.int64), 49, group_size=4)
    assert not plan.has_split and plan.num_work == 256
    assert plan.makespan <= 4 / 3 * plan.cta_cost.mean()


def test_partial_rows_are_capped_and_a_coarser_split_still_balances():
    # One request of 600 queries over 2048 keys (a shared prefix in a cascade): every KV
    # chunk adds 600 partial rows. With room for 3000 rows the plan may not exceed it, but
    # still splits (into at most 5 chunks) instead of giving up on splitting.
    qo, lens, ip = np.array([0, 600]), [2048], np.zeros(2, np.int64)
    free = plan_work(qo, lens, ip, 66, group_size=1, block_m=64)
    assert free.num_partial_rows > 3000
    capped = plan_work(
        qo, lens, ip, 66, group_size=1, block_m=64, rules=SplitRules(max_partial_rows=3000)
    )
    _coverage(capped, lens, qo, 1, 64)
    assert 0 < capped.num_partial_rows <= 3000
    assert capped.merge_info[:, 1].max() > 1
    # No room for any split: one item per tile, nothing to merge.
    none = plan_work(
        qo, lens, ip, 66, group_size=1, block_m=64, rules=SplitRules(max_partial_rows=599)
    )
    _coverage(none, lens, qo, 1, 64)
    assert not none.has_split


def test_partial_rows_cap_keeps_decode_plans_that_fit():
    lens = [32768] + [512] * 63
    qo, ip = np.arange(65), np.zeros(65, np.int64)
    free = plan_work(qo, lens, ip, 66, group_size=4)
    capped = plan_work(
        qo, lens, ip, 66, group_size=4, rules=SplitRules(max_partial_rows=free.num_partial_rows)
    )
    assert np.array_equal(free.work, capped.work)
    assert np.array_equal(free.merge_info, capped.merge_info)


def test_fixed_chunk_that_needs_more_partial_rows_than_fit_is_an_error():
    qo, lens, ip = np.array([0, 600]), [2048], np.zeros(2, np.int64)
    with pytest.raises(ValueError, match="partial rows"):
        plan_work(
            qo, lens, ip, 66, block_m=64, rules=SplitRules(kv_chunk_size=256, max_partial_rows=1000)
        )

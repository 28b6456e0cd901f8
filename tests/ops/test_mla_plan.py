"""MLA's host plan (no kernel runs): causal sub-requests keep every query's position, the
work items cover each query row's visible keys exactly once, and bad tables and CUDA-graph
limits raise errors that name what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashtune.ops.mla.config import MLALaunch, planless_chunk
from flashtune.ops.mla.plan import (
    MLAParams,
    MLAPlanner,
    MLATables,
    SplitPolicy,
    causal_subrequests,
    validate_tables,
)

H = 16


def _tables(qo_lens, kv_lens, page_size=1):
    qo = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int64)
    pages = -(-np.asarray(kv_lens, np.int64) // page_size)
    kv = np.concatenate([[0], np.cumsum(pages)]).astype(np.int64)
    return MLATables(qo, kv, np.asarray(kv_lens, np.int64), int(kv[-1]))


def _params(causal=True, page_size=1):
    return MLAParams(H, 512, 64, page_size, causal, 0.1, torch.bfloat16, torch.bfloat16)


def test_causal_subrequests_keep_positions():
    tables = _tables([9, 1, 3], [50, 7, 2])
    qo, kv, pages = causal_subrequests(tables, H, 64)  # 4 tokens a tile
    assert qo.tolist() == [0, 4, 8, 9, 10, 13]
    # Sub-request j's queries sit at kv_j - qo_j + i: the positions they have in the request.
    assert kv.tolist() == [45, 49, 50, 7, 2]
    assert pages[:-1].tolist() == [0, 0, 0, 50, 57]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("split", [None, 64])
def test_work_items_cover_each_row_once(causal, split):
    rng = np.random.default_rng(0)
    qo_lens = [1, 1, 9, 3, 0, 20, 2]
    kv_lens = [0, 700, 300, 2, 40, 1000, 129]
    tables = _tables(qo_lens, kv_lens, page_size=16)
    planner = MLAPlanner(torch.empty(1 << 24, dtype=torch.uint8))
    indices = torch.from_numpy(rng.permutation(tables.num_indices).astype(np.int32))
    plan = planner.make(tables, indices, _params(causal, 16), SplitPolicy(fixed_split_size=split),
                        MLALaunch(sm_count=8))  # fmt: skip
    seen: dict[tuple[int, int], list[tuple[int, int]]] = {}
    work = plan.host.work
    for item in work:
        qo_start, qo_len, row_start, _, kv_start, kv_end, kv_len, _ = item.tolist()
        for p in range(row_start, min(row_start + plan.block_m, qo_len * H)):
            tok, head = qo_start + p // H, p % H
            hi = min(kv_end, kv_len - qo_len + p // H + 1) if causal else kv_end
            seen.setdefault((tok, head), []).append((kv_start, max(kv_start, hi)))
    for b, (qs, qe) in enumerate(zip(tables.qo_indptr[:-1], tables.qo_indptr[1:], strict=True)):
        for tok in range(qs, qe):
            visible = kv_lens[b] - (qe - tok - 1) if causal else kv_lens[b]
            for head in range(H):
                spans = sorted(seen[(tok, head)])
                covered = [t for s, e in spans for t in range(s, e)]
                assert covered == list(range(max(visible, 0)))  # each key once, in order


def test_bad_tables_are_named():
    with pytest.raises(ValueError, match="kv_indptr must be non-negative and non-decreasing"):
        validate_tables(MLATables(np.array([0, 1]), np.array([0, -1]), np.array([0]), 0), 1)
    with pytest.raises(ValueError, match=r"kv_indptr\[-1\] = 4 but kv_indices has 3"):
        validate_tables(MLATables(np.array([0, 1]), np.array([0, 4]), np.array([4]), 3), 1)
    with pytest.raises(ValueError, match="batch_size \\+ 1 = 2"):
        validate_tables(MLATables(np.array([0, 1, 2]), np.array([0, 4]), np.array([4]), 4), 1)


def test_cuda_graph_planner_limits():
    tables = _tables([1, 1], [100, 5])
    indices = torch.arange(tables.num_indices, dtype=torch.int32)
    planner = MLAPlanner(
        torch.empty(1 << 24, dtype=torch.uint8), True, torch.empty(4096, dtype=torch.int32), 2
    )
    planner.make(tables, indices, _params())
    with pytest.raises(ValueError, match="built for batch_size 2"):
        planner.make(_tables([1], [3]), indices, _params())
    with pytest.raises(ValueError, match="at most 2"):
        planner.make(_tables([2, 1], [100, 5]), indices, _params())
    with pytest.raises(ValueError, match="holds 4096"):
        planner.make(tables, torch.arange(5000, dtype=torch.int32), _params())


def test_workspace_too_small():
    planner = MLAPlanner(torch.empty(64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="workspace_buffer holds 64 bytes"):
        planner.make(_tables([1] * 4, [10] * 4), torch.arange(40, dtype=torch.int32), _params())


def test_planless_chunk_spreads_long_requests():
    # Batch 2 of 32k tokens on 132 slots: chunks short enough to fill the GPU.
    chunk, programs = planless_chunk(2, 65536, 1, 132, 64, 64)
    assert chunk % 64 == 0 and 2 * -(-32768 // chunk) >= 64
    assert programs == -(-65536 // chunk) + 2
    # Many short requests: one chunk each.
    chunk, _ = planless_chunk(256, 256 * 512, 1, 264, 64, 256)
    assert chunk >= 512


@pytest.mark.parametrize(
    "batch,kv_len,chunk",
    [(8, 1024, 64), (16, 1024, 128), (16, 4096, 512), (32, 1024, 256), (64, 1024, 512)],
)
def test_the_chunk_fills_the_sms_at_16_tiles(batch, kv_len, chunk):
    """16 heads on 132 SMs, measured on an H200 (bench_mla.py --only sweep-chunk): b16 x 1k
    in 128-token chunks (20.7 us; 24.1 in 256-token chunks that fill 64 of the SMs); the
    plan's own choice was already the fastest at the other shapes."""
    from flashtune.ops.mla import BatchMLAPagedAttentionWrapper

    pages = -(-kv_len // 64)
    w = BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8))
    w.plan(torch.arange(batch + 1, dtype=torch.int32),
           torch.arange(batch + 1, dtype=torch.int32) * pages,
           torch.arange(batch * pages, dtype=torch.int32),
           torch.full((batch,), kv_len, dtype=torch.int32), 16, 512, 64, 64, True, 0.1,
           torch.bfloat16, torch.bfloat16, launch=MLALaunch(sm_count=132, max_ctas_per_sm=1))  # fmt: skip
    assert w._planner.plan.host.kv_chunk_size == chunk

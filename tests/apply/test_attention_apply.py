"""Apply on flashtune's attention ops: the planned wrappers' run, the prefill ops behind them
and the plan-free calls dispatch to a planted winner with their own return conventions."""

from __future__ import annotations

from pathlib import Path

import torch
from _apply_helpers import add_traces, plant, trace

from flashtune.apply import enable_apply
from flashtune.data import Dataset
from flashtune.ops.attention import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    paged_decode,
)
from flashtune.ops.attention.page import build_page_table
from flashtune.ops.attention.prefill import gqa_paged_prefill, gqa_ragged_prefill

# The planted winner's output depends on the page table it was given (its length), so a
# test sees whether a re-planned wrapper's new table reached the solution.
DECODE_SRC = """CALLS = []

def run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    CALLS.append(int(kv_indices.numel()))
    return q * kv_indices.numel(), q[..., 0].float() + sm_scale
"""

PREFILL_PAGED_SRC = """
def run(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    return q * 2, q[..., 0].float()
"""

PREFILL_RAGGED_SRC = """
def run(q, k, v, qo_indptr, kv_indptr, sm_scale):
    return q * 3, q[..., 1].float()
"""


def _table(lens: list[int]):
    indptr, indices, last, n = build_page_table(lens, 16)
    return (indptr, indices, last), n


def _winner(ds: Dataset, call, source: str, var_axes_list) -> None:
    definition = call.definition()
    ds.add_definition(definition)
    plant(ds, definition.name, "fast", source)
    add_traces(ds, [trace(definition.name, "fast", axes, 0.1) for axes in var_axes_list])


def test_decode_wrapper_and_plan_free_call_dispatch_with_their_return_conventions(
    tmp_path: Path,
) -> None:
    ds = Dataset(tmp_path)
    q = torch.randn(2, 4, 64, dtype=torch.float16)
    table, n = _table([5, 9])
    cache = torch.randn(n + 4, 2, 16, 2, 64, dtype=torch.float16)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(torch.empty(2**20, dtype=torch.uint8))
    wrapper.plan(*table, 4, 2, 64, 16, q_data_type=torch.float16)
    # Traces for both page-table sizes used below (var axes differ, shapes of q do not).
    table2, _ = _table([20, 40])
    axes = [dict(paged_decode.bind(q, cache, *t).var_axes) for t in (table, table2)]
    _winner(ds, paged_decode.bind(q, cache, *table), DECODE_SRC, axes)
    assert wrapper.run.definition(q, cache).name == paged_decode.definition(q, cache, *table).name

    with enable_apply(dataset=tmp_path):
        out = wrapper.run(q, cache)
        assert isinstance(out, torch.Tensor) and torch.equal(out, q * 2)  # 2 pages
        out, lse = wrapper.run(q, cache, return_lse=True)
        assert torch.equal(out, q * 2)
        torch.testing.assert_close(lse, q[..., 0].float() + 64**-0.5)
        buf = torch.empty_like(q)
        assert wrapper.run(q, cache, out=buf) is buf and torch.equal(buf, q * 2)
        # A new plan with the same q/cache shapes: the solution sees the new table (5 pages).
        wrapper.plan(*table2, 4, 2, 64, 16, q_data_type=torch.float16)
        assert torch.equal(wrapper.run(q, cache), q * 5)
        # The plan-free call, same Definition, same winner.
        out = paged_decode(q, cache, *table)
        assert isinstance(out, torch.Tensor) and torch.equal(out, q * 2)
        out, lse = paged_decode(q, cache, *table, sm_scale=0.5, return_lse=True)
        torch.testing.assert_close(lse, q[..., 0].float() + 0.5)


def test_prefill_wrappers_write_the_winner_into_their_outputs(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    qo = torch.tensor([0, 3, 7], dtype=torch.int32)
    kv = torch.tensor([0, 5, 12], dtype=torch.int32)
    q = torch.randn(7, 4, 64, dtype=torch.float16)
    k = torch.randn(12, 2, 64, dtype=torch.float16)
    v = torch.randn_like(k)
    ragged = gqa_ragged_prefill.bind(
        q, k, v, qo, kv, 0.125, causal=True, plan=None, out=None, lse=None
    )
    _winner(ds, ragged, PREFILL_RAGGED_SRC, [dict(ragged.var_axes)])
    (indptr, indices, last), n = _table([5, 7])
    cache = torch.randn(n, 16, 2, 64, dtype=torch.float16)
    paged = gqa_paged_prefill.bind(
        q,
        cache,
        cache,
        qo,
        indptr,
        indices,
        0.125,
        last,
        causal=True,
        plan=None,
        out=None,
        lse=None,
    )
    _winner(ds, paged, PREFILL_PAGED_SRC, [dict(paged.var_axes)])
    ws = torch.empty(2**20, dtype=torch.uint8)
    w_ragged = BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    w_ragged.plan(qo, kv, 4, 2, 64, causal=True, q_data_type=torch.float16)
    w_paged = BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    w_paged.plan(qo, indptr, indices, last, 4, 2, 64, 16, causal=True, q_data_type=torch.float16)
    with enable_apply(dataset=tmp_path):
        assert torch.equal(w_ragged.run(q, k, v), q * 3)
        out, lse = w_ragged.run(q, k, v, return_lse=True)
        assert torch.equal(out, q * 3) and torch.equal(lse, q[..., 1].float())
        assert torch.equal(w_paged.run(q, (cache, cache)), q * 2)


def test_plan_free_prefill_calls_dispatch(tmp_path: Path) -> None:
    from flashtune.ops.attention import paged_prefill, ragged_prefill

    ds = Dataset(tmp_path)
    qo = torch.tensor([0, 3, 7], dtype=torch.int32)
    kv = torch.tensor([0, 5, 12], dtype=torch.int32)
    q = torch.randn(7, 4, 64, dtype=torch.float16)
    k = torch.randn(12, 2, 64, dtype=torch.float16)
    ragged = ragged_prefill.bind(q, k, k, qo, kv, causal=True)
    _winner(ds, ragged, PREFILL_RAGGED_SRC, [dict(ragged.var_axes)])
    (indptr, indices, last), n = _table([5, 7])
    cache = torch.randn(n, 2, 16, 2, 64, dtype=torch.float16)
    paged = paged_prefill.bind(q, cache, qo, indptr, indices, last, causal=True)
    _winner(ds, paged, PREFILL_PAGED_SRC, [dict(paged.var_axes)])
    with enable_apply(dataset=tmp_path):
        assert torch.equal(ragged_prefill(q, k, k, qo, kv, causal=True), q * 3)
        out, lse = paged_prefill(q, cache, qo, indptr, indices, last, causal=True, return_lse=True)
        assert torch.equal(out, q * 2) and torch.equal(lse, q[..., 0].float())
        # Not causal: another Definition, no winner: the kernel (or reference) runs.
        assert not torch.equal(ragged_prefill(q, k, k, qo, kv, causal=False), q * 3)

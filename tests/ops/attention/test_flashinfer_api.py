"""FlashInfer 0.2.14 API surface of the attention wrappers: run_return_lse, the deprecated
forward/forward_return_lse, CUDAGraphBatchDecodeWithPagedKVCacheWrapper, the shared-prefix
wrappers and single_prefill_with_kv_cache's arguments (interpreter on CPU, GPU under cuda)."""

from __future__ import annotations

import math

import pytest
import torch

from flashtune.ops.attention import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    single_prefill_with_kv_cache,
)
from flashtune.ops.attention.page import build_page_table, split_kv_cache
from flashtune.ops.attention.reference import gather_paged_kv, single_prefill_ref

HKV, GROUP, D, PAGE = 2, 2, 64, 4
HQ = HKV * GROUP
ATOL = RTOL = 2e-3


def _ws(device):
    return torch.empty(1 << 22, dtype=torch.uint8, device=device)


def _cache(kv_lens, device):
    indptr, indices, last, num_pages = build_page_table(kv_lens, PAGE, device=device)
    cache = torch.randn(num_pages, 2, PAGE, HKV, D, dtype=torch.float16, device=device)
    return cache, indptr, indices, last


def _indptr(lens, device):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def test_decode_run_return_lse_and_graph_wrapper(device):
    kv_lens = [5, 17, 1]
    cache, indptr, indices, last = _cache(kv_lens, device)
    q = torch.randn(3, HQ, D, dtype=torch.float16, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(_ws(device))
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.float16)
    out, lse = w.run_return_lse(q, cache)
    out2, lse2 = w.run(q, cache, return_lse=True)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    out3, lse3 = w.forward_return_lse(q, cache)
    assert torch.equal(out, out3) and torch.equal(lse, lse3)
    with pytest.raises(ValueError, match="window_left"):
        w.forward(q, cache, window_left=3)

    buffers = (
        torch.empty(4, dtype=torch.int32, device=device),
        torch.empty(64, dtype=torch.int32, device=device),
        torch.empty(3, dtype=torch.int32, device=device),
    )
    g = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(_ws(device), *buffers)
    assert g.is_cuda_graph_enabled
    g.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.float16)
    torch.testing.assert_close(g.run(q, cache), out, atol=ATOL, rtol=RTOL)


def _reference_with_prefix(q, qo_lens, k_shared, v_shared, cache, indptr, indices, last, causal):
    """Each request over concat(prefix, its own KV): the shared-prefix wrappers' meaning."""
    k_cache, v_cache = split_kv_cache(cache, "NHD")
    outs, start = [], 0
    for b, n in enumerate(qo_lens):
        k_b, v_b = gather_paged_kv(k_cache, v_cache, indptr, indices, last, b)
        o, _ = single_prefill_ref(
            q[start : start + n],
            torch.cat([k_shared, k_b]),
            torch.cat([v_shared, v_b]),
            1 / math.sqrt(D),
            causal=causal,
            compute_dtype=torch.float64,
        )
        outs.append(o)
        start += n
    return torch.cat(outs)


def test_shared_prefix_decode(device):
    unique = [3, 9, 1, 6]
    cache, indptr, indices, last = _cache(unique, device)
    k_shared = torch.randn(11, HKV, D, dtype=torch.float16, device=device)
    v_shared = torch.randn(11, HKV, D, dtype=torch.float16, device=device)
    q = torch.randn(len(unique), HQ, D, dtype=torch.float16, device=device)
    w = BatchDecodeWithSharedPrefixPagedKVCacheWrapper(_ws(device))
    w.begin_forward(indptr, indices, last, HQ, HKV, D, PAGE)
    out = w.forward(q, k_shared, v_shared, cache)
    ref = _reference_with_prefix(
        q, [1] * len(unique), k_shared, v_shared, cache, indptr, indices, last, False
    )
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("causal", [False, True])
def test_shared_prefix_prefill(device, causal):
    qo_lens, unique = [3, 5, 2], [3, 9, 7]
    cache, indptr, indices, last = _cache(unique, device)
    k_shared = torch.randn(13, HKV, D, dtype=torch.float16, device=device)
    v_shared = torch.randn(13, HKV, D, dtype=torch.float16, device=device)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=torch.float16, device=device)
    w = BatchPrefillWithSharedPrefixPagedKVCacheWrapper(_ws(device))
    w.begin_forward(_indptr(qo_lens, device), indptr, indices, last, HQ, HKV, D, PAGE)
    out = w.forward(q, k_shared, v_shared, cache, causal=causal)
    ref = _reference_with_prefix(
        q, qo_lens, k_shared, v_shared, cache, indptr, indices, last, causal
    )
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), atol=ATOL, rtol=RTOL)


def test_prefill_forward_sets_the_variant(device):
    qo_lens, kv_lens = [4, 7], [9, 7]
    cache, indptr, indices, last = _cache(kv_lens, device)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=torch.float16, device=device)
    qo_indptr = _indptr(qo_lens, device)
    causal = BatchPrefillWithPagedKVCacheWrapper(_ws(device))
    causal.plan(qo_indptr, indptr, indices, last, HQ, HKV, D, PAGE, causal=True)
    expected, expected_lse = causal.run_return_lse(q, cache)
    w = BatchPrefillWithPagedKVCacheWrapper(_ws(device))
    w.begin_forward(qo_indptr, indptr, indices, last, HQ, HKV, D, PAGE)  # causal=False
    out, lse = w.forward_return_lse(q, cache, causal=True)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    with pytest.raises(ValueError, match="window_left"):
        w.run(q, cache, window_left=5)
    # k_scale multiplies sm_scale, v_scale the output (FlashInfer's run scales).
    scaled = BatchPrefillWithPagedKVCacheWrapper(_ws(device))
    scaled.plan(
        qo_indptr, indptr, indices, last, HQ, HKV, D, PAGE, causal=True, sm_scale=0.5 / math.sqrt(D)
    )
    expected = scaled.run(q, cache) * 3.0
    out = w.run(q, cache, k_scale=0.5, v_scale=3.0)
    torch.testing.assert_close(out.float(), expected.float(), atol=ATOL, rtol=RTOL)


def test_single_prefill_arguments(device):
    q = torch.randn(6, HQ, D, dtype=torch.float16, device=device)
    k = torch.randn(9, HKV, D, dtype=torch.float16, device=device)
    v = torch.randn(9, HKV, D, dtype=torch.float16, device=device)
    base = single_prefill_with_kv_cache(q, k, v, causal=True)
    for backend in ("auto", "fa2", "fa3"):
        hinted = single_prefill_with_kv_cache(
            q, k, v, causal=True, backend=backend, use_fp16_qk_reduction=True
        )
        assert torch.equal(hinted, base)
    ref, _ = single_prefill_ref(q, k, v, 1 / math.sqrt(D), causal=True, compute_dtype=torch.float64)
    torch.testing.assert_close(base.float().cpu(), ref.float().cpu(), atol=ATOL, rtol=RTOL)
    with pytest.raises(NotImplementedError, match="scale_k"):
        single_prefill_with_kv_cache(q, k, v, scale_k=torch.ones(1))
    with pytest.raises(NotImplementedError, match="packed_custom_mask"):
        single_prefill_with_kv_cache(q, k, v, packed_custom_mask=torch.ones(8, dtype=torch.uint8))
    with pytest.raises(NotImplementedError, match="o_dtype"):
        single_prefill_with_kv_cache(q, k, v, o_dtype=torch.float32)

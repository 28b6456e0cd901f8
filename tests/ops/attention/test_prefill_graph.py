"""CUDA-graph mode of the prefill wrappers (FlashInfer's pattern: plan a warm-up batch,
capture run, plan the real batch, replay).

A replay re-launches the captured kernel with the same grid, pointers and scalars. On the
CPU the kernel launches of run are recorded and replayed as they were after the second plan:
that is the invariant a graph replay relies on. On a GPU a real graph is captured too.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashtune.ops.attention.page import build_page_table, split_kv_cache
from flashtune.ops.attention.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashtune.ops.attention.prefill import launch as prefill_launch
from flashtune.ops.attention.reference import batch_prefill_paged_ref, batch_prefill_ragged_ref
from flashtune.ops.attention.variant import AttentionVariant

HKV, GROUP, D, PAGE = 2, 3, 64, 5
HQ = HKV * GROUP


class _LaunchRecorder:
    """Stands in for prefill_kernel: launches it and keeps (grid, args) for a replay."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch

    def replay(self):
        for grid, args, kwargs in self.launches:
            self.kernel[grid](*args, **kwargs)


def _i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _indptr(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return _i32(out)


def _paged_wrapper(device, batch, max_pages, *, mask_elems=0):
    bufs = dict(
        qo_indptr_buf=torch.empty(batch + 1, dtype=torch.int32, device=device),
        paged_kv_indptr_buf=torch.empty(batch + 1, dtype=torch.int32, device=device),
        paged_kv_indices_buf=torch.empty(max_pages, dtype=torch.int32, device=device),
        paged_kv_last_page_len_buf=torch.empty(batch, dtype=torch.int32, device=device),
    )
    if mask_elems:
        bufs["custom_mask_buf"] = torch.empty(-(-mask_elems // 8), dtype=torch.uint8, device=device)
        bufs["mask_indptr_buf"] = torch.empty(batch + 1, dtype=torch.int32, device=device)
    ws = torch.empty(1 << 16, dtype=torch.uint8, device=device)
    return BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, **bufs)


def _plan_paged(w, qo_lens, kv_lens, num_pages, *, causal, mask=None):
    indptr, indices, last, _ = build_page_table(
        kv_lens, PAGE, extra_pages=num_pages - sum(-(-n // PAGE) for n in kv_lens)
    )
    w.plan(
        _indptr(qo_lens), indptr, indices, last, HQ, HKV, D, PAGE, causal=causal, custom_mask=mask
    )
    return indptr, indices, last


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("custom", [False, True])
def test_paged_replay_after_replan(device, monkeypatch, causal, custom):
    recorder = _LaunchRecorder(prefill_launch.prefill_kernel)
    monkeypatch.setattr(prefill_launch, "prefill_kernel", recorder)
    batch, num_pages = 3, 40
    warm_qo, warm_kv = [8, 8, 8], [8, 9, 10]
    real_qo, real_kv = [1, 20, 3], [57, 33, 3]  # fewer rows, more items, longer KV
    mask_elems = max(
        sum(a * b for a, b in zip(warm_qo, warm_kv, strict=True)),
        sum(a * b for a, b in zip(real_qo, real_kv, strict=True)),
    )

    def mask_for(qo, kv):
        if not custom:
            return None
        n = sum(a * b for a, b in zip(qo, kv, strict=True))
        return torch.rand(n, device=device) > 0.3

    w = _paged_wrapper(device, batch, num_pages, mask_elems=mask_elems)
    cache = torch.randn(num_pages, 2, PAGE, HKV, D, dtype=torch.float16, device=device)
    q = torch.randn(sum(warm_qo), HQ, D, dtype=torch.float16, device=device)
    _plan_paged(w, warm_qo, warm_kv, num_pages, causal=causal, mask=mask_for(warm_qo, warm_kv))
    out, lse = w.run(q, cache, return_lse=True)  # "capture"
    assert recorder.launches, "run launched no kernel"

    mask = mask_for(real_qo, real_kv)
    indptr, indices, last = _plan_paged(w, real_qo, real_kv, num_pages, causal=causal, mask=mask)
    q.copy_(torch.randn_like(q))
    out.fill_(float("nan"))
    recorder.replay()

    k, v = split_kv_cache(cache, "NHD")
    rows = sum(real_qo)
    ref_out, ref_lse = batch_prefill_paged_ref(
        q[:rows],
        k,
        v,
        _indptr(real_qo),
        indptr,
        indices,
        last,
        AttentionVariant(sm_scale=1 / math.sqrt(D), causal=causal),
        custom_mask=mask,
        compute_dtype=torch.float64,
    )
    torch.testing.assert_close(
        out[:rows].float().cpu(), ref_out.float().cpu(), atol=2e-3, rtol=2e-3
    )
    finite = ~ref_lse.isinf().cpu()
    assert torch.equal(lse[:rows].isinf().cpu(), ~finite)
    torch.testing.assert_close(
        lse[:rows].cpu()[finite], ref_lse.cpu()[finite], atol=2e-3, rtol=2e-3
    )
    # The caller's buffers hold the plan, as FlashInfer's graph mode leaves them.
    assert w._graph is not None
    assert torch.equal(w._graph.kv_indices_buf[: indices.numel()].cpu(), indices)
    assert torch.equal(w._graph.qo_indptr_buf.cpu(), _indptr(real_qo))


def test_ragged_replay_after_replan(device, monkeypatch):
    recorder = _LaunchRecorder(prefill_launch.prefill_kernel)
    monkeypatch.setattr(prefill_launch, "prefill_kernel", recorder)
    batch, kv_capacity = 3, 90
    ws = torch.empty(1 << 16, dtype=torch.uint8, device=device)
    w = BatchPrefillWithRaggedKVCacheWrapper(
        ws,
        "NHD",
        use_cuda_graph=True,
        qo_indptr_buf=torch.empty(batch + 1, dtype=torch.int32, device=device),
        kv_indptr_buf=torch.empty(batch + 1, dtype=torch.int32, device=device),
    )
    q = torch.randn(30, HQ, D, dtype=torch.float16, device=device)
    k = torch.randn(kv_capacity, HKV, D, dtype=torch.float16, device=device)
    v = torch.randn(kv_capacity, HKV, D, dtype=torch.float16, device=device)
    w.plan(_indptr([10, 10, 10]), _indptr([10, 10, 10]), HQ, HKV, D, causal=True)
    out, lse = w.run(q, k, v, return_lse=True)
    real_qo, real_kv = [2, 25, 0], [40, 30, 20]
    w.plan(_indptr(real_qo), _indptr(real_kv), HQ, HKV, D, causal=True)
    q.copy_(torch.randn_like(q))
    recorder.replay()
    rows = sum(real_qo)
    ref_out, ref_lse = batch_prefill_ragged_ref(
        q[:rows],
        k,
        v,
        _indptr(real_qo),
        _indptr(real_kv),
        AttentionVariant(sm_scale=1 / math.sqrt(D), causal=True),
        compute_dtype=torch.float64,
    )
    torch.testing.assert_close(
        out[:rows].float().cpu(), ref_out.float().cpu(), atol=2e-3, rtol=2e-3
    )
    torch.testing.assert_close(lse[:rows].cpu(), ref_lse.cpu(), atol=2e-3, rtol=2e-3)


def test_graph_mode_refuses_what_a_replay_cannot_serve(device):
    ws = torch.empty(1 << 16, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match="qo_indptr_buf"):
        BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True)
    with pytest.raises(ValueError, match="paged_kv_last_page_len_buf"):
        BatchPrefillWithPagedKVCacheWrapper(
            ws,
            "NHD",
            use_cuda_graph=True,
            qo_indptr_buf=torch.empty(4, dtype=torch.int32, device=device),
            paged_kv_indptr_buf=torch.empty(4, dtype=torch.int32, device=device),
            paged_kv_indices_buf=torch.empty(10, dtype=torch.int32, device=device),
            paged_kv_last_page_len_buf=torch.empty(2, dtype=torch.int32, device=device),
        )
    w = _paged_wrapper(device, 3, 40)
    _plan_paged(w, [8, 8, 8], [8, 9, 10], 40, causal=True)
    with pytest.raises(ValueError, match="causal"):
        _plan_paged(w, [8, 8, 8], [8, 9, 10], 40, causal=False)
    with pytest.raises(ValueError, match="batch size"):
        w.plan(_indptr([1, 1]), _indptr([1, 1]), _i32([0, 1]), _i32([1, 1]), HQ, HKV, D, PAGE)
    with pytest.raises(ValueError, match="rows"):
        _plan_paged(w, [8, 8, 9], [8, 9, 10], 40, causal=True)
    with pytest.raises(ValueError, match="paged_kv_indices_buf"):
        _plan_paged(w, [8, 8, 8], [100, 100, 8], 60, causal=True)
    mask = torch.ones(8 * 8 + 8 * 9 + 8 * 10, dtype=torch.bool)
    with pytest.raises(ValueError, match="custom_mask_buf"):
        _plan_paged(
            _paged_wrapper(device, 3, 40), [8, 8, 8], [8, 9, 10], 40, causal=False, mask=mask
        )


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
def test_paged_cuda_graph_capture_replay(causal):
    """FlashInfer's test pattern: warm-up plan of one page per request, capture, real plan,
    replay (test_batch_prefill_kernels.py's use_cuda_graph=True case)."""
    dev = torch.device("cuda")
    batch, qo_len, kv_len, ps, hq, hkv, d = 12, 37, 54, 16, 32, 4, 128
    pages_per_seq = -(-kv_len // ps)
    total_pages = pages_per_seq * batch
    q = torch.randn(batch * qo_len, hq, d, dtype=torch.float16, device=dev)
    cache = torch.randn(total_pages, 2, ps, hkv, d, dtype=torch.float16, device=dev)
    i32 = lambda n: torch.empty(n, dtype=torch.int32, device=dev)  # noqa: E731
    w = BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(256 << 20, dtype=torch.uint8, device=dev),
        "NHD",
        use_cuda_graph=True,
        qo_indptr_buf=i32(batch + 1),
        paged_kv_indptr_buf=i32(batch + 1),
        paged_kv_indices_buf=i32(total_pages),
        paged_kv_last_page_len_buf=i32(batch),
    )
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32) * qo_len
    w.plan(
        qo_indptr,
        torch.arange(batch + 1, dtype=torch.int32),
        torch.arange(batch, dtype=torch.int32),
        torch.full((batch,), ps, dtype=torch.int32),
        hq,
        hkv,
        d,
        ps,
        causal=causal,
    )
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            w.run(q, cache, return_lse=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, lse = w.run(q, cache, return_lse=True)
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32) * pages_per_seq
    indices = torch.randperm(total_pages).int()
    last = torch.full((batch,), (kv_len - 1) % ps + 1, dtype=torch.int32)
    w.plan(qo_indptr, kv_indptr, indices, last, hq, hkv, d, ps, causal=causal)
    g.replay()
    torch.cuda.synchronize()
    k, v = split_kv_cache(cache, "NHD")
    ref_o, ref_lse = batch_prefill_paged_ref(
        q,
        k,
        v,
        qo_indptr,
        kv_indptr,
        indices,
        last,
        AttentionVariant(sm_scale=d**-0.5, causal=causal),
    )
    torch.testing.assert_close(o, ref_o, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=2e-3)

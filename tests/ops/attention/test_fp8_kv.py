"""fp8 KV caches (float8_e4m3fn, float8_e5m2) under fp16/bf16 queries, with FlashInfer's
k_scale / v_scale, in decode and prefill (interpreter on CPU, GPU under cuda)."""

from __future__ import annotations

import math

import pytest
import torch

from flashtune.ops.attention.decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    single_decode_with_kv_cache,
)
from flashtune.ops.attention.page import build_page_table, split_kv_cache
from flashtune.ops.attention.prefill import BatchPrefillWithPagedKVCacheWrapper
from flashtune.ops.attention.reference import batch_decode_ref, batch_prefill_paged_ref
from flashtune.ops.attention.variant import AttentionVariant

HKV, GROUP, D = 2, 4, 64
HQ = HKV * GROUP
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
# The reference reads the same fp8 values (converted exactly), so only the kernels'
# rounding of the probabilities to q's dtype separates the two.
TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _fp8_cache(kv_lens, page_size, kv_dtype, device, scale):
    indptr, indices, last, num_pages = build_page_table(kv_lens, page_size)
    cache = (torch.randn(num_pages, 2, page_size, HKV, D, device=device) / scale).to(kv_dtype)
    return cache, indptr, indices, last


def _check(out, lse, ref_out, ref_lse, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(out.float().cpu(), ref_out.float().cpu(), atol=tol, rtol=tol)
    finite = ~ref_lse.isinf().cpu()
    assert torch.equal(lse.isinf().cpu(), ~finite)
    torch.testing.assert_close(lse.cpu()[finite], ref_lse.cpu()[finite], atol=tol, rtol=tol)


@pytest.mark.parametrize("kv_dtype", FP8)
# bf16: GPU only (the Triton interpreter's bf16 dot is wrong on this Triton, fp8 or not).
@pytest.mark.parametrize(
    "q_dtype", [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.cuda)]
)
def test_decode_fp8(device, kv_dtype, q_dtype):
    kv_lens, page_size, k_scale, v_scale = [1, 70, 0, 33], 16, 0.5, 2.0
    cache, indptr, indices, last = _fp8_cache(kv_lens, page_size, kv_dtype, device, 1.0)
    q = torch.randn(len(kv_lens), HQ, D, dtype=q_dtype, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 22, dtype=torch.uint8, device=device))
    # FlashInfer's tests name the cache's dtype with the deprecated data_type.
    w.plan(indptr, indices, last, HQ, HKV, D, page_size, data_type=kv_dtype, q_data_type=q_dtype)
    out, lse = w.run(q, cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)
    k, v = split_kv_cache(cache, "NHD")
    ref_out, ref_lse = batch_decode_ref(
        q, k, v, indptr, indices, last, sm_scale=k_scale / math.sqrt(D)
    )
    _check(out, lse, ref_out.double() * v_scale, ref_lse, q_dtype)


def test_single_decode_fp8(device):
    q = torch.randn(HQ, D, dtype=torch.float16, device=device)
    k = torch.randn(40, HKV, D, device=device).to(torch.float8_e4m3fn)
    v = torch.randn(40, HKV, D, device=device).to(torch.float8_e4m3fn)
    out = single_decode_with_kv_cache(q, k, v)
    ref = single_decode_with_kv_cache(q, k.to(torch.float16), v.to(torch.float16))
    torch.testing.assert_close(out.float(), ref.float(), atol=3e-3, rtol=3e-3)


@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("causal", [True, False])
def test_prefill_fp8(device, kv_dtype, causal):
    qo_lens, kv_lens, page_size = [5, 20, 0], [9, 40, 3], 5
    cache, indptr, indices, last = _fp8_cache(kv_lens, page_size, kv_dtype, device, 1.0)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=torch.float16, device=device)
    qo_indptr = torch.tensor([0, 5, 25, 25], dtype=torch.int32)
    w = BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    w.plan(
        qo_indptr,
        indptr,
        indices,
        last,
        HQ,
        HKV,
        D,
        page_size,
        causal=causal,
        q_data_type=torch.float16,
        kv_data_type=kv_dtype,
    )
    out, lse = w.run(q, cache, k_scale=0.25, v_scale=1.5, return_lse=True)
    k, v = split_kv_cache(cache, "NHD")
    ref_out, ref_lse = batch_prefill_paged_ref(
        q,
        k,
        v,
        qo_indptr,
        indptr,
        indices,
        last,
        AttentionVariant(sm_scale=0.25 / math.sqrt(D), causal=causal),
        compute_dtype=torch.float64,
    )
    _check(out, lse, ref_out.double() * 1.5, ref_lse, torch.float16)


def test_fp8_needs_16_bit_queries(device):
    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=device))
    indptr, indices, last, _ = build_page_table([3], 4)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        w.plan(
            indptr,
            indices,
            last,
            HQ,
            HKV,
            D,
            4,
            q_data_type=torch.float16,
            kv_data_type=torch.bfloat16,
        )


@pytest.mark.cuda
@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("page_size", [1, 16])
def test_fp8_gpu_sizes(kv_dtype, page_size):
    """Realistic sizes on the GPU: split-KV decode (partials merged) and TMA-staged prefill."""
    dev = torch.device("cuda")
    hkv, hq, d = 8, 32, 128
    kv_lens = [0, 1, 5000, 700, 64, 2049] * 4
    indptr, indices, last, num_pages = build_page_table(kv_lens, page_size, device=dev)
    cache = torch.randn(num_pages, 2, page_size, hkv, d, device=dev).to(kv_dtype)
    k, v = split_kv_cache(cache, "NHD")
    q = torch.randn(len(kv_lens), hq, d, dtype=torch.bfloat16, device=dev)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    w = BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(
        indptr,
        indices,
        last,
        hq,
        hkv,
        d,
        page_size,
        q_data_type=torch.bfloat16,
        kv_data_type=kv_dtype,
    )
    out, lse = w.run(q, cache, k_scale=0.7, v_scale=1.3, return_lse=True)
    ref_out, ref_lse = batch_decode_ref(
        q, k, v, indptr, indices, last, sm_scale=0.7 / math.sqrt(d), compute_dtype=torch.float32
    )
    _check(out, lse, ref_out.float() * 1.3, ref_lse, torch.bfloat16)

    qo_lens = [0, 1, 300, 700, 64, 100] * 4
    qo_indptr = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)
    qp = torch.randn(sum(qo_lens), hq, d, dtype=torch.bfloat16, device=dev)
    p = BatchPrefillWithPagedKVCacheWrapper(ws)
    p.plan(
        qo_indptr, indptr, indices, last, hq, hkv, d, page_size, causal=True, kv_data_type=kv_dtype
    )
    out, lse = p.run(qp, cache, k_scale=0.7, v_scale=1.3, return_lse=True)
    ref_out, ref_lse = batch_prefill_paged_ref(
        qp,
        k,
        v,
        qo_indptr,
        indptr,
        indices,
        last,
        AttentionVariant(sm_scale=0.7 / math.sqrt(d), causal=True),
    )
    _check(out, lse, ref_out.float() * 1.3, ref_lse, torch.bfloat16)


def test_autotuner_keys_decode_by_cache_dtype_and_variant(device, monkeypatch):
    """A tactic tuned on an fp8 cache (or with fused RoPE) is never reused for a bf16 cache
    (or plain decode) of the same shapes: the dtypes and the variant are in the tuner's key."""
    from flashtune.ops.attention.decode import launch as decode_launch
    from flashtune.tune import AutoTuner

    calls = []
    real = decode_launch.choose_one

    def spy(op_name, runners, config, inputs):
        calls.append((op_name, AutoTuner.profile_of(inputs, config)))
        return real(op_name, runners, config, inputs)

    monkeypatch.setattr(decode_launch, "choose_one", spy)
    indptr, indices, last, num_pages = build_page_table([40, 7], 4)
    q = torch.randn(2, HQ, D, dtype=torch.float16, device=device)
    base = torch.randn(num_pages, 2, 4, HKV, D, dtype=torch.float16, device=device)
    for kv_dtype, mode in [
        (torch.float16, "NONE"),
        (torch.float8_e4m3fn, "NONE"),
        (torch.float16, "ROPE_LLAMA"),
    ]:
        w = BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(1 << 22, dtype=torch.uint8, device=device)
        )
        w.plan(
            indptr, indices, last, HQ, HKV, D, 4,
            q_data_type=torch.float16, kv_data_type=kv_dtype, pos_encoding_mode=mode,
        )  # fmt: skip
        w.run(q, base.to(kv_dtype))
    assert [name for name, _ in calls] == [
        "attention.paged_decode",
        "attention.paged_decode",
        "attention.paged_decode+rope",
    ]
    assert calls[0][1] != calls[1][1]  # same shapes, different cache dtype

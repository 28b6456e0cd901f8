"""pos_encoding_mode="ALIBI" in the prefill wrappers (FlashInfer's bias: slope[head] * (key
position - query index in the request), folded into the logit before a soft-cap) against
the reference, and the reference against the formula written out for one request."""

from __future__ import annotations

import math

import pytest
import torch

from _position_encoding import ATOL, GROUP, HKV, HQ, RTOL, D, compare, offsets, ragged_qkv
from flashtune.ops.attention.page import build_page_table
from flashtune.ops.attention.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)
from flashtune.ops.attention.reference import (
    alibi_slopes,
    batch_prefill_paged_ref,
    batch_prefill_ragged_ref,
)
from flashtune.ops.attention.variant import AttentionVariant


def test_slopes_are_the_alibi_papers():
    # A power of two: 2^(-8 i / n) for i = 1..n.
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2**-2, 2**-4, 2**-6, 2**-8]))
    # 6 heads: the 4 of n = 4, then 2^(-4 (2 j + 1) / 4) for j = 0, 1.
    expected = [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(expected))
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)


@pytest.mark.parametrize("soft_cap", [0.0, 30.0])
def test_reference_is_the_written_out_formula(soft_cap):
    qo_len, kv_len, sm = 3, 7, 0.125
    q = torch.randn(qo_len, HQ, D, dtype=torch.float64)
    k = torch.randn(kv_len, HKV, D, dtype=torch.float64)
    v = torch.randn(kv_len, HKV, D, dtype=torch.float64)
    out, lse = batch_prefill_ragged_ref(
        q,
        k,
        v,
        offsets([qo_len]),
        offsets([kv_len]),
        AttentionVariant(sm_scale=sm, causal=True, logits_soft_cap=soft_cap or None, alibi=True),
        compute_dtype=torch.float64,
    )
    slopes = alibi_slopes(HQ).double()
    for h in range(HQ):
        for i in range(qo_len):
            logits = []
            for j in range(kv_len - qo_len + i + 1):  # causal, bottom-right aligned
                x = float(q[i, h] @ k[j, h // GROUP]) * sm + float(slopes[h]) * (j - i)
                if soft_cap:  # FlashInfer scales the biased logit by sm_scale again
                    x = soft_cap * math.tanh(x * sm / soft_cap)
                logits.append(x)
            w = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
            expected = (w[:, None] * v[: len(logits), h // GROUP]).sum(0)
            torch.testing.assert_close(out[i, h].double(), expected)
            lse_e = torch.logsumexp(torch.tensor(logits, dtype=torch.float64), 0) / math.log(2)
            assert lse[i, h].item() == pytest.approx(lse_e.item(), rel=1e-5)


@pytest.mark.parametrize("soft_cap", [0.0, 30.0])
@pytest.mark.parametrize("causal", [True, False])
def test_ragged_alibi(device, causal, soft_cap):
    qo_lens, kv_lens = [3, 17], [30, 20]
    q, k, v = ragged_qkv(qo_lens, kv_lens, device)
    w = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    w.plan(
        offsets(qo_lens), offsets(kv_lens), HQ, HKV, D, causal=causal,
        pos_encoding_mode="ALIBI", logits_soft_cap=soft_cap or None,
    )  # fmt: skip
    out, lse = w.run(q, k, v, return_lse=True)
    ref = batch_prefill_ragged_ref(
        q,
        k,
        v,
        offsets(qo_lens),
        offsets(kv_lens),
        AttentionVariant(
            sm_scale=1 / math.sqrt(D), causal=causal, logits_soft_cap=soft_cap or None, alibi=True
        ),
        compute_dtype=torch.float64,
    )
    compare(out, lse, *ref)
    # The bias changes the result (a kernel ignoring it would not pass).
    plain = single_prefill_with_kv_cache(q[3:], k[30:], v[30:], causal=causal)
    single = single_prefill_with_kv_cache(
        q[3:], k[30:], v[30:], causal=causal, pos_encoding_mode="ALIBI",
        logits_soft_cap=soft_cap or None,
    )  # fmt: skip
    torch.testing.assert_close(single.float().cpu(), out[3:].float().cpu(), atol=ATOL, rtol=RTOL)
    assert (plain.float() - single.float()).abs().max().item() > 1e-2


def test_paged_alibi_with_a_custom_mask(device):
    page_size, qo_lens, kv_lens = 4, [5, 9], [13, 9]
    kv_indptr, kv_indices, last, num_pages = build_page_table(kv_lens, page_size, device=device)
    k_cache = torch.randn(num_pages, page_size, HKV, D, dtype=torch.float16, device=device)
    v_cache = torch.randn(num_pages, page_size, HKV, D, dtype=torch.float16, device=device)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=torch.float16, device=device)
    mask = torch.cat([torch.rand(a * b) > 0.3 for a, b in zip(qo_lens, kv_lens, strict=True)]).to(
        device
    )
    w = BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    w.plan(
        offsets(qo_lens), kv_indptr, kv_indices, last,
        HQ, HKV, D, page_size, custom_mask=mask, pos_encoding_mode="ALIBI",
    )  # fmt: skip
    out, lse = w.run(q, (k_cache, v_cache), return_lse=True)
    ref = batch_prefill_paged_ref(
        q,
        k_cache,
        v_cache,
        offsets(qo_lens),
        kv_indptr,
        kv_indices,
        last,
        AttentionVariant(sm_scale=1 / math.sqrt(D), alibi=True),
        custom_mask=mask,
        compute_dtype=torch.float64,
    )
    compare(out, lse, *ref)


def test_decode_still_names_what_it_lacks():
    from flashtune.ops.attention.decode import BatchDecodeWithPagedKVCacheWrapper

    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8))
    with pytest.raises(NotImplementedError, match="ALIBI"):
        w.plan(offsets([1]), torch.tensor([0], dtype=torch.int32), torch.tensor([1], dtype=torch.int32),
               HQ, HKV, D, 4, pos_encoding_mode="ALIBI")  # fmt: skip


@pytest.mark.parametrize(
    "variant",
    [dict(pos_encoding_mode="ALIBI"), dict(pos_encoding_mode="ROPE_LLAMA"), dict(mask=True)],
)
def test_variants_no_definition_describes_bypass_the_schemad_op(device, monkeypatch, variant):
    # Capture and apply hook the schema'd op: a call it would describe as plain attention
    # must not reach it (a proven plain solution applied there would compute the wrong thing).
    from flashtune.ops.attention import prefill

    calls = []
    real = prefill.gqa_ragged_prefill
    monkeypatch.setattr(
        prefill, "gqa_ragged_prefill", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    q = torch.randn(5, HQ, D, dtype=torch.float16, device=device)
    k = torch.randn(7, HKV, D, dtype=torch.float16, device=device)
    v = torch.randn(7, HKV, D, dtype=torch.float16, device=device)
    w = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    w.plan(offsets([5]), offsets([7]), HQ, HKV, D, causal=True)
    w.run(q, k, v)
    assert calls == [1]  # the plain call goes through the schema'd op
    options = dict(variant)
    if options.pop("mask", False):
        options["custom_mask"] = torch.rand(5 * 7, device=device) > 0.5
    w.plan(offsets([5]), offsets([7]), HQ, HKV, D, causal=True, **options)
    w.run(q, k, v)
    assert calls == [1]

"""FlashInfer's multi-item scoring (prefill plan's prefix_len_ptr, token_pos_in_items_ptr,
token_pos_in_items_len, max_item_len_ptr): the mask flashtune builds, and the wrappers served
with it, against a mask derived another way (item groups from the delimiters, as FlashInfer's
test_batch_prefill_kernels.py builds its reference)."""

from __future__ import annotations

import pytest
import torch

from flashtune.ops.attention.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)
from flashtune.ops.attention.prefill.multi_item import MultiItemScoring
from flashtune.ops.attention.reference import (
    batch_prefill_paged_ref,
    batch_prefill_ragged_ref,
    single_prefill_ref,
)
from flashtune.ops.attention.variant import AttentionVariant

HKV, GROUP, D, PAGE = 2, 2, 64, 4
HQ = HKV * GROUP


def _group_mask(token_pos: list[int], prefix_len: int) -> torch.Tensor:
    """[items_len, prefix_len + items_len]: each query sees the prefix and its own item up to
    itself, delimiters (position 0) neither see nor are seen past the prefix."""
    pos = torch.tensor(token_pos)
    delimiter = pos == 0
    group = torch.cumsum(delimiter.int(), 0)
    idx = torch.arange(len(token_pos))
    own = (group[:, None] == group[None, :]) & (idx[None, :] <= idx[:, None])
    items = own & ~delimiter[None, :] & ~delimiter[:, None]
    return torch.cat([torch.ones(len(token_pos), prefix_len, dtype=torch.bool), items], dim=1)


# Two requests: (prefix_len, token positions of the items), FlashInfer's layout.
REQUESTS = [
    (5, [0, 1, 2, 3, 0, 1, 2, 0]),
    (3, [0, 1, 0, 1, 2, 3, 4, 5, 6, 0]),
]
STRIDE = 12  # token_pos_in_items_len: each request's row, zero padded


def _plan_args() -> dict:
    token_pos = torch.zeros(len(REQUESTS) * STRIDE, dtype=torch.int64)
    for b, (_, row) in enumerate(REQUESTS):
        token_pos[b * STRIDE : b * STRIDE + len(row)] = torch.tensor(row)
    return dict(
        prefix_len_ptr=torch.tensor([p for p, _ in REQUESTS]).to(torch.uint32),
        token_pos_in_items_ptr=token_pos.to(torch.uint16),
        token_pos_in_items_len=STRIDE,
        max_item_len_ptr=torch.tensor([4, 7]).to(torch.uint16),
    )


def _lens() -> tuple[list[int], list[int]]:
    qo_lens = [len(row) for _, row in REQUESTS]  # the queries are the items
    kv_lens = [p + len(row) for p, row in REQUESTS]
    return qo_lens, kv_lens


def _expected_mask() -> torch.Tensor:
    return torch.cat([_group_mask(row, p).reshape(-1) for p, row in REQUESTS])


def _indptr(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def test_mask_matches_the_item_groups():
    args = _plan_args()
    mi = MultiItemScoring.from_plan_args(
        args["prefix_len_ptr"], args["token_pos_in_items_ptr"], STRIDE
    )
    assert mi is not None
    qo_lens, kv_lens = _lens()
    mask = mi.custom_mask(torch.tensor(qo_lens).numpy(), torch.tensor(kv_lens).numpy())
    assert torch.equal(mask, _expected_mask())


def test_prefix_queries_are_causal():
    # Queries inside the prefix (qo_len > items) see keys causally, items or not.
    mi = MultiItemScoring.from_plan_args(torch.tensor([3]), torch.tensor([0, 1, 2, 0]), 4)
    assert mi is not None
    mask = mi.custom_mask(torch.tensor([6]).numpy(), torch.tensor([7]).numpy())
    full = mask.reshape(6, 7)
    # Query 0 sits at position 1 (< prefix 3): keys 0..1.
    assert full[0].tolist() == [True, True, False, False, False, False, False]
    # Query 2 is the delimiter at position 3: the prefix only.
    assert full[2].tolist() == [True, True, True, False, False, False, False]
    # Query 4 (position 5, item position 2): prefix + positions 4..5.
    assert full[4].tolist() == [True, True, True, False, True, True, False]


def test_without_prefix_len_there_is_no_multi_item_mask():
    assert MultiItemScoring.from_plan_args(None, None, 0) is None


def test_paged_wrapper(device):
    qo_lens, kv_lens = _lens()
    pages = [-(-n // PAGE) for n in kv_lens]
    kv_indptr = _indptr(pages)
    kv_indices = torch.randperm(sum(pages) + 3, dtype=torch.int32)[: sum(pages)]
    last = torch.tensor(
        [n - (p - 1) * PAGE for n, p in zip(kv_lens, pages, strict=True)], dtype=torch.int32
    )
    k_cache = torch.randn(sum(pages) + 3, PAGE, HKV, D, dtype=torch.float16, device=device)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=torch.float16, device=device)
    w = BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    w.plan(
        _indptr(qo_lens),
        kv_indptr,
        kv_indices,
        last,
        HQ,
        HKV,
        D,
        PAGE,
        causal=True,
        pos_encoding_mode="ROPE_LLAMA",
        **_plan_args(),
    )
    out, lse = w.run(q, (k_cache, v_cache), return_lse=True)
    ref_out, ref_lse = batch_prefill_paged_ref(
        q.cpu(),
        k_cache.cpu(),
        v_cache.cpu(),
        _indptr(qo_lens),
        kv_indptr,
        kv_indices,
        last,
        AttentionVariant(sm_scale=D**-0.5, rope=(1.0, 1e4)),
        custom_mask=_expected_mask(),
        compute_dtype=torch.float64,
    )
    torch.testing.assert_close(out.cpu().float(), ref_out.float(), atol=2e-3, rtol=2e-3)
    finite = ~ref_lse.isinf()
    torch.testing.assert_close(lse.cpu()[finite], ref_lse[finite], atol=2e-3, rtol=2e-3)


def test_ragged_wrapper(device):
    qo_lens, kv_lens = _lens()
    k = torch.randn(sum(kv_lens), HKV, D, dtype=torch.float32, device=device)
    v = torch.randn_like(k)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=torch.float32, device=device)
    w = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    w.plan(_indptr(qo_lens), _indptr(kv_lens), HQ, HKV, D, logits_soft_cap=30.0, **_plan_args())
    out = w.run(q, k, v)
    ref, _ = batch_prefill_ragged_ref(
        q.cpu(),
        k.cpu(),
        v.cpu(),
        _indptr(qo_lens),
        _indptr(kv_lens),
        AttentionVariant(sm_scale=D**-0.5, logits_soft_cap=30.0),
        custom_mask=_expected_mask(),
        compute_dtype=torch.float64,
    )
    torch.testing.assert_close(out.cpu(), ref, atol=2e-3, rtol=2e-3)


def test_custom_mask_and_multi_item_together_raise():
    qo_lens, kv_lens = _lens()
    w = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8))
    mask = torch.ones(sum(q * k for q, k in zip(qo_lens, kv_lens, strict=True)), dtype=torch.bool)
    with pytest.raises(ValueError, match="prefix_len_ptr"):
        w.plan(_indptr(qo_lens), _indptr(kv_lens), HQ, HKV, D, custom_mask=mask, **_plan_args())


def test_too_short_token_positions_raise():
    qo_lens, kv_lens = _lens()
    w = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8))
    args = {**_plan_args(), "token_pos_in_items_len": 4}
    with pytest.raises(ValueError, match="token_pos_in_items_len"):
        w.plan(_indptr(qo_lens), _indptr(kv_lens), HQ, HKV, D, **args)


def test_single_prefill_takes_a_flat_mask(device):
    # FlashInfer flattens custom_mask: its tests pass [qo_len * kv_len].
    q = torch.randn(7, HQ, D, dtype=torch.float16, device=device)
    k = torch.randn(11, HKV, D, dtype=torch.float16, device=device)
    v = torch.randn_like(k)
    mask = torch.rand(7, 11, device=device) > 0.4
    flat = single_prefill_with_kv_cache(q, k, v, custom_mask=mask.reshape(-1))
    ref, _ = single_prefill_ref(
        q.cpu(), k.cpu(), v.cpu(), D**-0.5, custom_mask=mask.cpu(), compute_dtype=torch.float64
    )
    torch.testing.assert_close(flat.cpu(), ref, atol=2e-3, rtol=2e-3)
    with pytest.raises(ValueError, match="custom_mask"):
        single_prefill_with_kv_cache(q, k, v, custom_mask=mask.reshape(-1)[:-1])


def test_the_last_row_may_be_shorter_than_its_stride():
    # FlashInfer's own test passes token_pos_in_items_len=100 with 37 positions (batch 1):
    # only the entries the queries use are read.
    short = MultiItemScoring.from_plan_args(torch.tensor([3]), torch.tensor([0, 1, 2, 0]), 100)
    exact = MultiItemScoring.from_plan_args(torch.tensor([3]), torch.tensor([0, 1, 2, 0]), 4)
    assert short is not None and exact is not None
    qo_lens, kv_lens = torch.tensor([4]).numpy(), torch.tensor([7]).numpy()
    assert torch.equal(short.custom_mask(qo_lens, kv_lens), exact.custom_mask(qo_lens, kv_lens))
    with pytest.raises(ValueError, match="entries"):
        short.custom_mask(torch.tensor([5]).numpy(), torch.tensor([8]).numpy())

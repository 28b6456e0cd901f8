"""Paged KV cache helpers: append kernel, batch indices/positions, layouts."""

from __future__ import annotations

import pytest
import torch

from flashtune.ops.attention import (
    BatchDecodeWithPagedKVCacheWrapper,
    append_paged_kv_cache,
    batch_decode_ref,
    get_batch_indices_positions,
    get_seq_lens,
    split_kv_cache,
)
from flashtune.ops.attention.page import (
    append_paged_kv_cache_ref,
    build_page_table,
    get_batch_indices_positions_ref,
)
from flashtune.ops.attention.reference import gather_paged_kv


def test_get_batch_indices_positions(device):
    append = [3, 0, 1, 7]
    seq_lens = torch.tensor([10, 4, 1, 7], dtype=torch.int32, device=device)
    append_indptr = torch.tensor([0, 3, 3, 4, 11], dtype=torch.int32, device=device)
    b, p = get_batch_indices_positions(append_indptr, seq_lens, 12)
    rb, rp = get_batch_indices_positions_ref(append_indptr, seq_lens, 12)
    assert torch.equal(b, rb) and torch.equal(p, rp)
    assert b[:11].tolist() == [0, 0, 0, 2] + [3] * 7
    assert p[:11].tolist() == [7, 8, 9, 0] + list(range(7))
    assert sum(append) == 11


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size,five_d", [(16, True), (1, False), (5, True)])
def test_append_paged_kv_cache(layout, page_size, five_d, device):
    hk, d = 3, 64
    old = [0, 17, 5]
    new = [4, 1, 20]
    lens = [o + n for o, n in zip(old, new, strict=True)]
    indptr, indices, last, n_pages = build_page_table(lens, page_size, extra_pages=1)
    shape = (n_pages, page_size, hk, d) if layout == "NHD" else (n_pages, hk, page_size, d)
    if five_d:
        cache = torch.randn(n_pages, 2, *shape[1:], dtype=torch.float16, device=device)
        ref_cache = cache.clone()
    else:
        cache = tuple(torch.randn(shape, dtype=torch.float16, device=device) for _ in range(2))
        ref_cache = tuple(c.clone() for c in cache)
    nnz = sum(new)
    key = torch.randn(nnz, hk, d, dtype=torch.float16, device=device)
    val = torch.randn(nnz, hk, d, dtype=torch.float16, device=device)
    append_indptr = torch.tensor([0, 4, 5, 25], dtype=torch.int32, device=device)
    seq_lens = get_seq_lens(indptr, last, page_size).to(device)
    bi, pos = get_batch_indices_positions(append_indptr, seq_lens, nnz)
    args = (bi, pos)
    table = (indices.to(device), indptr.to(device), last.to(device))
    append_paged_kv_cache(key, val, *args, cache, *table, kv_layout=layout)
    append_paged_kv_cache_ref(key, val, *args, ref_cache, *table, kv_layout=layout)
    k, v = split_kv_cache(cache, layout)
    rk, rv = split_kv_cache(ref_cache, layout)
    assert torch.equal(k, rk) and torch.equal(v, rv)
    # The appended tokens are the last ones of each request: read them back.
    kb, vb = gather_paged_kv(k, v, indptr, indices, last, 2)
    assert torch.equal(kb[-20:], key[5:25]) and torch.equal(vb[-20:], val[5:25])


def test_append_then_decode(device):
    """Build a cache by appending every token, then decode: same as the reference."""
    lens, ps, hq, hk, d = [9, 33], 16, 4, 2, 64
    indptr, indices, last, n_pages = build_page_table(lens, ps)
    cache = torch.zeros(n_pages, 2, ps, hk, d, dtype=torch.float16, device=device)
    nnz = sum(lens)
    key = torch.randn(nnz, hk, d, dtype=torch.float16, device=device)
    val = torch.randn(nnz, hk, d, dtype=torch.float16, device=device)
    append_indptr = torch.tensor([0, 9, 42], dtype=torch.int32, device=device)
    bi, pos = get_batch_indices_positions(
        append_indptr, torch.tensor(lens, dtype=torch.int32, device=device), nnz
    )
    append_paged_kv_cache(key, val, bi, pos, cache, indices, indptr, last)
    q = torch.randn(2, hq, d, dtype=torch.float16, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(2**22, dtype=torch.uint8, device=device))
    w.plan(indptr, indices, last, hq, hk, d, ps)
    out = w.run(q, cache)
    for b, (s, e) in enumerate([(0, 9), (9, 42)]):
        ref, _ = batch_decode_ref(
            q[b : b + 1],
            key[s:e, None],
            val[s:e, None],
            torch.tensor([0, e - s]),
            torch.arange(e - s),
            torch.tensor([1]),
        )
        torch.testing.assert_close(out[b : b + 1], ref, atol=2e-3, rtol=2e-3)


def test_append_bad_input(device):
    cache = torch.randn(4, 2, 16, 2, 64, dtype=torch.float16, device=device)
    key = torch.randn(3, 2, 64, dtype=torch.float16, device=device)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    table = (i32([0, 1]), i32([0, 1, 2]), i32([3, 16]))
    with pytest.raises(ValueError, match="append_key"):
        append_paged_kv_cache(key[:, :1], key, i32([0, 0, 1]), i32([0, 1, 0]), cache, *table)
    with pytest.raises(ValueError, match="batch_indices"):
        append_paged_kv_cache(key, key, i32([0, 0]), i32([0, 1]), cache, *table)
    with pytest.raises(ValueError, match="beyond"):
        append_paged_kv_cache(key, key, i32([0, 0, 0]), i32([0, 1, 5]), cache, *table)
    with pytest.raises(ValueError, match="page ids"):
        append_paged_kv_cache(
            key, key, i32([0, 0, 1]), i32([0, 1, 0]), cache, i32([0, 7]), *table[1:]
        )
    with pytest.raises(ValueError, match="kv_layout"):
        split_kv_cache(cache, "NDH")

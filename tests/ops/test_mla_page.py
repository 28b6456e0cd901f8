"""MLA's paged-cache append (`append_paged_mla_kv_cache`, FlashInfer's flashinfer.page name):
each token's latent and RoPE rows land in the page and slot its position gives, nothing else
is written; the Triton kernel (interpreter, GPU) and the reference agree."""

from __future__ import annotations

import pytest
import torch

from flashtune.ops.attention.page import get_batch_indices_positions, get_seq_lens
from flashtune.ops.mla import append_paged_mla_kv_cache
from flashtune.ops.mla.page import append_paged_mla_kv_cache_ref

DC, DP = 512, 64


def _append_case(kv_lens, page_size, device, dtype=torch.float16):
    """A shuffled page table for kv_lens, all tokens appended: (args, pages of request b)."""
    pages = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages) + 2
    indices = torch.randperm(num_pages)[: sum(pages)].to(torch.int32).to(device)
    indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(pages).cumsum(0)
    last = torch.tensor([(n - 1) % page_size + 1 for n in kv_lens], dtype=torch.int32)
    append_indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int32)
    append_indptr[1:] = torch.tensor(kv_lens).cumsum(0)
    indptr, last, append_indptr = indptr.to(device), last.to(device), append_indptr.to(device)
    nnz = sum(kv_lens)
    batch_indices, positions = get_batch_indices_positions(
        append_indptr, get_seq_lens(indptr, last, page_size).to(torch.int32), nnz
    )
    ckv = torch.randn(nnz, DC, device=device).to(dtype)
    kpe = torch.randn(nnz, DP, device=device).to(dtype)
    ckv_cache = torch.zeros(num_pages, page_size, DC, dtype=dtype, device=device)
    kpe_cache = torch.zeros(num_pages, page_size, DP, dtype=dtype, device=device)
    return (ckv, kpe, batch_indices, positions, ckv_cache, kpe_cache, indices, indptr, last)


def _expected(args):
    ckv, kpe, bi, pos, ckv_cache, kpe_cache, indices, indptr, _ = args
    want_c, want_p = torch.zeros_like(ckv_cache), torch.zeros_like(kpe_cache)
    page_size = ckv_cache.shape[1]
    for i in range(ckv.shape[0]):
        b, p = int(bi[i]), int(pos[i])
        page = int(indices[int(indptr[b]) + p // page_size])
        want_c[page, p % page_size] = ckv[i]
        want_p[page, p % page_size] = kpe[i]
    return want_c, want_p


@pytest.mark.interpreter
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_append_writes_each_row_to_its_slot(page_size):
    args = _append_case([45, 8, 25, 1], page_size, torch.device("cpu"))
    append_paged_mla_kv_cache(*args)
    want_c, want_p = _expected(args)
    assert torch.equal(args[4], want_c) and torch.equal(args[5], want_p)


def test_reference_path(monkeypatch):
    monkeypatch.setenv("FLASHTUNE_FORCE_REFERENCE", "1")
    args = _append_case([7, 30], 16, torch.device("cpu"))
    append_paged_mla_kv_cache(*args)
    want_c, want_p = _expected(args)
    assert torch.equal(args[4], want_c) and torch.equal(args[5], want_p)
    copy = [a.clone() for a in args]
    copy[4].zero_(), copy[5].zero_()
    append_paged_mla_kv_cache_ref(*copy[:8])
    assert torch.equal(copy[4], want_c) and torch.equal(copy[5], want_p)


def test_bad_input_is_named():
    args = list(_append_case([5, 3], 4, torch.device("cpu")))
    with pytest.raises(ValueError, match="append_ckv must be"):
        append_paged_mla_kv_cache(args[0][:, :256], *args[1:])
    with pytest.raises(ValueError, match="kpe_cache"):
        append_paged_mla_kv_cache(*args[:5], args[5][:, :2], *args[6:])
    with pytest.raises(ValueError, match="positions must have shape"):
        append_paged_mla_kv_cache(*args[:3], args[3][:4], *args[4:])
    bad = args[3].clone()
    bad[0] = 100
    with pytest.raises(ValueError, match="past its request's pages"):
        append_paged_mla_kv_cache(*args[:3], bad, *args[4:])
    with pytest.raises(TypeError, match="kv_indices must be int32 or int64"):
        append_paged_mla_kv_cache(*args[:6], args[6].float(), *args[7:])


@pytest.mark.cuda
@pytest.mark.parametrize("page_size", [1, 64])
def test_gpu_append(page_size):
    args = _append_case([45, 4096, 8, 400], page_size, torch.device("cuda"), torch.bfloat16)
    append_paged_mla_kv_cache(*args)
    want_c, want_p = _expected([a.cpu() for a in args])
    assert torch.equal(args[4].cpu(), want_c) and torch.equal(args[5].cpu(), want_p)

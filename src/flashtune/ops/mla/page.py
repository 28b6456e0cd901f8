"""Appending tokens to MLA's paged latent cache: FlashInfer's `append_paged_mla_kv_cache`
(flashinfer.page), the MLA form of `append_paged_kv_cache`. A token's entry is its latent
`ckv` row and its RoPE `kpe` row (one "head", shared by every query head), written to the
page and slot its request's page table gives its position:
page = kv_indices[kv_indptr[b] + pos // page_size], slot = pos % page_size.

One Triton program per appended token writes both rows; the reference (CPU without the
interpreter, FLASHTUNE_FORCE_REFERENCE) indexes the caches in PyTorch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashtune import env
from flashtune.ops.mla.launch import use_kernels

__all__ = ["append_paged_mla_kv_cache", "append_paged_mla_kv_cache_ref"]


@triton.jit
def _append_paged_mla_kernel(
    ckv_ptr,  # [nnz, D_CKV]
    kpe_ptr,  # [nnz, D_KPE]
    batch_indices_ptr,  # [nnz]
    positions_ptr,  # [nnz]
    ckv_cache_ptr,  # [num_pages, page_size, D_CKV]
    kpe_cache_ptr,  # [num_pages, page_size, D_KPE]
    kv_indices_ptr,  # [nnz_pages]
    kv_indptr_ptr,  # [B + 1]
    stride_cn,
    stride_pn,
    stride_ccp,
    stride_cct,
    stride_pcp,
    stride_pct,
    PAGE_SIZE: tl.constexpr,
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    BLOCK_CKV: tl.constexpr,
    BLOCK_KPE: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    b = tl.load(batch_indices_ptr + i)
    pos = tl.load(positions_ptr + i)
    page = tl.load(kv_indices_ptr + tl.load(kv_indptr_ptr + b) + pos // PAGE_SIZE).to(tl.int64)
    slot = (pos % PAGE_SIZE).to(tl.int64)
    c = tl.arange(0, BLOCK_CKV)
    row = tl.load(ckv_ptr + i * stride_cn + c, mask=c < D_CKV)
    dst = ckv_cache_ptr + page * stride_ccp + slot * stride_cct + c
    tl.store(dst, row.to(ckv_cache_ptr.dtype.element_ty), mask=c < D_CKV)
    p = tl.arange(0, BLOCK_KPE)
    row_pe = tl.load(kpe_ptr + i * stride_pn + p, mask=p < D_KPE)
    dst_pe = kpe_cache_ptr + page * stride_pcp + slot * stride_pct + p
    tl.store(dst_pe, row_pe.to(kpe_cache_ptr.dtype.element_ty), mask=p < D_KPE)


def append_paged_mla_kv_cache_ref(
    append_ckv: torch.Tensor,
    append_kpe: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
) -> None:
    """Each appended token's rows written to its page and slot (in place)."""
    page_size = ckv_cache.shape[1]
    bi = batch_indices.to(torch.long)
    pos = positions.to(torch.long)
    pages = kv_indices.to(torch.long)[kv_indptr.to(torch.long)[bi] + pos // page_size]
    slots = pos % page_size
    ckv_cache[pages, slots] = append_ckv.to(ckv_cache.dtype)
    kpe_cache[pages, slots] = append_kpe.to(kpe_cache.dtype)


def _index(name: str, t: object, length: int | None, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != 1 or (length is not None and t.numel() != length):
        want = f"({length},)" if length is not None else "1-D"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the caches are on {device}")
    return t.contiguous()


def _rows(name: str, t: object, cache: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dim() != 2 or t.shape[1] != cache.shape[2]:
        raise ValueError(f"{name} must be [nnz, {cache.shape[2]}], got {tuple(t.shape)}")
    if t.device != cache.device:
        raise ValueError(f"{name} is on {t.device} but the caches are on {cache.device}")
    return t if t.stride(-1) == 1 else t.contiguous()


def append_paged_mla_kv_cache(
    append_ckv: torch.Tensor,
    append_kpe: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    ckv_cache: torch.Tensor | None,
    kpe_cache: torch.Tensor | None,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
) -> None:
    """Write new tokens' latent rows into MLA's paged cache in place (FlashInfer API).

    append_ckv [nnz, head_dim_ckv], append_kpe [nnz, head_dim_kpe]; batch_indices,
    positions [nnz] (from `get_batch_indices_positions`); ckv_cache [pages, page_size,
    head_dim_ckv], kpe_cache [pages, page_size, head_dim_kpe]; the page table (kv_indices,
    kv_indptr [B + 1], kv_last_page_len [B]) must already hold the pages the new tokens land
    in. Any head dims (FlashInfer's kernel: 512 and 64 only); rows are cast to the caches'
    dtype. Index contents are checked on CPU tensors, on a GPU with FLASHTUNE_DEBUG_CHECKS.
    """
    for name, cache in (("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache)):
        if not isinstance(cache, torch.Tensor) or cache.dim() != 3:
            raise ValueError(f"{name} must be a [num_pages, page_size, head_dim] tensor")
        if cache.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    assert isinstance(ckv_cache, torch.Tensor) and isinstance(kpe_cache, torch.Tensor)
    if tuple(kpe_cache.shape[:2]) != tuple(ckv_cache.shape[:2]) or (
        kpe_cache.device != ckv_cache.device
    ):
        raise ValueError(
            f"kpe_cache {tuple(kpe_cache.shape)} on {kpe_cache.device} must have ckv_cache's "
            f"pages and page size {tuple(ckv_cache.shape[:2])} on {ckv_cache.device}"
        )
    device = ckv_cache.device
    ckv = _rows("append_ckv", append_ckv, ckv_cache)
    kpe = _rows("append_kpe", append_kpe, kpe_cache)
    nnz = ckv.shape[0]
    if kpe.shape[0] != nnz:
        raise ValueError(f"append_kpe has {kpe.shape[0]} rows, append_ckv {nnz}")
    bi = _index("batch_indices", batch_indices, nnz, device)
    pos = _index("positions", positions, nnz, device)
    indices = _index("kv_indices", kv_indices, None, device)
    indptr = _index("kv_indptr", kv_indptr, None, device)
    batch = indptr.numel() - 1
    _index("kv_last_page_len", kv_last_page_len, batch, device)
    page_size = ckv_cache.shape[1]
    if (env.DEBUG_CHECKS.get() or device.type == "cpu") and nnz:
        b, p = bi.to(torch.int64), pos.to(torch.int64)
        if int(b.min()) < 0 or int(b.max()) >= batch or int(p.min()) < 0:
            raise ValueError("batch_indices/positions out of range for the page table")
        ip = indptr.to(torch.int64)
        if bool((p // page_size >= (ip[1:] - ip[:-1])[b]).any()):
            raise ValueError("a position lies past its request's pages")
        used = indices[ip[b] + p // page_size].to(torch.int64)
        if int(used.min()) < 0 or int(used.max()) >= ckv_cache.shape[0]:
            raise ValueError(f"kv_indices hold page ids outside 0..{ckv_cache.shape[0] - 1}")
    if nnz == 0:
        return
    if not use_kernels(device):
        append_paged_mla_kv_cache_ref(ckv, kpe, bi, pos, ckv_cache, kpe_cache, indices, indptr)
        return
    d_ckv, d_kpe = ckv_cache.shape[2], kpe_cache.shape[2]
    _append_paged_mla_kernel[(nnz,)](
        ckv,
        kpe,
        bi,
        pos,
        ckv_cache,
        kpe_cache,
        indices,
        indptr,
        ckv.stride(0),
        kpe.stride(0),
        ckv_cache.stride(0),
        ckv_cache.stride(1),
        kpe_cache.stride(0),
        kpe_cache.stride(1),
        PAGE_SIZE=page_size,
        D_CKV=d_ckv,
        D_KPE=d_kpe,
        BLOCK_CKV=triton.next_power_of_2(max(d_ckv, 1)),
        BLOCK_KPE=triton.next_power_of_2(max(d_kpe, 1)),
    )

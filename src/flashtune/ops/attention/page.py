"""The paged KV cache layout.

A paged KV cache is a block-sparse row matrix: `kv_indptr` [B+1] and `kv_indices` (the CSR
index) list each request's pages, `kv_last_page_len` [B] says how many tokens its last page
holds. Pages are stored in one of two layouts:
- NHD: [num_pages, page_size, num_kv_heads, head_dim]
- HND: [num_pages, num_kv_heads, page_size, head_dim]
either as one 5-D tensor [num_pages, 2, ...] (k at index 0, v at 1) or as a (k, v) pair.
"""

from __future__ import annotations

import torch

__all__ = ["KV_LAYOUTS", "split_kv_cache"]

KV_LAYOUTS = ("NHD", "HND")


def split_kv_cache(
    paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor], kv_layout: str = "NHD"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (k, v) as views of logical shape [num_pages, page_size, num_kv_heads, head_dim].

    HND storage is returned permuted (a view, no copy), so kernels that take strides read
    either layout through the same code path.
    """
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(
                f"paged_kv_cache as a tuple must be (k, v), got {len(paged_kv_cache)} tensors"
            )
        k, v = paged_kv_cache
        if k.shape != v.shape:
            raise ValueError(
                f"paged_kv_cache: k shape {tuple(k.shape)} != v shape {tuple(v.shape)}"
            )
    elif isinstance(paged_kv_cache, torch.Tensor):
        if paged_kv_cache.dim() != 5 or paged_kv_cache.shape[1] != 2:
            raise ValueError(
                "paged_kv_cache as one tensor must be 5-D [num_pages, 2, ...], got shape "
                f"{tuple(paged_kv_cache.shape)}"
            )
        k, v = paged_kv_cache[:, 0], paged_kv_cache[:, 1]
    else:
        raise TypeError(
            f"paged_kv_cache must be a tensor or a (k, v) tuple, got {type(paged_kv_cache).__name__}"
        )
    if k.dim() != 4:
        raise ValueError(
            f"paged_kv_cache: k and v must be 4-D per page table entry, got shape {tuple(k.shape)}"
        )
    if kv_layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return k, v

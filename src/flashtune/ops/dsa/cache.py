"""The DSA indexer's key cache layout (deep_gemm's, as DeepSeek-V3.2's serving stacks hold it):
[num_pages, page_size, 1, D + 4] int8 where each page's bytes are its page_size * D fp8 e4m3
key values first, then its page_size float32 scales (one per token). A token's real key is
fp8 value * scale.

`pack_index_cache` quantizes float keys into that layout (one scale per token: its absolute
max over 448, e4m3's largest value); `index_cache_views` gives the two views the kernel reads
(fp8 values and float32 scales, as strided tensors over the same bytes).
"""

from __future__ import annotations

import torch

__all__ = ["FP8_MAX", "index_cache_views", "pack_index_cache", "unpack_index_cache"]

FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def pack_index_cache(keys: torch.Tensor) -> torch.Tensor:
    """keys [num_pages, page_size, D] (any float) -> the packed int8 cache [num_pages,
    page_size, 1, D + 4], one scale per token (amax / 448, at least 1e-4 / 448)."""
    if keys.dim() != 3:
        raise ValueError(f"keys must be [num_pages, page_size, head_dim], got {tuple(keys.shape)}")
    num_pages, page_size, head_dim = keys.shape
    k = keys.to(torch.float32)
    scale = k.abs().amax(dim=-1).clamp(min=1e-4) / FP8_MAX  # [P, page_size]
    values = (k / scale[..., None]).to(torch.float8_e4m3fn)
    packed = torch.empty(num_pages, page_size * (head_dim + 4), dtype=torch.uint8, device=k.device)
    packed[:, : page_size * head_dim] = values.view(torch.uint8).reshape(num_pages, -1)
    packed[:, page_size * head_dim :] = scale.contiguous().view(torch.uint8).reshape(num_pages, -1)
    return packed.view(torch.int8).view(num_pages, page_size, 1, head_dim + 4)


def index_cache_views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [num_pages, page_size, D] fp8, scales [num_pages, page_size] float32): strided
    views of the packed cache's bytes, no copy (the cache must be contiguous)."""
    if cache.dim() != 4 or cache.shape[2] != 1 or cache.dtype not in (torch.int8, torch.uint8):
        raise ValueError(
            "k_index_cache_fp8 must be an int8 [num_pages, page_size, 1, head_dim + 4] tensor, "
            f"got {str(cache.dtype).removeprefix('torch.')} {tuple(cache.shape)}"
        )
    if not cache.is_contiguous():
        raise ValueError("k_index_cache_fp8 must be contiguous (its pages are packed bytes)")
    num_pages, page_size, _, width = cache.shape
    head_dim = width - 4
    flat = cache.view(torch.uint8).view(num_pages, page_size * width)
    values = flat.view(torch.float8_e4m3fn)[:, : page_size * head_dim]
    values = values.unflatten(1, (page_size, head_dim))
    # The scales: float32 words page * page_size * width / 4 + page_size * D / 4 + token.
    words = flat.view(torch.float32) if flat.numel() else flat.new_empty(0, 0).view(torch.float32)
    scales = words[:, page_size * head_dim // 4 :]
    return values, scales


def unpack_index_cache(cache: torch.Tensor) -> torch.Tensor:
    """The real keys [num_pages, page_size, D] float32 of a packed cache."""
    values, scales = index_cache_views(cache)
    return values.to(torch.float32) * scales[..., None]

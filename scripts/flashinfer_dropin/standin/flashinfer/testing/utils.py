"""`flashinfer.testing.utils`: the block fp8 quantization helpers FlashInfer's GEMM tests
import (test_groupwise_scaled_gemm_fp8.py), written from what they compute, in torch.

quantize_fp8(x, scale_shape, tile_shape, scale_major_mode): one float32 scale per tile of
x (2-D or 3-D), the power of two at or above max|tile| / 448 (max|tile| at least 1e-4);
x / (scale + 1e-8) in float8_e4m3fn. The scales come in `scale_shape`: "K" lays them out
as the tiles lie in x, any other mode ("MN") with the last two scale axes swapped.
dequantize_fp8(x, x_scale, scale_major_mode) multiplies each tile back by its scale.
"""

from __future__ import annotations

import torch

_FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def _tiles(x: torch.Tensor, tile_shape: tuple[int, ...]) -> torch.Tensor:
    """x [(g0 t0), (g1 t1), ...] viewed as [g0, t0, g1, t1, ...]."""
    shape: list[int] = []
    for size, tile in zip(x.shape, tile_shape, strict=True):
        if size % tile:
            raise ValueError(f"a dimension of {size} is not a multiple of the tile {tile}")
        shape += [size // tile, tile]
    return x.reshape(shape)


def _spread(scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-tile (K-major) scale repeated to x's shape."""
    out = scale
    for dim, size in enumerate(x.shape):
        out = out.repeat_interleave(size // scale.shape[dim], dim=dim)
    return out


def _swap_last(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-2, -1)


def quantize_fp8(
    x: torch.Tensor,
    scale_shape: tuple[int, ...],
    tile_shape: tuple[int, ...],
    scale_major_mode: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    assert x.ndim in (2, 3) and x.ndim == len(scale_shape) == len(tile_shape)
    tiled = _tiles(x.float(), tile_shape).abs()
    amax = tiled.amax(dim=tuple(range(1, 2 * x.ndim, 2))).clamp(min=1e-4)
    scale = torch.pow(2.0, torch.ceil(torch.log2(amax / _FP8_MAX)))  # K-major, as the tiles lie
    x_fp8 = (x / (_spread(scale, x) + 1e-8)).to(torch.float8_e4m3fn)
    if scale_major_mode != "K":
        scale = _swap_last(scale)
    if tuple(scale.shape) != tuple(scale_shape):
        raise ValueError(
            f"scale_shape {tuple(scale_shape)} does not match the tiles: {tuple(scale.shape)}"
        )
    return x_fp8, scale.contiguous()


def dequantize_fp8(x: torch.Tensor, x_scale: torch.Tensor, scale_major_mode: str) -> torch.Tensor:
    assert x.ndim in (2, 3) and x.ndim == x_scale.ndim
    scale = x_scale if scale_major_mode == "K" else _swap_last(x_scale)
    return x.float() * _spread(scale.float(), x)

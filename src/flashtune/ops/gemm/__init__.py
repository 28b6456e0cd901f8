"""GEMM: C = A @ B.T with B stored [N, K] (the FlashInfer-Trace `gemm` definitions), or
C = A @ B with B stored [K, N]; fp16/bf16 (and fp32) inputs, fp32 accumulation, optional bias;
fp8 e4m3 with per-tensor scales and a bf16/fp16 output (`mm_fp8`).

Three runners compute it (launch.py; the kernels live in kernels.py, their tactics, search
spaces and defaults in config.py):
- `CublasRunner`: torch (F.linear / addmm / _scaled_mm), i.e. cuBLAS(Lt) on a GPU.
- `TritonTiledRunner`: a tiled Triton GEMM; tactics span block sizes, warps, stages, group-M
  swizzle and split-K (`TiledTactic`, space `TiledSpace`).
- `TritonSmallMRunner`: the decode GEMM (M <= 16): bound by reading B once, so it spreads
  N and a split K over many CTAs (a split-K grid, or a stream-K schedule with equal work
  per SM) and reads B with 16-byte loads (`SmallMTactic`, space `SmallMSpace`).
  H200, bf16, 162 corpus shapes with M <= 16: 1.08x cuBLAS geomean with the best tactic
  per shape (benchmarks/results/gemm.jsonl).
The public `mm` asks the autotuner (`choose_one("gemm", GEMM_RUNNERS, GEMM_TUNING, ...)`,
M tuned per power-of-two bucket) which runner and tactic to launch.

Layouts: for b_layout="kn" B is passed on as its transposed view, so every runner sees B as a
logical [N, K] tensor and reads it through its strides (no copy).

This module holds the public functions only; the package: reference.py (the contracts in
PyTorch), schema.py (the Definitions' schemas, the model examples), kernels.py (Triton),
config.py (tactics, search spaces, defaults), launch.py (launches, runners, tuning,
validation, the torch custom op).
"""

from __future__ import annotations

import torch

from flashtune.ops.gemm.launch import _mm, _mm_fp8
from flashtune.ops.gemm.schema import GEMM, GEMM_KN, _mm_schema
from flashtune.schema import api

__all__ = ["mm", "gemm", "mm_fp8"]


@api(schema=_mm_schema, schemas=[GEMM, GEMM_KN])
def mm(
    A: torch.Tensor,
    B: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    b_layout: str = "nk",
) -> torch.Tensor:
    """C = A @ B.T (b_layout="nk", B [N, K]) or C = A @ B (b_layout="kn", B [K, N]), + bias.

    A [M, K] and B in float16, bfloat16 or float32 (same dtype); fp32 accumulation; the result
    [M, N] has A's dtype. bias [N] (A's dtype) is added before rounding. out: an optional
    [M, N] tensor to write into (returned).
    """
    return _mm(A, B, bias, b_layout, out)


@api(schema=GEMM)
def gemm(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T (+ bias) for A [M, K] and B [N, K]: the contract of the FlashInfer-Trace
    `gemm` definitions (gemm_n4096_k4096, ...)."""
    return mm.fn(A, B, bias)


def mm_fp8(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    b_layout: str = "nk",
) -> torch.Tensor:
    """C = (A * A_scale) @ (B * B_scale).T (+ bias) for float8_e4m3fn A [M, K] and B [N, K]
    (or [K, N] with b_layout="kn"), per-tensor fp32 scales of shape [] or [1], C in `dtype`
    (bfloat16 or float16)."""
    return _mm_fp8(A, B, A_scale, B_scale, dtype, out, bias, b_layout)

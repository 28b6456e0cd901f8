"""RMSNorm family: rmsnorm, fused_add_rmsnorm and their Gemma variants (weight applied as 1 + w),
under FlashInfer's names and signatures (`flashinfer.norm`).

Numerics follow FlashInfer: x (and x + residual) in fp32, y = x * rsqrt(mean(x^2) + eps) * w
in fp32, cast to the input dtype; fused_add stores residual = x + residual in the residual
dtype and normalizes the fp32 sum.

Layout: reference.py (the references in PyTorch), schema.py (the schemas and the model
examples), kernels.py (the one Triton kernel serving all four ops), config.py (its tactics
and the default), launch.py (launching, the autotuner's runner, validation, the torch
custom ops). This module holds the public functions only.
"""

from __future__ import annotations

import torch

from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.norm.launch import _fused_add, _rmsnorm
from flashtune.ops.norm.schema import (
    FUSED_ADD_RMSNORM,
    GEMMA_FUSED_ADD_RMSNORM,
    GEMMA_RMSNORM,
    RMSNORM,
)
from flashtune.schema import api

__all__ = [*TOP_LEVEL["norm"]]  # FlashInfer's names (flashtune.flashinfer_names)


@api(schema=RMSNORM)
def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Root mean square normalization: out = input / sqrt(mean(input^2) + eps) * weight.

    input: [batch, hidden] or [batch, seq, hidden], float16/bfloat16/float32, last dimension
    contiguous (rows may have a stride); weight: [hidden], same dtype. Returns out.
    enable_pdl: launch with programmatic dependent launch on Hopper and later (None: the
    default of flashtune.ops.pdl); ignored where unsupported.
    """
    return _rmsnorm(input, weight, eps, out, 0.0, enable_pdl)


@api(schema=FUSED_ADD_RMSNORM)
def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """In place: residual += input; input = rmsnorm(residual) * weight (normalizing the fp32
    sum). input and residual: [batch, hidden] or [batch, seq, hidden], same shape and dtype.
    enable_pdl: as in `rmsnorm`."""
    _fused_add(input, residual, weight, eps, 0.0, enable_pdl)


@api(schema=GEMMA_RMSNORM)
def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Gemma RMSNorm: out = input / sqrt(mean(input^2) + eps) * (1 + weight). enable_pdl: as
    in `rmsnorm`."""
    return _rmsnorm(input, weight, eps, out, 1.0, enable_pdl)


@api(schema=GEMMA_FUSED_ADD_RMSNORM)
def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """In place: residual += input; input = rmsnorm(residual) * (1 + weight). enable_pdl: as
    in `rmsnorm`."""
    _fused_add(input, residual, weight, eps, 1.0, enable_pdl)

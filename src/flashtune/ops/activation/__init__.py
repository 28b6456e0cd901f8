"""Gated activations: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul, under FlashInfer's
names and signatures (`flashinfer.activation`).

input [..., 2d] holds the gate in its first half and the up projection in its second half;
out [..., d] = act(input[..., :d]) * input[..., d:], computed in fp32 and cast to the input
dtype (as FlashInfer and vLLM do).

Layout: reference.py (the references in PyTorch), schema.py (the schemas and the model
examples), kernels.py (the one Triton kernel serving all three ops), config.py (its tactics
and the default), launch.py (launching, the autotuner's runner, validation, the torch
custom op). This module holds the public functions only.
"""

from __future__ import annotations

import torch

from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.activation.launch import _GELU, _GELU_TANH, _SILU, _gated
from flashtune.ops.activation.schema import GELU_AND_MUL, GELU_TANH_AND_MUL, SILU_AND_MUL
from flashtune.schema import api

__all__ = [*TOP_LEVEL["activation"]]  # FlashInfer's names (flashtune.flashinfer_names)


@api(schema=SILU_AND_MUL)
def silu_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """SwiGLU gate: silu(input[..., :d]) * input[..., d:]; input [..., 2d] -> [..., d].
    enable_pdl: launch with programmatic dependent launch on Hopper and later (None: the
    default of flashtune.ops.pdl); ignored where unsupported."""
    return _gated(input, out, _SILU, enable_pdl)


@api(schema=GELU_AND_MUL)
def gelu_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """GeGLU gate (exact erf GELU): gelu(input[..., :d]) * input[..., d:]. enable_pdl: as in
    `silu_and_mul`."""
    return _gated(input, out, _GELU, enable_pdl)


@api(schema=GELU_TANH_AND_MUL)
def gelu_tanh_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """GeGLU gate (tanh-approximate GELU): gelu_tanh(input[..., :d]) * input[..., d:].
    enable_pdl: as in `silu_and_mul`."""
    return _gated(input, out, _GELU_TANH, enable_pdl)

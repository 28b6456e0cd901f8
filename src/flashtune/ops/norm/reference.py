"""The RMSNorm family's references in plain PyTorch, one per op: the schemas' references
(their source is emitted into the Definitions), the CPU path and the tests' contract.

Numerics follow FlashInfer: x (and x + residual) in fp32, y = x * rsqrt(mean(x^2) + eps) * w
in fp32, cast to the input dtype.
"""

from __future__ import annotations

import torch

__all__ = [
    "rmsnorm_ref",
    "fused_add_rmsnorm_ref",
    "gemma_rmsnorm_ref",
    "gemma_fused_add_rmsnorm_ref",
]


def rmsnorm_ref(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32, returned in x's dtype."""
    x = hidden_states.to(torch.float32)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x * inv_rms * weight.to(torch.float32)).to(hidden_states.dtype)


def fused_add_rmsnorm_ref(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
):
    """The output, rmsnorm(hidden_states + residual) with the sum in fp32. (The op also
    stores the sum into residual: (hidden_states + residual) in fp32, cast to its dtype.)"""
    x = hidden_states.to(torch.float32) + residual.to(torch.float32)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x * inv_rms * weight.to(torch.float32)).to(hidden_states.dtype)


def gemma_rmsnorm_ref(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6):
    """Gemma's RMSNorm: the weight is stored as an offset from one, y = x_hat * (1 + weight)."""
    x = hidden_states.to(torch.float32)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x * inv_rms * (1.0 + weight.to(torch.float32))).to(hidden_states.dtype)


def gemma_fused_add_rmsnorm_ref(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
):
    """The output of the Gemma fused add + RMSNorm: weight applied as (1 + weight)."""
    x = hidden_states.to(torch.float32) + residual.to(torch.float32)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x * inv_rms * (1.0 + weight.to(torch.float32))).to(hidden_states.dtype)

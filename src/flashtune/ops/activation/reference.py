"""The gated activations' references in plain PyTorch, one per op: the schemas' references
(their source is emitted into the Definitions), the CPU path and the tests' contract.
"""

from __future__ import annotations

import torch

__all__ = ["silu_and_mul_ref", "gelu_and_mul_ref", "gelu_tanh_and_mul_ref"]


def silu_and_mul_ref(input: torch.Tensor) -> torch.Tensor:
    """silu(input[..., :d]) * input[..., d:], in fp32, cast to input's dtype."""
    d = input.shape[-1] // 2
    x = input.to(torch.float32)
    return (torch.nn.functional.silu(x[..., :d]) * x[..., d:]).to(input.dtype)


def gelu_and_mul_ref(input: torch.Tensor) -> torch.Tensor:
    """gelu(input[..., :d]) (exact, erf) * input[..., d:], in fp32, cast to input's dtype."""
    d = input.shape[-1] // 2
    x = input.to(torch.float32)
    return (torch.nn.functional.gelu(x[..., :d]) * x[..., d:]).to(input.dtype)


def gelu_tanh_and_mul_ref(input: torch.Tensor) -> torch.Tensor:
    """gelu(input[..., :d], tanh approximation) * input[..., d:], in fp32."""
    d = input.shape[-1] // 2
    x = input.to(torch.float32)
    gate = torch.nn.functional.gelu(x[..., :d], approximate="tanh")
    return (gate * x[..., d:]).to(input.dtype)

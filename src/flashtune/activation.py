"""`flashinfer.activation` under flashtune's name: the gated activations
(flashtune.ops.activation)."""

from __future__ import annotations

from flashtune.ops.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul

__all__ = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"]

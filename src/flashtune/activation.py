"""`flashinfer.activation` under flashtune's name: the gated activations
(flashtune.ops.activation)."""

from __future__ import annotations

from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.activation import (  # noqa: F401  (re-exported: __all__ is the table's)
    gelu_and_mul,
    gelu_tanh_and_mul,
    silu_and_mul,
)

__all__ = list(TOP_LEVEL["activation"])

"""`flashinfer.norm` under flashtune's name: the RMSNorm family (flashtune.ops.norm)."""

from __future__ import annotations

from flashtune.ops.norm import (
    fused_add_rmsnorm,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    rmsnorm,
)

__all__ = ["rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm"]

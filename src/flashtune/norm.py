"""`flashinfer.norm` under flashtune's name: the RMSNorm family (flashtune.ops.norm)."""

from __future__ import annotations

from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.norm import (  # noqa: F401  (re-exported: __all__ is the table's)
    fused_add_rmsnorm,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    rmsnorm,
)

__all__ = list(TOP_LEVEL["norm"])

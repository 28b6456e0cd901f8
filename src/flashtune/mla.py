"""`flashinfer.mla` under flashtune's name: Multi-head Latent Attention (flashtune.ops.mla)."""

from __future__ import annotations

from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.mla import BatchMLAPagedAttentionWrapper  # noqa: F401  (re-exported)

__all__ = list(TOP_LEVEL["mla"])

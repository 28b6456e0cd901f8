"""`flashinfer.gdn_prefill` under flashtune's name: the chunked Gated Delta Net prefill
(flashtune.ops.gdn; flashtune.gdn holds the family's every call)."""

from __future__ import annotations

from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.gdn import chunk_gated_delta_rule  # noqa: F401  (re-exported)

__all__ = list(TOP_LEVEL["gdn_prefill"])

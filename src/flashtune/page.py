"""`flashinfer.page` under flashtune's name: the paged KV cache helpers."""

from __future__ import annotations

from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.attention import (  # noqa: F401  (re-exported: __all__ is the table's)
    append_paged_kv_cache,
    get_batch_indices_positions,
    get_seq_lens,
)
from flashtune.ops.mla import append_paged_mla_kv_cache  # noqa: F401  (re-exported)

__all__ = list(TOP_LEVEL["page"])

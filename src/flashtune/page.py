"""`flashinfer.page` under flashtune's name: the paged KV cache helpers."""

from __future__ import annotations

from flashtune.ops.attention import (
    append_paged_kv_cache,
    get_batch_indices_positions,
    get_seq_lens,
)

__all__ = ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"]

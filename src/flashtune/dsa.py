"""DeepSeek Sparse Attention under flashtune's name (flashtune.ops.dsa): the top-k indexer and
sparse MLA attention. FlashInfer has no such submodule: the ops carry the FlashInfer-Trace
dsa_paged Definitions' names (flashinfer_names.SUBMODULE_ONLY["dsa"])."""

from __future__ import annotations

from flashtune.flashinfer_names import SUBMODULE_ONLY, TOP_LEVEL
from flashtune.ops.dsa import (  # noqa: F401  (re-exported)
    dsa_sparse_attention,
    dsa_topk_indexer,
    pack_index_cache,
    unpack_index_cache,
)

__all__ = [*TOP_LEVEL["dsa"], *SUBMODULE_ONLY["dsa"], "pack_index_cache", "unpack_index_cache"]

"""`flashinfer.rope` under flashtune's name: rotary position embeddings
(flashtune.ops.rope)."""

from __future__ import annotations

from flashtune.flashinfer_names import SUBMODULE_ONLY, TOP_LEVEL
from flashtune.ops.rope import (  # noqa: F401  (re-exported: __all__ is the table's)
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
    mla_rope_quantize_fp8,
)

__all__ = [*TOP_LEVEL["rope"], *SUBMODULE_ONLY["rope"]]

"""FlashInfer's public names that flashtune serves, by the FlashInfer submodule defining them.

The one list behind `import flashtune as flashinfer`: the package root's lazy table and
`__all__`, the facade submodules' `__all__` (flashtune.norm, flashtune.sampling, ...) and the
op modules' `__all__` are built from it. Plain data (and the facades' lookup of growing
names), importing no flashtune module: the package root imports it and must stay cheap and
CUDA-free.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["TOP_LEVEL", "GROWING", "SUBMODULE_ONLY", "growing_attributes"]

# FlashInfer's top-level names, by the submodule (facade) that defines them.
TOP_LEVEL: dict[str, tuple[str, ...]] = {
    "activation": ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"),
    "cascade": (
        "MultiLevelCascadeAttentionWrapper",
        "merge_state",
        "merge_state_in_place",
        "merge_states",
    ),
    "decode": ("BatchDecodeWithPagedKVCacheWrapper", "single_decode_with_kv_cache"),
    "norm": ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm"),
    "page": ("append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"),
    "prefill": (
        "BatchPrefillWithPagedKVCacheWrapper",
        "BatchPrefillWithRaggedKVCacheWrapper",
        "single_prefill_with_kv_cache",
        "single_prefill_with_kv_cache_return_lse",
    ),
    "rope": (
        "apply_rope",
        "apply_rope_inplace",
        "apply_rope_pos_ids",
        "apply_rope_pos_ids_inplace",
        "apply_llama31_rope",
        "apply_llama31_rope_inplace",
        "apply_llama31_rope_pos_ids",
        "apply_llama31_rope_pos_ids_inplace",
        "apply_rope_with_cos_sin_cache",
        "apply_rope_with_cos_sin_cache_inplace",
    ),
    "sparse": ("BlockSparseAttentionWrapper", "VariableBlockSparseAttentionWrapper"),
    "sampling": (
        "softmax",
        "sampling_from_probs",
        "sampling_from_logits",
        "top_p_sampling_from_probs",
        "top_k_sampling_from_probs",
        "min_p_sampling_from_probs",
        "top_k_top_p_sampling_from_probs",
        "top_k_top_p_sampling_from_logits",
        "top_p_renorm_probs",
        "top_p_renorm_prob",
        "top_k_renorm_probs",
        "top_k_renorm_prob",
        "top_k_mask_logits",
        "chain_speculative_sampling",
    ),
}

# Top-level names the attention package is still growing: exported (at the top level and in
# their facade) once flashtune.ops.attention has them, looked up at access time.
GROWING: dict[str, tuple[str, ...]] = {
    "cascade": (
        "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
        "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
    ),
    "decode": ("CUDAGraphBatchDecodeWithPagedKVCacheWrapper",),
}

# Names FlashInfer keeps in a submodule only, not at its top level.
SUBMODULE_ONLY: dict[str, tuple[str, ...]] = {"rope": ("mla_rope_quantize_fp8",)}


def growing_attributes(module: str, family: str, source: ModuleType) -> Callable[[str], Any]:
    """The module `__getattr__` of a facade whose family has GROWING names: its `__all__` is
    the family's TOP_LEVEL names plus the growing ones `source` has now (so `from facade import
    *` takes only what exists); a growing name resolves to `source`'s at access time."""
    present, growing = TOP_LEVEL[family], GROWING[family]

    def __getattr__(name: str) -> Any:
        if name == "__all__":
            return [*present, *(n for n in growing if hasattr(source, n))]
        if name in growing and hasattr(source, name):
            return getattr(source, name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__

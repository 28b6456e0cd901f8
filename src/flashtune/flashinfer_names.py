"""FlashInfer's public names that flashtune serves, by the FlashInfer submodule defining them.

The one list behind `import flashtune as flashinfer`: the package root's lazy table and
`__all__`, the facade submodules' `__all__` (flashtune.norm, flashtune.sampling, ...), the op
packages' `__all__` and scripts/check_layers.py's facade list are built from it. Plain data,
importing no flashtune module: the package root imports it and must stay cheap and CUDA-free.
A new family with FlashInfer names adds its entry here and a facade module
`flashtune/<submodule>.py` re-exporting them.
"""

from __future__ import annotations

__all__ = ["TOP_LEVEL", "SUBMODULE_ONLY"]

# FlashInfer's top-level names, by the submodule (facade) that defines them.
TOP_LEVEL: dict[str, tuple[str, ...]] = {
    "activation": ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"),
    "cascade": (
        "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
        "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
        "MultiLevelCascadeAttentionWrapper",
        "merge_state",
        "merge_state_in_place",
        "merge_states",
    ),
    "decode": (
        "BatchDecodeWithPagedKVCacheWrapper",
        "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
        "single_decode_with_kv_cache",
    ),
    # mm_fp8 and its weight preparation: FlashInfer's current top level (not 0.2.14's)
    "gemm": ("bmm_fp8", "mm_fp8", "prepare_low_latency_gemm_weights"),
    "fused_moe": (
        "RoutingMethodType",
        "trtllm_fp8_block_scale_moe",
        "trtllm_fp8_per_tensor_scale_moe",
        "trtllm_bf16_moe",
    ),
    # Gated Delta Net: FlashInfer's flashinfer.gdn_prefill and flashinfer.gdn_decode, and all of
    # them in flashtune.gdn (the module FlashInfer-Trace's gdn Definitions name: fi_api:
    # flashinfer.gdn.*)
    "gdn": (),
    "gdn_decode": (),
    "gdn_prefill": ("chunk_gated_delta_rule",),
    # FlashInfer's mamba submodule: none of its names are at its top level (SUBMODULE_ONLY)
    "mamba": (),
    # flashtune's DeepSeek Sparse Attention (FlashInfer has no Python API of its contracts:
    # the names are FlashInfer-Trace's dsa_paged Definitions'); none at the top level
    "dsa": (),
    "mla": ("BatchMLAPagedAttentionWrapper",),
    "norm": ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm"),
    "page": (
        "append_paged_kv_cache",
        "append_paged_mla_kv_cache",
        "get_batch_indices_positions",
        "get_seq_lens",
    ),
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

# Names FlashInfer keeps in a submodule only, not at its top level.
SUBMODULE_ONLY: dict[str, tuple[str, ...]] = {
    "gemm": (
        "gemm_fp8_nt_groupwise",
        "gemm_fp8_nt_blockscaled",
        "group_gemm_fp8_nt_groupwise",
        "group_deepgemm_fp8_nt_groupwise",
        "batch_deepgemm_fp8_nt_groupwise",
    ),
    "gdn": (
        "chunk_gated_delta_rule",
        "gated_delta_rule_decode",
        "gated_delta_rule_decode_pretranspose",
        "gated_delta_rule_mtp",
    ),
    "gdn_decode": (
        "gated_delta_rule_decode",
        "gated_delta_rule_decode_pretranspose",
        "gated_delta_rule_mtp",
    ),
    "mamba": ("selective_state_update",),
    "dsa": ("dsa_topk_indexer", "dsa_sparse_attention"),
    "rope": ("mla_rope_quantize_fp8",),
}

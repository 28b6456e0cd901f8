"""Attention over paged KV caches: FlashInfer-compatible wrappers over Triton kernels.

One package per job, each on the op families' layout (`__init__`: the public API; schema,
kernels, config, plan, launch beside it): decode/ (the batch decode wrappers, single decode and
`paged_decode`), prefill/ (the paged and ragged prefill wrappers, single prefill,
`paged_prefill` and `ragged_prefill`), cascade/ (multi-level cascade and FlashInfer's older
shared-prefix wrappers on top of it), sparse/ (block-sparse attention, a configuration of the
paged prefill). plan_free.py in decode/ and prefill/ holds the plan-free calls: single calls
that find their work on the device (no plan, no host sync: CUDA-graph capturable end to end).

Shared by the jobs, as modules of this package: the paged KV cache helpers (page.py), merging
of attention states (merge.py), the references (reference.py), the CPU scheduler of the
planned decode and of MLA (scheduler.py), RoPE inside the kernels (rotary.py), fp8 tiles in
q's dtype (tile_dtype.py), host <-> device staging of plans (staging.py), FlashInfer's
convenience aliases of the wrappers (aliases.py) and the attention variant a plan fixes
(variant.py: scale, causal, window, soft-cap, RoPE, ALiBi), which the references take too.
"""

from __future__ import annotations

from flashtune.ops.attention.cascade import (
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
    BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)
from flashtune.ops.attention.decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    paged_decode,
    single_decode_with_kv_cache,
)
from flashtune.ops.attention.merge import merge_state, merge_state_in_place, merge_states
from flashtune.ops.attention.page import (
    append_paged_kv_cache,
    get_batch_indices_positions,
    get_seq_lens,
    split_kv_cache,
)
from flashtune.ops.attention.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    paged_prefill,
    ragged_prefill,
    single_prefill_with_kv_cache,
)
from flashtune.ops.attention.reference import (
    batch_decode_ref,
    gqa_paged_decode_ref,
    merge_state_ref,
    merge_states_ref,
    paged_attention_ref,
    single_decode_ref,
)
from flashtune.ops.attention.variant import AttentionVariant

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "MultiLevelCascadeAttentionWrapper",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "paged_decode",
    "paged_prefill",
    "ragged_prefill",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "append_paged_kv_cache",
    "get_batch_indices_positions",
    "get_seq_lens",
    "split_kv_cache",
    "batch_decode_ref",
    "gqa_paged_decode_ref",
    "single_decode_ref",
    "paged_attention_ref",
    "merge_state_ref",
    "merge_states_ref",
    "AttentionVariant",
]

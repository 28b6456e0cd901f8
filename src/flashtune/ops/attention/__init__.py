"""Attention over paged KV caches: FlashInfer-compatible wrappers over Triton kernels.

Decode (decode.py) and prefill (prefill.py), each with its kernels, launch policy, host plan
and runner beside it (decode_kernels / decode_config / decode_plan / decode_run.py, and the
prefill_* modules likewise); merging of attention states (merge.py), cascade (cascade.py) and FlashInfer's older
shared-prefix wrappers on top of it (shared_prefix.py),
the paged KV cache helpers (page.py), the CPU scheduler (scheduler.py) and the references
(reference.py). planless.py and planless_prefill.py offer decode and prefill as single calls
that schedule their work on the device (no plan, no host sync: CUDA-graph capturable end to
end).
"""

from __future__ import annotations

from flashtune.ops.attention.cascade import MultiLevelCascadeAttentionWrapper
from flashtune.ops.attention.decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    single_decode_with_kv_cache,
)
from flashtune.ops.attention.merge import merge_state, merge_state_in_place, merge_states
from flashtune.ops.attention.page import (
    append_paged_kv_cache,
    get_batch_indices_positions,
    get_seq_lens,
    split_kv_cache,
)
from flashtune.ops.attention.planless import paged_decode
from flashtune.ops.attention.planless_prefill import paged_prefill, ragged_prefill
from flashtune.ops.attention.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
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
from flashtune.ops.attention.shared_prefix import (
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
    BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
)

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
]

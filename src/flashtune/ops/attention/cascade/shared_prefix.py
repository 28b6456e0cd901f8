"""FlashInfer 0.2.14's shared-prefix wrappers (cascade of two levels, its older API).

Every request attends to one shared prefix, given as contiguous k_shared/v_shared
[prefix_len, Hkv, D] (NHD) or [Hkv, prefix_len, D] (HND), followed by its own KV in a paged
cache. forward computes the prefix part with `single_prefill_with_kv_cache` (all queries of
the batch as one request, non-causal: every query sees the whole prefix), the unique part
with the batch decode or prefill wrapper, and merges the two attention states
(`merge_state_in_place`). `MultiLevelCascadeAttentionWrapper` (cascade/__init__.py) is the general
form, with the prefix in the paged cache too.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.ops.attention.decode import BatchDecodeWithPagedKVCacheWrapper
from flashtune.ops.attention.merge import merge_state_in_place
from flashtune.ops.attention.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    single_prefill_with_kv_cache,
)

__all__ = [
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
]


class _SharedPrefixWrapper:
    """What both wrappers share: the wrapper of the unique part, and the merge of its
    attention state with the shared prefix's."""

    def __init__(
        self,
        unique: BatchDecodeWithPagedKVCacheWrapper | BatchPrefillWithPagedKVCacheWrapper,
        kv_layout: str,
    ) -> None:
        self._unique = unique
        self._kv_layout = kv_layout

    def end_forward(self) -> None:
        """FlashInfer compatibility no-op."""

    def reset_workspace_buffer(
        self, float_workspace_buffer: torch.Tensor, int_workspace_buffer: Any = None
    ) -> None:
        self._unique.reset_workspace_buffer(float_workspace_buffer)

    def _with_prefix(
        self,
        q: torch.Tensor,
        k_shared: torch.Tensor,
        v_shared: torch.Tensor,
        sm_scale: float | None,
        unique: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """The attention of every query token of q [tokens, Hq, D] over the whole shared
        prefix (non-causal), merged with `unique`, its (out, lse) over its own pages."""
        out, lse = single_prefill_with_kv_cache(
            q,
            k_shared,
            v_shared,
            causal=False,
            kv_layout=self._kv_layout,
            sm_scale=sm_scale,
            return_lse=True,
        )
        merge_state_in_place(out, lse, *unique)
        return out


class BatchDecodeWithSharedPrefixPagedKVCacheWrapper(_SharedPrefixWrapper):
    """Decode of a batch sharing one prefix (FlashInfer's wrapper of the same name)."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD") -> None:
        self._batch_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            float_workspace_buffer, kv_layout
        )
        super().__init__(self._batch_decode_wrapper, kv_layout)

    def begin_forward(
        self,
        unique_kv_indptr: torch.Tensor,
        unique_kv_indices: torch.Tensor,
        unique_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        data_type: str | torch.dtype = "float16",
    ) -> None:
        """Plan the unique (per-request) part: the page table of each request's own KV."""
        self._batch_decode_wrapper.plan(
            unique_kv_indptr,
            unique_kv_indices,
            unique_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            pos_encoding_mode="NONE",
            q_data_type=data_type,  # the queries share the cache's dtype here
            data_type=data_type,
        )

    plan = begin_forward

    def forward(
        self,
        q: torch.Tensor,
        k_shared: torch.Tensor,
        v_shared: torch.Tensor,
        unique_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """q [batch, Hq, D] over the shared prefix then each request's own pages."""
        # The plan's scale is FlashInfer's default too: 1 / sqrt(head_dim).
        unique = self._batch_decode_wrapper.run_return_lse(q, unique_kv_cache)
        return self._with_prefix(q, k_shared, v_shared, None, unique)

    run = forward


class BatchPrefillWithSharedPrefixPagedKVCacheWrapper(_SharedPrefixWrapper):
    """Prefill/append of a batch sharing one prefix (FlashInfer's wrapper of the same name)."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD") -> None:
        self._batch_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            float_workspace_buffer, kv_layout
        )
        super().__init__(self._batch_prefill_wrapper, kv_layout)

    def begin_forward(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
    ) -> None:
        """Plan the unique part: each request's queries over its own pages."""
        self._batch_prefill_wrapper.plan(
            qo_indptr,
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
        )

    plan = begin_forward

    def forward(
        self,
        q: torch.Tensor,
        k_shared: torch.Tensor,
        v_shared: torch.Tensor,
        unique_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        causal: bool = False,
        use_fp16_qk_reduction: bool = False,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
    ) -> torch.Tensor:
        """q [qo_indptr[-1], Hq, D] over the shared prefix (non-causal) then each request's
        own pages (`causal` applies there, aligned bottom-right)."""
        unique = self._batch_prefill_wrapper.forward_return_lse(
            q, unique_kv_cache, causal=causal, sm_scale=sm_scale
        )
        return self._with_prefix(q, k_shared, v_shared, sm_scale, unique)

    run = forward

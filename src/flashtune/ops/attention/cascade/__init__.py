"""Cascade attention: KV shared by many requests is stored once and read once per level.

`MultiLevelCascadeAttentionWrapper` (FlashInfer's API) takes one page table per level:
level 0 usually holds a prefix shared by every request, the last level each request's own
suffix. At every level the queries that share an entry are packed together into the MMA
rows of one tile (query tokens x heads of a KV group), so a shared prefix is read once per
tile of up to 64 rows instead of once per request. Each level yields an attention state
(output, base-2 LSE); the states are combined with `merge_state_in_place`.

All levels run on the split-KV paged kernel of decode/, which handles several query
tokens per entry, causal masks aligned bottom-right and sliding windows: decode and small
prefills both work. (For long prefills the prefill kernels of prefill/ are faster.)

FlashInfer 0.2.14's older shared-prefix wrappers, a cascade of two levels, are in
shared_prefix.py.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.ops.attention.cascade.shared_prefix import (
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
    BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
)
from flashtune.ops.attention.decode.launch import run_plan
from flashtune.ops.attention.decode.plan import DecodeSpec, Planner, as_dtype, as_int_tensor
from flashtune.ops.attention.merge import merge_state_in_place
from flashtune.ops.attention.page import KV_LAYOUTS, split_kv_cache
from flashtune.ops.attention.staging import host_int64

__all__ = [
    "MultiLevelCascadeAttentionWrapper",
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
]


class MultiLevelCascadeAttentionWrapper:
    """Attention over a multi-level (shared prefix + suffix) paged KV cache.

    The workspace buffer is split evenly between the levels. `causal` applies at every
    level, as in FlashInfer: for decode (one query per request), pass causal=False.
    """

    def __init__(
        self,
        num_levels: int,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf_arr: list[torch.Tensor] | None = None,
        paged_kv_indptr_buf_arr: list[torch.Tensor] | None = None,
        paged_kv_indices_buf_arr: list[torch.Tensor] | None = None,
        paged_kv_last_page_len_buf_arr: list[torch.Tensor] | None = None,
    ) -> None:
        if not isinstance(num_levels, int) or num_levels < 1:
            raise ValueError(f"num_levels must be a positive int, got {num_levels!r}")
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
        if use_cuda_graph:
            raise NotImplementedError(
                "MultiLevelCascadeAttentionWrapper(use_cuda_graph=True) is not implemented; "
                "BatchDecodeWithPagedKVCacheWrapper supports CUDA graphs"
            )
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise TypeError("float_workspace_buffer must be a tensor")
        raw = float_workspace_buffer.view(torch.uint8).reshape(-1)
        part = (raw.numel() // num_levels) // 256 * 256
        self._num_levels = num_levels
        self._kv_layout = kv_layout
        self._planners = [
            Planner(raw[i * part : (i + 1) * part], False, None, None, None)
            for i in range(num_levels)
        ]
        self._total_qo: int | None = None

    def plan(
        self,
        qo_indptr_arr: list[torch.Tensor],
        paged_kv_indptr_arr: list[torch.Tensor],
        paged_kv_indices_arr: list[torch.Tensor],
        paged_kv_last_page_len: list[torch.Tensor],
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: str | torch.dtype = "float16",
        kv_data_type: str | torch.dtype | None = None,
    ) -> None:
        """Schedule every level; lists hold one tensor per level (level 0 first).

        qo_indptr_arr[i] [n_i + 1]: which query tokens share each of level i's n_i page-table
        entries; every level must cover the same total number of query tokens.
        """
        if pos_encoding_mode != "NONE":
            raise NotImplementedError(f"pos_encoding_mode={pos_encoding_mode!r}: only 'NONE'")
        arrays = {
            "qo_indptr_arr": qo_indptr_arr,
            "paged_kv_indptr_arr": paged_kv_indptr_arr,
            "paged_kv_indices_arr": paged_kv_indices_arr,
            "paged_kv_last_page_len": paged_kv_last_page_len,
        }
        for name, arr in arrays.items():
            if not isinstance(arr, (list, tuple)) or len(arr) != self._num_levels:
                raise ValueError(
                    f"{name} must be a list of {self._num_levels} tensors (one per level)"
                )
        q_dtype = as_dtype("q_data_type", q_data_type, torch.float16)
        kv_dtype = as_dtype("kv_data_type", kv_data_type, q_dtype)
        spec = DecodeSpec(
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            causal=causal,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
        )
        total = None
        for level in range(self._num_levels):
            qo = as_int_tensor(f"qo_indptr_arr[{level}]", qo_indptr_arr[level])
            if qo.dim() != 1:
                raise ValueError(f"qo_indptr_arr[{level}] must be 1-D and start at 0")
            (qo_host,) = host_int64(qo)
            if qo_host.ndim != 1 or qo_host.size < 1 or qo_host[0] != 0:
                raise ValueError(f"qo_indptr_arr[{level}] must be 1-D and start at 0")
            if total is not None and int(qo_host[-1]) != total:
                raise ValueError(
                    f"qo_indptr_arr[{level}] covers {int(qo_host[-1])} query tokens, level 0 "
                    f"covers {total}: every level must cover all queries"
                )
            total = int(qo_host[-1])
            self._planners[level].make(
                qo_host,
                paged_kv_indptr_arr[level],
                paged_kv_indices_arr[level],
                paged_kv_last_page_len[level],
                spec,
            )
        self._total_qo = total

    begin_forward = plan

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        **kwargs: Any,
    ) -> torch.Tensor:
        """Attention for q [total_qo, num_qo_heads, head_dim]; returns out like q."""
        if self._total_qo is None:
            raise RuntimeError("run() called before plan()")
        k, v = split_kv_cache(paged_kv_cache, self._kv_layout)
        first = self._planners[0].plan
        assert first is not None
        shape = (self._total_qo, first.num_qo_heads, first.head_dim)
        out: torch.Tensor | None = None
        lse: torch.Tensor | None = None
        for planner in self._planners:
            plan = planner.check_run(q, k, v, None, None, shape)
            o_l = torch.empty(shape, dtype=q.dtype, device=q.device)
            lse_l = torch.empty(shape[:2], dtype=torch.float32, device=q.device)
            run_plan(plan, q, k, v, o_l, lse_l, (1.0, 1.0))
            if out is None or lse is None:  # level 0
                out, lse = o_l, lse_l
            else:
                merge_state_in_place(out, lse, o_l, lse_l)
        assert out is not None
        return out

    forward = run

    def end_forward(self) -> None:
        """FlashInfer compatibility no-op."""

"""Batch decode attention over a paged KV cache: a split-KV Triton kernel with a CPU plan.

The kernel processes *work items* (see ops/attention/scheduler.py): one query tile of one request against
one chunk of its KV, for one KV head. All query heads that share the KV head (and, for
multi-token queries, all query tokens) are packed into the rows of one MMA tile, so each KV
block is read once per group instead of once per query head. A CTA is persistent: it runs
the list of items the plan dealt to it. Requests whose KV was split write partial (V, LSE)
rows to the workspace, combined afterwards by `merge.merge_partials`; the others write their
final output directly.

`plan` runs on the CPU (one device-to-host copy of indptr and last_page_len, as FlashInfer's
does) and is shared by all layers of a step; `run` launches two kernels and never syncs, so
it can be captured in a CUDA graph. With use_cuda_graph=True every buffer handed to the
kernels lives at a fixed place in the workspace and the grid is fixed, so a graph captured
once replays correctly after plan() is called again with new lengths.

This package's `__init__` holds the public API (and the wrappers' model example); the rest
lives beside it: schema.py (the Definition and the wrapper's run as the schema sees it),
kernels.py (Triton), config.py (tactics and launch policy; registers.py, the measured
register counts it reads), plan.py (the host plan), launch.py (launching a plan through the
autotuner's runner), plan_free.py (`paged_decode`, the plan-free call: its work is found on
the device). The references are shared with prefill (`ops/attention/reference.py`), the CPU
scheduler with MLA (`ops/attention/scheduler.py`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from flashtune.model_shapes import ModelConfig
from flashtune.ops.attention.aliases import WrapperAliases
from flashtune.ops.attention.decode.config import DecodeLaunch
from flashtune.ops.attention.decode.launch import run_plan
from flashtune.ops.attention.decode.plan import DecodeSpec, Planner, as_dtype, as_int_tensor
from flashtune.ops.attention.decode.plan_free import paged_decode
from flashtune.ops.attention.decode.schema import EXAMPLE_KV_LENS, EXAMPLE_PAGE_SIZE, _schema_run
from flashtune.ops.attention.page import KV_LAYOUTS, build_page_table, split_kv_cache
from flashtune.ops.attention.rotary import rope_for
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "single_decode_with_kv_cache",
    "paged_decode",
]


# --------------------------------------------------------------------------- public API


class BatchDecodeWithPagedKVCacheWrapper(WrapperAliases):
    """Batch decode over a paged KV cache (FlashInfer's wrapper of the same name).

    Call `plan` once per step with the page table (it runs the CPU scheduler and fills the
    workspace), then `run` for every layer. With use_cuda_graph=True, pass the page-table
    buffers at construction: their sizes fix the batch size and the most pages, and `run`
    can be captured once and replayed after each `plan`.

    Extra plan keywords (as in later FlashInfer releases): disable_split_kv=True keeps each
    request in one CTA; fixed_split_size=n splits KV into chunks of n tokens.
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: list[Any] | None = None,
    ) -> None:
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise TypeError("float_workspace_buffer must be a tensor")
        if not float_workspace_buffer.is_contiguous():
            raise ValueError("float_workspace_buffer must be contiguous")
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
        self._kv_layout = kv_layout
        self._use_cuda_graph = use_cuda_graph
        self.use_tensor_cores = use_tensor_cores  # accepted for compatibility: always MMA
        max_batch = None
        if use_cuda_graph:
            if (
                paged_kv_indptr_buffer is None
                or paged_kv_indices_buffer is None
                or paged_kv_last_page_len_buffer is None
            ):
                raise ValueError(
                    "use_cuda_graph=True needs paged_kv_indptr_buffer, paged_kv_indices_buffer "
                    "and paged_kv_last_page_len_buffer (their sizes fix the batch and page count)"
                )
            max_batch = paged_kv_indptr_buffer.numel() - 1
            if max_batch < 1:
                raise ValueError("paged_kv_indptr_buffer must hold at least 2 entries")
            if paged_kv_last_page_len_buffer.numel() != max_batch:
                raise ValueError(
                    f"paged_kv_last_page_len_buffer holds {paged_kv_last_page_len_buffer.numel()} "
                    f"entries; paged_kv_indptr_buffer implies batch_size {max_batch}"
                )
            for name, b in (
                ("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer),
            ):
                if b.device != float_workspace_buffer.device or b.dtype != torch.int32:
                    raise ValueError(
                        f"{name} must be int32 on {float_workspace_buffer.device}, got "
                        f"{b.dtype} on {b.device}"
                    )
        self._indptr_buf = paged_kv_indptr_buffer
        self._last_buf = paged_kv_last_page_len_buffer
        self._planner = Planner(
            float_workspace_buffer,
            use_cuda_graph,
            paged_kv_indices_buffer if use_cuda_graph else None,
            max_batch,
            max_batch,
        )

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    # The planned page table and scale as the schema reads them (see GQA_PAGED_DECODE),
    # built on access from the plan's host copies: plan() itself stays free of them.
    @property
    def _kv_indptr(self) -> torch.Tensor | None:
        plan = self._planner.plan
        return None if plan is None else torch.from_numpy(plan.indptr_host.astype(np.int32))

    @property
    def _kv_last_page_len(self) -> torch.Tensor | None:
        plan = self._planner.plan
        return None if plan is None else torch.from_numpy(plan.last_host.astype(np.int32))

    @property
    def _kv_indices(self) -> torch.Tensor | None:
        plan = self._planner.plan
        return None if plan is None else plan.kv_indices[: plan.nnz_pages]

    @property
    def _sm_scale(self) -> float | None:
        plan = self._planner.plan
        return None if plan is None else plan.sm_scale

    def reset_workspace_buffer(
        self, float_workspace_buffer: torch.Tensor, int_workspace_buffer: torch.Tensor | None = None
    ) -> None:
        """Use another workspace (FlashInfer API); the next plan() fills it."""
        self._planner.workspace = float_workspace_buffer
        self._planner.plan = None

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        q_data_type: str | torch.dtype | None = "float16",
        kv_data_type: str | torch.dtype | None = None,
        data_type: str | torch.dtype | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        non_blocking: bool = True,
        *,
        disable_split_kv: bool = False,
        fixed_split_size: int | None = None,
        launch: DecodeLaunch | None = None,
    ) -> None:
        """Schedule decode for one step (see the class docstring).

        indptr [B+1], indices [nnz_pages], last_page_len [B]: the page table (int32).
        launch: a fixed tactic / CTAs per SM / SM count for this plan (benchmarks); None
        leaves them to the autotuner and the defaults (decode/config.py).
        """
        rope = rope_for(pos_encoding_mode, rope_scale, rope_theta)
        # data_type: FlashInfer's deprecated alias, for whichever of the two is not given.
        q_dtype = as_dtype("q_data_type", q_data_type, torch.float16)
        if data_type is not None and q_data_type is None:
            q_dtype = as_dtype("data_type", data_type, q_dtype)
        if data_type is not None and kv_data_type is None:
            kv_data_type = data_type
        kv_dtype = as_dtype("kv_data_type", kv_data_type, q_dtype)
        if not isinstance(window_left, int):
            raise TypeError(f"window_left must be an int, got {type(window_left).__name__}")
        indptr_t = as_int_tensor("indptr", indptr)
        last_t = as_int_tensor("last_page_len", last_page_len)
        spec = DecodeSpec(
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            rope=rope,
        )
        self._planner.make(
            None,  # decode: one query per request
            indptr_t,
            indices,
            last_t,
            spec,
            disable_split_kv=disable_split_kv,
            fixed_split_size=fixed_split_size,
            launch=launch,
        )
        assert self._planner.plan is not None
        if self._use_cuda_graph:
            # Keep the caller-visible buffers in sync, as FlashInfer's graph mode does.
            indptr_buf, last_buf = self._indptr_buf, self._last_buf
            assert indptr_buf is not None and last_buf is not None  # required in graph mode
            if indptr_t.data_ptr() != indptr_buf.data_ptr():
                indptr_buf.copy_(indptr_t.to(torch.int32))
            if last_t.data_ptr() != last_buf.data_ptr():
                last_buf.copy_(last_t.to(torch.int32))

    begin_forward = plan

    @_schema_run
    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        *args: Any,
        q_scale: float | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Decode attention for q [B, num_qo_heads, head_dim] over the planned page table.

        Returns out [B, num_qo_heads, head_dim] (q's dtype), and with return_lse=True also
        the base-2 log-sum-exp [B, num_qo_heads] float32.
        """
        plan = self._planner.plan
        if plan is None:
            raise RuntimeError("run() called before plan(): call plan() once per step first")
        if window_left is not None and window_left != plan.window_left:
            raise ValueError(
                f"run(window_left={window_left}) differs from plan(window_left="
                f"{plan.window_left}); the plan trims KV to the window, so pass it to plan()"
            )
        k, v = split_kv_cache(paged_kv_cache, self._kv_layout)
        q_shape = (plan.batch, plan.num_qo_heads, plan.head_dim)
        self._planner.check_run(q, k, v, out, lse if return_lse else None, q_shape)
        logit_scale = (q_scale if q_scale is not None else 1.0) * (
            k_scale if k_scale is not None else 1.0
        )
        out_t, lse_t = run_plan(
            plan,
            q,
            k,
            v,
            out,
            lse if return_lse else None,
            (logit_scale, v_scale if v_scale is not None else 1.0),
        )
        return (out_t, lse_t) if return_lse else out_t

    def forward(
        self,
        q: torch.Tensor,
        paged_kv_cache: Any,
        pos_encoding_mode: str = "NONE",
        q_scale: float | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        *,
        return_lse: bool = False,
    ) -> Any:
        """Deprecated FlashInfer alias of run (plan must have been called). FlashInfer's
        forward re-sets the plan's variant; here it must match the plan (else ValueError)."""
        plan = self._planner.plan
        if plan is None:
            raise RuntimeError("forward() called before plan(): call plan() once per step first")
        if rope_for(pos_encoding_mode, rope_scale, rope_theta) != plan.rope:
            raise ValueError("forward(pos_encoding_mode/rope_*=...) differs from plan()")
        mismatched = [
            name
            for name, given, planned in (
                ("window_left", window_left, plan.window_left),
                ("logits_soft_cap", logits_soft_cap or 0.0, plan.logits_soft_cap or 0.0),
            )
            if given != planned
        ]
        if sm_scale is not None and sm_scale != plan.sm_scale:
            mismatched.append("sm_scale")
        if mismatched:
            raise ValueError(
                f"forward({', '.join(mismatched)}=...) differs from plan(); pass them to plan()"
            )
        return self.run(
            q,
            paged_kv_cache,
            q_scale=q_scale,
            k_scale=k_scale,
            v_scale=v_scale,
            return_lse=return_lse,
        )


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """The decode wrapper in CUDA-graph mode (FlashInfer's class of the same name): the
    page-table buffers fix the batch size and the most pages; plan() may be called again
    between replays of a captured run()."""

    def __init__(
        self,
        workspace_buffer: torch.Tensor,
        indptr_buffer: torch.Tensor,
        indices_buffer: torch.Tensor,
        last_page_len_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_tensor_cores: bool = False,
    ) -> None:
        super().__init__(
            workspace_buffer,
            kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=indptr_buffer,
            paged_kv_indices_buffer=indices_buffer,
            paged_kv_last_page_len_buffer=last_page_len_buffer,
        )


def single_decode_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    sm_scale: float | None = None,
    rope_scale: float | None = None,
    rope_theta: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Decode attention of one request (FlashInfer `single_decode_with_kv_cache`).

    q: [num_qo_heads, head_dim]; k, v: [kv_len, num_kv_heads, head_dim] (NHD) or
    [num_kv_heads, kv_len, head_dim] (HND). Returns out [num_qo_heads, head_dim] and, with
    return_lse, the base-2 LSE [num_qo_heads].
    """
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if q.dim() != 2:
        raise ValueError(f"q must be [num_qo_heads, head_dim], got shape {tuple(q.shape)}")
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(
            f"k and v must be 3-D of equal shape, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    kv_len, num_kv_heads, head_dim = k.shape
    if q.shape[1] != head_dim:
        raise ValueError(f"q head_dim {q.shape[1]} != k head_dim {head_dim}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    # Each token is a page of size 1 (indices 0..kv_len-1): one kernel serves both APIs, and
    # the 4-byte index per 512-byte token costs under 1% of the traffic.
    workspace = torch.empty(32 * 2**20, dtype=torch.uint8, device=q.device)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    dev = q.device
    has = kv_len > 0
    wrapper.plan(
        torch.tensor([0, kv_len], dtype=torch.int32),
        torch.arange(kv_len, dtype=torch.int32, device=dev),
        torch.tensor([1 if has else 0], dtype=torch.int32),
        q.shape[0],
        num_kv_heads,
        head_dim,
        1,
        pos_encoding_mode=pos_encoding_mode,
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        q_data_type=q.dtype,
        kv_data_type=k.dtype,
        sm_scale=sm_scale,
        rope_scale=rope_scale,
        rope_theta=rope_theta,
    )
    res = wrapper.run(
        q[None],
        (k[:, None], v[:, None]),
        q_scale=q_scale,
        k_scale=k_scale,
        v_scale=v_scale,
        return_lse=return_lse,
    )
    if return_lse:
        o, s = res
        return o[0], s[0]
    return res[0]


# --------------------------------------------------------------------------- model examples


@register_examples(attention="gqa")
def decode_examples(model: ModelConfig) -> list[Example]:
    """One batch-decode call at `model`'s shapes (paged NHD cache, bf16): the planned wrapper's
    run, planned on a small CPU page table."""
    hq, hk, d = model.num_qo_heads, model.num_kv_heads, model.head_dim
    lens = list(EXAMPLE_KV_LENS)
    indptr, indices, last, num_pages = build_page_table(lens, EXAMPLE_PAGE_SIZE, shuffle=False)
    # A small CPU workspace: this plan needs a few KB (a handful of work items).
    wrapper = BatchDecodeWithPagedKVCacheWrapper(torch.empty(2**20, dtype=torch.uint8), "NHD")
    wrapper.plan(indptr, indices, last, hq, hk, d, EXAMPLE_PAGE_SIZE, q_data_type=torch.bfloat16)
    q = meta_tensor(len(lens), hq, d)
    kv_cache = meta_tensor(num_pages, 2, EXAMPLE_PAGE_SIZE, hk, d)
    return [(wrapper.run, (q, kv_cache), {})]

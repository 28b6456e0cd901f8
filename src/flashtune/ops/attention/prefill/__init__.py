"""Batch prefill attention over a paged or ragged KV cache (FlashInfer-compatible API).

- `BatchPrefillWithPagedKVCacheWrapper`: plan(qo_indptr, paged_kv_indptr, ...) / run(q, cache).
- `BatchPrefillWithRaggedKVCacheWrapper`: plan(qo_indptr, kv_indptr, ...) / run(q, k, v).
- `single_prefill_with_kv_cache(q, k, v, ...)`: one request, no plan.

plan runs on the CPU from the lengths alone: it validates the batch and builds the flat work
list of (request, query tile) items, heaviest request first and, within it, heaviest tile
first (the number of KV tiles a tile visits), so long causal tiles start early, short ones
fill the tail, and the programs in flight share one request's K/V in L2. run validates the
tensors against the plan and launches one Triton program per (work item, head group). With
a TMA tactic on a paged cache, run first copies the planned pages contiguously into the
workspace (two index_select launches) and reads them as ragged KV.

Semantics follow FlashInfer: causal masks align bottom-right (query i of a request with
qo_len queries and kv_len keys sees keys j <= i + kv_len - qo_len); `window_left` keeps keys
j >= i + kv_len - qo_len - window_left; `logits_soft_cap` c maps a logit x to c*tanh(x/c);
a custom mask (flattened booleans, request after request, each [qo_len, kv_len] row-major)
replaces the causal mask; the LSE is base 2. With qo_len > kv_len, causal rows that see no
key give output 0 and LSE -inf. pos_encoding_mode="ROPE_LLAMA" rotates q and k inside the
kernel (rotary.py); an fp8 cache (e4m3/e5m2) is read under fp16/bf16 queries, with run's
k_scale/v_scale. use_cuda_graph=True (graph.py): plans write into fixed buffers and
the launch is fixed, so a captured run replays correctly after each plan.

This package's `__init__` holds the public API, the schema'd ops behind the wrappers' run and
their model example; the rest lives beside it: schema.py (the Definitions), kernels.py
(Triton), config.py (tactics, launch policy and the tuning notes), plan.py (the host plan;
graph.py, its CUDA-graph buffers; multi_item.py, the multi-item scoring mask), launch.py
(launching a plan through the autotuner's runner), plan_free.py (`paged_prefill` and
`ragged_prefill`, the plan-free calls: their work is found on the device). The references
are shared with decode (`ops/attention/reference.py`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from flashtune.model_shapes import ModelConfig
from flashtune.ops.attention.aliases import WrapperAliases
from flashtune.ops.attention.page import (
    KV_LAYOUTS,
    build_page_table,
    split_kv_cache,
)
from flashtune.ops.attention.prefill.graph import PrefillGraph
from flashtune.ops.attention.prefill.launch import (
    _check_kv,
    _check_q,
    _check_tensor,
    _check_window,
    _prepare_out,
    _run_scales,
    execute,
)
from flashtune.ops.attention.prefill.multi_item import MultiItemScoring
from flashtune.ops.attention.prefill.plan import (
    PrefillBatch,
    PrefillPlan,
    PrefillSpec,
    check_page_ids,
    make_plan,
)
from flashtune.ops.attention.prefill.plan_free import paged_prefill, ragged_prefill
from flashtune.ops.attention.prefill.schema import (
    EXAMPLE_KV_LENS,
    EXAMPLE_PAGE_SIZES,
    EXAMPLE_QO_INDPTR,
    GQA_PAGED_PREFILL,
    GQA_RAGGED_PREFILL,
    paged_schema_for,
    ragged_schema_for,
)
from flashtune.schema import api
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = [
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "single_prefill_with_kv_cache",
    "paged_prefill",
    "ragged_prefill",
    "gqa_paged_prefill",
    "gqa_ragged_prefill",
]


# --------------------------------------------------------------------------------------------
# The schema'd ops behind the wrappers' run (Definitions: schema.py)
# --------------------------------------------------------------------------------------------


@api(schema=paged_schema_for, schemas=list(GQA_PAGED_PREFILL.values()))
def gqa_paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    kv_last_page_len: torch.Tensor | None = None,
    causal: bool = True,
    window_left: int | None = None,
    logits_soft_cap: float | None = None,
    *,
    plan: PrefillPlan,
    out: torch.Tensor,
    lse: torch.Tensor | None,
) -> None:
    """The schema'd op behind BatchPrefillWithPagedKVCacheWrapper.run (arguments named as
    the Definition's inputs; `plan` carries the device copies and the work list)."""
    execute(plan, q, k_cache, v_cache, out, lse)


@api(schema=ragged_schema_for, schemas=list(GQA_RAGGED_PREFILL.values()))
def gqa_ragged_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    sm_scale: float,
    causal: bool = True,
    window_left: int | None = None,
    logits_soft_cap: float | None = None,
    *,
    plan: PrefillPlan,
    out: torch.Tensor,
    lse: torch.Tensor | None,
) -> None:
    """The schema'd op behind BatchPrefillWithRaggedKVCacheWrapper.run."""
    execute(plan, q, k, v, out, lse)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def _run(
    plan: PrefillPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
    return_lse: bool,
    scales: tuple[float, float] = (1.0, 1.0),
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    out, lse = _prepare_out(q, plan, out, lse, return_lse)
    logit_scale, out_scale = scales
    if logit_scale != 1.0:
        # A copy of the plan (its device arrays and work lists shared) with the run's scale.
        plan = dataclasses.replace(plan, sm_scale=plan.sm_scale * logit_scale)
    variant = dict(
        causal=plan.causal,
        window_left=plan.window_left if plan.window_left >= 0 else None,
        logits_soft_cap=plan.logits_soft_cap or None,
        plan=plan,
        out=out,
        lse=lse,
    )
    if plan.rope is not None or plan.alibi or plan.mask_d is not None:
        # No Definition describes RoPE, ALiBi or a custom mask (multi-item scoring is one):
        # the kernel runs itself, so that capture never records such a call as a plain
        # workload and apply never hands it to a solution that computes plain attention.
        execute(plan, q, k, v, out, lse)
    elif plan.paged:
        gqa_paged_prefill(
            q,
            k,
            v,
            plan.qo_indptr_d,
            plan.kv_indptr_d,
            plan.kv_indices_d,
            plan.sm_scale,
            None if plan.page_size == 1 else plan.kv_last_page_len_d,
            **variant,
        )
    else:
        gqa_ragged_prefill(q, k, v, plan.qo_indptr_d, plan.kv_indptr_d, plan.sm_scale, **variant)
    if out_scale != 1.0:
        out.mul_(out_scale)
    return (out, lse) if return_lse else out  # type: ignore[return-value]


class _PrefillWrapperBase(WrapperAliases):
    def __init__(
        self,
        workspace_buffer: torch.Tensor,
        kv_layout: str,
        use_cuda_graph: bool,
        paged: bool,
        **graph_buffers: torch.Tensor | None,
    ):
        if not isinstance(workspace_buffer, torch.Tensor):
            raise TypeError(
                f"workspace_buffer must be a torch.Tensor, got {type(workspace_buffer).__name__}"
            )
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
        self._workspace = workspace_buffer
        self._kv_layout = kv_layout
        self._use_cuda_graph = use_cuda_graph
        self._paged = paged
        self._plan: PrefillPlan | None = None
        self._plan_args: dict[str, Any] = {}  # make_plan's arguments of the last plan()
        # Graph mode (prefill/graph.py): plans write into fixed buffers, run launches alike.
        self._graph: PrefillGraph | None = None
        if use_cuda_graph:
            # A ragged wrapper has no page-table buffers.
            buffers = {"kv_indices_buf": None, "kv_last_page_len_buf": None, **graph_buffers}
            self._graph = PrefillGraph(workspace_buffer.device, paged=paged, **buffers)

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @property
    def device(self) -> torch.device:
        return self._workspace.device

    def _require_plan(self) -> PrefillPlan:
        if self._plan is None:
            raise RuntimeError(f"{type(self).__name__}.run called before plan()")
        return self._plan

    def _make_plan(self, batch: PrefillBatch, spec: PrefillSpec) -> None:
        """make_plan with this wrapper's kind, device, workspace and graph buffers."""
        self._plan_args = dict(
            paged=self._paged,
            device=self.device,
            workspace=self._workspace,
            graph=self._graph,
            batch=batch,
            spec=spec,
        )
        self._plan = make_plan(**self._plan_args)

    def _replan_variant(
        self,
        causal: bool,
        pos_encoding_mode: str,
        window_left: int,
        logits_soft_cap: float | None,
        sm_scale: float | None,
        rope_scale: float | None,
        rope_theta: float | None,
    ) -> None:
        """FlashInfer's deprecated forward() sets the variant at run time; the work list
        depends on it, so plan again (same batch) where it differs from the plan's."""
        self._require_plan()
        wanted: dict[str, Any] = dict(
            causal=causal,
            pos_encoding_mode=pos_encoding_mode,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
        )
        spec = self._plan_args["spec"]
        if any(getattr(spec, k) != v for k, v in wanted.items()):
            self._plan_args["spec"] = dataclasses.replace(spec, **wanted)
            self._plan = make_plan(**self._plan_args)

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor, *args: Any) -> None:
        self._workspace = float_workspace_buffer
        if self._plan is not None:
            self._plan.workspace = float_workspace_buffer
            self._plan.default_tactic = None  # staging may (no longer) fit: pick again


class BatchPrefillWithPagedKVCacheWrapper(_PrefillWrapperBase):
    """Batch prefill/append attention over a paged KV cache (FlashInfer-compatible)."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        paged_kv_indptr_buf: torch.Tensor | None = None,
        paged_kv_indices_buf: torch.Tensor | None = None,
        paged_kv_last_page_len_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__(
            float_workspace_buffer,
            kv_layout,
            use_cuda_graph,
            paged=True,
            qo_indptr_buf=qo_indptr_buf,
            kv_indptr_buf=paged_kv_indptr_buf,
            kv_indices_buf=paged_kv_indices_buf,
            kv_last_page_len_buf=paged_kv_last_page_len_buf,
            custom_mask_buf=custom_mask_buf,
            mask_indptr_buf=mask_indptr_buf,
        )

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: str | torch.dtype | None = None,
        kv_data_type: str | torch.dtype | None = None,
        non_blocking: bool = True,
        prefix_len_ptr: torch.Tensor | None = None,
        token_pos_in_items_ptr: torch.Tensor | None = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: torch.Tensor | None = None,
    ) -> None:
        """Validate the batch and build the work list (CPU, from the lengths alone).

        q_data_type / kv_data_type: when given, run checks q / the cache against them.
        """
        for name, t in (
            ("paged_kv_indices", paged_kv_indices),
            ("paged_kv_last_page_len", paged_kv_last_page_len),
        ):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        batch = PrefillBatch(
            qo_indptr=qo_indptr,
            kv_indptr=paged_kv_indptr,
            kv_indices=paged_kv_indices,
            kv_last_page_len=paged_kv_last_page_len,
            custom_mask=custom_mask,
            packed_custom_mask=packed_custom_mask,
            multi_item=MultiItemScoring.from_plan_args(
                prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr
            ),
        )
        spec = PrefillSpec(
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim_qk=head_dim_qk,
            head_dim_vo=head_dim_vo,
            page_size=page_size,
            causal=causal,
            pos_encoding_mode=pos_encoding_mode,
            sm_scale=sm_scale,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
        )
        self._make_plan(batch, spec)

    begin_forward = plan

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
        """Attention of q [qo_indptr[-1], Hq, D] over the planned pages of `paged_kv_cache`.

        Returns out [qo_indptr[-1], Hq, D], and the base-2 LSE [qo_indptr[-1], Hq] float32
        when return_lse. enable_pdl is accepted and ignored; window_left must be the plan's.
        """
        plan = self._require_plan()
        _check_window(window_left, plan)
        _check_q(q, plan)
        k, v = split_kv_cache(paged_kv_cache, self._kv_layout)
        _check_kv(k, v, q, plan)
        if k.shape[1] != plan.page_size:
            raise ValueError(
                f"paged_kv_cache has page_size {k.shape[1]} ({self._kv_layout}), planned "
                f"{plan.page_size}"
            )
        indices = plan.kv_indices_d
        assert indices is not None  # a paged plan has them
        if not plan.page_ids_checked and indices.device.type == "cpu":
            check_page_ids(plan, indices)  # on the CPU: free of syncs
        if plan.num_pages_needed > k.shape[0]:
            raise ValueError(
                f"paged_kv_indices reference page {plan.num_pages_needed - 1} but the cache "
                f"holds {k.shape[0]} pages"
            )
        scales = _run_scales(q_scale, k_scale, v_scale)
        return _run(plan, q, k, v, out, lse, return_lse, scales)

    def forward(
        self,
        q: torch.Tensor,
        paged_kv_cache: Any,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
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
        """Deprecated FlashInfer API: run with the variant given here (planned again if it
        differs from the plan's)."""
        self._replan_variant(
            causal,
            pos_encoding_mode,
            window_left,
            logits_soft_cap,
            sm_scale,
            rope_scale,
            rope_theta,
        )
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)


@dataclasses.dataclass(frozen=True)
class _SplitVO:
    """A ragged prefill planned with head_dim_vo != head_dim_qk (MLA's non-absorbed form):
    served by flashtune.ops.mla.mla_ragged_prefill, which needs no plan."""

    qo_indptr: torch.Tensor  # on the wrapper's device, int32
    kv_indptr: torch.Tensor
    dims: tuple[int, int, int, int]  # num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo
    causal: bool
    sm_scale: float | None

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor | None,
        lse: torch.Tensor | None,
        return_lse: bool,
        scales: tuple[float, float],
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        from flashtune.ops.mla import mla_ragged_prefill

        hq, hk, dqk, dvo = self.dims
        for name, t, want in (("q", q, (hq, dqk)), ("k", k, (hk, dqk)), ("v", v, (hk, dvo))):
            if not isinstance(t, torch.Tensor) or t.dim() != 3 or tuple(t.shape[1:]) != want:
                raise ValueError(
                    f"{name} must be [tokens, {want[0]}, {want[1]}] as planned, got "
                    f"{tuple(getattr(t, 'shape', ()))}"
                )
        logit_scale, out_scale = scales
        sm_scale = 1.0 / math.sqrt(dqk) if self.sm_scale is None else float(self.sm_scale)
        result = mla_ragged_prefill(
            q,
            k,
            v,
            self.qo_indptr,
            self.kv_indptr,
            self.causal,
            sm_scale * logit_scale,
            return_lse,
            out=out,
            lse=lse,
        )
        if out_scale != 1.0:
            (result[0] if return_lse else result).mul_(out_scale)
        return result


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillWrapperBase):
    """Batch prefill attention over ragged (concatenated) K/V tensors (FlashInfer-compatible)."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        kv_indptr_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__(
            float_workspace_buffer,
            kv_layout,
            use_cuda_graph,
            paged=False,
            qo_indptr_buf=qo_indptr_buf,
            kv_indptr_buf=kv_indptr_buf,
            custom_mask_buf=custom_mask_buf,
            mask_indptr_buf=mask_indptr_buf,
        )
        # A plan with head_dim_vo != head_dim_qk (MLA's non-absorbed prefill), run by
        # flashtune.ops.mla instead of this wrapper's kernels.
        self._split_vo: _SplitVO | None = None

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: str | torch.dtype | None = None,
        kv_data_type: str | torch.dtype | None = None,
        non_blocking: bool = True,
        prefix_len_ptr: torch.Tensor | None = None,
        token_pos_in_items_ptr: torch.Tensor | None = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: torch.Tensor | None = None,
    ) -> None:
        """Validate the batch and build the work list (CPU, from the lengths alone)."""
        self._split_vo = None
        if head_dim_vo is not None and head_dim_vo != head_dim_qk:
            # MLA's non-absorbed prefill (QK 192, VO 128): flashtune.ops.mla's kernel.
            unsupported = {
                "custom_mask": custom_mask is not None or packed_custom_mask is not None,
                "pos_encoding_mode": pos_encoding_mode != "NONE",
                "window_left": window_left is not None and window_left >= 0,
                "logits_soft_cap": bool(logits_soft_cap),
                "multi-item scoring": prefix_len_ptr is not None,
                "use_cuda_graph": self._use_cuda_graph,
            }
            named = [name for name, given in unsupported.items() if given]
            if named:
                raise NotImplementedError(
                    f"head_dim_vo ({head_dim_vo}) != head_dim_qk ({head_dim_qk}) with "
                    f"{', '.join(named)} is not supported"
                )
            if num_qo_heads % num_kv_heads:
                raise ValueError(
                    f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads "
                    f"({num_kv_heads})"
                )
            dev = self.device
            self._split_vo = _SplitVO(
                qo_indptr.to(dev, torch.int32, non_blocking=non_blocking),
                kv_indptr.to(dev, torch.int32, non_blocking=non_blocking),
                (num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo),
                bool(causal),
                sm_scale,
            )
            self._plan = None
            return
        batch = PrefillBatch(
            qo_indptr=qo_indptr,
            kv_indptr=kv_indptr,
            custom_mask=custom_mask,
            packed_custom_mask=packed_custom_mask,
            multi_item=MultiItemScoring.from_plan_args(
                prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr
            ),
        )
        spec = PrefillSpec(
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim_qk=head_dim_qk,
            head_dim_vo=head_dim_vo,
            page_size=1,
            causal=causal,
            pos_encoding_mode=pos_encoding_mode,
            sm_scale=sm_scale,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
        )
        self._make_plan(batch, spec)

    begin_forward = plan

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
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
        """Attention of q [qo_indptr[-1], Hq, D] over k/v [kv_indptr[-1], Hkv, D] (NHD) or
        [Hkv, kv_indptr[-1], D] (HND)."""
        split = self._split_vo
        if split is not None:
            if self._kv_layout == "HND":
                k, v = k.transpose(0, 1), v.transpose(0, 1)
            return split.run(q, k, v, out, lse, return_lse, _run_scales(q_scale, k_scale, v_scale))
        plan = self._require_plan()
        _check_window(window_left, plan)
        _check_q(q, plan)
        _check_tensor(k, "k", 3)
        _check_tensor(v, "v", 3)
        if self._kv_layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        if k.shape != v.shape:
            raise ValueError(f"k shape {list(k.shape)} != v shape {list(v.shape)}")
        _check_kv(k, v, q, plan)
        # Graph mode: k/v keep the captured size; tokens past kv_indptr[-1] are padding.
        kv_tokens = int(plan.kv_indptr[-1])
        if k.shape[0] != kv_tokens and not (self._graph is not None and k.shape[0] > kv_tokens):
            raise ValueError(
                f"k/v must hold kv_indptr[-1]={plan.kv_indptr[-1]} tokens as planned, got "
                f"{k.shape[0]}"
            )
        scales = _run_scales(q_scale, k_scale, v_scale)
        return _run(plan, q, k, v, out, lse, return_lse, scales)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        *,
        return_lse: bool = False,
    ) -> Any:
        """Deprecated FlashInfer API: run with the variant given here (see the paged one)."""
        self._replan_variant(
            causal,
            pos_encoding_mode,
            window_left,
            logits_soft_cap,
            sm_scale,
            rope_scale,
            rope_theta,
        )
        return self.run(q, k, v, return_lse=return_lse)


def single_prefill_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale_q: torch.Tensor | None = None,
    scale_k: torch.Tensor | None = None,
    scale_v: torch.Tensor | None = None,
    o_dtype: torch.dtype | None = None,
    custom_mask: torch.Tensor | None = None,
    packed_custom_mask: torch.Tensor | None = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    rope_scale: float | None = None,
    rope_theta: float | None = None,
    backend: str = "auto",
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Prefill attention of one request (FlashInfer 0.2.14's signature): q [qo_len, Hq, D],
    k/v [kv_len, Hkv, D] (NHD) or [Hkv, kv_len, D] (HND); custom_mask [qo_len, kv_len] bool,
    or flat (replaces causal). `backend` is a hint (one Triton kernel serves every backend);
    use_fp16_qk_reduction is accepted (logits are always reduced in fp32, at least as
    accurate). What this kernel does not do raises: fp8 scales, another output dtype,
    packed masks."""
    for name, value in (("scale_q", scale_q), ("scale_k", scale_k), ("scale_v", scale_v)):
        if value is not None:
            raise NotImplementedError(f"{name}: fp8 prefill scales are not supported")
    if o_dtype is not None and o_dtype != q.dtype:
        raise NotImplementedError(f"o_dtype={o_dtype}: the output has q's dtype ({q.dtype})")
    if packed_custom_mask is not None:
        raise NotImplementedError("packed_custom_mask is not supported; pass custom_mask (bool)")
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, got {type(backend).__name__}")
    _check_tensor(q, "q", 3)
    _check_tensor(k, "k", 3, q.device)
    _check_tensor(v, "v", 3, q.device)
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    qo_len, kv_len = q.shape[0], k.shape[0]
    mask = None
    if custom_mask is not None:
        # FlashInfer flattens the mask: [qo_len, kv_len] or its flat [qo_len * kv_len].
        if tuple(custom_mask.shape) not in ((qo_len, kv_len), (qo_len * kv_len,)):
            raise ValueError(
                f"custom_mask must have shape [qo_len, kv_len] = [{qo_len}, {kv_len}] or be "
                f"flat, got {list(custom_mask.shape)}"
            )
        mask = custom_mask.reshape(-1)
    wrapper = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(0, device=q.device))
    wrapper.plan(
        torch.tensor([0, qo_len], dtype=torch.int32),
        torch.tensor([0, kv_len], dtype=torch.int32),
        q.shape[1],
        k.shape[1],
        q.shape[2],
        head_dim_vo=v.shape[2],
        custom_mask=mask,
        causal=causal,
        pos_encoding_mode=pos_encoding_mode,
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        sm_scale=sm_scale,
        rope_scale=rope_scale,
        rope_theta=rope_theta,
    )
    return wrapper.run(q, k, v, return_lse=return_lse)


# --------------------------------------------------------------------------------------------
# Model examples
# --------------------------------------------------------------------------------------------


@register_examples(attention="gqa")
def prefill_examples(model: ModelConfig) -> list[Example]:
    """Paged (each of EXAMPLE_PAGE_SIZES) and ragged prefill, causal and not, at `model`'s
    shapes (bf16), through the schema'd ops behind the wrappers' run.

    These take the Definition's inputs directly; their `plan`/`out`/`lse` keywords are not
    part of the Definition, so None stands in for them."""
    hq, hk, d = model.num_qo_heads, model.num_kv_heads, model.head_dim
    kv_lens = list(EXAMPLE_KV_LENS)
    qo_indptr = torch.tensor(EXAMPLE_QO_INDPTR, dtype=torch.int32)
    q = meta_tensor(EXAMPLE_QO_INDPTR[-1], hq, d)
    unused = {"plan": None, "out": None, "lse": None}
    examples: list[Example] = []
    kv_indptr = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    kv = meta_tensor(sum(kv_lens), hk, d)
    for causal in (True, False):
        for page_size in EXAMPLE_PAGE_SIZES:
            indptr, indices, last, num_pages = build_page_table(kv_lens, page_size, shuffle=False)
            cache = meta_tensor(num_pages, page_size, hk, d)
            paged_args = (q, cache, cache, qo_indptr, indptr, indices, d**-0.5)
            kwargs = {"kv_last_page_len": last, "causal": causal, **unused}
            examples.append((gqa_paged_prefill, paged_args, kwargs))
        ragged_args = (q, kv, kv, qo_indptr, kv_indptr, d**-0.5)
        examples.append((gqa_ragged_prefill, ragged_args, {"causal": causal, **unused}))
    return examples

"""Running a prefill plan: the Triton kernel (prefill/kernels.py) through the autotuner's
runner, or the reference where no kernel can run, and the checks of run()'s tensors against
the plan. `launch_kernel` also serves the plan-free calls (prefill/plan_free.py), which find
their work items on the device.

With a TMA tactic on a paged cache, `launch` first copies the planned pages contiguously
into the workspace (two index_select launches) and reads them as ragged KV.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flashtune import platform
from flashtune.ops.attention.page import check_kv_dtype
from flashtune.ops.attention.prefill import hopper
from flashtune.ops.attention.prefill.config import PREFILL_TACTICS, PrefillTactic
from flashtune.ops.attention.prefill.kernels import prefill_kernel
from flashtune.ops.attention.prefill.plan import PrefillPlan, default_tactic
from flashtune.ops.attention.reference import (
    alibi_slopes,
    batch_prefill_paged_ref,
    batch_prefill_ragged_ref,
)
from flashtune.ops.attention.rotary import rope_arguments
from flashtune.ops.attention.variant import AttentionVariant
from flashtune.tune import DEFAULT_TACTIC, Tactic, TunableRunner, TuningConfig, choose_one

__all__ = [
    "execute",
    "launch",
    "launch_kernel",
    "KernelSpec",
    "WorkItems",
    "heads_per_program",
    "TritonPrefillRunner",
    "HopperPrefillRunner",
    "RUNNERS",
    "TUNING",
]

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class KernelSpec:
    """One launch of prefill_kernel apart from its tensors: the tactic, what the kernel is
    specialized on (paged or ragged KV, heads, head_dim) and the attention variant.
    page_size: the cache's (paged), 1 or the plan-free call's INDPTR_PAGE_SIZE otherwise;
    pack: query heads per program (heads_per_program)."""

    tactic: PrefillTactic
    paged: bool
    page_size: int
    group: int
    pack: int
    num_qo_heads: int
    head_dim: int
    variant: AttentionVariant


@dataclass(frozen=True)
class WorkItems:
    """Where a launch's work items come from: the planned path's `work` list ([num_items,
    8] int32), or, for the plan-free calls, `device_work`, the kernel's DEVICE_WORK
    arguments other than QO_INDPTR (KV_INDPTR, KV_LAST_PAGE_LEN, batch, INDPTR_PAGE_SIZE,
    BLOCK_B), with num_items an upper bound (programs past the real items do nothing)."""

    num_items: int
    work: torch.Tensor | None = None
    device_work: dict[str, Any] | None = None


def execute(
    plan: PrefillPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
) -> None:
    """Kernel when one can run on q's device, else the reference (CPU without interpreter)."""
    if platform.kernels_available(q.device):
        if plan.graph_tactic is not None:
            # Graph mode: the launch (tactic, work buffer, grid) the first plan fixed.
            launch(plan, q, k, v, out, lse, plan.graph_tactic)
            return
        inputs = (q, k, v, out, lse, plan)
        runner, tactic = choose_one("attention.prefill", RUNNERS, TUNING, inputs)
        runner.forward(inputs, tactic)
        return
    assert plan.qo_indptr_d is not None and plan.kv_indptr_d is not None  # set by make_plan
    mask = plan.mask_d.view(torch.bool) if plan.mask_d is not None else None
    variant = dataclasses.replace(plan.variant, logits_soft_cap=plan.logits_soft_cap or None)
    if plan.paged:
        assert plan.kv_indices_d is not None and plan.kv_last_page_len_d is not None
        o, s = batch_prefill_paged_ref(
            q,
            k,
            v,
            plan.qo_indptr_d,
            plan.kv_indptr_d,
            plan.kv_indices_d,
            plan.kv_last_page_len_d,
            variant,
            custom_mask=mask,
        )
    else:
        o, s = batch_prefill_ragged_ref(
            q, k, v, plan.qo_indptr_d, plan.kv_indptr_d, variant, custom_mask=mask
        )
    out.copy_(o)
    if lse is not None:
        lse.copy_(s)


def launch(
    plan: PrefillPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    tactic: PrefillTactic,
) -> None:
    """Launch the Triton kernel. k/v: paged [P, page_size, Hkv, D] views or ragged [T, Hkv, D]."""
    group = plan.group_size
    pack = heads_per_program(tactic, group)
    work = plan.work_list(tactic.tokens_per_tile(group), tactic.block_n)
    if work.shape[0] == 0:
        return
    assert plan.qo_indptr_d is not None  # set by make_plan
    paged = plan.paged
    if paged and tactic.tma:
        k, v = _stage_pages(plan, k, v)
        paged = False
    spec = KernelSpec(
        tactic=tactic,
        paged=paged,
        page_size=plan.page_size,
        group=group,
        pack=pack,
        num_qo_heads=plan.num_qo_heads,
        head_dim=plan.head_dim,
        variant=plan.variant,
    )
    launch_kernel(
        q,
        k,
        v,
        out,
        lse,
        plan.qo_indptr_d,
        spec=spec,
        items=WorkItems(num_items=work.shape[0], work=work),
        kv_indices=plan.kv_indices_d,
        mask=plan.mask_d,
        mask_indptr=plan.mask_indptr_d,
    )


def heads_per_program(tactic: PrefillTactic, group: int) -> int:
    """Query heads per program under `tactic` (the whole GQA group, or 1)."""
    pack = group if tactic.pack_heads else 1
    if tactic.block_m < pack:
        raise ValueError(f"tactic {tactic} cannot hold a group of {group} heads")
    return pack


def launch_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    qo_indptr: torch.Tensor,
    *,
    spec: KernelSpec,
    items: WorkItems,
    kv_indices: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
) -> None:
    """Launch prefill_kernel, one program per (work item, head group), for both paths.

    k/v: paged [P, page_size, Hkv, D] views (spec.paged) or ragged/staged [T, Hkv, D];
    qo_indptr [batch + 1] int32 on q's device; alibi (spec.variant) is FlashInfer's ALiBi
    bias (its slopes, per query head). The planned path gives its work list and, where
    planned, the custom mask; the plan-free path its DEVICE_WORK arguments (WorkItems).
    """
    tactic, paged, page_size = spec.tactic, spec.paged, spec.page_size
    group, pack, num_qo_heads, head_dim = spec.group, spec.pack, spec.num_qo_heads, spec.head_dim
    causal, window_left = spec.variant.causal, spec.variant.window_left
    sm_scale, logits_soft_cap = spec.variant.sm_scale, spec.variant.logits_soft_cap or 0.0
    assert sm_scale is not None  # resolved by the plan / the plan-free call
    rope, alibi = spec.variant.rope, spec.variant.alibi
    num_items, work, device_work = items.num_items, items.work, items.device_work
    dummy = qo_indptr  # int32 stand-in for the tensors this launch never reads
    if paged:
        stride_kp, stride_ks, stride_kh = k.stride(0), k.stride(1), k.stride(2)
        stride_vp, stride_vs, stride_vh = v.stride(0), v.stride(1), v.stride(2)
    else:
        stride_kp, stride_ks, stride_kh = k.stride(0), 0, k.stride(1)
        stride_vp, stride_vs, stride_vh = v.stride(0), 0, v.stride(1)
    soft_cap = logits_soft_cap > 0
    if soft_cap:
        qk_scale = sm_scale / logits_soft_cap
        soft_cap_log2 = logits_soft_cap * _LOG2E
    else:
        qk_scale = sm_scale * _LOG2E
        soft_cap_log2 = 0.0
    lse_t = lse if lse is not None else out
    # RoPE rotates K as it is loaded: pointer loads (the staged pages of a TMA tactic too).
    use_tma = tactic.tma and rope is None and not paged and _tma_ok(k) and _tma_ok(v)
    k_arg: Any = k
    v_arg: Any = v
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        # 2-D view [total_kv, H * D] (heads adjacent, as NHD storage has them): one TMA box
        # [BLOCK_N, D] per tile at column kv_head * D, the layout TMA and wgmma like best.
        block = [tactic.block_n, head_dim]
        k_arg = TensorDescriptor(k, [k.shape[0], k.shape[1] * k.shape[2]], [k.stride(0), 1], block)
        v_arg = TensorDescriptor(v, [v.shape[0], v.shape[1] * v.shape[2]], [v.stride(0), 1], block)
    # Only the plan-free launch names the DEVICE_WORK arguments; the planned one leaves them
    # at the kernel's defaults (DEVICE_WORK=False: WORK is read, the indptr arrays are not).
    extra = (
        {} if device_work is None else dict(DEVICE_WORK=True, QO_INDPTR=qo_indptr, **device_work)
    )
    if rope is not None:
        # Named only when on: the default launch keeps the kernel's default specialization.
        rcp_scale, log2_theta = rope_arguments(*rope)
        extra.update(ROPE=True, rope_rcp_scale=rcp_scale, rope_log2_theta=log2_theta)
    if alibi:
        # FlashInfer adds the bias to the sm_scale'd logit, and under a soft-cap scales that
        # sum by sm_scale / cap once more before the tanh: both factors folded here.
        slopes = alibi_slopes(num_qo_heads, q.device)
        if soft_cap:
            qk_scale = sm_scale * sm_scale / logits_soft_cap
            alibi_scale = sm_scale / logits_soft_cap
        else:
            alibi_scale = _LOG2E
        extra.update(ALIBI=True, ALIBI_SLOPES=slopes, alibi_scale=alibi_scale)
    num_head_groups = num_qo_heads // pack
    prefill_kernel[(num_items * num_head_groups,)](
        q,
        k_arg,
        v_arg,
        out,
        lse_t,
        work if work is not None else dummy,
        kv_indices if paged else dummy,
        mask if mask is not None else dummy,
        mask_indptr if mask_indptr is not None else dummy,
        qk_scale,
        soft_cap_log2,
        window_left,
        q.stride(0),
        q.stride(1),
        stride_kp,
        stride_ks,
        stride_kh,
        stride_vp,
        stride_vs,
        stride_vh,
        out.stride(0),
        out.stride(1),
        lse_t.stride(0) if lse is not None else 0,
        lse_t.stride(1) if lse is not None else 0,
        NUM_HEAD_GROUPS=num_head_groups,
        GROUP_SIZE=group,
        PACK=pack,
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size if paged else 1,
        PAGED=paged,
        USE_TMA=use_tma,
        CAUSAL=causal,
        WINDOW=window_left >= 0,
        CUSTOM_MASK=mask is not None,
        SOFT_CAP=soft_cap,
        RETURN_LSE=lse is not None,
        BLOCK_M=tactic.block_m,
        BLOCK_N=tactic.block_n,
        num_warps=tactic.num_warps,
        num_stages=tactic.num_stages,
        **extra,
    )


def _stage_pages(
    plan: PrefillPlan, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy the planned pages of k/v [P, page_size, H, D] (any layout) page after page into
    [nnz_pages * page_size, H, D] NHD tensors, in the workspace when it is large enough."""
    assert plan.kv_indices_d is not None
    pages = plan.kv_indices_d[: int(plan.kv_indptr[-1])]  # int32 ids: index_select takes them
    n, ps, h, d = pages.numel(), k.shape[1], k.shape[2], k.shape[3]
    elems = n * ps * h * d
    ws = plan.workspace
    nbytes = 2 * elems * k.element_size()
    if (
        ws is not None
        and ws.device == k.device
        and ws.is_contiguous()
        and ws.numel() * ws.element_size() >= nbytes
    ):
        buf = ws.view(-1).view(torch.uint8)[:nbytes].view(k.dtype)
    else:
        buf = torch.empty(2 * elems, dtype=k.dtype, device=k.device)
    ks = buf[:elems].view(n, ps, h, d)
    vs = buf[elems:].view(n, ps, h, d)
    if k.element_size() == 1:
        # fp8 pages move as bytes (index_select need not know the fp8 dtypes).
        torch.index_select(k.view(torch.uint8), 0, pages, out=ks.view(torch.uint8))
        torch.index_select(v.view(torch.uint8), 0, pages, out=vs.view(torch.uint8))
    else:
        torch.index_select(k, 0, pages, out=ks)
        torch.index_select(v, 0, pages, out=vs)
    return ks.view(n * ps, h, d), vs.view(n * ps, h, d)


def _tma_ok(t: torch.Tensor) -> bool:
    """A ragged [T, H, D] K/V the 2-D TMA view [T, H * D] can describe: heads adjacent, rows
    16-byte aligned (TMA's rule for the base address and the row stride)."""
    es = t.element_size()
    return (
        t.shape[0] > 0
        and t.stride(2) == 1
        and t.stride(1) == t.shape[2]
        and (t.stride(0) * es) % 16 == 0
        and t.data_ptr() % 16 == 0
    )


class TritonPrefillRunner(TunableRunner):
    """The Triton FlashAttention-2 prefill kernel; tactics index PREFILL_TACTICS.

    inputs: (q, k, v, out, lse_or_None, plan) with k/v as the kernel reads them.
    """

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        q, plan = inputs[0], inputs[5]
        cap = platform.compute_capability(q.device) or (0, 0)
        return [
            i
            for i, t in enumerate(PREFILL_TACTICS)
            if t.fits(plan.head_dim, plan.group_size) and not (t.tma and cap < (9, 0))
        ]

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        q, k, v, out, lse, plan = inputs
        if tactic == DEFAULT_TACTIC:
            t = default_tactic(plan, q.device)
        elif isinstance(tactic, PrefillTactic):
            t = tactic
        else:
            t = PREFILL_TACTICS[int(tactic)]  # type: ignore[call-overload]
        launch(plan, q, k, v, out, lse, t)
        return out


class HopperPrefillRunner(TunableRunner):
    """The Gluon FA3-style kernel for sm_90 (prefill/hopper.py): first, so that it is the
    untuned default where it applies; elsewhere it offers no tactic and its default runs
    the Triton kernel's. Tactics index hopper.HOPPER_TACTICS.

    inputs: (q, k, v, out, lse_or_None, plan), as TritonPrefillRunner's."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        q, k, v, out, lse, plan = inputs
        if hopper.supported(q, k, v, out, plan, lse) is not None:
            return []
        return list(range(len(hopper.HOPPER_TACTICS)))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        q, k, v, out, lse, plan = inputs
        if hopper.supported(q, k, v, out, plan, lse) is not None:
            # Also for a tuned tactic: a memoized pick is keyed on shapes, and a later call of
            # the same shapes may not qualify (its strides, an lse view).
            return _TRITON.forward(inputs, DEFAULT_TACTIC)
        if tactic == DEFAULT_TACTIC and hopper.default_prefers_triton(plan):
            return _TRITON.forward(inputs, DEFAULT_TACTIC)
        work = plan.work_list(hopper.BLOCK_M, hopper.block_n(plan.head_dim))
        if tactic == DEFAULT_TACTIC:
            tactic = hopper.default_tactic(plan, q.device)
        if plan.paged:
            k, v = _stage_pages(plan, k, v)
        hopper.launch(q, k, v, out, lse, plan, work, hopper.HOPPER_TACTICS[int(tactic)])  # type: ignore[call-overload]
        return out


_TRITON = TritonPrefillRunner()
RUNNERS: tuple[TunableRunner, ...] = (HopperPrefillRunner(), _TRITON)
TUNING = TuningConfig(make_inputs=lambda inputs, profile: inputs)


# --------------------------------------------------------------------------- run's checks


def _check_tensor(t: Any, name: str, dim: int, device: torch.device | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the device of q)")


def _check_q(q: torch.Tensor, plan: PrefillPlan) -> None:
    _check_tensor(q, "q", 3)
    expected = (plan.total_q, plan.num_qo_heads, plan.head_dim)
    # Graph mode: q keeps the captured size; rows past qo_indptr[-1] are padding.
    padded = plan.graph_tactic is not None and q.shape[0] >= plan.total_q
    if tuple(q.shape) != expected and not (padded and tuple(q.shape[1:]) == expected[1:]):
        raise ValueError(
            f"q must have shape [qo_indptr[-1], num_qo_heads, head_dim] = {list(expected)} as "
            f"planned, got {list(q.shape)}"
        )
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    if plan.q_dtype is not None and q.dtype != plan.q_dtype:
        raise TypeError(f"q has dtype {q.dtype}, planned q_data_type is {plan.q_dtype}")
    if q.device != plan.device and not (q.device.type == plan.device.type == "cuda"):
        raise ValueError(
            f"q is on device {q.device}, the wrapper's workspace is on device {plan.device}"
        )
    if q.stride(-1) != 1:
        raise ValueError("q must be contiguous in its last dimension")


def _check_kv(k: torch.Tensor, v: torch.Tensor, q: torch.Tensor, plan: PrefillPlan) -> None:
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, expected {q.device} (the device of q)")
        check_kv_dtype(q.dtype, t.dtype)
        if plan.kv_dtype is not None and t.dtype != plan.kv_dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, planned kv_data_type {plan.kv_dtype}")
        if t.shape[-2] != plan.num_kv_heads or t.shape[-1] != plan.head_dim:
            raise ValueError(
                f"{name} must have num_kv_heads={plan.num_kv_heads}, head_dim={plan.head_dim} "
                f"as planned, got shape {list(t.shape)}"
            )
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")


def _check_window(window_left: int | None, plan: PrefillPlan) -> None:
    if window_left is not None and max(window_left, -1) != plan.window_left:
        raise ValueError(
            f"run(window_left={window_left}) differs from plan(window_left={plan.window_left}); "
            "the plan's work list depends on it, so pass it to plan()"
        )


def _prepare_out(
    q: torch.Tensor,
    plan: PrefillPlan,
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if out is None:
        out = torch.empty_like(q)
    else:
        if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.device != q.device:
            raise ValueError(
                f"out must be {list(q.shape)} {q.dtype} on {q.device}, got "
                f"{list(out.shape)} {out.dtype} on {out.device}"
            )
    if return_lse:
        shape = (q.shape[0], plan.num_qo_heads)
        if lse is None:
            lse = torch.empty(shape, dtype=torch.float32, device=q.device)
        elif tuple(lse.shape) != shape or lse.dtype != torch.float32 or lse.device != q.device:
            raise ValueError(
                f"lse must be {list(shape)} float32 on {q.device}, got {list(lse.shape)} "
                f"{lse.dtype} on {lse.device}"
            )
    else:
        lse = None
    return out, lse


def _run_scales(
    q_scale: float | None, k_scale: float | None, v_scale: float | None
) -> tuple[float, float]:
    """FlashInfer's run scales as (logit scale, output scale): q_scale and k_scale multiply
    sm_scale, v_scale the output (fp8 KV caches store K and V divided by them)."""
    q_s = 1.0 if q_scale is None else float(q_scale)
    k_s = 1.0 if k_scale is None else float(k_scale)
    return q_s * k_s, 1.0 if v_scale is None else float(v_scale)

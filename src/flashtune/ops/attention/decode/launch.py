"""Running a decode plan: the attention kernel and, where the plan split KV, the merge
kernel, through the autotuner's runner; the float64 reference where no kernel can run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import triton

from flashtune import env, platform
from flashtune.ops.attention.decode.config import DecodeTactic
from flashtune.ops.attention.decode.kernels import LOG2E, paged_attn_kernel
from flashtune.ops.attention.decode.plan import DevicePlan
from flashtune.ops.attention.merge import ArrivalCounters, merge_partials
from flashtune.ops.attention.reference import paged_attention_ref
from flashtune.ops.attention.rotary import rope_arguments
from flashtune.ops.attention.variant import AttentionVariant
from flashtune.tune import DEFAULT_TACTIC, Tactic, TunableRunner, TuningConfig, choose_one

__all__ = ["run_plan", "launch_kernels", "tuning_name", "PagedAttentionRunner", "RUNNERS", "TUNING"]


def run_plan(
    plan: DevicePlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
    scale: tuple[float, float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `plan` on checked inputs (`Planner.check_run`): compute into out/lse (allocated if
    None); scale = (logit scale, output scale)."""
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse_buf = lse if lse is not None else plan.lse_scratch
    logit_scale, out_scale = scale
    use_kernel = platform.kernels_available(q.device) and not env.FORCE_REFERENCE.get()
    if not use_kernel:
        o_ref, l_ref = _reference(plan, q, k, v, logit_scale)
        out.copy_(o_ref)
        lse_buf.copy_(l_ref)
    elif plan.total_qo > 0:
        inputs = [q, k, v, plan, out, lse_buf]
        runner: TunableRunner
        tactic: Tactic
        if plan.launch is not None and plan.launch.tactic is not None:
            runner, tactic = RUNNERS[0], plan.launch.tactic  # fixed by the caller
        else:
            runner, tactic = choose_one(tuning_name(plan), RUNNERS, TUNING, inputs)
        if logit_scale != 1.0:
            plan = _scaled(plan, logit_scale)
            inputs[3] = plan
        runner(inputs, tactic)
    if out_scale != 1.0:
        out.mul_(out_scale)
    return out, lse_buf


def _reference(
    plan: DevicePlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, logit_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU path: the float64 reference on the planned page table."""
    dev = q.device
    return paged_attention_ref(
        q,
        k,
        v,
        torch.as_tensor(plan.qo_indptr_host, device=dev),
        torch.as_tensor(plan.indptr_host, device=dev),
        plan.kv_indices.to(dev),
        torch.as_tensor(plan.last_host, device=dev),
        AttentionVariant(
            sm_scale=plan.sm_scale * logit_scale,
            causal=plan.causal,
            window_left=plan.window_left,
            logits_soft_cap=plan.logits_soft_cap,
            rope=plan.rope,
        ),
    )


def _scaled(plan: DevicePlan, factor: float) -> DevicePlan:
    return replace(plan, sm_scale=plan.sm_scale * factor)


def launch_kernels(
    plan: DevicePlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    tactic: DecodeTactic,
) -> None:
    """Launch the attention kernel and, where the plan split KV, the merge kernel."""
    cap = plan.logits_soft_cap
    if cap:
        qk_scale, cap_arg = plan.sm_scale / cap, cap * LOG2E
    else:
        qk_scale, cap_arg = plan.sm_scale * LOG2E, 0.0
    grid = (plan.grid_ctas, plan.num_kv_heads)
    rope: dict[str, Any] = {}
    if plan.rope is not None:
        # Named only when on: the default launch keeps the kernel's default specialization.
        rcp_scale, log2_theta = rope_arguments(*plan.rope)
        rope = dict(ROPE=True, rope_rcp_scale=rcp_scale, rope_log2_theta=log2_theta)
        assert plan.rope_tables is not None
        rope["rope_rows_ptr"], rope["rope_block_ptr"] = plan.rope_tables
    paged_attn_kernel[grid](
        q,
        k,
        v,
        plan.kv_indices,
        plan.work_indptr,
        plan.work,
        out,
        lse,
        plan.partial_o,
        plan.partial_lse,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        plan.num_qo_heads,
        qk_scale,
        cap_arg,
        max(plan.window_left, 0),
        GROUP=plan.group,
        HEAD_DIM=plan.head_dim,
        BLOCK_D=triton.next_power_of_2(plan.head_dim),
        PAGE_SIZE=plan.page_size,
        BLOCK_M=plan.block_m,
        BLOCK_N=tactic.block_n,
        SOFT_CAP=bool(cap),
        CAUSAL=plan.causal,
        WINDOW=plan.mask_window,
        num_warps=tactic.num_warps,
        num_stages=tactic.num_stages,
        **rope,
        **(
            ArrivalCounters.launch_args(plan.merge_info, plan.counters)
            if tactic.fused_merge
            else {}
        ),
    )
    if tactic.fused_merge:
        return  # the kernel merged its split tiles
    if plan.always_merge or plan.host.has_split:
        merge_partials(
            plan.partial_o,
            plan.partial_lse,
            plan.merge_info,
            out,
            lse,
            sm_count=plan.sm_count,
        )


def tuning_name(plan: DevicePlan) -> str:
    """The autotuner's op name for `plan`: the kernel variant is part of it, since a tactic
    tuned for plain decode is not the best for fused RoPE or soft-capping (the dtypes of q and
    the cache are keyed by TUNING.key_dtypes)."""
    variant = "".join(
        f"+{name}"
        for name, on in (
            ("rope", plan.rope is not None),
            ("softcap", bool(plan.logits_soft_cap)),
            ("window", plan.mask_window),
            ("causal", plan.causal),
        )
        if on
    )
    return "attention.paged_decode" + variant


class PagedAttentionRunner(TunableRunner):
    """The split-KV Triton kernel; inputs are (q, k, v, plan, out, lse) with a `DevicePlan`."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        q = inputs[0]
        if q.device.type != "cuda":
            return []
        fused_ok = ArrivalCounters.worth_trying(inputs[3].host.merge_info)
        return [t for t in DecodeTactic.space(inputs[1].shape[-1]) if fused_ok or not t.fused_merge]

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        q, k, v, dplan, out, lse = inputs
        # Tactic -1: the plan's default, the one its grid and chunks were sized for.
        chosen = tactic if isinstance(tactic, DecodeTactic) else dplan.default_tactic
        launch_kernels(dplan, q, k, v, out, lse, chosen)
        return out


RUNNERS: tuple[TunableRunner, ...] = (PagedAttentionRunner(),)
# key_dtypes: an fp8 cache's best tactic is not bf16's at the same shapes (H100: 1.06x
# FlashInfer tuned vs 0.88x with bf16's default, bench_decode.py --only variants).
TUNING = TuningConfig(cold_l2=True, use_cuda_graph=True, key_dtypes=True)

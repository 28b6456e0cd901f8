"""Host side of MLA attention: launching a plan (the attention kernel, then the merge of
split-KV partials) through the autotuner's runner, the plan-free launch, and the CPU path
(the reference) where no kernel can run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flashtune import env, platform
from flashtune.ops.attention.merge import ArrivalCounters, merge_partials
from flashtune.ops.mla import hopper, hopper_split
from flashtune.ops.mla.config import (
    DEFAULT_LAUNCH,
    MLALaunch,
    MLATactic,
    block_m_for,
    chunk_align,
    ctas_per_sm,
    default_tactic,
    min_chunk,
    plan_sm_count,
    planless_chunk,
)
from flashtune.ops.mla.kernels import (
    LOG2E,
    SCALE_GROUPS,
    SCALE_NONE,
    SCALE_TENSOR,
    mla_paged_kernel,
    mla_planless_kernel,
)
from flashtune.ops.mla.plan import MAX_P_SCRATCH_N, MLAPlan
from flashtune.ops.mla.reference import mla_paged_ref
from flashtune.tune import DEFAULT_TACTIC, Tactic, TunableRunner, TuningConfig, choose_one

__all__ = [
    "MLAInputs",
    "KVScales",
    "PlanlessTable",
    "PlanlessOptions",
    "run_plan",
    "launch_kernels",
    "tile_in_page",
    "launch_planless",
    "tuning_name",
    "MLAPagedRunner",
    "RUNNERS",
    "TUNING",
    "use_kernels",
]


@dataclass(frozen=True)
class MLAInputs:
    """A call's tensors: the two parts of the query and of the paged latent cache."""

    q_nope: torch.Tensor  # [total_q, H, D_CKV]
    q_pe: torch.Tensor  # [total_q, H, D_KPE]
    ckv_cache: torch.Tensor  # [num_pages, page_size, D_CKV]
    kpe_cache: torch.Tensor  # [num_pages, page_size, D_KPE]


@dataclass(frozen=True)
class KVScales:
    """How an fp8 cache is scaled back (FlashInfer's run(ckv_scale=, ckv_scale_arr=,
    kpe_scale=)): real = stored * scale; ckv_arr [num_pages, page_size, D_CKV // 128] fp32
    (one scale per token and 128 channels) replaces ckv."""

    ckv: float = 1.0
    kpe: float = 1.0
    ckv_arr: torch.Tensor | None = None

    @property
    def mode(self) -> int:
        if self.ckv_arr is not None:
            return SCALE_GROUPS
        return SCALE_TENSOR if (self.ckv != 1.0 or self.kpe != 1.0) else SCALE_NONE


def use_kernels(device: torch.device) -> bool:
    """Whether the Triton kernels run here (else the reference does)."""
    return platform.kernels_available(device) and not env.FORCE_REFERENCE.get()


def _strides(inputs: MLAInputs, scales: KVScales, out: torch.Tensor) -> list[int]:
    arr = scales.ckv_arr
    return [
        inputs.q_nope.stride(0),
        inputs.q_nope.stride(1),
        inputs.q_pe.stride(0),
        inputs.q_pe.stride(1),
        inputs.ckv_cache.stride(0),
        inputs.ckv_cache.stride(1),
        inputs.kpe_cache.stride(0),
        inputs.kpe_cache.stride(1),
        arr.stride(0) if arr is not None else 0,
        arr.stride(1) if arr is not None else 0,
        out.stride(0),
        out.stride(1),
    ]


def _reference(
    inputs: MLAInputs,
    tables: dict[str, Any],
    sm_scale: float,
    causal: bool,
    scales: KVScales,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU path: the reference on the call's page table (tables: mla_paged_ref's
    index arguments)."""
    return mla_paged_ref(
        inputs.q_nope,
        inputs.q_pe,
        inputs.ckv_cache,
        inputs.kpe_cache,
        sm_scale=sm_scale,
        causal=causal,
        kv_scale=None
        if scales.mode == SCALE_NONE
        else (scales.ckv_arr if scales.ckv_arr is not None else scales.ckv, scales.kpe),
        **tables,
    )


def run_plan(
    plan: MLAPlan,
    inputs: MLAInputs,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    scales: KVScales,
) -> torch.Tensor:
    """Run `plan` on checked inputs, writing `out` (and `lse` when given); returns the LSE
    buffer written (`lse`, or the plan's scratch)."""
    lse_buf = lse if lse is not None else plan.lse_scratch
    p = plan.params
    if not use_kernels(out.device):
        dev = out.device
        t = plan.tables
        ref_o, ref_lse = _reference(
            inputs,
            {
                "qo_indptr": torch.as_tensor(t.qo_indptr, device=dev),
                "kv_indptr": torch.as_tensor(t.kv_indptr, device=dev),
                "kv_indices": plan.kv_indices,
                "kv_len_arr": torch.as_tensor(t.kv_len, device=dev),
            },
            p.sm_scale,
            p.causal,
            scales,
        )
        n = plan.total_qo
        out[:n].copy_(ref_o[:n])
        lse_buf[:n].copy_(ref_lse[:n])
        return lse_buf
    if plan.total_qo == 0:
        return lse_buf
    runner: TunableRunner
    tactic: Tactic
    args = [inputs.q_nope, inputs.q_pe, inputs.ckv_cache, inputs.kpe_cache, plan, out, lse_buf]
    if plan.launch is not None and plan.launch.tactic is not None:
        runner, tactic = RUNNERS[0], plan.launch.tactic  # fixed by the caller
    else:
        runner, tactic = choose_one(tuning_name(plan), RUNNERS, TUNING, args)
    runner([*args, scales], tactic)
    return lse_buf


def tile_in_page(plan: MLAPlan, tactic: MLATactic) -> bool:
    """Whether each KV tile of `tactic` lies in one page of `plan`'s cache: block_n divides
    the page size and every work item's first KV position (plan.kv_align). The kernel then
    loads one page id a tile and adds a scalar base to offsets computed before its loop
    (kernels.mla_item's TILE_IN_PAGE)."""
    return plan.params.page_size % tactic.block_n == 0 and plan.kv_align % tactic.block_n == 0


def launch_kernels(
    plan: MLAPlan,
    inputs: MLAInputs,
    out: torch.Tensor,
    lse: torch.Tensor,
    scales: KVScales,
    tactic: MLATactic,
) -> None:
    """Launch the attention kernel and, where the plan split KV, the merge kernel."""
    p = plan.params
    arr = scales.ckv_arr
    if tactic.dv_split > 1 and (scales.mode == SCALE_GROUPS or p.head_dim_ckv % tactic.dv_split):
        raise ValueError(
            f"MLATactic.dv_split={tactic.dv_split} needs head_dim_ckv divisible by it and no "
            "per-group fp8 scales"
        )
    if tactic.p_scratch and (
        plan.p_scratch is None or tactic.dv_split > 1 or tactic.block_n > MAX_P_SCRATCH_N
    ):
        raise ValueError(
            f"MLATactic.p_scratch needs a plan of 32 rows or more (this one: {plan.block_m}), "
            f"dv_split 1 and block_n <= {MAX_P_SCRATCH_N}"
        )
    mla_paged_kernel[(plan.grid_ctas, tactic.dv_split)](
        inputs.q_nope,
        inputs.q_pe,
        inputs.ckv_cache,
        inputs.kpe_cache,
        arr if arr is not None else plan.partial_lse,  # read only with SCALE_GROUPS
        plan.kv_indices,
        plan.work_indptr,
        plan.work,
        out,
        lse,
        plan.partial_o,
        plan.partial_lse,
        *_strides(inputs, scales, out),
        p.num_heads,
        p.sm_scale * LOG2E,
        float(scales.ckv),
        float(scales.kpe),
        D_CKV=p.head_dim_ckv,
        D_KPE=p.head_dim_kpe,
        PAGE_SIZE=p.page_size,
        BLOCK_M=plan.block_m,
        BLOCK_N=tactic.block_n,
        CAUSAL=p.causal,
        SCALE_MODE=scales.mode,
        num_warps=tactic.num_warps,
        num_stages=tactic.num_stages,
        **({"RELOAD_Q": True} if tactic.reload_q else {}),
        **({"DV_SPLIT": tactic.dv_split} if tactic.dv_split > 1 else {}),
        **({"TILE_IN_PAGE": True} if tile_in_page(plan, tactic) else {}),
        **(
            ArrivalCounters.launch_args(plan.merge_info, plan.counters)
            if tactic.fused_merge
            else {}
        ),
        **(
            {"P_SCRATCH": True, "p_scratch_ptr": plan.p_scratch, "a_scratch_ptr": plan.a_scratch}
            if tactic.p_scratch
            else {}
        ),
    )
    if tactic.fused_merge:
        return  # the kernel merged its split tiles
    if plan.always_merge or plan.host.has_split:
        # Rows past the merge info (a CUDA-graph wrapper's padding) are left alone.
        n = min(out.shape[0], plan.merge_info.shape[0])
        merge_partials(
            plan.partial_o,
            plan.partial_lse,
            plan.merge_info[:n],
            out[:n],
            lse[:n],
            sm_count=plan.sm_count,
        )


def tuning_name(plan: MLAPlan) -> str:
    """The autotuner's op name: causal multi-token plans run another kernel variant (the
    dtypes of q and the cache are keyed by TUNING.key_dtypes)."""
    multi = plan.total_qo > plan.batch
    return "mla.paged" + ("+causal" if plan.params.causal and multi else "")


class MLAPagedRunner(TunableRunner):
    """The split-KV Triton kernel; inputs are (q_nope, q_pe, ckv_cache, kpe_cache, plan,
    out, lse[, scales]) with an `MLAPlan`."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        if inputs[0].device.type != "cuda":
            return []
        plan: MLAPlan = inputs[4]
        p = plan.params
        smem = platform.device_limits(inputs[0].device).shared_memory_per_block
        dims = (p.head_dim_ckv, p.head_dim_kpe)
        space = MLATactic.space(plan.block_m, p.kv_dtype.itemsize, dims, smem)
        fused_ok = ArrivalCounters.worth_trying(plan.host.merge_info)
        return [t for t in space if fused_ok or not t.fused_merge]

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        q_nope, q_pe, ckv, kpe, plan, out, lse = inputs[:7]
        scales = inputs[7] if len(inputs) > 7 else KVScales()
        # Tactic -1: the plan's default, the one its grid and chunks were sized for.
        chosen = tactic if isinstance(tactic, MLATactic) else plan.default_tactic
        launch_kernels(plan, MLAInputs(q_nope, q_pe, ckv, kpe), out, lse, scales, chosen)
        return out


def _staged(plan: MLAPlan, ckv_cache: torch.Tensor,
            kpe_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The paged caches gathered contiguously for the Gluon kernel (`hopper.stage`), the
    row index made once a plan (at plan() on sm_90, else here) and shared by both."""
    t = plan.tables
    if plan.hopper_rows is None:
        page_size = plan.params.page_size
        plan.hopper_rows = hopper.staged_rows(t.kv_indptr, plan.kv_indices, t.kv_len, page_size)
    ckv = hopper.stage(ckv_cache, t.kv_indptr, plan.kv_indices, t.kv_len, plan.hopper_rows)
    kpe = hopper.stage(kpe_cache, t.kv_indptr, plan.kv_indices, t.kv_len, plan.hopper_rows)
    return ckv, kpe


# MLAHopperPrefillRunner's split-KV tactic (mla/hopper_split.py).
SPLIT_TACTIC = 2


class MLAHopperPrefillRunner(TunableRunner):
    """The Gluon prefill for sm_90 (mla/hopper.py) on multi-token plans it qualifies for
    (`hopper.supported`, a 16-bit cache, outside CUDA-graph mode); else the Triton kernel's
    default. First in RUNNERS (the untuned default) once `hopper.ADMITTED`; at tactic -1 it
    runs only where `hopper.default_uses_gluon` (enough work items to fill the GPU), else
    the Triton kernel's default."""

    @staticmethod
    def qualifies(inputs: Sequence[Any], decode: bool = False) -> bool:
        """Whether the kernel can run these inputs: multi-token plans, and with `decode`
        (the split-KV form) one-token ones too."""
        q_nope, q_pe, ckv, _, plan, out, lse = inputs[:7]
        scales = inputs[7] if len(inputs) > 7 else KVScales()
        if (plan.total_qo <= plan.batch and not decode) or plan.total_qo == 0:
            return False  # decode (without the split form)
        if plan.always_merge or scales.mode != SCALE_NONE:
            return False  # CUDA-graph mode, an fp8 cache
        # The kernel reads q and writes out/lse through flat row views (TMA descriptors);
        # a strided query (a slice of a fused q tensor) stays on the Triton kernel.
        tensors = (q_nope, q_pe, out, lse)
        if not all(x.is_contiguous() for x in tensors):
            return False
        t = plan.tables
        qo_lens = t.qo_indptr[1:] - t.qo_indptr[:-1]
        return hopper.supported(q_nope, ckv, qo_lens, t.kv_len, plan.params.causal) is None

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        # 0: one score MMA at a time; 1: `overlap` (block j + 1's score MMA under block j's
        # softmax); 2: split-KV (mla/hopper_split.py), once hopper.SPLIT_ADMITTED. -1, the
        # untuned default, is 0 where `default_uses_gluon`, else Triton.
        tactics: list[Tactic] = [0, 1] if self.qualifies(inputs) else []
        if hopper.SPLIT_ADMITTED and self._split_ok(inputs):
            tactics.append(SPLIT_TACTIC)
        return tactics

    @classmethod
    def _split_ok(cls, inputs: Sequence[Any]) -> bool:
        plan = inputs[4]
        return cls.qualifies(inputs, decode=True) and hopper_split.can_split(plan.params.num_heads)

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        if tactic == SPLIT_TACTIC and self._split_ok(inputs):
            return self._forward_split(inputs)
        if not self.qualifies(inputs) or tactic == SPLIT_TACTIC:
            return _TRITON.forward(inputs, DEFAULT_TACTIC)
        q_nope, q_pe, ckv_cache, kpe_cache, plan, out, lse = inputs[:7]
        t = plan.tables
        capturing = q_nope.is_cuda and torch.cuda.is_current_stream_capturing()
        if plan.hopper_work is None and capturing:
            # A plan made off sm_90 (hopper.plan_tables made none): building the tables now
            # would copy from the host inside the capture.
            return _TRITON.forward(inputs, DEFAULT_TACTIC)
        if plan.hopper_work is None:
            work = hopper.work_items(
                t.qo_indptr, t.kv_len, plan.params.num_heads, plan.params.causal
            )
            plan.hopper_work = torch.from_numpy(work).to(q_nope.device)
        if tactic == DEFAULT_TACTIC:
            sms = platform.device_limits(q_nope.device).sm_count
            if not hopper.default_uses_gluon(plan.hopper_work, sms):
                return _TRITON.forward(inputs, DEFAULT_TACTIC)
        ckv, kpe = _staged(plan, ckv_cache, kpe_cache)
        n = plan.total_qo
        hopper.launch(
            q_nope[:n], q_pe[:n], ckv, kpe, out[:n], lse[:n], plan.hopper_work,
            plan.params.sm_scale, plan.params.causal, overlap=tactic == 1,
        )  # fmt: skip
        return out

    @staticmethod
    def _forward_split(inputs: Sequence[Any]) -> Any:
        """The split-KV form: chunks of about two items an SM, written to the plan's
        partial rows, then merged. Falls back to the Triton kernel where the plan's partial
        buffers cannot hold the chunks, or inside a capture before its first run."""
        q_nope, q_pe, ckv_cache, kpe_cache, plan, out, lse = inputs[:7]
        t, dev = plan.tables, q_nope.device
        sms = platform.device_limits(dev).sm_count
        if plan.hopper_split is None:
            if q_nope.is_cuda and torch.cuda.is_current_stream_capturing():
                return _TRITON.forward(inputs, DEFAULT_TACTIC)
            h = plan.params.num_heads
            work = hopper.work_items(t.qo_indptr, t.kv_len, h, plan.params.causal)
            chunk = hopper_split.chunk_blocks_for(work, sms)
            work, merge, slots = hopper_split.split_work(work, t.qo_indptr, h, chunk)
            if slots > plan.partial_o.shape[0]:
                return _TRITON.forward(inputs, DEFAULT_TACTIC)  # the workspace is too small
            plan.hopper_split = (torch.from_numpy(work).to(dev), torch.from_numpy(merge).to(dev))
        work_dev, merge_dev = plan.hopper_split
        ckv, kpe = _staged(plan, ckv_cache, kpe_cache)
        n = plan.total_qo
        hopper.launch(
            q_nope[:n], q_pe[:n], ckv, kpe, out[:n], lse[:n], work_dev,
            plan.params.sm_scale, plan.params.causal,
            partial=(plan.partial_o, plan.partial_lse),
        )  # fmt: skip
        merge_partials(plan.partial_o, plan.partial_lse, merge_dev, out[:n], lse[:n], sms)
        return out


_TRITON = MLAPagedRunner()
RUNNERS: tuple[TunableRunner, ...] = (
    (MLAHopperPrefillRunner(), _TRITON) if hopper.ADMITTED else (_TRITON,)
)
# key_dtypes: an fp8 cache's best tactic is not bf16's at the same shapes.
TUNING = TuningConfig(cold_l2=True, use_cuda_graph=True, key_dtypes=True)


# --------------------------------------------------------------------------- plan-free


@dataclass(frozen=True)
class PlanlessTable:
    """A plan-free call's page table (int32, on q's device): qo_indptr None for decode (one
    query per request), kv_last_page_len None when every page is full."""

    qo_indptr: torch.Tensor | None
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor | None


@dataclass(frozen=True)
class PlanlessOptions:
    sm_scale: float
    causal: bool
    launch: MLALaunch | None = None


def _search_block(batch: int) -> int:
    # Two widths only, so that batch sizes share compiled kernels (as the GQA plan-free calls).
    return 128 if batch <= 128 else 1024


def launch_planless(
    inputs: MLAInputs,
    table: PlanlessTable,
    out: torch.Tensor,
    lse: torch.Tensor,
    scales: KVScales,
    options: PlanlessOptions,
) -> None:
    """The plan-free call on checked inputs: decode (table.qo_indptr None) splits each
    request's KV in chunks chosen from shapes alone and merges them; otherwise one program
    per query tile reads the tile's whole (causally trimmed) KV. No host sync."""
    dev = out.device
    batch = table.kv_indptr.numel() - 1
    if not use_kernels(dev):
        ref_o, ref_lse = _reference(
            inputs,
            {
                "qo_indptr": table.qo_indptr,
                "kv_indptr": table.kv_indptr,
                "kv_indices": table.kv_indices,
                "kv_last_page_len": table.kv_last_page_len,
            },
            options.sm_scale,
            options.causal,
            scales,
        )
        out.copy_(ref_o)
        lse.copy_(ref_lse)
        return
    total_q, h, d_ckv = inputs.q_nope.shape
    if batch == 0 or total_q == 0:
        return
    page_size = inputs.ckv_cache.shape[1]
    itemsize = inputs.ckv_cache.element_size()
    decode = table.qo_indptr is None
    how = options.launch if options.launch is not None else DEFAULT_LAUNCH
    block_m = block_m_for(h if decode else min(total_q * h, 64), options.launch)
    limits = platform.device_limits(dev)
    dims = (d_ckv, inputs.q_pe.shape[-1])
    tactic = how.tactic or default_tactic(block_m, itemsize, dims, limits.shared_memory_per_block)
    if tactic.dv_split > 1 or tactic.fused_merge or tactic.p_scratch:
        raise ValueError(
            "MLATactic.dv_split > 1, fused_merge and p_scratch run in planned calls only (the "
            "MLA wrapper)"
        )
    sm_count = plan_sm_count(limits, options.launch)
    if decode:
        tiles = -(-h // block_m)
        per_sm = ctas_per_sm(
            tactic,
            block_m,
            d_ckv,
            inputs.q_pe.shape[-1],
            itemsize,
            limits.shared_memory_per_block,
            how.max_ctas_per_sm,
        )
        chunk, programs = planless_chunk(
            batch,
            table.kv_indices.numel() * page_size,
            tiles,
            sm_count * per_sm,
            chunk_align(tactic),
            min_chunk(batch * tiles, sm_count),
        )
        # One fp32 allocation for the partial outputs and LSEs (row j belongs to program j).
        partial = torch.empty(programs * h * (d_ckv + 1), dtype=torch.float32, device=dev)
        partial_o = partial[: programs * h * d_ckv].view(programs, h, d_ckv)
        partial_lse = partial[programs * h * d_ckv :].view(programs, h)
        merge_info = torch.empty(batch, 3, dtype=torch.int32, device=dev)
        grid = (programs, tiles)
    else:
        chunk = 0
        programs = -(-total_q * h // block_m) + batch
        partial_o, partial_lse, merge_info = out, lse, table.kv_indptr  # unused
        grid = (programs, 1)
    arr = scales.ckv_arr
    mla_planless_kernel[grid](
        inputs.q_nope,
        inputs.q_pe,
        inputs.ckv_cache,
        inputs.kpe_cache,
        arr if arr is not None else lse,  # read only with SCALE_GROUPS
        table.qo_indptr if table.qo_indptr is not None else table.kv_indptr,
        table.kv_indptr,
        table.kv_last_page_len if table.kv_last_page_len is not None else table.kv_indptr,
        table.kv_indices,
        out,
        lse,
        partial_o,
        partial_lse,
        merge_info,
        batch,
        chunk,
        *_strides(inputs, scales, out),
        h,
        options.sm_scale * LOG2E,
        float(scales.ckv),
        float(scales.kpe),
        D_CKV=d_ckv,
        D_KPE=inputs.q_pe.shape[-1],
        PAGE_SIZE=page_size,
        BLOCK_M=block_m,
        BLOCK_N=tactic.block_n,
        BLOCK_B=_search_block(batch),
        CAUSAL=options.causal and not decode,
        SCALE_MODE=scales.mode,
        DECODE=decode,
        HAS_LAST=table.kv_last_page_len is not None,
        num_warps=tactic.num_warps,
        num_stages=tactic.num_stages,
        **({"RELOAD_Q": True} if tactic.reload_q else {}),
    )
    # Nothing can be split when one chunk holds every token the page table could describe.
    if decode and programs - batch > 1:
        merge_partials(partial_o, partial_lse, merge_info, out, lse, sm_count=sm_count)

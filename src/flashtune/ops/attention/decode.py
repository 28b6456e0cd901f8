"""Batch decode attention over a paged KV cache: a split-KV Triton kernel with a CPU plan.

The kernel processes *work items* (see scheduler.py): one query tile of one request against
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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from flashtune import env, platform
from flashtune.ops.attention.merge import merge_partials
from flashtune.ops.attention.page import KV_LAYOUTS, split_kv_cache
from flashtune.ops.attention.reference import (
    batch_decode_ref,
    gqa_paged_decode_ref,
    paged_attention_ref,
    single_decode_ref,
)
from flashtune.ops.attention.scheduler import (
    NUM_WORK_FIELDS,
    CostModel,
    WorkPlan,
    max_work_items,
    plan_work,
)
from flashtune.schema import REGISTRY, ApiOp, Const, OpSchema, Scalar, Tensor, Var
from flashtune.tune import TunableRunner, TuningConfig, choose_one

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "single_decode_with_kv_cache",
    "batch_decode_ref",
    "gqa_paged_decode_ref",
    "single_decode_ref",
    "GQA_PAGED_DECODE",
    "PagedAttentionRunner",
    "DecodeTactic",
]

_LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------- kernel


@triton.jit
def _tanh(x):
    # tanh through exp2 (portable to the interpreter); saturates correctly at +-inf.
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * 1.4426950408889634)) + 1.0)


@triton.jit
def _decode_item(
    q_ptr,
    k_base,  # K pointer offset by the KV head
    v_base,  # V pointer offset by the KV head
    kv_indices_ptr,
    o_ptr,
    lse_ptr,
    po_ptr,
    plse_ptr,
    kvh,
    qo_start,  # first query token of the request
    qo_len,
    row_start,  # first packed row of this query tile
    page_base,  # offset of the request's pages in kv_indices
    kv_start,
    kv_end,
    kv_len,
    out_row,  # -1: write the final output; else the first partial row of this chunk
    stride_qt,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_vp,
    stride_vt,
    stride_ot,
    stride_oh,
    num_qo_heads,
    qk_scale,
    soft_cap,
    window_left,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """One work item: a query tile of one request against KV [kv_start, kv_end)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    # Packed rows: (query token, head within the group); see scheduler.WORK_FIELDS.
    p = row_start + offs_m
    qi = p // GROUP
    head = kvh * GROUP + p % GROUP
    row_ok = p < qo_len * GROUP
    tok = (qo_start + qi).to(tl.int64)
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    q_pos = kv_len - qo_len + qi

    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Page ids are loaded one block ahead (loop-carried): otherwise each block waits for
    # its index load before its K/V copies can start, a full memory latency per block
    # (page size 1 reads a fresh 256 B of indices per block: 73% of HBM bandwidth).
    t_next = kv_start + offs_n
    page_next = tl.load(
        kv_indices_ptr + page_base + t_next // PAGE_SIZE, mask=t_next < kv_end, other=0
    )
    for start in range(kv_start, kv_end, BLOCK_N):
        t = start + offs_n
        t_ok = t < kv_end
        page = page_next.to(tl.int64)
        t_next = t + BLOCK_N
        page_next = tl.load(
            kv_indices_ptr + page_base + t_next // PAGE_SIZE, mask=t_next < kv_end, other=0
        )
        in_page = t % PAGE_SIZE
        kv_mask = t_ok[:, None] & d_ok[None, :]
        k = tl.load(
            k_base + page[:, None] * stride_kp + in_page[:, None] * stride_kt + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N] fp32
        if SOFT_CAP:
            s = soft_cap * _tanh(s * qk_scale)
        else:
            s = s * qk_scale
        valid = t_ok[None, :]
        if CAUSAL:
            valid = valid & (t[None, :] <= q_pos[:, None])
        if WINDOW:
            valid = valid & (t[None, :] >= q_pos[:, None] - window_left)
        s = tl.where(valid, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        prob = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(prob, 1)
        v = tl.load(
            v_base + page[:, None] * stride_vp + in_page[:, None] * stride_vt + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(prob.to(v.dtype), v)
        m_i = m_new

    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), -float("inf"))
    st_mask = row_ok[:, None] & d_ok[None, :]
    if out_row < 0:
        tl.store(
            o_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=st_mask,
        )
        tl.store(lse_ptr + tok * num_qo_heads + head, lse, mask=row_ok)
    else:
        prow = (out_row + qi).to(tl.int64) * num_qo_heads + head
        tl.store(po_ptr + prow[:, None] * HEAD_DIM + offs_d[None, :], out, mask=st_mask)
        tl.store(plse_ptr + prow, lse, mask=row_ok)


@triton.jit
def _paged_attn_kernel(
    q_ptr,  # [total_qo, H_qo, D]
    k_ptr,  # [num_pages, page_size, H_kv, D] logical (strided: NHD or HND storage)
    v_ptr,  # [num_pages, page_size, H_kv, D] logical
    kv_indices_ptr,  # [nnz_pages] int32
    work_indptr_ptr,  # [num_ctas + 1] int32
    work_ptr,  # [num_work, 8] int32 (scheduler.WORK_FIELDS)
    o_ptr,  # [total_qo, H_qo, D]
    lse_ptr,  # [total_qo, H_qo] fp32
    po_ptr,  # [num_partial_rows, H_qo, D] fp32
    plse_ptr,  # [num_partial_rows, H_qo] fp32
    stride_qt,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    num_qo_heads,
    qk_scale,  # sm_scale * log2(e), or sm_scale / soft_cap with SOFT_CAP
    soft_cap,  # soft_cap * log2(e) with SOFT_CAP
    window_left,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    cta = tl.program_id(0)
    kvh = tl.program_id(1)
    w_begin = tl.load(work_indptr_ptr + cta)
    w_end = tl.load(work_indptr_ptr + cta + 1)
    k_base = k_ptr + kvh * stride_kh
    v_base = v_ptr + kvh * stride_vh
    for w in range(w_begin, w_end):
        item = work_ptr + w * 8
        _decode_item(
            q_ptr, k_base, v_base, kv_indices_ptr, o_ptr, lse_ptr, po_ptr, plse_ptr, kvh,
            tl.load(item + 0), tl.load(item + 1), tl.load(item + 2), tl.load(item + 3),
            tl.load(item + 4), tl.load(item + 5), tl.load(item + 6), tl.load(item + 7),
            stride_qt, stride_qh, stride_kp, stride_kt, stride_vp, stride_vt,
            stride_ot, stride_oh, num_qo_heads, qk_scale, soft_cap, window_left,
            GROUP, HEAD_DIM, BLOCK_D, PAGE_SIZE, BLOCK_M, BLOCK_N, SOFT_CAP, CAUSAL, WINDOW,
        )  # fmt: skip


# --------------------------------------------------------------------------- schema

_KV_DIMS = ["num_pages", "page_size", "num_kv_heads", "head_dim"]
_QO_DIMS = ["batch_size", "num_qo_heads", "head_dim"]

# Axes, inputs and outputs as in the FlashInfer-Trace corpus (gqa_paged_decode_*.json).
# The page table and sm_scale are plan() state, read from the wrapper (`self`); the cache
# comes from run()'s paged_kv_cache as a logical NHD (k, v) pair (see _WrapperRunOp).
GQA_PAGED_DECODE = OpSchema(
    op_type="gqa_paged",
    name_prefix="gqa_paged_decode",
    axes={
        "batch_size": Var("Total number of query tokens."),
        "num_qo_heads": Const("Number of query/output attention heads.", abbrev="h"),
        "num_kv_heads": Const("Number of key-value attention heads.", abbrev="kv"),
        "head_dim": Const("Dimension of each attention head.", abbrev="d"),
        "num_pages": Var("Total number of allocated pages in the KV cache."),
        "page_size": Const("Number of tokens stored per page.", abbrev="ps"),
        "len_indptr": Var("Length of kv_indptr array."),
        "num_kv_indices": Var("Total number of KV page indices."),
    },
    inputs={
        "q": Tensor(_QO_DIMS, dtype_from="q", description="Query tensor for decode."),
        "k_cache": Tensor(
            _KV_DIMS, dtype_from="k_cache", param="paged_kv_cache.k",
            description="Paged key cache.",
        ),
        "v_cache": Tensor(
            _KV_DIMS, dtype_from="k_cache", param="paged_kv_cache.v",
            description="Paged value cache.",
        ),
        "kv_indptr": Tensor(
            ["len_indptr"], dtype="int32", param="self._kv_indptr",
            description="KV page offsets for each sequence.",
        ),
        "kv_indices": Tensor(
            ["num_kv_indices"], dtype="int32", param="self._kv_indices",
            description="Page IDs for KV cache lookups.",
        ),
        "kv_last_page_len": Tensor(
            ["batch_size"], dtype="int32", param="self._kv_last_page_len",
            description="Number of valid tokens in the last page for each sequence.",
        ),
        "sm_scale": Scalar(
            "float32", param="self._sm_scale",
            description="Softmax scale. Default is (1/sqrt(head_dim)).",
        ),
    },
    outputs={
        "output": Tensor(_QO_DIMS, dtype_from="q", description="Attention output tensor."),
        "lse": Tensor(
            ["batch_size", "num_qo_heads"], dtype="float32",
            description="The 2-based log-sum-exp of attention logits.",
        ),
    },
    reference=gqa_paged_decode_ref,
    bound=("window_left", "logits_soft_cap"),
    constraints=["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"],
    tags=["stage:decode", "fi_api:flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper"],
    description="Batched Grouped Query Attention decode with a paged KV cache.",
)  # fmt: skip


@dataclass(frozen=True)
class _PagedKV:
    """run()'s paged_kv_cache as the schema sees it: logical NHD views of K and V."""

    k: torch.Tensor
    v: torch.Tensor


class _WrapperRunOp(ApiOp):
    """`@api` for the wrapper's run method: the bound arguments see paged_kv_cache split into
    (k, v) in NHD order (a 5-D tensor or an HND pair would give wrong axes) plus the plan's
    window and soft-cap, which the emitted reference bakes in."""

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        wrapper = arguments["self"]
        k, v = split_kv_cache(arguments["paged_kv_cache"], wrapper._kv_layout)
        arguments["paged_kv_cache"] = _PagedKV(k, v)
        plan = wrapper._planner.plan
        if plan is not None:
            # Only non-defaults, so a plain decode's Definition matches the corpus.
            if plan.window_left >= 0:
                arguments["window_left"] = plan.window_left
            if plan.logits_soft_cap:
                arguments["logits_soft_cap"] = float(plan.logits_soft_cap)
        return arguments


def _schema_run(fn: Any) -> _WrapperRunOp:
    op = _WrapperRunOp(fn, GQA_PAGED_DECODE, None)
    REGISTRY[op.qualname] = op
    return op


# --------------------------------------------------------------------------- tactics / runner


@dataclass(frozen=True)
class DecodeTactic:
    """Launch configuration of `_paged_attn_kernel`."""

    block_n: int
    num_warps: int
    num_stages: int


def default_tactic(head_dim: int, page_size: int, block_m: int) -> DecodeTactic:
    """The tactic used when the tuner has nothing better (tactic -1)."""
    if TACTIC_OVERRIDE is not None:
        return TACTIC_OVERRIDE
    # Wide tiles amortize the per-block softmax work; d256 halves them to stay in registers.
    block_n = 64 if head_dim <= 128 else 32
    if block_m >= 64:
        return DecodeTactic(block_n=32 if head_dim <= 128 else 16, num_warps=4, num_stages=3)
    if page_size == 1 and head_dim <= 128:
        # One page per token: 128 gathered rows per block keep more bytes in flight
        # (H200, 32/8 heads, b64 KV 2k: 131 us vs 162 us with 64 rows).
        block_n = 128
    # 2 stages: with the page ids loaded a block ahead the K/V loads still overlap the math,
    # and the smaller shared-memory footprint fits 4 CTAs per SM instead of 3 (H200 sweep,
    # page size 16, b16-256 x KV 512-32k: 2-21% faster than 3 stages).
    return DecodeTactic(block_n=block_n, num_warps=4, num_stages=2)


# Set by benchmarks to sweep tactics until the autotuner picks them per shape.
TACTIC_OVERRIDE: DecodeTactic | None = None


TACTICS: tuple[DecodeTactic, ...] = tuple(
    DecodeTactic(bn, nw, ns) for bn in (32, 64, 128) for nw in (4, 8) for ns in (2, 3)
)


class PagedAttentionRunner(TunableRunner):
    """The split-KV Triton kernel; inputs are (q, k, v, plan) with a planned `_DevicePlan`."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[DecodeTactic]:
        q = inputs[0]
        if q.device.type != "cuda":
            return []
        d = inputs[1].shape[-1]
        return [t for t in TACTICS if d <= 128 or t.block_n <= 64]

    def forward(self, inputs: Sequence[Any], tactic: Any = -1) -> Any:
        q, k, v, dplan, out, lse = inputs
        if not isinstance(tactic, DecodeTactic):
            tactic = default_tactic(dplan.head_dim, dplan.page_size, dplan.block_m)
        _launch(dplan, q, k, v, out, lse, tactic)
        return out


_RUNNERS = (PagedAttentionRunner(),)
_TUNING = TuningConfig(cold_l2=True, use_cuda_graph=True)


# --------------------------------------------------------------------------- plan state


_SMEM_PER_SM = 227 * 1024  # H100/H200: usable shared memory per SM (bytes)


def _ctas_per_sm(tactic: DecodeTactic, head_dim: int, block_m: int) -> int:
    """Persistent CTAs per SM: as many as fit in shared memory, at most 4.

    The plan balances work over all CTAs assuming they run at once; a grid larger than
    what is resident would run in waves and double the makespan of the last ones.
    """
    d = _next_pow2(head_dim)
    # Buffered K and V tiles (stages - 1 copies of each), the Q tile twice (staging and
    # layout conversion) and the P tile, bf16: within 10% of what Triton 3.6 allocates
    # (checked on sm_90 for d 64-256, BLOCK_N 32-128, BLOCK_M 16-64, 2-4 stages).
    kv_tile = 2 * tactic.block_n * d * 2
    smem = max(tactic.num_stages - 1, 1) * kv_tile + 2 * block_m * d * 2
    smem += block_m * tactic.block_n * 2 + 1024  # + page-id buffers and alignment slack
    return max(1, min(CTAS_PER_SM_CAP, _SMEM_PER_SM // smem))


# Most persistent CTAs per SM (benchmarks sweep it with the tactic).
CTAS_PER_SM_CAP = 4


def _min_chunk(batch: int, num_kv_heads: int, sm_count: int) -> int:
    # Latency regime (batch 1-4 at 8 KV heads): a CTA's chain of dependent block loads,
    # not bandwidth, sets the time, so short chunks spread one request over all SMs.
    if batch * num_kv_heads * 4 <= sm_count:
        return 64
    # 256: the merge re-reads a 2 KB partial per chunk and head group; below 256 tokens
    # (128 KB of KV per head) that traffic and the extra items cost more than they balance.
    return 256


_SM_COUNTS: dict[torch.device, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        if device not in _SM_COUNTS:
            _SM_COUNTS[device] = torch.cuda.get_device_properties(device).multi_processor_count
        return _SM_COUNTS[device]
    # The interpreter runs CTAs one by one: a few are enough to exercise the scheduling.
    return 2


def _block_m(rows_per_tile_hint: int) -> int:
    # tl.dot needs M >= 16; more rows than 64 per tile only for very large groups.
    return max(16, min(64, _next_pow2(max(rows_per_tile_hint, 1))))


def _next_pow2(n: int) -> int:
    # triton.next_power_of_2 is a ConstexprFunction in Triton 3.6: ~5 us per host call.
    return 1 << (int(n) - 1).bit_length() if n > 1 else 1


def _align256(n: int) -> int:
    return -(-n // 256) * 256


@dataclass
class _DevicePlan:
    """Everything `run` needs: scalar parameters and device views of the plan arrays."""

    batch: int
    total_qo: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    group: int
    block_m: int
    sm_scale: float
    logits_soft_cap: float | None
    window_left: int
    causal: bool
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    host: WorkPlan
    grid_ctas: int
    work_indptr: torch.Tensor  # [grid_ctas + 1] int32 (device)
    work: torch.Tensor  # [W, 8] int32 (device)
    merge_info: torch.Tensor  # [total_qo, 3] int32 (device)
    partial_o: torch.Tensor  # [P, H_qo, D] fp32
    partial_lse: torch.Tensor  # [P, H_qo] fp32
    lse_scratch: torch.Tensor  # [total_qo, H_qo] fp32, used when no lse is requested
    kv_indices: torch.Tensor  # [>= nnz] int32 (device)
    nnz_pages: int
    index_range: tuple[int, int] | None  # (min, max) of kv_indices[:nnz] when known cheaply
    always_merge: bool  # graph mode: launch the merge kernel even when nothing was split
    mask_window: bool  # mask by window in the kernel (else the plan trimmed the KV range)
    max_partials: int  # most partials merged into one output row (0: nothing split)
    sm_count: int
    qo_indptr_host: np.ndarray  # [B+1] int64
    indptr_host: np.ndarray  # [B+1] int64
    last_host: np.ndarray  # [B] int64


@dataclass(frozen=True)
class _Layout:
    """Sizes of the plan's integer arrays (a planner-owned buffer) and byte offsets of its
    float scratch regions in the workspace buffer."""

    ints: int  # int32 elements of [work_indptr | work | merge_info]
    max_ctas: int
    max_work: int
    max_qo: int
    max_partial: int
    num_qo_heads: int
    head_dim: int

    @property
    def off_plse(self) -> int:
        return 0

    @property
    def off_lse(self) -> int:
        return self.off_plse + _align256(self.max_partial * self.num_qo_heads * 4)

    @property
    def off_po(self) -> int:
        return self.off_lse + _align256(self.max_qo * self.num_qo_heads * 4)

    @property
    def nbytes(self) -> int:
        return self.off_po + self.max_partial * self.num_qo_heads * self.head_dim * 4


def _make_layout(
    max_ctas: int, max_work: int, max_qo: int, max_partial: int, num_qo_heads: int, head_dim: int
) -> _Layout:
    ints = (max_ctas + 1) + max_work * NUM_WORK_FIELDS + max_qo * 3
    return _Layout(ints, max_ctas, max_work, max_qo, max_partial, num_qo_heads, head_dim)


def _carve(workspace: torch.Tensor, layout: _Layout) -> dict[str, torch.Tensor]:
    if workspace.numel() * workspace.element_size() < layout.nbytes:
        raise ValueError(
            f"workspace_buffer holds {workspace.numel() * workspace.element_size()} bytes but "
            f"this plan needs {layout.nbytes}; allocate a larger workspace (FlashInfer's "
            "recommendation, 128 MB, is always enough for decode)"
        )
    raw = workspace.view(torch.uint8).reshape(-1)
    h, d = layout.num_qo_heads, layout.head_dim
    return {
        "partial_lse": raw[layout.off_plse : layout.off_plse + layout.max_partial * h * 4]
        .view(torch.float32)
        .view(layout.max_partial, h),
        "lse_scratch": raw[layout.off_lse : layout.off_lse + layout.max_qo * h * 4]
        .view(torch.float32)
        .view(layout.max_qo, h),
        "partial_o": raw[layout.off_po : layout.off_po + layout.max_partial * h * d * 4]
        .view(torch.float32)
        .view(layout.max_partial, h, d),
    }


def _as_int_tensor(name: str, x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        if x.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {x.dtype}")
        return x
    try:
        return torch.as_tensor(np.asarray(x, dtype=np.int64))
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an integer tensor, got {type(x).__name__}") from None


def _dtype(name: str, x: Any, default: torch.dtype) -> torch.dtype:
    if x is None:
        return default
    if isinstance(x, torch.dtype):
        return x
    if isinstance(x, str):
        d = getattr(torch, x, None)
        if isinstance(d, torch.dtype):
            return d
    raise TypeError(f"{name} must be a torch.dtype or its name, got {x!r}")


# --------------------------------------------------------------------------- host transfers


class _HostStaging:
    """A pinned host buffer reused across plans of one device, for both directions.

    Device-to-host: all small index arrays of a plan are copied into it non_blocking and
    waited for with ONE stream synchronize (a .cpu() per array would sync once each).
    Host-to-device: the packed plan is written into it and copied non_blocking; an event
    marks when the copy has read it, so the next plan never overwrites bytes in flight.
    """

    def __init__(self) -> None:
        self.d2h: torch.Tensor | None = None  # int64, pinned
        self.h2d: torch.Tensor | None = None  # int32, pinned
        self.h2d_done: Any = None  # torch.cuda.Event of the last H2D copy out of h2d

    @staticmethod
    def _grow(buf: torch.Tensor | None, n: int, dtype: torch.dtype) -> torch.Tensor:
        if buf is None or buf.numel() < n:
            size = 1 << max(10, (n - 1).bit_length())  # powers of two: few reallocations
            buf = torch.empty(size, dtype=dtype, pin_memory=True)
        return buf

    def to_host(self, tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
        sizes = [t.numel() for t in tensors]
        self.d2h = self._grow(self.d2h, sum(sizes), torch.int64)
        views, off = [], 0
        for t, n in zip(tensors, sizes, strict=True):
            dst = self.d2h[off : off + n]
            dst.copy_(t, non_blocking=True)  # casts to int64 on the way
            views.append(dst)
            off += n
        cuda = next(t.device for t in tensors if t.device.type == "cuda")
        torch.cuda.current_stream(cuda).synchronize()
        # Copies: the pinned buffer is reused by the next plan.
        return [v.numpy().copy() for v in views]

    def host_buffer(self, n: int) -> np.ndarray:
        """An int32 pinned area of n elements, free to overwrite (waits for the last copy)."""
        if self.h2d_done is not None:
            self.h2d_done.synchronize()
        self.h2d = self._grow(self.h2d, n, torch.int32)
        return self.h2d[:n].numpy()

    def upload(self, dst: torch.Tensor, n: int) -> None:
        dst.copy_(self.h2d[:n], non_blocking=True)
        if self.h2d_done is None:
            self.h2d_done = torch.cuda.Event()
        self.h2d_done.record(torch.cuda.current_stream(dst.device))


_STAGING: dict[torch.device, _HostStaging] = {}


def _staging(device: torch.device) -> _HostStaging:
    if device not in _STAGING:
        _STAGING[device] = _HostStaging()
    return _STAGING[device]


def _host_int64(*tensors: torch.Tensor) -> list[np.ndarray]:
    """int64 host copies of small index tensors: free on the CPU, one sync on a GPU."""
    if tensors and all(t.device.type == "cpu" for t in tensors):
        return [t.detach().numpy().astype(np.int64) for t in tensors]
    cuda = next(t.device for t in tensors if t.device.type != "cpu")
    return _staging(cuda).to_host([t.detach() for t in tensors])


def validate_page_table(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    page_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check a CSR page table on the host; return (indptr, last_page_len, kv_lens) as int64.

    Errors name the argument: indptr must be 1-D, non-decreasing, start >= 0 and end within
    `indices`; last_page_len must be in 1..page_size for requests with pages (0..page_size
    for requests without).
    """
    if indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError(
            f"indptr must be 1-D with batch_size + 1 entries, got {tuple(indptr.shape)}"
        )
    batch = indptr.numel() - 1
    if last_page_len.shape != (batch,):
        raise ValueError(
            f"last_page_len must have shape ({batch},) (batch_size from indptr), got "
            f"{tuple(last_page_len.shape)}"
        )
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
    ip, lp = _host_int64(indptr, last_page_len)
    return _validate_host_page_table(ip, lp, indices.numel(), page_size)


# Up to this many requests, the page table is checked in plain Python: ~10 numpy calls of
# ~1 us each on tiny arrays cost more than a loop over lists.
_PY_BATCH = 32


def _validate_host_page_table(
    ip: np.ndarray, lp: np.ndarray, num_indices: int, page_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if 0 < ip.size <= _PY_BATCH + 1:
        ipl = ip.tolist()
        if ipl[0] >= 0 and ipl[-1] <= num_indices:
            kv: list[int] = []
            # The same conditions as the numpy check below, request by request.
            for a, b, last in zip(ipl[:-1], ipl[1:], lp.tolist(), strict=True):
                s = b - a
                if s < 0 or last > page_size or last < (1 if s > 0 else 0):
                    break
                kv.append((s - 1) * page_size + last if s > 0 else 0)
            else:
                return ip, lp, np.array(kv, dtype=np.int64)
        return _explain_page_table(ip, lp, num_indices, page_size)
    steps = ip[1:] - ip[:-1]
    # The common case in a few numpy calls (each ~1 us, and plan() is timed per call): every
    # step >= 0, every last_page_len in 0..page_size, and 0 only for requests without pages
    # (lp >= min(step, 1)); the detailed pass below only runs to name what is wrong.
    if (
        ip.size
        and ip[0] >= 0
        and ip[-1] <= num_indices
        and (steps.size == 0 or (steps.min() >= 0 and lp.max() <= page_size))
        and (lp >= np.minimum(steps, 1)).all()
    ):
        # Requests without pages have lp <= page_size, so their (steps - 1) * ps + lp <= 0.
        return ip, lp, np.maximum((steps - 1) * page_size + lp, 0)
    return _explain_page_table(ip, lp, num_indices, page_size)


def _explain_page_table(
    ip: np.ndarray, lp: np.ndarray, num_indices: int, page_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if ip[0] < 0:
        raise ValueError(f"indptr[0] must be >= 0, got {ip[0]}")
    steps = np.diff(ip)
    if (steps < 0).any():
        b = int(np.argmax(steps < 0))
        raise ValueError(f"indptr must be non-decreasing, but indptr[{b + 1}] < indptr[{b}]")
    if ip[-1] > num_indices:
        raise ValueError(f"indptr[-1] = {ip[-1]} pages but indices has only {num_indices} entries")
    has_pages = steps > 0
    bad = has_pages & ((lp < 1) | (lp > page_size)) | ~has_pages & ((lp < 0) | (lp > page_size))
    if bad.any():
        b = int(np.argmax(bad))
        raise ValueError(
            f"last_page_len[{b}] = {lp[b]} is outside 1..page_size ({page_size}) for a request "
            "with pages"
            if has_pages[b]
            else f"last_page_len[{b}] = {lp[b]} is outside 0..page_size for an empty request"
        )
    kv_lens = np.where(has_pages, (steps - 1) * page_size + lp, 0)
    return ip, lp, kv_lens


def _index_range(indices: torch.Tensor, nnz: int) -> tuple[int, int] | None:
    """(min, max) of indices[:nnz]: a pass over every page id, so only when asked for."""
    if nnz == 0:
        return None
    head = indices[:nnz]
    return int(head.min()), int(head.max())


_COST = CostModel(qo=1.0, kv=1.0, fixed=32.0)
_LAUNCH: dict[tuple[Any, ...], tuple[int, int]] = {}


def _launch_shape(
    sm_count: int, head_dim: int, page_size: int, block_m: int, num_kv_heads: int
) -> tuple[int, int]:
    """(CTAs of the persistent grid, KV chunk alignment) of the default tactic, memoized:
    they depend only on the arguments (and TACTIC_OVERRIDE), and take ~3 us to derive."""
    key = (sm_count, head_dim, page_size, block_m, num_kv_heads, TACTIC_OVERRIDE, CTAS_PER_SM_CAP)
    shape = _LAUNCH.get(key)
    if shape is None:
        tactic = default_tactic(head_dim, page_size, block_m)
        num_ctas = max(1, (sm_count * _ctas_per_sm(tactic, head_dim, block_m)) // num_kv_heads)
        shape = _LAUNCH[key] = (num_ctas, max(tactic.block_n, 16))
    return shape


_CARVED: dict[tuple[Any, ...], dict[str, torch.Tensor]] = {}


def _carve_cached(workspace: torch.Tensor, layout: _Layout) -> dict[str, torch.Tensor]:
    """`_carve`, memoized per (workspace memory, layout): the views cost ~1 us each, and a
    wrapper built per call (the bundled benchmark's adapters) would otherwise redo them.
    At most 4 entries: the views keep their workspace alive until they are replaced."""
    key = (workspace.device, workspace.data_ptr(), workspace.numel() * workspace.element_size(),
           layout)  # fmt: skip
    regions = _CARVED.get(key)
    if regions is None:
        regions = _carve(workspace, layout)
        if len(_CARVED) >= 4:
            _CARVED.pop(next(iter(_CARVED)))
        _CARVED[key] = regions
    return regions


def _head(t: torch.Tensor, n: int) -> torch.Tensor:
    """t[:n]; t itself when that is all of it (the cached view: no new view per plan)."""
    return t if t.shape[0] == n else t[:n]


class _Planner:
    """Shared plan/run machinery of the decode and cascade wrappers (one level each)."""

    def __init__(
        self,
        workspace: torch.Tensor,
        use_cuda_graph: bool,
        indices_buffer: torch.Tensor | None,
        max_batch: int | None,
        max_qo: int | None,
    ) -> None:
        self.workspace = workspace
        self.device = workspace.device
        self.use_cuda_graph = use_cuda_graph
        self.indices_buffer = indices_buffer
        self.max_batch = max_batch
        self.max_qo = max_qo
        self._graph_layout: _Layout | None = None
        self.plan: _DevicePlan | None = None
        # The plan's integer arrays live in a buffer of this planner, not in the shared
        # workspace (FlashInfer's int workspace does the same): wrappers that share one
        # float workspace, as serving engines do, run only scratch through it, so one
        # wrapper's plan() never overwrites another's work list.
        self._ints_buf: torch.Tensor | None = None
        self._int_views: tuple[_Layout, dict[str, torch.Tensor]] | None = None

    def make(
        self,
        qo_indptr: np.ndarray | None,
        indptr: Any,
        indices: Any,
        last_page_len: Any,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        causal: bool,
        window_left: int,
        logits_soft_cap: float | None,
        sm_scale: float | None,
        q_dtype: torch.dtype,
        kv_dtype: torch.dtype,
        disable_split_kv: bool,
        fixed_split_size: int | None,
    ) -> _DevicePlan:
        for name, val in (
            ("num_qo_heads", num_qo_heads),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("page_size", page_size),
        ):
            if not isinstance(val, (int, np.integer)) or val < 1:
                raise ValueError(f"{name} must be a positive integer, got {val!r}")
        if num_qo_heads % num_kv_heads:
            raise ValueError(
                f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        if head_dim < 16 or head_dim > 256:
            raise ValueError(f"head_dim must be in 16..256, got {head_dim}")
        if q_dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"q_data_type must be float16 or bfloat16, got {q_dtype}")
        if kv_dtype != q_dtype:
            raise NotImplementedError(
                f"kv_data_type {kv_dtype} differs from q_data_type {q_dtype}: only matching "
                "fp16/bf16 KV is implemented"
            )
        indptr_t = _as_int_tensor("indptr", indptr)
        indices_t = _as_int_tensor("indices", indices)
        last_t = _as_int_tensor("last_page_len", last_page_len)
        ip, lp, kv_lens = validate_page_table(indptr_t, indices_t, last_t, page_size)
        batch = ip.shape[0] - 1
        group = num_qo_heads // num_kv_heads
        if qo_indptr is None:
            # Decode: one query per request, nothing to check (saves ~10 us of numpy calls).
            qo_indptr = np.arange(batch + 1, dtype=np.int64)
            total_qo, max_rows, single = batch, group, True
        else:
            total_qo = int(qo_indptr[-1])
            if qo_indptr.shape[0] != batch + 1:
                raise ValueError(
                    f"qo_indptr has {qo_indptr.shape[0]} entries but indptr has {batch + 1}"
                )
            qo_lens = np.diff(qo_indptr)
            if (qo_lens < 0).any():
                raise ValueError("qo_indptr must be non-decreasing")
            if (qo_lens > kv_lens).any() and causal:
                b = int(np.argmax(qo_lens > kv_lens))
                raise ValueError(
                    f"request {b}: qo_len {qo_lens[b]} > kv_len {kv_lens[b]} (causal queries "
                    "are aligned bottom-right and need qo_len <= kv_len)"
                )
            max_rows = int(qo_lens.max()) * group if batch else group
            # With a single query per request, a window only trims the KV range: no masking.
            single = bool((qo_lens <= 1).all())
        block_m = _block_m(max_rows)
        kv_starts = None
        if window_left >= 0 and single:
            kv_starts = np.maximum(kv_lens - 1 - window_left, 0)
        sm_count = _sm_count(self.device)
        num_ctas, align = _launch_shape(sm_count, head_dim, page_size, block_m, num_kv_heads)

        if self.use_cuda_graph:
            if self.max_batch is not None and batch != self.max_batch:
                raise ValueError(
                    f"CUDA-graph wrapper was built for batch_size {self.max_batch} (from the "
                    f"indptr buffer), but plan got {batch}"
                )
            max_qo = self.max_qo if self.max_qo is not None else total_qo
            if total_qo > max_qo:
                raise ValueError(f"plan has {total_qo} query tokens; the wrapper holds {max_qo}")
            max_tiles = batch * max(1, -(-max_rows // block_m))
            max_work = max_work_items(num_ctas, max_tiles)
            layout = _make_layout(
                num_ctas, max_work, max_qo, max_work * max(1, max_qo // max(batch, 1)),
                num_qo_heads, head_dim,
            )  # fmt: skip
            if self._graph_layout is not None and self._graph_layout != layout:
                raise ValueError(
                    "CUDA-graph wrapper re-planned with different heads/head_dim/batch: the "
                    "captured graph's buffers would move; build a new wrapper"
                )
            self._graph_layout = layout
        else:
            max_work = None

        host = plan_work(
            qo_indptr,
            kv_lens,
            ip,
            num_ctas,
            group_size=group,
            block_m=block_m,
            kv_starts=kv_starts,
            split_kv=not disable_split_kv,
            kv_chunk_size=fixed_split_size if fixed_split_size and fixed_split_size > 0 else None,
            chunk_align=align,
            min_chunk=_min_chunk(batch, num_kv_heads, sm_count),
            max_work=max_work,
            cost=_COST,
        )
        if not self.use_cuda_graph:
            layout = _make_layout(
                num_ctas, max(host.num_work, 1), max(total_qo, 1), max(host.num_partial_rows, 1),
                num_qo_heads, head_dim,
            )  # fmt: skip
        regions = {**_carve_cached(self.workspace, layout), **self._int_regions(layout)}

        # One host-to-device copy of all integer plan arrays: packed in a reused pinned
        # buffer on a GPU (async copy), written in place when the workspace is on the CPU.
        cuda = self.device.type == "cuda"
        staging = _staging(self.device) if cuda else None
        ints = staging.host_buffer(layout.ints) if staging else regions["ints"].numpy()
        c, w = layout.max_ctas + 1, layout.max_work * NUM_WORK_FIELDS
        ints[: host.num_ctas + 1] = host.work_indptr
        if c > host.num_ctas + 1:  # graph mode: the CTAs past the plan's run nothing
            ints[host.num_ctas + 1 : c] = host.work_indptr[-1]
        ints[c : c + host.work.size] = host.work.reshape(-1)
        ints[c + w : c + w + host.merge_info.size] = host.merge_info.reshape(-1)
        if staging:
            staging.upload(regions["ints"], layout.ints)

        nnz = int(ip[-1])
        if self.indices_buffer is not None:
            if indices_t.numel() > self.indices_buffer.numel():
                raise ValueError(
                    f"indices has {indices_t.numel()} entries but paged_kv_indices_buffer holds "
                    f"{self.indices_buffer.numel()}"
                )
            if indices_t.data_ptr() != self.indices_buffer.data_ptr():
                self.indices_buffer[: indices_t.numel()].copy_(indices_t)
            dev_indices = self.indices_buffer
        elif indices_t.dtype == torch.int32 and indices_t.device == self.device:
            dev_indices = indices_t  # what .to() returns, without its ~2 us of dispatch
        else:
            dev_indices = indices_t.to(device=self.device, dtype=torch.int32)
        # Page-id bounds: a pass over every id (and a sync on a GPU), so on a GPU only under
        # DEBUG_CHECKS; on the CPU check_run computes them on first use (the interpreter
        # would read out of bounds; the CPU path's cost is the reference anyway).
        index_range = (
            _index_range(indices_t, nnz) if indices_t.is_cuda and env.DEBUG_CHECKS.get() else None
        )

        plan = _DevicePlan(
            batch=batch,
            total_qo=total_qo,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            group=group,
            block_m=block_m,
            sm_scale=float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(head_dim),
            logits_soft_cap=logits_soft_cap if logits_soft_cap else None,
            window_left=window_left,
            causal=causal,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            host=host,
            # LPT fills CTAs in index order, so without a graph the empty tail is not launched.
            grid_ctas=layout.max_ctas
            if self.use_cuda_graph
            else max(1, min(host.num_ctas, host.num_work)),
            work_indptr=regions["work_indptr"],
            work=regions["work"],
            merge_info=_head(regions["merge_info"], total_qo),
            partial_o=regions["partial_o"],
            partial_lse=regions["partial_lse"],
            lse_scratch=_head(regions["lse_scratch"], total_qo),
            kv_indices=dev_indices,
            nnz_pages=nnz,
            index_range=index_range,
            always_merge=self.use_cuda_graph,
            mask_window=window_left >= 0 and not single,
            max_partials=int(host.merge_info[:, 1].max()) if host.num_partial_rows else 0,
            sm_count=sm_count,
            qo_indptr_host=qo_indptr,
            indptr_host=ip,
            last_host=lp,
        )
        self.plan = plan
        return plan

    def _int_regions(self, layout: _Layout) -> dict[str, torch.Tensor]:
        """Views of this planner's integer buffer for `layout` (grown when too small; in
        graph mode the layout, so the buffer, never changes after the first plan)."""
        if self._int_views is not None and self._int_views[0] == layout:
            return self._int_views[1]
        buf = self._ints_buf
        if buf is None or buf.numel() < layout.ints:
            buf = torch.empty(layout.ints, dtype=torch.int32, device=self.device)
            self._ints_buf = buf
        ints = buf[: layout.ints]
        c, w = layout.max_ctas + 1, layout.max_work * NUM_WORK_FIELDS
        views = {
            "ints": ints,
            "work_indptr": ints[:c],
            "work": ints[c : c + w].view(layout.max_work, NUM_WORK_FIELDS),
            "merge_info": ints[c + w : c + w + layout.max_qo * 3].view(layout.max_qo, 3),
        }
        self._int_views = (layout, views)
        return views

    def check_run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor | None,
        lse: torch.Tensor | None,
        q_shape: tuple[int, ...],
    ) -> _DevicePlan:
        plan = self.plan
        if plan is None:
            raise RuntimeError("run() called before plan(): call plan() once per step first")
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"q must be a tensor, got {type(q).__name__}")
        if tuple(q.shape) != q_shape:
            raise ValueError(
                f"q must have shape {q_shape} (tokens, num_qo_heads, head_dim as planned), got "
                f"{tuple(q.shape)}"
            )
        if q.dtype != plan.q_dtype:
            raise TypeError(
                f"q dtype {q.dtype} differs from the planned q_data_type {plan.q_dtype}"
            )
        if q.device != self.device:
            raise ValueError(f"q is on {q.device} but the workspace buffer is on {self.device}")
        if q.stride(-1) != 1:
            raise ValueError("q must be contiguous in its last dimension")
        expect = (plan.page_size, plan.num_kv_heads, plan.head_dim)
        for name, t in (("k", k), ("v", v)):
            if tuple(t.shape[1:]) != expect:
                raise ValueError(
                    f"paged_kv_cache {name}: expected pages of (page_size, num_kv_heads, "
                    f"head_dim) = {expect} as planned, got {tuple(t.shape[1:])}"
                )
            if t.dtype != plan.kv_dtype:
                raise TypeError(
                    f"paged_kv_cache dtype {t.dtype} differs from the planned kv_data_type "
                    f"{plan.kv_dtype}"
                )
            if t.device != self.device:
                raise ValueError(f"paged_kv_cache is on {t.device}, expected {self.device}")
            if t.stride(-1) != 1:
                raise ValueError("paged_kv_cache must be contiguous in head_dim")
        if plan.index_range is None and plan.kv_indices.device.type == "cpu" and plan.nnz_pages:
            plan.index_range = _index_range(plan.kv_indices, plan.nnz_pages)
        if plan.index_range is not None:
            lo, hi = plan.index_range
            if lo < 0 or hi >= k.shape[0]:
                raise ValueError(
                    f"indices hold page ids in [{lo}, {hi}] but the cache has {k.shape[0]} pages"
                )
        if out is not None:
            if tuple(out.shape) != q_shape or out.dtype != q.dtype or out.device != q.device:
                raise ValueError(
                    f"out must be a {q.dtype} tensor of shape {q_shape} on {q.device}, got "
                    f"{out.dtype} {tuple(out.shape)} on {out.device}"
                )
            if out.stride(-1) != 1:
                raise ValueError("out must be contiguous in its last dimension")
        if lse is not None:
            want = q_shape[:2]
            if (
                tuple(lse.shape) != want
                or lse.dtype != torch.float32
                or lse.device != q.device
                or not lse.is_contiguous()
            ):
                raise ValueError(
                    f"lse must be a contiguous float32 tensor of shape {want} on {q.device}, got "
                    f"{lse.dtype} {tuple(lse.shape)} on {lse.device}"
                )
        return plan

    def run(
        self,
        plan: _DevicePlan,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor | None,
        lse: torch.Tensor | None,
        scale: tuple[float, float],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Compute into out/lse (allocated if None); scale = (logit scale, output scale)."""
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
            runner, tactic = choose_one("attention.paged_decode", _RUNNERS, _TUNING, inputs)
            if logit_scale != 1.0:
                plan = _scaled(plan, logit_scale)
                inputs[3] = plan
            runner(inputs, tactic)
        if out_scale != 1.0:
            out.mul_(out_scale)
        return out, lse_buf


def _reference(
    plan: _DevicePlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, logit_scale: float
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
        causal=plan.causal,
        sm_scale=plan.sm_scale * logit_scale,
        window_left=plan.window_left,
        logits_soft_cap=plan.logits_soft_cap,
    )


def _scaled(plan: _DevicePlan, factor: float) -> _DevicePlan:
    from dataclasses import replace

    return replace(plan, sm_scale=plan.sm_scale * factor)


def _launch(
    plan: _DevicePlan,
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
        qk_scale, cap_arg = plan.sm_scale / cap, cap * _LOG2E
    else:
        qk_scale, cap_arg = plan.sm_scale * _LOG2E, 0.0
    grid = (plan.grid_ctas, plan.num_kv_heads)
    _paged_attn_kernel[grid](
        q, k, v, plan.kv_indices, plan.work_indptr, plan.work,
        out, lse, plan.partial_o, plan.partial_lse,
        q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1),
        plan.num_qo_heads, qk_scale, cap_arg, max(plan.window_left, 0),
        GROUP=plan.group, HEAD_DIM=plan.head_dim,
        BLOCK_D=triton.next_power_of_2(plan.head_dim), PAGE_SIZE=plan.page_size,
        BLOCK_M=plan.block_m, BLOCK_N=tactic.block_n,
        SOFT_CAP=bool(cap), CAUSAL=plan.causal, WINDOW=plan.mask_window,
        num_warps=tactic.num_warps, num_stages=tactic.num_stages,
    )  # fmt: skip
    if plan.always_merge or plan.host.has_split:
        merge_partials(
            plan.partial_o, plan.partial_lse, plan.merge_info, out, lse,
            max_count=None if plan.always_merge else plan.max_partials,
            sm_count=plan.sm_count,
        )  # fmt: skip


# --------------------------------------------------------------------------- public API


class BatchDecodeWithPagedKVCacheWrapper:
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
            bufs = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
            if any(b is None for b in bufs):
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
        self._planner = _Planner(
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
        q_data_type: str | torch.dtype = "float16",
        kv_data_type: str | torch.dtype | None = None,
        data_type: str | torch.dtype | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        non_blocking: bool = True,
        *,
        disable_split_kv: bool = False,
        fixed_split_size: int | None = None,
    ) -> None:
        """Schedule decode for one step (see the class docstring).

        indptr [B+1], indices [nnz_pages], last_page_len [B]: the page table (int32).
        """
        if pos_encoding_mode != "NONE":
            raise NotImplementedError(
                f"pos_encoding_mode={pos_encoding_mode!r}: only 'NONE' is implemented (apply "
                "RoPE before writing the KV cache)"
            )
        q_dtype = _dtype("q_data_type", q_data_type, torch.float16)
        if data_type is not None:  # FlashInfer's deprecated alias
            q_dtype = _dtype("data_type", data_type, q_dtype)
        kv_dtype = _dtype("kv_data_type", kv_data_type, q_dtype)
        if not isinstance(window_left, int):
            raise TypeError(f"window_left must be an int, got {type(window_left).__name__}")
        indptr_t = _as_int_tensor("indptr", indptr)
        last_t = _as_int_tensor("last_page_len", last_page_len)
        self._planner.make(
            None,  # decode: one query per request
            indptr_t,
            indices,
            last_t,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            causal=False,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            disable_split_kv=disable_split_kv,
            fixed_split_size=fixed_split_size,
        )
        if self._use_cuda_graph:
            # Keep the caller-visible buffers in sync, as FlashInfer's graph mode does.
            if indptr_t.data_ptr() != self._indptr_buf.data_ptr():
                self._indptr_buf.copy_(indptr_t.to(torch.int32))
            if last_t.data_ptr() != self._last_buf.data_ptr():
                self._last_buf.copy_(last_t.to(torch.int32))

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
        out_t, lse_t = self._planner.run(
            plan,
            q,
            k,
            v,
            out,
            lse if return_lse else None,
            (logit_scale, v_scale if v_scale is not None else 1.0),
        )
        return (out_t, lse_t) if return_lse else out_t

    def forward(self, q: torch.Tensor, paged_kv_cache: Any, **kwargs: Any) -> Any:
        """Deprecated FlashInfer alias of run (plan must have been called)."""
        return self.run(q, paged_kv_cache, **kwargs)

    def end_forward(self) -> None:
        """FlashInfer compatibility no-op."""


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

"""Merging attention states: the composition operator behind split-KV and cascade attention.

An attention state over a KV subset is (v, s): v the softmax-weighted sum of values, s the
base-2 log-sum-exp of the logits. Two states over disjoint subsets combine exactly:
    s = log2(2^s_a + 2^s_b),   v = (2^(s_a - s) v_a + 2^(s_b - s) v_b)
The operator is associative and commutative, so partial results can be merged in any fixed
order; states with s = -inf (empty subsets) carry no weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from flashtune import platform
from flashtune.ops.attention.reference import merge_state_ref, merge_states_ref

__all__ = [
    "ArrivalCounters",
    "merge_split_tile",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "merge_partials",
    "merge_tiles",
    "merge_state_ref",
    "merge_states_ref",
]


class ArrivalCounters:
    """The arrival counters of a planner's fused merge (`merge_split_tile`): int32, zeroed
    once, the same buffer for every plan that fits it (a captured CUDA graph keeps its
    address); the kernel resets each counter it completes, so they are zero between
    launches."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buf: torch.Tensor | None = None

    def at_least(self, n: int) -> torch.Tensor:
        """The buffer, grown (a new zeroed one) when it holds fewer than `n` counters."""
        if self._buf is None or self._buf.numel() < max(n, 1):
            self._buf = torch.zeros(max(n, 1), dtype=torch.int32, device=self.device)
        return self._buf

    # The most chunks a split tile may have for the fused merge to be worth timing: the last
    # chunk to arrive merges all of them alone (H200, MLA at 16 heads: b64 x 1k 40.0 us fused
    # against 42.1, b1 x 16k with one tile over all SMs 91 us against 20).
    MAX_SPLITS = 8

    @staticmethod
    def worth_trying(host_merge_info: np.ndarray) -> bool:
        """Whether a plan's fused-merge tactics are worth timing: some tile was split (else
        they are the plain kernel again), none into more than `MAX_SPLITS` chunks.
        host_merge_info: the plan's [rows, 3] (first partial row, count, stride)."""
        counts = host_merge_info[:, 1] if host_merge_info.size else host_merge_info
        return bool(counts.size) and 1 < int(counts.max()) <= ArrivalCounters.MAX_SPLITS

    @staticmethod
    def launch_args(merge_info: torch.Tensor, counters: torch.Tensor | None) -> dict[str, Any]:
        """The attention kernels' arguments that turn the fused merge on."""
        return {"FUSED_MERGE": True, "merge_info_ptr": merge_info, "counter_ptr": counters}


# --------------------------------------------------------------------------- kernels


@triton.jit
def _rescale(m, m_new, s):
    """(alpha, w): the factors that bring a running state of max m and a new state s to the
    common max m_new. A max still -inf (no state with weight yet) is shifted by 0, so that
    exp2 gives 0, not NaN."""
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
    return tl.exp2(m - m_safe), tl.exp2(s - m_safe)


@triton.jit
def merge_split_tile(o_ptr, lse_ptr, po_ptr, plse_ptr, merge_info_ptr, counter_ptr, tok0,
                     head0, tokens, heads, tok, st_mask, offs_c, stride_ot, stride_oh,
                     num_heads, ROW: tl.constexpr, COLS: tl.constexpr, PARTS: tl.constexpr,
                     part, BLOCK_M: tl.constexpr):  # fmt: skip
    """The fused merge of an attention kernel's split tile, called by each chunk after its
    partial rows are written: count the chunk in, and if it is the last of the tile's chunks
    to arrive, merge the tile's partials (in chunk order: the result does not depend on the
    arrival order) into the output, as `merge_partials` would, and reset the counter for the
    next launch. The GEMM split-K fixup's pattern (ops/gemm/kernels._split_k_fixup): partials
    published, a CTA barrier, an acq_rel arrival at GPU scope, the last arrival reads the
    others from L2. No program waits for another: a persistent grid cannot deadlock.

    merge_info: [tokens, 3] int32 (first partial row, count, stride), the plan's; tok0/head0:
    the tile's first token (a merge_info row) and first head; tokens, heads: each row's
    merge_info row and head; tok: its output row; st_mask [BLOCK_M, COLS]: rows and columns to
    write; offs_c: this program's COLS columns of a partial row of ROW floats; PARTS/part:
    programs sharing the tile's columns (each counts and merges its own). The counter: the
    first token's first partial row (unique to the token), the first head, the part."""
    info0 = merge_info_ptr + tok0.to(tl.int64) * 3
    count = tl.load(info0 + 1)
    tile_id = (tl.load(info0) * num_heads + head0) * PARTS + part
    # Every thread's partial must be written before one thread announces the chunk.
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
    if arrived == count - 1:
        row_ok = tl.max(st_mask.to(tl.int32), 1) > 0
        info = merge_info_ptr + tokens.to(tl.int64) * 3
        first = tl.load(info, mask=row_ok, other=0)
        stride = tl.load(info + 2, mask=row_ok, other=0)
        m = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
        total = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, COLS], dtype=tl.float32)
        for i in range(0, count):
            prow = (first + i * stride).to(tl.int64) * num_heads + heads
            # .cg reads from L2: L1 is not coherent with the other SMs' stores.
            s_i = tl.load(plse_ptr + prow, mask=row_ok, other=-float("inf"), cache_modifier=".cg")
            v_i = tl.load(
                po_ptr + prow[:, None] * ROW + offs_c[None, :],
                mask=st_mask,
                other=0.0,
                cache_modifier=".cg",
            )
            m_new = tl.maximum(m, s_i)
            alpha, w = _rescale(m, m_new, s_i)
            acc = acc * alpha[:, None] + w[:, None] * v_i
            total = total * alpha + w
            m = m_new
        has = total > 0
        out = acc / tl.where(has, total, 1.0)[:, None]
        tl.store(
            o_ptr + tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_c[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=st_mask,
        )
        lse = tl.where(has, m + tl.log2(tl.where(has, total, 1.0)), -float("inf"))
        tl.store(lse_ptr + tok * num_heads + heads, lse, mask=row_ok)
        tl.store(counter_ptr + tile_id, 0)  # ready for the next launch


@triton.jit
def _merge_states_kernel(
    v_ptr,  # [seq, n, H, D]
    s_ptr,  # [seq, n, H] fp32
    vo_ptr,  # [seq, H, D]
    so_ptr,  # [seq, H] fp32
    num_states,
    stride_vt,
    stride_vn,
    stride_vh,
    stride_st,
    stride_sn,
    stride_ot,
    stride_oh,
    stride_sot,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    m = -float("inf")
    total = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    # Fixed order 0..n-1: the result is deterministic.
    for i in range(num_states):
        s_i = tl.load(s_ptr + t * stride_st + i * stride_sn + h).to(tl.float32)
        v_i = tl.load(v_ptr + t * stride_vt + i * stride_vn + h * stride_vh + d, mask=dmask)
        m_new = tl.maximum(m, s_i)
        alpha, w = _rescale(m, m_new, s_i)
        acc = acc * alpha + w * v_i.to(tl.float32)
        total = total * alpha + w
        m = m_new
    out = tl.where(total > 0, acc / total, 0.0)
    lse = tl.where(total > 0, m + tl.log2(total), -float("inf"))
    tl.store(
        vo_ptr + t * stride_ot + h * stride_oh + d, out.to(vo_ptr.dtype.element_ty), mask=dmask
    )
    tl.store(so_ptr + t * stride_sot + h, lse)


@triton.jit
def _merge_two_kernel(
    va_ptr,  # [seq, H, D]
    sa_ptr,  # [seq, H] fp32
    vb_ptr,  # [seq, H, D]
    sb_ptr,  # [seq, H] fp32
    vo_ptr,  # [seq, H, D] (may alias va)
    so_ptr,  # [seq, H] fp32 (may alias sa)
    mask_ptr,  # [seq] bool (read only when HAS_MASK)
    stride_vat,
    stride_vah,
    stride_sat,
    stride_vbt,
    stride_vbh,
    stride_sbt,
    stride_vot,
    stride_voh,
    stride_sot,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_MASK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    if HAS_MASK:
        if tl.load(mask_ptr + t) == 0:
            return
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    s_a = tl.load(sa_ptr + t * stride_sat + h).to(tl.float32)
    s_b = tl.load(sb_ptr + t * stride_sbt + h).to(tl.float32)
    v_a = tl.load(va_ptr + t * stride_vat + h * stride_vah + d, mask=dmask).to(tl.float32)
    v_b = tl.load(vb_ptr + t * stride_vbt + h * stride_vbh + d, mask=dmask).to(tl.float32)
    m = tl.maximum(s_a, s_b)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    w_a = tl.exp2(s_a - m_safe)
    w_b = tl.exp2(s_b - m_safe)
    total = w_a + w_b
    out = tl.where(total > 0, (w_a * v_a + w_b * v_b) / total, 0.0)
    lse = tl.where(total > 0, m_safe + tl.log2(total), -float("inf"))
    tl.store(
        vo_ptr + t * stride_vot + h * stride_voh + d, out.to(vo_ptr.dtype.element_ty), mask=dmask
    )
    tl.store(so_ptr + t * stride_sot + h, lse)


@triton.jit
def _merge_partials_kernel(
    po_ptr,  # [P, H, D] fp32 partial outputs (workspace)
    plse_ptr,  # [P, H] fp32 partial LSEs (workspace)
    info_ptr,  # [T, 3] int32: (first partial row, count, row stride); count 0: nothing to do
    o_ptr,  # [T, H, D]
    lse_ptr,  # [T, H] fp32
    num_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    # Axis 2 splits head_dim: with few rows (batch 1) more CTAs load the partials at once.
    d0 = tl.program_id(2) * BLOCK_D
    first = tl.load(info_ptr + t * 3)
    count = tl.load(info_ptr + t * 3 + 1)
    stride = tl.load(info_ptr + t * 3 + 2)
    # count == 0: the attention kernel wrote this row's final result itself. The grid stays
    # sized for the largest batch so that a captured CUDA graph survives re-planning.
    if count > 0:
        d = d0 + tl.arange(0, BLOCK_D)
        dmask = d < HEAD_DIM
        m = -float("inf")
        total = 0.0
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        # BLOCK_S partials per step, loaded together: a loop of dependent single-row steps
        # would pay one memory latency per partial (64 partials: ~20 us at batch 1).
        for i0 in range(0, count, BLOCK_S):
            si = i0 + tl.arange(0, BLOCK_S)
            s_ok = si < count
            row = (first + si * stride).to(tl.int64) * num_heads + h
            s_i = tl.load(plse_ptr + row, mask=s_ok, other=-float("inf"))
            v_i = tl.load(
                po_ptr + row[:, None] * HEAD_DIM + d[None, :],
                mask=s_ok[:, None] & dmask[None, :],
                other=0.0,
            )
            m_new = tl.maximum(m, tl.max(s_i, 0))
            alpha, w = _rescale(m, m_new, s_i)
            acc = acc * alpha + tl.sum(w[:, None] * v_i, 0)
            total = total * alpha + tl.sum(w, 0)
            m = m_new
        out = tl.where(total > 0, acc / total, 0.0)
        lse = tl.where(total > 0, m + tl.log2(total), -float("inf"))
        t64 = t.to(tl.int64)
        tl.store(
            o_ptr + t64 * stride_ot + h * stride_oh + d,
            out.to(o_ptr.dtype.element_ty),
            mask=dmask,
        )
        if d0 == 0:
            tl.store(lse_ptr + t64 * num_heads + h, lse)


# --------------------------------------------------------------------------- validation


def _check_state(name_v: str, v: torch.Tensor, name_s: str, s: torch.Tensor, ndim: int) -> None:
    if not isinstance(v, torch.Tensor) or not isinstance(s, torch.Tensor):
        raise TypeError(f"{name_v} and {name_s} must be tensors")
    if v.dim() != ndim:
        raise ValueError(f"{name_v} must be {ndim}-D, got shape {tuple(v.shape)}")
    if tuple(s.shape) != tuple(v.shape[:-1]):
        raise ValueError(
            f"{name_s} must have shape {tuple(v.shape[:-1])} (= {name_v}.shape[:-1]), "
            f"got {tuple(s.shape)}"
        )
    if s.dtype != torch.float32:
        raise TypeError(f"{name_s} must be float32, got {s.dtype}")
    if v.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"{name_v} must be float16, bfloat16 or float32, got {v.dtype}")
    if v.device != s.device:
        raise ValueError(f"{name_v} is on {v.device} but {name_s} is on {s.device}")
    if v.shape[-1] and v.stride(-1) != 1:
        raise ValueError(f"{name_v} must be contiguous in its last dimension")
    if s.dim() and s.shape[-1] > 1 and s.stride(-1) != 1:
        raise ValueError(f"{name_s} must be contiguous in its last dimension")


def _same(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_b} shape {tuple(b.shape)} != {name_a} shape {tuple(a.shape)}")
    if a.device != b.device:
        raise ValueError(f"{name_b} is on {b.device} but {name_a} is on {a.device}")


def _use_kernel(t: torch.Tensor) -> bool:
    from flashtune import env

    return platform.kernels_available(t.device) and not env.FORCE_REFERENCE.get()


# --------------------------------------------------------------------------- public API


def merge_state(
    v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attention states (FlashInfer `flashinfer.merge_state`).

    v_a, v_b: [seq, num_heads, head_dim]; s_a, s_b: [seq, num_heads] float32, base-2 LSE.
    Returns (v [seq, num_heads, head_dim] in v_a's dtype, s [seq, num_heads] float32).
    """
    _check_state("v_a", v_a, "s_a", s_a, 3)
    _check_state("v_b", v_b, "s_b", s_b, 3)
    _same("v_a", v_a, "v_b", v_b)
    if not _use_kernel(v_a):
        return merge_state_ref(v_a, s_a, v_b, s_b)
    v_out = torch.empty_like(v_a, memory_format=torch.contiguous_format)
    s_out = torch.empty(s_a.shape, dtype=torch.float32, device=s_a.device)
    _launch_merge_two(v_a, s_a, v_b, s_b, v_out, s_out, None)
    return v_out, s_out


def merge_state_in_place(
    v: torch.Tensor,
    s: torch.Tensor,
    v_other: torch.Tensor,
    s_other: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> None:
    """Merge (v_other, s_other) into (v, s) in place (FlashInfer `merge_state_in_place`).

    v, v_other: [seq, num_heads, head_dim]; s, s_other: [seq, num_heads] float32.
    mask: optional [seq] bool; rows where it is False are left unchanged.
    """
    _check_state("v", v, "s", s, 3)
    _check_state("v_other", v_other, "s_other", s_other, 3)
    _same("v", v, "v_other", v_other)
    if mask is not None:
        if mask.shape != (v.shape[0],) or mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be a bool tensor of shape ({v.shape[0]},), got {mask.dtype} "
                f"{tuple(mask.shape)}"
            )
        if mask.device != v.device:
            raise ValueError(f"mask is on {mask.device} but v is on {v.device}")
    if not _use_kernel(v):
        v_new, s_new = merge_state_ref(v, s, v_other, s_other)
        if mask is not None:
            v_new = torch.where(mask[:, None, None], v_new, v)
            s_new = torch.where(mask[:, None], s_new, s)
        v.copy_(v_new)
        s.copy_(s_new)
        return
    _launch_merge_two(v, s, v_other, s_other, v, s, mask)


def merge_states(v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge n attention states per row (FlashInfer `merge_states`).

    v: [seq, num_states, num_heads, head_dim]; s: [seq, num_states, num_heads] float32.
    Returns (v [seq, num_heads, head_dim] in v's dtype, s [seq, num_heads] float32).
    """
    _check_state("v", v, "s", s, 4)
    if not _use_kernel(v):
        return merge_states_ref(v, s)
    seq, n, h, d = v.shape
    v_out = torch.empty((seq, h, d), dtype=v.dtype, device=v.device)
    s_out = torch.empty((seq, h), dtype=torch.float32, device=v.device)
    if seq == 0 or h == 0:
        return v_out, s_out
    _merge_states_kernel[(seq, h)](
        v,
        s,
        v_out,
        s_out,
        n,
        v.stride(0),
        v.stride(1),
        v.stride(2),
        s.stride(0),
        s.stride(1),
        v_out.stride(0),
        v_out.stride(1),
        s_out.stride(0),
        HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(max(d, 1)),
    )
    return v_out, s_out


def merge_partials(
    partial_o: torch.Tensor,
    partial_lse: torch.Tensor,
    merge_info: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    sm_count: int | None = None,
    tiles: tuple[int, int, int] | None = None,
) -> None:
    """Combine split-KV partial results into `out`/`lse` rows (internal, used by plan/run).

    partial_o: [P, H, D] fp32; partial_lse: [P, H] fp32; merge_info: [T, 3] int32 giving,
    for output row t, (first partial row, count, row stride); count 0 leaves row t as is.
    out: [T, H, D] (last dim contiguous); lse: [T, H] fp32 contiguous.
    sm_count: the SMs to fill (None: the device's, `platform.device_limits`).

    tiles: (BLOCK_S, BLOCK_D, num_warps), None: `merge_tiles` (benchmarks/bench_merge.py
    times others).
    """
    t, h, d = out.shape
    if t == 0 or h == 0:
        return
    if tiles is None:
        if sm_count is None:
            sm_count = platform.device_limits(out.device).sm_count
        tiles = merge_tiles(t, h, d, sm_count)
    block_s, block_d, num_warps = tiles
    _merge_partials_kernel[(t, h, triton.cdiv(d, block_d))](
        partial_o,
        partial_lse,
        merge_info,
        out,
        lse,
        h,
        out.stride(0),
        out.stride(1),
        HEAD_DIM=d,
        BLOCK_D=block_d,
        BLOCK_S=block_s,
        num_warps=num_warps,
    )


def merge_tiles(t: int, h: int, d: int, sm_count: int) -> tuple[int, int, int]:
    """(BLOCK_S, BLOCK_D, num_warps) of `merge_partials` for t rows of h heads of head_dim d.

    One program merges one (row, head) pair, or a slice of its head_dim:
    - At least as many pairs as SMs (decode at batch >= 8 or so, split into a few chunks):
      the whole head_dim, 4 partials a step, 2 warps. Small programs, one memory chain each.
    - Fewer pairs than SMs (batch 1-4, split finely: tens of partials a row): 32-wide
      slices of head_dim so that more programs load at once, 32 partials a step, 4 warps.
    Measured on an H200 (200 back-to-back calls in a CUDA graph, partials warm in L2 as
    the attention kernel leaves them; benchmarks/bench_merge.py, 2026-12-01), against the
    former rule (32 partials a step everywhere, 4 warps): MLA decode, 16 heads x 512, 2 partials a
    row: t 64 6.5 -> 2.6 us, t 128 11.4 -> 3.3, t 256 20.9 -> 5.0; 128 heads, t 64:
    39.9 -> 9.9; GQA decode, 32 heads x 128: t 32 x 4 partials 5.2 -> 2.7, t 256 27.9 ->
    9.1. The tiles follow the batch only across these two choices: a new batch compiles at
    most one more variant."""
    full = triton.next_power_of_2(d)
    if t * h < sm_count:
        return 32, min(full, 32), 4
    return 4, full, 2


def _launch_merge_two(v_a, s_a, v_b, s_b, v_out, s_out, mask) -> None:
    seq, h, d = v_a.shape
    if seq == 0 or h == 0:
        return
    _merge_two_kernel[(seq, h)](
        v_a,
        s_a,
        v_b,
        s_b,
        v_out,
        s_out,
        mask if mask is not None else s_a,
        v_a.stride(0),
        v_a.stride(1),
        s_a.stride(0),
        v_b.stride(0),
        v_b.stride(1),
        s_b.stride(0),
        v_out.stride(0),
        v_out.stride(1),
        s_out.stride(0),
        HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(max(d, 1)),
        HAS_MASK=mask is not None,
    )

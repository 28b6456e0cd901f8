"""The fused-MoE decode path without the alignment: two launches (direct_kernels.py says how).

`MoETactic.direct` picks it (the tuner's decode candidates; `DIRECT_MAX_ROUTES` bounds the
routes a call may have). experts.fused_experts_triton resolves the quantization's scales
and calls `launch_direct`.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton

from flashtune import platform
from flashtune.ops.gemm.launch import split_k_counters
from flashtune.ops.moe import grid
from flashtune.ops.moe.config import DIRECT_MAX_ROUTES, MoETactic
from flashtune.ops.moe.direct_kernels import (
    BY_TOKEN_MAX_TOP_K,
    _moe_direct_fused_kernel,
    _moe_direct_gemm1_kernel,
    _moe_direct_gemm2_by_token_kernel,
    _moe_direct_gemm2_kernel,
)
from flashtune.ops.pdl import launch_options
from flashtune.tune import DEFAULT_TACTIC, Tactic

__all__ = ["launch_direct", "within_direct_limit"]

# K parts: as many as fill _FILL_PER_SM programs an SM, each of _MIN_PART_STEPS K steps at
# least (kernels._split_of). Not the whole resident grid, as the general path fills: that
# made short parts whose fixups cost more than the idle slots (H200, Qwen3-30B fp8 at T=1,
# 96 GEMM1 tiles: 8.6 us in parts of 4 steps, 6.6 unsplit), while one route's tiles on an
# EP rank (32 of GEMM1 for DeepSeek-V3) still need the parts.
_FILL_PER_SM = 1
_MIN_PART_STEPS = 1


# Programs an SM of the one-launch form (direct=3), where two are sure to be resident: 2 took
# it from 25.4 to 20.5 us at Qwen3-30B fp8 T=1 (H200, session 27). Every program must be
# resident, or GEMM2's waits would keep a GEMM1 item off the GPU: _resident_per_sm bounds it
# by the registers a program could take (255 a thread) and persistent_programs by its shared
# memory.
_FUSED_PROGRAMS_PER_SM = 2
_REGISTERS_PER_SM = 65536  # every NVIDIA GPU since sm_50
_MAX_REGISTERS_PER_THREAD = 255


def _resident_per_sm(num_warps: int) -> int:
    """Programs of `num_warps` warps an SM holds at once whatever their register count."""
    worst = num_warps * 32 * _MAX_REGISTERS_PER_THREAD
    return max(1, min(_FUSED_PROGRAMS_PER_SM, _REGISTERS_PER_SM // worst))


def _work_bound(tiles: int, tactic: MoETactic, fill: int) -> int:
    """The most work items a launch of at most `tiles` tiles can have on the device."""
    return min(tiles * tactic.max_split, max(tiles, fill))


def _workspaces(
    device: torch.device, tactic: MoETactic, tiles1: int, tiles2: int, fill1: int, fill2: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two GEMMs' fp32 K-part partials, one slot a work item: a split launch has at most
    min(tiles x max_split, fill) of them (GEMM1's two vectors a slot: up and gate); GEMM2
    also stashes the unsplit parts of tokens with several local routes (one a tile)."""
    g1, g2, split = tactic.gemm1, tactic.gemm2, tactic.max_split
    ws1 = torch.empty(
        min(tiles1 * split, fill1) * 2 * g1.block_n, dtype=torch.float32, device=device
    )
    ws2 = torch.empty(
        max(tiles2, min(tiles2 * split, fill2)) * g2.block_n, dtype=torch.float32, device=device
    )
    return ws1, ws2


def within_direct_limit(tactic: Tactic, routes: int) -> Tactic:
    """The tuner's pick as it can run: a direct-path pick profiled at its bucket's T (a
    power of two at most the call's T) takes the general path past DIRECT_MAX_ROUTES, with
    the same tiles."""
    if tactic == DEFAULT_TACTIC or routes <= DIRECT_MAX_ROUTES:
        return tactic
    t = MoETactic.from_tactic(tactic)
    return replace(t, direct=0).as_tactic() if t.direct else tactic


def launch_direct(
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm2_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    out: torch.Tensor,
    tactic: MoETactic,
    *,
    qcode: int,
    local_expert_offset: int,
    a_scale: torch.Tensor,
    a_scale_strides: tuple[int, int],
    has_a_scale: bool,
    w1_scale: torch.Tensor,
    w1_scale_strides: tuple[int, int, int],
    w2_scale: torch.Tensor,
    w2_scale_strides: tuple[int, int, int],
    up_scale: torch.Tensor,
    gate_scale: torch.Tensor,
    out_scale: torch.Tensor,
    c_dtype: torch.dtype,
    pdl: bool,
) -> torch.Tensor:
    """GEMM1 + SwiGLU and GEMM2 + combine straight from topk_ids into `out` [T, H]."""
    T, H = hidden_states.shape
    E, two_i, _ = gemm1_weights.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    routes = T * top_k
    if routes > DIRECT_MAX_ROUTES:
        raise ValueError(
            f"the direct decode path takes at most {DIRECT_MAX_ROUTES} routes, got {routes}"
        )
    device = hidden_states.device
    dot_f32 = device.type == "cpu"  # the interpreter's tl.dot is wrong on bf16 operands
    g1, g2 = tactic.gemm1, tactic.gemm2
    a_size, w_size = hidden_states.element_size(), gemm1_weights.element_size()
    c = torch.empty(routes, inter, dtype=c_dtype, device=device)
    tiles1 = routes * -(-inter // g1.block_n)
    # GEMM2's work items: (token, N tile) by output tile, else (route, N tile).
    by_token = tactic.direct == 2 and top_k <= BY_TOKEN_MAX_TOP_K
    tiles2 = (T if by_token else routes) * -(-H // g2.block_n)
    smem1 = (16 * a_size + 2 * g1.block_n * w_size) * g1.block_k * g1.num_stages
    smem2 = (16 * 2 + g2.block_n * w_size) * g2.block_k * g2.num_stages
    r_pad = max(16, triton.next_power_of_2(routes))
    if tactic.direct == 3:
        _launch_fused(
            hidden_states, gemm1_weights, gemm2_weights, topk_ids, topk_weights, out, c,
            tactic, qcode=qcode, local_expert_offset=local_expert_offset, a_scale=a_scale,
            a_scale_strides=a_scale_strides, has_a_scale=has_a_scale, w1_scale=w1_scale,
            w1_scale_strides=w1_scale_strides, w2_scale=w2_scale,
            w2_scale_strides=w2_scale_strides, up_scale=up_scale, gate_scale=gate_scale,
            out_scale=out_scale, pdl=pdl, r_pad=r_pad, smem=max(smem1, smem2), tiles1=tiles1,
            tiles2=tiles2,
        )  # fmt: skip
        return out
    if device.type == "cpu":
        # The interpreter's few programs stand in for the SMs (fill), so that its tests split.
        grid1 = grid.persistent_programs(device, tiles1 * tactic.max_split, smem1)
        grid2 = grid.persistent_programs(device, tiles2 * tactic.max_split, smem2)
        fill, fill2 = grid1, grid2
    else:
        # K parts fill `fill` programs: a launch has at most max(tiles, fill) work items
        # (kernels._split_of splits only tiles fewer than the fill), so no more programs.
        # Programs beyond the work were not free: H200, Qwen3-30B fp8 at T=1, GEMM1 (96
        # tiles) 9.2 -> 8.0 us and GEMM2 (256) 11.7 -> 9.7 without the idle ones (CUDA
        # graph of the call: 23.3 -> 19.2 us).
        fill = fill2 = _FILL_PER_SM * platform.device_limits(device).sm_count
        grid1 = grid.persistent_programs(device, _work_bound(tiles1, tactic, fill), smem1)
        grid2 = grid.persistent_programs(device, _work_bound(tiles2, tactic, fill), smem2)
    ws1, ws2 = _workspaces(device, tactic, tiles1, tiles2, fill, fill2)
    locks = split_k_counters(device, max(tiles1, T * -(-H // g2.block_n)))

    _moe_direct_gemm1_kernel[(grid1,)](
        hidden_states,
        gemm1_weights,
        c,
        topk_ids,
        a_scale,
        w1_scale,
        up_scale,
        gate_scale,
        ws1,
        locks,
        topk_weights,
        out_scale,
        routes,
        E,
        local_expert_offset,
        H,
        inter,
        fill,
        top_k,
        *topk_ids.stride(),
        *hidden_states.stride(),
        *gemm1_weights.stride(),
        *c.stride(),
        *a_scale_strides,
        *w1_scale_strides,
        *topk_weights.stride(),
        QUANT=qcode,
        HAS_A_SCALE=has_a_scale,
        DOT_F32=dot_f32,
        EVEN_K=H % g1.block_k == 0,
        R_PAD=r_pad,
        BLOCK_N=g1.block_n,
        BLOCK_K=g1.block_k,
        MAX_SPLIT=tactic.max_split,
        PARTS_PAD=triton.next_power_of_2(tactic.max_split),  # a tile's K parts
        MIN_STEPS=_MIN_PART_STEPS,
        USE_PDL=pdl,
        SCALE_C=by_token,  # GEMM2 by output tile scales no route itself
        num_warps=g1.num_warps,
        num_stages=g1.num_stages,
        **launch_options(pdl),
    )
    if by_token:
        _moe_direct_gemm2_by_token_kernel[(grid2,)](
            c,
            gemm2_weights,
            out,
            topk_ids,
            w2_scale,
            ws2,
            locks,
            routes,
            E,
            local_expert_offset,
            T,
            H,
            inter,
            fill2,
            top_k,
            *topk_ids.stride(),
            *c.stride(),
            *gemm2_weights.stride(),
            *out.stride(),
            *w2_scale_strides,
            QUANT=qcode,
            DOT_F32=dot_f32,
            EVEN_K=inter % g2.block_k == 0,
            R_PAD=r_pad,
            KP=triton.next_power_of_2(top_k),
            BLOCK_N=g2.block_n,
            BLOCK_K=g2.block_k,
            MAX_SPLIT=tactic.max_split,
            PARTS_PAD=triton.next_power_of_2(tactic.max_split),  # a tile's parts
            USE_PDL=pdl,
            num_warps=g2.num_warps,
            num_stages=g2.num_stages,
            **launch_options(pdl),
        )
        return out
    _moe_direct_gemm2_kernel[(grid2,)](
        c,
        gemm2_weights,
        out,
        topk_ids,
        topk_weights,
        w2_scale,
        out_scale,
        ws2,
        locks,
        routes,
        E,
        local_expert_offset,
        T,
        H,
        inter,
        fill2,
        top_k,
        *topk_ids.stride(),
        *topk_weights.stride(),
        *c.stride(),
        *gemm2_weights.stride(),
        *out.stride(),
        *w2_scale_strides,
        QUANT=qcode,
        DOT_F32=dot_f32,
        EVEN_K=inter % g2.block_k == 0,
        R_PAD=r_pad,
        BLOCK_N=g2.block_n,
        BLOCK_K=g2.block_k,
        MAX_SPLIT=tactic.max_split,
        PARTS_PAD=triton.next_power_of_2(top_k * tactic.max_split),  # a token's routes x K parts
        MIN_STEPS=_MIN_PART_STEPS,
        USE_PDL=pdl,
        num_warps=g2.num_warps,
        num_stages=g2.num_stages,
        **launch_options(pdl),
    )
    return out


def _launch_fused(
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm2_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    out: torch.Tensor,
    c: torch.Tensor,
    tactic: MoETactic,
    *,
    qcode: int,
    local_expert_offset: int,
    a_scale: torch.Tensor,
    a_scale_strides: tuple[int, int],
    has_a_scale: bool,
    w1_scale: torch.Tensor,
    w1_scale_strides: tuple[int, int, int],
    w2_scale: torch.Tensor,
    w2_scale_strides: tuple[int, int, int],
    up_scale: torch.Tensor,
    gate_scale: torch.Tensor,
    out_scale: torch.Tensor,
    pdl: bool,
    r_pad: int,
    smem: int,
    tiles1: int,
    tiles2: int,
) -> None:
    """Both GEMMs in one launch (direct_kernels._moe_direct_fused_kernel, tactic direct=3).
    Its GEMM2 items wait on GEMM1's: every program must be resident at once, so the grid is
    at most what the SMs surely hold (_resident_per_sm; the interpreter, which runs programs
    one after another, gets one program; its fill stays the test's program count, so that
    tiles still split)."""
    device = hidden_states.device
    T, H = hidden_states.shape
    E, two_i, _ = gemm1_weights.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    routes = T * top_k
    g1, g2 = tactic.gemm1, tactic.gemm2
    if device.type == "cpu":
        fill = grid.persistent_programs(device, max(tiles1, tiles2) * tactic.max_split, smem)
        programs = 1
    else:
        sms = platform.device_limits(device).sm_count
        fill = _FILL_PER_SM * sms
        work = max(_work_bound(tiles1, tactic, fill), _work_bound(tiles2, tactic, fill))
        per_sm = _resident_per_sm(max(g1.num_warps, g2.num_warps))
        programs = min(grid.persistent_programs(device, work, smem), per_sm * sms)
    ws1, ws2 = _workspaces(device, tactic, tiles1, tiles2, fill, fill)
    # GEMM1's arrival counters, GEMM2's, then the routes' ready and read counters: the two
    # phases run at once, so none may share.
    out_tiles = T * -(-H // g2.block_n)
    counters = split_k_counters(device, tiles1 + out_tiles + 2 * DIRECT_MAX_ROUTES)
    lock1 = counters[:tiles1]
    lock2 = counters[tiles1 : tiles1 + out_tiles]
    ready = counters[tiles1 + out_tiles : tiles1 + out_tiles + 2 * DIRECT_MAX_ROUTES]
    _moe_direct_fused_kernel[(programs,)](
        hidden_states,
        gemm1_weights,
        c,
        topk_ids,
        a_scale,
        w1_scale,
        up_scale,
        gate_scale,
        ws1,
        lock1,
        gemm2_weights,
        out,
        topk_weights,
        w2_scale,
        out_scale,
        ws2,
        lock2,
        ready,
        routes,
        E,
        local_expert_offset,
        T,
        H,
        inter,
        fill,
        top_k,
        *topk_ids.stride(),
        *hidden_states.stride(),
        *gemm1_weights.stride(),
        *c.stride(),
        *a_scale_strides,
        *w1_scale_strides,
        *topk_weights.stride(),
        *gemm2_weights.stride(),
        *out.stride(),
        *w2_scale_strides,
        QUANT=qcode,
        HAS_A_SCALE=has_a_scale,
        DOT_F32=device.type == "cpu",
        EVEN_K1=H % g1.block_k == 0,
        EVEN_K2=inter % g2.block_k == 0,
        R_PAD=r_pad,
        BLOCK_N1=g1.block_n,
        BLOCK_K1=g1.block_k,
        BLOCK_N2=g2.block_n,
        BLOCK_K2=g2.block_k,
        MAX_SPLIT=tactic.max_split,
        PARTS_PAD1=triton.next_power_of_2(tactic.max_split),
        PARTS_PAD2=triton.next_power_of_2(top_k * tactic.max_split),
        MIN_STEPS=_MIN_PART_STEPS,
        MAX_ROUTES=DIRECT_MAX_ROUTES,
        USE_PDL=pdl,
        num_warps=max(g1.num_warps, g2.num_warps),
        num_stages=max(g1.num_stages, g2.num_stages),
        **launch_options(pdl),
    )

"""Triton kernels of the fused-MoE expert computation; experts.py launches them.

Four launches over the alignment of align.py (routes sorted by local expert, padded to
BLOCK_M-row blocks of one expert each):

0. `_moe_align_kernel` (up to align.ONE_PROGRAM_MAX_ROUTES routes): the alignment itself,
   one program; beyond, `_moe_align_count_kernel` (each program counts a chunk of routes
   per expert) then `_moe_align_scatter_kernel` (each program places its chunk's routes
   after the earlier chunks' and fills a share of the padding rows and block owners).
1. `_moe_gemm1_swiglu_kernel`: per (M-block, N tile), the block's token rows (gathered
   from hidden_states through sorted_ids) times the expert's W13 up rows [n] and gate rows
   [I + n], two accumulators in one program so SwiGLU (silu(gate) * up) runs in the
   epilogue; writes the intermediate C [P, I] in sorted-row order (16-bit).
2. `_moe_gemm2_kernel`: C's rows of the block times the expert's W2 [H, I]; writes fp32
   rows [P, H], still in sorted order (dense: only routed rows are written).
3. `_moe_combine_kernel`: per token, the weighted sum of its K rows (16-bit: GEMM2 writes them
   in bf16, half the bytes of fp32 through GEMM2's stores and the combine's loads) (found through
   route_pos, -1 for non-local routes) in a fixed order: deterministic, unlike an atomic
   scatter-add from GEMM2, and it writes every output row, so `out` needs no memset.

The GEMM programs are persistent: a grid sized to the SMs strides over the tiles of the
M-blocks that hold routes (their count is read on the device), so neither a host sync nor
programs that find no rows are needed, and the launch can be captured in a CUDA graph.
With MAX_SPLIT > 1 (decode) a tile's K steps are cut into parts when the tiles in use leave
programs idle (an expert-parallel rank's decode step touches one or two experts, whose
tiles would keep a fifth of the SMs streaming weights): each part writes its fp32 partial
to a workspace slot and the last to arrive at the tile's counter sums them in part order
(deterministic) and runs the epilogue, the GEMM family's split-K fixup.

Orientation (SWAP_AB, per GEMM): swapped, a GEMM forms W @ A^T, so the weight tile takes
the MMA's M side: for 16-row decode blocks, and for GEMM2 with fp8 weights at any size,
where the upcast (block-scaled) W2 tile is then the MMA's register operand.

Quantization (QUANT): 0 none (bf16/fp16 operands); 1 fp8 block scales: every K step is one
128-wide scale block (BLOCK_K divides 128), so GEMM1's fp32 partial product of a step is
scaled by a_scale[token, kb] x w_scale[e, n // 128, kb] before it is accumulated (one
weight scale a tile of up to 128 columns: _mma_row_scaled); 2 fp8 per-tensor: fp8 x fp8
products, per-expert scales applied in the epilogues. The intermediate C is stored in 16
bits, not re-quantized to fp8 (bf16; fp16 for fp16 inputs, and with fp8 weights where
FLASHTUNE_MOE_FP8_C_FP16 asks, saturated at 65504: _saturate_c):
FlashInfer's references keep C in fp32, and re-quantizing C to fp8 (1x128 group scales)
costs 2.3e-2 of the output's norm (CPU emulation, H=2048, I=768), above the evaluator's
1e-2 bound for a bf16 output; bf16 C costs 1.7e-3, fp16 less. GEMM2 then multiplies C by
the fp8 W2 tile upcast to C's type in registers (weight streaming is the same; the MMA
runs at 16-bit rate), its 128x128 block scale folded into the upcast tile (_dequant_w2)
so the K steps chain on one accumulator.

DOT_F32 (the Triton interpreter only): tl.dot on bf16 operands is wrong there, so the
operands are upcast to fp32 first; every other step is the same code.

Out-of-range rows and columns are clamped (padding rows read token 0, tail columns wrap)
instead of masked on load: loads stay in bounds and unmasked, the stores are masked.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashtune.ops.gemm.kernels import tile_coords

# The kernels are the package's own: experts.py launches them.
__all__: list[str] = []


@triton.jit
def _pdl_start(USE_PDL: tl.constexpr):
    """With programmatic dependent launch (ops/pdl.py): wait for the previous kernel's writes
    (every load here may read them)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def _pdl_end(USE_PDL: tl.constexpr):
    """This program's work is done: the next kernel of the chain (align, GEMM1, GEMM2,
    combine) may launch once every program got here (its programs wait for this kernel's
    writes). Earlier, at the start, the next kernel's waiting programs took SM slots from
    the running ones (H200: Qwen3-30B fp8 at T=16, 149 -> 167 us)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _saturate_c(c, c_ptr):
    """C at the edge of an fp16 store: +-65504 instead of inf past fp16's range (bf16's reaches
    3e38), so a rare huge activation costs precision in one element rather than an inf, and
    the NaN of inf x 0 in GEMM2, in a whole output row. A NaN stays a NaN."""
    if c_ptr.dtype.element_ty == tl.float16:
        c = tl.clamp(c, -65504.0, 65504.0, propagate_nan=tl.PropagateNan.ALL)
    return c


@triton.jit
def _zeros_acc(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """An fp32 accumulator in the program's orientation: [N, M] when swapped."""
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return acc


@triton.jit
def _mma(acc, a, w, SWAP_AB: tl.constexpr):
    """acc + a [M, K] @ w [N, K]^T. Swapped, the product is formed as w @ a^T ([N, M]): at
    decode M is one 16-row block and N the weight tile, so N takes the MMA's M side (which
    the tensor cores would otherwise pad to 64), as the GEMM family's small-M kernel does."""
    if SWAP_AB:
        acc = tl.dot(w, tl.trans(a), acc)
    else:
        acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.jit
def _mma_scaled(acc, a, w, a_s, w_s, SWAP_AB: tl.constexpr):
    """acc + (a @ w^T) x a_s[m] x w_s[n]: one K step's fp32 partial, scaled per block."""
    if SWAP_AB:
        acc += tl.dot(w, tl.trans(a)) * (w_s[:, None] * a_s[None, :])
    else:
        acc += tl.dot(a, tl.trans(w)) * (a_s[:, None] * w_s[None, :])
    return acc


# GEMM2's fp16 dequantization multiplies the W2 block scales by this power of two, and its
# accumulator by the inverse after the K loop (both exact): scales down to ~1e-6 stay fp16
# normal numbers, and a weight block's largest value may reach ~1000 before w x s x 64
# would pass fp16's 65504 (real blocks' are below 10).
_W2_PRESCALE: tl.constexpr = tl.constexpr(64.0)


@triton.jit
def _dequant_w2(w, s, C_DTYPE: tl.constexpr):
    """The fp8 W2 tile [BLOCK_N, BLOCK_K] times its rows' block scales `s` [BLOCK_N]. For fp16
    C in fp16, times _W2_PRESCALE (e4m3 -> fp16 is one instruction for two values, the
    product another, no branch: GEMM2 3561 -> 3118 us at DeepSeek-V3 EP8 T=4096, H200, the
    same error; a branch to fp32 for small scales cost more than that); else in fp32."""
    if C_DTYPE == tl.float16:
        return w.to(tl.float16) * (s * _W2_PRESCALE).to(tl.float16)[:, None]
    else:
        return w.to(tl.float32) * s[:, None]


@triton.jit
def _mma_row_scaled(acc, a, w, row_s, SWAP_AB: tl.constexpr):
    """acc + (a @ w^T) x row_s[m]: one K step's fp32 partial, scaled per activation row (the
    weight tile's one block scale folded into row_s): one FMA an element, where
    _mma_scaled's outer product of two scale vectors takes a multiply more."""
    if SWAP_AB:
        acc += tl.dot(w, tl.trans(a)) * row_s[None, :]
    else:
        acc += tl.dot(a, tl.trans(w)) * row_s[:, None]
    return acc


@triton.jit
def _split_of(num_tiles, k_steps, fill, MAX_SPLIT: tl.constexpr, MIN_STEPS: tl.constexpr = 1):
    """(split, steps_per_split) of a launch: with MAX_SPLIT > 1, the K steps of each tile are
    cut into as many parts as `fill` programs allow for the tiles in use (read on the device:
    at decode the tiles of the few touched experts leave most of the persistent grid idle),
    each part at least MIN_STEPS steps (and one); with MAX_SPLIT 1, one part. The general
    path fills its whole grid (tl.num_programs); the direct path (direct_kernels.py) only
    the SMs once."""
    if MAX_SPLIT > 1:
        split = tl.minimum(fill // tl.maximum(num_tiles, 1), MAX_SPLIT)
        split = tl.maximum(tl.minimum(split, k_steps // MIN_STEPS), 1)
        steps = tl.cdiv(k_steps, split)
        split = tl.cdiv(k_steps, steps)
    else:
        split = 1
        steps = k_steps
    return split, steps


@triton.jit
def _part_of(work, split, steps, K, BLOCK_K: tl.constexpr):
    """(tile, first K, end K) of a work item: consecutive items are one tile's K parts."""
    tile = work // split
    k_lo = (work - tile * split) * steps * BLOCK_K
    return tile, k_lo, tl.minimum(K, k_lo + steps * BLOCK_K)


@triton.jit
def _acc_offsets(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """Row-major offsets of an accumulator in the program's orientation ([N, M] swapped)."""
    if SWAP_AB:
        offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    else:
        offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return offs


@triton.jit
def _stash(acc, ws_ptr, slot, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """Write one K part's fp32 partial to its workspace slot."""
    offs = _acc_offsets(BLOCK_M, BLOCK_N, SWAP_AB)
    # slot < 2 x programs: the offsets fit int32.
    tl.store(ws_ptr + slot * (BLOCK_M * BLOCK_N) + offs, acc)


@triton.jit
def _arrive(lock_ptr, tile, split):
    """Count this part's arrival at its tile; True for the last of the tile's parts. The
    partials must all be written (barrier) before the counter is released (acq_rel at GPU
    scope, as the GEMM family's split-K fixup)."""
    tl.debug_barrier()
    arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
    return arrived == split - 1


@triton.jit
def _sum_parts(
    ws_ptr,
    first_slot,
    split,
    STEP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SWAP_AB: tl.constexpr,
):
    """The tile's partials (slots first_slot + STEP * part) summed in part order: the same
    sum whichever part arrives last, so the output is deterministic. .cg loads read L2,
    which the other SMs' stores reached."""
    offs = _acc_offsets(BLOCK_M, BLOCK_N, SWAP_AB)
    total = _zeros_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    for s in range(0, split):
        slot = first_slot + STEP * s
        total += tl.load(ws_ptr + slot * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
    return total


@triton.jit
def _unswap(acc, SWAP_AB: tl.constexpr):
    """The accumulator as [M, N]."""
    if SWAP_AB:
        acc = tl.trans(acc)
    return acc


@triton.jit(do_not_specialize=["num_routes"])
def _moe_gemm1_swiglu_kernel(
    a_ptr,  # [T, H] activations (bf16/fp16/fp8)
    w_ptr,  # [E, 2I, H] W13: rows [0, I) up (X1), rows [I, 2I) gate (X2)
    c_ptr,  # [P, I] intermediate, sorted-row order
    sorted_ids_ptr,  # [P] int32 route index t*K + k, num_routes for padding
    block_expert_ptr,  # [P / BLOCK_M] int32 local expert, -1: no rows
    used_blocks_ptr,  # [1] int32 M-blocks holding routes
    a_scale_ptr,  # QUANT 1: [H/128, T] fp32; QUANT 2 with HAS_A_SCALE: [1] fp32; else dummy
    w_scale_ptr,  # QUANT 1: [E, 2I/128, H/128] fp32; else dummy
    up_scale_ptr,  # QUANT 2: [E] fp32 (output1_scales_scalar); else dummy
    gate_scale_ptr,  # QUANT 2: [E] fp32 (output1_scales_gate_scalar); else dummy
    ws_ptr,  # MAX_SPLIT > 1: [programs, 2, tile] fp32 K-part partials; else dummy
    lock_ptr,  # MAX_SPLIT > 1: int32 arrival counters, zero between launches; else dummy
    num_routes,  # T * K
    H,
    INTER,
    TOP_K,
    stride_at,
    stride_ah,
    stride_we,
    stride_wn,
    stride_wk,
    stride_cm,
    stride_cn,
    stride_ask,
    stride_ast,
    stride_wse,
    stride_wsn,
    stride_wsk,
    QUANT: tl.constexpr,
    HAS_A_SCALE: tl.constexpr,
    DOT_F32: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr,
    MAX_SPLIT: tl.constexpr,
    SUB: tl.constexpr,  # row tiles (of BLOCK_M rows) per M-block of the alignment
    USE_PDL: tl.constexpr = False,  # launched with PDL (ops/pdl.py)
):
    _pdl_start(USE_PDL)
    # Persistent: the programs stride over the tiles of the M-blocks that hold routes
    # (used_blocks, from the alignment on the device), so the grid is sized to the SMs, not
    # to the host's bound on the blocks, and no program is launched only to find no rows.
    # With MAX_SPLIT > 1 a work item is one K part of a tile (_split_of).
    num_pid_m = tl.load(used_blocks_ptr) * SUB
    num_pid_n = tl.cdiv(INTER, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    split, steps = _split_of(num_tiles, tl.cdiv(H, BLOCK_K), tl.num_programs(0), MAX_SPLIT)
    for work in range(tl.program_id(0), num_tiles * split, tl.num_programs(0)):
        tile, k_lo, k_hi = _part_of(work, split, steps, H, BLOCK_K)
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        expert = tl.load(block_expert_ptr + pid_m // SUB).to(tl.int64)

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        route = tl.load(sorted_ids_ptr + offs_m)
        row_ok = route < num_routes
        token = tl.where(row_ok, route // TOP_K, 0).to(tl.int64)
        if SUB > 1:
            # A row tile past its expert's last row holds only padding: no K steps for it
            # (its stores are masked; GEMM2 reads its rows of C as zeros).
            k_hi = tl.where(tl.max(row_ok.to(tl.int32), axis=0) > 0, k_hi, k_lo)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_nw = offs_n % INTER  # tail columns wrap: in-bounds loads, masked store
        offs_k = tl.arange(0, BLOCK_K)

        offs_kl = k_lo + offs_k
        a_ptrs = a_ptr + token[:, None] * stride_at + offs_kl[None, :] * stride_ah
        w_base = w_ptr + expert * stride_we
        # Weight tiles [BLOCK_N, BLOCK_K] in their stored orientation (K contiguous).
        up_ptrs = w_base + offs_nw[:, None] * stride_wn + offs_kl[None, :] * stride_wk
        gate_ptrs = w_base + (offs_nw + INTER)[:, None] * stride_wn + offs_kl[None, :] * stride_wk
        if QUANT == 1:
            # Per-column weight scale rows: the up and gate columns of this tile.
            ws_up = w_scale_ptr + expert * stride_wse + (offs_nw // 128) * stride_wsn
            ws_gate = w_scale_ptr + expert * stride_wse + ((offs_nw + INTER) // 128) * stride_wsn
            col0 = pid_n * BLOCK_N
            ws_up_one = w_scale_ptr + expert * stride_wse + (col0 // 128) * stride_wsn
            ws_gate_one = w_scale_ptr + expert * stride_wse + ((col0 + INTER) // 128) * stride_wsn
            as_ptrs = a_scale_ptr + token * stride_ast

        acc_up = _zeros_acc(BLOCK_M, BLOCK_N, SWAP_AB)
        acc_gate = _zeros_acc(BLOCK_M, BLOCK_N, SWAP_AB)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs)
                w_up = tl.load(up_ptrs)
                w_gate = tl.load(gate_ptrs)
            else:
                k_ok = offs_k < H - k0
                a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
                w_up = tl.load(up_ptrs, mask=k_ok[None, :], other=0.0)
                w_gate = tl.load(gate_ptrs, mask=k_ok[None, :], other=0.0)
            if DOT_F32:
                a = a.to(tl.float32)
                w_up = w_up.to(tl.float32)
                w_gate = w_gate.to(tl.float32)
            else:
                # float32 weights (the fp4 Definitions' contract) meet 16-bit activations
                # here; in the other modes both sides share a type and this is no op.
                w_up = w_up.to(a.dtype)
                w_gate = w_gate.to(a.dtype)
            if QUANT == 1:
                kb = k0 // 128
                a_s = tl.load(as_ptrs + kb * stride_ask)  # [BLOCK_M]
                if BLOCK_N <= 128:
                    # I is a multiple of 128: the tile's up (and gate) columns share one
                    # weight scale, folded into the rows' scales (H200, DeepSeek-V3 EP8
                    # T=4096: GEMM1 3715 -> 3229 us, the same error; session 27).
                    s_up = tl.load(ws_up_one + kb * stride_wsk)
                    s_gate = tl.load(ws_gate_one + kb * stride_wsk)
                    acc_up = _mma_row_scaled(acc_up, a, w_up, a_s * s_up, SWAP_AB)
                    acc_gate = _mma_row_scaled(acc_gate, a, w_gate, a_s * s_gate, SWAP_AB)
                else:
                    s_up = tl.load(ws_up + kb * stride_wsk)  # [BLOCK_N]
                    s_gate = tl.load(ws_gate + kb * stride_wsk)
                    acc_up = _mma_scaled(acc_up, a, w_up, a_s, s_up, SWAP_AB)
                    acc_gate = _mma_scaled(acc_gate, a, w_gate, a_s, s_gate, SWAP_AB)
            else:
                acc_up = _mma(acc_up, a, w_up, SWAP_AB)
                acc_gate = _mma(acc_gate, a, w_gate, SWAP_AB)
            a_ptrs += BLOCK_K * stride_ah
            up_ptrs += BLOCK_K * stride_wk
            gate_ptrs += BLOCK_K * stride_wk

        # Split tiles: the last K part to arrive sums the parts and runs the epilogue.
        finish = num_tiles >= 0  # a runtime True
        if MAX_SPLIT > 1:
            if split > 1:
                _stash(acc_up, ws_ptr, 2 * work, BLOCK_M, BLOCK_N, SWAP_AB)
                _stash(acc_gate, ws_ptr, 2 * work + 1, BLOCK_M, BLOCK_N, SWAP_AB)
                finish = _arrive(lock_ptr, tile, split)
                if finish:
                    first = tile * split
                    acc_up = _sum_parts(ws_ptr, 2 * first, split, 2, BLOCK_M, BLOCK_N, SWAP_AB)
                    acc_gate = _sum_parts(
                        ws_ptr, 2 * first + 1, split, 2, BLOCK_M, BLOCK_N, SWAP_AB
                    )
                    tl.store(lock_ptr + tile, 0)  # ready for the next launch

        acc_up = _unswap(acc_up, SWAP_AB)
        acc_gate = _unswap(acc_gate, SWAP_AB)
        if QUANT == 2:
            acc_up = acc_up * tl.load(up_scale_ptr + expert)
            acc_gate = acc_gate * tl.load(gate_scale_ptr + expert)
            if HAS_A_SCALE:
                a_scale = tl.load(a_scale_ptr)
                acc_up = acc_up * a_scale
                acc_gate = acc_gate * a_scale
        # SwiGLU as the Definitions write it: silu on the second half (gate), times the first.
        c = _saturate_c(acc_up * (acc_gate * tl.sigmoid(acc_gate)), c_ptr)
        c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
        c_ok = row_ok[:, None] & (offs_n < INTER)[None, :] & finish
        tl.store(c_ptrs, c.to(c_ptr.dtype.element_ty), mask=c_ok)
    _pdl_end(USE_PDL)


@triton.jit(do_not_specialize=["num_routes"])
def _moe_gemm2_kernel(
    c_ptr,  # [P, I] intermediate (16-bit), sorted-row order
    w_ptr,  # [E, H, I] W2
    o_ptr,  # [P, H] bf16 per-route rows (fp32 under the interpreter), sorted-row order
    sorted_ids_ptr,  # [P] int32
    block_expert_ptr,  # [P / BLOCK_M] int32
    used_blocks_ptr,  # [1] int32 M-blocks holding routes
    w_scale_ptr,  # QUANT 1: [E, H/128, I/128] fp32; else dummy
    out_scale_ptr,  # QUANT 2: [E] fp32 (output2_scales_scalar); else dummy
    ws_ptr,  # MAX_SPLIT > 1: [programs, tile] fp32 K-part partials; else dummy
    lock_ptr,  # MAX_SPLIT > 1: int32 arrival counters, zero between launches; else dummy
    num_routes,
    H,
    INTER,
    stride_cm,
    stride_ck,
    stride_we,
    stride_wn,
    stride_wk,
    stride_om,
    stride_on,
    stride_wse,
    stride_wsn,
    stride_wsk,
    QUANT: tl.constexpr,
    DOT_F32: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr,
    MAX_SPLIT: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # launched with PDL (ops/pdl.py)
):
    _pdl_start(USE_PDL)
    # Persistent, and split over K at decode, as GEMM1.
    num_pid_m = tl.load(used_blocks_ptr)
    num_pid_n = tl.cdiv(H, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    split, steps = _split_of(num_tiles, tl.cdiv(INTER, BLOCK_K), tl.num_programs(0), MAX_SPLIT)
    for work in range(tl.program_id(0), num_tiles * split, tl.num_programs(0)):
        tile, k_lo, k_hi = _part_of(work, split, steps, INTER, BLOCK_K)
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        route = tl.load(sorted_ids_ptr + offs_m)
        row_ok = route < num_routes
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_nw = offs_n % H
        offs_k = tl.arange(0, BLOCK_K)

        # Padding rows of C were never written: mask them to zeros (no NaN from stale memory).
        offs_kl = k_lo + offs_k
        c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_kl[None, :] * stride_ck
        w_ptrs = (
            w_ptr + expert * stride_we + offs_nw[:, None] * stride_wn + offs_kl[None, :] * stride_wk
        )
        if QUANT == 1:
            ws_ptrs = w_scale_ptr + expert * stride_wse + (offs_nw // 128) * stride_wsn

        acc = _zeros_acc(BLOCK_M, BLOCK_N, SWAP_AB)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            if EVEN_K:
                c = tl.load(c_ptrs, mask=row_ok[:, None], other=0.0)
                w = tl.load(w_ptrs)
            else:
                k_ok = offs_k < INTER - k0
                c = tl.load(c_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
            if DOT_F32:
                c = c.to(tl.float32)
            if QUANT == 1:
                # The block scale goes into the upcast weight (the dequantized W2 tile), so
                # the K steps chain on one accumulator.
                w = _dequant_w2(w, tl.load(ws_ptrs + (k0 // 128) * stride_wsk), c.dtype)
            # fp8 W2 upcast (float32 W2 cast) to C's type (16-bit; fp32 under DOT_F32)
            w = w.to(c.dtype)
            acc = _mma(acc, c, w, SWAP_AB)
            c_ptrs += BLOCK_K * stride_ck
            w_ptrs += BLOCK_K * stride_wk
        if QUANT == 1 and not DOT_F32 and c_ptr.dtype.element_ty == tl.float16:
            acc = acc * (1.0 / _W2_PRESCALE)  # _dequant_w2's pre-scale, undone

        finish = num_tiles >= 0  # a runtime True
        if MAX_SPLIT > 1:
            if split > 1:
                _stash(acc, ws_ptr, work, BLOCK_M, BLOCK_N, SWAP_AB)
                finish = _arrive(lock_ptr, tile, split)
                if finish:
                    acc = _sum_parts(ws_ptr, tile * split, split, 1, BLOCK_M, BLOCK_N, SWAP_AB)
                    tl.store(lock_ptr + tile, 0)  # ready for the next launch
        acc = _unswap(acc, SWAP_AB)

        if QUANT == 2:
            acc = acc * tl.load(out_scale_ptr + expert)
        o_ptrs = o_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
        tl.store(
            o_ptrs,
            acc.to(o_ptr.dtype.element_ty),
            mask=row_ok[:, None] & (offs_n < H)[None, :] & finish,
        )
    _pdl_end(USE_PDL)


@triton.jit
def _moe_combine_kernel(
    o_ptr,  # [P, H] bf16 per-route rows (fp32 under the interpreter), sorted-row order
    route_pos_ptr,  # [T * K] int32 row of each route, -1 when not local
    weights_ptr,  # [T, K] routing weights
    out_ptr,  # [T, H] bf16
    H,
    TOP_K,
    stride_om,
    stride_wt,
    stride_wk,
    stride_ot,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # launched with PDL (ops/pdl.py)
):
    _pdl_start(USE_PDL)
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    # A fixed order over k: the same sum for the same inputs, run after run.
    for k in range(0, TOP_K):
        pos = tl.load(route_pos_ptr + t * TOP_K + k)
        if pos >= 0:
            w = tl.load(weights_ptr + t * stride_wt + k * stride_wk).to(tl.float32)
            row = tl.load(o_ptr + pos.to(tl.int64) * stride_om + offs_h, mask=h_ok, other=0.0)
            acc += w * row.to(tl.float32)
    tl.store(
        out_ptr + t.to(tl.int64) * stride_ot + offs_h, acc.to(out_ptr.dtype.element_ty), mask=h_ok
    )
    _pdl_end(USE_PDL)


@triton.jit
def _count_routes(
    topk_ids_ptr, start, stop, num_routes, num_experts, offset, NBINS: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Routes [start, stop) per local expert ([NBINS]; non-local ones counted nowhere)."""
    bins = tl.arange(0, NBINS)
    counts = tl.zeros((NBINS,), dtype=tl.int32)
    for first in range(start, stop, BLOCK):
        offs = first + tl.arange(0, BLOCK)
        in_range = offs < num_routes
        e = tl.load(topk_ids_ptr + offs, mask=in_range, other=0) - offset
        e = tl.where(in_range & (e >= 0) & (e < num_experts), e, -1)
        counts += tl.sum((e[:, None] == bins[None, :]).to(tl.int32), axis=0)
    return counts


@triton.jit
def _padded_layout(counts, BLOCK_M: tl.constexpr):
    """(padded, pad_end, pad_start) per expert: each expert's rows rounded up to M-blocks,
    laid out one expert after another."""
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    return padded, pad_end, pad_end - padded


@triton.jit
def _place_routes(
    topk_ids_ptr, sorted_ids_ptr, route_pos_ptr, start, stop, running, num_routes,
    num_experts, offset, NBINS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Write routes [start, stop) to their rows: expert e's next row is running[e], taken in
    route order (so each expert's rows are in route order, as a stable sort gives); each
    route's row goes to route_pos (-1 for a non-local route)."""
    bins = tl.arange(0, NBINS)
    for first in range(start, stop, BLOCK):
        offs = first + tl.arange(0, BLOCK)
        in_range = offs < num_routes
        e = tl.load(topk_ids_ptr + offs, mask=in_range, other=0) - offset
        local = in_range & (e >= 0) & (e < num_experts)
        e = tl.where(local, e, -1)
        onehot = (e[:, None] == bins[None, :]).to(tl.int32)  # [BLOCK, NBINS]
        earlier = tl.cumsum(onehot, axis=0) - onehot  # same-expert routes earlier in the step
        dest = tl.sum(onehot * (earlier + running[None, :]), axis=1)
        tl.store(sorted_ids_ptr + dest, offs, mask=local)
        tl.store(route_pos_ptr + offs, tl.where(local, dest, -1), mask=in_range)
        running += tl.sum(onehot, axis=0)


@triton.jit(do_not_specialize=["num_routes", "num_experts", "offset", "num_rows", "num_blocks"])
def _moe_align_kernel(
    topk_ids_ptr,  # [T * K] int32 global expert ids
    sorted_ids_ptr,  # [num_rows] int32 out: route index per row, num_routes for padding
    block_expert_ptr,  # [num_blocks] int32 out: local expert per M-block, -1 past the last
    route_pos_ptr,  # [T * K] int32 out: row of each route, -1 when not local
    used_ptr,  # [1] int32 out: M-blocks holding routes
    num_routes,
    num_experts,
    offset,
    num_rows,
    num_blocks,
    BLOCK_M: tl.constexpr,
    NBINS: tl.constexpr,  # power of two >= num_experts
    BLOCK: tl.constexpr,  # routes per step (BLOCK x NBINS one-hot fits registers)
    USE_PDL: tl.constexpr = False,  # launched with PDL (ops/pdl.py)
):
    """align.align_routes in one program (decode and small batches: one launch where the
    PyTorch version takes a dozen). Same output, row for row: routes are visited in
    ascending index, so each expert's rows are in route order, as a stable sort gives."""
    _pdl_start(USE_PDL)
    counts = _count_routes(
        topk_ids_ptr, 0, num_routes, num_routes, num_experts, offset, NBINS, BLOCK
    )
    padded, pad_end, pad_start = _padded_layout(counts, BLOCK_M)
    tl.store(used_ptr, tl.sum(padded, axis=0) // BLOCK_M)

    for start in range(0, num_rows, BLOCK * 4):
        offs = start + tl.arange(0, BLOCK * 4)
        tl.store(sorted_ids_ptr + offs, tl.zeros_like(offs) + num_routes, mask=offs < num_rows)
    for start in range(0, num_blocks, BLOCK):
        b = start + tl.arange(0, BLOCK)
        row = b * BLOCK_M
        # The owner of a block: the first expert whose padded rows end after its first row
        # (bins past the last expert have no rows: past the total, no owner).
        owner = tl.sum((pad_end[None, :] <= row[:, None]).to(tl.int32), axis=1)
        owner = tl.where(owner < num_experts, owner, -1)
        tl.store(block_expert_ptr + b, owner, mask=b < num_blocks)
    # The padding stores above must land before the scatter below overwrites some of them.
    tl.debug_barrier()

    _place_routes(
        topk_ids_ptr, sorted_ids_ptr, route_pos_ptr, 0, num_routes, pad_start, num_routes,
        num_experts, offset, NBINS, BLOCK,
    )  # fmt: skip
    _pdl_end(USE_PDL)


@triton.jit(do_not_specialize=["num_routes", "num_experts", "offset"])
def _moe_align_count_kernel(
    topk_ids_ptr,  # [T * K] int32 global expert ids
    counts_ptr,  # [num_chunks, NBINS] int32 out: each chunk's routes per local expert
    num_routes,
    num_experts,
    offset,
    CHUNK: tl.constexpr,  # routes per program (a multiple of BLOCK)
    NBINS: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # launched with PDL (ops/pdl.py)
):
    """The first of the two launches that align many routes: chunk c's count per expert."""
    _pdl_start(USE_PDL)
    c = tl.program_id(0)
    counts = _count_routes(
        topk_ids_ptr, c * CHUNK, c * CHUNK + CHUNK, num_routes, num_experts, offset, NBINS, BLOCK
    )
    tl.store(counts_ptr + c * NBINS + tl.arange(0, NBINS), counts)
    _pdl_end(USE_PDL)


@triton.jit(do_not_specialize=["num_routes", "num_experts", "offset", "num_blocks", "num_chunks"])
def _moe_align_scatter_kernel(
    topk_ids_ptr,  # [T * K] int32 global expert ids
    counts_ptr,  # [num_chunks, NBINS] int32: _moe_align_count_kernel's counts
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32 out (as _moe_align_kernel's)
    block_expert_ptr,  # [num_blocks] int32 out
    route_pos_ptr,  # [T * K] int32 out
    used_ptr,  # [1] int32 out
    num_routes,
    num_experts,
    offset,
    num_blocks,
    num_chunks,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
    NBINS: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCKS_STEP: tl.constexpr,  # M-blocks per step of the padding fill
    USE_PDL: tl.constexpr = False,  # launched with PDL (ops/pdl.py)
):
    """The second launch: program c places chunk c's routes (after every earlier chunk's
    routes of the same expert, so each expert's rows stay in route order, as the one-program
    kernel and a stable sort give) and writes the sentinel rows and block owners of its
    share of the M-blocks. The routes' rows and the padding rows are disjoint, so the
    programs need no order between them."""
    _pdl_start(USE_PDL)
    c = tl.program_id(0)
    bins = tl.arange(0, NBINS)
    totals = tl.zeros((NBINS,), dtype=tl.int32)
    before = tl.zeros((NBINS,), dtype=tl.int32)
    for j in range(0, num_chunks):
        cj = tl.load(counts_ptr + j * NBINS + bins)
        totals += cj
        before += tl.where(j < c, cj, 0)
    padded, pad_end, pad_start = _padded_layout(totals, BLOCK_M)
    if c == 0:
        tl.store(used_ptr, tl.sum(padded, axis=0) // BLOCK_M)

    _place_routes(
        topk_ids_ptr, sorted_ids_ptr, route_pos_ptr, c * CHUNK, c * CHUNK + CHUNK,
        pad_start + before, num_routes, num_experts, offset, NBINS, BLOCK,
    )  # fmt: skip

    # This program's M-blocks: owner (as in _moe_align_kernel) and the rows past the
    # owner's routes, which hold the sentinel.
    per_program = tl.cdiv(num_blocks, num_chunks)
    cols = tl.arange(0, BLOCK_M)
    for b0 in range(c * per_program, c * per_program + per_program, BLOCKS_STEP):
        b = b0 + tl.arange(0, BLOCKS_STEP)
        b_ok = (b < num_blocks) & (b < c * per_program + per_program)
        row = b * BLOCK_M
        owner = tl.sum((pad_end[None, :] <= row[:, None]).to(tl.int32), axis=1)
        mine = (bins[None, :] == owner[:, None]).to(tl.int32)  # [BLOCKS_STEP, NBINS]
        routes_in = tl.sum(mine * totals[None, :], axis=1) - (
            row - tl.sum(mine * pad_start[None, :], axis=1)
        )
        valid = tl.minimum(tl.maximum(routes_in, 0), BLOCK_M)
        tl.store(block_expert_ptr + b, tl.where(owner < num_experts, owner, -1), mask=b_ok)
        pad = b_ok[:, None] & (cols[None, :] >= valid[:, None])
        rows = row[:, None] + cols[None, :]
        tl.store(sorted_ids_ptr + rows, tl.zeros_like(rows) + num_routes, mask=pad)
    _pdl_end(USE_PDL)

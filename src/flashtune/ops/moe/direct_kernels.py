"""Triton kernels of the fused-MoE decode path without the alignment (direct.py launches them).

At decode a call has a handful of routes (T * K <= DIRECT_MAX_ROUTES): each is its own
expert row, so the alignment launch (align.py) and the combine launch (kernels.py) of the
general path are pure overhead beside streaming the touched experts' weights. Here two
kernels do it all:
- GEMM1 + SwiGLU: each program reads `topk_ids` itself and numbers the local routes in
  route order (a prefix sum over at most DIRECT_MAX_ROUTES ids, in registers); work items
  are (local route, N tile, K part), the row of C is the route's local number.
- GEMM2 + combine: work items (local route, N tile of H, K part); each part scales its
  partial by the route's weight, and the last part of a token's output tile to arrive sums
  every part of that token's routes in route order (deterministic bits) and stores the
  output row. Tokens with no local route get zeros.
The number of local routes is known only on the device (expert parallelism: an EP-8 rank
sees about one of eight), so the K split of the tiles is decided there (kernels._split_of),
as in the general path's decode. One route a work item: the activation tile is 16 rows
(tl.dot's minimum) of which row 0 is the route's token, and the weight tile takes the MMA's
M side (swap-AB); the product's other 15 columns are zeros and summed away.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashtune.ops.moe.kernels import (
    _arrive,
    _mma,
    _mma_scaled,
    _part_of,
    _pdl_end,
    _pdl_start,
    _saturate_c,
    _split_of,
)

# The kernels are the package's own: direct.py launches them.
__all__: list[str] = []

# The activation tile's rows: tl.dot's minimum; row 0 holds the route's token.
_ROWS: tl.constexpr = tl.constexpr(16)


@triton.jit
def _local_routes(ids_ptr, num_routes, num_experts, offset, stride_it, stride_ik, TOP_K,
                  R_PAD: tl.constexpr):  # fmt: skip
    """Every route's (index r = t * K + k, local expert, local flag, local number + 1): the
    local routes numbered 1.. in route order, so a token's local routes are consecutive."""
    r = tl.arange(0, R_PAD)
    in_range = r < num_routes
    t = r // TOP_K
    ids = tl.load(ids_ptr + t * stride_it + (r - t * TOP_K) * stride_ik, mask=in_range, other=-1)
    expert = ids.to(tl.int64) - offset
    local = in_range & (expert >= 0) & (expert < num_experts)
    number = tl.cumsum(local.to(tl.int32), axis=0)
    return r, expert, local, number


@triton.jit
def _slot_route(slot, r, expert, local, number):
    """(route, local expert) of the slot-th local route (0-based)."""
    hit = local & (number == slot + 1)
    return tl.sum(tl.where(hit, r, 0), axis=0), tl.sum(tl.where(hit, expert, 0), axis=0)


@triton.jit
def _row_tile(ptr, row, stride_row, offs_k, stride_k, k0, K, EVEN_K: tl.constexpr):
    """A [16, BLOCK_K] tile whose row 0 is `row` of a matrix (from K offset k0) and whose
    other rows are zeros (not read)."""
    rows = tl.arange(0, _ROWS)
    ptrs = ptr + row * stride_row + (k0 + offs_k)[None, :] * stride_k + rows[:, None] * 0
    mask = rows[:, None] == 0
    if not EVEN_K:
        mask = mask & (offs_k[None, :] < K - k0)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _w2_step(acc, c, w_ptrs, s_ptrs, k0, offs_k, INTER, stride_wsk, QUANT: tl.constexpr,
             DOT_F32: tl.constexpr, EVEN_K: tl.constexpr):  # fmt: skip
    """One K step of either GEMM2 (route-major or by output tile): the [BLOCK_N, BLOCK_K] W2
    tile at `w_ptrs`, upcast to C's type, against a route's [16, BLOCK_K] tile `c` of C. With
    fp8 block scales (QUANT 1; `s_ptrs` the tile rows' scales) the block scale multiplies the
    step's [BLOCK_N, 16] product, not the upcast tile (kernels.py's GEMM2 scales the tile,
    which at one route a work item is 8x the multiplies; the tile's upcast to bf16 bounded
    GEMM2 at 2.1 TB/s, DeepSeek-V3 T=1, H200)."""
    if EVEN_K:
        w = tl.load(w_ptrs)
    else:
        w = tl.load(w_ptrs, mask=(offs_k < INTER - k0)[None, :], other=0.0)
    if DOT_F32:
        c = c.to(tl.float32)
    if QUANT == 1:
        s = tl.load(s_ptrs + (k0 // 128) * stride_wsk)
        acc += tl.dot(w.to(c.dtype), tl.trans(c)) * s[:, None]
    else:
        acc = _mma(acc, c, w.to(c.dtype), True)
    return acc


@triton.jit
def _stash_vec(vec, ws_ptr, slot, BLOCK_N: tl.constexpr):
    tl.store(ws_ptr + slot * BLOCK_N + tl.arange(0, BLOCK_N), vec)


@triton.jit
def _sum_slots(ws_ptr, slots, ok, BLOCK_N: tl.constexpr):
    """The partials in `slots` ([PARTS] slot numbers, `ok` the ones in use) summed: one 2-D
    load instead of a load a part (H200, Qwen3-30B fp8 at T=1, GEMM2 summing 8 routes x 2
    parts: 13.5 -> 12.7 us; the split itself, not the sum, was the cost: unsplit 9.1) and a
    fixed reduction tree, so the same sum whichever part arrives last. .cg reads L2, which
    the other SMs' stores reached (L1 is not coherent with them)."""
    ptrs = ws_ptr + slots[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    parts = tl.load(ptrs, mask=ok[:, None], other=0.0, cache_modifier=".cg")
    return tl.sum(parts, axis=0)


@triton.jit
def _route_scale(weights_ptr, out_scale_ptr, route, expert, stride_wt, stride_wk2, TOP_K,
                 QUANT: tl.constexpr):  # fmt: skip
    """What scales a route's GEMM2 product: its routing weight (x QUANT 2's per-expert
    output scale), fp32."""
    token = route // TOP_K
    scale = tl.load(weights_ptr + token * stride_wt + (route - token * TOP_K) * stride_wk2)
    scale = scale.to(tl.float32)
    if QUANT == 2:
        scale = scale * tl.load(out_scale_ptr + expert)
    return scale


@triton.jit
def _swiglu_store(up, gate, c_ptr, slot, offs_n, expert, a_scale_ptr, up_scale_ptr,
                  gate_scale_ptr, INTER, stride_cm, stride_cn, c_scale, QUANT: tl.constexpr,
                  HAS_A_SCALE: tl.constexpr):  # fmt: skip
    """GEMM1's epilogue: per-tensor scales, SwiGLU (silu on the gate half, times up), times
    `c_scale` (1, or the route's GEMM2 scale folded in), the route's row of C."""
    if QUANT == 2:
        up = up * tl.load(up_scale_ptr + expert)
        gate = gate * tl.load(gate_scale_ptr + expert)
        if HAS_A_SCALE:
            up = up * tl.load(a_scale_ptr)
            gate = gate * tl.load(a_scale_ptr)
    c = _saturate_c(up * (gate * tl.sigmoid(gate)) * c_scale, c_ptr)
    c_ptrs = c_ptr + slot.to(tl.int64) * stride_cm + offs_n * stride_cn
    tl.store(c_ptrs, c.to(c_ptr.dtype.element_ty), mask=offs_n < INTER)


@triton.jit
def _signal_ready(ready_ptr, slot):
    """One more C tile of local route `slot` is stored: a CTA barrier, then a release at GPU
    scope (the tile's stores are visible to whoever acquires the count)."""
    tl.debug_barrier()
    tl.atomic_add(ready_ptr + slot, 1, sem="release", scope="gpu")


@triton.jit
def _wait_ready(ready_ptr, slot, target):
    """Spin until local route `slot`'s row of C is whole (`target` tiles stored)."""
    while tl.atomic_add(ready_ptr + slot, 0, sem="acquire", scope="gpu") < target:
        pass


@triton.jit
def _consume(ready_ptr, slot, readers, MAX_ROUTES: tl.constexpr):
    """This GEMM2 item is done with route `slot`'s row of C; the last of its `readers`
    resets the slot's counters (ready at ready_ptr, read ones MAX_ROUTES further) for the
    next launch."""
    tl.debug_barrier()
    done = tl.atomic_add(ready_ptr + MAX_ROUTES + slot, 1, sem="acq_rel", scope="gpu")
    if done == readers - 1:
        tl.store(ready_ptr + slot, 0)
        tl.store(ready_ptr + MAX_ROUTES + slot, 0)


@triton.jit(do_not_specialize=["num_routes", "num_experts", "offset"])
def _moe_direct_gemm1_kernel(
    a_ptr,  # [T, H] activations (bf16/fp16/fp8)
    w_ptr,  # [E, 2I, H] W13: rows [0, I) up, rows [I, 2I) gate
    c_ptr,  # [T * K, I] intermediate, row = the route's local number
    ids_ptr,  # [T, K] global expert ids (any integer type)
    a_scale_ptr,  # QUANT 1: [H/128, T] fp32; QUANT 2 with HAS_A_SCALE: [1] fp32; else dummy
    w_scale_ptr,  # QUANT 1: [E, 2I/128, H/128] fp32; else dummy
    up_scale_ptr,  # QUANT 2: [E] fp32; else dummy
    gate_scale_ptr,  # QUANT 2: [E] fp32; else dummy
    ws_ptr,  # MAX_SPLIT > 1: [programs, 2, BLOCK_N] fp32 K-part partials; else dummy
    lock_ptr,  # int32 arrival counters, zero between launches
    weights_ptr,  # SCALE_C: [T, K] routing weights; else dummy
    out_scale_ptr,  # SCALE_C and QUANT 2: [E] fp32 GEMM2 output scales; else dummy
    num_routes,  # T * K
    num_experts,  # local experts E
    offset,  # the first local expert's global id
    H,
    INTER,
    fill,  # programs the tiles and their K parts should fill (the SMs)
    TOP_K: tl.constexpr,
    stride_it,
    stride_ik,
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
    stride_wt,
    stride_wk2,
    QUANT: tl.constexpr,
    HAS_A_SCALE: tl.constexpr,
    DOT_F32: tl.constexpr,
    EVEN_K: tl.constexpr,
    R_PAD: tl.constexpr,  # next power of two of num_routes
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MAX_SPLIT: tl.constexpr,
    PARTS_PAD: tl.constexpr,  # a power of two >= the parts one sum reads
    MIN_STEPS: tl.constexpr,  # the fewest K steps a part has
    USE_PDL: tl.constexpr = False,
    SCALE_C: tl.constexpr = False,  # fold the route's weight (x QUANT 2's output scale) into C
    ready_ptr=None,  # READY: int32 [2 * MAX_ROUTES] counters (the fused launch)
    READY: tl.constexpr = False,  # count each stored C tile on its route's counter
):
    _pdl_start(USE_PDL)
    r, expert_of, local, number = _local_routes(
        ids_ptr, num_routes, num_experts, offset, stride_it, stride_ik, TOP_K, R_PAD
    )
    num_pid_n = tl.cdiv(INTER, BLOCK_N)
    num_tiles = tl.sum(local.to(tl.int32), axis=0) * num_pid_n
    split, steps = _split_of(num_tiles, tl.cdiv(H, BLOCK_K), fill, MAX_SPLIT, MIN_STEPS)
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, _ROWS)
    for work in range(tl.program_id(0), num_tiles * split, tl.num_programs(0)):
        tile, k_lo, k_hi = _part_of(work, split, steps, H, BLOCK_K)
        slot = tile // num_pid_n
        pid_n = tile - slot * num_pid_n
        route, expert = _slot_route(slot, r, expert_of, local, number)
        token = (route // TOP_K).to(tl.int64)
        c_scale = 1.0
        if SCALE_C:
            c_scale = _route_scale(weights_ptr, out_scale_ptr, route, expert, stride_wt,
                                   stride_wk2, TOP_K, QUANT)  # fmt: skip
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_nw = offs_n % INTER  # tail columns wrap: in-bounds loads, masked store
        w_base = w_ptr + expert * stride_we
        up_ptrs = w_base + offs_nw[:, None] * stride_wn + (k_lo + offs_k)[None, :] * stride_wk
        gate_ptrs = up_ptrs + INTER * stride_wn
        if QUANT == 1:
            ws_up = w_scale_ptr + expert * stride_wse + (offs_nw // 128) * stride_wsn
            ws_gate = w_scale_ptr + expert * stride_wse + ((offs_nw + INTER) // 128) * stride_wsn
        acc_up = tl.zeros((BLOCK_N, _ROWS), dtype=tl.float32)
        acc_gate = tl.zeros((BLOCK_N, _ROWS), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            a = _row_tile(a_ptr, token, stride_at, offs_k, stride_ah, k0, H, EVEN_K)
            if EVEN_K:
                w_up = tl.load(up_ptrs)
                w_gate = tl.load(gate_ptrs)
            else:
                k_ok = (offs_k < H - k0)[None, :]
                w_up = tl.load(up_ptrs, mask=k_ok, other=0.0)
                w_gate = tl.load(gate_ptrs, mask=k_ok, other=0.0)
            if DOT_F32:
                a = a.to(tl.float32)
                w_up = w_up.to(tl.float32)
                w_gate = w_gate.to(tl.float32)
            else:
                w_up = w_up.to(a.dtype)  # float32 weights meet 16-bit activations
                w_gate = w_gate.to(a.dtype)
            if QUANT == 1:
                kb = k0 // 128
                a_s = tl.load(a_scale_ptr + kb * stride_ask + token * stride_ast + rows * 0)
                s_up = tl.load(ws_up + kb * stride_wsk)
                s_gate = tl.load(ws_gate + kb * stride_wsk)
                acc_up = _mma_scaled(acc_up, a, w_up, a_s, s_up, True)
                acc_gate = _mma_scaled(acc_gate, a, w_gate, a_s, s_gate, True)
            else:
                acc_up = _mma(acc_up, a, w_up, True)
                acc_gate = _mma(acc_gate, a, w_gate, True)
            up_ptrs += BLOCK_K * stride_wk
            gate_ptrs += BLOCK_K * stride_wk
        # Column 0 is the route's product; the zero rows of the activation tile gave zeros.
        up = tl.sum(acc_up, axis=1)
        gate = tl.sum(acc_gate, axis=1)
        # Each branch stores (a value assigned in a branch and used after it trips Triton
        # 3.6's layout pass on these 1-D tiles: "operand does not dominate this use").
        if MAX_SPLIT > 1 and split > 1:
            _stash_vec(up, ws_ptr, 2 * work, BLOCK_N)
            _stash_vec(gate, ws_ptr, 2 * work + 1, BLOCK_N)
            if _arrive(lock_ptr, tile, split):
                p = tl.arange(0, PARTS_PAD)
                up = _sum_slots(ws_ptr, 2 * (tile * split + p), p < split, BLOCK_N)
                gate = _sum_slots(ws_ptr, 2 * (tile * split + p) + 1, p < split, BLOCK_N)
                tl.store(lock_ptr + tile, 0)  # ready for the next launch
                _swiglu_store(up, gate, c_ptr, slot, offs_n, expert, a_scale_ptr, up_scale_ptr,
                              gate_scale_ptr, INTER, stride_cm, stride_cn, c_scale, QUANT,
                              HAS_A_SCALE)  # fmt: skip
                if READY:
                    _signal_ready(ready_ptr, slot)
        else:
            _swiglu_store(up, gate, c_ptr, slot, offs_n, expert, a_scale_ptr, up_scale_ptr,
                          gate_scale_ptr, INTER, stride_cm, stride_cn, c_scale, QUANT,
                          HAS_A_SCALE)  # fmt: skip
            if READY:
                _signal_ready(ready_ptr, slot)
    _pdl_end(USE_PDL)


@triton.jit(do_not_specialize=["num_routes", "num_experts", "offset", "num_tokens"])
def _moe_direct_gemm2_kernel(
    c_ptr,  # [T * K, I] intermediate (16-bit), row = the route's local number
    w_ptr,  # [E, H, I] W2
    out_ptr,  # [T, H] output (bf16)
    ids_ptr,  # [T, K] global expert ids
    weights_ptr,  # [T, K] routing weights
    w_scale_ptr,  # QUANT 1: [E, H/128, I/128] fp32; else dummy
    out_scale_ptr,  # QUANT 2: [E] fp32; else dummy
    ws_ptr,  # [max(programs, T * K * N tiles), BLOCK_N] fp32 partials
    lock_ptr,  # int32 arrival counters (one per token and N tile), zero between launches
    num_routes,
    num_experts,
    offset,
    num_tokens,
    H,
    INTER,
    fill,  # programs the tiles and their K parts should fill (the SMs)
    TOP_K: tl.constexpr,
    stride_it,
    stride_ik,
    stride_wt,
    stride_wk2,
    stride_cm,
    stride_ck,
    stride_we,
    stride_wn,
    stride_wk,
    stride_ot,
    stride_on,
    stride_wse,
    stride_wsn,
    stride_wsk,
    QUANT: tl.constexpr,
    DOT_F32: tl.constexpr,
    EVEN_K: tl.constexpr,
    R_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MAX_SPLIT: tl.constexpr,
    PARTS_PAD: tl.constexpr,  # a power of two >= the parts one sum reads
    MIN_STEPS: tl.constexpr,  # the fewest K steps a part has
    USE_PDL: tl.constexpr = False,
    ready_ptr=None,  # READY: int32 [2 * MAX_ROUTES] counters (the fused launch)
    ready_target=0,  # READY: the C tiles of a route's row
    READY: tl.constexpr = False,  # wait for each route's row of C on its counter
    MAX_ROUTES: tl.constexpr = 64,
):
    _pdl_start(USE_PDL)
    r, expert_of, local, number = _local_routes(
        ids_ptr, num_routes, num_experts, offset, stride_it, stride_ik, TOP_K, R_PAD
    )
    token_of = r // TOP_K
    num_pid_n = tl.cdiv(H, BLOCK_N)
    num_tiles = tl.sum(local.to(tl.int32), axis=0) * num_pid_n
    split, steps = _split_of(num_tiles, tl.cdiv(INTER, BLOCK_K), fill, MAX_SPLIT, MIN_STEPS)
    offs_k = tl.arange(0, BLOCK_K)
    for work in range(tl.program_id(0), num_tiles * split, tl.num_programs(0)):
        tile, k_lo, k_hi = _part_of(work, split, steps, INTER, BLOCK_K)
        slot = tile // num_pid_n
        pid_n = tile - slot * num_pid_n
        route, expert = _slot_route(slot, r, expert_of, local, number)
        token = route // TOP_K
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_nw = offs_n % H
        w_ptrs = (
            w_ptr
            + expert * stride_we
            + offs_nw[:, None] * stride_wn
            + (k_lo + offs_k)[None, :] * stride_wk
        )
        s_ptrs = w_scale_ptr + expert * stride_wse + (offs_nw // 128) * stride_wsn  # QUANT 1
        if READY:
            _wait_ready(ready_ptr, slot, ready_target)
        acc = tl.zeros((BLOCK_N, _ROWS), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            c = _row_tile(c_ptr, slot.to(tl.int64), stride_cm, offs_k, stride_ck, k0, INTER, EVEN_K)
            acc = _w2_step(acc, c, w_ptrs, s_ptrs, k0, offs_k, INTER, stride_wsk, QUANT, DOT_F32,
                           EVEN_K)  # fmt: skip
            w_ptrs += BLOCK_K * stride_wk
        if READY:
            _consume(ready_ptr, slot, num_pid_n * split, MAX_ROUTES)
        part = tl.sum(acc, axis=1) * _route_scale(
            weights_ptr, out_scale_ptr, route, expert, stride_wt, stride_wk2, TOP_K, QUANT
        )
        # The token's output tile sums the parts of all its local routes.
        of_token = local & (token_of == token)
        routes_of_token = tl.sum(of_token.to(tl.int32), axis=0)
        first_slot = tl.sum((local & (token_of < token)).to(tl.int32), axis=0)
        parts = routes_of_token * split
        out_tile = token * num_pid_n + pid_n
        out_ptrs = out_ptr + token.to(tl.int64) * stride_ot + offs_n * stride_on
        n_ok = offs_n < H
        if parts > 1:  # each branch stores (GEMM1 says why)
            _stash_vec(part, ws_ptr, work, BLOCK_N)
            if _arrive(lock_ptr, out_tile, parts):
                # The token's routes (consecutive local numbers) times the K parts.
                q = tl.arange(0, PARTS_PAD)
                slots = ((first_slot + q // split) * num_pid_n + pid_n) * split + q % split
                total = _sum_slots(ws_ptr, slots, q < parts, BLOCK_N)
                tl.store(lock_ptr + out_tile, 0)  # ready for the next launch
                tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=n_ok)
        else:
            tl.store(out_ptrs, part.to(out_ptr.dtype.element_ty), mask=n_ok)
    # Tokens none of whose routes are local: zero rows.
    for z in range(tl.program_id(0), num_tokens * num_pid_n, tl.num_programs(0)):
        t = z // num_pid_n
        if tl.sum((local & (token_of == t)).to(tl.int32), axis=0) == 0:
            offs_n = (z - t * num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
            zeros = tl.zeros((BLOCK_N,), dtype=out_ptr.dtype.element_ty)
            out_ptrs = out_ptr + t.to(tl.int64) * stride_ot + offs_n * stride_on
            tl.store(out_ptrs, zeros, mask=offs_n < H)
    _pdl_end(USE_PDL)


# The most routes a token may have for GEMM2 by output tile: its local experts ride in two
# int64 words, 16 bits each.
BY_TOKEN_MAX_TOP_K = 8


@triton.jit
def _pack16(vals, j, FIRST: tl.constexpr):
    """vals[FIRST:FIRST + 4] (non-negative, < 2**16) packed 16 bits each into an int64."""
    sel = (j >= FIRST) & (j < FIRST + 4)
    shift = (16 * tl.maximum(j - FIRST, 0)).to(tl.int64)
    return tl.sum(tl.where(sel, vals.to(tl.int64) << shift, 0), axis=0)


@triton.jit(do_not_specialize=["num_routes", "num_experts", "offset", "num_tokens"])
def _moe_direct_gemm2_by_token_kernel(
    c_ptr,  # [T * K, I] intermediate (16-bit, the route's scale folded in), row = local number
    w_ptr,  # [E, H, I] W2
    out_ptr,  # [T, H] output (bf16)
    ids_ptr,  # [T, K] global expert ids
    w_scale_ptr,  # QUANT 1: [E, H/128, I/128] fp32; else dummy
    ws_ptr,  # MAX_SPLIT > 1: [fill, BLOCK_N] fp32 partials; else dummy
    lock_ptr,  # int32 arrival counters (one per token and N tile), zero between launches
    num_routes,
    num_experts,
    offset,
    num_tokens,
    H,
    INTER,
    fill,  # programs the tiles and their parts should fill (the SMs)
    TOP_K: tl.constexpr,  # at most BY_TOKEN_MAX_TOP_K
    stride_it,
    stride_ik,
    stride_cm,
    stride_ck,
    stride_we,
    stride_wn,
    stride_wk,
    stride_ot,
    stride_on,
    stride_wse,
    stride_wsn,
    stride_wsk,
    QUANT: tl.constexpr,
    DOT_F32: tl.constexpr,
    EVEN_K: tl.constexpr,
    R_PAD: tl.constexpr,
    KP: tl.constexpr,  # next power of two of TOP_K
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MAX_SPLIT: tl.constexpr,
    PARTS_PAD: tl.constexpr,  # a power of two >= MAX_SPLIT
    USE_PDL: tl.constexpr = False,
):
    """GEMM2 + combine by output tile: work items (token, N tile of H, part); a part walks
    its share of the token's (local route, K step) sequence in one loop, so a tile has no
    partial a route to stash and sum (the route-major kernel's arrival chain) and tokens
    with no local route store zeros from the same loop. GEMM1 folded each route's weight
    (and output scale) into its row of C. The loop finds a step's expert by shifts in two
    packed words: picking it from a vector by a reduction kept Triton from pipelining the
    loop (H200, Qwen3-30B fp8 T=1: 15.5 us against the route-major 9.7). Parts (split
    only where the tiles leave SMs idle) sum in part order."""
    _pdl_start(USE_PDL)
    r, expert_of, local, number = _local_routes(
        ids_ptr, num_routes, num_experts, offset, stride_it, stride_ik, TOP_K, R_PAD
    )
    token_of = r // TOP_K
    num_pid_n = tl.cdiv(H, BLOCK_N)
    k_steps = tl.cdiv(INTER, BLOCK_K)
    num_tiles = num_tokens * num_pid_n
    if MAX_SPLIT > 1:
        split = tl.minimum(tl.maximum(fill // tl.maximum(num_tiles, 1), 1), MAX_SPLIT)
    else:
        split = 1
    offs_k = tl.arange(0, BLOCK_K)
    jj = tl.arange(0, KP)
    for work in range(tl.program_id(0), num_tiles * split, tl.num_programs(0)):
        tile = work // split
        part = work - tile * split
        token = tile // num_pid_n
        pid_n = tile - token * num_pid_n
        # The token's local routes are the consecutive local numbers first+1 .. first+count.
        count = tl.sum((local & (token_of == token)).to(tl.int32), axis=0)
        first = tl.sum((local & (token_of < token)).to(tl.int32), axis=0)
        hit = local[None, :] & (number[None, :] == (first + jj + 1)[:, None])
        expert_j = tl.sum(tl.where(hit, expert_of[None, :], 0), axis=1)
        low_word = _pack16(expert_j, jj, 0)
        high_word = _pack16(expert_j, jj, 4)
        total = count * k_steps
        per = tl.cdiv(total, split)
        i_lo = part * per
        i_hi = tl.minimum(total, i_lo + per)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_nw = offs_n % H
        acc = tl.zeros((BLOCK_N, _ROWS), dtype=tl.float32)
        for i in range(i_lo, i_hi):
            j = i // k_steps
            k0 = (i - j * k_steps) * BLOCK_K
            word = tl.where(j < 4, low_word, high_word)
            expert = (word >> (16 * (j % 4)).to(tl.int64)) & 0xFFFF
            c = _row_tile(c_ptr, (first + j).to(tl.int64), stride_cm, offs_k, stride_ck, k0,
                          INTER, EVEN_K)  # fmt: skip
            w_ptrs = (
                w_ptr
                + expert * stride_we
                + offs_nw[:, None] * stride_wn
                + (k0 + offs_k)[None, :] * stride_wk
            )
            s_ptrs = w_scale_ptr + expert * stride_wse + (offs_nw // 128) * stride_wsn
            acc = _w2_step(acc, c, w_ptrs, s_ptrs, k0, offs_k, INTER, stride_wsk, QUANT, DOT_F32,
                           EVEN_K)  # fmt: skip
        out_vec = tl.sum(acc, axis=1)
        out_ptrs = out_ptr + token.to(tl.int64) * stride_ot + offs_n * stride_on
        n_ok = offs_n < H
        if MAX_SPLIT > 1 and split > 1:  # each branch stores (GEMM1 says why)
            _stash_vec(out_vec, ws_ptr, work, BLOCK_N)
            if _arrive(lock_ptr, tile, split):
                p = tl.arange(0, PARTS_PAD)
                out_vec = _sum_slots(ws_ptr, tile * split + p, p < split, BLOCK_N)
                tl.store(lock_ptr + tile, 0)  # ready for the next launch
                tl.store(out_ptrs, out_vec.to(out_ptr.dtype.element_ty), mask=n_ok)
        else:
            tl.store(out_ptrs, out_vec.to(out_ptr.dtype.element_ty), mask=n_ok)
    _pdl_end(USE_PDL)


@triton.jit(do_not_specialize=["num_routes", "num_experts", "offset", "num_tokens"])
def _moe_direct_fused_kernel(
    a_ptr,
    w1_ptr,
    c_ptr,
    ids_ptr,
    a_scale_ptr,
    w1_scale_ptr,
    up_scale_ptr,
    gate_scale_ptr,
    ws1_ptr,
    lock1_ptr,  # GEMM1's arrival counters
    w2_ptr,
    out_ptr,
    weights_ptr,
    w2_scale_ptr,
    out_scale_ptr,
    ws2_ptr,
    lock2_ptr,  # GEMM2's arrival counters (apart from GEMM1's: both phases run at once)
    ready_ptr,  # int32 [2 * MAX_ROUTES]: C tiles stored a route, GEMM2 items done with it
    num_routes,
    num_experts,
    offset,
    num_tokens,
    H,
    INTER,
    fill,
    TOP_K: tl.constexpr,
    stride_it,
    stride_ik,
    stride_at,
    stride_ah,
    stride_w1e,
    stride_w1n,
    stride_w1k,
    stride_cm,
    stride_cn,
    stride_ask,
    stride_ast,
    stride_w1se,
    stride_w1sn,
    stride_w1sk,
    stride_wt,
    stride_wk2,
    stride_w2e,
    stride_w2n,
    stride_w2k,
    stride_ot,
    stride_on,
    stride_w2se,
    stride_w2sn,
    stride_w2sk,
    QUANT: tl.constexpr,
    HAS_A_SCALE: tl.constexpr,
    DOT_F32: tl.constexpr,
    EVEN_K1: tl.constexpr,
    EVEN_K2: tl.constexpr,
    R_PAD: tl.constexpr,
    BLOCK_N1: tl.constexpr,
    BLOCK_K1: tl.constexpr,
    BLOCK_N2: tl.constexpr,
    BLOCK_K2: tl.constexpr,
    MAX_SPLIT: tl.constexpr,
    PARTS_PAD1: tl.constexpr,
    PARTS_PAD2: tl.constexpr,
    MIN_STEPS: tl.constexpr,
    MAX_ROUTES: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """Both GEMMs of the direct path in one persistent launch: every program does its GEMM1
    items (each stored C tile counted on its route's ready counter), then its GEMM2 items,
    each waiting until its route's row of C is whole. No second launch, and GEMM2 finds the
    routes GEMM1 already numbered. A waiting program must not keep a GEMM1 item off the GPU:
    the host launches at most one program an SM (all resident), the interpreter one."""
    _pdl_start(USE_PDL)
    _moe_direct_gemm1_kernel(
        a_ptr, w1_ptr, c_ptr, ids_ptr, a_scale_ptr, w1_scale_ptr, up_scale_ptr,
        gate_scale_ptr, ws1_ptr, lock1_ptr, weights_ptr, out_scale_ptr, num_routes,
        num_experts, offset, H, INTER, fill, TOP_K, stride_it, stride_ik, stride_at, stride_ah,
        stride_w1e, stride_w1n, stride_w1k, stride_cm, stride_cn, stride_ask, stride_ast,
        stride_w1se, stride_w1sn, stride_w1sk, stride_wt, stride_wk2, QUANT, HAS_A_SCALE,
        DOT_F32, EVEN_K1, R_PAD, BLOCK_N1, BLOCK_K1, MAX_SPLIT, PARTS_PAD1, MIN_STEPS,
        USE_PDL=False, ready_ptr=ready_ptr, READY=True,
    )  # fmt: skip
    _moe_direct_gemm2_kernel(
        c_ptr, w2_ptr, out_ptr, ids_ptr, weights_ptr, w2_scale_ptr, out_scale_ptr, ws2_ptr,
        lock2_ptr, num_routes, num_experts, offset, num_tokens, H, INTER, fill, TOP_K,
        stride_it, stride_ik, stride_wt, stride_wk2, stride_cm, stride_cn, stride_w2e,
        stride_w2n, stride_w2k, stride_ot, stride_on, stride_w2se, stride_w2sn, stride_w2sk,
        QUANT, DOT_F32, EVEN_K2, R_PAD, BLOCK_N2, BLOCK_K2, MAX_SPLIT, PARTS_PAD2, MIN_STEPS,
        USE_PDL=USE_PDL, ready_ptr=ready_ptr, ready_target=tl.cdiv(INTER, BLOCK_N1),
        READY=True, MAX_ROUTES=MAX_ROUTES,
    )  # fmt: skip

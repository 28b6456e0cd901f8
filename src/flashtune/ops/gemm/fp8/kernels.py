"""Triton kernel of the fp8 GEMMs (C = A @ B.T, B logically [N, K]); launch.py launches it.

One kernel serves every fp8 op of the package, chosen by compile-time flags:
- per-tensor scales (bmm_fp8): one fp32 accumulator over K, scaled once in the epilogue;
- block scales (gemm_fp8_nt_groupwise and its grouped forms, DeepSeek's 1x128 activation
  groups and 128x128 weight blocks): each BLOCK_K step's fp32 partial product is scaled by
  a_scale[m, kblock] * b_scale[nblock, kblock] before it is added, so BLOCK_K divides the
  scale block along K (GK);
- ROW_GROUPS: each row of A names the group (index into B's first dimension) it multiplies,
  -1 for a padding row (written as zeros); a tile loops over the groups its rows name, which
  is one group for the contiguous layouts MoE produces;
- MASKED_M: batch b has only its first rows[b] rows; the rest are written as zeros;
- B_KBLOCK > 0: B stored in K blocks, [K / B_KBLOCK, N, B_KBLOCK] (TRT-LLM's layout of
  mm_fp8's weight), read in place;
- SPLIT_K > 1 (a runtime argument): K is split over the grid's third axis, each split owning
  whole K tiles; the last split of a tile to arrive sums the partials (the GEMM family's
  `_split_k_fixup`), so decode-sized GEMMs (a handful of output tiles) fill the SMs.
- TAIL: only the output tiles past DP_TILES (the last, partial wave of a launch whose tiles
  do not divide into the SMs) are split SPLIT_K ways, on a 1-D grid: programs [0, DP_TILES)
  compute whole tiles, each later one a K part of a tail tile. One 128x128 tile a program
  on 132 SMs, M=4096 x N=576 has 160 tiles: two waves of 56 K steps where 1.2 would do;
  with the 28 tail tiles in 4 parts the SMs run 56 + 14 steps.
- stream-K (its own kernel, `_fp8_gemm_streamk_kernel`, on one batch entry, per-tensor or
  block scales, pointer or TMA loads): a persistent grid of about the SM count (or a
  multiple) shares the tiles x K-steps iterations out in equal contiguous ranges, so every
  SM does the same number of K steps whatever the tile count (4096 x 576 in 128x256 tiles
  is 96 tiles on 132 SMs: 36 SMs idle in the one wave; docs/gemm-fp8.md has what it
  measured).
- TMA: A and B are 2-D tensor descriptors ([M, K] and [N, K], K contiguous, one batch entry,
  per-tensor or block scales): each K step's tiles arrive by the Hopper TMA engine, zero
  filled past M, N and K, instead of pointer loads (launch.py's TritonFp8TmaRunner).
Otherwise everything is read through strides (B column-major or row-major, scales K-major or
MN-major views), so no layout costs a copy. fp8 operands of two different formats (e4m3 x e5m2) are
widened to fp16 first (exact), since not every target has a mixed fp8 MMA.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashtune.ops.gemm.kernels import _split_k_fixup, tile_coords

# The kernel is the package's own: launch.py launches it.
__all__: list[str] = []


@triton.jit
def _k_loop(
    a_ptr,  # [M, K] of this batch, through strides (TMA: a descriptor, block [BM, BK])
    b_ptr,  # [N, K] of this batch / group, through strides (TMA: a descriptor, [BN, BK])
    sa_ptr,  # block scales of A [M/GM, K/GK] (through strides) or a dummy
    sb_ptr,  # block scales of B [N/GN, K/GK] (through strides) or a dummy
    offs_am,  # [BLOCK_M] rows, wrapped into [0, M)
    offs_bn,  # [BLOCK_N] columns, wrapped into [0, N)
    m0,  # TMA: the tile's first row and column (loads past the ends read zeros)
    n0,
    K,
    k_start,  # this split's K range [k_start, k_stop), k_start a multiple of BLOCK_K
    k_stop,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_bkb,
    stride_sam,
    stride_sak,
    stride_sbn,
    stride_sbk,
    BLOCK_SCALE: tl.constexpr,
    GM: tl.constexpr,
    GN: tl.constexpr,
    GK: tl.constexpr,
    UPCAST: tl.constexpr,
    B_KBLOCK: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TMA: tl.constexpr,
):
    offs_k = tl.arange(0, BLOCK_K)
    if not TMA:
        a_ptrs = a_ptr + offs_am[:, None] * stride_am + (k_start + offs_k[None, :]) * stride_ak
        b_ptrs = b_ptr + offs_bn[None, :] * stride_bn + (k_start + offs_k[:, None]) * stride_bk
    if BLOCK_SCALE:
        sa_ptrs = sa_ptr + (offs_am // GM) * stride_sam
        sb_ptrs = sb_ptr + (offs_bn // GN) * stride_sbn
        # Where BLOCK_N divides GN, the tile's stored columns lie in one scale block (its
        # first column is a multiple of BLOCK_N; wrapped tail columns, below it, are not
        # stored), the one of its largest column: a step's B scale is one number.
        sb_one = sb_ptr + (tl.max(offs_bn, axis=0) // GN) * stride_sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_stop, BLOCK_K):
        if TMA:
            a = a_ptr.load([m0, k0])
            b = b_ptr.load([n0, k0]).T  # loaded [BLOCK_N, BLOCK_K]: K-major, as fp8 MMAs take B
        else:
            if B_KBLOCK > 0:
                # B stored in K blocks: k lies in block k // B_KBLOCK at offset k % B_KBLOCK.
                kk = k0 + offs_k
                b_ptrs = (
                    b_ptr
                    + offs_bn[None, :] * stride_bn
                    + ((kk // B_KBLOCK) * stride_bkb + (kk % B_KBLOCK) * stride_bk)[:, None]
                )
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k0, other=0.0)
                b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k0, other=0.0)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        if UPCAST:
            a = a.to(tl.float16)
            b = b.to(tl.float16)
        if BLOCK_SCALE:
            kb = k0 // GK
            sa = tl.load(sa_ptrs + kb * stride_sak)
            if GN % BLOCK_N == 0:
                # Folded into the rows' scales: one FMA an element, not an outer product's
                # multiply and FMA (MoE's GEMM1, the same change: 13% on an H200).
                acc += tl.dot(a, b) * (sa * tl.load(sb_one + kb * stride_sbk))[:, None]
            else:
                sb = tl.load(sb_ptrs + kb * stride_sbk)
                acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])
        else:
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit(do_not_specialize=["M", "SPLIT_K", "DP_TILES"])
def _fp8_gemm_kernel(
    a_ptr,  # [batch, M, K] fp8
    b_ptr,  # [batch or groups, N, K] fp8 through strides
    c_ptr,  # [batch, M, N] bf16 / fp16
    sa_ptr,  # per-tensor: [1] fp32; block: [batch, M/GM, K/GK] through strides
    sb_ptr,  # per-tensor: [1] fp32; block: [batch or groups, N/GN, K/GK] through strides
    rows_ptr,  # ROW_GROUPS: [M] int32 group of each row; MASKED_M: [batch] int32; else dummy
    ws_ptr,  # SPLIT_K > 1: [batch, SPLIT_K, M, N] fp32 partials; else a dummy
    lock_ptr,  # SPLIT_K > 1: [batch * tiles] int32 arrival counters, zero between launches
    M,
    N,
    K,
    SPLIT_K,
    DP_TILES,  # TAIL: the tiles computed whole (the rest split SPLIT_K ways); else unused
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bn,
    stride_bk,
    stride_bkb,  # B_KBLOCK > 0: the stride between K blocks of B
    stride_cb,
    stride_cm,
    stride_cn,
    stride_sab,
    stride_sam,
    stride_sak,
    stride_sbb,
    stride_sbn,
    stride_sbk,
    BLOCK_SCALE: tl.constexpr,
    GM: tl.constexpr,
    GN: tl.constexpr,
    GK: tl.constexpr,
    ROW_GROUPS: tl.constexpr,
    MASKED_M: tl.constexpr,
    UPCAST: tl.constexpr,
    B_KBLOCK: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TMA: tl.constexpr = False,  # a_ptr / b_ptr are tensor descriptors (one batch entry)
    TAIL: tl.constexpr = False,  # only the tiles past DP_TILES split (1-D grid)
):
    pid = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    if TAIL:
        # Programs past DP_TILES: consecutive ones are one tail tile's K parts.
        q = pid - DP_TILES
        in_tail = q >= 0
        pid_k = tl.where(in_tail, q % SPLIT_K, 0)
        pid = tl.where(in_tail, DP_TILES + q // SPLIT_K, pid)
        split = tl.where(in_tail, SPLIT_K, 1)
    else:
        pid_k = tl.program_id(2)
        split = SPLIT_K
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coords(pid, num_pid_m, num_pid_n, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Out-of-range rows / columns wrap around instead of being masked: loads stay in bounds
    # and unmasked; the store is masked.
    offs_am = offs_m % M
    offs_bn = offs_n % N
    # Split-K: each split owns whole K tiles (which lie in one scale block each).
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, split)
    k_start = pid_k * tiles_per_split * BLOCK_K
    k_stop = min(K, k_start + tiles_per_split * BLOCK_K)
    sa_base = sa_ptr + pid_b * stride_sab
    row_ok = offs_m < M

    if ROW_GROUPS:
        a_base = a_ptr + pid_b * stride_ab
        groups = tl.load(rows_ptr + offs_m, mask=row_ok, other=-1)
        # The groups this tile's rows name, lowest to highest; padding rows (-1) none.
        # int64: group offsets into B pass 2**31 elements (256 experts of 7168 x 2048).
        g_lo = tl.min(tl.where(groups >= 0, groups, 2147483647), axis=0).to(tl.int64)
        g_hi = tl.max(groups, axis=0).to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for g in range(g_lo, g_hi + 1):
            part = _k_loop(
                a_base,
                b_ptr + g * stride_bb,
                sa_base,
                sb_ptr + g * stride_sbb,
                offs_am,
                offs_bn,
                0,
                0,
                K,
                k_start,
                k_stop,
                stride_am,
                stride_ak,
                stride_bn,
                stride_bk,
                stride_bkb,
                stride_sam,
                stride_sak,
                stride_sbn,
                stride_sbk,
                BLOCK_SCALE,
                GM,
                GN,
                GK,
                UPCAST,
                B_KBLOCK,
                EVEN_K,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                False,
            )
            acc = tl.where((groups == g)[:, None], part, acc)
    else:
        if TMA:  # descriptors of the one batch entry
            a_base = a_ptr
            b_base = b_ptr
        else:
            a_base = a_ptr + pid_b * stride_ab
            b_base = b_ptr + pid_b * stride_bb
        if MASKED_M:
            m_valid = tl.load(rows_ptr + pid_b)
            # A tile past the batch's valid rows reads nothing (an empty K range) and writes
            # zeros; a select, not a branch around the loop, keeps the accumulator's layout.
            k_stop = tl.where(pid_m * BLOCK_M < m_valid, k_stop, k_start)
        acc = _k_loop(
            a_base,
            b_base,
            sa_base,
            sb_ptr + pid_b * stride_sbb,
            offs_am,
            offs_bn,
            pid_m * BLOCK_M,
            pid_n * BLOCK_N,
            K,
            k_start,
            k_stop,
            stride_am,
            stride_ak,
            stride_bn,
            stride_bk,
            stride_bkb,
            stride_sam,
            stride_sak,
            stride_sbn,
            stride_sbk,
            BLOCK_SCALE,
            GM,
            GN,
            GK,
            UPCAST,
            B_KBLOCK,
            EVEN_K,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            TMA,
        )
        if MASKED_M:
            acc = tl.where((offs_m < m_valid)[:, None], acc, 0.0)

    c_base = c_ptr + pid_b * stride_cb
    if split == 1:
        _store(acc, c_base, sa_ptr, sb_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, BLOCK_SCALE)
    else:
        # The last split of this tile to arrive sums the partials and stores (the GEMM
        # family's fixup: no second launch, the counters left at zero).
        is_last, acc = _split_k_fixup(
            acc,
            offs_m,
            offs_n,
            pid_k,
            pid_b * (num_pid_m * num_pid_n) + pid_m * num_pid_n + pid_n,
            ws_ptr + pid_b * split * M * N,
            lock_ptr,
            M,
            N,
            split,
        )
        if is_last:
            _store(
                acc, c_base, sa_ptr, sb_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, BLOCK_SCALE
            )


@triton.jit(do_not_specialize=["M", "ITERS"])
def _fp8_gemm_streamk_kernel(
    a_ptr,  # [M, K] fp8 through strides (TMA: a descriptor, block [BLOCK_M, BLOCK_K])
    b_ptr,  # [N, K] fp8 through strides (TMA: a descriptor, block [BLOCK_N, BLOCK_K])
    c_ptr,  # [M, N] bf16 / fp16
    sa_ptr,  # per-tensor: [1] fp32; block: [M/GM, K/GK] through strides
    sb_ptr,  # per-tensor: [1] fp32; block: [N/GN, K/GK] through strides
    ws_ptr,  # [programs, 2, BLOCK_M, BLOCK_N] fp32 partials (a dummy if no range ends mid-tile)
    lock_ptr,  # [tiles] int32 arrival counters, zero between launches
    M,
    N,
    K,
    ITERS,  # iterations (K steps of a tile) a program: cdiv(tiles * k_steps, programs)
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_bkb,  # B_KBLOCK > 0: the stride between K blocks of B
    stride_cm,
    stride_cn,
    stride_sam,
    stride_sak,
    stride_sbn,
    stride_sbk,
    BLOCK_SCALE: tl.constexpr,
    GM: tl.constexpr,
    GN: tl.constexpr,
    GK: tl.constexpr,
    UPCAST: tl.constexpr,
    B_KBLOCK: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TMA: tl.constexpr,
    SUM_N: tl.constexpr,  # the columns the fixup sums at a time (divides BLOCK_N)
):
    """Stream-K: program p computes iterations [p * ITERS, (p + 1) * ITERS) of the tiles x
    k_steps (tile-major) iteration space, one segment per tile it touches. A segment that
    is a whole tile is stored; a part of a tile goes to one of the program's two workspace
    slots (0: its range's first segment, which may start mid-tile; 1: its last, which may
    end mid-tile; a segment that is both: 0), and the tile's last program to arrive at its
    counter sums the parts in program order and stores. Nobody waits for anybody: no
    deadlock, whatever runs when."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    start = pid * ITERS
    stop = min(start + ITERS, num_pid_m * num_pid_n * k_steps)
    offs_ws = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    it = start
    # A range of ITERS iterations touches at most cdiv(ITERS, k_steps) + 1 tiles.
    for _ in range(0, tl.cdiv(ITERS, k_steps) + 1):
        if it < stop:
            tile = it // k_steps
            tile_start = tile * k_steps
            pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            # Whole K steps: each lies in one scale block, as in a split-K split.
            acc = _k_loop(
                a_ptr,
                b_ptr,
                sa_ptr,
                sb_ptr,
                offs_m % M,  # wrapped: loads in bounds and unmasked; the store is masked
                offs_n % N,
                pid_m * BLOCK_M,
                pid_n * BLOCK_N,
                K,
                (it - tile_start) * BLOCK_K,
                min(K, (min(stop, tile_start + k_steps) - tile_start) * BLOCK_K),
                stride_am,
                stride_ak,
                stride_bn,
                stride_bk,
                stride_bkb,
                stride_sam,
                stride_sak,
                stride_sbn,
                stride_sbk,
                BLOCK_SCALE,
                GM,
                GN,
                GK,
                UPCAST,
                B_KBLOCK,
                EVEN_K,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                TMA,
            )
            # The programs whose ranges share this tile.
            p_first = tile_start // ITERS
            p_last = (tile_start + k_steps - 1) // ITERS
            if p_first == p_last:
                _store(
                    acc,
                    c_ptr,
                    sa_ptr,
                    sb_ptr,
                    offs_m,
                    offs_n,
                    M,
                    N,
                    stride_cm,
                    stride_cn,
                    BLOCK_SCALE,
                )
            else:
                slot = tl.where(it == start, 0, 1)
                tl.store(ws_ptr + (pid * 2 + slot) * (BLOCK_M * BLOCK_N) + offs_ws, acc)
                # Every thread's part must be written before one thread releases the counter.
                tl.debug_barrier()
                arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
                if arrived == p_last - p_first:
                    tl.store(lock_ptr + tile, 0)  # ready for the next launch
                    _streamk_sum_store(
                        ws_ptr,
                        c_ptr,
                        sa_ptr,
                        sb_ptr,
                        offs_m,
                        pid_n * BLOCK_N,
                        p_first,
                        p_last,
                        tl.where(p_first * ITERS < tile_start, 1, 0),
                        M,
                        N,
                        stride_cm,
                        stride_cn,
                        BLOCK_SCALE,
                        BLOCK_M,
                        BLOCK_N,
                        SUM_N,
                    )
            it = tile_start + k_steps


@triton.jit
def _streamk_sum_store(
    ws_ptr,  # [programs, 2, BLOCK_M, BLOCK_N] fp32 parts
    c_ptr,
    sa_ptr,
    sb_ptr,
    offs_m,  # [BLOCK_M] the tile's rows
    n0,  # the tile's first column
    p_first,  # the programs whose parts make the tile, in order
    p_last,
    first_slot,  # p_first's slot: 1 if its range began before the tile (its last segment)
    M,
    N,
    stride_cm,
    stride_cn,
    BLOCK_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SUM_N: tl.constexpr,
):
    """C[tile] = the sum of its parts in program order (the same bits whichever program
    arrives last), SUM_N columns at a time. Every part is read from the workspace, the
    caller's own too (just written, in L2): a [128, 256] sum held beside the accumulator
    and a loaded part spilled 848 bytes a thread on sm_90; in [128, 64] pieces, none."""
    for c0 in range(0, BLOCK_N, SUM_N):
        offs_c = c0 + tl.arange(0, SUM_N)
        offs_ws = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + offs_c[None, :]
        # .cg reads from L2: L1 is not coherent with the other SMs' stores.
        first = ws_ptr + (p_first * 2 + first_slot) * (BLOCK_M * BLOCK_N)
        total = tl.load(first + offs_ws, cache_modifier=".cg")
        for p in range(p_first + 1, p_last + 1):
            # Every later program's range begins in this tile: its first segment, slot 0.
            part = ws_ptr + p * 2 * (BLOCK_M * BLOCK_N)
            total += tl.load(part + offs_ws, cache_modifier=".cg")
        _store(
            total,
            c_ptr,
            sa_ptr,
            sb_ptr,
            offs_m,
            n0 + offs_c,
            M,
            N,
            stride_cm,
            stride_cn,
            BLOCK_SCALE,
        )


@triton.jit
def _store(
    acc,  # [BLOCK_M, BLOCK_N] fp32, rows offs_m, columns offs_n
    c_ptr,  # [M, N] of this batch
    sa_ptr,  # per-tensor [1] fp32 (with BLOCK_SCALE already applied, unused)
    sb_ptr,
    offs_m,
    offs_n,
    M,
    N,
    stride_cm,
    stride_cn,
    BLOCK_SCALE: tl.constexpr,
):
    if not BLOCK_SCALE:
        acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)

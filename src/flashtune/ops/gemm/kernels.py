"""Triton kernels of the GEMM op (C = A @ B.T, B logically [N, K]); launch.py launches them.

Kernels: a tiled GEMM (group-M swizzle, split-K), a decode kernel for small M (split-K grid)
and its stream-K variant (equal K-iterations per program). All read B through its strides,
so one code path serves B stored [N, K] ("nk", the corpus layout) and B stored [K, N]
(passed as a transposed view). All accumulate in fp32 and apply, in this order, the fp8
per-tensor scales, the bias, and the cast to the output dtype.

Split-K without a second launch: each split writes its fp32 partial tile to a workspace and
bumps a per-tile arrival counter; the last split to arrive sums the partials, writes C and
resets the counter to zero, so the counters never need a memset between launches (one
persistent zeroed buffer per device). A second reduction kernel or a memset would add a few
microseconds, which is the whole budget of a decode GEMM.
"""

from __future__ import annotations

import triton
import triton.language as tl

# The kernels are the package's own: launch.py launches them.
__all__: list[str] = []


@triton.jit
def _epilogue(
    acc,  # [BLOCK_M, BLOCK_N] fp32, rows offs_m, columns offs_n
    offs_m,
    offs_n,
    c_ptr,  # [M, N]
    bias_ptr,  # [N] or a dummy
    scale_a_ptr,  # [1] fp32 or a dummy
    scale_b_ptr,  # [1] fp32 or a dummy
    M,
    N,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):
    if HAS_SCALE:
        acc = acc * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _split_k_fixup(
    acc,  # [BLOCK_M, BLOCK_N] fp32: this split's partial
    offs_m,
    offs_n,
    pid_k,
    tile_id,
    ws_ptr,  # [SPLIT_K, M, N] fp32 partials
    lock_ptr,  # [num_tiles] int32 arrival counters, all zero between launches
    M,
    N,
    SPLIT_K,
):
    """Publish this split's partial; return (is_last, total) where total is the full sum
    when this program is the last split of its tile to arrive."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws_tile = offs_m[:, None] * N + offs_n[None, :]
    tl.store(ws_ptr + pid_k * M * N + ws_tile, acc, mask=mask)
    # Every thread's partial must be written before one thread releases the counter.
    tl.debug_barrier()
    arrived = tl.atomic_add(lock_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
    is_last = arrived == SPLIT_K - 1
    if is_last:
        for s in range(0, SPLIT_K):
            # .cg reads from L2: L1 is not coherent with the other SMs' stores. Our own
            # partial is already in registers, so masking it out saves its traffic.
            other = tl.load(
                ws_ptr + s * M * N + ws_tile,
                mask=mask & (s != pid_k),
                other=0.0,
                cache_modifier=".cg",
            )
            acc += other
        tl.store(lock_ptr + tile_id, 0)  # ready for the next launch
    return is_last, acc


@triton.jit
def tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of linear output tile `tile`. Group-M swizzle: GROUP_M row tiles walk
    the N tiles together, so the B tiles they share stay in L2 (the fp8 GEMM's and the
    fused-MoE GEMMs' tile order too)."""
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile % num_pid_in_group) % group_size_m)
    pid_n = (tile % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit(do_not_specialize=["M", "SPLIT_K"])
def _gemm_tiled_kernel(
    a_ptr,  # [M, K]
    b_ptr,  # [N, K] through strides (stride_bn, stride_bk)
    c_ptr,  # [M, N]
    bias_ptr,  # [N] or a dummy
    ws_ptr,  # [SPLIT_K, M, N] fp32 or a dummy
    lock_ptr,  # [num_tiles] int32 or a dummy
    scale_a_ptr,  # [1] fp32 or a dummy
    scale_b_ptr,  # [1] fp32 or a dummy
    M,
    N,
    K,
    SPLIT_K,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coords(pid, num_pid_m, num_pid_n, GROUP_M)

    # Splits own whole K tiles, so only the last tile of K needs a mask against K, and
    # none when BLOCK_K divides K (EVEN_K: unmasked 16-byte loads).
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_start = pid_k * tiles_per_split * BLOCK_K
    k_stop = min(K, k_start + tiles_per_split * BLOCK_K)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Out-of-range rows/columns wrap around instead of being masked: loads stay in bounds
    # and unmasked (faster); the epilogue masks the store.
    offs_am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + (k_start + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + (k_start + offs_k)[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_start, k_stop, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k, other=0.0)
        if IEEE_FP32:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if SPLIT_K == 1:
        _epilogue(
            acc,
            offs_m,
            offs_n,
            c_ptr,
            bias_ptr,
            scale_a_ptr,
            scale_b_ptr,
            M,
            N,
            stride_cm,
            stride_cn,
            HAS_BIAS,
            HAS_SCALE,
        )
    else:
        is_last, acc = _split_k_fixup(
            acc,
            offs_m,
            offs_n,
            pid_k,
            pid_m * num_pid_n + pid_n,
            ws_ptr,
            lock_ptr,
            M,
            N,
            SPLIT_K,
        )
        if is_last:
            _epilogue(
                acc,
                offs_m,
                offs_n,
                c_ptr,
                bias_ptr,
                scale_a_ptr,
                scale_b_ptr,
                M,
                N,
                stride_cm,
                stride_cn,
                HAS_BIAS,
                HAS_SCALE,
            )


@triton.jit(do_not_specialize=["M", "SPLIT_K"])
def _gemm_small_m_kernel(
    a_ptr,  # [M, K]
    b_ptr,  # [N, K] through strides (stride_bn, stride_bk)
    c_ptr,  # [M, N]
    bias_ptr,  # [N] or a dummy
    ws_ptr,  # [SPLIT_K, M, N] fp32 or a dummy
    lock_ptr,  # [num_tiles] int32 or a dummy
    scale_a_ptr,  # [1] fp32 or a dummy
    scale_b_ptr,  # [1] fp32 or a dummy
    M,
    N,
    K,
    SPLIT_K,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Decode GEMM: the whole (small) M in one tile, many CTAs over N and split K.

    It is bound by reading B once. B is read in its own [N, K] orientation, K contiguous, so
    each thread issues 16-byte loads. With BLOCK_M >= 16 the tile is computed "swap-AB",
    C.T[BLOCK_N, BLOCK_M] = B[BLOCK_N, :] @ A.T, so the large N side is the MMA's M side and
    the tensor cores do not pad M up to 64; below 16 rows there is no MMA shape, so it is
    an FMA reduction over K, kept as a 3-D accumulator and reduced once at the end.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    num_pid_n = tl.cdiv(N, BLOCK_N)

    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_start = pid_k * tiles_per_split * BLOCK_K
    k_stop = min(K, k_start + tiles_per_split * BLOCK_K)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_am = offs_m % M
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + (k_start + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + offs_bn[:, None] * stride_bn + (k_start + offs_k)[None, :] * stride_bk

    if BLOCK_M >= 16:
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k in range(k_start, k_stop, BLOCK_K):
            if EVEN_K:
                b = tl.load(b_ptrs)  # [BLOCK_N, BLOCK_K]
                a = tl.load(a_ptrs)  # [BLOCK_M, BLOCK_K]
            else:
                b = tl.load(b_ptrs, mask=offs_k[None, :] < K - k, other=0.0)
                a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k, other=0.0)
            if IEEE_FP32:
                acc_t = tl.dot(b, tl.trans(a), acc_t, input_precision="ieee")
            else:
                acc_t = tl.dot(b, tl.trans(a), acc_t)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        acc = tl.trans(acc_t)
    else:
        acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k in range(k_start, k_stop, BLOCK_K):
            if EVEN_K:
                b = tl.load(b_ptrs)
                a = tl.load(a_ptrs)
            else:
                b = tl.load(b_ptrs, mask=offs_k[None, :] < K - k, other=0.0)
                a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k, other=0.0)
            acc3 += a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        acc = tl.sum(acc3, axis=2)

    if SPLIT_K == 1:
        _epilogue(
            acc,
            offs_m,
            offs_n,
            c_ptr,
            bias_ptr,
            scale_a_ptr,
            scale_b_ptr,
            M,
            N,
            stride_cm,
            stride_cn,
            HAS_BIAS,
            HAS_SCALE,
        )
    else:
        is_last, acc = _split_k_fixup(
            acc,
            offs_m,
            offs_n,
            pid_k,
            pid_m * num_pid_n + pid_n,
            ws_ptr,
            lock_ptr,
            M,
            N,
            SPLIT_K,
        )
        if is_last:
            _epilogue(
                acc,
                offs_m,
                offs_n,
                c_ptr,
                bias_ptr,
                scale_a_ptr,
                scale_b_ptr,
                M,
                N,
                stride_cm,
                stride_cn,
                HAS_BIAS,
                HAS_SCALE,
            )


@triton.jit
def _small_m_partial(
    a_ptr,  # [M, K]
    b_ptr,  # [N, K] through strides
    offs_am,  # [BLOCK_M] rows of A (wrapped into range)
    offs_bn,  # [BLOCK_N] rows of B (wrapped into range)
    kt_lo,
    kt_hi,
    K,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    IEEE_FP32: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """A[offs_am, K tiles kt_lo..kt_hi) @ B[offs_bn, same].T as an fp32 [BLOCK_M, BLOCK_N]."""
    offs_k = tl.arange(0, BLOCK_K)
    k0 = kt_lo * BLOCK_K
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + offs_bn[:, None] * stride_bn + (k0 + offs_k)[None, :] * stride_bk
    if BLOCK_M >= 16:
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for kt in range(kt_lo, kt_hi):
            if EVEN_K:
                b = tl.load(b_ptrs)
                a = tl.load(a_ptrs)
            else:
                b = tl.load(b_ptrs, mask=offs_k[None, :] < K - kt * BLOCK_K, other=0.0)
                a = tl.load(a_ptrs, mask=offs_k[None, :] < K - kt * BLOCK_K, other=0.0)
            if IEEE_FP32:
                acc_t = tl.dot(b, tl.trans(a), acc_t, input_precision="ieee")
            else:
                acc_t = tl.dot(b, tl.trans(a), acc_t)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        acc = tl.trans(acc_t)
    else:
        acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
        for kt in range(kt_lo, kt_hi):
            if EVEN_K:
                b = tl.load(b_ptrs)
                a = tl.load(a_ptrs)
            else:
                b = tl.load(b_ptrs, mask=offs_k[None, :] < K - kt * BLOCK_K, other=0.0)
                a = tl.load(a_ptrs, mask=offs_k[None, :] < K - kt * BLOCK_K, other=0.0)
            acc3 += a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        acc = tl.sum(acc3, axis=2)
    return acc


@triton.jit(do_not_specialize=["M", "ITERS"])
def _gemm_small_m_streamk_kernel(
    a_ptr,  # [M, K], M <= BLOCK_M
    b_ptr,  # [N, K] through strides (stride_bn, stride_bk)
    c_ptr,  # [M, N]
    bias_ptr,  # [N] or a dummy
    ws_ptr,  # [n_tiles, MAX_SLOTS, BLOCK_M, BLOCK_N] fp32 partials
    lock_ptr,  # [n_tiles] int32 arrival counters, zero between launches
    scale_a_ptr,  # [1] fp32 or a dummy
    scale_b_ptr,  # [1] fp32 or a dummy
    M,
    N,
    K,
    ITERS,  # K tiles per program: cdiv(n_tiles * k_tiles, grid)
    MAX_SLOTS,  # most programs that share one output tile
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Decode GEMM, stream-K schedule: the n_tiles x k_tiles iterations are cut into equal
    contiguous runs, one per program (a few programs per SM), so every SM reads the same
    number of B bytes whatever N and K are; a split-K grid leaves a tail whenever its CTA
    count is not a multiple of the resident slots. A run that covers part of a tile's K
    range publishes a partial; the tile's last arrival sums them and writes C."""
    pid = tl.program_id(0)
    k_tiles = tl.cdiv(K, BLOCK_K)
    total = tl.cdiv(N, BLOCK_N) * k_tiles
    it = pid * ITERS
    stop = min(it + ITERS, total)
    offs_m = tl.arange(0, BLOCK_M)
    offs_am = offs_m % M
    offs_tile = offs_m[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    for _ in range(0, tl.cdiv(ITERS, k_tiles) + 1):
        if it < stop:
            tile = it // k_tiles
            kt_lo = it - tile * k_tiles
            kt_hi = min(k_tiles, kt_lo + (stop - it))
            offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
            acc = _small_m_partial(
                a_ptr,
                b_ptr,
                offs_am,
                offs_bn,
                kt_lo,
                kt_hi,
                K,
                stride_am,
                stride_ak,
                stride_bn,
                stride_bk,
                IEEE_FP32,
                EVEN_K,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
            )
            first = (tile * k_tiles) // ITERS
            last = ((tile + 1) * k_tiles - 1) // ITERS
            if first == last:
                _epilogue(
                    acc,
                    offs_m,
                    offs_n,
                    c_ptr,
                    bias_ptr,
                    scale_a_ptr,
                    scale_b_ptr,
                    M,
                    N,
                    stride_cm,
                    stride_cn,
                    HAS_BIAS,
                    HAS_SCALE,
                )
            else:
                row_ok = offs_m[:, None] < M
                ws_tile = ws_ptr + tile * MAX_SLOTS * BLOCK_M * BLOCK_N + offs_tile
                slot = pid - first
                tl.store(ws_tile + slot * BLOCK_M * BLOCK_N, acc, mask=row_ok)
                tl.debug_barrier()
                arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
                if arrived == last - first:
                    for s in range(0, last - first + 1):
                        acc += tl.load(
                            ws_tile + s * BLOCK_M * BLOCK_N,
                            mask=row_ok & (s != slot),
                            other=0.0,
                            cache_modifier=".cg",
                        )
                    tl.store(lock_ptr + tile, 0)
                    _epilogue(
                        acc,
                        offs_m,
                        offs_n,
                        c_ptr,
                        bias_ptr,
                        scale_a_ptr,
                        scale_b_ptr,
                        M,
                        N,
                        stride_cm,
                        stride_cn,
                        HAS_BIAS,
                        HAS_SCALE,
                    )
            it = (tile + 1) * k_tiles

"""The RMSNorm Triton kernel: one kernel for all four ops (launch.py launches it).

Rows are addressed through two strides so that 2-D inputs with a row stride and 3-D inputs
that cannot be flattened without a copy are read in place: row r lives at
(r // inner) * stride0 + (r % inner) * stride1.

- Single pass (hidden <= config.MAX_SINGLE_BLOCK): ROWS rows per program, each row held in
  registers; several rows per program keep small hidden sizes from being launch-bound.
- Two passes (larger hidden, or a hidden far from a power of two at large batch): one row per
  program, a loop of BLOCK_N chunks to accumulate the sum of squares, then a second loop that
  normalizes (the re-read hits L1/L2).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__: list[str] = []


@triton.jit
def _rmsnorm_kernel(
    X,  # [n_rows, N] input rows; updated in place with the output when FUSED_ADD
    R,  # [n_rows, N] residual, updated in place to X + R (FUSED_ADD only; else unused)
    W,  # [N] weight
    Y,  # [n_rows, N] output (aliases X when FUSED_ADD)
    n_rows,
    N,
    inner,  # rows of the inner dimension: row r is at (r // inner, r % inner)
    sx0,
    sx1,
    sr0,
    sr1,
    sy0,
    sy1,
    eps,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    FUSED_ADD: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
    USE_PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/pdl.py)
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    r64 = rows.to(tl.int64)
    outer = r64 // inner
    inn = r64 % inner
    x_row = (outer * sx0 + inn * sx1)[:, None]  # [ROWS, 1]
    y_row = (outer * sy0 + inn * sy1)[:, None]
    r_row = (outer * sr0 + inn * sr1)[:, None]
    cols = tl.arange(0, BLOCK_N)
    if USE_PDL:
        # The previous kernel may still be running: its writes are visible after the wait.
        tl.extra.cuda.gdc_wait()

    if NUM_CHUNKS == 1:
        col_mask = cols < N
        mask = row_mask[:, None] & col_mask[None, :]
        # The weight load is issued with x's, not after the reduction: at small batches the
        # kernel is one DRAM round trip long, and a second one after the barrier costs ~10%.
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + WEIGHT_OFFSET
        x = tl.load(X + x_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if FUSED_ADD:
            x += tl.load(R + r_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if USE_PDL:
            tl.extra.cuda.gdc_launch_dependents()  # inputs read: the next kernel may start
        if FUSED_ADD:
            tl.store(R + r_row + cols[None, :], x.to(R.dtype.element_ty), mask=mask)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / N + eps)  # [ROWS]
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        # ROWS == 1 here (the launcher guarantees it).
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for c in range(NUM_CHUNKS):
            cc = c * BLOCK_N + cols
            mask = row_mask[:, None] & (cc < N)[None, :]
            x = tl.load(X + x_row + cc[None, :], mask=mask, other=0.0).to(tl.float32)
            if FUSED_ADD:
                x += tl.load(R + r_row + cc[None, :], mask=mask, other=0.0).to(tl.float32)
                tl.store(R + r_row + cc[None, :], x.to(R.dtype.element_ty), mask=mask)
            acc += x * x
        if USE_PDL:
            tl.extra.cuda.gdc_launch_dependents()
        rstd = tl.math.rsqrt(tl.sum(acc, axis=1) / N + eps)
        for c in range(NUM_CHUNKS):
            cc = c * BLOCK_N + cols
            col_mask = cc < N
            mask = row_mask[:, None] & col_mask[None, :]
            if FUSED_ADD:
                # The stored (rounded) sum: the fp32 one is gone after pass one.
                x = tl.load(R + r_row + cc[None, :], mask=mask, other=0.0).to(tl.float32)
            else:
                x = tl.load(X + x_row + cc[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + cc, mask=col_mask, other=0.0).to(tl.float32) + WEIGHT_OFFSET
            y = x * rstd[:, None] * w[None, :]
            tl.store(Y + y_row + cc[None, :], y.to(Y.dtype.element_ty), mask=mask)

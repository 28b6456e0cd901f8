"""The gated-activation Triton kernel (launch.py launches it): a 2-D grid of (ROWS rows) x
(BLOCK_D columns) tiles; rows are addressed with a stride so that a 2-D input with padded
rows is read in place. ACT picks the activation (launch.py's _SILU, _GELU, _GELU_TANH).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__: list[str] = []


@triton.jit
def _gated_act_kernel(
    X,  # [n_rows, 2 * D] gate | up
    Y,  # [n_rows, D]
    n_rows,
    D,
    stride_x,
    stride_y,
    ACT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/pdl.py)
    COLS_FASTEST: tl.constexpr = False,  # grid axis 0 walks the columns, axis 1 the rows
):
    if COLS_FASTEST:
        # Programs launched one after another read one row band left to right: one
        # sequential stream, not a column block of many rows 2d elements apart.
        row_block, col_block = tl.program_id(1), tl.program_id(0)
    else:
        row_block, col_block = tl.program_id(0), tl.program_id(1)
    rows = row_block * ROWS + tl.arange(0, ROWS)
    cols = col_block * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    x_ptr = X + r64 * stride_x + cols[None, :]
    if USE_PDL:
        # The previous kernel may still be running: its writes are visible after the wait.
        tl.extra.cuda.gdc_wait()
    # Each element is read once: stream it through L2 without displacing other data.
    gate = tl.load(x_ptr, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    up = tl.load(x_ptr + D, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()  # inputs read: the next kernel may start
    if ACT == 0:
        # exp's argument is capped so that large negative gates give 0 without an inf.
        act = gate / (1.0 + tl.exp(tl.minimum(-gate, 80.0)))
    elif ACT == 1:
        act = 0.5 * gate * (1.0 + tl.math.erf(gate * 0.7071067811865476))
    else:
        # tanh(z) = 1 - 2 / (exp(2z) + 1): exact at both saturations (exp -> inf or 0).
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = 0.5 * gate * (2.0 - 2.0 / (tl.exp(tl.minimum(2.0 * z, 80.0)) + 1.0))
    tl.store(Y + r64 * stride_y + cols[None, :], (act * up).to(Y.dtype.element_ty), mask=mask)

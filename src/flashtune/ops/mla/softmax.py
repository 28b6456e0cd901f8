"""The online-softmax step the MLA kernels share (fp32, base 2): the paged kernel
(`kernels.mla_item`) and the ragged prefill kernel (`ragged.mla_ragged_kernel`)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["softmax_step"]


@triton.jit
def softmax_step(s, valid, m_i, l_i):
    """One KV tile's update of the rows' running max `m_i` and sum `l_i` [BLOCK_M]: s
    [BLOCK_M, BLOCK_N] fp32 scores in log2 units (scaled by sm_scale * log2(e)), `valid` the
    keys each row may see. Returns (p, alpha, m_new, l_new): the caller's accumulator becomes
    acc * alpha[:, None] + p @ v."""
    s = tl.where(valid, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row that has seen no key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new

"""K/V tiles in q's dtype inside the attention kernels (decode and prefill).

An fp8 cache (e4m3, e5m2) is read under fp16/bf16 queries. Its tiles go through fp32: both
conversions are exact (every e4m3 and e5m2 value is a bf16 and an fp16 value), and on sm_90
the direct fp8 -> f16 -> bf16 path costs one F2F.BF16.F16 per element, an instruction of the
slow conversion pipe (128 a thread for a 64 x 128 tile of the decode kernel), where through
fp32 it is HADD2.F32 and packed F2FP (`scripts/sass_decode.py`, no GPU needed).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["as_q_dtype"]


@triton.jit
def as_q_dtype(x, dtype: tl.constexpr):
    """The tile x in `dtype` (q's); a no-op when x has it."""
    if x.dtype.is_fp8():
        return x.to(tl.float32).to(dtype)
    else:
        return x.to(dtype)

"""Launch configurations of the RoPE kernel (kernels.py): the tactic, its search space and the
default (tactic -1)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

__all__ = ["RopeTactic", "default_tactic"]


@dataclass(frozen=True)
class RopeTactic:
    """BLOCK_H heads a program and its warps."""

    block_h: int
    num_warps: int

    @staticmethod
    def space(num_heads: int, head_size: int) -> list[RopeTactic]:
        cap = triton.next_power_of_2(max(num_heads, 1))
        out = []
        for block_h in (1, 2, 4, 8, 16, 32):
            if block_h > cap:
                continue
            for warps in (1, 2, 4, 8):
                per_thread = block_h * head_size / (32 * warps)
                if 4 <= per_thread <= 32 or (warps == 1 and per_thread < 4):
                    out.append(RopeTactic(block_h, warps))
        return out


def _pow2_floor(x: int) -> int:
    return 1 << (max(int(x), 1).bit_length() - 1)


@functools.lru_cache(maxsize=1024)
def default_tactic(num_heads: int, rotary_dim: int) -> RopeTactic:
    """~1K rotated elements and 4 warps a program, from the sweep of bench_elementwise.py on
    H200 (bf16, nnz 1..32768): rotary_dim 128 -> 8 heads / 4 warps was best or within 3% at
    every size (Llama); rotary_dim 64 -> 16 heads / 4 warps (MiniMax-M2), e.g. 34.8 us vs
    43.9 us for 8 heads in place at nnz 8192. Both counts are powers of two, as Triton needs."""
    block_h = min(
        triton.next_power_of_2(max(num_heads, 1)), _pow2_floor(1024 // max(rotary_dim, 1))
    )
    warps = max(1, min(8, _pow2_floor(block_h * rotary_dim // 256)))
    return RopeTactic(block_h, warps)

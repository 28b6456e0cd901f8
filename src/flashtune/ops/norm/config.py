"""Launch configurations of the RMSNorm kernel (kernels.py): the tactic, its search space and
the default (tactic -1)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

__all__ = ["MAX_SINGLE_BLOCK", "RMSNormTactic", "default_tactic"]

# Largest row kept in registers in one pass: 16384 fp32 values over 16 warps is 32 values a
# thread; beyond that register pressure spills, and the chunked two-pass kernel wins.
MAX_SINGLE_BLOCK = 16384


@dataclass(frozen=True)
class RMSNormTactic:
    """One launch configuration. block_n >= hidden means one pass (rows rows a program);
    block_n < hidden means the chunked two-pass kernel (rows must be 1)."""

    block_n: int
    rows: int
    num_warps: int

    @staticmethod
    def space(hidden: int) -> list[RMSNormTactic]:
        """Every tactic worth trying for this hidden size."""
        full = triton.next_power_of_2(hidden)
        out: list[RMSNormTactic] = []
        if full <= MAX_SINGLE_BLOCK:
            for rows in (1, 2, 4, 8, 16):
                if rows * full > 4 * MAX_SINGLE_BLOCK // 2 or (rows > 1 and full > 2048):
                    continue
                for warps in (1, 2, 4, 8, 16):
                    # Fewer than 1 or more than 64 values a thread is never competitive.
                    per_thread = rows * full / (32 * warps)
                    if 1 <= per_thread <= 64 or (warps == 1 and per_thread < 1):
                        out.append(RMSNormTactic(full, rows, warps))
        for block in (1024, 2048, 4096, 8192):
            if block < hidden:
                for warps in (4, 8, 16):
                    out.append(RMSNormTactic(block, 1, warps))
        return out


# Single-block warps for power-of-two rows, from the tactic sweep of bench_norm.py on H200
# (bf16, batch 1..16384): 2048 -> 4 warps, 4096 -> 8, 8192 -> 4 (64 values a thread; 16
# warps was 3-5% slower at batch >= 1024); 16384 -> 8 by the same rule.
_SINGLE_BLOCK_WARPS = {2048: 4, 4096: 8, 8192: 4, 16384: 8}


@functools.lru_cache(maxsize=4096)
def default_tactic(hidden: int, n_rows: int) -> RMSNormTactic:
    """The heuristic config, valid for any shape."""
    full = triton.next_power_of_2(hidden)
    if full > MAX_SINGLE_BLOCK:
        return RMSNormTactic(4096, 1, 16)
    if hidden >= 2048 and full > 1.25 * hidden and n_rows >= 1024:
        # Far from a power of two (5120 -> 8192 idles 37% of the lanes) and enough rows to be
        # bandwidth-bound: two passes over 2048-wide chunks, the second from L1/L2. H200,
        # hidden 5120: 23.4 us vs 30.0 us (one 8192 block, 16 warps) at batch 4096, 83 us vs
        # 111 us at 16384. Small batches are latency-bound and keep the single pass.
        return RMSNormTactic(2048, 1, 8)
    if full > 1.25 * hidden and full >= 8192:
        return RMSNormTactic(full, 1, 4)  # best single pass at batch 8..64, hidden 5120
    if full in _SINGLE_BLOCK_WARPS:
        return RMSNormTactic(full, 1, _SINGLE_BLOCK_WARPS[full])
    # Small rows: stack several a program, aiming at 8-16 values a thread (16 B vectors).
    rows = 1
    if full < 1024:
        rows = min(16, 2048 // full, triton.next_power_of_2(max(n_rows // 1024, 1)))
        rows = max(rows, 1)
    warps = max(1, min(16, rows * full // 512))
    return RMSNormTactic(full, rows, warps)

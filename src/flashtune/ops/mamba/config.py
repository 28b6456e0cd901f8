"""Launch configurations of the selective-state-update kernel (kernels.py): the tactic, its
search space and the default (tactic -1)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

__all__ = ["SSUTactic", "default_tactic"]

_BLOCK_DS = (4, 8, 16, 32, 64)
_WARPS = (1, 2, 4, 8)
# Programs wanted in flight before BLOCK_D stops shrinking: about four per SM of an H100 /
# H200 (132 SMs), so that small batches still spread the state over every SM.
_ENOUGH_PROGRAMS = 512


@dataclass(frozen=True)
class SSUTactic:
    """One launch configuration: block_d channels of one head per program (the whole dstate
    in each), num_warps warps."""

    block_d: int
    num_warps: int

    @staticmethod
    def space(dim: int, dstate: int) -> list[SSUTactic]:
        """Every tactic worth trying: tiles no wider than head_dim (rounded up to a power of
        two), 2 to 64 state elements a thread (fewer idles lanes, more spills)."""
        width = triton.next_power_of_2(dstate)
        top = max(_BLOCK_DS[0], triton.next_power_of_2(dim))
        out = []
        for block_d in _BLOCK_DS:
            if block_d > top:
                continue
            for warps in _WARPS:
                per_thread = block_d * width / (32 * warps)
                # 64 a thread of an 8192-element tile spills (BLOCK_D 64 x dstate 128 at 4
                # warps: 1484 bytes of spill stores, ptxas for sm_90a; smaller tiles at 64 a
                # thread do not: tests/ops/test_mamba.py's compile check).
                if per_thread == 64 and block_d * width >= 8192:
                    continue
                if 2 <= per_thread <= 64:
                    out.append(SSUTactic(block_d, warps))
        return out


@functools.lru_cache(maxsize=1024)
def default_tactic(batch: int, nheads: int, dim: int, dstate: int) -> SSUTactic:
    """The heuristic config, valid for any shape: the widest tile (up to 16 channels) that
    still gives _ENOUGH_PROGRAMS programs, 8-16 state elements a thread (16-byte bf16
    vectors along dstate). Not yet measured: `flashtune tune` or bench_mamba.py --sweep
    picks per shape on a GPU."""
    width = triton.next_power_of_2(dstate)
    block_d = min(16, triton.next_power_of_2(dim))
    while block_d > 4 and batch * nheads * triton.cdiv(dim, block_d) < _ENOUGH_PROGRAMS:
        block_d //= 2
    warps = max(1, min(8, block_d * width // (32 * 16)))
    return SSUTactic(block_d, warps)

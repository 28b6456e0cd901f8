"""Launch configurations of the gated-activation kernel (kernels.py): the tactic, its
search space and the default (tactic -1)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import triton

__all__ = ["ActivationTactic", "default_tactic"]


@dataclass(frozen=True)
class ActivationTactic:
    """A (rows x block_d) tile per program and its warps."""

    block_d: int
    rows: int
    num_warps: int
    # Launch the column blocks of a row band one after another (grid axis 0) instead of one
    # column block of many rows: the programs running at once then read one sequential
    # stream. Falls back to rows first past CUDA's 65535 row blocks on the grid's y axis.
    cols_fastest: bool = False

    @staticmethod
    def space(d: int) -> list[ActivationTactic]:
        cap = max(triton.next_power_of_2(max(d, 1)), 256)
        out = []
        for block_d in (256, 512, 1024, 2048, 4096):
            if block_d > cap:
                continue
            for rows in (1, 2, 4, 8):
                for warps in (4, 8, 16):
                    # 8..32 values a thread: one to four 16-byte vectors of each half. The
                    # default's 8 (two 16-byte loads in flight a thread, 6 KB a program) reads
                    # 3.9 TB/s on an H200 at 1k-16k tokens x 11008 where FlashInfer 0.7.2
                    # reads 4.2; 32 values (eight loads in flight, a quarter of the programs)
                    # compile to 36-38 registers without spills for sm_90 (not yet timed).
                    values = rows * block_d / (32 * warps)
                    if 8 <= values <= 32 and rows * block_d <= 16384:
                        out.append(ActivationTactic(block_d, rows, warps))
        return out + [replace(t, cols_fastest=True) for t in out]


# From 1k rows: the pick of the tuner's sweep re-measured in a fresh process at 4k and 16k
# tokens of d 11008 and 14336 (H200, session 21: 257 us at 16k x 11008 against 274 for the
# rows-first default below, FlashInfer 0.7.2 253), eight rows of 512 columns a program read
# column block after column block.
_MANY_ROWS = ActivationTactic(512, 8, 16, cols_fastest=True)


@functools.lru_cache(maxsize=4096)
def default_tactic(d: int, n_rows: int) -> ActivationTactic:
    if n_rows >= 1024 and d >= 512:
        return _MANY_ROWS
    block_d = min(triton.next_power_of_2(max(d, 1)), 1024)
    # Small d: stack rows so a program still moves a few KB.
    rows = max(1, min(8, 1024 // block_d, triton.next_power_of_2(max(n_rows, 1))))
    warps = max(1, min(8, rows * block_d // 256))
    return ActivationTactic(block_d, rows, warps)

"""Launch configurations of the sampling kernels (sampling_kernels.py): the tactic, its search
space and the default (tactic -1).

A tactic changes how a row is read (chunk width, rows a program, warps), never which token
a uniform draws but for the rounding of partial sums: the autotuner's check that a tactic
reproduces the default tactic's samples holds. The pivot count is not a tactic: it decides
the rejection rounds, and so which uniforms are drawn.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

from flashtune import platform

__all__ = ["PIVOTS", "SamplingTactic", "default_tactic", "chunk_count"]

# Thresholds tested per pass: the candidate and 3 more between it and the smallest value
# known to pass. FlashInfer tests 2 (its "dual pivot"); 4 narrows the interval 4-fold a
# round for 2 more compare-and-add per value. Not yet measured on a GPU.
PIVOTS = 4

# Elements of the [rows, PIVOTS, block] per-pivot accumulators one program keeps by default:
# ptxas -v for sm_90 (no GPU needed): ROWS=1, BLOCK=1024, 8 warps uses 40-128 registers a
# thread and never spills; ROWS=4, BLOCK=256 spills 44 bytes (4 warps) or 16 (8 warps) in
# the top-k-first kernel, the others not; BLOCK=4096, 16 warps spills 108 bytes there.
_MAX_TILE = 4096
# The interpreter's cost is per operation, not per element: many rows a program.
_MAX_TILE_INTERPRETED = 1 << 17


@dataclass(frozen=True)
class SamplingTactic:
    """`rows` rows a program, each read `block` values at a time, with `num_warps` warps."""

    block: int
    rows: int
    num_warps: int

    @staticmethod
    def space(vocab: int, batch: int) -> list[SamplingTactic]:
        """Every tactic worth trying for rows of `vocab` values (`batch` rows)."""
        full = triton.next_power_of_2(max(vocab, 1))
        out = []
        for block in (256, 512, 1024, 2048, 4096):
            if block > max(full, 256):
                continue
            for rows in (1, 2, 4, 8, 16):
                if rows > triton.next_power_of_2(max(batch, 1)) or rows * block > 4096:
                    continue
                if rows > 1 and block < full:
                    continue  # several rows a program only when each fits one chunk
                for warps in (4, 8, 16):
                    if rows * block >= 32 * warps:
                        out.append(SamplingTactic(block, rows, warps))
        return out


def chunk_count(vocab: int, block: int) -> int:
    """NCHUNK: the chunk sums a row keeps (a power of two, as Triton's shapes must be)."""
    return triton.next_power_of_2(max(triton.cdiv(vocab, block), 1))


@functools.lru_cache(maxsize=4096)
def default_tactic(vocab: int, batch: int) -> SamplingTactic:
    """The heuristic launch, valid for any shape. One row a program at LLM vocabularies
    (128k-262k values: 1024-wide chunks, 8 warps); small rows are stacked."""
    full = triton.next_power_of_2(max(vocab, 1))
    batch2 = triton.next_power_of_2(max(batch, 1))
    if platform.triton_interpret():
        block = min(full, 4096)
        rows = max(1, min(batch2, _MAX_TILE_INTERPRETED // (block * 4)))
        return SamplingTactic(block, rows, 4)
    block = min(full, 1024)
    rows = 1 if full > block else max(1, min(batch2, _MAX_TILE // (block * 4)))
    warps = 8 if rows * block >= 1024 else 4
    return SamplingTactic(block, rows, warps)

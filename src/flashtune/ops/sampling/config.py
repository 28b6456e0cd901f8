"""Launch configurations of the sampling kernels (kernels.py): the tactic, its search
space and the default (tactic -1).

A tactic changes how a row is read (chunk width, rows a program, warps, programs a row),
never which token a uniform draws but for the rounding of partial sums: the autotuner's
check that a tactic reproduces the default tactic's samples holds. The pivot count is not a
tactic: it decides the rejection rounds, and so which uniforms are drawn.

Split rows (`split` > 1, sampling only): at small batch one program a row leaves most SMs
idle, so each pass over a row is shared by `split` programs (split_kernels.py), for
`rounds` rejection rounds; rows still undecided then finish one program a row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

from flashtune import platform

__all__ = [
    "PIVOTS",
    "SPLIT_ROUNDS",
    "SamplingTactic",
    "default_tactic",
    "split_default",
    "split_block",
    "chunk_count",
]

# Thresholds tested per pass: the candidate and 3 more between it and the smallest value
# known to pass. FlashInfer tests 2 (its "dual pivot"); 4 narrows the interval 4-fold a
# round for 2 more compare-and-add per value. Not yet measured on a GPU.
PIVOTS = 4

# Rejection rounds a split row runs before the rows still undecided finish one program a
# row. A round after the first pass is usually enough (see kernels.py); a launch for
# rows already done costs a load per program. H100, top-p at vocab 128256 (bench_sampling
# --tactics): 2 rounds were within 5% of the best of 1/2/3/5 at batch 1, 16, 64 and 256,
# each round more cost ~1 us at batch 1 and ~2 us at batch 64; but a row still undecided
# after them costs a one-program pass (~140 us at vocab 262k; seen at batch 1 and 64
# there), so the default keeps two rounds in reserve.
SPLIT_ROUNDS = 4
# Programs the default split aims for at small batch: about four per SM of an H100 (132).
# H100, top-p at vocab 128256: the fastest split measured was 128 programs a row at batch 1,
# 32 at 16, 8 at 64 and 4 at 256 (then 1.6x faster than one program a row of 2048 chunks).
# 256 a row (vocab 152k and 262k at batch 1) was 2.5x slower than 128 at 128k: the cap.
_SPLIT_TARGET_PROGRAMS = 512
_SPLIT_MIN = 4
_SPLIT_MAX = 128
# Most chunk sums a row keeps in the split default (see split_block).
_SPLIT_MAX_NCHUNK = 256
# Largest batch (grid dimension 1 of the split kernels) a split tactic runs at.
_SPLIT_MAX_BATCH = 65535

# Elements of the [rows, PIVOTS, block] per-pivot accumulators one program keeps by default:
# ptxas -v for sm_90 (no GPU needed): ROWS=1, BLOCK=1024, 8 warps uses 40-128 registers a
# thread and never spills; ROWS=4, BLOCK=256 spills 44 bytes (4 warps) or 16 (8 warps) in
# the top-k-first kernel, the others not; BLOCK=4096, 16 warps spills 108 bytes there.
_MAX_TILE = 4096
# The interpreter's cost is per operation, not per element: many rows a program.
_MAX_TILE_INTERPRETED = 1 << 17


@dataclass(frozen=True)
class SamplingTactic:
    """`rows` rows a program, each read `block` values at a time, with `num_warps` warps;
    `split` > 1: each row's passes shared by that many programs for `rounds` rejection
    rounds (then `rows` rows a program finish the rows still undecided); `prefetch`: a pass
    loads the next chunk before reducing the current one (steps._scan)."""

    block: int
    rows: int
    num_warps: int
    split: int = 1
    rounds: int = 0
    prefetch: bool = True

    @staticmethod
    def space(vocab: int, batch: int, split: bool = False) -> list[SamplingTactic]:
        """Every tactic worth trying for rows of `vocab` values (`batch` rows); with `split`,
        the split-row tactics too (the sampling kernel has them, the others not)."""
        full = triton.next_power_of_2(max(vocab, 1))
        out = SamplingTactic.split_space(vocab, batch) if split else []
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

    @staticmethod
    def split_space(vocab: int, batch: int) -> list[SamplingTactic]:
        """The split-row tactics worth trying: up to ~4 programs an SM in all, at least a
        chunk a program, 1024- or 2048-wide chunks."""
        if batch > _SPLIT_MAX_BATCH:
            return []
        out = []
        for block in (1024, 2048):
            chunks = triton.cdiv(max(vocab, 1), block)
            split = 2
            while split <= min(_SPLIT_MAX, triton.next_power_of_2(chunks)):
                if batch * split <= 4 * _SPLIT_TARGET_PROGRAMS:
                    for warps in (4, 8):
                        out.append(SamplingTactic(block, 1, warps, split, SPLIT_ROUNDS))
                split *= 2
        return out


def split_default(vocab: int, batch: int, block: int) -> int:
    """Programs a row by default: enough for ~_SPLIT_TARGET_PROGRAMS in all, at least
    _SPLIT_MIN (a power of two, up to one a chunk; the last few may get none); 1 (no
    split) above batch _SPLIT_TARGET_PROGRAMS / 2, where it was not measured."""
    chunks = triton.cdiv(max(vocab, 1), block)
    if batch > _SPLIT_MAX_BATCH or 2 * batch > _SPLIT_TARGET_PROGRAMS or chunks < 8:
        return 1
    wanted = max(_SPLIT_MIN, triton.next_power_of_2(triton.cdiv(_SPLIT_TARGET_PROGRAMS, batch)))
    return max(1, min(wanted, _SPLIT_MAX, triton.next_power_of_2(chunks)))


def chunk_count(vocab: int, block: int) -> int:
    """NCHUNK: the chunk sums a row keeps (a power of two, as Triton's shapes must be)."""
    return triton.next_power_of_2(max(triton.cdiv(vocab, block), 1))


@functools.lru_cache(maxsize=4096)
def default_tactic(vocab: int, batch: int, split: bool = False) -> SamplingTactic:
    """The heuristic launch, valid for any shape. One row a program at LLM vocabularies
    (128k-262k values: 1024-wide chunks, 8 warps); small rows are stacked. With `split`
    (the sampling kernel), a small batch of long rows spreads each row over several
    programs (`split_default`); never in the interpreter (its cost is per operation)."""
    full = triton.next_power_of_2(max(vocab, 1))
    batch2 = triton.next_power_of_2(max(batch, 1))
    if platform.triton_interpret():
        block = min(full, 4096)
        rows = max(1, min(batch2, _MAX_TILE_INTERPRETED // (block * 4)))
        return SamplingTactic(block, rows, 4)
    block = min(full, 1024)
    rows = 1 if full > block else max(1, min(batch2, _MAX_TILE // (block * 4)))
    warps = 8 if rows * block >= 1024 else 4
    sblock = split_block(vocab)
    programs = split_default(vocab, batch, sblock) if split else 1
    if programs > 1:
        # 4 warps: ptxas -v (sm_90, BLOCK=1024, SPLIT=128) gives split_round_kernel 80
        # (min-p) to 255 registers a thread with 4 warps, 72 to 255 with 8 (207 for plain
        # and top-p), no spills: twice the threads cost a second CTA an SM.
        return SamplingTactic(sblock, 1, 4, programs, SPLIT_ROUNDS)
    return SamplingTactic(block, rows, warps)


def split_block(vocab: int) -> int:
    """The chunk width of the split default: 1024, or wider while a row would have more
    than _SPLIT_MAX_NCHUNK chunk sums. ptxas -v (sm_90, top-p, 4 warps): split_round_kernel
    keeps its [PIVOTS, NCHUNK] sums in registers and spills 228 bytes at vocab 262208 in
    1024-wide chunks (NCHUNK 512), none in 2048-wide ones (NCHUNK 256); on the H100 the
    1024-wide split at that vocab ran 0.5-0.9x FlashInfer wherever a row needed a split
    round, 3.5-5x where none did, and the 2048-wide one 1.4-5.3x at every batch (top-p at
    batch 256: 755 us before, 227 us after; FlashInfer 362 us)."""
    block = 1024
    while chunk_count(vocab, block) > _SPLIT_MAX_NCHUNK and block < 4096:
        block *= 2
    return block

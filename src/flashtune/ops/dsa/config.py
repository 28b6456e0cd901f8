"""DSA's launch tactics: frozen, with the search space benchmarks/bench_dsa.py --sweep times.

Defaults are first guesses from MLA's measured decode tactics (config of ops.mla: 16 rows of
bf16 against [BLOCK_N, 512] latent tiles want 8 warps, 64-token tiles; at 4 warps the
[16, 512] fp32 accumulator spills), not yet measured for DSA's gathered rows on an H200:
`bench_dsa.py --sweep` prints the timings to pick from.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ATTENTION_CANDIDATES",
    "AttentionTactic",
    "DEFAULT_ATTENTION",
    "DEFAULT_INDEXER",
    "INDEXER_CANDIDATES",
    "IndexerTactic",
    "splits_for",
]


@dataclass(frozen=True)
class AttentionTactic:
    """Sparse attention: slots per tile, warps, pipeline stages, and the programs to aim for
    per SM when splitting a token's topk slots (split-K: a decode batch of a few tokens
    would otherwise run a few programs on a 132-SM GPU)."""

    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2
    programs_per_sm: int = 2
    min_split_tiles: int = 2  # a split's fewest tiles: fewer and the merge reads more


@dataclass(frozen=True)
class IndexerTactic:
    """Indexer scores: tokens per tile, tokens per program (its tiles share one q load),
    warps, pipeline stages."""

    block_n: int = 64
    chunk: int = 512
    num_warps: int = 4
    num_stages: int = 2


DEFAULT_ATTENTION = AttentionTactic()
DEFAULT_INDEXER = IndexerTactic()

ATTENTION_CANDIDATES: tuple[AttentionTactic, ...] = tuple(
    AttentionTactic(n, w, s, p, m)
    for n in (32, 64)
    for w in (4, 8)
    for s in (2, 3)
    for p in (1, 2, 4)
    for m in (1, 2, 4)
)
INDEXER_CANDIDATES: tuple[IndexerTactic, ...] = tuple(
    IndexerTactic(n, c, w, s)
    for n in (32, 64, 128)
    for c in (256, 1024, 4096)
    for w in (4, 8)
    for s in (2, 3)
    if c >= n
)


def splits_for(tokens: int, topk: int, tactic: AttentionTactic, sm_count: int) -> int:
    """How many splits of a token's topk slots: enough programs to fill the GPU
    (tokens * splits >= programs_per_sm * sm_count), a power of two, each split at least
    min_split_tiles tiles of slots (fewer and the merge reads more than the split spreads:
    a split's partial output is H x 512 fp32, 32 KB at 16 heads, its tiles' rows 73 KB)."""
    programs_per_sm = tactic.programs_per_sm
    most = max(1, topk // (tactic.min_split_tiles * tactic.block_n))
    splits = 1
    while splits < most and tokens * splits < programs_per_sm * sm_count:
        splits *= 2
    return min(splits, most)

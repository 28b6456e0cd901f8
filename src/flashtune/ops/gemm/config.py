"""Launch configurations of the GEMM kernels (kernels.py), in one place.

Tactics are frozen dataclasses; each kernel's search space is a frozen dataclass too, whose
iteration yields every tactic of the product (`TiledSpace`, `SmallMSpace`). The pruned lists
the tuner tries per shape (`tiled_candidates`, `small_m_candidates`) and the default tactics
(tactic -1) live here as well. Hardware facts (SM count, shared memory) come from
`flashtune.platform.device_limits`, passed in by the runners.

Runners hand out plain tuples (JSON-friendly for the tuner's cache) and accept either form
back (`as_tactic`, `from_tactic`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass

from flashtune.tune import Tactic

__all__ = [
    "SMALL_M",
    "TiledTactic",
    "TiledSpace",
    "SmallMTactic",
    "SmallMSpace",
    "split_k_ok",
    "split_candidates",
    "wave_split",
    "wave_splits",
    "tiled_default_tactic",
    "tiled_candidates",
    "small_m_default_tactic",
    "small_m_candidates",
]

# The decode regime the small-M kernel is built for (one 16-row MMA tile).
SMALL_M = 16


def _pow2_round(x: float) -> int:
    """The power of two nearest to x (in log scale), at least 1."""
    return 1 << max(0, round(math.log2(max(x, 1.0))))


@dataclass(frozen=True)
class TiledTactic:
    """One configuration of the tiled kernel."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    split_k: int = 1
    num_warps: int = 8
    num_stages: int = 3

    def smem_bytes(self, elem_size: int) -> int:
        return (self.block_m + self.block_n) * self.block_k * elem_size * self.num_stages

    def as_tactic(self) -> tuple[int, ...]:
        return astuple(self)

    @classmethod
    def from_tactic(cls, tactic: Tactic) -> TiledTactic:
        return tactic if isinstance(tactic, cls) else cls(*tactic)  # type: ignore[misc]


@dataclass(frozen=True)
class TiledSpace:
    """The tiled kernel's search space: iterating yields every TiledTactic of the product."""

    block_m: tuple[int, ...] = (16, 32, 64, 128, 256)
    block_n: tuple[int, ...] = (32, 64, 128, 256)
    block_k: tuple[int, ...] = (32, 64, 128)
    group_m: tuple[int, ...] = (1, 8)
    split_k: tuple[int, ...] = (1, 2, 4, 8, 16)
    num_warps: tuple[int, ...] = (4, 8)
    num_stages: tuple[int, ...] = (2, 3, 4, 5)

    def __iter__(self) -> Iterator[TiledTactic]:
        for values in itertools.product(
            self.block_m,
            self.block_n,
            self.block_k,
            self.group_m,
            self.split_k,
            self.num_warps,
            self.num_stages,
        ):
            yield TiledTactic(*values)


@dataclass(frozen=True)
class SmallMTactic:
    """One configuration of the small-M kernel. block_m >= 16 uses the tensor cores (swap-AB),
    block_m < 16 an FMA reduction. stream_k > 0: the stream-K schedule with that many
    programs per SM (split_k unused; M must fit in block_m), else a split-K grid."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    stream_k: int = 0

    def as_tactic(self) -> tuple[int, ...]:
        # Split-K tactics stay 6-tuples, as before stream_k existed: cached picks still match.
        values = astuple(self)
        return values if self.stream_k else values[:-1]

    @classmethod
    def from_tactic(cls, tactic: Tactic) -> SmallMTactic:
        return tactic if isinstance(tactic, cls) else cls(*tactic)  # type: ignore[misc]

    def fma_registers(self) -> int:
        """fp32 accumulator registers per thread of the FMA path."""
        return self.block_m * self.block_n * self.block_k // (32 * self.num_warps)


@dataclass(frozen=True)
class SmallMSpace:
    """The small-M kernel's search space: iterating yields every SmallMTactic of the product
    whose FMA accumulator fits in registers."""

    block_m: tuple[int, ...] = (1, 2, 4, 16)
    block_n: tuple[int, ...] = (16, 32, 64, 128)
    block_k: tuple[int, ...] = (64, 128, 256, 512)
    split_k: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    num_warps: tuple[int, ...] = (2, 4, 8)
    num_stages: tuple[int, ...] = (2, 3, 4, 5)
    stream_k: tuple[int, ...] = (0, 1, 2, 3, 4)

    def __iter__(self) -> Iterator[SmallMTactic]:
        for values in itertools.product(
            self.block_m,
            self.block_n,
            self.block_k,
            self.split_k,
            self.num_warps,
            self.num_stages,
            self.stream_k,
        ):
            t = SmallMTactic(*values)
            if t.block_m < 16 and t.fma_registers() > 64:
                continue
            if t.stream_k and t.split_k != 1:
                continue  # stream-K ignores split_k: one representative
            yield t


# Workspace cap for split-K partials: beyond this, splitting costs more traffic than it saves.
MAX_WORKSPACE_BYTES = 256 * 2**20


def split_k_ok(M: int, N: int, K: int, block_k: int, split_k: int) -> bool:
    """Whether K splits `split_k` ways: at least one K tile per split, partials within the
    workspace cap."""
    if split_k == 1:
        return True
    k_tiles = math.ceil(K / block_k)
    return split_k <= k_tiles and split_k * M * N * 4 <= MAX_WORKSPACE_BYTES


def split_candidates(ctas: int, k_tiles: int, sms: int, waves: Sequence[float]) -> list[int]:
    """Split-K factors that bring `ctas` output tiles to about `waves` x the SM count, each
    split keeping at least two K tiles (fewer and the pipeline never fills). Any integer:
    SPLIT_K is a runtime argument, and 3 or 5 often balances the SMs where 2 or 4 leave a
    tail (H200, M=1, N=28672: 448 tiles of 64 rows)."""
    out = []
    cap = min(64, max(1, k_tiles // 2))
    for w in waves:
        target = w * sms / max(ctas, 1)
        # The power of two too: the first tuned picks (bundled configs) used those.
        for s in (round(target), _pow2_round(target)):
            s = max(1, min(s, cap))
            if s not in out:
                out.append(s)
    return out


def wave_split(ctas: int, rows: int, N: int, K: int, block_k: int, sms: int, waves: float) -> int:
    """The split-K factor that brings `ctas` output tiles to about `waves` x the SM count,
    or 1 where its partials ([`rows`, N]) would not fit (`split_k_ok`)."""
    split = split_candidates(ctas, math.ceil(K / block_k), sms, (waves,))[0]
    return split if split_k_ok(rows, N, K, block_k, split) else 1


def wave_splits(
    shapes: Sequence[tuple[int, int, int, int, int]],
    M: int,
    N: int,
    K: int,
    sms: int,
    batch: int = 1,
) -> Iterator[tuple[int, int, int, int, int, int]]:
    """(block_m, block_n, block_k, split_k, num_warps, num_stages) for each (block_m,
    block_n, block_k, num_warps, num_stages) of `shapes`, with each split-K factor that
    brings its output tiles (`batch` x M x N) to one or two waves; no split where the tiles
    already fill the SMs (splitting only adds traffic)."""
    for bm, bn, bk, warps, stages in shapes:
        ctas = batch * math.ceil(M / bm) * math.ceil(N / bn)
        for split in split_candidates(ctas, math.ceil(K / bk), sms, (1.0, 2.0)):
            if ctas >= sms and split > 1:
                continue  # already a full wave: splitting only adds traffic
            yield bm, bn, bk, split, warps, stages


def tiled_default_tactic(M: int, N: int, K: int) -> TiledTactic:
    """Tactic -1 of the tiled kernel, valid for any shape."""
    if M > 64:
        return TiledTactic(128, 128, 64, 8, 1, 8, 3)
    bm = max(16, 1 << (max(M, 1) - 1).bit_length())
    return TiledTactic(bm, 128, 64, 8, 1, 4, 4)


def tiled_candidates(M: int, N: int, K: int, sms: int) -> list[TiledTactic]:
    """The tiled tactics the tuner tries at (M, N, K) on `sms` SMs: about a dozen
    configurations known to be good on Hopper, each with the split-K factors that fill the
    SMs."""
    if M >= 256:
        shapes = [
            (128, 256, 64, 8, 3),
            (128, 128, 64, 8, 3),
            (128, 128, 64, 4, 4),
            (256, 128, 64, 8, 3),
            (64, 256, 64, 4, 4),
            (128, 128, 128, 8, 3),
        ]
    elif M > 64:
        shapes = [
            (64, 128, 64, 4, 4),
            (128, 128, 64, 8, 3),
            (64, 256, 64, 8, 3),
            (128, 64, 64, 4, 4),
            (64, 64, 128, 4, 4),
        ]
    else:
        bm = max(16, 1 << (max(M, 1) - 1).bit_length())
        shapes = [
            (bm, 64, 128, 4, 4),
            (bm, 128, 64, 4, 4),
            (bm, 128, 128, 4, 3),
            (bm, 256, 64, 8, 3),
        ]
    out = [
        TiledTactic(bm, bn, bk, 8, split, warps, stages)
        for bm, bn, bk, split, warps, stages in wave_splits(shapes, M, N, K, sms)
    ]
    return list(dict.fromkeys(out))


def small_m_default_tactic(M: int, N: int, K: int, sms: int) -> SmallMTactic:
    """Tactic -1 of the small-M kernel on `sms` SMs."""
    # The most frequent winner of benchmarks/bench_gemm.py at M <= 16 on an H200
    # (91 of 162 shapes: 64 x 128 tiles, 3-5 stages), split to about two waves.
    block_n, block_k = 64, 128
    ctas = math.ceil(N / block_n) * math.ceil(M / 16)
    split = wave_split(ctas, M, N, K, block_k, sms, 2.0)
    return SmallMTactic(16, block_n, block_k, split, 4, 5)


def small_m_candidates(M: int, N: int, K: int, sms: int) -> list[SmallMTactic]:
    """The small-M tactics the tuner tries at (M, N, K) on `sms` SMs."""
    # (block_m, block_n, block_k, num_warps, num_stages): dot tiles moving 8-32 KB of B
    # per stage; FMA tiles for one to four rows (they won at M=1 for N*K near 20 MB).
    shapes = [
        (16, 64, 128, 4, 3),
        (16, 64, 128, 4, 4),
        (16, 64, 128, 4, 5),
        (16, 32, 256, 4, 3),
        (16, 128, 128, 4, 3),
        (16, 64, 256, 4, 4),
        (16, 32, 128, 4, 4),
        (16, 128, 128, 8, 4),
    ]
    if M == 1:
        shapes += [
            (1, 16, 512, 4, 3),
            (1, 16, 512, 4, 4),
            (1, 32, 256, 4, 3),
            (1, 16, 256, 4, 3),
            (1, 32, 512, 8, 3),
        ]
    elif M == 2:
        shapes += [(2, 16, 256, 4, 3), (2, 32, 256, 8, 3)]
    elif M <= 4:
        shapes += [(4, 16, 256, 8, 3), (4, 16, 128, 4, 3)]
    out = []
    for bm, bn, bk, warps, stages in shapes:
        ctas = math.ceil(M / bm) * math.ceil(N / bn)
        k_tiles = math.ceil(K / bk)
        splits = split_candidates(ctas, k_tiles, sms, (1.0, 2.0, 3.0, 4.0, 6.0))
        if ctas > sms:  # beyond one wave, small splits balance the tail
            splits += [s for s in (1, 2, 3) if s not in splits and s <= k_tiles // 2]
        for split in splits:
            out.append(SmallMTactic(bm, bn, bk, split, warps, stages))
    # Stream-K: equal work per SM whatever the tile count (1-4 programs per SM).
    if M <= SMALL_M:
        sk_shapes = [(16, 64, 128, 4, 4), (16, 32, 256, 4, 3), (16, 128, 128, 8, 4)]
        if M == 1:
            sk_shapes += [(1, 16, 512, 4, 3)]
        for bm, bn, bk, warps, stages in sk_shapes:
            for per_sm in (1, 2, 3, 4):
                out.append(SmallMTactic(bm, bn, bk, 1, warps, stages, per_sm))
    return list(dict.fromkeys(out))

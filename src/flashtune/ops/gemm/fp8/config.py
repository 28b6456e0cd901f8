"""Launch configurations of the fp8 GEMM kernel (kernels.py): the tactic, its search space,
the pruned candidates the tuner tries per shape and the default tactic (-1).

Runners hand out plain tuples (JSON-friendly for the tuner's cache) and accept either form
back (`Fp8Tactic.from_tactic`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import astuple, dataclass, replace

from flashtune.ops.gemm.config import split_k_ok, wave_split, wave_splits
from flashtune.tune import Tactic

__all__ = [
    "Fp8Tactic",
    "Fp8Space",
    "TAIL_SPLIT",
    "STREAM_K",
    "fp8_default_tactic",
    "fp8_candidates",
    "tactic_fits",
    "tail_layout",
    "tail_splits",
    "stream_k_layout",
    "stream_k_splits",
]

# Fp8Tactic.tail's values: 0 no split or a split-K grid, TAIL_SPLIT the tail split, STREAM_K
# the stream-K schedule.
TAIL_SPLIT = 1
STREAM_K = 2
# Stream-K programs per SM a tactic may ask for. The schedule's point is one even wave; a
# second program an SM can hide load latency where two tiles' stages fit, more only add
# workspace and fixups (unmeasured).
MAX_STREAM_K_PER_SM = 2


@dataclass(frozen=True)
class Fp8Tactic:
    """One configuration of the fp8 kernel."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    group_m: int = 8
    split_k: int = 1
    num_warps: int = 8
    num_stages: int = 3
    # TAIL_SPLIT (1): split_k applies to the tail tiles only (the last, partial wave of
    # output tiles on the SMs: kernels.py's TAIL); the full waves compute whole tiles.
    # STREAM_K (2): the stream-K schedule (kernels.py's _fp8_gemm_streamk_kernel) on split_k
    # programs per SM; split_k is then that multiplier, not a split of K.
    tail: int = 0

    def __post_init__(self) -> None:
        if self.tail not in (0, TAIL_SPLIT, STREAM_K):
            raise ValueError(
                f"Fp8Tactic.tail must be 0, {TAIL_SPLIT} (tail split) or {STREAM_K} "
                f"(stream-K), got {self.tail}"
            )
        if self.split_k < 1:
            raise ValueError(f"Fp8Tactic.split_k must be at least 1, got {self.split_k}")

    @property
    def stream_k(self) -> bool:
        """Whether this is a stream-K tactic (split_k programs per SM)."""
        return self.tail == STREAM_K

    def smem_bytes(self) -> int:
        # fp8 operands: one byte an element, both tiles per pipeline stage.
        return (self.block_m + self.block_n) * self.block_k * self.num_stages

    def as_tactic(self) -> tuple[int, ...]:
        # Seven ints without a tail split or stream-K: the form caches written before they
        # existed hold.
        values = astuple(self)
        return values if self.tail else values[:7]

    @classmethod
    def from_tactic(cls, tactic: Tactic) -> Fp8Tactic:
        if isinstance(tactic, cls):
            return tactic
        values: tuple[int, ...] = tuple(tactic)  # type: ignore[arg-type]
        if len(values) not in (7, 8):
            raise ValueError(
                "an fp8 tactic is an Fp8Tactic or 7 ints (block_m, block_n, block_k, "
                "group_m, split_k, num_warps, num_stages) and an optional schedule "
                f"({TAIL_SPLIT}: tail split, {STREAM_K}: stream-K), got "
                f"{tactic!r}"
            )
        return cls(*values)


@dataclass(frozen=True)
class Fp8Space:
    """The kernel's whole search space (the tuner's exhaustive mode)."""

    block_m: tuple[int, ...] = (16, 32, 64, 128, 256)
    block_n: tuple[int, ...] = (32, 64, 128, 256)
    block_k: tuple[int, ...] = (64, 128)
    group_m: tuple[int, ...] = (1, 8)
    split_k: tuple[int, ...] = (1, 2, 4, 8, 16)
    num_warps: tuple[int, ...] = (4, 8)
    num_stages: tuple[int, ...] = (2, 3, 4, 5)
    tail: tuple[int, ...] = (0, TAIL_SPLIT, STREAM_K)

    def __iter__(self) -> Iterator[Fp8Tactic]:
        for values in itertools.product(
            self.block_m,
            self.block_n,
            self.block_k,
            self.group_m,
            self.split_k,
            self.num_warps,
            self.num_stages,
            self.tail,
        ):
            if values[-1] == TAIL_SPLIT and values[4] == 1:
                continue  # a tail split of one part is the plain tactic
            if values[-1] == STREAM_K and values[4] > MAX_STREAM_K_PER_SM:
                continue
            yield Fp8Tactic(*values)


def tactic_fits(
    t: Fp8Tactic, scale_block_k: int | None, smem: int, rows: int, N: int, K: int
) -> bool:
    """Whether `t` can run: its stages fit in shared memory, with block scales its K step
    divides the scale block along K (each step is scaled by one K block's scales), and a
    split of K has a K tile per split and partials ([batch * M, N] `rows`) within the
    workspace cap; stream-K at most MAX_STREAM_K_PER_SM programs an SM."""
    if t.smem_bytes() > smem:
        return False
    if scale_block_k is not None and scale_block_k % t.block_k:
        return False
    if t.stream_k:
        # Its workspace is two tiles a program, not [split, M, N]: bounded by the SM count.
        return t.split_k <= MAX_STREAM_K_PER_SM
    return split_k_ok(rows, N, K, t.block_k, t.split_k)


def _block_m_for(M: int) -> int:
    """The smallest MMA-friendly row tile (16..64) holding M rows."""
    return min(64, max(16, 1 << (max(M, 1) - 1).bit_length()))


# The per-tensor large-M tile: the selected-then-re-measured best at M=4096 on all 8 shapes of
# bench_gemm_fp8 (H200: DeepSeek-V3 TP8 and Llama-3.1-8B layers; e.g. N=4608 K=7168 205 us
# against 276 for 128x128). Its 144 KiB of stages need a Hopper-class shared memory.
_LARGE_TENSOR = Fp8Tactic(128, 256, 128, 8, 1, 8, 3)
_LARGE = Fp8Tactic(128, 128, 128, 8, 1, 8, 3)
# 64 < M < 256: the re-measured best at M=128 on 7 of 8 shapes for per-tensor scales and 5 of
# 8 for block scales (e.g. N=1536 K=7168 11.3 us against 28.2 for the 128x128 tile that was
# the default), K split to one wave of output tiles (the measured splits: 2, 7, 1, 1, 1, 1, 2).
_MEDIUM = Fp8Tactic(64, 64, 128, 8, 1, 4, 5)


def fp8_default_tactic(
    M: int,
    N: int,
    K: int,
    sms: int,
    batch: int = 1,
    *,
    block_scaled: bool = False,
    smem: int | None = None,
) -> Fp8Tactic:
    """Tactic -1 on `sms` SMs, valid for any shape (block_k 128 divides DeepSeek's 128-wide
    scale blocks; wider K steps halve the loop count of the 1-byte operands). Fewer output
    tiles than SMs split K, to about one wave at medium M and two at decode sizes, as the
    bf16 decode GEMM's default. `smem` (bytes a block may use; None: assume Hopper's) keeps
    the large per-tensor tile off smaller GPUs."""
    if M >= 256:
        wide_ok = smem is None or _LARGE_TENSOR.smem_bytes() <= smem
        return _LARGE_TENSOR if not block_scaled and wide_ok else _LARGE
    if M > 64:
        return _split_to_waves(_MEDIUM, M, N, K, sms, batch, 1.0)
    t = Fp8Tactic(_block_m_for(M), 64, 128, 8, 1, 4, 4)
    return _split_to_waves(t, M, N, K, sms, batch, 2.0)


def _split_to_waves(
    t: Fp8Tactic, M: int, N: int, K: int, sms: int, batch: int, waves: float
) -> Fp8Tactic:
    """`t` with K split so its output tiles fill about `waves` waves of the SMs (unchanged
    when they already fill one, or where the split's partials would not fit)."""
    ctas = batch * math.ceil(M / t.block_m) * math.ceil(N / t.block_n)
    if ctas >= sms:
        return t
    return replace(t, split_k=wave_split(ctas, batch * M, N, K, t.block_k, sms, waves))


def fp8_candidates(
    M: int, N: int, K: int, sms: int, batch: int = 1, *, per_tensor: bool = False
) -> list[Fp8Tactic]:
    """The tactics the tuner tries at (M, N, K) on `sms` SMs: tiles known to suit fp8 MMAs
    on Hopper (128-wide K steps; narrower N tiles at small M, where B's bytes bound the
    time), each with the split-K factors that bring the output tiles to one or two waves.
    `per_tensor` (no scale blocks along K): also 256-wide K steps (half the loop trips and
    barriers a tile, the gap at M = 128 where loads and MMAs must overlap; unmeasured).
    Tail splits and stream-K schedules (`tail_splits`, `stream_k_splits`) where the output
    tiles load the SMs unevenly."""
    shapes = _candidate_shapes(M)
    if per_tensor:
        shapes += _wide_k_shapes(M)
    out = [fp8_default_tactic(M, N, K, sms, batch)]
    out += [
        Fp8Tactic(bm, bn, bk, 8, split, warps, stages)
        for bm, bn, bk, split, warps, stages in wave_splits(shapes, M, N, K, sms, batch)
    ]
    out += [
        Fp8Tactic(bm, bn, bk, 8, split, warps, stages, tail=TAIL_SPLIT)
        for bm, bn, bk, split, warps, stages in tail_splits(shapes, M, N, K, sms, batch)
    ]
    # Stream-K: the default's tile first (the measured best where the tiles divide evenly).
    # Block scales: at most 64 accumulator values a thread (128x128 on 8 warps), since the
    # accumulator and the scaled partial product of a step are live together: 128x256 and
    # 256x128 spill 104-664 bytes a thread on sm_90, and 128x128 on 4 warps ran 5-10x
    # slower on an H200 (data-parallel and stream-K alike).
    d = fp8_default_tactic(M, N, K, sms, batch, block_scaled=not per_tensor)
    sk_shapes = [(d.block_m, d.block_n, d.block_k, d.num_warps, d.num_stages), *shapes]
    sk_shapes = [s for s in sk_shapes if per_tensor or s[0] * s[1] <= 64 * 32 * s[3]]
    out += [
        Fp8Tactic(bm, bn, bk, 8, per_sm, warps, stages, tail=STREAM_K)
        for bm, bn, bk, per_sm, warps, stages in stream_k_splits(sk_shapes, M, N, K, sms, batch)
    ]
    return list(dict.fromkeys(out))


def tail_layout(num_tiles: int, sms: int, split: int) -> tuple[int, int]:
    """(whole tiles, programs) of a tail-split launch: the full waves of `num_tiles` output
    tiles on `sms` SMs are computed whole, the last partial wave's tiles in `split` parts."""
    whole = num_tiles // sms * sms
    return whole, whole + (num_tiles - whole) * split


def tail_splits(
    shapes: list[tuple[int, int, int, int, int]], M: int, N: int, K: int, sms: int, batch: int
) -> Iterator[tuple[int, int, int, int, int, int]]:
    """(block_m, block_n, block_k, split, num_warps, num_stages) with a tail split for each
    of `shapes` whose output tiles fill at least one wave and leave a last wave under
    three-quarters full (its SMs then idle for a quarter of a tile or more): splits that
    spread the tail's K steps over about all the SMs, or half of them, in even parts."""
    if batch != 1:
        return
    for bm, bn, bk, warps, stages in shapes:
        tiles = math.ceil(M / bm) * math.ceil(N / bn)
        tail = tiles % sms
        if tiles < sms or not tail or tail * 4 > sms * 3:
            continue
        k_tiles = math.ceil(K / bk)
        seen = set()
        for target in (sms / tail, sms / (2 * tail)):
            split = max(2, min(round(target), k_tiles // 2))
            split = math.ceil(k_tiles / math.ceil(k_tiles / split))  # even parts
            if split >= 2 and split not in seen and split_k_ok(M, N, K, bk, split):
                seen.add(split)
                yield bm, bn, bk, split, warps, stages


def stream_k_layout(tiles: int, k_steps: int, programs: int) -> tuple[int, int]:
    """(iterations a program, programs launched) of a stream-K launch of `tiles` output tiles
    of `k_steps` K steps each on `programs` programs: the tiles x k_steps iterations in
    equal contiguous ranges; programs whose range would be empty are not launched."""
    total = tiles * k_steps
    iters = math.ceil(total / max(1, min(programs, total)))
    return iters, math.ceil(total / iters)


# Stream-K candidates a shape gets at most: each costs a tuning run.
_MAX_STREAM_K = 4
# A Hopper SM's shared memory: stream-K with two programs an SM only where both fit.
_SMEM_PER_SM = 228 * 1024


def stream_k_splits(
    shapes: list[tuple[int, int, int, int, int]], M: int, N: int, K: int, sms: int, batch: int
) -> Iterator[tuple[int, int, int, int, int, int]]:
    """(block_m, block_n, block_k, programs per SM, num_warps, num_stages) of stream-K
    candidates, at most _MAX_STREAM_K: one program an SM for the first three of `shapes`
    (in order, duplicates skipped) whose output tiles leave the SMs unevenly loaded (fewer
    tiles than SMs, or a last wave under 80% full) in at most two waves, and two an SM for
    the first of those whose stages fit twice in an SM (more warps to hide the latency of
    the loads where B's bytes bound the time). None for a batch, and none where K is one
    step (no K range to share).

    H200, per-tensor scales (cold L2): M=1024 x N=1536 x K=7168 (96 tiles of 128x128) 32.4
    us against 37.4 for the default; M=4096 x N=576 (96 tiles of 128x256) 53 against 38
    and M=128 x N=4608 (144 tiles of 64x64) 22-24 against 18: there the data-parallel
    kernel on 96 or 132 SMs already keeps something they share busy (stream-K without its
    fixup ran 36.7 and 20.8 us); M=4096 x N=4608 (4.4 waves of 128x256) 273 against 226,
    hence the two-wave bound."""
    if batch != 1:
        return
    picked: list[tuple[int, int, int, int, int]] = []
    for shape in dict.fromkeys(shapes):
        bm, bn, bk, _warps, _stages = shape
        tiles = math.ceil(M / bm) * math.ceil(N / bn)
        last_wave = tiles % sms
        uneven = tiles < sms or (tiles <= 2 * sms and last_wave and last_wave < 0.8 * sms)
        if uneven and math.ceil(K / bk) >= 2:
            picked.append(shape)
    out = [(bm, bn, bk, 1, warps, stages) for bm, bn, bk, warps, stages in picked[:3]]
    for bm, bn, bk, warps, stages in picked:
        if 2 * (bm + bn) * bk * stages <= _SMEM_PER_SM:
            out.append((bm, bn, bk, 2, warps, stages))
            break
    yield from out[:_MAX_STREAM_K]


def _wide_k_shapes(M: int) -> list[tuple[int, int, int, int, int]]:
    """fp8_candidates' tiles with 256-wide K steps (per-tensor scales only: a step must not
    straddle a 128-wide scale block)."""
    if M >= 256:
        return [(128, 128, 256, 8, 3)]
    if M > 64:
        return [(64, 64, 256, 4, 4), (64, 128, 256, 4, 3), (128, 64, 256, 8, 3)]
    bm = _block_m_for(M)
    return [(bm, 64, 256, 4, 4), (bm, 128, 256, 4, 3)]


def _candidate_shapes(M: int) -> list[tuple[int, int, int, int, int]]:
    """fp8_candidates' tiles for M (block_m, block_n, block_k, num_warps, num_stages)."""
    if M >= 256:
        shapes = [
            (128, 128, 128, 8, 3),
            (128, 256, 128, 8, 3),
            (256, 128, 128, 8, 3),
            (128, 128, 64, 4, 4),
            (64, 256, 128, 4, 3),
            (128, 64, 128, 4, 4),
        ]
    elif M > 64:
        shapes = [
            (64, 128, 128, 4, 4),
            (128, 128, 128, 8, 3),
            (64, 256, 128, 8, 3),
            (128, 64, 128, 4, 4),
            (64, 64, 128, 4, 5),
            # every row in one tile: A's rows are read from L2 once per N tile, not twice
            (128, 32, 128, 4, 4),
        ]
    else:
        bm = _block_m_for(M)
        shapes = [
            (bm, 64, 128, 4, 4),
            (bm, 128, 128, 4, 3),
            (bm, 32, 128, 4, 5),
            (bm, 128, 64, 4, 4),
            (bm, 256, 128, 8, 3),
        ]
    return shapes

"""Launch configurations of the fused-MoE expert kernels (kernels.py), in one place.

A fused-experts call runs two grouped GEMMs over the same token alignment (align.py), so its
tactic is compound: one BLOCK_M (the rows of an M-block: every block holds one expert's
tokens, so the alignment pads each expert's count to a multiple of it) and one tile config
per GEMM stage (`StageTile`: BLOCK_N, BLOCK_K, GROUP_M, warps, stages), since GEMM1
(K = H, two B tiles per program: up and gate) and GEMM2 (K = I) favour different tiles.

The tuner's cache holds tactics as flat int tuples (`MoETactic.as_tactic`: block_m, then
GEMM1's five, then GEMM2's five, then swap_ab); `MoETactic.from_tactic` accepts either form
back.

The regime is set by the tokens per expert, `tokens_per_expert(T, K, E_local)`: at decode
(T*K/E < 16) every touched expert is one 16-row block and the cost is streaming the touched
experts' weights, so narrow N tiles (many programs per expert, to keep the SMs' loads in
flight) win; with many tokens per expert the GEMMs are compute bound and want the large
tiles of the plain GEMM (ops/gemm/config.py).

Defaults are unmeasured starting points (no GPU in the session that wrote them): choices
carried over from the GEMM family's H200 measurements (64x128 B tiles with 4-5 stages at
M <= 16; 128x128x64, 8 warps, 3 stages for large M). `benchmarks/bench_moe.py` measures them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import astuple, dataclass, replace

from flashtune.tune import Tactic

__all__ = [
    "StageTile",
    "MoETactic",
    "MoESpace",
    "QUANT_BLOCK",
    "tokens_per_expert",
    "bucket_of",
    "default_tactic",
    "candidates",
    "tactic_ok",
    "MAX_SPLIT",
    "DIRECT_MAX_ROUTES",
]

# The fp8 block-scale format's block (DeepSeek-V3's 128x128 weight blocks, 1x128
# activation groups): with fp8_block, BLOCK_K must divide it (one scale per K step).
QUANT_BLOCK = 128

# The most K parts a tile is cut into (the workspace holds one partial per program, so this
# only bounds the sum each split tile's last part reads).
MAX_SPLIT = 8

# The most routes (T * K) a call on the direct decode path may have (direct_kernels.py: each
# program numbers the local routes in registers, and GEMM2 keeps a partial per route).
DIRECT_MAX_ROUTES = 64

# One CTA's shared memory on Hopper (227 KB opt-in), the bound tactic_ok checks against.
_SMEM_LIMIT = 227 * 1024


@dataclass(frozen=True)
class StageTile:
    """The tile of one GEMM stage: B tile [block_n, block_k] per K step (GEMM1 loads two, the
    up rows and the gate rows), GROUP_M M-blocks walking the N tiles together."""

    block_n: int = 64
    block_k: int = 128
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 4


@dataclass(frozen=True)
class MoETactic:
    """The compound tactic of fused_experts: the M-block rows and each GEMM's tile."""

    block_m: int = 16
    gemm1: StageTile = StageTile()
    gemm2: StageTile = StageTile()
    # 1: both GEMMs form W @ A^T ("swap-AB", kernels._mma): the weight tile takes the MMA's
    # M side, for M-blocks of 16 rows (decode). 2: GEMM2 only (its fp8 weight tile, upcast
    # in registers, is then the MMA's register operand instead of going back to shared
    # memory).
    swap_ab: int = 0
    # K parts a GEMM tile may be cut into when its tiles leave programs idle (kernels
    # `_split_of`, decided on the device from the M-blocks in use): 1 never splits.
    max_split: int = 1
    # GEMM1 row tiles per M-block: GEMM1 runs on block_m / gemm1_sub rows and skips a row
    # tile that holds only padding, while GEMM2 keeps block_m rows. With fp8 W2 upcast in
    # registers GEMM2 gains from many rows an upcast tile, GEMM1 (fp8 MMAs) loses to the
    # padding of large blocks: 128-row blocks with 64-row GEMM1 tiles take both sides.
    gemm1_sub: int = 1
    # 1: the decode path without the alignment (direct.py): GEMM1 reads each route from
    # topk_ids, GEMM2 sums a token's routes (no combine launch); block_m, swap_ab and
    # gemm1_sub do not apply (one route a work item, weight tiles on the MMA's M side).
    # 2: the same with GEMM2 by output tile (a work item walks a token's routes; top-k up
    # to 8, else 1's GEMM2). 3: 1's two GEMMs in one persistent launch (GEMM2's items wait
    # on their routes' rows of C).
    direct: int = 0

    @property
    def gemm1_rows(self) -> int:
        """GEMM1's row tile."""
        return self.block_m // self.gemm1_sub

    @property
    def swap1(self) -> bool:
        """GEMM1 swapped."""
        return self.swap_ab == 1

    @property
    def swap2(self) -> bool:
        """GEMM2 swapped."""
        return self.swap_ab in (1, 2)

    def as_tactic(self) -> tuple[int, ...]:
        values = (
            self.block_m,
            *astuple(self.gemm1),
            *astuple(self.gemm2),
            self.swap_ab,
            self.max_split,
            self.gemm1_sub,
        )
        # Fourteen ints off the direct path: the form caches written before it hold.
        return (*values, self.direct) if self.direct else values

    @classmethod
    def from_tactic(cls, tactic: Tactic) -> MoETactic:
        if isinstance(tactic, cls):
            return tactic
        values: tuple[int, ...] = tuple(tactic)  # type: ignore[arg-type]
        if len(values) not in (11, 12, 13, 14, 15):
            raise ValueError(
                f"a MoE tactic is a MoETactic or 14 ints (block_m, 5 for GEMM1, 5 for "
                f"GEMM2, swap_ab, max_split, gemm1_sub; older caches' 13, 12 or 11 leave "
                f"out the last ones) and an optional direct flag, got {tactic!r}"
            )
        swap = values[11] if len(values) > 11 else 0
        split = values[12] if len(values) > 12 else 1
        sub = values[13] if len(values) > 13 else 1
        direct = values[14] if len(values) > 14 else 0
        return cls(
            values[0], StageTile(*values[1:6]), StageTile(*values[6:11]), swap, split, sub, direct
        )

    def smem_bytes(self, a_itemsize: int, w_itemsize: int) -> int:
        """Shared memory of the larger stage's pipeline (GEMM1: A tile plus two B tiles)."""
        g1, g2 = self.gemm1, self.gemm2
        s1 = (self.gemm1_rows * a_itemsize + 2 * g1.block_n * w_itemsize) * g1.block_k
        # GEMM2's A is the 16-bit intermediate; its fp8 B tile is upcast in registers.
        s2 = (self.block_m * 2 + g2.block_n * w_itemsize) * g2.block_k
        return max(s1 * g1.num_stages, s2 * g2.num_stages)


@dataclass(frozen=True)
class MoESpace:
    """The search space: iterating yields every MoETactic of the product (the tuner prunes
    with `tactic_ok`; `candidates` is the short list it tries by default)."""

    block_m: tuple[int, ...] = (16, 32, 64, 128)
    block_n: tuple[int, ...] = (32, 64, 128, 256)
    block_k: tuple[int, ...] = (64, 128)
    group_m: tuple[int, ...] = (1, 8)
    num_warps: tuple[int, ...] = (4, 8)
    num_stages: tuple[int, ...] = (2, 3, 4, 5)

    def tiles(self) -> Iterator[StageTile]:
        for values in itertools.product(
            self.block_n, self.block_k, self.group_m, self.num_warps, self.num_stages
        ):
            yield StageTile(*values)

    def __iter__(self) -> Iterator[MoETactic]:
        tiles = list(self.tiles())
        for bm in self.block_m:
            for g1 in tiles:
                for g2 in tiles:
                    yield MoETactic(bm, g1, g2)


def tokens_per_expert(num_tokens: int, top_k: int, num_local_experts: int) -> float:
    """The mean (token, k) rows per local expert if every route were local: the figure the
    tiles depend on."""
    return num_tokens * top_k / max(num_local_experts, 1)


def bucket_of(num_tokens: int, top_k: int, num_local_experts: int) -> str:
    """The regime of a call: "decode" (< 16 rows an expert), "small" (< 64), "medium"
    (< 256), "large"."""
    m = tokens_per_expert(num_tokens, top_k, num_local_experts)
    if m < 16:
        return "decode"
    if m < 64:
        return "small"
    if m < 256:
        return "medium"
    return "large"


# Per bucket, best first; default_tactic takes the first valid one. GEMM1's N tiles are per
# half (up and gate each: two fp32 accumulators of [block_m, block_n]), so its tiles are half
# as wide as GEMM2's for the same registers. Decode's block_n is then narrowed to fill the
# SMs (`_fill_sms`). fp8 operands take 128-deep K steps (the scale block; half the loop
# iterations of 64 at the same bytes per stage as 16-bit 64-deep steps).
_DEFAULTS: dict[str, tuple[MoETactic, ...]] = {
    # Decode splits tiles over K where they leave programs idle (max_split 8; session 23,
    # H200, kernel times: DeepSeek-V3 EP8 at T=1 with one local route, GEMM1 22.9 -> 12.8 us
    # and GEMM2 13.8 -> 11.4; where the touched experts' tiles fill the grid nothing splits).
    "decode": (
        MoETactic(16, StageTile(64, 128, 1, 4, 4), StageTile(64, 128, 1, 4, 4), 1, 8),
        MoETactic(16, StageTile(32, 128, 1, 4, 4), StageTile(64, 128, 1, 4, 4), 1, 8),
        MoETactic(16, StageTile(32, 64, 1, 4, 2), StageTile(32, 64, 1, 4, 2), 1, 8),
    ),
    "small": (
        # Measured best (H200, bench_moe --sweep, re-timed in a fresh process): Qwen3-30B bf16
        # at T=512, 510 us against 568 for the next line.
        MoETactic(16, StageTile(64, 64, 8, 4, 3), StageTile(128, 64, 8, 4, 4)),
        MoETactic(32, StageTile(64, 128, 1, 4, 4), StageTile(64, 128, 1, 4, 4)),
        MoETactic(32, StageTile(64, 64, 1, 4, 3), StageTile(64, 64, 1, 4, 3)),
    ),
    "medium": (
        MoETactic(64, StageTile(64, 64, 8, 4, 4), StageTile(128, 64, 8, 4, 4)),
        MoETactic(64, StageTile(64, 64, 8, 4, 3), StageTile(64, 64, 8, 4, 3)),
    ),
    "large": (
        # Measured best (as above): Qwen3-30B bf16 at T=4096, 1046 us against 1294.
        MoETactic(64, StageTile(256, 64, 8, 8, 3), StageTile(256, 64, 8, 8, 3)),
        MoETactic(128, StageTile(64, 64, 8, 8, 3), StageTile(128, 64, 8, 8, 3)),
        MoETactic(64, StageTile(64, 64, 8, 4, 3), StageTile(128, 64, 8, 4, 3)),
    ),
}
# fp8: registers decide. Block scales keep a K step's partial product beside the
# accumulator, so tiles that fit with 16-bit operands spill (ptxas -v for sm_90a on the AOT
# compile, no GPU: gemm1 64x64x128 at 4 warps 255 registers + 52 B spilled, at 8 warps
# 166; gemm1 128x64x128 at 8 warps 12 B spilled, 128x64x64 none (254); gemm2 128x128x128
# at 8 warps 80 B spilled, 128x64x128 none (248), 64x128x128 none (239)).
_DEFAULTS_FP8: dict[str, tuple[MoETactic, ...]] = {
    "small": _DEFAULTS["small"][1:],  # fp8 per-tensor at T=512 (Qwen3): the default won
    "medium": (
        MoETactic(64, StageTile(64, 128, 8, 8, 4), StageTile(128, 128, 8, 8, 3)),
        *_DEFAULTS["medium"],
    ),
    "large": (
        # Measured best, per-tensor fp8 (Qwen3-30B at T=4096): 1018 us against 1411.
        MoETactic(64, StageTile(128, 64, 8, 4, 4), StageTile(128, 64, 8, 4, 4)),
        MoETactic(128, StageTile(64, 64, 8, 8, 3), StageTile(64, 128, 8, 8, 3)),
        *_DEFAULTS["large"][1:],
    ),
}
# fp8 block scales (DeepSeek-V3 EP8, 32 local experts): one measured best for both regimes
# (session 21: T=512 903 us against 1014, T=4096 1876 against 2345; all routes local: 10355
# against 11189), ahead of the register-chosen tiles. Session 23 (H200, kernel times) swapped
# GEMM2 (swap_ab 2: the upcast, block-scaled W2 tile is the MMA's register operand) on
# 128x128 tiles: GEMM2 5083 -> 3679 us at T=4096 with every route local, 813 -> 564 at
# T=4096 uniform, 811 -> 561 at T=512; unswapped 128x128 gave 4590 / 700 / 698.
_BLOCK_BEST = MoETactic(64, StageTile(128, 128, 8, 8, 3), StageTile(128, 128, 8, 8, 3), 2)
# Defaults kept although ptxas reports a register spill for them (_BLOCK_BEST's GEMM1: 32 B at
# sm_90a): measured faster than every spill-free tile tried. The AOT spill test allows these.
MEASURED_SPILLING: frozenset[tuple[int, ...]] = frozenset({_BLOCK_BEST.as_tactic()})
_DEFAULTS_FP8_BLOCK: dict[str, tuple[MoETactic, ...]] = {
    "medium": (_BLOCK_BEST, *_DEFAULTS_FP8["medium"]),
    "large": (_BLOCK_BEST, *_DEFAULTS_FP8["large"][1:]),
}
# Programs per SM decode's grid aims for. Two (narrower tiles) measured slower than one on
# the H200: DeepSeek-V3 with 8 local experts touched at T=1, 128 us with 64-wide tiles against
# 149 with 32; Qwen3-30B at T=1, 33 us against 42 (bench_moe --sweep, re-timed); one per SM
# reproduces both measured picks.
_DECODE_PROGRAMS_PER_SM = 1


def _fill_sms(
    tactic: MoETactic, touched: int, inter: int, hidden: int, sm_count: int, w_itemsize: int
) -> MoETactic:
    """Decode: each touched expert is one M-block, so a GEMM has touched x N/block_n
    programs; halve block_n (down to 16) until they fill the SMs (Qwen3-30B at T=1: 8
    experts x 768/64 = 96 programs of GEMM1 on 132 SMs; 32-wide tiles give 192). GEMM1 on
    fp8 weights with split tiles stays at 64 or more and fills the SMs with K parts instead
    (session 23, H200, kernel times, Qwen3-30B fp8 at T=1: GEMM1 14.3 us at 32 wide, 10.4 at
    64 split in two; with bf16 weights 19.4 and 18.7: narrowing kept there)."""
    want = _DECODE_PROGRAMS_PER_SM * sm_count

    def narrow(tile: StageTile, n: int, floor: int = 16) -> StageTile:
        bn = tile.block_n
        while bn > floor and touched * -(-n // bn) < want:
            bn //= 2
        return replace(tile, block_n=bn)

    floor1 = 64 if w_itemsize == 1 and tactic.max_split > 1 else 16
    return replace(
        tactic, gemm1=narrow(tactic.gemm1, inter, floor1), gemm2=narrow(tactic.gemm2, hidden)
    )


# Small enough for any shared memory and any legal shape (interpreter, odd tests).
_FALLBACK = MoETactic(16, StageTile(32, 64, 1, 4, 2), StageTile(32, 64, 1, 4, 2))


def tactic_ok(
    tactic: MoETactic,
    *,
    fp8_block: bool,
    a_itemsize: int,
    w_itemsize: int,
    smem_limit: int = _SMEM_LIMIT,
) -> bool:
    """Whether `tactic` can run: its tiles fit shared memory, tl.dot's minimum of 16 in each
    dimension, and with fp8 block scales a BLOCK_K dividing the 128-wide scale block (one
    activation and one weight scale per K step)."""
    for tile in (tactic.gemm1, tactic.gemm2):
        if tile.block_n < 16 or tile.block_k < 16 or tile.num_stages < 1:
            return False
        if fp8_block and QUANT_BLOCK % tile.block_k:
            return False
        if tile.group_m < 1 or tile.num_warps not in (1, 2, 4, 8, 16):
            return False
    if tactic.block_m < 16 or tactic.swap_ab not in (0, 1, 2):
        return False
    if tactic.gemm1_sub not in (1, 2, 4) or tactic.gemm1_rows < 16:
        return False
    if not 1 <= tactic.max_split <= MAX_SPLIT or tactic.direct not in (0, 1, 2, 3):
        return False
    return tactic.smem_bytes(a_itemsize, w_itemsize) <= smem_limit


def default_tactic(
    num_tokens: int,
    top_k: int,
    num_local_experts: int,
    *,
    fp8_block: bool = False,
    a_itemsize: int = 2,
    w_itemsize: int = 2,
    inter: int | None = None,
    hidden: int | None = None,
    sm_count: int = 132,
) -> MoETactic:
    """Tactic -1: the first default of the call's bucket that is valid, else the fallback.
    With the expert's sizes (inter: I, hidden: H), decode's tiles are narrowed to fill
    `sm_count` SMs."""
    bucket = bucket_of(num_tokens, top_k, num_local_experts)
    routes = num_tokens * top_k
    if routes <= DIRECT_MAX_ROUTES and routes <= _DIRECT_DENSITY * num_local_experts:
        if tactic_ok(_DIRECT, fp8_block=fp8_block, a_itemsize=a_itemsize, w_itemsize=w_itemsize):
            return _DIRECT
    table = _DEFAULTS
    if a_itemsize == 1 and fp8_block and bucket in _DEFAULTS_FP8_BLOCK:
        table = _DEFAULTS_FP8_BLOCK
    elif a_itemsize == 1 and bucket in _DEFAULTS_FP8:
        table = _DEFAULTS_FP8
    for t in table[bucket]:
        if bucket == "decode" and inter is not None and hidden is not None:
            touched = min(num_local_experts, num_tokens * top_k)
            t = _fill_sms(t, touched, inter, hidden, sm_count, w_itemsize)
        if tactic_ok(t, fp8_block=fp8_block, a_itemsize=a_itemsize, w_itemsize=w_itemsize):
            return t
    return _FALLBACK


def candidates(
    num_tokens: int,
    top_k: int,
    num_local_experts: int,
    *,
    fp8_block: bool = False,
    a_itemsize: int = 2,
    w_itemsize: int = 2,
) -> list[MoETactic]:
    """The tactics the tuner tries for a call: per stage a dozen tiles known to be good for
    the regime, crossed, with the block_m of the regime and its neighbours."""
    m = tokens_per_expert(num_tokens, top_k, num_local_experts)
    if m < 16:
        block_ms: tuple[int, ...] = (16,)
        tiles = [
            StageTile(bn, bk, 1, w, s)
            for bn, bk, w, s in (
                (16, 128, 4, 4),  # EP ranks: T=1 touches one local expert or two
                (32, 128, 4, 4),
                (64, 128, 4, 4),
                (64, 128, 4, 5),
                (128, 128, 4, 3),
                (32, 256, 4, 3),
                (64, 64, 4, 5),
            )
        ]
    elif m < 128:
        block_ms = (16, 32, 64)
        tiles = [
            StageTile(bn, bk, g, w, s)
            for bn, bk, g, w, s in (
                (64, 128, 1, 4, 4),
                (128, 64, 8, 4, 4),
                (128, 128, 8, 8, 3),
                (64, 64, 8, 4, 3),
            )
        ]
    else:
        block_ms = (64, 128)
        tiles = [
            StageTile(bn, bk, g, w, s)
            for bn, bk, g, w, s in (
                (128, 64, 8, 8, 3),
                (128, 64, 8, 4, 4),
                (256, 64, 8, 8, 3),
                (128, 128, 8, 8, 3),
                (64, 128, 8, 4, 4),
            )
        ]
    # GEMM2 swapped alone pays where its weights are upcast from fp8 (swap_ab 2).
    swaps = (1, 0) if m < 16 else (0, 2) if w_itemsize == 1 else (0,)
    split = MAX_SPLIT if m < 16 else 1
    # 128-row blocks with 64-row GEMM1 tiles where fp8 W2 is upcast (gemm1_sub): a candidate,
    # not a default (session 24, H200: it wins with many rows an expert, loses where the
    # routes spread; the host cannot tell the two apart).
    subs = {bm: (1, 2) if bm == 128 and w_itemsize == 1 else (1,) for bm in block_ms}
    out = [
        MoETactic(bm, g1, g2, swap, split, sub)
        for bm in block_ms
        for sub in subs[bm]
        for swap in swaps
        for g1 in tiles
        for g2 in tiles
        if tactic_ok(
            MoETactic(bm, g1, g2, swap, split, sub),
            fp8_block=fp8_block,
            a_itemsize=a_itemsize,
            w_itemsize=w_itemsize,
        )
    ]
    if m < 16 and num_tokens * top_k <= DIRECT_MAX_ROUTES:
        # The decode path without the alignment and combine launches (direct.py), then with
        # GEMM2 by output tile (direct=2). H200, CUDA graphs: the latter wins where a tile's
        # routes are few and its parts fill the SMs (DeepSeek-V3 EP8 with one local route,
        # T=1: 30.6 -> 27.2 us; Qwen3-30B bf16 T 2-8: 5-9%) and loses where one token's many
        # routes run in one program (DeepSeek-V3, 8 local routes at T=1: 115 -> 159 us).
        out += [
            MoETactic(
                16, StageTile(bn1, 128, 1, 4, s1), StageTile(bn2, 128, 1, 4, s2), 1, split, direct=d
            )  # fmt: skip
            for d, tiles in ((1, _DIRECT_TILES), (2, _DIRECT_TILES_BY_TOKEN))
            for bn1, s1, bn2, s2 in tiles
        ]
    return [
        t
        for t in dict.fromkeys(out)
        if tactic_ok(t, fp8_block=fp8_block, a_itemsize=a_itemsize, w_itemsize=w_itemsize)
    ]


# The direct path (no alignment or combine launch) is the default where routes rarely share
# an expert: at most one route per four local experts (each route streams its expert's
# weights itself; two routes of one expert read them twice). Session 25, H200, kernel
# times at T=1: Qwen3-30B fp8 25.8 -> 15.8 us, bf16 38.6 -> 24.5, DeepSeek-V3 EP8 with 8
# local routes 120 -> 113; at T=4 with every route on 32 local experts (one route an
# expert) the general path's 262 us against 395.
_DIRECT_DENSITY = 0.25
_DIRECT = MoETactic(16, StageTile(64, 128, 1, 4, 4), StageTile(64, 128, 1, 4, 4), 1, 8, direct=1)

# (GEMM1 block_n, stages, GEMM2 block_n, stages) of the direct path's candidates: each
# program streams a [block_n, 128] weight tile a step (two for GEMM1: up and gate).
_DIRECT_TILES = ((16, 4, 32, 4), (32, 4, 64, 4), (64, 4, 64, 4), (64, 4, 128, 3), (128, 3, 128, 3))
_DIRECT_TILES_BY_TOKEN = ((64, 4, 64, 4), (64, 4, 128, 3))

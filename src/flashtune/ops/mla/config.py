"""Launch policy of MLA attention in one place: the kernel's tactics and their space, the
default tactic, the heads per program, the persistent grid and the chunking rules, for the
planned wrapper (plan.py) and the plan-free calls (launch.py) alike.

The kernel's shape: all query heads of a request read the same latent KV (one shared
"head" of 512 + 64 dims per token), so a program packs BLOCK_M (query token, head) rows into
the M dimension of its MMAs and reads each [BLOCK_N, 512] ckv tile once for all of them (the
score MMA and the output MMA use the same tile). Decode is bound by the cache's bandwidth:
at 16 heads (DeepSeek at TP 8) one request is one 16-row tile; 128 heads are two 64-row
tiles. Hardware facts come from `flashtune.platform.device_limits`; a caller that fixes how
a call launches passes an `MLALaunch`.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashtune.ops.attention.scheduler import CostModel
from flashtune.platform import DeviceLimits

__all__ = [
    "MLATactic",
    "TACTICS",
    "default_tactic",
    "MLALaunch",
    "DEFAULT_LAUNCH",
    "INTERPRETER_SM_COUNT",
    "WORK_COST",
    "BLOCK_M_CHOICES",
    "block_m_for",
    "plan_sm_count",
    "smem_bytes",
    "ctas_per_sm",
    "REGISTERS_PER_SM",
    "chunk_align",
    "min_chunk",
    "latency_regime",
    "next_pow2",
    "planless_chunk",
    "RaggedTactic",
    "RAGGED_TACTICS",
    "default_ragged_tactic",
    "ragged_smem_bytes",
]


@dataclass(frozen=True)
class MLATactic:
    """Launch configuration of the MLA kernels (`kernels.mla_paged_kernel` and the plan-free
    kernel): KV tokens per tile, warps, software-pipeline stages. The rows per program
    (heads x query tokens, `block_m`) are fixed by the plan, not by the tactic: they decide
    the work items."""

    block_n: int
    num_warps: int
    num_stages: int
    # Load q for every KV tile instead of keeping the [block_m, 576] tile live across the
    # loop: registers for tall tiles, at the price of L2 reads.
    reload_q: bool = False
    # Programs sharing each work item, each accumulating 512 / dv_split output columns (the
    # scores computed by each): a [64, 512] fp32 accumulator is 128 registers a thread at 8
    # warps, which Triton spills. Planned calls only; not with per-group fp8 scales.
    dv_split: int = 1
    # Split tiles merged by the last of their chunks to finish, inside the attention kernel
    # (arrival counters, as the GEMM's split-K fixup), instead of a second kernel: at small
    # batch the merge launch is a good part of a decode step. Planned calls only.
    fused_merge: bool = False
    # The probabilities reach the output MMA through a scratch tile in memory, so the score
    # MMAs are spread over the warpgroups instead of repeated in each (kernels.mla_item's
    # P_SCRATCH; sm_90 SASS at 64 rows, 8 warps, 64-token tiles, q reloaded: 36 score MMAs a
    # KV tile instead of 72, 1359 instructions instead of 1553, 2 spill stores instead of
    # 21, but the KV loads no longer software-pipelined). Planned calls only, 32 rows and
    # more; a manual tactic (MLALaunch), not in the tuner's space until a GPU has run its
    # cuda test and timed it (benchmarks/bench_mla.py --only sweep-scratch).
    p_scratch: bool = False

    @staticmethod
    def space(
        block_m: int,
        kv_itemsize: int = 2,
        head_dims: tuple[int, int] = (512, 64),
        smem_limit: int = 227 * 1024,
    ) -> list[MLATactic]:
        """The tactics whose tiles fit one program's shared memory (`smem_bytes`); with
        32 rows and more, each also with q reloaded for every KV tile, and (a bf16 cache)
        the 32- and 64-token tiles at 4 and 8 warps with the output columns split in two.
        Not p_scratch: a manual tactic until a GPU has checked and timed it."""
        reload = (False, True) if block_m >= 32 else (False,)
        tactics = [
            MLATactic(t.block_n, t.num_warps, t.num_stages, r) for t in TACTICS for r in reload
        ]
        # The fused merge with the 8-warp tactics (the measured defaults' family).
        tactics += [
            MLATactic(t.block_n, t.num_warps, t.num_stages, r, fused_merge=True)
            for t in TACTICS
            if t.num_warps == 8
            for r in reload
        ]
        if block_m >= 32 and kv_itemsize == 2 and head_dims[0] % 2 == 0:
            tactics += [
                MLATactic(t.block_n, t.num_warps, t.num_stages, r, dv_split=2)
                for t in TACTICS
                if t.block_n <= 64 and t.num_warps <= 8
                for r in reload
            ]
        return [
            t
            for t in tactics
            if smem_bytes(t, block_m, head_dims[0], head_dims[1], kv_itemsize) <= smem_limit
        ]


TACTICS: tuple[MLATactic, ...] = tuple(
    MLATactic(bn, nw, ns) for bn in (32, 64, 128) for nw in (4, 8, 16) for ns in (2, 3, 4)
)


# The default tactics, best first: the first whose tiles fit (`smem_bytes`) is taken.
# Measured on an H100 (16 heads, page 64, benchmarks/bench_mla.py --only sweep...):
# - 16 rows, bf16: 8 warps (at 4 the [16, 512] fp32 accumulator and the q tile take all 255
#   registers and spill), 64-token tiles, 3 stages: b128 x 8k 406 us (2.97 TB/s) vs 589 us
#   for 64/4/2; b16 x 4k 42 us vs 59; b1 x 16k 21 us vs 27.
# - 16 rows, fp8 e4m3: 128-token tiles over 16 warps, b128 x 8k 496 us (64/8/3: 551 us).
# - 32 rows (MTP, 2 tokens), q loaded for every KV tile (the live q tile made it spill):
#   64/8/3 b32 x 4k 82 us (93 keeping q live; 64/8/2 96, 32/8/3 109).
# - 64 rows, one tile a request (MTP, 4 tokens): 32/8/3 124 us, 64/8/2 143 us; prefill
#   (b4 x 1024 queries over 4k): 64/8/2 2.50 ms, 32/8/3 2.75 ms. 16 warps spill at 128
#   registers a thread and lose everywhere but fp8 (2x slower for prefill).
_DEFAULTS = {
    "bf16": (MLATactic(64, 8, 3), MLATactic(64, 8, 2), MLATactic(32, 8, 3), MLATactic(32, 8, 2)),
    "rows32": (MLATactic(64, 8, 3, True), MLATactic(64, 8, 2, True), MLATactic(32, 8, 3)),
    "fp8": (MLATactic(128, 16, 2), MLATactic(64, 8, 3), MLATactic(64, 8, 2)),
    "short64": (MLATactic(32, 8, 3), MLATactic(32, 8, 2)),
}
_FALLBACK = MLATactic(32, 4, 2)


def default_tactic(
    block_m: int,
    kv_itemsize: int = 2,
    head_dims: tuple[int, int] = (512, 64),
    smem_limit: int = 227 * 1024,
    *,
    long_queries: bool = True,
) -> MLATactic:
    """The tactic used when the tuner has nothing better (tactic -1): the first of the
    measured defaults whose tiles fit `smem_limit`. block_m: rows per program; kv_itemsize:
    bytes per cache element (1: fp8); long_queries: some request has more rows than one
    tile (prefill) rather than one tile each (decode, MTP)."""
    if kv_itemsize == 1 and block_m == 16:
        candidates = _DEFAULTS["fp8"]
    elif block_m == 64 and not long_queries:
        candidates = _DEFAULTS["short64"]
    elif block_m == 32:
        candidates = _DEFAULTS["rows32"]
    else:
        candidates = _DEFAULTS["bf16"]
    for tactic in candidates:
        if smem_bytes(tactic, block_m, head_dims[0], head_dims[1], kv_itemsize) <= smem_limit:
            return tactic
    return _FALLBACK


@dataclass(frozen=True)
class MLALaunch:
    """How an MLA call launches, when the caller fixes it rather than the defaults.

    tactic: the kernel's tactic for every call of the plan (None: the autotuner's pick, else
    `default_tactic`). block_m: query rows (token x head pairs) per program, 16, 32 or 64
    (None: `block_m_for` of the longest request). max_ctas_per_sm: the most persistent
    CTAs per SM. sm_count: the SMs to plan for (None: the device's)."""

    tactic: MLATactic | None = None
    block_m: int | None = None
    max_ctas_per_sm: int = 2
    sm_count: int | None = None


DEFAULT_LAUNCH = MLALaunch()

# The interpreter runs programs one by one: a few CTAs are enough to exercise the schedule.
INTERPRETER_SM_COUNT = 2

# The scheduler's cost of a work item in KV tokens: a token is 1152 bytes of ckv + kpe
# (bf16); a split item also writes and the merge reads one fp32 partial row of 2 KB per head
# (16 heads: 32 KB, ~28 tokens), plus the prologue (q load) and the epilogue.
WORK_COST = CostModel(qo=1.0, kv=1.0, fixed=48.0)

BLOCK_M_CHOICES = (16, 32, 64)


def next_pow2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length() if n > 1 else 1


def block_m_for(max_rows: int, launch: MLALaunch | None = None) -> int:
    """Rows per program for requests of at most `max_rows` packed rows (tokens x heads)."""
    if launch is not None and launch.block_m is not None:
        if launch.block_m not in BLOCK_M_CHOICES:
            raise ValueError(
                f"launch.block_m must be one of {BLOCK_M_CHOICES}, got {launch.block_m}"
            )
        return launch.block_m
    # tl.dot needs M >= 16; past 64 rows the accumulator no longer fits 8 warps' registers.
    return max(16, min(64, next_pow2(max(max_rows, 1))))


def plan_sm_count(limits: DeviceLimits, launch: MLALaunch | None = None) -> int:
    """The SMs a plan spreads its work over: `launch.sm_count`, the device's on a GPU,
    `INTERPRETER_SM_COUNT` off-GPU (the limits are then a stand-in)."""
    if launch is not None and launch.sm_count is not None:
        return launch.sm_count
    return INTERPRETER_SM_COUNT if limits.stand_in else limits.sm_count


def smem_bytes(
    tactic: MLATactic, block_m: int, head_dim_ckv: int, head_dim_kpe: int, kv_itemsize: int
) -> int:
    """Shared memory of one program as Triton 3.6 allocates it on sm_90: the buffered ckv +
    kpe tiles (stages - 1 copies, in the cache's dtype), the q tile and the probability tile
    (q's dtype, 2 bytes), and at 64 rows one more copy of the ckv columns the output MMA
    reads (Triton stages that operand for the taller tile). Exact for bf16 at 16, 32 and 64
    rows, with and without the output columns split; an upper bound with an fp8 cache
    (tests/ops/test_mla_smem.py compiles the kernel for sm_90 and compares; e.g. 16 rows
    64/8/3 164 KB, 64 rows 64/8/3 288 KB, 64 rows 32/8/3 split in two 228 KB: 1 KB over an
    H100's 227 KB)."""
    ckv_width = head_dim_ckv + (head_dim_ckv // tactic.dv_split if tactic.dv_split > 1 else 0)
    # The program's own output columns are loaded again for the second MMA: buffered too.
    width = ckv_width + head_dim_kpe
    rest = block_m * (head_dim_ckv + head_dim_kpe) * 2 + block_m * tactic.block_n * 2
    if kv_itemsize == 1:
        # An fp8 tile is loaded to registers, converted, and staged once in q's dtype for the
        # MMAs; at 64 rows the fp8 tiles are buffered in shared memory as well. Triton's
        # allocator reuses some of these buffers, so this is an upper bound (16 rows: 64/8/2
        # 86 KB, 128/16/2 154 KB; 64 rows: 64/8/3 216 KB, compiled), not the exact size.
        fp8_stages = max(tactic.num_stages - 1, 1) if block_m >= 64 else 0
        return tactic.block_n * width * (2 + fp8_stages) + rest + 2048
    if block_m >= 64:
        rest += tactic.block_n * ckv_width * kv_itemsize
    return max(tactic.num_stages - 1, 1) * tactic.block_n * width * kv_itemsize + rest


# Registers a thread of the MLA kernel at block_m 16, head_dim_ckv 512 (sm_90, Triton 3.6):
# 255 at 4 warps (spilling), 157-218 at 8 warps; taller tiles take at least as many.
_REGISTERS = {4: 255, 8: 216}
REGISTERS_PER_SM = 65536


def ctas_per_sm(
    tactic: MLATactic,
    block_m: int,
    head_dim_ckv: int,
    head_dim_kpe: int,
    kv_itemsize: int,
    smem_per_sm: int,
    max_ctas: int,
) -> int:
    """Persistent CTAs per SM: as many as fit in `smem_per_sm` bytes and in the register
    file, at most `max_ctas`.

    The plan balances its work over all CTAs assuming they run at once: a grid larger than
    what is resident runs in waves (H100, b128 x 8k: 32/8/2 planned for 2 CTAs an SM took
    765 us, for 1 CTA 724 us; it holds 157 registers a thread, so one CTA of 8 warps fills
    an SM's register file past half)."""
    need = smem_bytes(tactic, block_m, head_dim_ckv, head_dim_kpe, kv_itemsize)
    regs = _REGISTERS.get(tactic.num_warps, 255) * 32 * tactic.num_warps
    return max(1, min(max_ctas, smem_per_sm // need, REGISTERS_PER_SM // regs))


def latency_regime(num_tiles: int, sm_count: int) -> bool:
    """Few query tiles for the SMs (batch 1-8 decode at 16 heads on 132 SMs): a program's
    chain of dependent tile loads, not bandwidth, sets the time; split KV finely."""
    return num_tiles * 16 <= sm_count


def chunk_align(tactic: MLATactic) -> int:
    """The multiple every KV chunk starts on, planned or plan-free, when `tactic` sized the
    chunks: its tile, at least 16 tokens (the scheduler rounds chunk steps up to it)."""
    return max(tactic.block_n, 16)


def min_chunk(num_tiles: int, sm_count: int) -> int:
    """The shortest KV chunk a query tile is split into (tokens)."""
    if latency_regime(num_tiles, sm_count):
        return 64
    if num_tiles * 8 <= sm_count:
        # 9-16 tiles on 132 SMs: chunks of 256 leave half the SMs idle at 1k tokens (H200,
        # b16 x 1k at 16 heads: 24.1 us in 4 chunks a tile, 20.7 in 8 of 128, 26.7 in 16
        # of 64); at b32 and past, 128-token chunks lose (b32 x 1k 35.9 us against 28.0).
        return 128
    # 256 tokens are 288 KB of latent cache; a partial row of 16 heads is 32 KB written and
    # read back, so shorter chunks spend more on the merge than they gain in balance.
    return 256


# The plan-free decode's chunk choice (cost in KV tokens of one program): a program's fixed
# cost, and a factor on splits for the partial rows and the merge launch (as for GQA decode).
_PROGRAM_COST = 48
_SPLIT_FACTOR = 1.2


def planless_chunk(
    batch: int, max_tokens: int, tiles_per_request: int, slots: int, align: int, shortest: int
) -> tuple[int, int]:
    """(KV tokens per chunk, programs along the request axis) of the plan-free decode, from
    shapes alone: max_tokens (pages x page_size) is assumed spread evenly over the batch;
    programs run in rounds of `slots`, each costing its longest chunk; among splits of the
    mean length into n chunks (never shorter than `shortest`), the least modelled time wins.
    The grid adds one program per request for the short last chunks."""
    mean = -(-max(max_tokens, 1) // max(batch, 1))
    shortest = -(-shortest // align) * align
    best: tuple[float, int] | None = None
    for n in range(1, 257):
        per = -(-mean // n)
        chunk = max(shortest, -(-per // align) * align)
        pieces = -(-mean // chunk)
        rounds = -(-(batch * pieces * tiles_per_request) // max(slots, 1))
        cost = rounds * (chunk + _PROGRAM_COST) * (_SPLIT_FACTOR if pieces > 1 else 1.0)
        if best is None or cost < best[0]:
            best = (cost, chunk)
        if chunk == shortest:
            break
    assert best is not None
    chunk = best[1]
    return chunk, -(-max_tokens // chunk) + batch


# --------------------------------------------------------------------------- ragged prefill


@dataclass(frozen=True)
class RaggedTactic:
    """Launch configuration of the ragged (non-absorbed) MLA prefill kernel
    (`ragged.mla_ragged_kernel`): query tokens per program (one head each), KV tokens per
    tile, warps, software-pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    @staticmethod
    def space() -> list[RaggedTactic]:
        return list(RAGGED_TACTICS)


RAGGED_TACTICS: tuple[RaggedTactic, ...] = tuple(
    RaggedTactic(bm, bn, nw, ns)
    for bm in (64, 128)
    for bn in (32, 64)
    for nw in (4, 8)
    for ns in (2, 3)
    if not (bm == 128 and nw == 4)  # a [128, 128] fp32 accumulator over 128 threads spills
)

# Not measured yet (no GPU run of this kernel so far), best first, the first whose tiles fit
# (`ragged_smem_bytes`) taken: the Triton fused-attention tutorial's forward configuration
# for head_dim 128 (128 x 64 tiles, 8 warps; the accumulator is [128, 128] fp32 as there),
# then smaller tiles for GPUs with less shared memory per block than an H100's 227 KB.
_RAGGED_DEFAULTS = (
    RaggedTactic(128, 64, 8, 2),
    RaggedTactic(64, 64, 4, 2),
    RaggedTactic(64, 32, 4, 2),
)
# The interpreter runs each program's numpy ops one by one: short tiles keep the tests'
# padding small and still cross tile boundaries at the tested lengths.
_RAGGED_INTERPRETER = RaggedTactic(16, 16, 4, 1)


def ragged_smem_bytes(
    tactic: RaggedTactic, head_dim_qk: int = 192, head_dim_vo: int = 128, itemsize: int = 2
) -> int:
    """An estimate of one program's shared memory (not measured): the q tile, the K and V
    tiles of each pipeline stage, and the probability tile, in the inputs' dtype."""
    q_tile = tactic.block_m * head_dim_qk
    kv_tiles = max(tactic.num_stages, 1) * tactic.block_n * (head_dim_qk + head_dim_vo)
    return (q_tile + kv_tiles + tactic.block_m * tactic.block_n) * itemsize


def default_ragged_tactic(
    on_gpu: bool,
    head_dim_qk: int = 192,
    head_dim_vo: int = 128,
    itemsize: int = 2,
    smem_limit: int = 227 * 1024,
) -> RaggedTactic:
    """The ragged prefill's tactic when the caller fixes none: on a GPU the first default
    whose tiles fit `smem_limit` bytes (the last one otherwise), else the interpreter's."""
    if not on_gpu:
        return _RAGGED_INTERPRETER
    for tactic in _RAGGED_DEFAULTS:
        if ragged_smem_bytes(tactic, head_dim_qk, head_dim_vo, itemsize) <= smem_limit:
            return tactic
    return _RAGGED_DEFAULTS[-1]

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
    "min_chunk",
    "latency_regime",
    "next_pow2",
    "planless_chunk",
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

    @staticmethod
    def space(block_m: int) -> list[MLATactic]:
        """The tactics worth trying for tiles of `block_m` rows: the [block_m, 512] fp32
        accumulator takes block_m * 4 registers a thread at 4 warps, so tall tiles need 8."""
        return [t for t in TACTICS if block_m <= 32 or t.num_warps == 8]


TACTICS: tuple[MLATactic, ...] = tuple(
    MLATactic(bn, nw, ns) for bn in (16, 32, 64) for nw in (4, 8) for ns in (1, 2, 3)
)


def default_tactic(block_m: int, kv_itemsize: int = 2) -> MLATactic:
    """The tactic used when the tuner has nothing better (tactic -1).

    block_m: rows per program; kv_itemsize: bytes per cache element (1: fp8)."""
    if block_m >= 64:
        # [64, 512] fp32 accumulator: 128 registers a thread at 8 warps; short KV tiles keep
        # the score tile and the staged ckv tile small.
        return MLATactic(block_n=32, num_warps=8, num_stages=2)
    if block_m >= 32:
        return MLATactic(block_n=32, num_warps=8, num_stages=2)
    # 16 rows (one decode request of 16 heads): wide KV tiles amortize the per-tile softmax;
    # an fp8 tile is half the shared memory, so a third stage fits.
    return MLATactic(block_n=64, num_warps=4, num_stages=3 if kv_itemsize == 1 else 2)


@dataclass(frozen=True)
class MLALaunch:
    """How an MLA call launches, when the caller fixes it rather than the defaults.

    tactic: the kernel's tactic for every call of the plan (None: the autotuner's pick, else
    `default_tactic`). block_m: query rows (token x head pairs) per program, 16..128, a power
    of two (None: `block_m_for` of the longest request). max_ctas_per_sm: the most persistent
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

BLOCK_M_CHOICES = (16, 32, 64, 128)


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
    """Shared memory of one program: the buffered ckv + kpe tiles (stages - 1 copies, staged
    in the cache's dtype), the q tiles and the probability tile (q's dtype, 2 bytes)."""
    width = head_dim_ckv + head_dim_kpe
    kv_tile = tactic.block_n * width * kv_itemsize
    if kv_itemsize == 1:
        kv_tile += tactic.block_n * width * 2  # the tile converted to q's dtype for the MMA
    return (
        max(tactic.num_stages - 1, 1) * kv_tile
        + block_m * width * 2
        + block_m * tactic.block_n * 2
        + 1024
    )


def ctas_per_sm(
    tactic: MLATactic,
    block_m: int,
    head_dim_ckv: int,
    head_dim_kpe: int,
    kv_itemsize: int,
    smem_per_sm: int,
    max_ctas: int,
) -> int:
    """Persistent CTAs per SM: as many as fit in `smem_per_sm` bytes, at most `max_ctas`.

    The plan balances its work over all CTAs assuming they run at once (a grid larger than
    what is resident would run in waves). Registers bound it too: a [64, 512] fp32
    accumulator over 8 warps is 128 registers a thread, so two such CTAs fill the register
    file; hence the default of at most 2."""
    need = smem_bytes(tactic, block_m, head_dim_ckv, head_dim_kpe, kv_itemsize)
    return max(1, min(max_ctas, smem_per_sm // need))


def latency_regime(num_tiles: int, sm_count: int) -> bool:
    """Few query tiles for the SMs (batch 1-8 decode at 16 heads on 132 SMs): a program's
    chain of dependent tile loads, not bandwidth, sets the time; split KV finely."""
    return num_tiles * 16 <= sm_count


def min_chunk(num_tiles: int, sm_count: int) -> int:
    """The shortest KV chunk a query tile is split into (tokens)."""
    if latency_regime(num_tiles, sm_count):
        return 64
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

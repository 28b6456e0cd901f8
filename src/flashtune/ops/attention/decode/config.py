"""Launch policy of paged decode attention, in one place: the kernel's tactics and their
space, the default tactic, the persistent grid and the chunking rules, for the planned
wrappers (decode/plan.py) and the plan-free call (decode/plan_free.py) alike.

Hardware facts come from `flashtune.platform.device_limits`; a caller that fixes how a call
launches (a benchmark sweeping tactics) passes a `DecodeLaunch` explicitly, to
`BatchDecodeWithPagedKVCacheWrapper.plan(..., launch=...)` or `paged_decode(..., launch=...)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flashtune.ops.attention.decode.registers import REGISTERS_SM90
from flashtune.ops.attention.scheduler import CostModel
from flashtune.platform import DeviceLimits

__all__ = [
    "DecodeTactic",
    "TACTICS",
    "default_tactic",
    "latency_regime",
    "short_requests",
    "DecodeLaunch",
    "DEFAULT_LAUNCH",
    "INTERPRETER_SM_COUNT",
    "WORK_COST",
    "plan_sm_count",
    "ctas_per_sm",
    "kernel_registers",
    "min_chunk",
    "block_m_for",
    "next_pow2",
    "launch_shape",
]


@dataclass(frozen=True)
class DecodeTactic:
    """Launch configuration of `decode.kernels.paged_attn_kernel`."""

    block_n: int
    num_warps: int
    num_stages: int
    # Split tiles merged by the last of their chunks inside the attention kernel (arrival
    # counters, as the GEMM's split-K fixup) instead of a second kernel: at small batch and
    # short KV the merge launch is a good part of a decode step. Planned calls only.
    fused_merge: bool = False

    @staticmethod
    def space(head_dim: int) -> list[DecodeTactic]:
        """The tactics worth trying at this head_dim (d256 keeps the K/V tiles <= 64 rows),
        each 4-warp one also with the fused merge."""
        plain = [t for t in TACTICS if head_dim <= 128 or t.block_n <= 64]
        return plain + [
            DecodeTactic(t.block_n, t.num_warps, t.num_stages, fused_merge=True)
            for t in plain
            if t.num_warps == 4
        ]


TACTICS: tuple[DecodeTactic, ...] = tuple(
    DecodeTactic(bn, nw, ns) for bn in (32, 64, 128) for nw in (4, 8) for ns in (2, 3)
)


def default_tactic(
    head_dim: int,
    page_size: int,
    block_m: int,
    *,
    kv_itemsize: int = 2,
    rope: bool = False,
    latency: bool = False,
    short: bool = False,
) -> DecodeTactic:
    """The tactic used when the tuner has nothing better (tactic -1).

    kv_itemsize: bytes per cache element (1: fp8); rope: fused ROPE_LLAMA; latency: the
    plan spreads few requests over all SMs (`latency_regime`); short: `short_requests`."""
    # Wide tiles amortize the per-block softmax work; d256 halves them to stay in registers.
    block_n = 64 if head_dim <= 128 else 32
    if block_m >= 64:
        return DecodeTactic(block_n=32 if head_dim <= 128 else 16, num_warps=4, num_stages=3)
    if kv_itemsize == 1 and page_size > 1 and head_dim <= 128:
        # fp8 tiles are half the shared memory: a third stage fits, and short tiles keep
        # more loads in flight while the conversions run (H100, 32/8 heads, page 16, b1-256 x
        # KV 1k-16k: 0.875x the latency of 64/4/2, geomean of 8 shapes, worst 1.04x).
        return DecodeTactic(block_n=32, num_warps=4, num_stages=3)
    if rope and (latency or short) and head_dim <= 128:
        # Fused RoPE, few requests or short ones: short tiles, 3 stages (H100, b1 x KV 1k/4k/
        # 16k: 1.10/1.01/1.00x plain decode, where 64/4/2 took 1.12/1.05/1.09x; b16 x 1k: 1.01x
        # where 128/4/2 took 1.11x, b64 x 1k 1.05x vs 1.07x).
        return DecodeTactic(block_n=32, num_warps=4, num_stages=3)
    if rope and head_dim <= 128:
        # Fused RoPE, many requests: 128-row tiles amortize the rest of the block (H100, page
        # 16, b16-256 x KV 1k-16k: 1.00-1.11x plain decode, 64/4/2 1.06-1.11x).
        return DecodeTactic(block_n=128, num_warps=4, num_stages=2)
    if page_size == 1 and head_dim <= 128:
        # One page per token: 128 gathered rows per block keep more bytes in flight
        # (H200, 32/8 heads, b64 KV 2k: 131 us vs 162 us with 64 rows).
        block_n = 128
    # 2 stages: with the page ids loaded a block ahead the K/V loads still overlap the math,
    # and the smaller shared-memory footprint fits 4 CTAs per SM instead of 3 (H200 sweep,
    # page size 16, b16-256 x KV 512-32k: 2-21% faster than 3 stages).
    return DecodeTactic(block_n=block_n, num_warps=4, num_stages=2)


def short_requests(batch: int, num_kv_heads: int, sm_count: int, mean_kv_len: float) -> bool:
    """Requests of at most 1k KV tokens on average, at most 4 (request, KV head) pairs an SM:
    every work item is a few blocks long, so what each item costs besides its blocks (fused
    RoPE: q's rotation) weighs (b256 x 1k, 16 pairs an SM, keeps the long tiles)."""
    return mean_kv_len <= 1024 and batch * num_kv_heads <= 4 * sm_count


def latency_regime(batch: int, num_kv_heads: int, sm_count: int) -> bool:
    """Few (request, KV head) pairs for the SMs: a CTA's chain of dependent block loads, not
    bandwidth, sets the time, and requests are split into short chunks (`min_chunk`)."""
    return batch * num_kv_heads * 4 <= sm_count


@dataclass(frozen=True)
class DecodeLaunch:
    """How a decode call launches, when the caller fixes it rather than the defaults.

    tactic: the kernel's tactic for every call of the plan (None: the autotuner's pick, else
    `default_tactic`); it also sizes the persistent grid and the chunk alignment.
    max_ctas_per_sm: the most persistent CTAs per SM (as many as fit in shared memory, up to
    this). sm_count: the SMs to plan for (None: the device's; see `plan_sm_count`).
    """

    tactic: DecodeTactic | None = None
    max_ctas_per_sm: int = 4
    sm_count: int | None = None

    def tactic_for(
        self, head_dim: int, page_size: int, block_m: int, **variant: Any
    ) -> DecodeTactic:
        """The fixed tactic, else `default_tactic` (variant: its keyword arguments)."""
        if self.tactic is not None:
            return self.tactic
        return default_tactic(head_dim, page_size, block_m, **variant)


DEFAULT_LAUNCH = DecodeLaunch()

# The interpreter runs CTAs one by one: a few are enough to exercise the scheduling.
INTERPRETER_SM_COUNT = 2

# The scheduler's cost of a work item, in KV tokens: its query rows, its KV tokens and a
# fixed cost per item (prologue, Q load, epilogue).
WORK_COST = CostModel(qo=1.0, kv=1.0, fixed=32.0)


def plan_sm_count(limits: DeviceLimits, launch: DecodeLaunch | None = None) -> int:
    """The SMs a plan spreads its work over: `launch.sm_count` when given, the device's on a
    GPU, `INTERPRETER_SM_COUNT` off-GPU (the limits are then a stand-in)."""
    if launch is not None and launch.sm_count is not None:
        return launch.sm_count
    return INTERPRETER_SM_COUNT if limits.stand_in else limits.sm_count


# The register file of an SM (sm_80 to sm_100) and the per-warp allocation unit, in
# registers of a thread (256 a warp).
REGISTERS_PER_SM = 65536
REGISTER_UNIT = 8


def kernel_registers(
    tactic: DecodeTactic, head_dim: int, *, kv_itemsize: int = 2, rope: bool = False
) -> int | None:
    """Registers a thread of the decode kernel takes with this tactic and variant, as
    measured for sm_90 (decode/registers.py); None where nothing was measured."""
    variant = "rope" if rope else "fp8" if kv_itemsize == 1 else "plain"
    variant += "+fused_merge" if tactic.fused_merge else ""  # its merge code takes registers
    key = (variant, next_pow2(head_dim), tactic.block_n, tactic.num_warps, tactic.num_stages)
    return REGISTERS_SM90.get(key)


def ctas_per_sm(
    tactic: DecodeTactic,
    head_dim: int,
    block_m: int,
    smem_per_sm: int,
    max_ctas: int,
    kv_itemsize: int = 2,
    registers: int | None = None,
) -> int:
    """Persistent CTAs per SM: as many as fit in `smem_per_sm` bytes and, given the
    kernel's `registers` a thread, in the register file; at most `max_ctas`.

    The plan balances work over all CTAs assuming they run at once; a grid larger than
    what is resident would run in waves and double the makespan of the last ones (fused
    RoPE at 146 registers fit 3 CTAs of 4 warps where the plan assumed 4: batch 1 x 4k
    took 1.37x plain decode on an H100).
    """
    d = next_pow2(head_dim)
    # Buffered K and V tiles (stages - 1 copies of each), the Q tile twice (staging and
    # layout conversion) and the P tile, bf16: within 10% of what Triton 3.6 allocates
    # (checked on sm_90 for d 64-256, BLOCK_N 32-128, BLOCK_M 16-64, 2-4 stages).
    kv_tile = 2 * tactic.block_n * d * kv_itemsize  # fp8 tiles are staged as fp8
    smem = max(tactic.num_stages - 1, 1) * kv_tile + 2 * block_m * d * 2
    smem += block_m * tactic.block_n * 2 + 1024  # + page-id buffers and alignment slack
    fit = smem_per_sm // smem
    if registers is not None:
        per_thread = -(-registers // REGISTER_UNIT) * REGISTER_UNIT
        fit = min(fit, REGISTERS_PER_SM // (per_thread * 32 * tactic.num_warps))
    return max(1, min(max_ctas, fit))


def min_chunk(batch: int, num_kv_heads: int, sm_count: int) -> int:
    """The shortest KV chunk a request is split into (tokens)."""
    # Latency regime (batch 1-4 at 8 KV heads): short chunks spread one request over all SMs.
    if latency_regime(batch, num_kv_heads, sm_count):
        return 64
    # 256: the merge re-reads a 2 KB partial per chunk and head group; below 256 tokens
    # (128 KB of KV per head) that traffic and the extra items cost more than they balance.
    return 256


def block_m_for(rows_per_tile_hint: int) -> int:
    """BLOCK_M of a query tile holding `rows_per_tile_hint` packed rows."""
    # tl.dot needs M >= 16; more rows than 64 per tile only for very large groups.
    return max(16, min(64, next_pow2(max(rows_per_tile_hint, 1))))


def next_pow2(n: int) -> int:
    # triton.next_power_of_2 is a ConstexprFunction in Triton 3.6: ~5 us per host call.
    return 1 << (int(n) - 1).bit_length() if n > 1 else 1


_LAUNCH_SHAPES: dict[tuple[Any, ...], tuple[int, int]] = {}


def launch_shape(
    sm_count: int,
    smem_per_sm: int,
    head_dim: int,
    page_size: int,
    block_m: int,
    num_kv_heads: int,
    launch: DecodeLaunch | None = None,
    **variant: Any,
) -> tuple[int, int]:
    """(CTAs of the persistent grid per KV head, KV chunk alignment) of the launch's tactic,
    memoized: they depend only on the arguments, and take ~3 us to derive.

    smem_per_sm: the shared memory the CTAs resident on one SM may use; the planners pass
    `DeviceLimits.shared_memory_per_block` (227 KB on H100/H200, the budget this policy was
    measured with). variant: `default_tactic`'s keyword arguments (kv_itemsize, rope,
    latency)."""
    key: tuple[Any, ...] = (sm_count, smem_per_sm, head_dim, page_size, block_m, num_kv_heads)
    key += (launch, *sorted(variant.items()))
    shape = _LAUNCH_SHAPES.get(key)
    if shape is None:
        how = launch if launch is not None else DEFAULT_LAUNCH
        tactic = how.tactic_for(head_dim, page_size, block_m, **variant)
        itemsize = variant.get("kv_itemsize", 2)
        regs = kernel_registers(
            tactic, head_dim, kv_itemsize=itemsize, rope=variant.get("rope", False)
        )
        per_sm = ctas_per_sm(
            tactic, head_dim, block_m, smem_per_sm, how.max_ctas_per_sm, itemsize, regs
        )
        num_ctas = max(1, (sm_count * per_sm) // num_kv_heads)
        shape = _LAUNCH_SHAPES[key] = (num_ctas, max(tactic.block_n, 16))
    return shape

"""Host side of GDN: checks, buffers, grids and the launch of kernels.py's kernels.

`recurrent` runs the token recurrence (decode T = 1, MTP T > 1) and `chunked` the chunked
prefill; both take gate inputs raw (A_log, a, dt_bias, b) as the definitions and FlashInfer's
decode do. Tactics (`GDNTactic`): the V tile of the state each program holds, warps, pipeline
stages and the precision of the prefill's products.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from flashtune.ops.call import KernelOp
from flashtune.ops.gdn.kernels import (
    CHUNK,
    SUB,
    _chunk_output_kernel,
    _chunk_solve_kernel,
    _chunk_state_kernel,
    _chunk_table_kernel,
    _chunk_wu_kernel,
    _recurrent_kernel,
)
from flashtune.ops.gdn.reference import gdn_gates, recurrent_ref
from flashtune.tune import DEFAULT_TACTIC, DynamicDim, Tactic, TunableRunner, TuningConfig

__all__ = [
    "GDNTactic",
    "DEFAULT_RECURRENT",
    "DEFAULT_MTP",
    "DEFAULT_CHUNKED",
    "RecurrentInputs",
    "ChunkedInputs",
    "RecurrentRunner",
    "ChunkedRunner",
    "recurrent",
    "chunked",
    "check",
]


PRECISIONS = ("half", "tf32", "ieee")


@dataclass(frozen=True)
class GDNTactic:
    """block_v: rows of the [V, K] state a program holds (registers: block_v * K * 4 bytes):
    the decode kernel's and the prefill's state pass; num_warps and num_stages: the same
    kernels' (the prefill's other two kernels are parallel over chunks and keep fixed ones);
    precision: the prefill's products and intermediates (W, U0, U, each chunk's entering
    state): "half" the input's bf16/fp16 on tensor cores with float32 accumulation (fla's
    rounding, the default), "tf32" float32 intermediates with tf32 products, "ieee" float32
    and exact (the checking path, several times slower). The state itself always
    accumulates in float32, and the final state is float32."""

    block_v: int = 32
    num_warps: int = 4
    precision: str = "half"
    num_stages: int = 2


# Unmeasured starting points (no GPU in the session that wrote them): a [32, 128] fp32 tile
# is 16 KB of registers, 32 per thread at 4 warps; benchmarks/bench_gdn.py --sweep measures.
# The prefill's state pass is the only sequential part: a V tile of 32 gives 4 programs per
# value head (128 for one sequence of 32 heads, about one per SM of an H200).
# Decode (one token): fla-core's [8, K] tiles on one warp up to 64 requests of 32 value
# heads, [16, K] beyond (H200, session 22, bench_gdn.py --sweep, one flat grid: batch 1
# 2.7 us against 3.3 for the [32, K] / 4-warp tile it replaced; 64: 68.0 / 68.1 against 70.7;
# 512: 519.4 / 513.8 against 531.3).
# The token loop's pipeline stages: Triton's default (3), which the recurrence always ran at
# (GDNTactic's own default, 2, is the prefill state pass's).
RECURRENT_STAGES = 3
DEFAULT_RECURRENT = GDNTactic(block_v=8, num_warps=1, num_stages=RECURRENT_STAGES)
DEFAULT_RECURRENT_WIDE = GDNTactic(block_v=16, num_warps=1, num_stages=RECURRENT_STAGES)
# (requests x value heads) above which a decode takes DEFAULT_RECURRENT_WIDE
WIDE_FROM_ROWS = 64 * 32
# A few tokens a request (MTP): [8, K] tiles on one warp, fla-core's choice, measured best of
# the sweep at 64 requests x 4 tokens (93.7 us against 139.5 us for a [32, K] 4-warp tile, H200,
# 2026-11-29, before the flat grid): many small programs hide the token loop's latency.
DEFAULT_MTP = GDNTactic(block_v=8, num_warps=1, num_stages=RECURRENT_STAGES)
# Few rows (requests x value heads, up to MTP_NARROW_TO_ROWS): [4, K] tiles, twice the
# programs (session 22, H200, before the one-token-ahead loads: 1 x 2 tokens of 32 heads
# 3.4 us against 4.2, 64 x 4 of 8 heads 30.1 against 31.1); many rows (past
# MTP_WIDE_FROM_ROWS): [16, K] (256 x 2 of 32 heads: 282.8 against 287.5).
DEFAULT_MTP_NARROW = GDNTactic(block_v=4, num_warps=1, num_stages=RECURRENT_STAGES)
DEFAULT_MTP_WIDE = GDNTactic(block_v=16, num_warps=1, num_stages=RECURRENT_STAGES)
MTP_NARROW_TO_ROWS = 512
MTP_WIDE_FROM_ROWS = 4096
# The prefill's (H200, HV 32, D 128, bf16; .gpujobs timing): the state pass is the only
# sequential part, and a V tile of 32 gives 4 programs per value head (128 for one sequence,
# about one per SM): best for 1 x 4096 tokens (V tile 32, 4 warps, 3 stages: 345 us in all
# against 367 at 64 and 388 at 2 stages). Where the sequences alone fill the GPU (16 x 477
# tokens: 2048 programs at 32), a tile of 64 halves the W and k reloads: 672 us against 781.
DEFAULT_CHUNKED = GDNTactic(block_v=32, num_warps=4, precision="half", num_stages=3)
DEFAULT_CHUNKED_WIDE = GDNTactic(block_v=64, num_warps=4, precision="half", num_stages=3)
# Programs of the state pass (at DEFAULT_CHUNKED's tile) from which DEFAULT_CHUNKED_WIDE is
# the default: four per SM of an H100/H200 (132).
WIDE_FROM_PROGRAMS = 4 * 132
# The candidates the autotuner times. The prefill's stay at "half": precision changes the
# error, which is not the tuner's to accept; "tf32" and "ieee" are manual tactics.
BLOCK_V_SPACE = (4, 8, 16, 32, 64, 128)
WARPS_SPACE = (1, 2, 4, 8)
CHUNKED_BLOCK_V_SPACE = (16, 32, 64)
CHUNKED_WARPS_SPACE = (2, 4)
CHUNKED_STAGES_SPACE = (1, 2, 3)
# The output kernel's V tile and warps (parallel over chunks, heads and tiles: 2048 programs
# for 4096 tokens of 32 heads at V 128, so no tuning of its parallelism). A tile of 128
# computes q k^T once per chunk and head: 321 us in all against 326 at 64 (1 x 4096, H200);
# 8 warps were slower (372 us).
OUTPUT_BLOCK_V = 128
OUTPUT_WARPS = 4
# The solve kernel (T = (I + A)^-1 per chunk and head): A is one [64, K] x [K, 64] product,
# a warpgroup MMA at 4 warps (at 2 it falls back to per-warp MMAs); the rest are 16 x 16
# float32 blocks. Offline sm_90 compiles (ptxas -v, K 128, bf16, fresh cache): 206
# registers at 4 warps, no spills, 16.3 KiB of shared memory (2 CTAs, 8 warps an SM; 168
# registers would allow 3); 252 at 2 warps; "tf32" 174. The one-kernel prepare measured
# best at 4 (2 warps: 334 us in all against 325). GPU speed of the split unmeasured.
# Session 22 (H200, bench_gdn.py --solve-sweep, whole prefill, HV 32): A's blocks as ten
# 16 x 16 products over 64 columns a step (`_blockwise_a`) on 2 warps, the small products in
# tf32: 244.8 us at 1 x 4096 tokens and 462.5 at 16 x 477, against 270.3 / 514.3 for the
# one [64, K] x [K, 64] product and its split (`_one_product_a`) on 4 warps with exact small
# products; 4 warps blockwise 297.6 / 558.1 (255 registers), a 32-column step 263.1 / 496.5.
SOLVE_WARPS = 2
SOLVE_BLOCKWISE = True
SOLVE_BK = 64
# The "half" precision's small float32 products (T's block inverses and merges): exact
# ("ieee", CUDA cores), "tf32" (tensor cores, fla's solve_tril choice for its merges) or
# "mixed" (the inverses exact, the merges tf32).
SOLVE_HALF_PRECISION = "tf32"
SOLVE_HALF_FORMS = {"ieee": ("ieee", "ieee"), "tf32": ("tf32", "tf32"), "mixed": ("ieee", "tf32")}
# The W / U0 kernel: one warpgroup (4 warps) issues each [64, 64] x [64, 64] product as one
# wgmma (M 64); a 64-column tile keeps 88 registers and 16 KiB of shared memory (offline
# compile): 5 CTAs an SM by registers (88 x 128 of 64K), 80 of 227 KiB, enough programs in
# flight to cover the loads. 128-column tiles: 128 registers, 24 KiB, 4 CTAs. Two stages:
# the tile loops are unrolled, so stages change little. Unmeasured on a GPU.
WU_WARPS = 4
WU_STAGES = 2
WU_BLOCK = 64


def check(name: str, t: Any, dims: int, dtypes: tuple[torch.dtype, ...] | None = None) -> None:
    """`t` is a tensor of `dims` dimensions (and one of `dtypes`), else an error naming it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must be {names}, got {str(t.dtype).removeprefix('torch.')}")


def check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")


def default_scale(scale: float | None, head_size: int) -> float:
    """The definitions' rule: None or 0 means 1/sqrt(head_size)."""
    return 1.0 / math.sqrt(head_size) if scale is None or scale == 0.0 else float(scale)


def _heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int]:
    h, hk, hv = q.shape[-2], k.shape[-2], v.shape[-2]
    if hk != h:
        raise ValueError(f"num_k_heads ({hk}) must equal num_q_heads ({h})")
    if hv % h:
        raise ValueError(f"num_v_heads ({hv}) must be a multiple of num_q_heads ({h}) (GVA)")
    kdim, vdim = q.shape[-1], v.shape[-1]
    if k.shape[-1] != kdim:
        raise ValueError(f"k's head size ({k.shape[-1]}) must equal q's ({kdim})")
    for what, d in (("head size of q/k", kdim), ("head size of v", vdim)):
        if d < 16 or d & (d - 1):
            raise ValueError(f"the {what} must be a power of two >= 16, got {d}")
    return h, hv, kdim


def _launch_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    state: torch.Tensor | None,
    new_state: torch.Tensor | None,
    output: torch.Tensor,
    scale: float,
    *,
    read_indices: torch.Tensor | None = None,
    write_indices: torch.Tensor | None = None,
    intermediate: torch.Tensor | None = None,
    intermediate_by_slot: bool = True,
    use_qk_l2norm: bool = False,
    raw_gates: bool = True,
    zero_padding: bool = False,
    tactic: GDNTactic = DEFAULT_RECURRENT,
) -> None:
    """The recurrence over q, k [B, T, H, K], v [B, T, HV, V], a, b [B, T, HV], from `state`
    ([P, HV, V, K] float32, any strides; None: zeros) into `new_state` (None: not written;
    may be `state`) and `output` [B, T, HV, V]. Request i reads slot read_indices[i]
    (default i) and writes write_indices[i] (default: the slot it read). raw_gates: a, b are
    the definitions' raw inputs (with A_log, dt_bias); else a is log g and b is beta, float32
    (A_log and dt_bias unread)."""
    batch, steps = q.shape[0], q.shape[1]
    _, hv, kdim = _heads(q, k, v)
    vdim = v.shape[-1]
    group = hv // q.shape[2]
    block_v = min(tactic.block_v, vdim)
    dummy = output
    st = state if state is not None else dummy
    ns = new_state if new_state is not None else dummy
    s_strides = state.stride() if state is not None else (0, 0, 0, 0)
    n_strides = new_state.stride() if new_state is not None else (0, 0, 0, 0)
    grid = (batch * hv * triton_cdiv(vdim, block_v),)
    _recurrent_kernel[grid](
        q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(), b.contiguous(),
        A_log.contiguous(), dt_bias.contiguous(), st, ns, output,
        intermediate if intermediate is not None else dummy,
        read_indices if read_indices is not None else dummy,
        write_indices if write_indices is not None else dummy,
        scale, steps, *s_strides, *n_strides,
        HV=hv, GROUP=group, K=kdim, V=vdim, BV=block_v,
        HAS_STATE=state is not None, HAS_READ_IDX=read_indices is not None,
        HAS_WRITE_IDX=write_indices is not None, WRITE_STATE=new_state is not None,
        HAS_INTER=intermediate is not None, INTER_BY_SLOT=intermediate_by_slot,
        ZERO_PAD=zero_padding,
        L2NORM=use_qk_l2norm, RAW_GATES=raw_gates, PREFETCH=steps > 1,
        num_warps=tactic.num_warps, num_stages=tactic.num_stages,
    )  # fmt: skip


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def chunk_table(
    cu_seqlens: torch.Tensor, total: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(first token, length) of every CHUNK-token chunk of every sequence, and each
    sequence's first chunk slot, int32, computed on cu_seqlens' device without a host sync
    (so a CUDA graph can capture the prefill): one slot per possible chunk, total // CHUNK +
    N of them (a sequence adds at most one partial chunk), in order of sequence then chunk;
    the slots past the last chunk have length 0. Chunks never straddle sequences."""
    n = cu_seqlens.shape[0] - 1
    cu = cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]
    chunks = (lengths + CHUNK - 1) // CHUNK
    ends = chunks.cumsum(0)
    slot = torch.arange(total // CHUNK + n, device=cu.device)
    seq = torch.searchsorted(ends, slot, right=True).clamp_(max=n - 1)
    start = cu[seq] + (slot - (ends[seq] - chunks[seq])) * CHUNK
    length = (cu[seq + 1] - start).clamp_(0, CHUNK)
    length = torch.where(slot < ends[-1], length, 0)
    return start.to(torch.int32), length.to(torch.int32), (ends - chunks).to(torch.int32)


def chunk_table_device(
    cu_seqlens: torch.Tensor, total: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`chunk_table`'s three tensors from one Triton kernel (`_chunk_table_kernel`): what
    the prefill launches (the torch form costs ~15 small kernels a call)."""
    n = cu_seqlens.shape[0] - 1
    slots = total // CHUNK + n
    dev = cu_seqlens.device
    starts = torch.empty(slots, dtype=torch.int32, device=dev)
    lengths = torch.empty(slots, dtype=torch.int32, device=dev)
    first = torch.empty(n, dtype=torch.int32, device=dev)
    block_s = 64
    _chunk_table_kernel[(triton_cdiv(slots, block_s),)](
        cu_seqlens, starts, lengths, first, n, slots,
        C=CHUNK, BS=block_s, BN=min(64, max(16, 1 << (n - 1).bit_length())),
    )  # fmt: skip
    return starts, lengths, first


def _launch_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor | None,
    new_state: torch.Tensor,
    output: torch.Tensor,
    scale: float,
    *,
    raw_gates: bool = True,
    tactic: GDNTactic = DEFAULT_CHUNKED,
) -> None:
    """The chunked prefill over packed q, k [T, H, K], v [T, HV, V], a, b [T, HV] by
    cu_seqlens [N + 1], from `state` [N, HV, V, K] float32 (None: zeros) into `new_state`
    [N, HV, V, K] and `output` [T, HV, V]. raw_gates as `recurrent`'s. Four kernels
    (kernels.py): the chunks' T = (I + A)^-1 and decays, then their W and U0, in parallel;
    the state pass along each sequence; the outputs in parallel."""
    if tactic.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {tactic.precision!r}")
    total = q.shape[0]
    _, hv, kdim = _heads(q, k, v)
    vdim = v.shape[-1]
    group = hv // q.shape[1]
    num_seqs = cu_seqlens.shape[0] - 1
    if num_seqs == 0:
        return
    starts, lengths, first = chunk_table_device(cu_seqlens, total)
    slots = starts.numel()
    dev = q.device
    # "half": the intermediates in v's dtype (q, k may come float32, l2-normalized, and are
    # rounded to it for the products, as fla's bf16 l2norm output is). The float32 products
    # left in "half" (T's 16 x 16 block inverses and merges) are tiny, so they run exact.
    inter = v.dtype if tactic.precision == "half" else torch.float32
    precision = "ieee" if tactic.precision == "half" else tactic.precision
    w = torch.empty(total, hv, kdim, dtype=inter, device=dev)
    u = torch.empty(total, hv, vdim, dtype=inter, device=dev)
    vn = torch.empty(total, hv, vdim, dtype=inter, device=dev)
    g = torch.empty(total, hv, dtype=torch.float32, device=dev)
    h = torch.empty(slots, hv, kdim, vdim, dtype=inter, device=dev)
    t_inv = torch.empty(total, hv, CHUNK, dtype=inter, device=dev)
    q, k, v, b = q.contiguous(), k.contiguous(), v.contiguous(), b.contiguous()
    inv_precision, merge_precision = (
        SOLVE_HALF_FORMS[SOLVE_HALF_PRECISION] if tactic.precision == "half"
        else (precision, precision)
    )  # fmt: skip
    _chunk_solve_kernel[(slots, hv)](
        k, a.contiguous(), b, A_log.contiguous(), dt_bias.contiguous(), starts, lengths,
        t_inv, g,
        HV=hv, GROUP=group, K=kdim, C=CHUNK, SUB=SUB, PRECISION=merge_precision,
        INV_PRECISION=inv_precision, RAW_GATES=raw_gates, BLOCKWISE=SOLVE_BLOCKWISE,
        BK=min(SOLVE_BK, kdim), num_warps=SOLVE_WARPS,
    )  # fmt: skip
    _chunk_wu_kernel[(slots, hv)](
        k, v, b, t_inv, g, starts, lengths, w, u,
        HV=hv, GROUP=group, K=kdim, V=vdim, C=CHUNK, SUB=SUB, BK=min(WU_BLOCK, kdim),
        BV=min(WU_BLOCK, vdim), PRECISION=precision, RAW_GATES=raw_gates,
        num_warps=WU_WARPS, num_stages=WU_STAGES,
    )  # fmt: skip
    block_v = min(tactic.block_v, vdim)
    s_strides = state.stride() if state is not None else (0, 0, 0, 0)
    _chunk_state_kernel[(num_seqs, hv, triton_cdiv(vdim, block_v))](
        k, w, u, g, cu_seqlens, first, state if state is not None else new_state, new_state,
        h, vn, *s_strides, *new_state.stride(),
        HV=hv, GROUP=group, K=kdim, V=vdim, BV=block_v, C=CHUNK,
        KH=kdim // 2 if kdim >= 32 else kdim, HAS_STATE=state is not None,
        PRECISION=precision, num_warps=tactic.num_warps, num_stages=tactic.num_stages,
    )  # fmt: skip
    block_o = min(OUTPUT_BLOCK_V, vdim)
    _chunk_output_kernel[(slots, hv, triton_cdiv(vdim, block_o))](
        q, k, g, h, vn, starts, lengths, output, scale,
        HV=hv, GROUP=group, K=kdim, V=vdim, BV=block_o, C=CHUNK, PRECISION=precision,
        num_warps=OUTPUT_WARPS,
    )  # fmt: skip


# --------------------------------------------------------------------------- the autotuner's view


class RecurrentInputs(NamedTuple):
    """RecurrentRunner's inputs (`_launch_recurrent`'s arguments); the tuner keys on them all,
    bucketing the requests (q's first dimension)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    A_log: torch.Tensor  # noqa: N815 (the Definitions' name)
    a: torch.Tensor
    dt_bias: torch.Tensor
    b: torch.Tensor
    state: torch.Tensor | None
    new_state: torch.Tensor | None
    output: torch.Tensor
    read_indices: torch.Tensor | None
    write_indices: torch.Tensor | None
    intermediate: torch.Tensor | None
    scale: float
    intermediate_by_slot: bool
    use_qk_l2norm: bool
    raw_gates: bool
    # Padding requests' output rows written as zeros (the output is the call's own; a given
    # one keeps its values there, as FlashInfer's).
    zero_padding: bool = False


class ChunkedInputs(NamedTuple):
    """ChunkedRunner's inputs (`_launch_chunked`'s); the tuner buckets the tokens."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    A_log: torch.Tensor  # noqa: N815
    a: torch.Tensor
    dt_bias: torch.Tensor
    b: torch.Tensor
    cu_seqlens: torch.Tensor
    state: torch.Tensor | None
    new_state: torch.Tensor
    output: torch.Tensor
    scale: float
    raw_gates: bool


def _tactic(tactic: Tactic, default: GDNTactic) -> GDNTactic:
    cfg = default if tactic == DEFAULT_TACTIC else tactic
    assert isinstance(cfg, GDNTactic)
    return cfg


class RecurrentRunner(TunableRunner):
    """The decode / MTP kernel: the V tile of the state a program holds and its warps."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        vdim = inputs[2].shape[-1]
        return [GDNTactic(bv, w, num_stages=RECURRENT_STAGES) for bv in BLOCK_V_SPACE
                if bv <= vdim for w in WARPS_SPACE]  # fmt: skip

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        x = RecurrentInputs(*inputs)
        _launch_recurrent(
            x.q, x.k, x.v, x.A_log, x.a, x.dt_bias, x.b, x.state, x.new_state, x.output,
            x.scale, read_indices=x.read_indices, write_indices=x.write_indices,
            intermediate=x.intermediate, intermediate_by_slot=x.intermediate_by_slot,
            use_qk_l2norm=x.use_qk_l2norm, raw_gates=x.raw_gates, zero_padding=x.zero_padding,
            tactic=_tactic(tactic, _recurrent_default(x)),
        )  # fmt: skip
        return x.output


def _recurrent_default(x: RecurrentInputs) -> GDNTactic:
    """Several tokens a request: DEFAULT_MTP, narrower or wider by the rows (requests x
    value heads); one: DEFAULT_RECURRENT, or its wider tile past WIDE_FROM_ROWS."""
    rows = x.q.shape[0] * x.v.shape[2]
    if x.q.shape[1] > 1:
        if rows <= MTP_NARROW_TO_ROWS:
            return DEFAULT_MTP_NARROW
        return DEFAULT_MTP_WIDE if rows > MTP_WIDE_FROM_ROWS else DEFAULT_MTP
    return DEFAULT_RECURRENT_WIDE if rows > WIDE_FROM_ROWS else DEFAULT_RECURRENT


class ChunkedRunner(TunableRunner):
    """The chunked prefill: the state pass's V tile, warps and pipeline stages, at "half"
    precision (tf32 and ieee are manual tactics: their error is not the tuner's to trade)."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        vdim = inputs[2].shape[-1]
        return [
            GDNTactic(bv, w, "half", st)
            for bv in CHUNKED_BLOCK_V_SPACE
            if bv <= vdim
            for w in CHUNKED_WARPS_SPACE
            for st in CHUNKED_STAGES_SPACE
        ]

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        x = ChunkedInputs(*inputs)
        _launch_chunked(
            x.q, x.k, x.v, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens, x.state, x.new_state,
            x.output, x.scale, raw_gates=x.raw_gates, tactic=_tactic(tactic, _chunked_default(x)),
        )  # fmt: skip
        return x.output


def _chunked_default(x: ChunkedInputs) -> GDNTactic:
    """DEFAULT_CHUNKED, or its wider V tile where the sequences alone give the state pass
    WIDE_FROM_PROGRAMS programs (shapes only: no host sync)."""
    programs = (x.cu_seqlens.shape[0] - 1) * x.v.shape[1] * max(1, x.v.shape[2] // 32)
    return DEFAULT_CHUNKED_WIDE if programs >= WIDE_FROM_PROGRAMS else DEFAULT_CHUNKED


def _gates_of(x: RecurrentInputs | ChunkedInputs) -> tuple[torch.Tensor, torch.Tensor]:
    if x.raw_gates:
        return gdn_gates(x.A_log, x.a, x.dt_bias, x.b)
    return torch.exp(x.a.float()), x.b.float()


def _recurrent_reference(inputs: Sequence[Any]) -> None:
    """The CPU path (no kernel can run): reference.recurrent_ref, with the slots."""
    x = RecurrentInputs(*inputs)
    g, beta = _gates_of(x)
    batch = x.q.shape[0]
    reads = torch.arange(batch) if x.read_indices is None else x.read_indices.long().cpu()
    writes = reads if x.write_indices is None else x.write_indices.long().cpu()
    valid = reads >= 0
    start = None
    if x.state is not None:
        start = torch.zeros(batch, *x.state.shape[1:], device=x.q.device)
        start[valid] = x.state[reads[valid]].float()
    steps = x.q.shape[1]
    out, final = recurrent_ref(x.q, x.k, x.v, g, beta, start, x.scale, x.use_qk_l2norm)
    x.output[valid] = out[valid].to(x.output.dtype)
    if x.zero_padding:
        x.output[~valid] = 0
    if x.intermediate is not None:  # each token's state: run the prefixes (a CPU path)
        for t in range(steps):
            _, s_t = recurrent_ref(x.q[:, : t + 1], x.k[:, : t + 1], x.v[:, : t + 1],
                                   g[:, : t + 1], beta[:, : t + 1], start, x.scale,
                                   x.use_qk_l2norm)  # fmt: skip
            rows = reads if x.intermediate_by_slot else torch.arange(batch)
            x.intermediate[rows[valid], t] = s_t[valid]
    if x.new_state is not None:
        keep = valid & (writes >= 0)
        x.new_state[writes[keep]] = final[keep]


def _chunked_reference(inputs: Sequence[Any]) -> None:
    """The CPU path: the token recurrence per sequence."""
    x = ChunkedInputs(*inputs)
    g, beta = _gates_of(x)
    cu = x.cu_seqlens.tolist()
    for n, (lo, hi) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        start = None if x.state is None else x.state[n : n + 1]
        sl = slice(lo, hi)
        out, final = recurrent_ref(x.q[None, sl], x.k[None, sl], x.v[None, sl], g[None, sl],
                                   beta[None, sl], start, x.scale)  # fmt: skip
        x.output[sl] = out[0].to(x.output.dtype)
        x.new_state[n] = final[0] if hi > lo else 0.0


RECURRENT_TUNING = TuningConfig(dynamic_dims=(DynamicDim(input_idx=0, dim=0),))
CHUNKED_TUNING = TuningConfig(dynamic_dims=(DynamicDim(input_idx=0, dim=0),))
_RECURRENT = KernelOp("flashtune::gdn_recurrent", (RecurrentRunner(),), RECURRENT_TUNING,
                      _recurrent_reference)  # fmt: skip
_CHUNKED = KernelOp("flashtune::gdn_chunked", (ChunkedRunner(),), CHUNKED_TUNING,
                    _chunked_reference)  # fmt: skip


def recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    state: torch.Tensor | None,
    new_state: torch.Tensor | None,
    output: torch.Tensor,
    scale: float,
    *,
    read_indices: torch.Tensor | None = None,
    write_indices: torch.Tensor | None = None,
    intermediate: torch.Tensor | None = None,
    intermediate_by_slot: bool = True,
    use_qk_l2norm: bool = False,
    raw_gates: bool = True,
    zero_padding: bool = False,
    tactic: GDNTactic | None = None,
) -> None:
    """`_launch_recurrent` through the autotuner's dispatch (its tactic per bucket of
    requests; the reference where no kernel runs), or with `tactic` when given."""
    inputs = RecurrentInputs(q, k, v, A_log, a, dt_bias, b, state, new_state, output,
                             read_indices, write_indices, intermediate, scale,
                             intermediate_by_slot, use_qk_l2norm, raw_gates,
                             zero_padding)  # fmt: skip
    if tactic is not None:
        RecurrentRunner().forward(inputs, tactic)
    else:
        _RECURRENT(inputs)


def chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor | None,
    new_state: torch.Tensor,
    output: torch.Tensor,
    scale: float,
    *,
    raw_gates: bool = True,
    tactic: GDNTactic | None = None,
) -> None:
    """`_launch_chunked` through the autotuner's dispatch (per bucket of tokens), or with
    `tactic` when given."""
    inputs = ChunkedInputs(q, k, v, A_log, a, dt_bias, b, cu_seqlens, state, new_state, output,
                           scale, raw_gates)  # fmt: skip
    if tactic is not None:
        ChunkedRunner().forward(inputs, tactic)
    else:
        _CHUNKED(inputs)

"""Host side of GEMM: the kernels' launches (kernels.py), the three runners the autotuner
chooses from and their tuning config, input validation, and the torch custom op that
torch.compile traces through.

Runners' inputs: GemmInputs (A [M, K], B [N, K] (any strides), bias [N] | None, out [M, N]
| None, scales (A_scale, B_scale) | None); the tuner passes the first three. Tactics and
search spaces come from config.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
import triton

from flashtune import platform
from flashtune.ops.call import KernelOp, SchemaChecks, field_index, inputs_of, named, traced
from flashtune.ops.gemm.config import (
    SMALL_M,
    SmallMSpace,
    SmallMTactic,
    TiledSpace,
    TiledTactic,
    small_m_candidates,
    small_m_default_tactic,
    split_k_ok,
    tiled_candidates,
    tiled_default_tactic,
)
from flashtune.ops.gemm.kernels import (
    _gemm_small_m_kernel,
    _gemm_small_m_streamk_kernel,
    _gemm_tiled_kernel,
)
from flashtune.ops.gemm.reference import gemm_fp8_ref, gemm_ref
from flashtune.ops.gemm.schema import GEMM, GEMM_KN
from flashtune.tune import (
    DEFAULT_TACTIC,
    DynamicDim,
    Tactic,
    TunableRunner,
    TuningConfig,
)
from flashtune.tune.search import tile_cost

__all__ = [
    "GemmInputs",
    "CublasRunner",
    "TritonTiledRunner",
    "TritonSmallMRunner",
    "GEMM_RUNNERS",
    "GEMM_TUNING",
    "launch_tiled",
    "launch_small_m",
    "launch_small_m_streamk",
    "split_k_counters",
]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FP8 = torch.float8_e4m3fn
_FP8_OUT_DTYPES = (torch.bfloat16, torch.float16)
_LAYOUTS = ("nk", "kn")


# ----------------------------------------------------------------------------------------------
# Launches of the kernels (kernels.py)
# ----------------------------------------------------------------------------------------------

_COUNTERS: dict[torch.device, torch.Tensor] = {}
# Counters are allocated once per device with headroom, so a launch inside CUDA-graph
# capture (after one warm-up call) never allocates.
_MIN_COUNTERS = 1 << 16


def split_k_counters(device: torch.device, num_tiles: int) -> torch.Tensor:
    """The device's zeroed int32 arrival counters, at least `num_tiles` of them.

    Kernels leave them zero, so they are shared by every split-K launch on the device.
    Launches on two streams at once must not share them: the GEMM API launches on the
    current stream only.
    """
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < num_tiles:
        if torch.cuda.is_available() and device.type == "cuda":
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "gemm split-K: counters must be allocated before CUDA graph capture; "
                    "run the GEMM once outside the graph first"
                )
        buf = torch.zeros(max(num_tiles, _MIN_COUNTERS), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


def _extras(
    A: torch.Tensor,
    C: torch.Tensor,
    bias: torch.Tensor | None,
    scales: tuple[torch.Tensor, torch.Tensor] | None,
    split_k: int,
    num_tiles: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    M, N = C.shape
    dummy = C  # never read: guarded by a constexpr or by SPLIT_K == 1
    if split_k > 1:
        ws = torch.empty((split_k, M, N), dtype=torch.float32, device=A.device)
        locks = split_k_counters(A.device, num_tiles)
    else:
        ws = locks = dummy
    sa, sb = scales if scales is not None else (dummy, dummy)
    return (bias if bias is not None else dummy), ws, locks, sa, sb


def launch_tiled(
    A: torch.Tensor,  # [M, K]
    B: torch.Tensor,  # [N, K], any strides
    C: torch.Tensor,  # [M, N]
    bias: torch.Tensor | None,  # [N]
    scales: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    block_m: int,
    block_n: int,
    block_k: int,
    group_m: int,
    split_k: int,
    num_warps: int,
    num_stages: int,
) -> torch.Tensor:
    """C = A @ B.T (+ bias) with the tiled kernel."""
    M, K = A.shape
    N = B.shape[0]
    num_tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    bias_arg, ws, locks, sa, sb = _extras(A, C, bias, scales, split_k, num_tiles)
    grid = (num_tiles, split_k)
    _gemm_tiled_kernel[grid](
        A,
        B,
        C,
        bias_arg,
        ws,
        locks,
        sa,
        sb,
        M,
        N,
        K,
        split_k,
        A.stride(0),
        A.stride(1),
        B.stride(0),
        B.stride(1),
        C.stride(0),
        C.stride(1),
        HAS_BIAS=bias is not None,
        HAS_SCALE=scales is not None,
        IEEE_FP32=A.dtype == torch.float32,
        EVEN_K=K % block_k == 0,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=group_m,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return C


def launch_small_m(
    A: torch.Tensor,  # [M, K]
    B: torch.Tensor,  # [N, K], any strides
    C: torch.Tensor,  # [M, N]
    bias: torch.Tensor | None,  # [N]
    scales: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    block_m: int,
    block_n: int,
    block_k: int,
    split_k: int,
    num_warps: int,
    num_stages: int,
) -> torch.Tensor:
    """C = A @ B.T (+ bias) with the decode (small-M) kernel."""
    M, K = A.shape
    N = B.shape[0]
    m_tiles = triton.cdiv(M, block_m)
    n_tiles = triton.cdiv(N, block_n)
    bias_arg, ws, locks, sa, sb = _extras(A, C, bias, scales, split_k, m_tiles * n_tiles)
    grid = (n_tiles, split_k, m_tiles)
    _gemm_small_m_kernel[grid](
        A,
        B,
        C,
        bias_arg,
        ws,
        locks,
        sa,
        sb,
        M,
        N,
        K,
        split_k,
        A.stride(0),
        A.stride(1),
        B.stride(0),
        B.stride(1),
        C.stride(0),
        C.stride(1),
        HAS_BIAS=bias is not None,
        HAS_SCALE=scales is not None,
        IEEE_FP32=A.dtype == torch.float32,
        EVEN_K=K % block_k == 0,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return C


def launch_small_m_streamk(
    A: torch.Tensor,  # [M, K], M <= block_m
    B: torch.Tensor,  # [N, K], any strides
    C: torch.Tensor,  # [M, N]
    bias: torch.Tensor | None,  # [N]
    scales: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    block_m: int,
    block_n: int,
    block_k: int,
    programs: int,
    num_warps: int,
    num_stages: int,
) -> torch.Tensor:
    """C = A @ B.T (+ bias) with the stream-K decode kernel over `programs` programs."""
    M, K = A.shape
    N = B.shape[0]
    if M > block_m:
        raise ValueError(f"stream-K decode kernel: M={M} exceeds block_m={block_m}")
    n_tiles = triton.cdiv(N, block_n)
    k_tiles = max(triton.cdiv(K, block_k), 1)
    total = n_tiles * k_tiles
    iters = triton.cdiv(total, max(1, min(programs, total)))
    grid = (triton.cdiv(total, iters),)
    max_slots = (k_tiles - 1) // iters + 2
    if iters % k_tiles:  # some runs end inside a tile: partials need a workspace
        ws = torch.empty(
            (n_tiles, max_slots, block_m, block_n), dtype=torch.float32, device=A.device
        )
    else:
        ws = C
    locks = split_k_counters(A.device, n_tiles)
    dummy = C
    sa, sb = scales if scales is not None else (dummy, dummy)
    _gemm_small_m_streamk_kernel[grid](
        A,
        B,
        C,
        bias if bias is not None else dummy,
        ws,
        locks,
        sa,
        sb,
        M,
        N,
        K,
        iters,
        max_slots,
        A.stride(0),
        A.stride(1),
        B.stride(0),
        B.stride(1),
        C.stride(0),
        C.stride(1),
        HAS_BIAS=bias is not None,
        HAS_SCALE=scales is not None,
        IEEE_FP32=A.dtype == torch.float32,
        EVEN_K=K % block_k == 0,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return C


# ----------------------------------------------------------------------------------------------
# Runners. inputs: GemmInputs; the tuner passes the first three.
# ----------------------------------------------------------------------------------------------


class GemmInputs(NamedTuple):
    """The runners' inputs; the tuner keys on A, B and bias and passes only them."""

    A: torch.Tensor  # [M, K]
    B: torch.Tensor  # [N, K], any strides (the transposed view of a [K, N] B)
    bias: torch.Tensor | None = None  # [N]
    out: torch.Tensor | None = None  # [M, N]; None: a new tensor
    scales: tuple[torch.Tensor, torch.Tensor] | None = None  # fp8: (A_scale, B_scale), [1]


def _out_dtype(A: torch.Tensor, out: torch.Tensor | None) -> torch.dtype:
    if out is not None:
        return out.dtype
    return torch.bfloat16 if A.dtype == _FP8 else A.dtype


def _alloc_out(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is not None:
        return out
    return torch.empty((A.shape[0], B.shape[0]), dtype=_out_dtype(A, out), device=A.device)


class CublasRunner(TunableRunner):
    """torch's GEMM (cuBLAS / cuBLASLt on a GPU). One tactic: the default."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return []

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> torch.Tensor:
        A, B, bias, out, scales = named(GemmInputs, inputs)
        if scales is not None:
            return _scaled_mm(A, B, bias, out, scales)
        if out is None:
            return F.linear(A, B, bias)
        if bias is None:
            return torch.mm(A, B.T, out=out)
        return torch.addmm(bias, A, B.T, out=out)


def _scaled_mm(A, B, bias, out, scales) -> torch.Tensor:
    sa, sb = scales
    dtype = _out_dtype(A, out)
    try:
        # cuBLASLt fp8 wants B.T column-major, i.e. B [N, K] row-major.
        C = torch._scaled_mm(
            A, B.contiguous().T, scale_a=sa, scale_b=sb, bias=bias, out_dtype=dtype
        )
    except (RuntimeError, NotImplementedError):  # shapes/devices cuBLASLt fp8 does not take
        C = gemm_fp8_ref(A, B, sa, sb, dtype, bias)
    if out is not None:
        out.copy_(C)
        return out
    return C


def _tile_estimate(
    inputs: Sequence[Any], block_m: int, block_n: int, block_k: int, split_k: int, stream_k: int = 0
) -> float:
    """The cost model's estimate of a tile configuration at these inputs (tune/search.py's
    tile_cost with the device's SMs and L2, waves priced on the FLOPs only): the tuner times
    the best estimates first and lets patience cut the tail (docs/autotune.md)."""
    A, B = inputs[0], inputs[1]
    (M, K), N = A.shape, B.shape[0]
    limits = platform.device_limits(A.device)
    return tile_cost(
        M, N, K, block_m, block_n, block_k, split_k, limits.sm_count,
        elem_bytes=A.element_size(), stream_k=stream_k, l2_bytes=limits.l2_bytes,
        bandwidth_waves=False,
    )  # fmt: skip


class TritonTiledRunner(TunableRunner):
    """Tiled Triton GEMM. get_valid_tactics hands out a pruned list per shape (about a dozen
    configurations known to be good on Hopper); exhaustive=True hands out all of TiledSpace
    that fits the device."""

    def __init__(self, exhaustive: bool = False) -> None:
        self.exhaustive = exhaustive

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        A, B = inputs[0], inputs[1]
        M, K = A.shape
        N = B.shape[0]
        limits = platform.device_limits(A.device)
        smem = limits.shared_memory_per_block
        elem = A.element_size()
        space = (
            iter(TiledSpace()) if self.exhaustive else tiled_candidates(M, N, K, limits.sm_count)
        )
        return [
            t.as_tactic()
            for t in space
            if t.smem_bytes(elem) <= smem and split_k_ok(M, N, K, t.block_k, t.split_k)
        ]

    def estimate_cost(self, inputs: Sequence[Any], profile: Any, tactic: Tactic) -> float | None:
        t = TiledTactic.from_tactic(tactic)
        return _tile_estimate(inputs, t.block_m, t.block_n, t.block_k, t.split_k)

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> torch.Tensor:
        A, B, bias, out, scales = named(GemmInputs, inputs)
        M, K = A.shape
        N = B.shape[0]
        t = (
            tiled_default_tactic(M, N, K)
            if tactic == DEFAULT_TACTIC
            else TiledTactic.from_tactic(tactic)
        )
        C = _alloc_out(A, B, out)
        if M == 0 or N == 0:
            return C
        return launch_tiled(
            A,
            B,
            C,
            bias,
            scales,
            block_m=t.block_m,
            block_n=t.block_n,
            block_k=t.block_k,
            group_m=t.group_m,
            split_k=t.split_k,
            num_warps=t.num_warps,
            num_stages=t.num_stages,
        )


class TritonSmallMRunner(TunableRunner):
    """The decode GEMM (M <= 16, any M correct): N and split K spread over many CTAs, B read
    once with 16-byte loads. Tactics are offered for M <= 4 * SMALL_M."""

    def __init__(self, exhaustive: bool = False) -> None:
        self.exhaustive = exhaustive

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        A, B = inputs[0], inputs[1]
        M, K = A.shape
        N = B.shape[0]
        if M > 4 * SMALL_M:
            return []
        sms = platform.device_limits(A.device).sm_count
        space = iter(SmallMSpace()) if self.exhaustive else small_m_candidates(M, N, K, sms)
        return [
            t.as_tactic()
            for t in space
            if split_k_ok(M, N, K, t.block_k, t.split_k)
            # The grid's y/z dimensions hold split-K and the M tiles.
            and math.ceil(M / t.block_m) <= platform.MAX_GRID_YZ
            and (t.block_m >= 16 or t.block_m >= M)  # FMA tiles only when one tile holds M
            and (t.stream_k == 0 or t.block_m >= M)
        ]

    def estimate_cost(self, inputs: Sequence[Any], profile: Any, tactic: Tactic) -> float | None:
        t = SmallMTactic.from_tactic(tactic)
        return _tile_estimate(inputs, t.block_m, t.block_n, t.block_k, t.split_k, t.stream_k)

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> torch.Tensor:
        A, B, bias, out, scales = named(GemmInputs, inputs)
        M, K = A.shape
        N = B.shape[0]
        C = _alloc_out(A, B, out)
        if M == 0 or N == 0:
            return C
        if tactic == DEFAULT_TACTIC:
            if math.ceil(M / 16) > platform.MAX_GRID_YZ:  # past the grid: the tiled kernel
                return TritonTiledRunner().forward([A, B, bias, C, scales])
            t = small_m_default_tactic(M, N, K, platform.device_limits(A.device).sm_count)
        else:
            t = SmallMTactic.from_tactic(tactic)
        if t.stream_k > 0 and M <= t.block_m and K > 0:
            return launch_small_m_streamk(
                A,
                B,
                C,
                bias,
                scales,
                block_m=t.block_m,
                block_n=t.block_n,
                block_k=t.block_k,
                programs=t.stream_k * platform.device_limits(A.device).sm_count,
                num_warps=t.num_warps,
                num_stages=t.num_stages,
            )
        return launch_small_m(
            A,
            B,
            C,
            bias,
            scales,
            block_m=t.block_m,
            block_n=t.block_n,
            block_k=t.block_k,
            split_k=t.split_k,
            num_warps=t.num_warps,
            num_stages=t.num_stages,
        )


# cuBLAS first: the fallback until the autotuner has measured the Triton runners.
GEMM_RUNNERS: tuple[TunableRunner, ...] = (
    CublasRunner(),
    TritonSmallMRunner(),
    TritonTiledRunner(),
)
# M is tuned per power-of-two bucket; N and K (and dtypes) are part of the key. CUDA graphs:
# decode GEMMs run for 5-20 us, less than a Triton launch costs on the host.
GEMM_TUNING = TuningConfig(
    dynamic_dims=(DynamicDim(input_idx=field_index(GemmInputs, "A"), dim=0),),
    cold_l2=True,
    use_cuda_graph=True,
)


# ----------------------------------------------------------------------------------------------
# Validation (from the schemas), the public functions' host side (__init__.py), the custom op
# ----------------------------------------------------------------------------------------------


def _reference(a: GemmInputs) -> torch.Tensor:
    """Where no kernel can run: the references (fp8: out is given)."""
    if a.scales is not None:
        assert a.out is not None
        C = gemm_fp8_ref(a.A, a.B, a.scales[0], a.scales[1], a.out.dtype, a.bias)
    else:
        C = gemm_ref(a.A, a.B, a.bias)
    return a.out.copy_(C) if a.out is not None else C


_GEMM = KernelOp("gemm", GEMM_RUNNERS, GEMM_TUNING, _reference, tuned=3)
# fp8 needs a GPU: the interpreter has no fp8 dot.
_GEMM_FP8 = KernelOp(
    "gemm_fp8",
    GEMM_RUNNERS,
    GEMM_TUNING,
    _reference,
    tuned=3,
    kernels_available=lambda device: device.type == "cuda",
)

# A, B (by b_layout: [N, K] or [K, N]), bias [N] and out [M, N], any strides; fp16/bf16/fp32,
# all in A's dtype. mm_fp8: A and B float8_e4m3fn, bias and out in its `dtype` argument.
_CHECKS = {
    layout: SchemaChecks(schema, dtypes={"A": _DTYPES}, outputs={"C": "out"}, contiguous=False)
    for layout, schema in (("nk", GEMM), ("kn", GEMM_KN))
}
_CHECKS_FP8 = {
    layout: SchemaChecks(
        schema,
        dtypes={"A": (_FP8,)},
        outputs={"C": "out"},
        contiguous=False,
        dtype_from={"bias": "dtype", "C": "dtype"},
    )
    for layout, schema in (("nk", GEMM), ("kn", GEMM_KN))
}


def _validate(
    checks: dict[str, SchemaChecks], arguments: dict[str, Any], b_layout: str
) -> torch.Tensor:
    """Check the arguments; return B as a logical [N, K] view."""
    if b_layout not in _LAYOUTS:
        raise ValueError(f"b_layout must be one of {_LAYOUTS}, got {b_layout!r}")
    checks[b_layout].validate(arguments)
    B = arguments["B"]
    return B if b_layout == "nk" else B.T


def _mm_fake(A, B, bias, b_layout):
    N = B.shape[0] if b_layout == "nk" else B.shape[1]
    return A.new_empty((A.shape[0], N))


# torch.compile traces through the custom op (functional: out is filled from its result);
# eager calls launch directly, since the dispatcher adds host time to every call (measured by
# benchmarks/bench_gemm.py, row "custom_op_overhead_us").
@traced(
    "mm",
    schema="(Tensor A, Tensor B, Tensor? bias, str b_layout) -> Tensor",
    fake=_mm_fake,
    out=True,
)
def _mm(
    A: torch.Tensor,
    B: torch.Tensor,
    bias: torch.Tensor | None,
    b_layout: str,
    out: torch.Tensor | None,
) -> torch.Tensor:
    B_nk = _validate(_CHECKS, {"A": A, "B": B, "bias": bias, "out": out}, b_layout)
    return _GEMM(inputs_of(GemmInputs, (A, B_nk, bias, out, None)))


def _mm_fp8(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    dtype: torch.dtype,
    out: torch.Tensor | None,
    bias: torch.Tensor | None,
    b_layout: str,
) -> torch.Tensor:
    if dtype not in _FP8_OUT_DTYPES:
        raise TypeError(f"dtype must be one of {_FP8_OUT_DTYPES}, got {dtype}")
    arguments = {"A": A, "B": B, "bias": bias, "out": out, "dtype": dtype}
    B_nk = _validate(_CHECKS_FP8, arguments, b_layout)
    scales = []
    for name, s in (("A_scale", A_scale), ("B_scale", B_scale)):
        if not isinstance(s, torch.Tensor) or s.numel() != 1 or s.dtype != torch.float32:
            raise TypeError(f"{name} must be a float32 tensor with one element, got {s!r}")
        if s.device != A.device:
            raise ValueError(f"{name} is on {s.device} but A is on {A.device}")
        scales.append(s.reshape(1))
    if out is None:
        out = torch.empty((A.shape[0], B_nk.shape[0]), dtype=dtype, device=A.device)
    return _GEMM_FP8(inputs_of(GemmInputs, (A, B_nk, bias, out, (scales[0], scales[1]))))

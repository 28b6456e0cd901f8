"""GEMM: C = A @ B.T with B stored [N, K] (the FlashInfer-Trace `gemm` definitions), or
C = A @ B with B stored [K, N]; fp16/bf16 (and fp32) inputs, fp32 accumulation, optional bias;
fp8 e4m3 with per-tensor scales and a bf16/fp16 output (`mm_fp8`).

Three runners compute it (the kernels live in gemm_kernels.py, their tactics, search spaces
and defaults in gemm_config.py):
- `CublasRunner`: torch (F.linear / addmm / _scaled_mm), i.e. cuBLAS(Lt) on a GPU.
- `TritonTiledRunner`: a tiled Triton GEMM; tactics span block sizes, warps, stages, group-M
  swizzle and split-K (`TiledTactic`, space `TiledSpace`).
- `TritonSmallMRunner`: the decode GEMM (M <= 16): bound by reading B once, so it spreads
  N and a split K over many CTAs (a split-K grid, or a stream-K schedule with equal work
  per SM) and reads B with 16-byte loads (`SmallMTactic`, space `SmallMSpace`).
  H200, bf16, 162 corpus shapes with M <= 16: 1.08x cuBLAS geomean with the best tactic
  per shape (benchmarks/results/gemm.jsonl).
The public `mm` asks the autotuner (`choose_one("gemm", GEMM_RUNNERS, GEMM_TUNING, ...)`,
M tuned per power-of-two bucket) which runner and tactic to launch.

Layouts: for b_layout="kn" B is passed on as its transposed view, so every runner sees B as a
logical [N, K] tensor and reads it through its strides (no copy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from flashtune import platform
from flashtune.model_shapes import ModelConfig
from flashtune.ops import gemm_kernels
from flashtune.ops.gemm_config import (
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
from flashtune.schema import Const, OpSchema, Tensor, Var, api
from flashtune.schema.dump import Example, meta_tensor, register_examples
from flashtune.tune import (
    DEFAULT_TACTIC,
    DynamicDim,
    Tactic,
    TunableRunner,
    TuningConfig,
    choose_one,
)

__all__ = [
    "mm",
    "gemm",
    "mm_fp8",
    "gemm_ref",
    "gemm_kn_ref",
    "GEMM",
    "GEMM_KN",
    "gemm_fp8_ref",
    "TiledTactic",
    "TiledSpace",
    "SmallMTactic",
    "SmallMSpace",
    "CublasRunner",
    "TritonTiledRunner",
    "TritonSmallMRunner",
    "GEMM_RUNNERS",
    "GEMM_TUNING",
    "SMALL_M",
    "gemm_examples",
]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FP8 = torch.float8_e4m3fn
_FP8_OUT_DTYPES = (torch.bfloat16, torch.float16)
_LAYOUTS = ("nk", "kn")


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------


def gemm_ref(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T (+ bias), B [N, K]: fp32 products and sums, rounded once to A's dtype."""
    import torch

    C = torch.matmul(A.float(), B.float().T)
    if bias is not None:
        C = C + bias.float()
    return C.to(A.dtype)


def gemm_kn_ref(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B (+ bias), B stored [K, N]: fp32 products and sums, rounded once to A's dtype."""
    import torch

    C = torch.matmul(A.float(), B.float())
    if bias is not None:
        C = C + bias.float()
    return C.to(A.dtype)


def gemm_fp8_ref(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """C = (A * A_scale) @ (B * B_scale).T (+ bias) for fp8 A [M, K], B [N, K], in fp32."""
    import torch

    C = torch.matmul(A.float(), B.float().T) * (A_scale.float() * B_scale.float())
    if bias is not None:
        C = C + bias.float()
    return C.to(dtype)


# ----------------------------------------------------------------------------------------------
# Schemas. Axes and tensors carry no description so that the generated Definitions equal the
# corpus files (gemm_n4096_k4096.json) field for field.
# ----------------------------------------------------------------------------------------------


def _gemm_schema(prefix: str, b_dims: list[str], reference: Any, layout: str) -> OpSchema:
    return OpSchema(
        op_type="gemm",
        name_prefix=prefix,
        axes={"M": Var(), "N": Const(abbrev="n"), "K": Const(abbrev="k")},
        inputs={
            "A": Tensor(["M", "K"], dtype_from="A"),
            "B": Tensor(b_dims, dtype_from="A"),
            "bias": Tensor(["N"], dtype_from="A", optional=True),
        },
        outputs={"C": Tensor(["M", "N"], dtype_from="A")},
        reference=reference,
        description=f"General matrix multiply (GEMM) C = {layout} (+ bias).",
    )


GEMM = _gemm_schema("gemm", ["N", "K"], gemm_ref, "A @ B.T")
# B stored [K, N]: its own Definition, since its B tensor has the other shape.
GEMM_KN = _gemm_schema("gemm_kn", ["K", "N"], gemm_kn_ref, "A @ B")


def _mm_schema(A: Any, B: Any, bias: Any = None, out: Any = None, b_layout: str = "nk") -> OpSchema:
    return GEMM_KN if b_layout == "kn" else GEMM


# ----------------------------------------------------------------------------------------------
# Runners. inputs = (A [M, K], B [N, K] (any strides), bias [N] | None[, out [M, N] | None
# [, scales (A_scale, B_scale) | None]]); the tuner passes the first three.
# ----------------------------------------------------------------------------------------------


def _unpack(inputs: Sequence[Any]) -> tuple[Any, Any, Any, Any, Any]:
    A, B = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    out = inputs[3] if len(inputs) > 3 else None
    scales = inputs[4] if len(inputs) > 4 else None
    return A, B, bias, out, scales


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
        A, B, bias, out, scales = _unpack(inputs)
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

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> torch.Tensor:
        A, B, bias, out, scales = _unpack(inputs)
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
        return gemm_kernels.launch_tiled(
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

    # The CUDA grid's y/z dimensions hold split-K and the M tiles.
    _MAX_GRID_YZ = 65535

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
            and math.ceil(M / t.block_m) <= self._MAX_GRID_YZ
            and (t.block_m >= 16 or t.block_m >= M)  # FMA tiles only when one tile holds M
            and (t.stream_k == 0 or t.block_m >= M)
        ]

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> torch.Tensor:
        A, B, bias, out, scales = _unpack(inputs)
        M, K = A.shape
        N = B.shape[0]
        C = _alloc_out(A, B, out)
        if M == 0 or N == 0:
            return C
        if tactic == DEFAULT_TACTIC:
            if math.ceil(M / 16) > self._MAX_GRID_YZ:  # past the grid: the tiled kernel
                return TritonTiledRunner().forward([A, B, bias, C, scales])
            t = small_m_default_tactic(M, N, K, platform.device_limits(A.device).sm_count)
        else:
            t = SmallMTactic.from_tactic(tactic)
        if t.stream_k > 0 and M <= t.block_m and K > 0:
            return gemm_kernels.launch_small_m_streamk(
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
        return gemm_kernels.launch_small_m(
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
    dynamic_dims=(DynamicDim(input_idx=0, dim=0),), cold_l2=True, use_cuda_graph=True
)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------


def _check_tensor(name: str, t: Any, dims: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    return t


def _validate(
    A: Any,
    B: Any,
    bias: Any,
    out: Any,
    b_layout: str,
    dtypes: Sequence[torch.dtype],
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Check the arguments; return B as a logical [N, K] view."""
    _check_tensor("A", A, 2)
    _check_tensor("B", B, 2)
    if b_layout not in _LAYOUTS:
        raise ValueError(f"b_layout must be one of {_LAYOUTS}, got {b_layout!r}")
    if A.dtype not in dtypes:
        raise TypeError(f"A must have dtype in {[str(d) for d in dtypes]}, got {A.dtype}")
    if B.dtype != A.dtype:
        raise TypeError(f"B must have A's dtype {A.dtype}, got {B.dtype}")
    if B.device != A.device:
        raise ValueError(f"B must be on A's device {A.device}, got {B.device}")
    B_nk = B if b_layout == "nk" else B.T
    expected = "[N, K]" if b_layout == "nk" else "[K, N]"
    if B_nk.shape[1] != A.shape[1]:
        raise ValueError(
            f"B (b_layout={b_layout!r}) must be {expected} with K = A.shape[1] = {A.shape[1]}, "
            f"got shape {tuple(B.shape)}"
        )
    M, N = A.shape[0], B_nk.shape[0]
    out_dtype = out_dtype or A.dtype
    if bias is not None:
        _check_tensor("bias", bias, 1)
        if bias.shape[0] != N:
            raise ValueError(f"bias must have shape [{N}] (N), got {tuple(bias.shape)}")
        if bias.dtype != out_dtype:
            raise TypeError(f"bias must have dtype {out_dtype}, got {bias.dtype}")
        if bias.device != A.device:
            raise ValueError(f"bias must be on A's device {A.device}, got {bias.device}")
    if out is not None:
        _check_tensor("out", out, 2)
        if tuple(out.shape) != (M, N):
            raise ValueError(f"out must have shape {(M, N)} (M, N), got {tuple(out.shape)}")
        if out.dtype != out_dtype:
            raise TypeError(f"out must have dtype {out_dtype}, got {out.dtype}")
        if out.device != A.device:
            raise ValueError(f"out must be on A's device {A.device}, got {out.device}")
    return B_nk


def _mm_eager(
    A: torch.Tensor,
    B: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    b_layout: str,
) -> torch.Tensor:
    B_nk = _validate(A, B, bias, out, b_layout, _DTYPES)
    if not platform.kernels_available(A.device):
        C = gemm_ref(A, B_nk, bias)
        return out.copy_(C) if out is not None else C
    runner, tactic = choose_one("gemm", GEMM_RUNNERS, GEMM_TUNING, [A, B_nk, bias])
    return runner.forward([A, B_nk, bias, out], tactic)


# torch.compile traces through the custom op; eager calls go straight to _mm_eager, since the
# dispatcher adds host time to every call (measured by benchmarks/bench_gemm.py, row
# "custom_op_overhead_us").
@torch.library.custom_op(
    "flashtune::mm",
    mutates_args=(),
    schema="(Tensor A, Tensor B, Tensor? bias, str b_layout) -> Tensor",
)
def _mm_op(
    A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None, b_layout: str
) -> torch.Tensor:
    return _mm_eager(A, B, bias, None, b_layout)


@_mm_op.register_fake
def _(A, B, bias, b_layout):
    N = B.shape[0] if b_layout == "nk" else B.shape[1]
    return A.new_empty((A.shape[0], N))


@api(schema=_mm_schema, schemas=[GEMM, GEMM_KN])
def mm(
    A: torch.Tensor,
    B: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    b_layout: str = "nk",
) -> torch.Tensor:
    """C = A @ B.T (b_layout="nk", B [N, K]) or C = A @ B (b_layout="kn", B [K, N]), + bias.

    A [M, K] and B in float16, bfloat16 or float32 (same dtype); fp32 accumulation; the result
    [M, N] has A's dtype. bias [N] (A's dtype) is added before rounding. out: an optional
    [M, N] tensor to write into (returned).
    """
    if torch.compiler.is_compiling():
        C = _mm_op(A, B, bias, b_layout)
        return out.copy_(C) if out is not None else C
    return _mm_eager(A, B, bias, out, b_layout)


@api(schema=GEMM)
def gemm(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T (+ bias) for A [M, K] and B [N, K]: the contract of the FlashInfer-Trace
    `gemm` definitions (gemm_n4096_k4096, ...)."""
    return mm.fn(A, B, bias)


def mm_fp8(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    b_layout: str = "nk",
) -> torch.Tensor:
    """C = (A * A_scale) @ (B * B_scale).T (+ bias) for float8_e4m3fn A [M, K] and B [N, K]
    (or [K, N] with b_layout="kn"), per-tensor fp32 scales of shape [] or [1], C in `dtype`
    (bfloat16 or float16)."""
    if dtype not in _FP8_OUT_DTYPES:
        raise TypeError(f"dtype must be one of {_FP8_OUT_DTYPES}, got {dtype}")
    B_nk = _validate(A, B, bias, out, b_layout, (_FP8,), out_dtype=dtype)
    scales = []
    for name, s in (("A_scale", A_scale), ("B_scale", B_scale)):
        if not isinstance(s, torch.Tensor) or s.numel() != 1 or s.dtype != torch.float32:
            raise TypeError(f"{name} must be a float32 tensor with one element, got {s!r}")
        if s.device != A.device:
            raise ValueError(f"{name} must be on A's device {A.device}, got {s.device}")
        scales.append(s.reshape(1))
    if A.device.type != "cuda":  # fp8 kernels need a GPU (the interpreter has no fp8 dot)
        C = gemm_fp8_ref(A, B_nk, scales[0], scales[1], dtype, bias)
        return out.copy_(C) if out is not None else C
    if out is None:
        out = torch.empty((A.shape[0], B_nk.shape[0]), dtype=dtype, device=A.device)
    runner, tactic = choose_one("gemm_fp8", GEMM_RUNNERS, GEMM_TUNING, [A, B_nk, bias])
    return runner.forward([A, B_nk, bias, out, tuple(scales)], tactic)


@register_examples
def gemm_examples(model: ModelConfig) -> list[Example]:
    """The layer's linear layers at decode (M = 1), float16 like the corpus definitions; and
    the down projection with its weight stored [K, N]."""
    examples: list[Example] = []
    for n, k in model.gemm_nk():
        A, B = meta_tensor(1, k, dtype=torch.float16), meta_tensor(n, k, dtype=torch.float16)
        examples.append((gemm, (A, B), {}))
    n, k = model.gemm_nk()[-1]
    A = meta_tensor(1, k, dtype=torch.float16)
    B_kn = meta_tensor(k, n, dtype=torch.float16)
    examples.append((mm, (A, B_kn), {"b_layout": "kn"}))
    return examples

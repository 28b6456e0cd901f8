"""Host side of the fp8 GEMMs: the kernel's launch (kernels.py), the two runners the
autotuner chooses from (Triton; cuBLAS through torch._scaled_mm for per-tensor scales), the
tuning configs, the reference path where no kernel runs, and one KernelOp per op.

Runner inputs: Fp8Inputs, every operand in the kernel's canonical form (layouts.py makes
it from FlashInfer's arguments): A [batch, M, K], B [batch or groups, N, K] (any strides),
per-tensor scales [1] or K-major block scales [.., ceil(M/gm), ceil(K/gk)] and
[.., ceil(N/gn), ceil(K/gk)] (any strides), and the mode that says how they combine.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import triton

from flashtune import platform
from flashtune.ops.call import KernelOp, named
from flashtune.ops.gemm.config import SmallMTactic
from flashtune.ops.gemm.fp8.config import (
    TAIL_SPLIT,
    Fp8Space,
    Fp8Tactic,
    fp8_candidates,
    fp8_default_tactic,
    stream_k_layout,
    tactic_fits,
    tail_layout,
)
from flashtune.ops.gemm.fp8.kernels import _fp8_gemm_kernel, _fp8_gemm_streamk_kernel
from flashtune.ops.gemm.fp8.reference import expand_scale
from flashtune.ops.gemm.launch import TritonSmallMRunner, split_k_counters
from flashtune.tune import DEFAULT_TACTIC, DynamicDim, Tactic, TunableRunner, TuningConfig

__all__ = [
    "Fp8Inputs",
    "MODES",
    "TritonFp8Runner",
    "TritonFp8SmallMRunner",
    "TritonFp8TmaRunner",
    "CublasFp8Runner",
    "launch_fp8",
    "b_nk",
    "b_logical",
    "cublas_applies",
    "small_m_applies",
    "stream_k_applies",
    "tma_applies",
    "run_fp8",
    "reference_fp8",
]

# How the scales and rows combine (the kernel's flags):
# "tensor": per-tensor scales; "block": block scales; "row_groups": block scales, each row
# of A names its group of B (-1: padding); "masked": block scales, batch b has rows[b] rows.
MODES = ("tensor", "block", "row_groups", "masked")


class Fp8Inputs(NamedTuple):
    """The runners' inputs; the tuner keys on all but `out`."""

    A: torch.Tensor  # [batch, M, K] fp8
    B: torch.Tensor  # [batch or groups, N, K] fp8, any strides
    A_scale: torch.Tensor  # "tensor": [1]; else [batch, ceil(M/gm), ceil(K/gk)]
    B_scale: torch.Tensor  # "tensor": [1]; else [batch or groups, ceil(N/gn), ceil(K/gk)]
    out_dtype: torch.dtype
    rows: torch.Tensor | None = None  # "row_groups": [M] int32; "masked": [batch] int32
    mode: str = "tensor"
    granularity: tuple[int, int, int] = (1, 128, 128)
    # > 0: B is stored in K blocks, [batch, K / b_kblock, N, b_kblock] (TRT-LLM's block
    # layout of mm_fp8), read in place
    b_kblock: int = 0
    out: torch.Tensor | None = None  # [batch, M, N]; None: a new tensor


_TUNED = 9  # Fp8Inputs fields the tuner keys on and passes: all but out


def b_nk(a: Fp8Inputs) -> tuple[int, int]:
    """(N, K) of the logical [N, K] B, whatever its storage."""
    if a.b_kblock:
        return a.B.shape[2], a.B.shape[1] * a.B.shape[3]
    return a.B.shape[1], a.B.shape[2]


def b_logical(a: Fp8Inputs) -> torch.Tensor:
    """B as a [batch, N, K] tensor (a copy for the block layout: references only)."""
    if a.b_kblock:
        batch, kb, n, bk = a.B.shape
        return a.B.permute(0, 2, 1, 3).reshape(batch, n, kb * bk)
    return a.B


# ----------------------------------------------------------------------------------------------
# The launch
# ----------------------------------------------------------------------------------------------


def launch_fp8(a: Fp8Inputs, C: torch.Tensor, t: Fp8Tactic, tma: bool = False) -> torch.Tensor:
    """C = the fp8 product of `a` (see MODES) with tactic `t`; returns C [batch, M, N].
    tma: A and B reach the kernel as TMA tensor descriptors (`tma_applies(a)` must hold).
    A stream-K tactic runs the stream-K kernel (`stream_k_applies(a)` must hold)."""
    A, sa, sb = a.A, a.A_scale, a.B_scale
    batch, M, K = A.shape
    N = b_nk(a)[0]
    if batch == 0 or M == 0 or N == 0:
        return C
    block = a.mode != "tensor"
    gk = a.granularity[2]
    block_k = t.block_k
    if block and gk % block_k:
        # Each K step must lie in one scale block: the largest power of two dividing gk.
        block_k = math.gcd(block_k, gk)
        if block_k < 16:
            raise ValueError(f"scale granularity along K must be a multiple of 16, got {gk}")
    sa_strides = sa.stride() if block else (0, 0, 0)
    sb_strides = sb.stride() if block else (0, 0, 0)
    if t.stream_k and K > 0:  # K = 0: no iterations to share; the plain kernel writes zeros
        return _launch_stream_k(a, C, t, block_k, sa_strides, sb_strides, tma)
    num_tiles = triton.cdiv(M, t.block_m) * triton.cdiv(N, t.block_n)
    # A tail split (t.tail) splits only the last partial wave's tiles, on one batch entry;
    # elsewhere that tactic splits nothing.
    tail = t.tail == TAIL_SPLIT and t.split_k > 1 and batch == 1
    split_k = 1 if t.tail and not tail else t.split_k
    whole = 0
    grid = (num_tiles, batch, split_k)
    if tail:
        whole, programs = tail_layout(num_tiles, platform.device_limits(A.device).sm_count, split_k)
        grid = (programs, 1, 1)
    if split_k > 1 and whole < num_tiles:
        ws = torch.empty((batch, split_k, M, N), dtype=torch.float32, device=A.device)
        locks = split_k_counters(A.device, batch * num_tiles)
    else:
        ws = locks = C  # never read: no tile splits
    a_arg, b_arg = _operand_args(a, t, block_k, tma)
    _fp8_gemm_kernel[grid](
        a_arg,
        b_arg,
        C,
        sa,
        sb,
        a.rows if a.rows is not None else C,  # never read without ROW_GROUPS / MASKED_M
        ws,
        locks,
        M,
        N,
        K,
        split_k,
        whole,
        *A.stride(),
        *_b_strides(a),
        *C.stride(),
        *sa_strides,
        *sb_strides,
        ROW_GROUPS=a.mode == "row_groups",
        MASKED_M=a.mode == "masked",
        TAIL=tail,
        **_tile_options(a, t, block_k, tma),
    )
    return C


def _tile_options(a: Fp8Inputs, t: Fp8Tactic, block_k: int, tma: bool) -> dict[str, Any]:
    """The compile-time options both fp8 kernels take alike: scales, operand types and
    layout, the tile, warps and stages."""
    gm, gn, gk = a.granularity
    return {
        "BLOCK_SCALE": a.mode != "tensor",
        "GM": gm,
        "GN": gn,
        "GK": gk,
        "UPCAST": a.A.dtype != a.B.dtype,
        "B_KBLOCK": a.b_kblock,
        "EVEN_K": a.A.shape[2] % block_k == 0,
        "BLOCK_M": t.block_m,
        "BLOCK_N": t.block_n,
        "BLOCK_K": block_k,
        "GROUP_M": t.group_m,
        "TMA": tma,
        "num_warps": t.num_warps,
        "num_stages": t.num_stages,
    }


def _operand_args(a: Fp8Inputs, t: Fp8Tactic, block_k: int, tma: bool) -> tuple[Any, Any]:
    """A and B as the kernels take them: the tensors, or TMA descriptors of batch entry 0."""
    if not tma:
        return a.A, a.B
    from triton.tools.tensor_descriptor import TensorDescriptor

    A, B = a.A[0], a.B[0]
    (M, K), N = A.shape, B.shape[0]
    return (
        TensorDescriptor(A, [M, K], [A.stride(0), 1], [t.block_m, block_k]),
        TensorDescriptor(B, [N, K], [B.stride(0), 1], [t.block_n, block_k]),
    )


def stream_k_applies(a: Fp8Inputs) -> bool:
    """Whether a stream-K tactic takes the product: one batch entry (A and B), per-tensor or
    block scales (not row groups or masked rows)."""
    return a.mode in ("tensor", "block") and a.A.shape[0] == 1 and a.B.shape[0] == 1


def _launch_stream_k(
    a: Fp8Inputs,
    C: torch.Tensor,
    t: Fp8Tactic,
    block_k: int,
    sa_strides: tuple[int, ...],
    sb_strides: tuple[int, ...],
    tma: bool,
) -> torch.Tensor:
    """launch_fp8 for a stream-K tactic: t.split_k programs per SM (the device's SM count;
    the stand-in's off CUDA, which tests patch to choose the program count)."""
    if not stream_k_applies(a):
        raise ValueError(
            "fp8 stream-K takes one batch entry with per-tensor or block scales, got "
            f"A {tuple(a.A.shape)}, B {tuple(a.B.shape)}, mode {a.mode!r}"
        )
    _, M, K = a.A.shape
    N = b_nk(a)[0]
    tiles = triton.cdiv(M, t.block_m) * triton.cdiv(N, t.block_n)
    k_steps = triton.cdiv(K, block_k)
    sms = platform.device_limits(a.A.device).sm_count
    iters, programs = stream_k_layout(tiles, k_steps, t.split_k * sms)
    if iters % k_steps:  # some ranges start or end inside a tile: parts need a workspace
        ws = torch.empty(
            (programs, 2, t.block_m, t.block_n), dtype=torch.float32, device=a.A.device
        )
    else:
        ws = C  # never read: every program computes whole tiles
    a_arg, b_arg = _operand_args(a, t, block_k, tma)
    _fp8_gemm_streamk_kernel[(programs,)](
        a_arg,
        b_arg,
        C,
        a.A_scale,
        a.B_scale,
        ws,
        split_k_counters(a.A.device, tiles),
        M,
        N,
        K,
        iters,
        *a.A.stride()[1:],
        *_b_strides(a)[1:],
        *C.stride()[1:],
        *sa_strides[1:],
        *sb_strides[1:],
        SUM_N=min(t.block_n, 64),
        **_tile_options(a, t, block_k, tma),
    )
    return C


def _b_strides(a: Fp8Inputs) -> tuple[int, int, int, int]:
    """(batch, n, k, k-block) strides of B; the k-block stride is used with b_kblock only."""
    if a.b_kblock:
        sb, skb, sn, sk = a.B.stride()
        return sb, sn, sk, skb
    sb, sn, sk = a.B.stride()
    return sb, sn, sk, 0


def _alloc_out(a: Fp8Inputs) -> torch.Tensor:
    if a.out is not None:
        return a.out
    batch, M, _ = a.A.shape
    return torch.empty((batch, M, b_nk(a)[0]), dtype=a.out_dtype, device=a.A.device)


# ----------------------------------------------------------------------------------------------
# Runners
# ----------------------------------------------------------------------------------------------


class TritonFp8Runner(TunableRunner):
    """The Triton fp8 GEMM (every mode). get_valid_tactics hands out a pruned list per shape;
    exhaustive=True hands out all of Fp8Space that fits the device. Stream-K tactics only
    for `stream_k_applies` products (one batch entry, per-tensor or block scales)."""

    def __init__(self, exhaustive: bool = False) -> None:
        self.exhaustive = exhaustive

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        a = named(Fp8Inputs, inputs)
        batch, M, K = a.A.shape
        N = b_nk(a)[0]
        limits = platform.device_limits(a.A.device)
        smem, sms = limits.shared_memory_per_block, limits.sm_count
        scale_k = None if a.mode == "tensor" else a.granularity[2]
        space = (
            iter(Fp8Space())
            if self.exhaustive
            else fp8_candidates(M, N, K, sms, batch, per_tensor=a.mode == "tensor")
        )
        stream_k_ok = stream_k_applies(a)
        return [
            t.as_tactic()
            for t in space
            if tactic_fits(t, scale_k, smem, batch * M, N, K) and (stream_k_ok or not t.stream_k)
        ]

    def tactic_for(self, a: Fp8Inputs, tactic: Tactic) -> Fp8Tactic:
        """`tactic` as an Fp8Tactic; the default one (fp8_default_tactic) for -1."""
        if tactic != DEFAULT_TACTIC:
            return Fp8Tactic.from_tactic(tactic)
        batch, M, K = a.A.shape
        limits = platform.device_limits(a.A.device)
        return fp8_default_tactic(
            M,
            b_nk(a)[0],
            K,
            limits.sm_count,
            batch,
            block_scaled=a.mode != "tensor",
            smem=limits.shared_memory_per_block,
        )

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> torch.Tensor:
        a = named(Fp8Inputs, inputs)
        return launch_fp8(a, _alloc_out(a), self.tactic_for(a, tactic))


class TritonFp8TmaRunner(TritonFp8Runner):
    """The Triton fp8 GEMM with its operand tiles loaded by the TMA engine (kernels.py's TMA
    flag): the same tactics as TritonFp8Runner, for `tma_applies` products (one batch entry,
    per-tensor or block scales, A and B K-contiguous with 16-byte aligned rows, one fp8
    format, a Hopper-class GPU or the interpreter); any other product runs the pointer-load
    kernel. A runner of its own, not a tactic field, so the tuner's cache keeps one tactic
    format for both and picks between them per shape bucket."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        if not tma_applies(named(Fp8Inputs, inputs)):
            return []
        return super().get_valid_tactics(inputs, profile)

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> torch.Tensor:
        a = named(Fp8Inputs, inputs)
        if not tma_applies(a):
            return TritonFp8Runner().forward(inputs)
        return launch_fp8(a, _alloc_out(a), self.tactic_for(a, tactic), tma=True)


def _tma_rows_ok(x: torch.Tensor) -> bool:
    # A TMA descriptor: the last dimension contiguous, the base and the row stride 16-byte
    # aligned (fp8: one byte an element).
    return (
        x.stride(-1) == 1 and (x.stride(-2) * x.element_size()) % 16 == 0 and x.data_ptr() % 16 == 0
    )


def tma_applies(a: Fp8Inputs) -> bool:
    """Whether TritonFp8TmaRunner takes the product (see the class)."""
    if a.mode not in ("tensor", "block") or a.b_kblock or a.A.dtype != a.B.dtype:
        return False
    if a.A.shape[0] != 1 or a.B.shape[0] != 1:
        return False
    device = a.A.device
    if device.type == "cuda" and _capability(device.index) < (9, 0):
        return False
    return _tma_rows_ok(a.A[0]) and _tma_rows_ok(a.B[0])


class TritonFp8SmallMRunner(TunableRunner):
    """The GEMM family's decode kernel (ops/gemm `_gemm_small_m_kernel`: swap-AB dots from 16
    rows, an FMA reduction below, K split over CTAs) on fp8 operands with per-tensor scales.
    A decode-sized fp8 GEMM is bound by reading B once; this kernel reads it in its [N, K]
    rows with 16-byte loads over many CTAs, where the tiled fp8 kernel pads M to its tile.
    Tactics only for `small_m_applies` products (one batch entry, M <= 64, per-tensor
    scales, B as [N, K] rows, one fp8 format); any other product runs the tiled kernel."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        a = named(Fp8Inputs, inputs)
        if not small_m_applies(a):
            return []
        # The GEMM family's tactics for this batch entry (split-K and stream-K: the bf16
        # decode GEMM's stream-K tiles read 4.1-4.4 TB/s at M=1), with K tiles of 32 for the
        # fp8 dots from 16 rows.
        tactics = TritonSmallMRunner().get_valid_tactics([a.A[0], a.B[0]], profile)
        picked = (SmallMTactic.from_tactic(t) for t in tactics)
        return [t.as_tactic() for t in picked if t.block_m < 16 or t.block_k % 32 == 0]

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> torch.Tensor:
        a = named(Fp8Inputs, inputs)
        if not small_m_applies(a):
            return TritonFp8Runner().forward(inputs)
        C = _alloc_out(a)
        # The GEMM family's runner itself, on this batch entry (its default tactic too).
        TritonSmallMRunner().forward([a.A[0], a.B[0], None, C[0], (a.A_scale, a.B_scale)], tactic)
        return C


def small_m_applies(a: Fp8Inputs) -> bool:
    """Whether TritonFp8SmallMRunner takes the product (see the class)."""
    return (
        a.mode == "tensor"
        and not a.b_kblock
        and a.A.shape[0] == 1
        and a.A.shape[1] <= 64
        and a.A.dtype == a.B.dtype
        and a.A_scale.numel() == 1
        and a.B_scale.numel() == 1
    )


@functools.cache
def _capability(index: int | None) -> tuple[int, int]:
    # Read once per device: a call pays a dict lookup, not a driver query.
    return torch.cuda.get_device_capability(index)


def cublas_applies(A: torch.Tensor, B: torch.Tensor, mode: str) -> bool:
    """Whether cuBLASLt's fp8 GEMM (torch._scaled_mm) takes this per-tensor product: a GPU
    with fp8 tensor cores (sm89+), leading dimensions of 16 bytes, and not e5m2 x e5m2."""
    if mode != "tensor" or A.device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    if _capability(A.device.index) < (8, 9):
        return False
    if A.dtype == B.dtype == torch.float8_e5m2:
        return False
    return A.shape[-1] % 16 == 0 and B.shape[-2] % 16 == 0


class CublasFp8Runner(TunableRunner):
    """cuBLASLt's fp8 GEMM through torch._scaled_mm, one call per batch entry. One tactic:
    the default. Products cuBLASLt does not take (`cublas_applies`) run the Triton
    kernel's default tactic instead, so the runner answers every call."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return []

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> torch.Tensor:
        a = named(Fp8Inputs, inputs)
        if a.b_kblock or not cublas_applies(a.A, a.B, a.mode):
            return TritonFp8Runner().forward(inputs)
        C = _alloc_out(a)
        sa, sb = a.A_scale.reshape(()), a.B_scale.reshape(())
        try:
            for i in range(a.A.shape[0]):
                A_i = a.A[i] if a.A[i].stride(-1) == 1 else a.A[i].contiguous()
                B_i = a.B[i] if a.B[i].stride(-1) == 1 else a.B[i].contiguous()
                # cuBLASLt wants mat2 [K, N] column-major: B_i [N, K] row-major, transposed.
                if C[i].is_contiguous():
                    torch._scaled_mm(
                        A_i, B_i.T, scale_a=sa, scale_b=sb, out_dtype=a.out_dtype, out=C[i]
                    )
                else:
                    C[i].copy_(
                        torch._scaled_mm(A_i, B_i.T, scale_a=sa, scale_b=sb, out_dtype=a.out_dtype)
                    )
        except (RuntimeError, TypeError, NotImplementedError):
            # A layout or size this torch / cuBLASLt build refuses: the Triton kernel.
            return TritonFp8Runner().forward([*a[:_TUNED], C])
        return C


# ----------------------------------------------------------------------------------------------
# Where no kernel runs: the references
# ----------------------------------------------------------------------------------------------


def _dequant(x: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    return x.float() * expand_scale(scale, x.shape[-2], x.shape[-1], block)


def reference_fp8(inputs: Sequence[Any]) -> torch.Tensor:
    """The product in fp32 PyTorch, written into out (a CPU without the Triton interpreter)."""
    a = named(Fp8Inputs, inputs)
    gm, gn, gk = a.granularity
    if a.mode == "tensor":
        scale = a.A_scale.float().reshape(()) * a.B_scale.float().reshape(())
        C = torch.matmul(a.A.float(), b_logical(a).float().transpose(-2, -1)) * scale
    else:
        A = _dequant(a.A, a.A_scale, (gm, gk))
        B = _dequant(a.B, a.B_scale, (gn, gk))
        if a.mode == "row_groups":
            assert a.rows is not None
            C = torch.zeros((1, A.shape[1], B.shape[1]), dtype=torch.float32, device=A.device)
            for g in range(B.shape[0]):
                sel = a.rows == g
                C[0, sel] = A[0, sel] @ B[g].T
        else:
            C = torch.matmul(A, B.transpose(-2, -1))
            if a.mode == "masked":
                assert a.rows is not None
                rows = torch.arange(A.shape[1], device=A.device)
                C = C * (rows[None, :] < a.rows[:, None]).unsqueeze(-1)
    out = _alloc_out(a)
    return out.copy_(C.to(out.dtype))


# ----------------------------------------------------------------------------------------------
# Tuning and the ops' launches
# ----------------------------------------------------------------------------------------------

_A = 0  # Fp8Inputs.A: its dimension 1 (M) is tuned per power-of-two bucket
_A_SCALE = 2  # Fp8Inputs.A_scale

# Per-tensor scales: M per bucket; batch, N, K and the fp8 formats in the key. CUDA graphs:
# a decode-sized fp8 GEMM runs for a few microseconds, less than a launch costs on the host.
TENSOR_TUNING = TuningConfig(
    dynamic_dims=(DynamicDim(input_idx=_A, dim=1),),
    key_dtypes=True,
    use_cuda_graph=True,
)
# Block scales with one scale per row (granularity (1, gn, gk)): A_scale's rows follow M.
ROWWISE_TUNING = TuningConfig(
    dynamic_dims=(DynamicDim(input_idx=_A, dim=1),),
    constraints=((_A_SCALE, 1, lambda shapes: shapes[_A][1]),),
    key_dtypes=True,
    use_cuda_graph=True,
)
# Grouped / masked calls and coarser row granularities: tuned at their exact shapes (their
# index tensors cannot be made up at another size).
EXACT_TUNING = TuningConfig(key_dtypes=True, use_cuda_graph=True)

_TRITON = (TritonFp8Runner(), TritonFp8TmaRunner(), TritonFp8SmallMRunner())
# cuBLAS first where it is a candidate: the default until the tuner has measured Triton.
_BACKEND_RUNNERS: dict[str, tuple[TunableRunner, ...]] = {
    "cublas": (CublasFp8Runner(),),
    "cudnn": (CublasFp8Runner(),),
    "cutlass": _TRITON,
    "auto": (CublasFp8Runner(), *_TRITON),
}
_OPS: dict[tuple[str, str], KernelOp] = {}


def _op(name: str, backend: str, tuning: TuningConfig) -> KernelOp:
    key = (name, backend)
    if key not in _OPS:
        runners = _BACKEND_RUNNERS.get(backend, _TRITON)
        # One tuner op name per runner set, so one set's picks never answer another's.
        op_name = name if backend in ("auto", "triton") else f"{name}[{backend}]"
        _OPS[key] = KernelOp(
            op_name,
            runners,
            tuning,
            reference_fp8,
            tuned=_TUNED,
            # Looked up per call, not bound once: tests switch kernels off with monkeypatch.
            kernels_available=lambda device: platform.kernels_available(device),
        )
    return _OPS[key]


def run_fp8(name: str, inputs: Fp8Inputs, backend: str = "triton") -> torch.Tensor:
    """Run op `name` on `inputs` (canonical form) with `backend`'s runners ("triton": the
    Triton kernel alone); returns out [batch, M, N]."""
    if inputs.mode == "tensor":
        tuning = TENSOR_TUNING
    elif inputs.mode == "block" and inputs.granularity[0] == 1:
        tuning = ROWWISE_TUNING
    else:
        tuning = EXACT_TUNING
    return _op(name, backend, tuning)(inputs)

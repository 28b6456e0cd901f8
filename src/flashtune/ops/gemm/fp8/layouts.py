"""FlashInfer's fp8 GEMM arguments checked and turned into the kernel's canonical operands
(launch.Fp8Inputs): views, never copies.

FlashInfer's layouts, as its 0.2.14 tests build them:
- bmm_fp8: A [b, m, k] row-major, B [b, k, n] column-major (a transposed [b, n, k]), scales
  one float32 element each;
- gemm_fp8_nt_groupwise, backend "cutlass": scale_major_mode "K": a_scale [m/gm, k/gk],
  b_scale [n/gn, k/gk]; "MN": their transposes, a_scale [k/gk, m/gm], b_scale [k/gk, n/gn];
- backend "trtllm": a_scale M-major (a [k/128, m] tensor, or its [m, k/128] transposed
  view), b_scale N-block-major rows of K blocks ([n/128, k/128], or its transposed view);
- the grouped forms: b [groups, n, k] with b_scale [groups, n/gn, k/gk] ("K") or
  [groups, k/gk, n/gn] ("MN"); DeepGEMM's are K-major.
Block counts round up (ceil), so sizes the blocks do not divide are served too.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.ops.call import check_tensor, dtype_list
from flashtune.ops.gemm.fp8.launch import Fp8Inputs

__all__ = [
    "FP8",
    "OUT_DTYPES",
    "BMM_BACKENDS",
    "OUTPUT_DTYPE_ENUM",
    "out_dtype_of",
    "bmm_inputs",
    "groupwise_inputs",
    "group_rows",
    "scale_views",
    "grouped_inputs",
    "masked_inputs",
    "mm_fp8_inputs",
    "MM_FP8_BLOCK",
]

# mm_fp8's weight layout (TRT-LLM's low-latency GEMM): [K / 128, N, 128].
MM_FP8_BLOCK = 128

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.bfloat16, torch.float16)
BMM_BACKENDS = ("cudnn", "cublas", "cutlass", "auto")
# The bmm_fp8 Definitions' `dtype` scalar: FlashInfer-Trace's bmm_fp8 init passes 1 for its
# bfloat16 output, the one output dtype a bmm_fp8 Definition has. bmm_fp8 takes the enum
# too, so a call made from a Definition's inputs runs.
OUTPUT_DTYPE_ENUM = {torch.bfloat16: 1}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def out_dtype_of(out: torch.Tensor | None, out_dtype: torch.dtype | None) -> torch.dtype:
    """The output dtype: out's when given (out_dtype, if also given, must agree), else
    out_dtype, else bfloat16 (FlashInfer's default)."""
    if out is not None:
        if out_dtype is not None and out_dtype != out.dtype:
            raise ValueError(f"out is {out.dtype} but out_dtype is {out_dtype}")
        dtype = out.dtype
    else:
        dtype = out_dtype if out_dtype is not None else torch.bfloat16
    if dtype not in OUT_DTYPES:
        raise ValueError(f"the output dtype must be {dtype_list(OUT_DTYPES)}, got {dtype}")
    return dtype


def _fp8(name: str, t: Any, ndim: int, device: torch.device | None = None) -> torch.Tensor:
    check_tensor(name, t, FP8, device, "a")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    return t


def _scale(name: str, t: Any, device: torch.device, shapes: list[tuple[int, ...]]) -> None:
    check_tensor(name, t, (torch.float32,), device, "a")
    if tuple(t.shape) not in shapes:
        want = " or ".join(str(s) for s in dict.fromkeys(shapes))
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")


def _out(out: torch.Tensor | None, shape: tuple[int, ...], device: torch.device) -> None:
    if out is None:
        return
    check_tensor("out", out, OUT_DTYPES, device, "a")
    if tuple(out.shape) != shape:
        raise ValueError(f"out must have shape {shape}, got {tuple(out.shape)}")


def bmm_inputs(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    dtype: torch.dtype,
    out: torch.Tensor | None,
) -> Fp8Inputs:
    """bmm_fp8's arguments as the kernel's operands (B as its [b, n, k] transposed view)."""
    if isinstance(dtype, int):
        dtype = {v: k for k, v in OUTPUT_DTYPE_ENUM.items()}.get(dtype, dtype)
    if dtype not in OUT_DTYPES:
        raise ValueError(f"dtype must be {dtype_list(OUT_DTYPES)}, got {dtype}")
    _fp8("A", A, 3)
    _fp8("B", B, 3, A.device)
    if B.shape[0] != A.shape[0] or B.shape[1] != A.shape[2]:
        raise ValueError(
            f"B must be [b, k, n] = [{A.shape[0]}, {A.shape[2]}, n] for A {tuple(A.shape)}, "
            f"got {tuple(B.shape)}"
        )
    for name, s in (("A_scale", A_scale), ("B_scale", B_scale)):
        check_tensor(name, s, (torch.float32,), A.device, "A")
        if s.numel() != 1:
            raise ValueError(f"{name} must hold one (per-tensor) scale, got shape {tuple(s.shape)}")
    shape = (A.shape[0], A.shape[1], B.shape[2])
    _out(out, shape, A.device)
    if out is not None and out.dtype != dtype:
        raise ValueError(f"out is {out.dtype} but dtype is {dtype}")
    return Fp8Inputs(A, B.transpose(-2, -1), A_scale.reshape(1), B_scale.reshape(1), dtype, out=out)


def _trtllm_view(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A trtllm-backend a_scale as its logical [rows, cols] view. TRT-LLM reads its memory
    rows-major (a contiguous [cols, rows] tensor, or that tensor's transposed view), which
    tells a square tensor's two readings apart."""
    if tuple(scale.shape) == (cols, rows) and (rows != cols or scale.stride(-1) == 1):
        return scale.T
    return scale


def scale_views(
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    m: int,
    n: int,
    k: int,
    granularity: tuple[int, int, int],
    scale_major_mode: str | None,
    backend: str,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """gemm_fp8_nt_groupwise's scales as K-major views [ceil(m/gm), ceil(k/gk)] and
    [ceil(n/gn), ceil(k/gk)] (see the module docstring for the layouts accepted)."""
    gm, gn, gk = granularity
    mb, nb, kb = _cdiv(m, gm), _cdiv(n, gn), _cdiv(k, gk)
    if backend == "trtllm":
        if granularity != (1, 128, 128):
            raise ValueError(
                f"backend 'trtllm' takes scale_granularity_mnk (1, 128, 128), got {granularity}"
            )
        _scale("a_scale", a_scale, device, [(kb, m), (m, kb)])
        _scale("b_scale", b_scale, device, [(nb, kb), (kb, nb)])
        # b_scale's memory is N blocks of K blocks: a [nb, kb] tensor, or its transposed view.
        b_view = b_scale
        if tuple(b_scale.shape) == (kb, nb) and (kb != nb or b_scale.stride(-1) != 1):
            b_view = b_scale.T
        return _trtllm_view(a_scale, m, kb), b_view
    if backend != "cutlass":
        raise ValueError(f"backend must be 'cutlass' or 'trtllm', got {backend!r}")
    if scale_major_mode == "K":
        _scale("a_scale", a_scale, device, [(mb, kb)])
        _scale("b_scale", b_scale, device, [(nb, kb)])
        return a_scale, b_scale
    if scale_major_mode == "MN":
        _scale("a_scale", a_scale, device, [(kb, mb)])
        _scale("b_scale", b_scale, device, [(kb, nb)])
        return a_scale.T, b_scale.T
    raise ValueError(
        f"scale_major_mode must be 'K' or 'MN' for backend 'cutlass', got {scale_major_mode!r}"
    )


def groupwise_inputs(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    scale_major_mode: str | None,
    mma_sm: int,
    granularity: tuple[int, int, int],
    out: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    backend: str,
) -> Fp8Inputs:
    """gemm_fp8_nt_groupwise's arguments as the kernel's operands (batch 1)."""
    granularity = _granularity(granularity)
    _fp8("a", a, 2)
    _fp8("b", b, 2, a.device)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"Shape mismatch. a.shape[1] = {a.shape[1]}, b.shape[1] = {b.shape[1]}")
    _mma_sm(mma_sm)
    dtype = out_dtype_of(out, out_dtype)
    (m, k), n = a.shape, b.shape[0]
    sa, sb = scale_views(
        a_scale, b_scale, m, n, k, granularity, scale_major_mode, backend, a.device
    )
    _out(out, (m, n), a.device)
    return Fp8Inputs(
        a.unsqueeze(0),
        b.unsqueeze(0),
        sa.unsqueeze(0),
        sb.unsqueeze(0),
        dtype,
        mode="block",
        granularity=granularity,
        out=None if out is None else out.unsqueeze(0),
    )


def _granularity(granularity: Any) -> tuple[int, int, int]:
    g = tuple(int(x) for x in granularity)
    if len(g) != 3 or min(g) < 1:
        raise ValueError(f"scale_granularity_mnk must be three positive ints, got {granularity}")
    return g[0], g[1], g[2]


def _mma_sm(mma_sm: int) -> None:
    # CUTLASS's 1- or 2-SM MMA: a performance hint with no meaning for the Triton kernel.
    if mma_sm not in (1, 2):
        raise ValueError(f"mma_sm must be 1 or 2, got {mma_sm}")


def group_rows(m_indptr: torch.Tensor, rows: int) -> torch.Tensor:
    """The group of each of `rows` rows from segment offsets m_indptr [groups + 1] (int32),
    -1 for rows past the last segment; computed on the device, with no host sync."""
    r = torch.arange(rows, device=m_indptr.device, dtype=m_indptr.dtype)
    group = torch.searchsorted(m_indptr[1:].contiguous(), r, right=True)
    inside = (r >= m_indptr[0]) & (r < m_indptr[-1])
    return torch.where(inside, group, -1).to(torch.int32)


def grouped_inputs(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    rows: torch.Tensor,
    rows_name: str,
    granularity: tuple[int, int, int],
    scale_major_mode: str,
    out: torch.Tensor | None,
    out_dtype: torch.dtype | None,
) -> Fp8Inputs:
    """A grouped GEMM's arguments (a [cum_m, k] rows, each naming its group of b [groups,
    n, k] through `rows`) as the kernel's operands."""
    g = _granularity(granularity)
    _fp8("a", a, 2)
    _fp8("b", b, 3, a.device)
    check_tensor(rows_name, rows, (torch.int32,), a.device, "a")
    (m, k), (groups, n) = a.shape, b.shape[:2]
    if b.shape[2] != k:
        raise ValueError(f"b must be [groups, n, {k}] for a {tuple(a.shape)}, got {tuple(b.shape)}")
    mb, nb, kb = _cdiv(m, g[0]), _cdiv(n, g[1]), _cdiv(k, g[2])
    if scale_major_mode == "K":
        _scale("a_scale", a_scale, a.device, [(mb, kb)])
        _scale("b_scale", b_scale, a.device, [(groups, nb, kb)])
        sa, sb = a_scale, b_scale
    elif scale_major_mode == "MN":
        _scale("a_scale", a_scale, a.device, [(kb, mb)])
        _scale("b_scale", b_scale, a.device, [(groups, kb, nb)])
        sa, sb = a_scale.T, b_scale.transpose(1, 2)
    else:
        raise ValueError(f"scale_major_mode must be 'K' or 'MN', got {scale_major_mode!r}")
    dtype = out_dtype_of(out, out_dtype)
    _out(out, (m, n), a.device)
    return Fp8Inputs(
        a.unsqueeze(0),
        b,
        sa.unsqueeze(0),
        sb,
        dtype,
        rows=rows,
        mode="row_groups",
        granularity=g,
        out=None if out is None else out.unsqueeze(0),
    )


def masked_inputs(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    masked_m: torch.Tensor,
    granularity: tuple[int, int, int],
    out: torch.Tensor | None,
    out_dtype: torch.dtype | None,
) -> Fp8Inputs:
    """batch_deepgemm_fp8_nt_groupwise's arguments (a [g, m, k], b [g, n, k], K-major
    scales, masked_m [g]) as the kernel's operands."""
    g = _granularity(granularity)
    _fp8("a", a, 3)
    _fp8("b", b, 3, a.device)
    check_tensor("masked_m", masked_m, (torch.int32,), a.device, "a")
    groups, m, k = a.shape
    n = b.shape[1]
    if b.shape[0] != groups or b.shape[2] != k:
        raise ValueError(
            f"b must be [{groups}, n, {k}] for a {tuple(a.shape)}, got {tuple(b.shape)}"
        )
    if tuple(masked_m.shape) != (groups,):
        raise ValueError(f"masked_m must have shape ({groups},), got {tuple(masked_m.shape)}")
    _scale("a_scale", a_scale, a.device, [(groups, _cdiv(m, g[0]), _cdiv(k, g[2]))])
    _scale("b_scale", b_scale, a.device, [(groups, _cdiv(n, g[1]), _cdiv(k, g[2]))])
    dtype = out_dtype_of(out, out_dtype)
    _out(out, (groups, m, n), a.device)
    return Fp8Inputs(
        a, b, a_scale, b_scale, dtype, rows=masked_m, mode="masked", granularity=g, out=out
    )


_ONES: dict[torch.device, torch.Tensor] = {}


def _one(device: torch.device) -> torch.Tensor:
    """A float32 [1] tensor of 1.0 on `device`, made once (a new one while a CUDA graph is
    being captured, which a cached tensor would have to outlive)."""
    one = _ONES.get(device)
    if one is None:
        one = torch.ones(1, dtype=torch.float32, device=device)
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if not capturing:
            _ONES[device] = one
    return one


def mm_fp8_inputs(
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: torch.Tensor | None,
    out_dtype: torch.dtype,
    out: torch.Tensor | None,
) -> Fp8Inputs:
    """mm_fp8's arguments (a [m, k] e4m3; b [k/128, n, 128] e4m3, the block layout
    prepare_low_latency_gemm_weights makes; alpha: the output scale, one float32 element or
    None) as the kernel's operands, b read in place."""
    check_tensor("a", a, (torch.float8_e4m3fn,))
    check_tensor("b", b, (torch.float8_e4m3fn,), a.device, "a")
    if a.dim() != 2 or b.dim() != 3 or b.shape[2] != MM_FP8_BLOCK:
        raise ValueError(
            f"a must be [m, k] and b [k / {MM_FP8_BLOCK}, n, {MM_FP8_BLOCK}] "
            f"(prepare_low_latency_gemm_weights), got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    m, k = a.shape
    n = b.shape[1]
    if b.shape[0] * MM_FP8_BLOCK != k:
        raise ValueError(f"b holds K = {b.shape[0] * MM_FP8_BLOCK} but a has K = {k}")
    dtype = out.dtype if out is not None else out_dtype
    if dtype != torch.bfloat16 or (out is not None and out_dtype not in (None, out.dtype)):
        raise ValueError(f"Unsupported output dtype: {dtype}. Only bfloat16 is supported")
    _out(out, (m, n), a.device)
    if alpha is None:
        scale = _one(a.device)
    else:
        check_tensor("alpha", alpha, (torch.float32,), a.device, "a")
        if alpha.numel() != 1:
            raise ValueError(f"alpha must hold one scale, got shape {tuple(alpha.shape)}")
        scale = alpha.reshape(1)
    return Fp8Inputs(
        a.unsqueeze(0),
        b.unsqueeze(0),
        scale,
        _one(a.device),
        dtype,
        b_kblock=MM_FP8_BLOCK,
        out=None if out is None else out.unsqueeze(0),
    )

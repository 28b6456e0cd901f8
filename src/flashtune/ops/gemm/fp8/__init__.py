"""fp8 GEMMs under FlashInfer's names (`flashinfer.gemm`): per-tensor scaled `bmm_fp8` and
`mm_fp8` (with `prepare_low_latency_gemm_weights`, its weight layout), and
the block-scaled GEMMs of DeepSeek's format (1x128 activation groups, 128x128 weight blocks):
`gemm_fp8_nt_groupwise`, `gemm_fp8_nt_blockscaled`, `group_gemm_fp8_nt_groupwise` and
DeepGEMM's `group_deepgemm_fp8_nt_groupwise` / `batch_deepgemm_fp8_nt_groupwise`, with
FlashInfer 0.2.14's signatures and semantics.

One Triton kernel serves them all (kernels.py: fp32 accumulation, per-tensor scales in the
epilogue or block scales per 128-wide K step, bf16/fp16 out); runners, tuning and the
reference path are in launch.py, FlashInfer's argument layouts in layouts.py, tactics in
config.py, the Definitions' schemas (FlashInfer-Trace's `bmm_fp8`, `gemm_fp8_nt_groupwise`,
`batch_deepgemm_fp8_nt_groupwise`) in schema.py, the references in reference.py.

FlashInfer's `backend` picks the runners the autotuner chooses from: "cublas" / "cudnn"
(the vendor library: torch._scaled_mm, i.e. cuBLASLt), "cutlass" / "trtllm" (flashtune's
Triton kernel, standing in for FlashInfer's own compiled kernels), "auto" (both, the tuner
picks inside `autotune()`). The Hopper/Blackwell restrictions of FlashInfer's kernels
(SM100-only groupwise GEMMs, K >= 256 for trtllm, m padded to 4) do not apply: the Triton
kernel runs on any GPU with fp8 support, and on CPU under TRITON_INTERPRET=1 (else the
reference runs).
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.ops.gemm.fp8.launch import run_fp8
from flashtune.ops.gemm.fp8.layouts import (
    BMM_BACKENDS,
    MM_FP8_BLOCK,
    bmm_inputs,
    group_rows,
    grouped_inputs,
    groupwise_inputs,
    masked_inputs,
    mm_fp8_inputs,
)
from flashtune.ops.gemm.fp8.schema import (
    BATCH_DEEPGEMM_FP8_NT_GROUPWISE,
    BMM_FP8,
    GEMM_FP8_NT_GROUPWISE,
    BmmFp8Op,
    GroupwiseOp,
    MaskedOp,
    fp8_api,
)
from flashtune.ops.gemm.fp8.schema import fp8_gemm_examples as fp8_gemm_examples

__all__ = [
    "bmm_fp8",
    "mm_fp8",
    "prepare_low_latency_gemm_weights",
    "gemm_fp8_nt_groupwise",
    "gemm_fp8_nt_blockscaled",
    "group_gemm_fp8_nt_groupwise",
    "group_deepgemm_fp8_nt_groupwise",
    "batch_deepgemm_fp8_nt_groupwise",
]

_GRANULARITY = (1, 128, 128)


@fp8_api(BmmFp8Op, BMM_FP8)
def bmm_fp8(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
    backend: str = "cublas",
) -> torch.Tensor:
    """out[b] = (A[b] * A_scale) @ (B[b] * B_scale) in `dtype` (bfloat16 or float16).

    A [b, m, k] and B [b, k, n] (column-major, as FlashInfer's tests build it; any strides
    work) in float8_e4m3fn or float8_e5m2 (not both e5m2), per-tensor float32 scales of one
    element, fp32 accumulation. out: an optional [b, m, n] tensor of `dtype` (returned).
    backend: "cublas" (default), "cudnn", "cutlass" (no e5m2, as FlashInfer's) or "auto".
    """
    if backend not in BMM_BACKENDS:
        raise ValueError(f"Unsupported backend: {backend}")
    if backend == "cutlass" and torch.float8_e5m2 in (A.dtype, B.dtype):
        raise ValueError("e5m2 is not supported for cutlass backend")
    if A.dtype == B.dtype == torch.float8_e5m2:
        raise ValueError("bmm_fp8: A and B cannot both be float8_e5m2")
    inputs = bmm_inputs(A, B, A_scale, B_scale, dtype, out)
    return run_fp8("bmm_fp8", inputs, backend)


def mm_fp8(
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    backend: str = "trtllm_low_latency",
) -> torch.Tensor:
    """out = alpha * (a @ B.T) in bfloat16 (FlashInfer's current `mm_fp8`; not in 0.2.14):
    a [m, k] float8_e4m3fn, b the [k / 128, n, 128] block layout of B [n, k] that
    `prepare_low_latency_gemm_weights` makes (read in place), alpha one float32 element
    (the product of the two dequantization scales) or None for 1. Returns out [m, n].

    flashtune's block layout is not shuffled: FlashInfer's prepare also permutes rows for its
    TRT-LLM epilogue, so pair this mm_fp8 with flashtune's prepare (and FlashInfer's with
    FlashInfer's). No Definition: FlashInfer-Trace's gemm_fp8 template for this call names
    axes it does not declare and has no alpha input."""
    if backend != "trtllm_low_latency":
        raise ValueError(
            f"Unsupported backend: {backend}. Only ('trtllm_low_latency',) are supported"
        )
    return run_fp8("mm_fp8", mm_fp8_inputs(a, b, alpha, out_dtype, out))[0]


def prepare_low_latency_gemm_weights(
    w: torch.Tensor, permutation_indices_cache: dict[Any, torch.Tensor] | None = None
) -> torch.Tensor:
    """B [n, k] float8_e4m3fn (k a multiple of 128) in mm_fp8's block layout [k / 128, n, 128]
    (a new contiguous tensor). permutation_indices_cache is FlashInfer's cache of its row
    shuffle, which flashtune's layout does not have: accepted and unused."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[1] % MM_FP8_BLOCK:
        shape = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"w must be [n, k] with k a multiple of {MM_FP8_BLOCK}, got {shape}")
    n, k = w.shape
    return w.reshape(n, k // MM_FP8_BLOCK, MM_FP8_BLOCK).permute(1, 0, 2).contiguous()


@fp8_api(GroupwiseOp, GEMM_FP8_NT_GROUPWISE)
def gemm_fp8_nt_groupwise(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    scale_major_mode: str | None = None,
    mma_sm: int = 1,
    scale_granularity_mnk: tuple[int, int, int] = (1, 128, 128),
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str = "cutlass",
) -> torch.Tensor:
    """out = (a * a_scale) @ (b * b_scale).T with block scales: a [m, k] and b [n, k] fp8,
    one float32 scale per (gm x gk) block of a and per (gn x gk) block of b for
    scale_granularity_mnk (gm, gn, gk) (DeepSeek's (1, 128, 128) by default).

    backend "cutlass": scale_major_mode "K" (a_scale [m/gm, k/gk], b_scale [n/gn, k/gk]) or
    "MN" (a_scale [k/gk, m/gm], b_scale [k/gk, n/gn]). backend "trtllm" (granularity
    (1, 128, 128)): a_scale M-major ([k/128, m]), b_scale [n/128, k/128]. Block counts round
    up, so m, n and k need not be multiples of the blocks. out [m, n] (returned) or a new
    tensor of out_dtype (bfloat16 by default). mma_sm (1 or 2) is CUTLASS's hint, unused.
    """
    inputs = groupwise_inputs(
        a,
        b,
        a_scale,
        b_scale,
        scale_major_mode,
        mma_sm,
        scale_granularity_mnk,
        out,
        out_dtype,
        backend,
    )
    name = "gemm_fp8_nt_groupwise" if inputs.granularity[0] == 1 else "gemm_fp8_nt_blockscaled"
    return run_fp8(name, inputs)[0]


def gemm_fp8_nt_blockscaled(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    scale_major_mode: str | None = "MN",
    mma_sm: int = 1,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """gemm_fp8_nt_groupwise with 128x128 blocks for a as well as b (granularity
    (128, 128, 128)): a_scale [m/128, k/128] ("K") or [k/128, m/128] ("MN", the default)."""
    return gemm_fp8_nt_groupwise.fn(
        a,
        b,
        a_scale,
        b_scale,
        scale_major_mode=scale_major_mode,
        mma_sm=mma_sm,
        scale_granularity_mnk=(128, 128, 128),
        out=out,
        out_dtype=out_dtype,
    )


def group_gemm_fp8_nt_groupwise(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    m_indptr: torch.Tensor,
    scale_granularity_mnk: tuple[int, int, int] = (1, 128, 128),
    scale_major_mode: str = "MN",
    mma_sm: int = 1,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Segment GEMM: rows m_indptr[g]:m_indptr[g+1] of a [cum_m, k] times b[g].T (b [groups,
    n, k]), block scales as gemm_fp8_nt_groupwise's: "MN": a_scale [k/gk, cum_m/gm],
    b_scale [groups, k/gk, n/gn]; "K": a_scale [cum_m/gm, k/gk], b_scale [groups, n/gn,
    k/gk]. m_indptr [groups + 1] int32; rows past m_indptr[-1] are written as zeros.
    Returns out [cum_m, n] (bfloat16 by default)."""
    if not isinstance(m_indptr, torch.Tensor) or m_indptr.dim() != 1:
        raise ValueError("m_indptr must be a 1-D int32 tensor of groups + 1 offsets")
    if isinstance(b, torch.Tensor) and b.dim() == 3 and m_indptr.shape[0] != b.shape[0] + 1:
        raise ValueError(
            f"m_indptr must have {b.shape[0] + 1} entries for {b.shape[0]} groups, "
            f"got {m_indptr.shape[0]}"
        )
    _mma_sm_ok(mma_sm)
    rows = group_rows(m_indptr, a.shape[0]) if m_indptr.dtype == torch.int32 else m_indptr
    inputs = grouped_inputs(
        a,
        b,
        a_scale,
        b_scale,
        rows,
        "m_indptr",
        scale_granularity_mnk,
        scale_major_mode,
        out,
        out_dtype,
    )
    return run_fp8("group_gemm_fp8_nt_groupwise", inputs)[0]


def group_deepgemm_fp8_nt_groupwise(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    m_indices: torch.Tensor,
    scale_granularity_mnk: tuple[int, int, int] = (1, 128, 128),
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """DeepGEMM's contiguous grouped GEMM: row i of a [m, k] times b[m_indices[i]].T
    (b [groups, n, k]); K-major scales a_scale [m/gm, k/gk], b_scale [groups, n/gn, k/gk];
    m_indices [m] int32, -1 for a padding row (written as zeros). Returns out [m, n]."""
    if isinstance(m_indices, torch.Tensor) and m_indices.shape != a.shape[:1]:
        raise ValueError(f"m_indices must have shape ({a.shape[0]},), got {tuple(m_indices.shape)}")
    inputs = grouped_inputs(
        a, b, a_scale, b_scale, m_indices, "m_indices", scale_granularity_mnk, "K", out, out_dtype
    )
    return run_fp8("group_deepgemm_fp8_nt_groupwise", inputs)[0]


@fp8_api(MaskedOp, BATCH_DEEPGEMM_FP8_NT_GROUPWISE)
def batch_deepgemm_fp8_nt_groupwise(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int,
    scale_granularity_mnk: tuple[int, int, int] = (1, 128, 128),
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """DeepGEMM's masked batched GEMM: out[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g].T
    for a [groups, m, k], b [groups, n, k], K-major scales a_scale [groups, m/gm, k/gk],
    b_scale [groups, n/gn, k/gk]; rows past masked_m[g] are written as zeros. expected_m
    (a host-side hint of the typical masked_m) is not needed by the Triton kernel."""
    if not isinstance(expected_m, int) or expected_m < 0:
        raise ValueError(f"expected_m must be a non-negative int, got {expected_m!r}")
    inputs = masked_inputs(a, b, a_scale, b_scale, masked_m, scale_granularity_mnk, out, out_dtype)
    return run_fp8("batch_deepgemm_fp8_nt_groupwise", inputs)


def _mma_sm_ok(mma_sm: int) -> None:
    if mma_sm not in (1, 2):
        raise ValueError(f"mma_sm must be 1 or 2, got {mma_sm}")

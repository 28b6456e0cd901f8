"""RMSNorm family: rmsnorm, fused_add_rmsnorm and their Gemma variants (weight applied as 1 + w).

One Triton kernel serves all four ops. Rows are addressed through two strides so that 2-D
inputs with a row stride and 3-D inputs that cannot be flattened without a copy are read in
place: row r lives at (r // inner) * stride0 + (r % inner) * stride1.

- Single pass (hidden <= norm_config.MAX_SINGLE_BLOCK): ROWS rows per program, each row held in
  registers; several rows per program keep small hidden sizes from being launch-bound.
- Two passes (larger hidden, or a hidden far from a power of two at large batch): one row per
  program, a loop of BLOCK_N chunks to accumulate the sum of squares, then a second loop that
  normalizes (the re-read hits L1/L2).

Numerics follow FlashInfer: x (and x + residual) in fp32, y = x * rsqrt(mean(x^2) + eps) * w
in fp32, cast to the input dtype; fused_add stores residual = x + residual in the residual
dtype and normalizes the fp32 sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from flashtune import platform
from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.model_shapes import ModelConfig
from flashtune.ops.norm_config import RMSNormTactic, default_tactic
from flashtune.ops.pdl import launch_options, use_pdl
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
    *TOP_LEVEL["norm"],  # FlashInfer's names (flashtune.flashinfer_names)
    "rmsnorm_ref",
    "fused_add_rmsnorm_ref",
    "gemma_rmsnorm_ref",
    "gemma_fused_add_rmsnorm_ref",
    "RMSNORM",
    "FUSED_ADD_RMSNORM",
    "GEMMA_RMSNORM",
    "GEMMA_FUSED_ADD_RMSNORM",
    "RMSNormTactic",
    "RMSNormRunner",
    "RMSNORM_TUNING",
    "norm_examples",
]

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ----------------------------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------------------------


@triton.jit
def _rmsnorm_kernel(
    X,  # [n_rows, N] input rows; updated in place with the output when FUSED_ADD
    R,  # [n_rows, N] residual, updated in place to X + R (FUSED_ADD only; else unused)
    W,  # [N] weight
    Y,  # [n_rows, N] output (aliases X when FUSED_ADD)
    n_rows,
    N,
    inner,  # rows of the inner dimension: row r is at (r // inner, r % inner)
    sx0,
    sx1,
    sr0,
    sr1,
    sy0,
    sy1,
    eps,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    FUSED_ADD: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
    USE_PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/pdl.py)
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    r64 = rows.to(tl.int64)
    outer = r64 // inner
    inn = r64 % inner
    x_row = (outer * sx0 + inn * sx1)[:, None]  # [ROWS, 1]
    y_row = (outer * sy0 + inn * sy1)[:, None]
    r_row = (outer * sr0 + inn * sr1)[:, None]
    cols = tl.arange(0, BLOCK_N)
    if USE_PDL:
        # The previous kernel may still be running: its writes are visible after the wait.
        tl.extra.cuda.gdc_wait()

    if NUM_CHUNKS == 1:
        col_mask = cols < N
        mask = row_mask[:, None] & col_mask[None, :]
        # The weight load is issued with x's, not after the reduction: at small batches the
        # kernel is one DRAM round trip long, and a second one after the barrier costs ~10%.
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + WEIGHT_OFFSET
        x = tl.load(X + x_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if FUSED_ADD:
            x += tl.load(R + r_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if USE_PDL:
            tl.extra.cuda.gdc_launch_dependents()  # inputs read: the next kernel may start
        if FUSED_ADD:
            tl.store(R + r_row + cols[None, :], x.to(R.dtype.element_ty), mask=mask)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / N + eps)  # [ROWS]
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        # ROWS == 1 here (the launcher guarantees it).
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for c in range(NUM_CHUNKS):
            cc = c * BLOCK_N + cols
            mask = row_mask[:, None] & (cc < N)[None, :]
            x = tl.load(X + x_row + cc[None, :], mask=mask, other=0.0).to(tl.float32)
            if FUSED_ADD:
                x += tl.load(R + r_row + cc[None, :], mask=mask, other=0.0).to(tl.float32)
                tl.store(R + r_row + cc[None, :], x.to(R.dtype.element_ty), mask=mask)
            acc += x * x
        if USE_PDL:
            tl.extra.cuda.gdc_launch_dependents()
        rstd = tl.math.rsqrt(tl.sum(acc, axis=1) / N + eps)
        for c in range(NUM_CHUNKS):
            cc = c * BLOCK_N + cols
            col_mask = cc < N
            mask = row_mask[:, None] & col_mask[None, :]
            if FUSED_ADD:
                # The stored (rounded) sum: the fp32 one is gone after pass one.
                x = tl.load(R + r_row + cc[None, :], mask=mask, other=0.0).to(tl.float32)
            else:
                x = tl.load(X + x_row + cc[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + cc, mask=col_mask, other=0.0).to(tl.float32) + WEIGHT_OFFSET
            y = x * rstd[:, None] * w[None, :]
            tl.store(Y + y_row + cc[None, :], y.to(Y.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# References (plain PyTorch; one per op)
# ----------------------------------------------------------------------------------------------


def rmsnorm_ref(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32, returned in x's dtype."""
    x = hidden_states.to(torch.float32)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x * inv_rms * weight.to(torch.float32)).to(hidden_states.dtype)


def fused_add_rmsnorm_ref(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
):
    """The output, rmsnorm(hidden_states + residual) with the sum in fp32. (The op also
    stores the sum into residual: (hidden_states + residual) in fp32, cast to its dtype.)"""
    x = hidden_states.to(torch.float32) + residual.to(torch.float32)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x * inv_rms * weight.to(torch.float32)).to(hidden_states.dtype)


def gemma_rmsnorm_ref(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6):
    """Gemma's RMSNorm: the weight is stored as an offset from one, y = x_hat * (1 + weight)."""
    x = hidden_states.to(torch.float32)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x * inv_rms * (1.0 + weight.to(torch.float32))).to(hidden_states.dtype)


def gemma_fused_add_rmsnorm_ref(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
):
    """The output of the Gemma fused add + RMSNorm: weight applied as (1 + weight)."""
    x = hidden_states.to(torch.float32) + residual.to(torch.float32)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x * inv_rms * (1.0 + weight.to(torch.float32))).to(hidden_states.dtype)


# ----------------------------------------------------------------------------------------------
# Schemas. Axes carry no description and tensors none, so that the generated Definitions equal
# the corpus files (rmsnorm_h4096.json, fused_add_rmsnorm_h4096.json) field for field. A 3-D
# input's leading dimensions merge into batch_size.
# ----------------------------------------------------------------------------------------------


def _norm_schema(prefix: str, reference: Any, fused: bool, what: str, fi_api: str) -> OpSchema:
    rows = ["batch_size", "hidden_size"]
    inputs: dict[str, Tensor] = {
        "hidden_states": Tensor(rows, dtype_from="input", param="input"),
    }
    if fused:
        inputs["residual"] = Tensor(rows, dtype_from="input")
    inputs["weight"] = Tensor(["hidden_size"], dtype_from="input")
    return OpSchema(
        op_type="rmsnorm",
        name_prefix=prefix,
        axes={"batch_size": Var(), "hidden_size": Const(abbrev="h")},
        inputs=inputs,
        outputs={"output": Tensor(rows, dtype_from="input")},
        reference=reference,
        bound=("eps",),
        tags=[f"fi_api:{fi_api}", *(["fused"] if fused else [])],
        description=what,
    )


RMSNORM = _norm_schema(
    "rmsnorm", rmsnorm_ref, False, "Root Mean Square Normalization.", "flashinfer.norm.rmsnorm"
)
FUSED_ADD_RMSNORM = _norm_schema(
    "fused_add_rmsnorm",
    fused_add_rmsnorm_ref,
    True,
    "Fused Add + RMSNorm (in place: residual += hidden_states; hidden_states = output).",
    "flashinfer.norm.fused_add_rmsnorm",
)
GEMMA_RMSNORM = _norm_schema(
    "gemma_rmsnorm",
    gemma_rmsnorm_ref,
    False,
    "Gemma RMSNorm: the weight is applied as (1 + weight).",
    "flashinfer.norm.gemma_rmsnorm",
)
GEMMA_FUSED_ADD_RMSNORM = _norm_schema(
    "gemma_fused_add_rmsnorm",
    gemma_fused_add_rmsnorm_ref,
    True,
    "Gemma fused Add + RMSNorm: weight applied as (1 + weight), in place.",
    "flashinfer.norm.gemma_fused_add_rmsnorm",
)


# ----------------------------------------------------------------------------------------------
# Runner and tactics
# ----------------------------------------------------------------------------------------------


def _addressing(tensors: Sequence[torch.Tensor]) -> tuple[int, list[tuple[int, int]]]:
    """(inner, [(stride0, stride1) per tensor]) addressing row r of each tensor at
    (r // inner) * stride0 + (r % inner) * stride1. When every tensor's rows are evenly spaced
    (2-D, or 3-D that a view could flatten) inner is 1: Triton specializes the argument 1 as a
    constant, so the division disappears from the kernel."""
    if all(t.dim() == 2 or t.stride(0) == t.shape[1] * t.stride(1) for t in tensors):
        return 1, [(t.stride(-2), 0) for t in tensors]
    return tensors[0].shape[1], [(t.stride(0), t.stride(1)) for t in tensors]


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    y: torch.Tensor,
    residual: torch.Tensor | None,
    eps: float,
    weight_offset: float,
    tactic: Tactic,
    pdl: bool = False,
) -> None:
    hidden = x.shape[-1]
    n_rows = x.numel() // hidden if hidden else 0
    if n_rows == 0:
        return
    cfg = default_tactic(hidden, n_rows) if tactic == DEFAULT_TACTIC else tactic
    assert isinstance(cfg, RMSNormTactic)
    num_chunks = triton.cdiv(hidden, cfg.block_n)
    rows = cfg.rows if num_chunks == 1 else 1
    r = residual if residual is not None else x
    inner, ((sx0, sx1), (sy0, sy1), (sr0, sr1)) = _addressing([x, y, r])
    grid = (triton.cdiv(n_rows, rows),)
    _rmsnorm_kernel[grid](
        x,
        r,
        weight,
        y,
        n_rows,
        hidden,
        inner,
        sx0,
        sx1,
        sr0,
        sr1,
        sy0,
        sy1,
        eps,
        BLOCK_N=cfg.block_n,
        ROWS=rows,
        NUM_CHUNKS=num_chunks,
        FUSED_ADD=residual is not None,
        WEIGHT_OFFSET=weight_offset,
        USE_PDL=pdl,
        num_warps=cfg.num_warps,
        **launch_options(pdl),
    )


class RMSNormRunner(TunableRunner):
    """The Triton RMSNorm kernel. inputs: [x, weight, out, residual | None, eps, weight_offset]
    (out is x for the fused in-place form), optionally followed by pdl (bool, default False:
    launch with programmatic dependent launch; not part of what the tuner keys on)."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return list(RMSNormTactic.space(inputs[0].shape[-1]))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        x, weight, out, residual, eps, weight_offset, *rest = inputs
        _launch(x, weight, out, residual, eps, weight_offset, tactic, bool(rest and rest[0]))
        return out


_RUNNERS: tuple[TunableRunner, ...] = (RMSNormRunner(),)
RMSNORM_TUNING = TuningConfig(dynamic_dims=(DynamicDim(input_idx=0, dim=0),))


# ----------------------------------------------------------------------------------------------
# Validation, execution, torch custom ops
# ----------------------------------------------------------------------------------------------


def _check_rows(name: str, t: Any, dtype: torch.dtype | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() not in (2, 3):
        raise ValueError(
            f"{name} must be 2-D [batch, hidden] or 3-D [batch, seq, hidden], "
            f"got shape {tuple(t.shape)}"
        )
    if t.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype} (as input), got {t.dtype}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension (stride 1), got strides "
            f"{tuple(t.stride())}"
        )


def _validate(
    input: Any, weight: Any, residual: Any = None, out: Any = None, fused: bool = False
) -> None:
    _check_rows("input", input)
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    hidden = input.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != hidden:
        raise ValueError(
            f"weight must have shape ({hidden},) to match input's hidden size, got "
            f"{tuple(weight.shape)}"
        )
    if weight.dtype != input.dtype:
        raise TypeError(f"weight must have dtype {input.dtype} (as input), got {weight.dtype}")
    others = [("weight", weight)]
    if fused:
        _check_rows("residual", residual, input.dtype)
        if residual.shape != input.shape:
            raise ValueError(
                f"residual must have input's shape {tuple(input.shape)}, got "
                f"{tuple(residual.shape)}"
            )
        others.append(("residual", residual))
    if out is not None:
        _check_rows("out", out, input.dtype)
        if out.shape != input.shape:
            raise ValueError(
                f"out must have input's shape {tuple(input.shape)}, got {tuple(out.shape)}"
            )
        others.append(("out", out))
    for name, t in others:
        if t.device != input.device:
            raise ValueError(f"{name} is on {t.device} but input is on {input.device}")


def _rmsnorm_into(
    input: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    offset: float,
    pdl: bool = False,
) -> None:
    if not platform.kernels_available(input.device):
        ref = gemma_rmsnorm_ref if offset else rmsnorm_ref
        out.copy_(ref(input, weight, eps))
        return
    inputs = [input, weight, out, None, eps, offset]
    runner, tactic = choose_one("flashtune::rmsnorm", _RUNNERS, RMSNORM_TUNING, inputs)
    runner.forward([*inputs, pdl], tactic)


def _fused_add_rmsnorm_inplace(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    pdl: bool = False,
) -> None:
    if not platform.kernels_available(input.device):
        ref = gemma_fused_add_rmsnorm_ref if offset else fused_add_rmsnorm_ref
        y = ref(input, residual, weight, eps)
        residual.copy_(input.to(torch.float32) + residual.to(torch.float32))
        input.copy_(y)
        return
    inputs = [input, weight, input, residual, eps, offset]
    runner, tactic = choose_one("flashtune::fused_add_rmsnorm", _RUNNERS, RMSNORM_TUNING, inputs)
    runner.forward([*inputs, pdl], tactic)


# torch.compile traces through these custom ops; eager calls skip them. The dispatcher
# boundary measured 18-21 us of host time per call on the H200 machine (custom op 41 us vs
# the direct launch 21-23 us, bench_norm.py "custom_op_overhead" rows), far above a few us,
# so the direct eager path stays.
_rmsnorm_op = torch.library.custom_op(
    "flashtune::rmsnorm_out", _rmsnorm_into, mutates_args=("out",)
)


@_rmsnorm_op.register_fake
def _(input, weight, out, eps, offset, pdl=False) -> None:
    return None


_fused_add_rmsnorm_op = torch.library.custom_op(
    "flashtune::fused_add_rmsnorm", _fused_add_rmsnorm_inplace, mutates_args=("input", "residual")
)


@_fused_add_rmsnorm_op.register_fake
def _(input, residual, weight, eps, offset, pdl=False) -> None:
    return None


def _rmsnorm(input, weight, eps, out, offset, enable_pdl) -> torch.Tensor:
    _validate(input, weight, out=out)
    pdl = use_pdl(input.device, enable_pdl)
    if out is None:
        out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    if torch.compiler.is_compiling():
        _rmsnorm_op(input, weight, out, eps, offset, pdl)
    else:
        _rmsnorm_into(input, weight, out, eps, offset, pdl)
    return out


def _fused_add(input, residual, weight, eps, offset, enable_pdl) -> None:
    _validate(input, weight, residual=residual, fused=True)
    pdl = use_pdl(input.device, enable_pdl)
    if torch.compiler.is_compiling():
        _fused_add_rmsnorm_op(input, residual, weight, eps, offset, pdl)
    else:
        _fused_add_rmsnorm_inplace(input, residual, weight, eps, offset, pdl)


# ----------------------------------------------------------------------------------------------
# Public API (FlashInfer names and signatures)
# ----------------------------------------------------------------------------------------------


@api(schema=RMSNORM)
def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Root mean square normalization: out = input / sqrt(mean(input^2) + eps) * weight.

    input: [batch, hidden] or [batch, seq, hidden], float16/bfloat16/float32, last dimension
    contiguous (rows may have a stride); weight: [hidden], same dtype. Returns out.
    enable_pdl: launch with programmatic dependent launch on Hopper and later (None: the
    default of flashtune.ops.pdl); ignored where unsupported.
    """
    return _rmsnorm(input, weight, eps, out, 0.0, enable_pdl)


@api(schema=FUSED_ADD_RMSNORM)
def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """In place: residual += input; input = rmsnorm(residual) * weight (normalizing the fp32
    sum). input and residual: [batch, hidden] or [batch, seq, hidden], same shape and dtype.
    enable_pdl: as in `rmsnorm`."""
    _fused_add(input, residual, weight, eps, 0.0, enable_pdl)


@api(schema=GEMMA_RMSNORM)
def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Gemma RMSNorm: out = input / sqrt(mean(input^2) + eps) * (1 + weight). enable_pdl: as
    in `rmsnorm`."""
    return _rmsnorm(input, weight, eps, out, 1.0, enable_pdl)


@api(schema=GEMMA_FUSED_ADD_RMSNORM)
def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """In place: residual += input; input = rmsnorm(residual) * (1 + weight). enable_pdl: as
    in `rmsnorm`."""
    _fused_add(input, residual, weight, eps, 1.0, enable_pdl)


@register_examples
def norm_examples(model: ModelConfig) -> list[Example]:
    """Each norm at the model's hidden size (bf16, one token). No Gemma model is configured:
    the Gemma variants are emitted at every model's shapes so each schema has an example."""
    x = meta_tensor(1, model.hidden_size)
    w = meta_tensor(model.hidden_size)
    eps = {"eps": 1e-5}
    return [
        (rmsnorm, (x, w), eps),
        (fused_add_rmsnorm, (x, x, w), eps),
        (gemma_rmsnorm, (x, w), eps),
        (gemma_fused_add_rmsnorm, (x, x, w), eps),
    ]

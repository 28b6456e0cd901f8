"""Host side of the RMSNorm family: the kernel's launch, the autotuner's runner, input
validation, the CPU path (the references) and the torch custom ops that torch.compile
traces through.

fused_add stores residual = x + residual in the residual dtype and normalizes the fp32 sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton

from flashtune import platform
from flashtune.ops.norm.config import RMSNormTactic, default_tactic
from flashtune.ops.norm.kernels import _rmsnorm_kernel
from flashtune.ops.norm.reference import (
    fused_add_rmsnorm_ref,
    gemma_fused_add_rmsnorm_ref,
    gemma_rmsnorm_ref,
    rmsnorm_ref,
)
from flashtune.ops.pdl import launch_options, use_pdl
from flashtune.tune import (
    DEFAULT_TACTIC,
    DynamicDim,
    Tactic,
    TunableRunner,
    TuningConfig,
    choose_one,
)

__all__ = ["RMSNormRunner", "RMSNORM_TUNING"]

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


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

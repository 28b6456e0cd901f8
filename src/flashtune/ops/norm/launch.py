"""Host side of the RMSNorm family: the kernel's launch, the autotuner's runner, input
validation, the CPU path (the references) and the torch custom ops that torch.compile
traces through.

fused_add stores residual = x + residual in the residual dtype and normalizes the fp32 sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import triton

from flashtune.ops.call import (
    FLOATS,
    KernelOp,
    SchemaChecks,
    field_index,
    inputs_of,
    named,
    traced,
)
from flashtune.ops.norm.config import RMSNormTactic, default_tactic
from flashtune.ops.norm.kernels import _rmsnorm_kernel
from flashtune.ops.norm.reference import (
    fused_add_rmsnorm_ref,
    gemma_fused_add_rmsnorm_ref,
    gemma_rmsnorm_ref,
    rmsnorm_ref,
)
from flashtune.ops.norm.schema import (
    FUSED_ADD_RMSNORM,
    GEMMA_FUSED_ADD_RMSNORM,
    GEMMA_RMSNORM,
    RMSNORM,
)
from flashtune.ops.pdl import launch_options, use_pdl
from flashtune.schema import OpSchema
from flashtune.tune import (
    DEFAULT_TACTIC,
    DynamicDim,
    Tactic,
    TunableRunner,
    TuningConfig,
)

__all__ = ["RMSNormInputs", "RMSNormRunner", "RMSNORM_TUNING"]


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


class RMSNormInputs(NamedTuple):
    """RMSNormRunner's inputs; the tuner keys on the fields before `pdl`."""

    x: torch.Tensor  # [..., hidden] rows, last dimension contiguous
    weight: torch.Tensor  # [hidden]
    out: torch.Tensor  # like x; x itself for the fused in-place form
    residual: torch.Tensor | None  # like x (fused form only): updated to x + residual
    eps: float
    weight_offset: float  # 0.0, or 1.0 for Gemma's (1 + weight)
    pdl: bool = False  # launch with programmatic dependent launch (ops/pdl.py)


class RMSNormRunner(TunableRunner):
    """The Triton RMSNorm kernel. inputs: RMSNormInputs."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return list(RMSNormTactic.space(inputs[0].shape[-1]))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        x, weight, out, residual, eps, weight_offset, pdl = named(RMSNormInputs, inputs)
        _launch(x, weight, out, residual, eps, weight_offset, tactic, pdl)
        return out


_RUNNERS: tuple[TunableRunner, ...] = (RMSNormRunner(),)
RMSNORM_TUNING = TuningConfig(
    dynamic_dims=(DynamicDim(input_idx=field_index(RMSNormInputs, "x"), dim=0),)
)


def _reference(a: RMSNormInputs) -> None:
    """The CPU path: the references, written into out (and residual)."""
    if a.residual is None:
        norm = gemma_rmsnorm_ref if a.weight_offset else rmsnorm_ref
        a.out.copy_(norm(a.x, a.weight, a.eps))
        return
    fused = gemma_fused_add_rmsnorm_ref if a.weight_offset else fused_add_rmsnorm_ref
    y = fused(a.x, a.residual, a.weight, a.eps)
    a.residual.copy_(a.x.to(torch.float32) + a.residual.to(torch.float32))
    a.out.copy_(y)


_TUNED = len(RMSNormInputs._fields) - 1  # all but pdl
_RMSNORM = KernelOp("flashtune::rmsnorm", _RUNNERS, RMSNORM_TUNING, _reference, _TUNED)
_FUSED = KernelOp("flashtune::fused_add_rmsnorm", _RUNNERS, RMSNORM_TUNING, _reference, _TUNED)


# ----------------------------------------------------------------------------------------------
# Validation (from the schemas), execution, torch custom ops
# ----------------------------------------------------------------------------------------------


def _checks(schema: OpSchema) -> SchemaChecks:
    """input, residual and out: [batch, hidden] or [batch, seq, hidden] (the schema merges
    leading dimensions into batch_size); weight [hidden]; all in input's dtype (float16,
    bfloat16 or float32), last dimension contiguous."""
    fused = "residual" in schema.inputs
    rows = ("hidden_states", "residual") if fused else ("hidden_states", "output")
    return SchemaChecks(
        schema,
        dtypes={"hidden_states": FLOATS},
        ranks=dict.fromkeys(rows, (2, 3)),
        outputs={} if fused else {"output": "out"},
    )


_CHECK_NORM = {0.0: _checks(RMSNORM), 1.0: _checks(GEMMA_RMSNORM)}  # by weight offset
_CHECK_FUSED = {0.0: _checks(FUSED_ADD_RMSNORM), 1.0: _checks(GEMMA_FUSED_ADD_RMSNORM)}


@traced("rmsnorm_out", mutates=("out",))
def _rmsnorm_into(
    input: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    offset: float,
    pdl: bool = False,
) -> None:
    _RMSNORM(inputs_of(RMSNormInputs, (input, weight, out, None, eps, offset, pdl)))


@traced("fused_add_rmsnorm", mutates=("input", "residual"))
def _fused_add_rmsnorm_inplace(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    pdl: bool = False,
) -> None:
    _FUSED(inputs_of(RMSNormInputs, (input, weight, input, residual, eps, offset, pdl)))


def _rmsnorm(input, weight, eps, out, offset, enable_pdl) -> torch.Tensor:
    _CHECK_NORM[offset].validate({"input": input, "weight": weight, "out": out})
    pdl = use_pdl(input.device, enable_pdl)
    if out is None:
        out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    _rmsnorm_into(input, weight, out, eps, offset, pdl)
    return out


def _fused_add(input, residual, weight, eps, offset, enable_pdl) -> None:
    _CHECK_FUSED[offset].validate({"input": input, "residual": residual, "weight": weight})
    pdl = use_pdl(input.device, enable_pdl)
    _fused_add_rmsnorm_inplace(input, residual, weight, eps, offset, pdl)

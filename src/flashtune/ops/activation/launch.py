"""Host side of the gated activations: the kernel's launch, the autotuner's runner, input
validation, the CPU path (the references) and the torch custom op that torch.compile traces
through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
import triton

from flashtune import platform
from flashtune.ops.activation.config import ActivationTactic, default_tactic
from flashtune.ops.activation.kernels import _gated_act_kernel
from flashtune.ops.activation.reference import (
    gelu_and_mul_ref,
    gelu_tanh_and_mul_ref,
    silu_and_mul_ref,
)
from flashtune.ops.activation.schema import GELU_AND_MUL, GELU_TANH_AND_MUL, SILU_AND_MUL
from flashtune.ops.call import (
    FLOATS,
    KernelOp,
    SchemaChecks,
    field_index,
    inputs_of,
    named,
    traced,
)
from flashtune.ops.pdl import launch_options, use_pdl
from flashtune.tune import (
    DEFAULT_TACTIC,
    DynamicDim,
    Tactic,
    TunableRunner,
    TuningConfig,
)

__all__ = ["ActivationInputs", "GatedActivationRunner", "ACTIVATION_TUNING"]

_SILU, _GELU, _GELU_TANH = 0, 1, 2
_ACT_NAMES = {_SILU: "silu", _GELU: "gelu", _GELU_TANH: "gelu_tanh"}
_REFS = {_SILU: silu_and_mul_ref, _GELU: gelu_and_mul_ref, _GELU_TANH: gelu_tanh_and_mul_ref}


# ----------------------------------------------------------------------------------------------
# Runner and tactics
# ----------------------------------------------------------------------------------------------


def _launch(x: torch.Tensor, y: torch.Tensor, act: int, tactic: Tactic, pdl: bool = False) -> None:
    n_rows, d = y.shape
    if n_rows == 0 or d == 0:
        return
    cfg = default_tactic(d, n_rows) if tactic == DEFAULT_TACTIC else tactic
    assert isinstance(cfg, ActivationTactic)
    row_blocks, col_blocks = triton.cdiv(n_rows, cfg.rows), triton.cdiv(d, cfg.block_d)
    cols_fastest = cfg.cols_fastest and row_blocks <= platform.MAX_GRID_YZ
    grid = (col_blocks, row_blocks) if cols_fastest else (row_blocks, col_blocks)
    _gated_act_kernel[grid](
        x,
        y,
        n_rows,
        d,
        x.stride(0),
        y.stride(0),
        ACT=act,
        ROWS=cfg.rows,
        BLOCK_D=cfg.block_d,
        USE_PDL=pdl,
        **({"COLS_FASTEST": True} if cols_fastest else {}),
        num_warps=cfg.num_warps,
        **launch_options(pdl),
    )


class ActivationInputs(NamedTuple):
    """GatedActivationRunner's inputs; the tuner keys on the fields before `pdl`."""

    x: torch.Tensor  # [n, 2d], rows with a stride, last dimension contiguous
    out: torch.Tensor  # [n, d]
    act: int  # _SILU, _GELU or _GELU_TANH
    pdl: bool = False  # launch with programmatic dependent launch (ops/pdl.py)


class GatedActivationRunner(TunableRunner):
    """The Triton gated-activation kernel. inputs: ActivationInputs."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return list(ActivationTactic.space(inputs[1].shape[-1]))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        x, out, act, pdl = named(ActivationInputs, inputs)
        _launch(x, out, act, tactic, pdl)
        return out


_RUNNERS: tuple[TunableRunner, ...] = (GatedActivationRunner(),)
ACTIVATION_TUNING = TuningConfig(
    dynamic_dims=(DynamicDim(input_idx=field_index(ActivationInputs, "x"), dim=0),)
)


def _reference(a: ActivationInputs) -> None:
    """The CPU path: the reference, written into out."""
    a.out.copy_(_REFS[a.act](a.x))


# One per activation: the tuner's op name tells them apart.
_OPS = {
    act: KernelOp(f"flashtune::{name}_and_mul", _RUNNERS, ACTIVATION_TUNING, _reference, tuned=3)
    for act, name in _ACT_NAMES.items()
}


# ----------------------------------------------------------------------------------------------
# Validation (from the schemas), execution, torch custom op
# ----------------------------------------------------------------------------------------------


def _check_halves(arguments: Mapping[str, Any]) -> None:
    """What the schemas cannot say: the gate and up halves, and out's exact shape."""
    input, out = arguments["input"], arguments["out"]
    shape = input.shape
    if shape[-1] % 2 != 0:
        raise ValueError(
            f"input must be [..., 2 * d] (an even last dimension), got shape {tuple(shape)}"
        )
    if out is not None:
        expected = (*shape[:-1], shape[-1] // 2)
        if tuple(out.shape) != expected:
            raise ValueError(f"out must have shape {expected}, got {tuple(out.shape)}")


# input [..., 2d] and out [..., d] (the schemas merge leading dimensions into num_tokens),
# float16/bfloat16/float32, out in input's dtype, last dimensions contiguous.
_CHECKS = {
    schema.name_prefix: SchemaChecks(
        schema,
        dtypes={"input": FLOATS},
        ranks={"input": (1, None), "output": (1, None)},
        outputs={"output": "out"},
        unbound=("output",),
        check=_check_halves,
    )
    for schema in (SILU_AND_MUL, GELU_AND_MUL, GELU_TANH_AND_MUL)
}
_CHECK_BY_ACT = {act: _CHECKS[f"{name}_and_mul"] for act, name in _ACT_NAMES.items()}


def _rows_view(t: torch.Tensor) -> torch.Tensor | None:
    """t as a 2-D [rows, last] view, or None when its layout needs a copy for that."""
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return None


@traced("gated_act_out", mutates=("out",))
def _act_into(input: torch.Tensor, out: torch.Tensor, act: int, pdl: bool = False) -> None:
    x2 = _rows_view(input)
    if x2 is None:
        x2 = input.reshape(-1, input.shape[-1])
    view = _rows_view(out)
    scratch = view is None
    y2 = (
        torch.empty(x2.shape[0], x2.shape[1] // 2, dtype=out.dtype, device=out.device)
        if view is None
        else view
    )
    _OPS[act](inputs_of(ActivationInputs, (x2, y2, act, pdl)))
    if scratch:
        out.copy_(y2.view(out.shape))


def _gated(
    input: torch.Tensor, out: torch.Tensor | None, act: int, enable_pdl: bool | None
) -> torch.Tensor:
    _CHECK_BY_ACT[act].validate({"input": input, "out": out})
    pdl = use_pdl(input.device, enable_pdl)
    if out is None:
        shape = (*input.shape[:-1], input.shape[-1] // 2)
        out = torch.empty(shape, dtype=input.dtype, device=input.device)
    _act_into(input, out, act, pdl)
    return out

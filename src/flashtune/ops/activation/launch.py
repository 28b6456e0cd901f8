"""Host side of the gated activations: the kernel's launch, the autotuner's runner, input
validation, the CPU path (the references) and the torch custom op that torch.compile traces
through.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
from flashtune.ops.pdl import launch_options, use_pdl
from flashtune.tune import (
    DEFAULT_TACTIC,
    DynamicDim,
    Tactic,
    TunableRunner,
    TuningConfig,
    choose_one,
)

__all__ = ["GatedActivationRunner", "ACTIVATION_TUNING"]

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
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
    grid = (triton.cdiv(n_rows, cfg.rows), triton.cdiv(d, cfg.block_d))
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
        num_warps=cfg.num_warps,
        **launch_options(pdl),
    )


class GatedActivationRunner(TunableRunner):
    """The Triton gated-activation kernel. inputs: [x2d [n, 2d], out2d [n, d], act], optionally
    followed by pdl (bool, default False: launch with programmatic dependent launch; not part
    of what the tuner keys on)."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return list(ActivationTactic.space(inputs[1].shape[-1]))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        x, out, act, *rest = inputs
        _launch(x, out, act, tactic, bool(rest and rest[0]))
        return out


_RUNNERS: tuple[TunableRunner, ...] = (GatedActivationRunner(),)
ACTIVATION_TUNING = TuningConfig(dynamic_dims=(DynamicDim(input_idx=0, dim=0),))


# ----------------------------------------------------------------------------------------------
# Validation, execution, torch custom op
# ----------------------------------------------------------------------------------------------


def _validate(input: Any, out: Any) -> None:
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() < 1 or input.shape[-1] % 2 != 0:
        raise ValueError(
            f"input must be [..., 2 * d] (an even last dimension), got shape {tuple(input.shape)}"
        )
    if input.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"input must be float16, bfloat16 or float32, got {input.dtype}")
    if input.shape[-1] > 1 and input.stride(-1) != 1:
        raise ValueError(
            f"input must be contiguous in its last dimension, got strides {tuple(input.stride())}"
        )
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    expected = (*input.shape[:-1], input.shape[-1] // 2)
    if tuple(out.shape) != expected:
        raise ValueError(f"out must have shape {expected}, got {tuple(out.shape)}")
    if out.dtype != input.dtype:
        raise TypeError(f"out must have dtype {input.dtype} (as input), got {out.dtype}")
    if out.device != input.device:
        raise ValueError(f"out is on {out.device} but input is on {input.device}")
    if out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(
            f"out must be contiguous in its last dimension, got strides {tuple(out.stride())}"
        )


def _rows_view(t: torch.Tensor) -> torch.Tensor | None:
    """t as a 2-D [rows, last] view, or None when its layout needs a copy for that."""
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return None


def _act_into(input: torch.Tensor, out: torch.Tensor, act: int, pdl: bool = False) -> None:
    if not platform.kernels_available(input.device):
        out.copy_(_REFS[act](input))
        return
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
    inputs = [x2, y2, act]
    name = f"flashtune::{_ACT_NAMES[act]}_and_mul"
    runner, tactic = choose_one(name, _RUNNERS, ACTIVATION_TUNING, inputs)
    runner.forward([*inputs, pdl], tactic)
    if scratch:
        out.copy_(y2.view(out.shape))


# torch.compile traces through the custom op; eager calls skip it: the dispatcher boundary
# costs 18-21 us of host time per call (H200 machine, bench_norm.py "custom_op_overhead" rows).
_act_op = torch.library.custom_op("flashtune::gated_act_out", _act_into, mutates_args=("out",))


@_act_op.register_fake
def _(input, out, act, pdl=False) -> None:
    return None


def _gated(
    input: torch.Tensor, out: torch.Tensor | None, act: int, enable_pdl: bool | None
) -> torch.Tensor:
    _validate(input, out)
    pdl = use_pdl(input.device, enable_pdl)
    if out is None:
        shape = (*input.shape[:-1], input.shape[-1] // 2)
        out = torch.empty(shape, dtype=input.dtype, device=input.device)
    if torch.compiler.is_compiling():
        _act_op(input, out, act, pdl)
    else:
        _act_into(input, out, act, pdl)
    return out

"""Gated activations: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul.

input [..., 2d] holds the gate in its first half and the up projection in its second half;
out [..., d] = act(input[..., :d]) * input[..., d:], computed in fp32 and cast to the input
dtype (as FlashInfer and vLLM do).

One Triton kernel: a 2-D grid of (ROWS rows) x (BLOCK_D columns) tiles; rows are addressed
with a stride so that a 2-D input with padded rows is read in place.
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
from flashtune.ops.activation_config import ActivationTactic, default_tactic
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
    *TOP_LEVEL["activation"],  # FlashInfer's names (flashtune.flashinfer_names)
    "silu_and_mul_ref",
    "gelu_and_mul_ref",
    "gelu_tanh_and_mul_ref",
    "SILU_AND_MUL",
    "GELU_AND_MUL",
    "GELU_TANH_AND_MUL",
    "ActivationTactic",
    "GatedActivationRunner",
    "ACTIVATION_TUNING",
    "activation_examples",
]

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_SILU, _GELU, _GELU_TANH = 0, 1, 2
_ACT_NAMES = {_SILU: "silu", _GELU: "gelu", _GELU_TANH: "gelu_tanh"}


# ----------------------------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------------------------


@triton.jit
def _gated_act_kernel(
    X,  # [n_rows, 2 * D] gate | up
    Y,  # [n_rows, D]
    n_rows,
    D,
    stride_x,
    stride_y,
    ACT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/pdl.py)
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    x_ptr = X + r64 * stride_x + cols[None, :]
    if USE_PDL:
        # The previous kernel may still be running: its writes are visible after the wait.
        tl.extra.cuda.gdc_wait()
    # Each element is read once: stream it through L2 without displacing other data.
    gate = tl.load(x_ptr, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    up = tl.load(x_ptr + D, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()  # inputs read: the next kernel may start
    if ACT == 0:
        # exp's argument is capped so that large negative gates give 0 without an inf.
        act = gate / (1.0 + tl.exp(tl.minimum(-gate, 80.0)))
    elif ACT == 1:
        act = 0.5 * gate * (1.0 + tl.math.erf(gate * 0.7071067811865476))
    else:
        # tanh(z) = 1 - 2 / (exp(2z) + 1): exact at both saturations (exp -> inf or 0).
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = 0.5 * gate * (2.0 - 2.0 / (tl.exp(tl.minimum(2.0 * z, 80.0)) + 1.0))
    tl.store(Y + r64 * stride_y + cols[None, :], (act * up).to(Y.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------


def silu_and_mul_ref(input: torch.Tensor) -> torch.Tensor:
    """silu(input[..., :d]) * input[..., d:], in fp32, cast to input's dtype."""
    d = input.shape[-1] // 2
    x = input.to(torch.float32)
    return (torch.nn.functional.silu(x[..., :d]) * x[..., d:]).to(input.dtype)


def gelu_and_mul_ref(input: torch.Tensor) -> torch.Tensor:
    """gelu(input[..., :d]) (exact, erf) * input[..., d:], in fp32, cast to input's dtype."""
    d = input.shape[-1] // 2
    x = input.to(torch.float32)
    return (torch.nn.functional.gelu(x[..., :d]) * x[..., d:]).to(input.dtype)


def gelu_tanh_and_mul_ref(input: torch.Tensor) -> torch.Tensor:
    """gelu(input[..., :d], tanh approximation) * input[..., d:], in fp32."""
    d = input.shape[-1] // 2
    x = input.to(torch.float32)
    gate = torch.nn.functional.gelu(x[..., :d], approximate="tanh")
    return (gate * x[..., d:]).to(input.dtype)


_REFS = {_SILU: silu_and_mul_ref, _GELU: gelu_and_mul_ref, _GELU_TANH: gelu_tanh_and_mul_ref}


# ----------------------------------------------------------------------------------------------
# Schemas. The corpus has no activation Definitions; these name the op by its input width
# (silu_and_mul_i28672: the gate/up projection of Llama-3.1-8B). The output width is a var
# axis tied to it by a constraint, because a const axis must be read off an input's shape.
# ----------------------------------------------------------------------------------------------


def _act_schema(prefix: str, reference: Any, what: str) -> OpSchema:
    return OpSchema(
        op_type="activation",
        name_prefix=prefix,
        axes={
            "num_tokens": Var("rows (leading dimensions merged)"),
            "input_size": Const("2 * d: the gate half then the up half", abbrev="i"),
            "hidden_size": Var("d = input_size / 2, the output width"),
        },
        inputs={"input": Tensor(["num_tokens", "input_size"], dtype_from="input")},
        outputs={"output": Tensor(["num_tokens", "hidden_size"], dtype_from="input")},
        reference=reference,
        constraints=["hidden_size == input_size // 2"],
        tags=[f"fi_api:flashinfer.activation.{prefix}"],
        description=what,
    )


SILU_AND_MUL = _act_schema(
    "silu_and_mul", silu_and_mul_ref, "SwiGLU gate: silu(input[:, :d]) * input[:, d:]."
)
GELU_AND_MUL = _act_schema(
    "gelu_and_mul", gelu_and_mul_ref, "GeGLU gate (erf GELU): gelu(input[:, :d]) * input[:, d:]."
)
GELU_TANH_AND_MUL = _act_schema(
    "gelu_tanh_and_mul",
    gelu_tanh_and_mul_ref,
    "GeGLU gate (tanh GELU): gelu_tanh(input[:, :d]) * input[:, d:].",
)


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


# ----------------------------------------------------------------------------------------------
# Public API (FlashInfer names and signatures)
# ----------------------------------------------------------------------------------------------


@api(schema=SILU_AND_MUL)
def silu_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """SwiGLU gate: silu(input[..., :d]) * input[..., d:]; input [..., 2d] -> [..., d].
    enable_pdl: launch with programmatic dependent launch on Hopper and later (None: the
    default of flashtune.ops.pdl); ignored where unsupported."""
    return _gated(input, out, _SILU, enable_pdl)


@api(schema=GELU_AND_MUL)
def gelu_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """GeGLU gate (exact erf GELU): gelu(input[..., :d]) * input[..., d:]. enable_pdl: as in
    `silu_and_mul`."""
    return _gated(input, out, _GELU, enable_pdl)


@api(schema=GELU_TANH_AND_MUL)
def gelu_tanh_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """GeGLU gate (tanh-approximate GELU): gelu_tanh(input[..., :d]) * input[..., d:].
    enable_pdl: as in `silu_and_mul`."""
    return _gated(input, out, _GELU_TANH, enable_pdl)


@register_examples
def activation_examples(model: ModelConfig) -> list[Example]:
    """The gated MLP activation at the model's intermediate size (bf16, one token); the GELU
    variants too, at the same shape, so each schema has an example (no GeGLU model is
    configured)."""
    x = meta_tensor(1, 2 * model.intermediate_size)
    return [(op, (x,), {}) for op in (silu_and_mul, gelu_and_mul, gelu_tanh_and_mul)]

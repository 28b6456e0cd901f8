"""Schemas of the gated activations (one per op) and their model examples.

The corpus has no activation Definitions; these name the op by its input width
(silu_and_mul_i28672: the gate/up projection of Llama-3.1-8B). The output width is a var
axis tied to it by a constraint, because a const axis must be read off an input's shape.
"""

from __future__ import annotations

from typing import Any

from flashtune.model_shapes import ModelConfig
from flashtune.ops.activation.reference import (
    gelu_and_mul_ref,
    gelu_tanh_and_mul_ref,
    silu_and_mul_ref,
)
from flashtune.schema import ApiOp, Const, OpSchema, Tensor, Var, family_op
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = ["SILU_AND_MUL", "GELU_AND_MUL", "GELU_TANH_AND_MUL", "activation_examples"]


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


def _op(name: str) -> ApiOp:
    return family_op(__name__, name)


@register_examples
def activation_examples(model: ModelConfig) -> list[Example]:
    """The gated MLP activation at the model's intermediate size (bf16, one token); the GELU
    variants too, at the same shape, so each schema has an example (no GeGLU model is
    configured)."""
    x = meta_tensor(1, 2 * model.intermediate_size)
    ops = map(_op, ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"))
    return [(op, (x,), {}) for op in ops]

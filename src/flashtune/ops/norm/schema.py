"""Schemas of the RMSNorm family (one per op) and its model examples.

Axes carry no description and tensors none, so that the generated Definitions equal the
corpus files (rmsnorm_h4096.json, fused_add_rmsnorm_h4096.json) field for field. A 3-D
input's leading dimensions merge into batch_size.
"""

from __future__ import annotations

from typing import Any

from flashtune.model_shapes import ModelConfig
from flashtune.ops.norm.reference import (
    fused_add_rmsnorm_ref,
    gemma_fused_add_rmsnorm_ref,
    gemma_rmsnorm_ref,
    rmsnorm_ref,
)
from flashtune.schema import ApiOp, Const, OpSchema, Tensor, Var, family_op
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = [
    "RMSNORM",
    "FUSED_ADD_RMSNORM",
    "GEMMA_RMSNORM",
    "GEMMA_FUSED_ADD_RMSNORM",
    "norm_examples",
]


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


def _op(name: str) -> ApiOp:
    return family_op(__name__, name)


@register_examples
def norm_examples(model: ModelConfig) -> list[Example]:
    """Each norm at the model's hidden size (bf16, one token). No Gemma model is configured:
    the Gemma variants are emitted at every model's shapes so each schema has an example."""
    x = meta_tensor(1, model.hidden_size)
    w = meta_tensor(model.hidden_size)
    eps = {"eps": 1e-5}
    return [
        (_op("rmsnorm"), (x, w), eps),
        (_op("fused_add_rmsnorm"), (x, x, w), eps),
        (_op("gemma_rmsnorm"), (x, w), eps),
        (_op("gemma_fused_add_rmsnorm"), (x, x, w), eps),
    ]

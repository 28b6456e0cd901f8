"""The sampling family's op schemas, built on the references (reference.py), the schema's view
of a call (`SamplingOp`, registered by `sampling_api`) and the family's model examples.

The Definitions of top_k / top_p / top_k_top_p sampling equal the FlashInfer-Trace corpus's
(../shared/flashinfer-trace/definitions/sampling): per-row parameters as [batch_size]
tensors (int32 top_k, float32 top_p), int64 samples. The public functions also take Python
scalars and return int32 (FlashInfer's convention); `SamplingOp` shows a call to the
schema as the corpus's form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from flashtune.model_shapes import ModelConfig
from flashtune.ops.sampling.reference import (
    min_p_sampling_from_probs_ref,
    sampling_from_logits_ref,
    sampling_from_probs_ref,
    softmax_ref,
    top_k_mask_logits_ref,
    top_k_renorm_probs_ref,
    top_k_sampling_from_probs_ref,
    top_k_top_p_joint_sampling_from_logits_ref,
    top_k_top_p_joint_sampling_from_probs_ref,
    top_k_top_p_sampling_from_logits_ref,
    top_k_top_p_sampling_from_probs_ref,
    top_p_renorm_probs_ref,
    top_p_sampling_from_probs_ref,
)
from flashtune.schema import REGISTRY, ApiOp, Const, OpSchema, Tensor, Var, family_op
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = [
    "SOFTMAX",
    "SAMPLING_FROM_PROBS",
    "SAMPLING_FROM_LOGITS",
    "TOP_P_SAMPLING",
    "TOP_K_SAMPLING",
    "MIN_P_SAMPLING",
    "TOP_K_TOP_P_SAMPLING",
    "TOP_K_TOP_P_JOINT_SAMPLING",
    "TOP_K_TOP_P_SAMPLING_FROM_LOGITS",
    "TOP_K_TOP_P_JOINT_SAMPLING_FROM_LOGITS",
    "TOP_P_RENORM",
    "TOP_K_RENORM",
    "TOP_K_MASK_LOGITS",
    "SamplingOp",
    "sampling_examples",
]


# ----------------------------------------------------------------------------------------------
# Schemas. The corpus's descriptions of axes and inputs are kept (its vocab description names
# a model; ours does not).
# ----------------------------------------------------------------------------------------------

_AXES: dict[str, Var | Const] = {
    "batch_size": Var(description="Number of sequences to sample from"),
    "vocab_size": Const(description="Size of the vocabulary", abbrev="v"),
}
_ROWS = ["batch_size", "vocab_size"]
_PROBS = Tensor(_ROWS, dtype_from="probs", description="Probability distributions (after softmax)")
_LOGITS = Tensor(_ROWS, dtype_from="logits", description="Pre-softmax logits")
_TOP_K = Tensor(
    ["batch_size"],
    dtype="int32",
    description="Number of top tokens to consider for sampling per sequence",
)
_TOP_P = Tensor(
    ["batch_size"],
    dtype="float32",
    description="Cumulative probability threshold for nucleus sampling per sequence",
)
_MIN_P = Tensor(
    ["batch_size"],
    dtype="float32",
    description="Minimum probability relative to the most likely token, per sequence",
)
_SAMPLES = {"samples": Tensor(["batch_size"], dtype="int64", description="Sampled token indices")}


def _schema(
    prefix: str,
    reference: Callable[..., Any],
    inputs: dict[str, Tensor],
    outputs: dict[str, Tensor],
    what: str,
    fi_name: str,
    op_type: str = "sampling",
) -> OpSchema:
    return OpSchema(
        op_type=op_type,  # "sampling" is checked by distribution (bench/correctness.py)
        name_prefix=prefix,
        axes=_AXES,
        inputs=inputs,
        outputs=outputs,
        reference=reference,
        tags=[f"fi_api:flashinfer.sampling.{fi_name}"],
        description=what,
    )


SOFTMAX = _schema(
    "softmax",
    softmax_ref,
    {"logits": _LOGITS, "temperature": Tensor(["batch_size"], dtype="float32")},
    {"probs": Tensor(_ROWS, dtype="float32")},
    "Softmax with temperature: softmax(logits / temperature) per row.",
    "softmax",
    op_type="softmax",
)
SAMPLING_FROM_PROBS = _schema(
    "sampling_from_probs",
    sampling_from_probs_ref,
    {"probs": _PROBS},
    _SAMPLES,
    "Sampling from probabilities: one draw per row.",
    "sampling_from_probs",
)
SAMPLING_FROM_LOGITS = _schema(
    "sampling_from_logits",
    sampling_from_logits_ref,
    {"logits": _LOGITS},
    _SAMPLES,
    "Sampling from logits: one draw per row from softmax(logits).",
    "sampling_from_logits",
)
TOP_P_SAMPLING = _schema(
    "top_p_sampling_from_probs",
    top_p_sampling_from_probs_ref,
    {"probs": _PROBS, "top_p": _TOP_P},
    _SAMPLES,
    "Top-p (nucleus) sampling from probabilities. Filters probabilities using cumulative "
    "probability threshold, then samples from the filtered distribution.",
    "top_p_sampling_from_probs",
)
TOP_K_SAMPLING = _schema(
    "top_k_sampling_from_probs",
    top_k_sampling_from_probs_ref,
    {"probs": _PROBS, "top_k": _TOP_K},
    _SAMPLES,
    "Top-k sampling from probabilities. Keeps only the k highest probability tokens, "
    "renormalizes, then samples from the filtered distribution.",
    "top_k_sampling_from_probs",
)
MIN_P_SAMPLING = _schema(
    "min_p_sampling_from_probs",
    min_p_sampling_from_probs_ref,
    {"probs": _PROBS, "min_p": _MIN_P},
    _SAMPLES,
    "Min-p sampling from probabilities. Keeps the tokens at least min_p times as likely as "
    "the most likely one, then samples from the filtered distribution.",
    "min_p_sampling_from_probs",
)
TOP_K_TOP_P_SAMPLING = _schema(
    "top_k_top_p_sampling_from_probs",
    top_k_top_p_sampling_from_probs_ref,
    {"probs": _PROBS, "top_k": _TOP_K, "top_p": _TOP_P},
    _SAMPLES,
    "Top-k top-p (nucleus) sampling from probabilities. Filters probabilities using top-k "
    "and top-p constraints, then samples from the filtered distribution.",
    "top_k_top_p_sampling_from_probs",
)
TOP_K_TOP_P_JOINT_SAMPLING = _schema(
    "top_k_top_p_joint_sampling_from_probs",
    top_k_top_p_joint_sampling_from_probs_ref,
    {"probs": _PROBS, "top_k": _TOP_K, "top_p": _TOP_P},
    _SAMPLES,
    "Joint top-k top-p sampling from probabilities (filter_apply_order='joint'): keeps the "
    "tokens both filters keep on the original row, then samples from them.",
    "top_k_top_p_sampling_from_probs",
)
TOP_K_TOP_P_SAMPLING_FROM_LOGITS = _schema(
    "top_k_top_p_sampling_from_logits",
    top_k_top_p_sampling_from_logits_ref,
    {"logits": _LOGITS, "top_k": _TOP_K, "top_p": _TOP_P},
    _SAMPLES,
    "Top-k top-p sampling from logits: top-k mask, softmax, then top-p sampling.",
    "top_k_top_p_sampling_from_logits",
)
TOP_K_TOP_P_JOINT_SAMPLING_FROM_LOGITS = _schema(
    "top_k_top_p_joint_sampling_from_logits",
    top_k_top_p_joint_sampling_from_logits_ref,
    {"logits": _LOGITS, "top_k": _TOP_K, "top_p": _TOP_P},
    _SAMPLES,
    "Joint top-k top-p sampling from logits (filter_apply_order='joint'): softmax, then "
    "the tokens both filters keep.",
    "top_k_top_p_sampling_from_logits",
)
TOP_P_RENORM = _schema(
    "top_p_renorm_probs",
    top_p_renorm_probs_ref,
    {"probs": _PROBS, "top_p": _TOP_P},
    {"renorm_probs": Tensor(_ROWS, dtype="float32")},
    "Top-p renormalization: the probabilities top-p sampling keeps, renormalized.",
    "top_p_renorm_probs",
    op_type="sampling_filter",
)
TOP_K_RENORM = _schema(
    "top_k_renorm_probs",
    top_k_renorm_probs_ref,
    {"probs": _PROBS, "top_k": _TOP_K},
    {"renorm_probs": Tensor(_ROWS, dtype="float32")},
    "Top-k renormalization: the probabilities top-k sampling keeps, renormalized.",
    "top_k_renorm_probs",
    op_type="sampling_filter",
)
TOP_K_MASK_LOGITS = _schema(
    "top_k_mask_logits",
    top_k_mask_logits_ref,
    {"logits": _LOGITS, "top_k": _TOP_K},
    {"masked_logits": Tensor(_ROWS, dtype_from="logits")},
    "Top-k logits mask: all but the k largest logits of each row set to -inf.",
    "top_k_mask_logits",
    op_type="sampling_filter",
)


# ----------------------------------------------------------------------------------------------
# The schema's view of a call
# ----------------------------------------------------------------------------------------------

# Per-row parameters as the Definitions hold them: (batch,) tensors of these dtypes.
_PER_ROW = {
    "top_k": torch.int32,
    "top_p": torch.float32,
    "min_p": torch.float32,
    "temperature": torch.float32,
}


class SamplingOp(ApiOp):
    """`@api` for the sampling family: the schema sees scalar parameters as (batch,) tensors
    of the Definition's dtype (so a call with top_p=0.9 has the corpus's Definition) and
    refuses the calls no Definition describes: `indices` (outputs and probability rows
    differ in number), a `generator` (the draws depend on its state, which a Definition
    cannot carry) and `check_nan` (a check the Definition's solutions would skip). Such
    calls are neither captured nor applied; they run flashtune's own kernels."""

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        for option in ("indices", "generator"):
            if arguments.get(option) is not None:
                raise ValueError(f"{self.fn.__name__}: a call with {option}= has no Definition")
        if arguments.get("check_nan"):
            raise ValueError(f"{self.fn.__name__}: a call with check_nan=True has no Definition")
        rows = arguments.get("probs", arguments.get("logits"))
        if not isinstance(rows, torch.Tensor) or rows.dim() != 2:
            return arguments  # the schema reports it
        for name, dtype in _PER_ROW.items():
            if name not in arguments:
                continue
            value = 1.0 if arguments[name] is None else arguments[name]
            if isinstance(value, torch.Tensor):
                arguments[name] = value.to(dtype)
            else:
                arguments[name] = torch.full(
                    (rows.shape[0],), value, dtype=dtype, device=rows.device
                )
        return arguments


def sampling_api(
    schema: OpSchema | Callable[..., OpSchema], schemas: Sequence[OpSchema] | None = None
) -> Callable[[Callable[..., Any]], SamplingOp]:
    """Register `fn` as a schema'd sampling op (schema: an OpSchema, or a callable choosing
    one of `schemas` from the arguments)."""

    def wrap(fn: Callable[..., Any]) -> SamplingOp:
        op = SamplingOp(fn, schema, None if schemas is None else list(schemas))
        REGISTRY[op.qualname] = op
        return op

    return wrap


def _by_order(joint: OpSchema, top_k_first: OpSchema) -> Callable[..., OpSchema]:
    def select(*args: Any, filter_apply_order: str = "top_k_first", **kwargs: Any) -> OpSchema:
        if filter_apply_order == "joint":
            return joint
        if filter_apply_order == "top_k_first":
            return top_k_first
        raise ValueError(
            f"filter_apply_order must be 'top_k_first' or 'joint', got {filter_apply_order!r}"
        )

    return select


def _op(name: str) -> ApiOp:
    return family_op(__name__, name)


@register_examples
def sampling_examples(model: ModelConfig) -> list[Example]:
    """Each op on one row of the model's vocabulary (fp32, as the corpus's definitions)."""
    probs = meta_tensor(1, model.vocab_size, dtype=torch.float32)
    logits = meta_tensor(1, model.vocab_size, dtype=torch.float32)
    joint = {"filter_apply_order": "joint"}
    return [
        (_op("softmax"), (logits,), {"temperature": 1.0}),
        (_op("sampling_from_probs"), (probs,), {}),
        (_op("sampling_from_logits"), (logits,), {}),
        (_op("top_p_sampling_from_probs"), (probs, 0.9), {}),
        (_op("top_k_sampling_from_probs"), (probs, 50), {}),
        (_op("min_p_sampling_from_probs"), (probs, 0.1), {}),
        (_op("top_k_top_p_sampling_from_probs"), (probs, 50, 0.9), {}),
        (_op("top_k_top_p_sampling_from_probs"), (probs, 50, 0.9), joint),
        (_op("top_k_top_p_sampling_from_logits"), (logits, 50, 0.9), {}),
        (_op("top_k_top_p_sampling_from_logits"), (logits, 50, 0.9), joint),
        (_op("top_p_renorm_probs"), (probs, 0.9), {}),
        (_op("top_k_renorm_probs"), (probs, 50), {}),
        (_op("top_k_mask_logits"), (logits, 50), {}),
    ]

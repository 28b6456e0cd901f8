"""Schemas of the cos/sin-cache form of RoPE and their model examples.

The schemas equal the corpus file rope_with_cos_sin_cache_neox_style_d128_rd64.json in name,
axes, inputs and outputs. They bind q/k as [num_tokens, num_heads, head_size]: a Definition
for a call with 2-D [num_tokens, num_heads * head_size] query/key cannot be built (the
schema layer has no way to split a dimension), so the definition dump skips such calls. The
ragged `apply_rope` has no schema yet.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.model_shapes import ModelConfig
from flashtune.ops.rope.reference import rope_with_cos_sin_cache_ref
from flashtune.schema import ApiOp, Const, OpSchema, Tensor, Var, family_op
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = ["ROPE_NEOX", "ROPE_GPTJ", "rope_examples"]


def _rope_schema(style: str, neox: bool) -> OpSchema:
    heads = ["num_tokens", "num_qo_heads", "head_size"]
    kv_heads = ["num_tokens", "num_kv_heads", "head_size"]
    return OpSchema(
        op_type="rope",
        name_prefix=f"rope_with_cos_sin_cache_{style}_style",
        axes={
            "num_tokens": Var("Total number of tokens across all sequences."),
            "num_qo_heads": Var("Number of query heads."),
            "num_kv_heads": Var("Number of KV heads."),
            "head_size": Const("Full head dimension.", abbrev="d", param="head_size"),
            "rotary_dim": Const("Rotated leading dimensions of each head.", abbrev="rd"),
            "max_seq_len": Var("Maximum sequence length for the cos/sin cache."),
        },
        inputs={
            "q": Tensor(heads, dtype_from="query", param="query"),
            "k": Tensor(kv_heads, dtype_from="query", param="key"),
            "cos_sin_cache": Tensor(["max_seq_len", "rotary_dim"], dtype="float32"),
            "positions": Tensor(["num_tokens"], dtype="int64"),
        },
        outputs={
            "q_out": Tensor(heads, dtype_from="query"),
            "k_out": Tensor(kv_heads, dtype_from="query"),
        },
        reference=rope_with_cos_sin_cache_ref,
        bound=("head_size", "is_neox"),
        tags=["fi_api:flashinfer.rope.apply_rope_with_cos_sin_cache_inplace"],
        description=(
            "Rotary position embedding with a precomputed cos/sin cache (cos | sin halves of "
            "rotary_dim), "
            + (
                "NeoX style: pairs (x[j], x[j + rd/2])."
                if neox
                else "GPT-J style: pairs (x[2j], x[2j+1])."
            )
            + " Dimensions past rotary_dim pass through."
        ),
    )


ROPE_NEOX = _rope_schema("neox", True)
ROPE_GPTJ = _rope_schema("gptj", False)


def _rope_cache_schema(
    positions: Any, query: Any, key: Any, head_size: Any, cos_sin_cache: Any, is_neox: bool = True
) -> OpSchema:
    return ROPE_NEOX if is_neox else ROPE_GPTJ


def _op(name: str) -> ApiOp:
    return family_op(__name__, name)


@register_examples
def rope_examples(model: ModelConfig) -> list[Example]:
    """RoPE over the model's heads (bf16, one token, full rotary dimension), NeoX style as the
    Llama/Qwen models use it; GPT-J style at the same shape so each schema has an example.
    An MLA model rotates only its decoupled RoPE part (qk_rope_head_dim) of every query head
    and of the one shared key."""
    d = model.head_dim if model.mla is None else model.mla.qk_rope_head_dim
    q = meta_tensor(1, model.num_qo_heads, d)
    k = meta_tensor(1, model.num_kv_heads if model.mla is None else 1, d)
    cache = meta_tensor(4096, d, dtype=torch.float32)
    pos = meta_tensor(1, dtype=torch.int64)
    return [
        (_op("apply_rope_with_cos_sin_cache_inplace"), (pos, q, k, d, cache), {"is_neox": neox})
        for neox in (True, False)
    ]

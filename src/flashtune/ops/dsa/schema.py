"""Schemas of DSA: the FlashInfer-Trace dsa_paged Definitions, field for field
(`dsa_topk_indexer_fp8_h64_d128_topk2048_ps64`, `dsa_sparse_attention_h16_ckv512_kpe64_
topk2048_ps1` and `_ps64`), with `reference.py`'s functions emitted as their reference.

The corpus words its descriptions per variant (page size 1 or 64; the indexer's deep_gemm
shapes, DeepSeek-V3.2's 16 heads at TP 8): the corpus's wording at its shapes, the same
contract in general words at others (the bundled dataset's reduced shapes). One schema per
op (`ATTENTION_SCHEMA`, `INDEXER_SCHEMA`) builds each Definition with the wording of its
constants (`DSASchema.describe`: the variants in ATTENTION_SCHEMAS / INDEXER_SCHEMAS, which
differ in descriptions only). Its names put topk before the page size although its axes list
page_size first: `DSASchema.name_order` spells the name's order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from flashtune.data.models import Definition
from flashtune.ops.dsa.reference import dsa_sparse_attention_ref, dsa_topk_indexer_ref
from flashtune.schema import Const, OpSchema, Scalar, Tensor, Var
from flashtune.schema.core import BoundCall

__all__ = [
    "ATTENTION_PREFIX",
    "ATTENTION_SCHEMA",
    "ATTENTION_SCHEMAS",
    "INDEXER_SCHEMA",
    "DSASchema",
    "INDEXER_PREFIX",
    "INDEXER_SCHEMAS",
    "attention_key",
    "indexer_key",
]

ATTENTION_PREFIX = "dsa_sparse_attention"
INDEXER_PREFIX = "dsa_topk_indexer_fp8"
OP_TYPE = "dsa_paged"


@dataclass(frozen=True)
class DSASchema(OpSchema):
    """An OpSchema whose name spells its const axes in `name_order` (the corpus's), whose
    Definition description is the schema's own (the bound topk is in the name already), and
    whose Definitions are worded by the variant `describe` gives for their constants (None:
    this schema's own words)."""

    name_order: tuple[str, ...] = ()
    describe: Callable[[Mapping[str, int]], OpSchema] | None = field(default=None, compare=False)

    def name_for(self, axes: Mapping[str, int]) -> str:
        parts = [self.name_prefix]
        for axis in self.name_order:
            spec = self.axes[axis]
            assert isinstance(spec, Const) and spec.abbrev
            parts.append(f"{spec.abbrev}{axes[axis]}")
        return "_".join(parts)

    def build_definition(self, call: BoundCall) -> Definition:
        if self.describe is not None:
            return self.describe(call.axes).build_definition(call)
        definition = super().build_definition(call)
        return definition.model_copy(update={"description": self.description or None})


# --------------------------------------------------------------------------- sparse attention

_SM_SCALE = (
    "Softmax scale. For MLA, uses pre-absorption head dimension: 1/sqrt(head_dim_qk + "
    "head_dim_kpe) = 1/sqrt(128 + 64) = 1/sqrt(192)."
)
_PAGE_SIZE_TEXT = {1: "token-level", 64: "64 tokens per page"}


def _attention_schema(page_size: int | None, deepseek: bool) -> DSASchema:
    """page_size: 1 or 64 (the corpus's wording of that page size) or None (any other);
    deepseek: 16 query heads, DeepSeek-V3.2's 128 at TP 8."""
    split = " (128/8=16)" if deepseek else ""
    if page_size is None:
        ps_text = "Page size for KV cache (tokens per page)."
        cache = "Compressed key-value cache."
        encode = " Indices encode (page_idx * page_size + offset)."
        variant = ""
    else:
        ps_text = f"Page size for KV cache ({_PAGE_SIZE_TEXT[page_size]})."
        cache = f"Compressed key-value cache with page_size={page_size}."
        encode = (
            "" if page_size == 1 else " For page_size=64, indices encode (page_idx * 64 + offset)."
        )
        variant = "" if page_size == 1 else " Page size 64 variant."
    captured = " Captured from DeepSeek-V3.2 with tensor parallel size 8." if deepseek else ""
    return DSASchema(
        op_type=OP_TYPE,
        name_prefix=ATTENTION_PREFIX,
        axes={
            "num_tokens": Var(
                "Number of tokens (batch_size for decode, total_num_tokens for prefill)."
            ),
            "num_qo_heads": Const(
                f"Number of query heads after tensor parallel split{split}.", abbrev="h"
            ),
            "head_dim_ckv": Const("Compressed KV head dimension.", abbrev="ckv"),
            "head_dim_kpe": Const("Key positional encoding dimension.", abbrev="kpe"),
            "page_size": Const(ps_text, abbrev="ps"),
            "topk": Const(
                "Number of top-K KV cache entries selected for sparse attention.", abbrev="topk"
            ),
            "num_pages": Var("Total number of allocated pages in the KV cache."),
        },
        inputs={
            "q_nope": Tensor(
                ["num_tokens", "num_qo_heads", "head_dim_ckv"],
                dtype_from="q_nope",
                description="Query tensor without positional encoding component.",
            ),
            "q_pe": Tensor(
                ["num_tokens", "num_qo_heads", "head_dim_kpe"],
                dtype_from="q_pe",
                description="Query positional encoding component.",
            ),
            "ckv_cache": Tensor(
                ["num_pages", "page_size", "head_dim_ckv"],
                dtype_from="ckv_cache",
                description=cache,
            ),
            "kpe_cache": Tensor(
                ["num_pages", "page_size", "head_dim_kpe"],
                dtype_from="kpe_cache",
                description="Key positional encoding cache.",
            ),
            "sparse_indices": Tensor(
                ["num_tokens", "topk"],
                dtype="int32",
                description="Sparse indices selecting top-K KV cache entries for each token. "
                f"Values of -1 indicate padding (invalid indices).{encode}",
            ),
            "sm_scale": Scalar("float32", description=_SM_SCALE),
        },
        outputs={
            "output": Tensor(["num_tokens", "num_qo_heads", "head_dim_ckv"], dtype_from="q_nope"),
            "lse": Tensor(
                ["num_tokens", "num_qo_heads"],
                dtype="float32",
                description="The 2-based log-sum-exp of attention logits.",
            ),
        },
        reference=dsa_sparse_attention_ref,
        constraints=[
            "sparse_indices.shape[0] == num_tokens",
            "sparse_indices.shape[-1] == topk",
            "ckv_cache.shape[1] == page_size",
        ],
        tags=["sparse:topk"],
        description="Batched Native Sparse Attention (DSA) with sparse TopK KV cache selection."
        f"{captured} Uses sparse indexing to select only top-K KV cache entries for attention "
        f"computation.{variant} Works for both prefill and decode stages.",
        name_order=("num_qo_heads", "head_dim_ckv", "head_dim_kpe", "topk", "page_size"),
    )


ATTENTION_SCHEMAS: dict[tuple[int | None, bool], DSASchema] = {
    (ps, deepseek): _attention_schema(ps, deepseek)
    for ps in (1, 64, None)
    for deepseek in (True, False)
}


def attention_key(page_size: int, num_heads: int) -> tuple[int | None, bool]:
    """The key of a sparse attention call's wording in ATTENTION_SCHEMAS."""
    return (page_size if page_size in _PAGE_SIZE_TEXT else None, num_heads == 16)


# The op's schema: the general words, each Definition in its constants' (describe).
ATTENTION_SCHEMA = dataclasses.replace(
    ATTENTION_SCHEMAS[(None, False)],
    describe=lambda axes: ATTENTION_SCHEMAS[attention_key(axes["page_size"], axes["num_qo_heads"])],
)


# --------------------------------------------------------------------------- indexer

_CACHE_LAYOUT = (
    "FP8 quantized key index cache with embedded scale factors (deep_gemm format). Memory "
    "layout: all FP8 values first (page_size * 128 bytes), then all scale factors (page_size "
    "* 4 bytes). Reshaped to [num_pages, page_size, 1, 132]. Uses int8 dtype but should be "
    "interpreted as uint8."
)
_WEIGHTS = (
    "Learned weights for combining heads. In SGLang: weights = weights_proj(x) * "
    "n_heads^-0.5 * q_scale * softmax_scale."
)


def _indexer_schema(deep_gemm: bool) -> DSASchema:
    """deep_gemm: the corpus's shapes (64 heads of 128, pages of 64) and its wording of them;
    else the same contract in general words."""
    if deep_gemm:
        heads = "Number of indexer heads (64 required by deep_gemm)."
        dim = "Indexer head dimension (matches deep_gemm requirement)."
        page = "Page size for KV cache (64 tokens per page, required by deep_gemm)."
        width = "Head dimension (128) + scale bytes (4) = 132 for deep_gemm FP8 format."
        layout = _CACHE_LAYOUT
        variant = " Page size 64 variant."
    else:
        heads = "Number of indexer heads."
        dim = "Indexer head dimension."
        page = "Page size for KV cache."
        width = "Head dimension + scale bytes (4), deep_gemm's FP8 format."
        layout = (
            "FP8 quantized key index cache with embedded scale factors (deep_gemm format). "
            "Memory layout per page: all FP8 values first (page_size * index_head_dim bytes), "
            "then all float32 scale factors (page_size * 4 bytes). Uses int8 dtype but should "
            "be interpreted as uint8."
        )
        variant = ""
    return DSASchema(
        op_type=OP_TYPE,
        name_prefix=INDEXER_PREFIX,
        axes={
            "batch_size": Var(),
            "num_index_heads": Const(heads, abbrev="h"),
            "index_head_dim": Const(dim, abbrev="d"),
            "page_size": Const(page, abbrev="ps"),
            "topk": Const("Number of top-K indices to select.", abbrev="topk", param="topk"),
            "max_num_pages": Var("Maximum number of pages per sequence."),
            "num_pages": Var("Total number of allocated pages in the KV cache."),
            "kv_cache_num_heads": Const(
                "Number of heads in KV cache (always 1 for deep_gemm MQA format)."
            ),
            "head_dim_with_scale": Const(width),
        },
        inputs={
            "q_index_fp8": Tensor(
                ["batch_size", "num_index_heads", "index_head_dim"],
                dtype="float8_e4m3fn",
                description="FP8 quantized query tensor for indexing.",
            ),
            "k_index_cache_fp8": Tensor(
                ["num_pages", "page_size", "kv_cache_num_heads", "head_dim_with_scale"],
                dtype="int8",
                description=layout,
            ),
            "weights": Tensor(
                ["batch_size", "num_index_heads"], dtype="float32", description=_WEIGHTS
            ),
            "seq_lens": Tensor(
                ["batch_size"],
                dtype="int32",
                description="Sequence lengths for each batch element.",
            ),
            "block_table": Tensor(
                ["batch_size", "max_num_pages"],
                dtype="int32",
                description="Page-level block table mapping batch to page indices.",
            ),
        },
        outputs={
            "topk_indices": Tensor(
                ["batch_size", "topk"],
                dtype="int32",
                description="Top-K token indices for each batch element. Values of -1 indicate "
                "padding.",
            )
        },
        reference=dsa_topk_indexer_ref,
        constraints=["topk <= max_num_pages * page_size"],
        tags=["stage:indexer", "sparse:topk", "quant:fp8"],
        description="Native Sparse Attention (DSA) TopK indexer with FP8 quantization for "
        "DeepSeek-V3.2. Computes sparse attention scores using ReLU activation and learned "
        "weights, then selects top-K KV cache indices. Formula: sum(relu(q @ K.T) * weights). "
        f"Matches SGLang/deep_gemm implementation.{variant}",
        bound=("topk",),
        name_order=("num_index_heads", "index_head_dim", "topk", "page_size"),
    )


INDEXER_SCHEMAS: dict[bool, DSASchema] = {dg: _indexer_schema(dg) for dg in (True, False)}


def indexer_key(axes: Mapping[str, int]) -> bool:
    """The key of an indexer call's wording in INDEXER_SCHEMAS: deep_gemm's shapes or not."""
    shape = (axes["num_index_heads"], axes["index_head_dim"], axes["page_size"])
    return shape == (64, 128, 64)


INDEXER_SCHEMA = dataclasses.replace(
    INDEXER_SCHEMAS[False], describe=lambda axes: INDEXER_SCHEMAS[indexer_key(axes)]
)

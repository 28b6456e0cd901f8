"""Schemas of paged MLA attention: the Definitions of the FlashInfer-Trace mla_paged ops
(`mla_paged_decode_h16_ckv512_kpe64_ps1`, `mla_paged_prefill_causal_h16_ckv512_kpe64_ps64`,
...), field for field, with `reference.mla_paged_ref` emitted as their reference.

The corpus spells its contracts per variant, so the schemas are made per variant:
- stage: decode (one query per request: no qo_indptr), causal prefill (qo_indptr; the
  queries are the last qo_len tokens of their request), non-causal prefill (flashtune's own,
  named as the GQA prefill's noncausal Definitions are);
- page size 1 (no kv_last_page_len input: every page is one token) or larger (with
  kv_last_page_len, and descriptions on more axes, as the corpus's ps64 files have);
- the head count's description, which names the model split the corpus captured (DeepSeek
  V3/R1's 128 heads at TP 8: 16; Kimi K2's 64 at TP 8: 8; generic otherwise).
Each schema exists twice: with its index inputs read from the call's arguments (the
plan-free calls) and from a planned wrapper's `definition_inputs` (its run method).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from flashtune.ops.mla.plan import MLATables
from flashtune.ops.mla.reference import mla_paged_ref, mla_ragged_prefill_ref
from flashtune.schema import Const, OpSchema, Scalar, Tensor, Var

__all__ = [
    "STAGES",
    "MLA_SCHEMAS",
    "WRAPPER_SCHEMAS",
    "DefinitionInputs",
    "definition_inputs",
    "schema_key",
    "FI_API",
    "RAGGED_FI_API",
    "RAGGED_SCHEMAS",
    "ragged_schema_key",
]

FI_API = "fi_api:flashinfer.mla.BatchMLAPagedAttentionWrapper"
STAGES = ("decode", "prefill_causal", "prefill_noncausal")
# The head counts the corpus has Definitions for, with the split its descriptions name.
_HEADS_NOTE = {16: " (128/8=16)", 8: " (64/8=8)"}

_SM_SCALE = (
    "Softmax scale. Default is (1/sqrt(128 + 64) = 1/sqrt(192)), based on head dimensions "
    "before matrix absorption."
)


def _described(text: str, on: bool) -> str:
    return text if on else ""


def _schema(stage: str, paged: bool, heads: int | None) -> OpSchema:
    """One variant (see the module docstring); paged: page size > 1."""
    decode = stage == "decode"
    rows = "batch_size" if decode else "total_q"
    batch = Var(_described("Number of sequences in the batch.", paged))
    axes: dict[str, Var | Const] = {"batch_size": batch} if decode else {}
    axes.update(
        num_qo_heads=Const(
            f"Number of query heads after tensor parallel split{_HEADS_NOTE.get(heads or 0, '')}.",
            abbrev="h",
        ),
        head_dim_ckv=Const(
            _described("Dimension of compressed key-value representation.", paged), abbrev="ckv"
        ),
        head_dim_kpe=Const(
            _described("Dimension of key positional encoding.", paged), abbrev="kpe"
        ),
        page_size=Const(_described("Number of tokens stored per page.", paged), abbrev="ps"),
    )
    if decode:
        axes.update(
            num_pages=Var("Total number of allocated pages in the KV cache."),
            len_indptr=Var("Length of kv_indptr array."),
            num_kv_indices=Var("Total number of KV page indices."),
        )
    else:
        axes.update(
            total_q=Var("Total number of query tokens."),
            num_pages=Var("Total allocated pages in KV cache."),
            len_indptr=Var("Length of indptr arrays (batch_size + 1)."),
            num_kv_indices=Var("Total number of KV indices."),
        )
        if paged:
            axes["batch_size"] = batch
    q_dims = [rows, "num_qo_heads"]
    inputs: dict[str, Tensor | Scalar] = {
        "q_nope": Tensor(
            [*q_dims, "head_dim_ckv"],
            dtype_from="q_nope",
            description="Query tensor without positional encoding component.",
        ),
        "q_pe": Tensor(
            [*q_dims, "head_dim_kpe"],
            dtype_from="q_pe",
            description="Query positional encoding component.",
        ),
        "ckv_cache": Tensor(
            ["num_pages", "page_size", "head_dim_ckv"],
            dtype_from="ckv_cache",
            description="Compressed key-value cache.",
        ),
        "kpe_cache": Tensor(
            ["num_pages", "page_size", "head_dim_kpe"],
            dtype_from="kpe_cache",
            description="Key positional encoding cache.",
        ),
    }
    if not decode:
        inputs["qo_indptr"] = Tensor(
            ["len_indptr"], dtype="int32", description="Query offsets for each sequence."
        )
    inputs["kv_indptr"] = Tensor(
        ["len_indptr"],
        dtype="int32",
        description="KV page offsets for each sequence."
        + (" For decode (single-query), we don't need qo_indptr." if decode else ""),
    )
    inputs["kv_indices"] = Tensor(
        ["num_kv_indices"], dtype="int32", description="Page indices for KV cache lookups."
    )
    if paged:
        inputs["kv_last_page_len"] = Tensor(
            ["batch_size"],
            dtype="int32",
            description="Number of valid tokens in the last page for each sequence.",
        )
    inputs["sm_scale"] = Scalar("float32", description=_SM_SCALE)
    outputs = {
        "output": Tensor(
            [*q_dims, "head_dim_ckv"],
            dtype_from="q_nope",
            description=_described("Attention output tensor.", paged),
        ),
        "lse": Tensor(
            q_dims, dtype="float32", description="The 2-based log-sum-exp of attention logits."
        ),
    }
    if decode:
        constraints = ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"]
        what = "decode with a paged KV cache."
    else:
        constraints = ["total_q == qo_indptr[-1].item()", "num_kv_indices == kv_indptr[-1].item()"]
        mask = "Causal mask is applied." if stage == "prefill_causal" else "No causal mask."
        what = f"prefill with a paged KV cache. {mask}"
    return OpSchema(
        op_type="mla_paged",
        name_prefix=f"mla_paged_{stage}",
        axes=axes,
        inputs=inputs,
        outputs=outputs,
        reference=mla_paged_ref,
        bound=() if decode else ("causal",),
        constraints=constraints,
        tags=["stage:decode" if decode else "stage:prefill", FI_API],
        description=f"Batched Multi-head Latent Attention {what}",
    )


_KEYS = [(s, paged, h) for s in STAGES for paged in (False, True) for h in (16, 8, None)]

# Index inputs read from the call's arguments (the plan-free calls).
MLA_SCHEMAS: dict[tuple[str, bool, int | None], OpSchema] = {key: _schema(*key) for key in _KEYS}

# The page table and scale a planned wrapper holds (`definition_inputs`), read from `self`.
_PLANNED = ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "sm_scale")
WRAPPER_SCHEMAS: dict[tuple[str, bool, int | None], OpSchema] = {
    key: dataclasses.replace(
        schema,
        inputs={
            name: dataclasses.replace(spec, param=f"self.definition_inputs.{name}")
            if name in _PLANNED
            else spec
            for name, spec in schema.inputs.items()
        },
    )
    for key, schema in MLA_SCHEMAS.items()
}


def schema_key(decode: bool, causal: bool, page_size: int, num_heads: int) -> tuple:
    """The key of a call's schema in MLA_SCHEMAS / WRAPPER_SCHEMAS."""
    stage = "decode" if decode else "prefill_causal" if causal else "prefill_noncausal"
    return (stage, page_size > 1, num_heads if num_heads in _HEADS_NOTE else None)


@dataclass(frozen=True)
class DefinitionInputs:
    """A plan as the Definitions see it: each request's pages trimmed to the ones its
    kv_len uses (FlashInfer's plan takes kv_len_arr and may be given more pages), the last
    page's token count instead of kv_len, int32 tensors."""

    qo_indptr: torch.Tensor  # [B + 1]
    kv_indptr: torch.Tensor  # [B + 1]
    kv_indices: torch.Tensor  # [kv_indptr[-1]]
    kv_last_page_len: torch.Tensor  # [B]: 1..page_size, 0 for a request without KV
    sm_scale: float


def definition_inputs(
    tables: MLATables, kv_indices: torch.Tensor, page_size: int, sm_scale: float
) -> DefinitionInputs:
    """The Definition's view of a plan's page table (see DefinitionInputs)."""
    lens = tables.kv_len
    used = -(-lens // page_size)
    indptr = np.zeros(lens.size + 1, dtype=np.int64)
    np.cumsum(used, out=indptr[1:])
    gather = np.repeat(tables.kv_indptr[:-1] - indptr[:-1], used) + np.arange(int(indptr[-1]))
    last = np.where(lens > 0, (lens - 1) % page_size + 1, 0)
    as_int = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
    index = torch.from_numpy(gather).to(kv_indices.device)
    return DefinitionInputs(
        qo_indptr=as_int(tables.qo_indptr),
        kv_indptr=as_int(indptr),
        kv_indices=kv_indices[index].to(torch.int32),
        kv_last_page_len=as_int(last),
        sm_scale=float(sm_scale),
    )


# --------------------------------------------------------------------------- ragged prefill
# The FlashInfer-Trace mla_ragged Definitions (`mla_ragged_prefill_causal_h16_qk192_vo128`,
# `..._h8_...`: DeepSeek-V3/R1 and Kimi K2 at TP 8), field for field, with
# `reference.mla_ragged_prefill_ref` emitted as their reference; non-causal is flashtune's
# own (named as the GQA prefill's noncausal Definitions are).

RAGGED_FI_API = "fi_api:flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper"
# Where the corpus captured each head count.
_RAGGED_CAPTURE = {
    16: " Captured from DeepSeek-V3 during total prefill (no prefix cache) with tensor "
    "parallel size 8.",
    8: " Captured from Kimi K2 during total prefill (no prefix cache) with tensor parallel "
    "size 8 (64/8=8 query heads).",
}


def _ragged_schema(causal: bool, heads: int | None) -> OpSchema:
    mask = "causal" if causal else "noncausal"
    return OpSchema(
        op_type="mla_ragged",
        name_prefix=f"mla_ragged_prefill_{mask}",
        axes={
            "num_qo_heads": Const(
                "Number of query/output heads after tensor parallel split"
                f"{_HEADS_NOTE.get(heads or 0, '')}.",
                abbrev="h",
            ),
            "num_kv_heads": Const(
                "Number of key/value heads. Equal to num_qo_heads in the absorbed MLA formulation."
            ),
            "qk_dim": Const(
                "Combined QK head dimension: qk_nope_head_dim (128) + qk_rope_head_dim (64) = 192.",
                abbrev="qk",
            ),
            "vo_dim": Const("Value/output head dimension (v_head_dim = 128).", abbrev="vo"),
            "total_q": Var("Total number of query tokens across all sequences."),
            "total_kv": Var("Total number of key-value tokens across all sequences."),
            "len_indptr": Var("Length of indptr arrays (batch_size + 1)."),
        },
        inputs={
            "q": Tensor(
                ["total_q", "num_qo_heads", "qk_dim"],
                dtype_from="q",
                description="Query tensor in absorbed MLA form, combining nope and rope "
                "components.",
            ),
            "k": Tensor(
                ["total_kv", "num_kv_heads", "qk_dim"],
                dtype_from="k",
                description="Key tensor in absorbed MLA form, combining nope and rope components.",
            ),
            "v": Tensor(
                ["total_kv", "num_kv_heads", "vo_dim"], dtype_from="v", description="Value tensor."
            ),
            "qo_indptr": Tensor(
                ["len_indptr"], dtype="int32", description="Query offsets for each sequence."
            ),
            "kv_indptr": Tensor(
                ["len_indptr"], dtype="int32", description="Key-value offsets for each sequence."
            ),
            "sm_scale": Scalar(
                "float32", description="Softmax scale. Default is 1/sqrt(qk_dim) = 1/sqrt(192)."
            ),
        },
        outputs={
            "output": Tensor(
                ["total_q", "num_qo_heads", "vo_dim"],
                dtype_from="q",
                description="Attention output tensor.",
            ),
            "lse": Tensor(
                ["total_q", "num_qo_heads"],
                dtype="float32",
                description="The 2-based log-sum-exp of attention logits.",
            ),
        },
        reference=mla_ragged_prefill_ref,
        bound=("causal",),
        constraints=["total_q == qo_indptr[-1].item()", "total_kv == kv_indptr[-1].item()"],
        tags=["stage:prefill", RAGGED_FI_API],
        description="Batched Multi-head Latent Attention prefill with ragged (variable-length) "
        "inputs. Uses the absorbed MLA formulation with combined QK dimension (qk_nope=128 + "
        "qk_rope=64 = 192) and value output dimension 128. "
        + ("Causal mask is applied." if causal else "No causal mask.")
        + (_RAGGED_CAPTURE.get(heads or 0, "") if causal else ""),
    )


RAGGED_SCHEMAS: dict[tuple[bool, int | None], OpSchema] = {
    (causal, h): _ragged_schema(causal, h) for causal in (True, False) for h in (16, 8, None)
}


def ragged_schema_key(causal: bool, num_heads: int) -> tuple[bool, int | None]:
    """The key of a ragged prefill call's schema in RAGGED_SCHEMAS."""
    return (bool(causal), num_heads if num_heads in _HEADS_NOTE else None)

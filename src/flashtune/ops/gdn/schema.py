"""GDN's contracts: FlashInfer-Trace's gdn_prefill_*, gdn_decode_* and gdn_mtp_* Definitions
(`gdn_<stage>_qk<num_q_heads>_v<num_v_heads>_d<head_size>_k_last`), emitted from the
definition-shaped ops (gdn_prefill, gdn_decode, gdn_mtp) with reference.py's functions as
their references. The names end in the state layout (`k_last`: [.., V, K]), which no axis
says, so the schemas append it (`GDNSchema.suffix`).

The corpus files' descriptions differ from file to file (tensor parallel degrees in the
axes' words, some axes described and others not); the contract is the same, and these
schemas describe it once (`flashtune solutions coverage` matches by names, shapes, dtypes).

No `fi_api:` tag (the corpus's name `flashinfer.gdn.chunk_gated_delta_rule` and
`.gated_delta_rule_decode`): apply's mirror routes a FlashInfer function named by a schema's
tag through the schema's op, and these ops are not FlashInfer's calls (raw gate inputs, no
q/k normalization, a new state returned, not updated in place); the tag's module path would
also name FlashInfer's modules flashinfer.gdn_prefill / gdn_decode. The tags stay within the
corpus's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flashtune.ops.gdn.reference import gdn_decode_ref, gdn_mtp_ref, gdn_prefill_ref
from flashtune.schema import Const, OpSchema, Scalar, Tensor, Var

__all__ = ["GDNSchema", "GDN_PREFILL", "GDN_DECODE", "GDN_MTP", "GDN_SCHEMAS"]


@dataclass(frozen=True)
class GDNSchema(OpSchema):
    """An OpSchema whose Definition names end in `_<suffix>` (the state layout)."""

    suffix: str = "k_last"

    def name_for(self, axes: Mapping[str, int]) -> str:
        return f"{super().name_for(axes)}_{self.suffix}"


def _heads() -> dict[str, Var | Const]:
    return {
        "num_q_heads": Const("Number of query heads (same as key heads in GVA mode).", "qk"),
        "num_k_heads": Const("Number of key heads."),
        "num_v_heads": Const(
            "Number of value heads (GVA: a multiple of the query heads; the state's heads).",
            "v",
        ),
        "head_size": Const("Head dimension (K of queries and keys, V of values).", "d"),
    }


_GVA = (
    "num_v_heads >= num_q_heads",
    "num_v_heads % num_q_heads == 0",
    "num_k_heads == num_q_heads",
)
_GATES = {
    "A_log": Tensor(
        ["num_v_heads"],
        dtype="float32",
        description="Log decay parameter: g = exp(-exp(A_log) * softplus(a + dt_bias)).",
    ),
    "a": None,
    "dt_bias": Tensor(
        ["num_v_heads"], dtype="float32", description="Decay bias, added to a before softplus."
    ),
    "b": None,
}
_SCALE = Scalar("float32", description="Scale of the output; 0 means 1/sqrt(head_size).")
_STATE = "Recurrent state, k-last layout [.., num_v_heads, V, K], float32."


def _gates(*dims: str) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for name, spec in _GATES.items():
        if spec is None:
            what = (
                "Input-dependent decay (projection)."
                if name == "a"
                else "Update gate input: beta = sigmoid(b)."
            )
            spec = Tensor([*dims, "num_v_heads"], dtype_from="q", description=what)
        out[name] = spec
    return out


GDN_PREFILL = GDNSchema(
    op_type="gdn",
    name_prefix="gdn_prefill",
    description="Gated Delta Net prefill (chunked), GVA, k-last state [N, H, V, K].",
    axes={
        "total_seq_len": Var("Total tokens of all sequences."),
        "num_seqs": Var("Number of sequences."),
        **_heads(),
        "len_cu_seqlens": Var("Length of cu_seqlens (num_seqs + 1)."),
    },
    inputs={
        "q": Tensor(
            ["total_seq_len", "num_q_heads", "head_size"], dtype_from="q", description="Queries."
        ),
        "k": Tensor(
            ["total_seq_len", "num_k_heads", "head_size"], dtype_from="q", description="Keys."
        ),
        "v": Tensor(
            ["total_seq_len", "num_v_heads", "head_size"], dtype_from="q", description="Values."
        ),
        "state": Tensor(
            ["num_seqs", "num_v_heads", "head_size", "head_size"],
            dtype="float32",
            optional=True,
            description=f"Initial {_STATE} Zeros when absent.",
        ),
        **{n: s for n, s in _gates("total_seq_len").items() if n in ("A_log", "a")},
        **{n: s for n, s in _gates("total_seq_len").items() if n in ("dt_bias", "b")},
        "cu_seqlens": Tensor(
            ["len_cu_seqlens"], dtype="int64", description="Cumulative sequence lengths."
        ),
        "scale": _SCALE,
    },
    outputs={
        "output": Tensor(
            ["total_seq_len", "num_v_heads", "head_size"],
            dtype_from="q",
            description="Output, per value head.",
        ),
        "new_state": Tensor(
            ["num_seqs", "num_v_heads", "head_size", "head_size"],
            dtype="float32",
            description=f"Final {_STATE}",
        ),
    },
    constraints=("len_cu_seqlens == num_seqs + 1", "total_seq_len == cu_seqlens[-1].item()"),
    tags=("stage:prefill", "layout:k-last"),
    reference=gdn_prefill_ref,
)

GDN_DECODE = GDNSchema(
    op_type="gdn",
    name_prefix="gdn_decode",
    description="Gated Delta Net decode (one token per request), GVA, k-last state [B, H, V, K].",
    axes={
        "batch_size": Var("Requests decoded together."),
        "seq_len": Const("Tokens per request (1 at decode)."),
        **_heads(),
    },
    inputs={
        "q": Tensor(
            ["batch_size", "seq_len", "num_q_heads", "head_size"],
            dtype_from="q",
            description="Queries.",
        ),
        "k": Tensor(
            ["batch_size", "seq_len", "num_k_heads", "head_size"],
            dtype_from="q",
            description="Keys.",
        ),
        "v": Tensor(
            ["batch_size", "seq_len", "num_v_heads", "head_size"],
            dtype_from="q",
            description="Values.",
        ),
        "state": Tensor(
            ["batch_size", "num_v_heads", "head_size", "head_size"],
            dtype="float32",
            optional=True,
            description=f"{_STATE} Zeros when absent.",
        ),
        **_gates("batch_size", "seq_len"),
        "scale": _SCALE,
    },
    outputs={
        "output": Tensor(
            ["batch_size", "seq_len", "num_v_heads", "head_size"],
            dtype_from="q",
            description="Output, per value head.",
        ),
        "new_state": Tensor(
            ["batch_size", "num_v_heads", "head_size", "head_size"],
            dtype="float32",
            description=f"Updated {_STATE}",
        ),
    },
    constraints=_GVA,
    tags=("stage:decode", "layout:k-last"),
    reference=gdn_decode_ref,
)

GDN_MTP = GDNSchema(
    op_type="gdn",
    name_prefix="gdn_mtp",
    description="Gated Delta Net multi-token (speculative verification) over a state pool, GVA, k-last state [pool_size, H, V, K]; the pool is not updated.",
    axes={
        "batch_size": Var("Requests verified together."),
        "seq_len": Var("Tokens per request (> 1)."),
        **_heads(),
        "pool_size": Var("Slots of the state pool."),
    },
    inputs={
        "q": Tensor(
            ["batch_size", "seq_len", "num_q_heads", "head_size"],
            dtype_from="q",
            description="Queries.",
        ),
        "k": Tensor(
            ["batch_size", "seq_len", "num_k_heads", "head_size"],
            dtype_from="q",
            description="Keys.",
        ),
        "v": Tensor(
            ["batch_size", "seq_len", "num_v_heads", "head_size"],
            dtype_from="q",
            description="Values.",
        ),
        "initial_state": Tensor(
            ["pool_size", "num_v_heads", "head_size", "head_size"],
            dtype="float32",
            description=f"The pool: {_STATE}",
        ),
        "initial_state_indices": Tensor(
            ["batch_size"], dtype="int32", description="The pool slot each request reads."
        ),
        **_gates("batch_size", "seq_len"),
        "scale": _SCALE,
        "intermediate_states_buffer": Tensor(
            ["pool_size", "seq_len", "num_v_heads", "head_size", "head_size"],
            dtype="float32",
            optional=True,
            description="Receives the state after each token, at [slot, t].",
        ),
    },
    outputs={
        "output": Tensor(
            ["batch_size", "seq_len", "num_v_heads", "head_size"],
            dtype_from="q",
            description="Output of every token, per value head.",
        ),
        "final_state": Tensor(
            ["pool_size", "num_v_heads", "head_size", "head_size"],
            dtype="float32",
            description="The pool, unchanged (state updates disabled).",
        ),
    },
    constraints=(*_GVA, "seq_len > 1"),
    tags=("stage:mtp", "layout:k-last"),
    reference=gdn_mtp_ref,
)

GDN_SCHEMAS = (GDN_PREFILL, GDN_DECODE, GDN_MTP)

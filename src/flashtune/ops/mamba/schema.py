"""Schemas of the selective state update: the FlashInfer-Trace `mamba_ssu_decode_*`
Definitions, field for field (`mamba_ssu_decode_h128_d64_s128_ng8`,
`mamba_ssu_decode_h64_d64_s128_ng4`: NemotronH-8B at TP 1 and 2), with `reference.py`'s
`mamba_ssu_ref` (and the general reference it calls) emitted as their reference.

The corpus spells its descriptions per shape (the TP split, the heads per group), so a call's
schema is made for its key (nheads, head_dim, dstate, ngroups; `schema_of`): the corpus's
words verbatim for its two shapes, neutral ones in its style otherwise. `TEMPLATE` is the
one registered schema under the prefix (what apply's prefix match and supply's listing read).

The Definitions describe one form of the call: dt_softplus=True, dt_bias and D given, no z,
slots from state_batch_indices with pad slot -1, the state updated (`definition_call`
refuses the others: ValueError, so capture, apply and the dump leave them to the op).
The Definition's outputs are (output, new_state): a value-returning solution returns the
whole state cache with the batch's slots updated.
"""

from __future__ import annotations

import functools
import inspect
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from flashtune.data.models import Definition
from flashtune.ops.mamba.reference import mamba_ssu_ref, selective_state_update_ref
from flashtune.schema import Const, OpSchema, Tensor, Var
from flashtune.schema.core import BoundCall

__all__ = [
    "FI_API",
    "PREFIX",
    "SSUKey",
    "SSUSchema",
    "TEMPLATE",
    "definition_call",
    "definition_key",
    "schema_for_call",
    "schema_for_definition",
    "schema_of",
]

PREFIX = "mamba_ssu_decode"
FI_API = "fi_api:flashinfer.mamba.selective_state_update"


class SSUKey(NamedTuple):
    """What fixes a call's schema: its const axes."""

    nheads: int
    head_dim: int
    dstate: int
    ngroups: int


@functools.cache
def _source_of(fn: Callable[..., Any]) -> str:
    return textwrap.dedent(inspect.getsource(fn)).rstrip()


@dataclass(frozen=True)
class SSUSchema(OpSchema):
    """An OpSchema whose emitted reference also defines the general reference its reference
    calls (and imports torch.nn.functional, which that one uses)."""

    helpers: tuple[Callable[..., Any], ...] = (selective_state_update_ref,)
    key: SSUKey | None = field(default=None, compare=False)  # None: the template

    def reference_source(self, call: BoundCall | None = None) -> str:
        source = super().reference_source(call)
        head = "import math\n\nimport torch\n\n\n"
        assert source.startswith(head)
        helpers = "".join(_source_of(fn) + "\n\n\n" for fn in self.helpers)
        imports = "import math\n\nimport torch\nimport torch.nn.functional as F\n\n\n"
        return imports + helpers + source[len(head) :]


# --------------------------------------------------------------------------- descriptions

# The corpus's words for its two shapes, verbatim (flashinfer-ai/flashinfer-bench at ecafa9c,
# Apache-2.0), by key: the Definition's description, then each axis's, input's and output's.
_CORPUS_TEXTS = {
    (64, 64, 128, 4): {
        "A": "Decay matrix (TP-sharded, nheads=64 per rank). TIE_HDIM=True: one scalar per head.",
        "B": "B gate (TP-sharded, ngroups=4 per rank).",
        "C": "C gate (TP-sharded, ngroups=4 per rank).",
        "D": "Skip connection weight (TP-sharded, nheads=64 per rank).",
        "batch_size": "Number of sequences being decoded concurrently.",
        "description": "Mamba2 Selective State Update (SSU) decode with 64 heads, "
        "head_dim=64, dstate=128, 4 groups. Single-token generation "
        "via recurrent SSM state update. Captured from NVIDIA "
        "NemotronH-8B Mamba layers (TP=2, heads split by TP: "
        "128/2=64, groups split by TP: 8/2=4). nheads/ngroups=16 is "
        "supported by FlashInfer.",
        "dstate": "SSM state dimension (ssm_state_size, not split by TP).",
        "dt": "Time step (delta) before softplus.",
        "dt_bias": "Dt bias (TP-sharded, nheads=64 per rank).",
        "head_dim": "Head dimension (mamba_head_dim = 64, not split by TP).",
        "new_state": "Updated SSM state cache (same tensor as input state, modified in-place).",
        "ngroups": "Number of SSM groups per TP rank (8/TP=8/2=4). "
        "nheads/ngroups=16 is supported by FlashInfer.",
        "nheads": "Number of SSM heads per TP rank (128/TP=128/2=64).",
        "output": "SSM output (TP-sharded, requires all-reduce after out_proj).",
        "state": "Paged SSM state cache (per-TP-rank shard). Updated in-place.",
        "state_batch_indices": "Slot index into state cache for each batch "
        "element. -1 (PAD_SLOT_ID) skips update.",
        "state_cache_size": "Total number of slots in the paged SSM state cache. "
        "Must be >= batch_size.",
        "x": "Input features (TP-sharded, nheads=64 heads per rank).",
    },
    (128, 64, 128, 8): {
        "A": "Decay matrix (negative values). With TIE_HDIM=True (NemotronH), has "
        "strides (1,0,0): one scalar per head. In non-TIE_HDIM mode, each "
        "element is independent.",
        "B": "B gate (input-dependent). Shared across nheads/ngroups=16 heads per group.",
        "C": "C gate (input-dependent). Shared across nheads/ngroups=16 heads per group.",
        "D": "Skip connection weight. With TIE_HDIM=True, has strides (1,0): one scalar per head.",
        "batch_size": "Number of sequences being decoded concurrently.",
        "description": "Mamba2 Selective State Update (SSU) decode with 128 "
        "heads, head_dim=64, dstate=128, 8 groups. Single-token "
        "generation via recurrent SSM state update. Captured from "
        "NVIDIA NemotronH-8B Mamba layers (TP=1). FlashInfer "
        "kernel: flashinfer.mamba.selective_state_update.",
        "dstate": "SSM state dimension (ssm_state_size).",
        "dt": "Time step (delta) before softplus. Applied as softplus(dt + dt_bias).",
        "dt_bias": "Dt bias added before softplus. With TIE_HDIM=True, has "
        "strides (1,0): one scalar per head.",
        "head_dim": "Head dimension (mamba_head_dim = d_ssm / nheads = 8192/128 = 64).",
        "new_state": "Updated SSM state cache (same tensor as input state, "
        "modified in-place for non-PAD slots).",
        "ngroups": "Number of SSM groups (mamba_n_groups). B and C are shared "
        "across nheads/ngroups heads. nheads/ngroups=16 is supported "
        "by FlashInfer.",
        "nheads": "Number of SSM heads (mamba_num_heads).",
        "output": "SSM output. y[b,h,d] = sum_s(state[slot,h,d,s] * C[b,g,s]) + x[b,h,d] * D[h,d].",
        "state": "Paged SSM state cache. Indexed by state_batch_indices. Updated in-place.",
        "state_batch_indices": "Slot index into state cache for each batch "
        "element. -1 (PAD_SLOT_ID) skips update.",
        "state_cache_size": "Total number of slots in the paged SSM state cache. "
        "Must be >= batch_size.",
        "x": "Input features (hidden states after in_proj and split).",
    },
}


def _texts(key: SSUKey) -> dict[str, str]:
    """Every description of the key's Definition: the corpus's, else neutral ones."""
    if key in _CORPUS_TEXTS:
        return _CORPUS_TEXTS[key]
    h, d, s, g = key
    per = h // g if g else 0
    return {
        "description": f"Mamba2 Selective State Update (SSU) decode with {h} heads, "
        f"head_dim={d}, dstate={s}, {g} groups. Single-token generation via recurrent SSM "
        "state update.",
        "batch_size": "Number of sequences being decoded concurrently.",
        "state_cache_size": "Total number of slots in the paged SSM state cache. Must be >= "
        "batch_size.",
        "nheads": "Number of SSM heads.",
        "head_dim": "Head dimension.",
        "dstate": "SSM state dimension.",
        "ngroups": f"Number of SSM groups. B and C are shared across nheads/ngroups={per} "
        "heads per group.",
        "state": "Paged SSM state cache. Indexed by state_batch_indices. Updated in-place.",
        "x": "Input features.",
        "dt": "Time step (delta) before softplus. Applied as softplus(dt + dt_bias).",
        "A": "Decay matrix (negative values).",
        "B": f"B gate (input-dependent). Shared across nheads/ngroups={per} heads per group.",
        "C": f"C gate (input-dependent). Shared across nheads/ngroups={per} heads per group.",
        "D": "Skip connection weight.",
        "dt_bias": "Dt bias added before softplus.",
        "state_batch_indices": "Slot index into state cache for each batch element. -1 "
        "(PAD_SLOT_ID) skips update.",
        "output": "SSM output.",
        "new_state": "Updated SSM state cache (same tensor as input state, modified in-place "
        "for non-PAD slots).",
    }


# --------------------------------------------------------------------------- the schemas

_ROW = ["batch_size", "nheads", "head_dim"]
_CACHE = ["state_cache_size", "nheads", "head_dim", "dstate"]
_GROUPS = ["batch_size", "ngroups", "dstate"]


@functools.lru_cache(maxsize=64)
def schema_of(key: SSUKey) -> SSUSchema:
    """The schema of calls with this key (made once per key)."""
    t = _texts(key)
    return SSUSchema(
        op_type="mamba_ssu",
        name_prefix=PREFIX,
        axes={
            "batch_size": Var(t["batch_size"]),
            "state_cache_size": Var(t["state_cache_size"]),
            "nheads": Const(t["nheads"], abbrev="h"),
            "head_dim": Const(t["head_dim"], abbrev="d"),
            "dstate": Const(t["dstate"], abbrev="s"),
            "ngroups": Const(t["ngroups"], abbrev="ng"),
        },
        inputs={
            "state": Tensor(_CACHE, dtype_from="state", description=t["state"]),
            "x": Tensor(_ROW, dtype_from="x", description=t["x"]),
            "dt": Tensor(_ROW, dtype_from="dt", description=t["dt"]),
            "A": Tensor(["nheads", "head_dim", "dstate"], dtype_from="A", description=t["A"]),
            "B": Tensor(_GROUPS, dtype_from="B", description=t["B"]),
            "C": Tensor(_GROUPS, dtype_from="C", description=t["C"]),
            "D": Tensor(["nheads", "head_dim"], dtype_from="D", description=t["D"]),
            "dt_bias": Tensor(
                ["nheads", "head_dim"], dtype_from="dt_bias", description=t["dt_bias"]
            ),
            "state_batch_indices": Tensor(
                ["batch_size"],
                dtype_from="state_batch_indices",
                description=t["state_batch_indices"],
            ),
        },
        outputs={
            "output": Tensor(_ROW, dtype_from="x", description=t["output"]),
            "new_state": Tensor(_CACHE, dtype_from="state", description=t["new_state"]),
        },
        reference=mamba_ssu_ref,
        constraints=("nheads % ngroups == 0", "state_cache_size >= batch_size"),
        tags=["stage:decode", FI_API],
        description=t["description"],
        key=key,
    )


# The one registered schema (the op's `schemas`): NemotronH-8B's, under the prefix.
TEMPLATE = schema_of(SSUKey(128, 64, 128, 8))


# --------------------------------------------------------------------------- a call's key


def definition_call(arguments: Mapping[str, Any]) -> SSUKey:
    """The key of a selective_state_update call's schema (arguments by parameter name), or
    ValueError where no Definition describes the call (see the module docstring)."""
    refused = {
        "z": arguments.get("z") is not None,
        "dt_softplus=False": not arguments.get("dt_softplus"),
        "no dt_bias": arguments.get("dt_bias") is None,
        "no D": arguments.get("D") is None,
        "no state_batch_indices": arguments.get("state_batch_indices") is None,
        "a pad_slot_id other than -1": arguments.get("pad_slot_id", -1) != -1,
        "disable_state_update": bool(arguments.get("disable_state_update")),
        "dst_state_batch_indices": arguments.get("dst_state_batch_indices") is not None,
    }
    for what, yes in refused.items():
        if yes:
            raise ValueError(f"no mamba_ssu_decode Definition describes a call with {what}")
    state, B = arguments.get("state"), arguments.get("B")
    if not isinstance(state, torch.Tensor) or state.dim() != 4:
        raise ValueError("state must be a [slots, nheads, head_dim, dstate] tensor")
    if not isinstance(B, torch.Tensor) or B.dim() != 3:
        raise ValueError("B must be a [batch, ngroups, dstate] tensor")
    _, h, d, s = (int(n) for n in state.shape)
    return SSUKey(h, d, s, int(B.shape[1]))


def schema_for_call(arguments: Mapping[str, Any]) -> SSUSchema:
    """The schema of a call (see definition_call)."""
    return schema_of(definition_call(arguments))


_NAME = re.compile(rf"^{PREFIX}_h(\d+)_d(\d+)_s(\d+)_ng(\d+)$")


def definition_key(definition: Definition) -> SSUKey | None:
    """The key a dataset's Definition names (its const axes agreeing), or None."""
    match = _NAME.match(definition.name)
    if match is None:
        return None
    key = SSUKey(*(int(v) for v in match.groups()))
    const = definition.const_axes
    if any(const.get(axis) not in (None, value) for axis, value in key._asdict().items()):
        return None
    return key


def schema_for_definition(definition: Definition) -> SSUSchema | None:
    """The schema made for a dataset's `mamba_ssu_decode_*` Definition, or None."""
    key = definition_key(definition)
    return None if key is None else schema_of(key)

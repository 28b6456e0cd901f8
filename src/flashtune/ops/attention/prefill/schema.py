"""Schemas of batch prefill: the Definitions of the FlashInfer-Trace gqa_paged /
gqa_ragged prefill ops, with the self-contained references emitted into them.

Four paged schemas (causal or not; page size 1, which has no kv_last_page_len input, or
larger) and two ragged ones. `paged_schema_for` / `ragged_schema_for` pick one from a call's
arguments for the schema'd ops of prefill/__init__.py.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from flashtune.schema import Const, OpSchema, Scalar, Tensor, Var

__all__ = [
    "GQA_PAGED_PREFILL",
    "GQA_RAGGED_PREFILL",
    "gqa_paged_prefill_ref",
    "gqa_ragged_prefill_ref",
    "paged_schema_for",
    "ragged_schema_for",
]


@torch.no_grad()
def gqa_paged_prefill_ref(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, kv_last_page_len=None,
    causal=True, window_left=None, logits_soft_cap=None,
):  # fmt: skip
    """Self-contained reference of a gqa_paged prefill Definition (emitted into the JSON).
    k_cache/v_cache [num_pages, page_size, Hkv, D]; kv_last_page_len None means full pages."""
    out = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float32, device=q.device)
    group = q.shape[1] // k_cache.shape[2]
    page_size = k_cache.shape[1]
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        if qe == qs or pages.numel() == 0:
            continue
        last = page_size if kv_last_page_len is None else int(kv_last_page_len[b])
        n = (pages.numel() - 1) * page_size + last
        k = k_cache[pages].flatten(0, 1)[:n].float().transpose(0, 1).repeat_interleave(group, 0)
        v = v_cache[pages].flatten(0, 1)[:n].float().transpose(0, 1).repeat_interleave(group, 0)
        logits = torch.matmul(q[qs:qe].float().transpose(0, 1), k.transpose(1, 2)) * sm_scale
        if logits_soft_cap:
            logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
        i = torch.arange(qe - qs, device=q.device)[:, None] + (n - (qe - qs))
        j = torch.arange(n, device=q.device)[None, :]
        keep = (j <= i) if causal else torch.ones_like(j <= i)
        if window_left is not None and window_left >= 0:
            keep = keep & (j >= i - window_left)
        logits = logits.masked_fill(~keep, -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)
        p = torch.exp(logits - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
        out[qs:qe] = torch.matmul(p, v).transpose(0, 1).to(q.dtype)
        lse[qs:qe] = (row_lse / math.log(2.0)).transpose(0, 1)
    return out, lse


@torch.no_grad()
def gqa_ragged_prefill_ref(
    q, k, v, qo_indptr, kv_indptr, sm_scale, causal=True, window_left=None, logits_soft_cap=None
):
    """Self-contained reference of a gqa_ragged prefill Definition (emitted into the JSON)."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float32, device=q.device)
    group = q.shape[1] // k.shape[1]
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        ks, ke = int(kv_indptr[b]), int(kv_indptr[b + 1])
        if qe == qs or ke == ks:
            continue
        kb = k[ks:ke].float().transpose(0, 1).repeat_interleave(group, 0)
        vb = v[ks:ke].float().transpose(0, 1).repeat_interleave(group, 0)
        logits = torch.matmul(q[qs:qe].float().transpose(0, 1), kb.transpose(1, 2)) * sm_scale
        if logits_soft_cap:
            logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
        i = torch.arange(qe - qs, device=q.device)[:, None] + ((ke - ks) - (qe - qs))
        j = torch.arange(ke - ks, device=q.device)[None, :]
        keep = (j <= i) if causal else torch.ones_like(j <= i)
        if window_left is not None and window_left >= 0:
            keep = keep & (j >= i - window_left)
        logits = logits.masked_fill(~keep, -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)
        p = torch.exp(logits - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
        out[qs:qe] = torch.matmul(p, vb).transpose(0, 1).to(q.dtype)
        lse[qs:qe] = (row_lse / math.log(2.0)).transpose(0, 1)
    return out, lse


def _heads_axes() -> dict[str, Var | Const]:
    return {
        "num_qo_heads": Const("Number of query/output attention heads.", abbrev="h"),
        "num_kv_heads": Const("Number of key-value attention heads.", abbrev="kv"),
        "head_dim": Const("Dimension of each attention head.", abbrev="d"),
    }


_LEN_INDPTR = Var(
    "Length of indptr arrays. Should be the same for qo_indptr and kv_indptr (batch_size + 1)."
)
_TOTAL_Q = Var("Total number of query tokens.")
_QO = ["total_q", "num_qo_heads", "head_dim"]
_OUTPUTS = {
    "output": Tensor(_QO, dtype_from="q"),
    "lse": Tensor(
        ["total_q", "num_qo_heads"],
        dtype="float32",
        description="The 2-based log-sum-exp of attention logits.",
    ),
}
_SM_SCALE = Scalar("float32", description="Softmax scale. Default is (1/sqrt(head_dim)).")
_BOUND = ("window_left", "logits_soft_cap")


def _paged_schema(causal: bool, last_page_len: bool) -> OpSchema:
    kv = ["num_pages", "page_size", "num_kv_heads", "head_dim"]
    axes: dict[str, Var | Const] = {
        **_heads_axes(),
        "page_size": Const("Number of tokens stored per page.", abbrev="ps"),
        "len_indptr": _LEN_INDPTR,
        "total_q": _TOTAL_Q,
        "num_kv_indices": Var("Total number of KV page indices."),
        "num_pages": Var("Total number of allocated pages in the KV cache."),
    }
    inputs: dict[str, Tensor | Scalar] = {
        "q": Tensor(_QO, dtype_from="q"),
        "k_cache": Tensor(kv, dtype_from="k_cache"),
        "v_cache": Tensor(kv, dtype_from="k_cache"),
        "qo_indptr": Tensor(
            ["len_indptr"], dtype="int32", description="Query offsets for each sequence."
        ),
        "kv_indptr": Tensor(
            ["len_indptr"], dtype="int32", description="KV page offsets for each sequence."
        ),
        "kv_indices": Tensor(
            ["num_kv_indices"], dtype="int32", description="Page IDs for KV cache lookups."
        ),
    }
    if last_page_len:
        axes["batch_size"] = Var("Number of sequences in the batch.")
        inputs["kv_last_page_len"] = Tensor(
            ["batch_size"], dtype="int32", description="Number of valid tokens in the last page."
        )
    inputs["sm_scale"] = _SM_SCALE
    mask = "causal" if causal else "noncausal"
    return OpSchema(
        op_type="gqa_paged",
        name_prefix=f"gqa_paged_prefill_{mask}",
        axes=axes,
        inputs=inputs,
        outputs=_OUTPUTS,
        reference=gqa_paged_prefill_ref,
        bound=("causal", *_BOUND),
        constraints=[
            "total_q == qo_indptr[-1].item()",
            "num_kv_indices == kv_indptr[-1].item()",
        ],
        tags=["stage:prefill", "fi_api:flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper"],
        description=f"Batched Grouped Query Attention prefill with a paged KV cache ({mask}).",
    )


def _ragged_schema(causal: bool) -> OpSchema:
    kv = ["total_kv", "num_kv_heads", "head_dim"]
    mask = "causal" if causal else "noncausal"
    return OpSchema(
        op_type="gqa_ragged",
        name_prefix=f"gqa_ragged_prefill_{mask}",
        axes={
            **_heads_axes(),
            "len_indptr": _LEN_INDPTR,
            "total_q": _TOTAL_Q,
            "total_kv": Var("Total key-value tokens across all sequences."),
        },
        inputs={
            "q": Tensor(_QO, dtype_from="q"),
            "k": Tensor(kv, dtype_from="k"),
            "v": Tensor(kv, dtype_from="k"),
            "qo_indptr": Tensor(
                ["len_indptr"], dtype="int32", description="Query offsets for each sequence."
            ),
            "kv_indptr": Tensor(
                ["len_indptr"], dtype="int32", description="Key-value offsets for each sequence."
            ),
            "sm_scale": _SM_SCALE,
        },
        outputs=_OUTPUTS,
        reference=gqa_ragged_prefill_ref,
        bound=("causal", *_BOUND),
        constraints=["total_q == qo_indptr[-1].item()", "total_kv == kv_indptr[-1].item()"],
        tags=["stage:prefill", "fi_api:flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper"],
        description=f"Batched Grouped Query Attention prefill with ragged KV ({mask}).",
    )


# Page size 1 has no kv_last_page_len input (every page is full), as in the corpus.
GQA_PAGED_PREFILL = {
    (causal, ps1): _paged_schema(causal, not ps1)
    for causal in (True, False)
    for ps1 in (True, False)
}
GQA_RAGGED_PREFILL = {causal: _ragged_schema(causal) for causal in (True, False)}


def paged_schema_for(
    q,
    k_cache,
    v_cache,
    qo_indptr,
    kv_indptr,
    kv_indices,
    sm_scale,
    kv_last_page_len=None,
    causal=True,
    **_: Any,
) -> OpSchema:
    return GQA_PAGED_PREFILL[(bool(causal), k_cache.shape[1] == 1)]


def ragged_schema_for(*args: Any, causal: bool = True, **_: Any) -> OpSchema:
    return GQA_RAGGED_PREFILL[bool(causal)]


# Page size 16: the common serving default (vLLM, SGLang); 1 as well, as in the corpus.
# Shared by the wrappers' and the plan-free calls' examples (plan_free.py): the same
# Definitions.
EXAMPLE_PAGE_SIZES = (16, 1)
EXAMPLE_KV_LENS = (37, 100, 16)
EXAMPLE_QO_INDPTR = (0, 5, 22, 25)  # queries 5, 17, 3: each no longer than its KV

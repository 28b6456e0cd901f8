"""The bundled dataset's DSA ops at reduced shapes a 2-core CPU runs the references of
(model_shapes' mini-dsa: an indexer of 8 heads of 32 over pages of 16; sparse attention of 4
heads over a 64-wide latent and a 16-wide RoPE key at page sizes 1 and 16), with DeepSeek-
V3.2's topk of 2048; flashtune's solutions and torch's (the ops' references).

The entries take the Definitions' inputs as they are, so FlashInfer-Trace's DeepSeek-V3.2
Definitions (`dsa_topk_indexer_fp8_h64_d128_topk2048_ps64`,
`dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps1` / `_ps64`) get the same entries
(flashtune.ops.bundle.supply): every size comes from the inputs' shapes, and topk (which no
input of the indexer shows) is the entries' default, 2048, as in every DSA Definition.
FlashInfer's sparse MLA (trtllm-gen, SM100; an SM120 kernel) runs on no Hopper GPU and
computes another contract (fp8 caches, its own cache layout): no FlashInfer entry.

Workloads: the indexer's request lengths and block tables are stored (a blob each), shorter
and longer than topk (padding and selection); its fp8 key cache and the attention's slot
rows are drawn by flashtune.data.synth (a packed cache of random keys; rows of valid slots
with -1 padding).
"""

from __future__ import annotations

import math

import torch

from flashtune.data import Definition, Workload
from flashtune.data.models import ScalarInput
from flashtune.ops.bundle import (
    NO_SETUP,
    TORCH_EAGER,
    BundledOp,
    Entry,
    WorkloadContext,
    runs_the_op,
)
from flashtune.ops.bundle import workloads as wl
from flashtune.ops.bundle.planned import on_device_of
from flashtune.ops.bundle.workloads import token_sweep

MODELS = ("mini-dsa",)
TOPK = 2048  # DeepSeek-V3.2's, every DSA Definition's
# The indexer's (batch, nominal request length): decode rows under and over topk.
INDEXER_ROWS = [(1, 300), (1, 2600), (4, 1500), (3, 3000), (2, 6000)]
TOKENS = [1, 3, 8, 16, 33]  # the sparse attention's query tokens (decode, prefill chunks)
SPARE_PAGES = 8
SM_SCALE = 1 / math.sqrt(192)  # DeepSeek's (pre-absorption head dim 128 + 64)


def _indexer_workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
    page_size = definition.const_axes["page_size"]
    topk = definition.const_axes["topk"]
    out = []
    for batch, nominal in INDEXER_ROWS:
        wid = wl.stable_uuid(definition.name, batch, nominal)
        lens = wl.request_lengths(batch, nominal, ctx.generator)
        pages = [-(-n // page_size) for n in lens]
        num_pages = sum(pages) + SPARE_PAGES
        # The constraint topk <= max_num_pages * page_size: a table at least topk wide.
        max_pages = max(max(pages), -(-topk // page_size))
        perm = torch.randperm(num_pages, generator=ctx.generator).to(torch.int32)
        table = torch.zeros(batch, max_pages, dtype=torch.int32)
        start = 0
        for b, n in enumerate(pages):
            table[b, :n] = perm[start : start + n]
            start += n
        tensors = {"seq_lens": torch.tensor(lens, dtype=torch.int32), "block_table": table}
        axes = {"batch_size": batch, "max_num_pages": max_pages, "num_pages": num_pages}
        out.append(Workload(uuid=wid, axes=axes, inputs=wl.blob(ctx, definition, wid, tensors)))
    return out


def _attention_workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
    page_size = definition.const_axes["page_size"]
    num_pages = -(-3000 // page_size)  # a 3000-token cache: more slots than topk
    scale = {"sm_scale": ScalarInput(type="scalar", value=SM_SCALE)}
    return [
        w.model_copy(
            update={"axes": {**w.axes, "num_pages": num_pages}, "inputs": {**w.inputs, **scale}}
        )
        for w in token_sweep(TOKENS)(definition, ctx)
    ]


# --------------------------------------------------------------------------- entries


@runs_the_op
def flashtune_dsa_topk_indexer(
    q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, *, topk=TOPK
):
    from flashtune.ops.dsa import dsa_topk_indexer

    seq_lens, block_table = on_device_of(q_index_fp8, seq_lens, block_table)
    return dsa_topk_indexer(
        q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk=topk
    )


def torch_dsa_topk_indexer(
    q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, *, topk=TOPK
):
    from flashtune.ops.dsa.reference import dsa_topk_indexer_ref

    return dsa_topk_indexer_ref(
        q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk
    )


@runs_the_op
def flashtune_dsa_sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    from flashtune.ops.dsa import dsa_sparse_attention

    (sparse_indices,) = on_device_of(q_nope, sparse_indices)
    return dsa_sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, float(sm_scale))


def torch_dsa_sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    from flashtune.ops.dsa.reference import dsa_sparse_attention_ref

    return dsa_sparse_attention_ref(
        q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, float(sm_scale)
    )


# --------------------------------------------------------------------------- declarations

_FLASHTUNE_INDEXER = (
    "flashtune's DSA indexer through its public API (dsa.dsa_topk_indexer): a Triton kernel "
    "scores every token of each request (fp8 x fp8 MMA, per-token scale, ReLU, head-weighted "
    "sum) into fp32 logits, a multi-program radix select in Triton picks the top-k set "
    "(unordered: the set is the contract) as cache slots. " + NO_SETUP
)
_FLASHTUNE_ATTENTION = (
    "flashtune's DSA sparse attention through its public API (dsa.dsa_sparse_attention): a "
    "Triton kernel gathers each token's selected latent rows and runs an fp32 online softmax, "
    "the slots split over programs and merged where the tokens are few. " + NO_SETUP
)
_TORCH = (
    f"{TORCH_EAGER} The op's reference (ops.dsa.reference): fp32, gathers then matmuls "
    "(the indexer: a loop over requests)."
)

BUNDLED = (
    BundledOp(
        prefix="dsa_topk_indexer_fp8",
        workloads=_indexer_workloads,
        models=MODELS,
        entries=(
            Entry("flashtune", flashtune_dsa_topk_indexer, _FLASHTUNE_INDEXER),
            Entry("torch", torch_dsa_topk_indexer, _TORCH),
        ),
    ),
    BundledOp(
        prefix="dsa_sparse_attention",
        workloads=_attention_workloads,
        models=MODELS,
        entries=(
            Entry("flashtune", flashtune_dsa_sparse_attention, _FLASHTUNE_ATTENTION),
            Entry("torch", torch_dsa_sparse_attention, _TORCH),
        ),
    ),
)

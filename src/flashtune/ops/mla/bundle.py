"""The bundled dataset's MLA ops at DeepSeek-V3's per-GPU shapes (tensor parallel 8: 16
heads, latent 512 + RoPE 64): paged decode and causal paged prefill at page sizes 1 and 64,
and the non-absorbed ragged prefill (QK 192, V 128), with flashtune's, FlashInfer's and torch
solutions.

flashtune's entries are its plan-free calls (the work found on the device, no setup phase);
FlashInfer's wrappers plan once in a setup phase outside the timed region, as its users do.
The torch solutions are the ops' references (a loop over requests in fp32): a baseline for
correctness more than for speed.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.ops.attention.page import get_seq_lens
from flashtune.ops.bundle import (
    NO_SETUP,
    PLANNED,
    BundledOp,
    Entry,
    runs_the_op,
)
from flashtune.ops.bundle import workloads as wl
from flashtune.ops.bundle.planned import flashinfer_workspace, on_device_of, with_setup

MODELS = ("deepseek-v3-tp8",)
DECODE = [(1, 128), (4, 256), (32, 4096), (64, 8192), (128, 16384)]  # (batch, kv_len)
# (batch, qo_len, kv_len): the queries are each request's last qo_len tokens.
PREFILL = [(1, 128, 128), (2, 64, 512), (4, 512, 2048), (1, 4096, 4096), (8, 1024, 8192)]
RAGGED = [(1, 128), (4, 256), (1, 2048), (8, 1024), (1, 8192)]  # (batch, qo_len = kv_len)


def _split(table_and_scale: tuple[Any, ...]) -> tuple[tuple[Any, ...], float]:
    """The index inputs (in definition order) and sm_scale, the last input."""
    return table_and_scale[:-1], float(table_and_scale[-1])


def _decode_table(table: tuple[Any, ...]) -> tuple[Any, Any, Any]:
    """(kv_indptr, kv_indices, kv_last_page_len or None: page size 1 lists none)."""
    kv_indptr, kv_indices, *last = table
    return kv_indptr, kv_indices, (last[0] if last else None)


@runs_the_op
def flashtune_mla_paged_decode(q_nope, q_pe, ckv_cache, kpe_cache, *table_and_scale):
    from flashtune.ops.mla import mla_paged_decode

    table, sm_scale = _split(table_and_scale)
    kv_indptr, kv_indices, last = _decode_table(tuple(on_device_of(q_nope, *table)))
    return mla_paged_decode(
        q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale, last,
        return_lse=True,
    )  # fmt: skip


@runs_the_op
def flashtune_mla_paged_prefill(q_nope, q_pe, ckv_cache, kpe_cache, *table_and_scale):
    from flashtune.ops.mla import mla_paged_prefill

    table, sm_scale = _split(table_and_scale)
    qo_indptr, *rest = on_device_of(q_nope, *table)
    kv_indptr, kv_indices, last = _decode_table(tuple(rest))
    return mla_paged_prefill(
        q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, last,
        causal=True, return_lse=True,
    )  # fmt: skip


@runs_the_op
def flashtune_mla_ragged_prefill(q, k, v, qo_indptr, kv_indptr, sm_scale):
    from flashtune.ops.mla import mla_ragged_prefill

    return mla_ragged_prefill(
        q, k, v, qo_indptr, kv_indptr, causal=True, sm_scale=float(sm_scale), return_lse=True
    )


def torch_mla_paged_decode(q_nope, q_pe, ckv_cache, kpe_cache, *table_and_scale):
    from flashtune.ops.mla.reference import mla_paged_ref

    table, sm_scale = _split(table_and_scale)
    kv_indptr, kv_indices, last = _decode_table(table)
    return mla_paged_ref(
        q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale,
        kv_last_page_len=last,
    )  # fmt: skip


def torch_mla_paged_prefill(q_nope, q_pe, ckv_cache, kpe_cache, *table_and_scale):
    from flashtune.ops.mla.reference import mla_paged_ref

    table, sm_scale = _split(table_and_scale)
    qo_indptr, *rest = table
    kv_indptr, kv_indices, last = _decode_table(tuple(rest))
    return mla_paged_ref(
        q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale,
        qo_indptr=qo_indptr, kv_last_page_len=last, causal=True,
    )  # fmt: skip


def torch_mla_ragged_prefill(q, k, v, qo_indptr, kv_indptr, sm_scale):
    from flashtune.ops.mla.reference import mla_ragged_prefill_ref

    return mla_ragged_prefill_ref(q, k, v, qo_indptr, kv_indptr, float(sm_scale), causal=True)


# --------------------------------------------------------------------------- FlashInfer


def _kv_lens(kv_indptr, last, page_size: int) -> torch.Tensor:
    """Each request's KV length (int32) from its page count and last page (page size 1
    lists no last page: every page holds one token)."""
    if last is None:
        return (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
    return get_seq_lens(kv_indptr, last, page_size).to(torch.int32)


def _mla_plan(decode: bool):
    def plan(q_nope, q_pe, ckv_cache, kpe_cache, *table_and_scale):
        import flashinfer

        table, sm_scale = _split(table_and_scale)
        if decode:
            batch = q_nope.shape[0]
            qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=q_nope.device)
            rest = table
        else:
            qo_indptr, rest = table[0], table[1:]
        kv_indptr, kv_indices, last = _decode_table(rest)
        page_size = ckv_cache.shape[1]
        wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(flashinfer_workspace(q_nope.device))
        wrapper.plan(
            qo_indptr,
            kv_indptr,
            kv_indices,
            _kv_lens(kv_indptr, last, page_size),
            q_nope.shape[1],
            ckv_cache.shape[-1],
            kpe_cache.shape[-1],
            page_size,
            not decode,  # causal (a decode row sees its whole request either way)
            sm_scale,
            q_nope.dtype,
            ckv_cache.dtype,
        )
        return wrapper

    return plan


def _mla_run(wrapper, q_nope, q_pe, ckv_cache, kpe_cache, *_index_and_scale):
    return wrapper.run(q_nope, q_pe, ckv_cache, kpe_cache, return_lse=True)


flashinfer_mla_paged_decode = with_setup(
    "flashinfer_mla_paged_decode",
    "FlashInfer's BatchMLAPagedAttentionWrapper, one query token per request.",
    _mla_plan(decode=True),
    _mla_run,
)
flashinfer_mla_paged_prefill = with_setup(
    "flashinfer_mla_paged_prefill",
    "FlashInfer's BatchMLAPagedAttentionWrapper, causal, several query tokens per request.",
    _mla_plan(decode=False),
    _mla_run,
)


def _ragged_plan(q, k, v, qo_indptr, kv_indptr, sm_scale):
    import flashinfer

    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(flashinfer_workspace(q.device), "NHD")
    wrapper.plan(
        qo_indptr,
        kv_indptr,
        q.shape[1],
        k.shape[1],
        q.shape[2],
        head_dim_vo=v.shape[2],
        causal=True,
        sm_scale=float(sm_scale),
        q_data_type=q.dtype,
        kv_data_type=k.dtype,
    )
    return wrapper


def _ragged_run(wrapper, q, k, v, *_index_and_scale):
    return wrapper.run(q, k, v, return_lse=True)


flashinfer_mla_ragged_prefill = with_setup(
    "flashinfer_mla_ragged_prefill",
    "FlashInfer's causal ragged prefill wrapper with QK 192 / VO 128 (backend 'auto').",
    _ragged_plan,
    _ragged_run,
)


# --------------------------------------------------------------------------- workloads


# --------------------------------------------------------------------------- declarations

_PLAN_FREE = (
    "the work is found on the device from the index inputs, so there is no plan and no setup "
    "phase: each timed call is the whole call. Its tactic follows from the shapes."
)
_REFERENCE = (
    "PyTorch eager baseline: the op's reference in ops.mla.reference (a loop over requests, "
    f"fp32). {NO_SETUP}"
)
_FI_MLA = "FlashInfer's BatchMLAPagedAttentionWrapper (backend 'auto')"
_FI_RAGGED = "FlashInfer's BatchPrefillWithRaggedKVCacheWrapper, causal, head_dim_vo 128"


def _paged(prefix: str, flashtune, torch_entry, flashinfer, call: str, what: str) -> BundledOp:
    return BundledOp(
        prefix=prefix,
        workloads=wl.paged_sweep([(b, 1, kv) for b, kv in DECODE], PREFILL),
        models=MODELS,
        entries=(
            Entry(
                "flashtune",
                flashtune,
                f"flashtune's plan-free Triton {what} ({call}): {_PLAN_FREE}",
            ),
            Entry("torch", torch_entry, _REFERENCE),
            Entry("flashinfer", flashinfer, f"{_FI_MLA}: {PLANNED}"),
        ),
    )


BUNDLED = (
    _paged(
        "mla_paged_decode",
        flashtune_mla_paged_decode,
        torch_mla_paged_decode,
        flashinfer_mla_paged_decode,
        "ops.mla.mla_paged_decode",
        "MLA decode, split-KV",
    ),
    _paged(
        "mla_paged_prefill_causal",
        flashtune_mla_paged_prefill,
        torch_mla_paged_prefill,
        flashinfer_mla_paged_prefill,
        "ops.mla.mla_paged_prefill",
        "causal MLA prefill over the paged latent cache",
    ),
    BundledOp(
        prefix="mla_ragged_prefill_causal",
        workloads=wl.ragged_sweep(RAGGED),
        models=MODELS,
        entries=(
            Entry(
                "flashtune",
                flashtune_mla_ragged_prefill,
                "flashtune's Triton non-absorbed MLA prefill over ragged K/V "
                f"(ops.mla.mla_ragged_prefill): {_PLAN_FREE}",
            ),
            Entry("torch", torch_mla_ragged_prefill, _REFERENCE),
            Entry("flashinfer", flashinfer_mla_ragged_prefill, f"{_FI_RAGGED}: {PLANNED}"),
        ),
    ),
)

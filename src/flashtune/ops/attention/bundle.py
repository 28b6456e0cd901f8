"""The bundled dataset's attention ops: GQA paged decode, causal paged and ragged prefill,
block-sparse attention, with flashtune's, FlashInfer's and torch eager solutions.

flashtune's attention entries use its plan-free functions, which find their work on the
device and never sync, so they have no setup phase. FlashInfer's wrappers and both
block-sparse wrappers plan once in a setup phase outside the timed region
(flashtune.ops.bundle.planned), as their users do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from flashtune.data import Definition, Workload
from flashtune.ops.attention.page import get_seq_lens
from flashtune.ops.bundle import (
    NO_SETUP,
    PLANNED,
    BundledOp,
    Entry,
    WorkloadContext,
    runs_the_op,
    with_description,
)
from flashtune.ops.bundle import workloads as wl
from flashtune.ops.bundle.planned import (
    flashinfer_workspace,
    last_page_len_and_scale,
    on_device_of,
    with_setup,
)

PAGE_SIZE = 16  # the serving default (the corpus also has 1)
DECODE = [(1, 128), (1, 32768), (16, 4096), (64, 2048), (256, 1024)]  # (batch, kv_len)
PREFILL = [(1, 128), (4, 256), (1, 2048), (8, 1024), (1, 8192)]  # (batch, qo_len = kv_len)
# Block-sparse attention (not causal, M = N tokens), per block shape (R, C): the densities
# of issue 18 (1.0: the format's own cost against the dense prefill) at the long M; its
# indices hold density * (M / R) * (N / C) int32s, so smaller blocks get fewer tokens: 8192
# at 64 x 64 (0.2 MB of blobs for the four densities), 4096 at 16 x 16 (0.7 MB), 2048 at
# 1 x 16 (2.9 MB). First, two short prefills (densities 0.2 and 0.9) at the short M: a CPU
# run takes the two smallest workloads of a definition, where the torch baseline costs the
# dense attention and the reference loops over block rows (128 of them at 1 x 16).
BLOCK_SPARSE_DENSITY = [0.2, 0.7, 0.9, 1.0]
BLOCK_SPARSE_SHORT_DENSITY = [0.2, 0.9]
BLOCK_SPARSE_TOKENS = {
    (64, 64): (512, 8192),
    (16, 16): (256, 4096),
    (4, 4): (128, 2048),
    (1, 16): (128, 2048),
}


@runs_the_op
def flashtune_gqa_paged_decode(
    q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale
):
    # The plan-free path: the split is scheduled on the device from the page table, so a
    # call never syncs (the planned wrapper's plan() reads indptr on the host).
    from flashtune.ops.attention.decode.plan_free import paged_decode

    kv_indptr, kv_indices, kv_last_page_len = on_device_of(
        q, kv_indptr, kv_indices, kv_last_page_len
    )
    return paged_decode(
        q,
        (k_cache, v_cache),
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        sm_scale=float(sm_scale),
        return_lse=True,
    )


@runs_the_op
def flashtune_gqa_paged_prefill(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len=None, sm_scale=None
):
    # The plan-free path: work items are found on the device from the indptr arrays, so a
    # call never syncs (the planned wrapper's plan() reads them on the host). Page-size-1
    # definitions list no kv_last_page_len (last_page_len_and_scale).
    from flashtune.ops.attention.prefill.plan_free import paged_prefill

    kv_last_page_len, sm_scale = last_page_len_and_scale(kv_indptr, kv_last_page_len, sm_scale)
    qo_indptr, kv_indptr, kv_indices, kv_last_page_len = on_device_of(
        q, qo_indptr, kv_indptr, kv_indices, kv_last_page_len
    )
    return paged_prefill(
        q,
        (k_cache, v_cache),
        qo_indptr,
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        causal=True,
        sm_scale=float(sm_scale),
        return_lse=True,
    )


@runs_the_op
def flashtune_gqa_ragged_prefill(q, k, v, qo_indptr, kv_indptr, sm_scale):
    from flashtune.ops.attention.prefill.plan_free import ragged_prefill

    return ragged_prefill(
        q, k, v, qo_indptr, kv_indptr, causal=True, sm_scale=float(sm_scale), return_lse=True
    )


def flashinfer_decode_uses_tensor_cores(
    num_qo_heads: int, num_kv_heads: int, kv_dtype: torch.dtype
) -> bool:
    """The decode backend FlashInfer itself picks where it chooses (its block-sparse wrapper's
    plan) and its serving users pick (sglang's `should_use_tensor_core`): tensor cores (the
    prefill kernel) for an fp8 KV cache or a GQA group size of at least 4 query heads per KV
    head, since the MMA fuses the head group with the token dimension; CUDA cores below."""
    if kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return True
    return num_qo_heads // num_kv_heads >= 4


def _decode_plan(tensor_cores: bool | None):
    def plan(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
        import flashinfer

        num_qo_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
        if tensor_cores is None:
            use_tc = flashinfer_decode_uses_tensor_cores(num_qo_heads, num_kv_heads, k_cache.dtype)
        else:
            use_tc = tensor_cores
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            flashinfer_workspace(q.device), "NHD", use_tensor_cores=use_tc
        )
        wrapper.plan(
            kv_indptr,
            kv_indices,
            kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            q.shape[2],
            k_cache.shape[1],
            q_data_type=q.dtype,
            kv_data_type=k_cache.dtype,
            sm_scale=float(sm_scale),
        )
        return wrapper

    return plan


def _paged_run(wrapper, q, k_cache, v_cache, *_index_and_scale):
    return wrapper.run(q, (k_cache, v_cache), return_lse=True)


# Decode: `flashinfer` follows FlashInfer's own backend rule (tensor cores for GQA group >= 4);
# the forced variants are listed as separately named solutions.
flashinfer_gqa_paged_decode = with_setup(
    "flashinfer_gqa_paged_decode",
    "FlashInfer's batch decode wrapper on the backend FlashInfer's rule picks "
    "(`flashinfer_decode_uses_tensor_cores`).",
    _decode_plan(None),
    _paged_run,
)
flashinfer_gqa_paged_decode_tensor_cores = with_setup(
    "flashinfer_gqa_paged_decode_tensor_cores",
    "FlashInfer's batch decode wrapper with use_tensor_cores=True (its prefill kernel).",
    _decode_plan(True),
    _paged_run,
)
flashinfer_gqa_paged_decode_cuda_cores = with_setup(
    "flashinfer_gqa_paged_decode_cuda_cores",
    "FlashInfer's batch decode wrapper with use_tensor_cores=False (its CUDA-core decode kernel).",
    _decode_plan(False),
    _paged_run,
)


def _paged_prefill_plan(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len=None, sm_scale=None
):
    import flashinfer

    kv_last_page_len, sm_scale = last_page_len_and_scale(kv_indptr, kv_last_page_len, sm_scale)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(flashinfer_workspace(q.device), "NHD")
    wrapper.plan(
        qo_indptr,
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        q.shape[1],
        k_cache.shape[2],
        q.shape[2],
        k_cache.shape[1],
        causal=True,
        sm_scale=float(sm_scale),
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
    )
    return wrapper


flashinfer_gqa_paged_prefill = with_setup(
    "flashinfer_gqa_paged_prefill",
    "FlashInfer's causal batch prefill wrapper over a paged KV cache (backend 'auto').",
    _paged_prefill_plan,
    _paged_run,
)


def _ragged_prefill_plan(q, k, v, qo_indptr, kv_indptr, sm_scale):
    import flashinfer

    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(flashinfer_workspace(q.device), "NHD")
    wrapper.plan(
        qo_indptr,
        kv_indptr,
        q.shape[1],
        k.shape[1],
        q.shape[2],
        causal=True,
        sm_scale=float(sm_scale),
        q_data_type=q.dtype,
        kv_data_type=k.dtype,
    )
    return wrapper


def _ragged_run(wrapper, q, k, v, *_index_and_scale):
    return wrapper.run(q, k, v, return_lse=True)


flashinfer_gqa_ragged_prefill = with_setup(
    "flashinfer_gqa_ragged_prefill",
    "FlashInfer's causal batch prefill wrapper over ragged K/V (backend 'auto').",
    _ragged_prefill_plan,
    _ragged_run,
)


def _attend_padded(q, k, v, q_pos, kv_len, sm_scale):
    """q [B, Lq, Hq, D], k/v [B, Lk, Hk, D] padded; causal by absolute position q_pos [B, Lq]
    (None: attend to all kv_len tokens). Returns out [B, Lq, Hq, D], lse2 [B, Lq, Hq]."""
    b, lq, hq, d = q.shape
    hk = k.shape[2]
    qg = q.float().view(b, lq, hk, hq // hk, d)  # query head h reads KV head h // group
    logits = torch.einsum("bqhgd,bkhd->bhgqk", qg, k.float()) * sm_scale
    kv_pos = torch.arange(k.shape[1], device=q.device)
    mask = kv_pos[None, None, :] >= kv_len[:, None, None]  # [B, 1, Lk] padding
    if q_pos is not None:
        mask = mask | (kv_pos[None, None, :] > q_pos[:, :, None])  # [B, Lq, Lk]
    logits = logits.masked_fill(mask[:, None, None], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1) / math.log(2.0)  # [B, Hk, G, Lq]
    out = torch.einsum("bhgqk,bkhd->bqhgd", torch.softmax(logits, dim=-1), v.float())
    return out.reshape(b, lq, hq, d).to(q.dtype), lse.reshape(b, hq, lq).permute(0, 2, 1)


def _gather_pages(cache, kv_indptr, kv_indices, lens, max_len):
    """[B, max_len, H, D] of each request's tokens (padding past its length)."""
    page_size = cache.shape[1]
    b = lens.shape[0]
    tok = torch.arange(max_len, device=cache.device)
    page_slot = (tok // page_size)[None, :].expand(b, -1)  # [B, L]
    starts = kv_indptr[:-1].long()[:, None]
    idx = (starts + page_slot).clamp(max=max(kv_indices.shape[0] - 1, 0))
    pages = kv_indices.long()[idx]
    return cache[pages, (tok % page_size)[None, :].expand(b, -1)]


def torch_gqa_paged_decode(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    # A paged decode is a prefill of one query token per request (attending to all KV).
    qo_indptr = torch.arange(q.shape[0] + 1, device=q.device, dtype=kv_indptr.dtype)
    return _paged_requests(
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale
    )


def torch_gqa_paged_prefill(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len=None, sm_scale=None
):
    kv_last_page_len, sm_scale = last_page_len_and_scale(kv_indptr, kv_last_page_len, sm_scale)
    return _paged_requests(
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale
    )


def _paged_requests(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale
):
    lens = get_seq_lens(kv_indptr, kv_last_page_len, k_cache.shape[1])
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    qo = qo_indptr.tolist()
    for b in range(len(qo) - 1):  # one request at a time: eager torch, no padding waste
        n_q, n_kv = qo[b + 1] - qo[b], int(lens[b])
        if n_q == 0:
            continue
        if n_kv == 0:  # nothing to attend to: output 0, lse -inf (the reference's convention)
            out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]] = 0, float("-inf")
            continue
        k = _gather_pages(k_cache, kv_indptr[b : b + 2], kv_indices, lens[b : b + 1], n_kv)
        v = _gather_pages(v_cache, kv_indptr[b : b + 2], kv_indices, lens[b : b + 1], n_kv)
        q_pos = torch.arange(n_q, device=q.device)[None] + (n_kv - n_q)
        o, s = _attend_padded(q[None, qo[b] : qo[b + 1]], k, v, q_pos, lens[b : b + 1], sm_scale)
        out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]] = o[0], s[0]
    return out, lse


def torch_gqa_ragged_prefill(q, k, v, qo_indptr, kv_indptr, sm_scale):
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        n_q, n_kv = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        if n_q == 0:
            continue
        q_pos = torch.arange(n_q, device=q.device)[None] + (n_kv - n_q)
        lens = torch.tensor([n_kv], device=q.device)
        o, s = _attend_padded(
            q[None, qo[b] : qo[b + 1]],
            k[None, kv[b] : kv[b + 1]],
            v[None, kv[b] : kv[b + 1]],
            q_pos,
            lens,
            sm_scale,
        )
        out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]] = o[0], s[0]
    return out, lse


# --------------------------------------------------------------------------- block-sparse
# The block_sparse_attention Definition's inputs: q [M, Hq, D], k/v as column blocks
# [N / C, C, Hkv, D] (a contiguous view of FlashInfer's k/v [N, Hkv, D]), the BSR indptr
# [M / R + 1] and indices [nnz], sm_scale. R is M / (len(indptr) - 1), C is k.shape[1].
# Both wrappers (flashtune's and FlashInfer's BlockSparseAttentionWrapper) plan once from
# the BSR index inputs in the setup phase, as their users do, and the runner only runs.


def _bsr_plan_args(q, k, indptr, indices) -> tuple:
    """FlashInfer's plan() positional arguments (indptr, indices, M, N, R, C, Hq, Hkv, D)."""
    num_pages, block_cols, num_kv_heads, head_dim = k.shape
    block_rows = q.shape[0] // (indptr.shape[0] - 1)
    M, N = q.shape[0], num_pages * block_cols
    return (indptr, indices, M, N, block_rows, block_cols, q.shape[1], num_kv_heads, head_dim)


def _block_sparse_plan(wrapper_class: Callable[[], Any]):
    def plan(q, k, v, indptr, indices, sm_scale):
        wrapper = wrapper_class()(flashinfer_workspace(q.device))
        wrapper.plan(
            *_bsr_plan_args(q, k, indptr, indices),
            sm_scale=float(sm_scale),
            q_data_type=q.dtype,
            kv_data_type=k.dtype,
            o_data_type=q.dtype,
        )
        return wrapper

    return plan


def _block_sparse_run(wrapper, q, k, v, *_index_and_scale):
    # [N / C, C, Hkv, D] -> [N, Hkv, D]: a view (the blocks are contiguous), no copy.
    return wrapper.run(q, k.flatten(0, 1), v.flatten(0, 1), return_lse=True)


def _flashtune_block_sparse_wrapper() -> Any:
    from flashtune.ops.attention.sparse import BlockSparseAttentionWrapper

    return BlockSparseAttentionWrapper


def _flashinfer_block_sparse_wrapper() -> Any:
    import flashinfer

    return flashinfer.sparse.BlockSparseAttentionWrapper


flashtune_block_sparse_attention = runs_the_op(
    with_setup(
        "flashtune_block_sparse_attention",
        "flashtune's BlockSparseAttentionWrapper (a configuration of its paged prefill).",
        _block_sparse_plan(_flashtune_block_sparse_wrapper),
        _block_sparse_run,
    )
)
flashinfer_block_sparse_attention = with_setup(
    "flashinfer_block_sparse_attention",
    "FlashInfer's flashinfer.sparse.BlockSparseAttentionWrapper (backend 'auto').",
    _block_sparse_plan(_flashinfer_block_sparse_wrapper),
    _block_sparse_run,
)

# The torch baseline's logits chunk: at most this many fp32 elements (256 MB) at a time.
_BSR_LOGITS_CHUNK = 1 << 26


def torch_block_sparse_attention(q, k, v, indptr, indices, sm_scale):
    """Dense masked attention: the BSR blocks expanded to a [block rows, column blocks] mask
    on the device (no host sync), then every query row against all N keys in fp32, masked,
    in query chunks of bounded memory. Its cost is the dense one at any density."""
    M, num_qo_heads, head_dim = q.shape
    num_pages, block_cols, num_kv_heads, _ = k.shape
    num_block_rows = indptr.shape[0] - 1
    block_rows = M // num_block_rows
    group = num_qo_heads // num_kv_heads
    blocks_per_row = (indptr[1:] - indptr[:-1]).long()
    row_of_block = torch.repeat_interleave(
        torch.arange(num_block_rows, device=q.device), blocks_per_row, output_size=indices.shape[0]
    )
    block_mask = torch.zeros(num_block_rows, num_pages, dtype=torch.bool, device=q.device)
    block_mask[row_of_block, indices.long()] = True
    key_block = torch.arange(num_pages * block_cols, device=q.device) // block_cols
    kf = k.flatten(0, 1).float().permute(1, 2, 0)  # [Hkv, D, N]
    vf = v.flatten(0, 1).float().transpose(0, 1)  # [Hkv, N, D]
    out = torch.empty_like(q)
    lse = torch.empty(M, num_qo_heads, dtype=torch.float32, device=q.device)
    chunk = max(block_rows, _BSR_LOGITS_CHUNK // (num_qo_heads * num_pages * block_cols))
    for start in range(0, M, chunk):
        rows = slice(start, min(start + chunk, M))
        # [Hkv, G * rows, D]: a KV head's query heads side by side, one matmul per KV head.
        qc = q[rows].float().reshape(-1, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        n = qc.shape[2]
        logits = torch.matmul(qc.reshape(num_kv_heads, group * n, head_dim), kf) * sm_scale
        logits = logits.view(num_kv_heads, group, n, -1)
        row_block = torch.arange(rows.start, rows.stop, device=q.device) // block_rows
        visible = block_mask[row_block][:, key_block]  # [rows, N]
        logits = logits.masked_fill(~visible, float("-inf"))
        row_lse = torch.logsumexp(logits, dim=-1)  # [Hkv, G, rows]; -inf where nothing is seen
        p = torch.exp(logits - row_lse.clamp(min=torch.finfo(torch.float32).min)[..., None])
        o = torch.matmul(p.view(num_kv_heads, group * n, -1), vf).view(num_kv_heads, group, n, -1)
        out[rows] = o.permute(2, 0, 1, 3).reshape(n, num_qo_heads, head_dim).to(q.dtype)
        lse[rows] = (row_lse / math.log(2.0)).permute(2, 0, 1).reshape(n, num_qo_heads)
    return out, lse


# --------------------------------------------------------------------------- workloads


def _block_sparse_workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
    from flashtune.ops.attention.sparse import bsr_pattern

    rows, cols = definition.const_axes["block_rows"], definition.const_axes["block_cols"]
    short, long = BLOCK_SPARSE_TOKENS[rows, cols]
    sizes = [(short, d) for d in BLOCK_SPARSE_SHORT_DENSITY]
    sizes += [(long, d) for d in BLOCK_SPARSE_DENSITY]
    out = []
    for n, density in sizes:
        wid = wl.stable_uuid(definition.name, n, density)
        indptr, indices = bsr_pattern(n // rows, n // cols, rows, cols, density, ctx.generator)
        inputs = wl.blob(ctx, definition, wid, {"indptr": indptr, "indices": indices})
        axes = {
            "num_rows": n,
            "len_indptr": n // rows + 1,
            "num_indices": indices.numel(),
            "num_pages": n // cols,
        }
        out.append(Workload(uuid=wid, axes=axes, inputs=inputs))
    return out


# --------------------------------------------------------------------------- declarations

_PLAN_FREE = (
    "the work is found on the device from the index inputs, so there is no plan and no setup "
    "phase: each timed call is the whole call. Its tactic follows from the shapes (the "
    "autotuner is not consulted)."
)
_TORCH = f"PyTorch eager baseline. {NO_SETUP}"


def _decode_backend(tensor_cores: bool) -> str:
    if tensor_cores:
        return "tensor cores (use_tensor_cores=True: its prefill kernel)"
    return "CUDA cores (use_tensor_cores=False: its decode kernel)"


def _decode_entries(definition: Definition, entries: tuple[Entry, ...]) -> list[Entry]:
    """flashtune and torch, then `flashinfer` on the backend FlashInfer's own rule picks for
    this definition, and the other backend beside it under its own name."""
    ours, baseline, fi, fi_tc, fi_cc = entries
    hq, hk = definition.const_axes["num_qo_heads"], definition.const_axes["num_kv_heads"]
    tc = flashinfer_decode_uses_tensor_cores(
        hq, hk, getattr(torch, definition.inputs["k_cache"].dtype)
    )
    wrapper = "FlashInfer's BatchDecodeWithPagedKVCacheWrapper"
    rule = f"FlashInfer's rule picks for GQA group size {hq // hk} (tensor cores from 4, or fp8 KV)"
    other = fi_cc if tc else fi_tc
    return [
        ours,
        baseline,
        with_description(fi, f"{wrapper} on {_decode_backend(tc)}, the backend {rule}: {PLANNED}"),
        with_description(
            other,
            f"{wrapper} forced to {_decode_backend(not tc)}, not the backend {rule}: {PLANNED}",
        ),
    ]


def _plan_free(call: str, what: str) -> str:
    return f"flashtune's plan-free Triton {what} ({call}): {_PLAN_FREE}"


_PAGED = {"page_size": PAGE_SIZE}
_PAGED_PREFILL = "FlashInfer's BatchPrefillWithPagedKVCacheWrapper (causal, backend 'auto')"
_RAGGED_PREFILL = "FlashInfer's BatchPrefillWithRaggedKVCacheWrapper (causal, backend 'auto')"
_FI_BLOCK_SPARSE = (
    "FlashInfer's flashinfer.sparse.BlockSparseAttentionWrapper (backend 'auto'; its "
    "tensor-core prefill kernels where block_rows x GQA group size >= 4, else its decode "
    "kernels)"
)
_FT_BLOCK_SPARSE = (
    "flashtune's BlockSparseAttentionWrapper (ops.attention.sparse: its Triton paged prefill "
    "with a block row as a request and a column block as a page): plan() runs once per input "
    "set in the setup phase, outside the timed region, as FlashInfer's is; the timed call is "
    "run() only (input sets with identical index tensors share one plan)."
)
_TORCH_BLOCK_SPARSE = (
    "PyTorch eager baseline, dense masked attention: the blocks expanded to a mask on the "
    "device, every query row against all N keys in fp32 (query chunks of at most 256 MB of "
    f"logits), so it costs the dense attention at every density. {NO_SETUP}"
)

BUNDLED = (
    BundledOp(
        prefix="gqa_paged_decode",
        workloads=wl.paged_sweep(DECODE, PREFILL),
        consts=_PAGED,
        entries=(
            Entry(
                "flashtune",
                flashtune_gqa_paged_decode,
                _plan_free("ops.attention.decode.plan_free.paged_decode", "paged decode"),
            ),
            Entry("torch", torch_gqa_paged_decode, _TORCH),
            Entry("flashinfer", flashinfer_gqa_paged_decode, ""),
            Entry("flashinfer_tensor_cores", flashinfer_gqa_paged_decode_tensor_cores, ""),
            Entry("flashinfer_cuda_cores", flashinfer_gqa_paged_decode_cuda_cores, ""),
        ),
        pick=_decode_entries,
    ),
    BundledOp(
        prefix="gqa_paged_prefill_causal",
        workloads=wl.paged_sweep(DECODE, PREFILL),
        consts=_PAGED,
        entries=(
            Entry(
                "flashtune",
                flashtune_gqa_paged_prefill,
                _plan_free("ops.attention.prefill.plan_free.paged_prefill", "causal paged prefill"),
            ),
            Entry("torch", torch_gqa_paged_prefill, _TORCH),
            Entry("flashinfer", flashinfer_gqa_paged_prefill, f"{_PAGED_PREFILL}: {PLANNED}"),
        ),
    ),
    BundledOp(
        prefix="gqa_ragged_prefill_causal",
        workloads=wl.ragged_sweep(PREFILL),
        entries=(
            Entry(
                "flashtune",
                flashtune_gqa_ragged_prefill,
                _plan_free(
                    "ops.attention.prefill.plan_free.ragged_prefill", "causal ragged prefill"
                ),
            ),
            Entry("torch", torch_gqa_ragged_prefill, _TORCH),
            Entry("flashinfer", flashinfer_gqa_ragged_prefill, f"{_RAGGED_PREFILL}: {PLANNED}"),
        ),
    ),
    BundledOp(
        prefix="block_sparse_attention",
        workloads=_block_sparse_workloads,
        # At the heads of Llama-3.1-8B and Qwen3-8B only (its index blobs are the bundle's
        # largest).
        consts={"num_qo_heads": 32, "num_kv_heads": 8},
        entries=(
            Entry("flashtune", flashtune_block_sparse_attention, _FT_BLOCK_SPARSE),
            Entry("torch", torch_block_sparse_attention, _TORCH_BLOCK_SPARSE),
            Entry(
                "flashinfer",
                flashinfer_block_sparse_attention,
                f"{_FI_BLOCK_SPARSE}: {PLANNED}",
            ),
        ),
    ),
)

"""Plain-PyTorch references for block-sparse attention (FlashInfer's `flashinfer.sparse`).

Two forms, written independently of the wrappers in sparse/__init__.py:
- the dense form: the BSR matrix expanded to an [M, N] boolean mask (`bsr_dense_mask`,
  `variable_block_dense_mask`), then ordinary masked attention. This is what "block-sparse
  attention" means, and what FlashInfer's own tests compare against;
- the gathered form (`block_sparse_attention_ref`): FlashInfer's exact semantics, needed for
  the options that depend on the order of a block row's keys. FlashInfer runs a block row as
  one prefill request whose keys are its blocks' keys concatenated in `indices` order, so
  `causal` aligns a row's queries bottom-right against that concatenation and ROPE_LLAMA
  places a key at its index in it, not at its column. With `causal=False` and no RoPE the
  two forms agree.

Conventions follow reference.py: computation in float32 (or `compute_dtype`), base-2 LSE,
rows that see no key give output 0 and LSE -inf.
"""

from __future__ import annotations

import math

import torch

from flashtune.ops.attention.reference import single_prefill_ref
from flashtune.ops.attention.variant import AttentionVariant

__all__ = [
    "bsr_block_rows",
    "bsr_dense_mask",
    "block_sparse_attention_ref",
    "dense_masked_attention_ref",
    "variable_block_dense_mask",
    "variable_block_sparse_attention_ref",
]


def bsr_block_rows(M: int, R: int, num_block_rows: int) -> list[tuple[int, int]]:
    """The query rows [start, end) of each block row: R each, the last cut at M (FlashInfer
    plans qo_indptr = R * arange(MB + 1) with its last entry replaced by M)."""
    return [(b * R, M if b == num_block_rows - 1 else (b + 1) * R) for b in range(num_block_rows)]


@torch.no_grad()
def bsr_dense_mask(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    M: int,
    N: int,
    R: int,
    C: int,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The [M, N] boolean mask of a BSR matrix with R x C blocks: block (b, indices[j]) for
    j in indptr[b]:indptr[b+1] is set (or set to mask[j] [R, C], cut to the rows and columns
    inside [M, N]). scipy's `bsr_matrix((mask, indices, indptr), (M, N)).toarray()`."""
    ptr = [int(x) for x in indptr.tolist()]
    cols = [int(x) for x in indices.tolist()]
    dense = torch.zeros(M, N, dtype=torch.bool)
    for b, (r0, r1) in enumerate(bsr_block_rows(M, R, len(ptr) - 1)):
        for j in range(ptr[b], ptr[b + 1]):
            c0 = cols[j] * C
            c1 = min(c0 + C, N)
            block = torch.ones(R, C, dtype=torch.bool) if mask is None else mask[j].cpu().bool()
            dense[r0:r1, c0:c1] |= block[: r1 - r0, : c1 - c0]
    return dense


@torch.no_grad()
def variable_block_dense_mask(
    block_mask_map: torch.Tensor, block_row_sz: torch.Tensor, block_col_sz: torch.Tensor
) -> torch.Tensor:
    """The [qo_len, kv_len] boolean mask of one KV head's variable-size blocks: block (i, j)
    spans block_row_sz[i] rows and block_col_sz[j] columns, set where block_mask_map[i, j]."""
    rows = block_row_sz.cpu().long()
    cols = block_col_sz.cpu().long()
    expanded = torch.repeat_interleave(block_mask_map.cpu().bool(), rows, dim=0)
    return torch.repeat_interleave(expanded, cols, dim=1)


def dense_masked_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dense_mask: torch.Tensor,
    sm_scale: float | None = None,
    logits_soft_cap: float | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [M, Hq, D] over k/v [N, Hkv, D] where dense_mask [M, N] allows:
    (out like q, lse [M, Hq] float32, base 2)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    return single_prefill_ref(
        q,
        k,
        v,
        scale,
        logits_soft_cap=logits_soft_cap,
        custom_mask=dense_mask.to(q.device),
        compute_dtype=compute_dtype,
    )


@torch.no_grad()
def block_sparse_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    R: int,
    C: int,
    variant: AttentionVariant = AttentionVariant(),
    mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's block-sparse attention, one block row at a time (the gathered form, see
    the module docstring): q [M, Hq, D], k/v [N, Hkv, D] NHD, mask [nnz, R, C] bool or None;
    variant: causal, scale (None: 1/sqrt(D)), soft-cap and RoPE (no window, no ALiBi).

    A block mask, when given, replaces `causal` (as FlashInfer's custom mask does). Returns
    (out like q, lse [M, Hq] float32, base 2)."""
    if variant.window_left >= 0 or variant.alibi:
        raise NotImplementedError("block-sparse attention has no window and no ALiBi")
    M = q.shape[0]
    sm_scale = variant.sm_scale
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float32, device=q.device)
    ptr = [int(x) for x in indptr.tolist()]
    cols = indices.cpu().long()
    offsets = torch.arange(C)
    for b, (r0, r1) in enumerate(bsr_block_rows(M, R, len(ptr) - 1)):
        blocks = cols[ptr[b] : ptr[b + 1]]
        if r1 == r0 or blocks.numel() == 0:
            continue
        keys = (blocks[:, None] * C + offsets[None, :]).reshape(-1).to(k.device)
        row_mask = None
        if mask is not None:
            # [blocks, R, C] -> this row's queries x its keys in concatenation order.
            row_mask = mask[ptr[b] : ptr[b + 1], : r1 - r0].transpose(0, 1).reshape(r1 - r0, -1)
        out[r0:r1], lse[r0:r1] = single_prefill_ref(
            q[r0:r1],
            k[keys],
            v[keys],
            scale,
            causal=variant.causal,
            logits_soft_cap=variant.logits_soft_cap,
            custom_mask=None if row_mask is None else row_mask.to(q.device),
            compute_dtype=compute_dtype,
            rope=variant.rope,
        )
    return out, lse


@torch.no_grad()
def variable_block_sparse_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask_map: torch.Tensor,
    block_row_sz: torch.Tensor,
    block_col_sz: torch.Tensor,
    sm_scale: float | None = None,
    logits_soft_cap: float | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable-block-size sparse attention in the dense form, each KV head with its own
    pattern: q [Hq, qo_len, D], k/v [Hkv, kv_len, D] (HND, as FlashInfer's
    VariableBlockSparseAttentionWrapper takes them); block_mask_map [Hkv, MB, NB],
    block_row_sz [Hkv, MB], block_col_sz [Hkv, NB]. Query head h reads KV head
    h // (Hq // Hkv). Returns (out [Hq, qo_len, D] like q, lse [Hq, qo_len] float32)."""
    num_qo_heads, num_kv_heads = q.shape[0], k.shape[0]
    group = num_qo_heads // num_kv_heads
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for h in range(num_kv_heads):
        dense = variable_block_dense_mask(block_mask_map[h], block_row_sz[h], block_col_sz[h])
        heads = slice(h * group, (h + 1) * group)
        o_h, lse_h = dense_masked_attention_ref(
            q[heads].transpose(0, 1),
            k[h : h + 1].transpose(0, 1),
            v[h : h + 1].transpose(0, 1),
            dense,
            sm_scale,
            logits_soft_cap,
            compute_dtype,
        )
        out[heads], lse[heads] = o_h.transpose(0, 1), lse_h.transpose(0, 1)
    return out, lse

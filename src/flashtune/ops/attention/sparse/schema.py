"""Schema of block-sparse attention: the Definition of `BlockSparseAttentionWrapper.run` in
its plain configuration (no mask inside the blocks, not causal, no RoPE, every block row
full: M a multiple of R), with the self-contained reference emitted into it.

K/V appear as their column blocks, [N / C, C, Hkv, D] (the wrapper's view of k/v [N, Hkv,
D]), so that a block's index is a page id and the block sizes are the tensors' axes.
"""

from __future__ import annotations

import math

import torch

from flashtune.schema import Const, OpSchema, Scalar, Tensor, Var

__all__ = ["BLOCK_SPARSE_ATTENTION", "block_sparse_attention_ref"]


@torch.no_grad()
def block_sparse_attention_ref(q, k, v, indptr, indices, sm_scale, logits_soft_cap=None):  # fmt: skip
    """Self-contained reference of the block_sparse_attention Definition (emitted into the
    JSON): q [M, Hq, D] in block rows of R = M / (len(indptr) - 1) queries; k/v
    [num_pages, C, Hkv, D]; block row b attends to the blocks
    indices[indptr[b]:indptr[b+1]]. Returns (output like q, base-2 lse [M, Hq] float32);
    a block row without blocks gives output 0 and lse -inf."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float32, device=q.device)
    num_block_rows = indptr.shape[0] - 1
    if num_block_rows == 0:
        return out, lse
    rows = q.shape[0] // num_block_rows
    num_kv_heads = k.shape[2]
    kf, vf = k.float(), v.float()  # once: every block row gathers its blocks from them
    ptr = indptr.tolist()  # one host copy, not one per block row
    for b in range(num_block_rows):
        blocks = indices[ptr[b] : ptr[b + 1]].long()
        if blocks.numel() == 0:
            continue
        kb, vb = kf[blocks].flatten(0, 1), vf[blocks].flatten(0, 1)  # [keys, Hkv, D]
        # Query head h reads KV head h // group: [rows, Hq, D] -> [rows, Hkv, group, D].
        qb = q[b * rows : (b + 1) * rows].float().unflatten(1, (num_kv_heads, -1))
        logits = torch.einsum("rhgd,nhd->rhgn", qb, kb) * sm_scale
        if logits_soft_cap:
            logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
        row_lse = torch.logsumexp(logits, dim=-1)
        p = torch.exp(logits - row_lse[..., None])
        o = torch.einsum("rhgn,nhd->rhgd", p, vb)
        out[b * rows : (b + 1) * rows] = o.flatten(1, 2).to(q.dtype)
        lse[b * rows : (b + 1) * rows] = row_lse.flatten(1, 2) / math.log(2.0)
    return out, lse


_BLOCKS = ["num_pages", "block_cols", "num_kv_heads", "head_dim"]

BLOCK_SPARSE_ATTENTION = OpSchema(
    op_type="block_sparse",
    name_prefix="block_sparse_attention",
    axes={
        "num_qo_heads": Const("Number of query/output attention heads.", abbrev="h"),
        "num_kv_heads": Const("Number of key-value attention heads.", abbrev="kv"),
        "head_dim": Const("Dimension of each attention head.", abbrev="d"),
        "block_rows": Const("Query rows per block (R).", abbrev="r", param="block_rows"),
        "block_cols": Const("Keys per block (C).", abbrev="c"),
        "num_rows": Var("Query rows (M), a multiple of block_rows."),
        "len_indptr": Var("Length of indptr: block rows + 1."),
        "num_indices": Var("Non-zero blocks (nnz)."),
        "num_pages": Var("Column blocks (keys N / block_cols): the pages of K/V."),
    },
    inputs={
        "q": Tensor(["num_rows", "num_qo_heads", "head_dim"], dtype_from="q"),
        "k": Tensor(_BLOCKS, dtype_from="k", description="Keys as column blocks."),
        "v": Tensor(_BLOCKS, dtype_from="k", description="Values as column blocks."),
        "indptr": Tensor(
            ["len_indptr"], dtype="int32", description="Block offsets of each block row (BSR)."
        ),
        "indices": Tensor(
            ["num_indices"], dtype="int32", description="Column block of each non-zero block."
        ),
        "sm_scale": Scalar("float32", description="Softmax scale. Default is 1/sqrt(head_dim)."),
    },
    outputs={
        "output": Tensor(["num_rows", "num_qo_heads", "head_dim"], dtype_from="q"),
        "lse": Tensor(
            ["num_rows", "num_qo_heads"],
            dtype="float32",
            description="The 2-based log-sum-exp of attention logits.",
        ),
    },
    reference=block_sparse_attention_ref,
    bound=("logits_soft_cap",),
    constraints=[
        "num_rows == (len_indptr - 1) * block_rows",
        "num_indices == indptr[-1].item()",
    ],
    tags=["stage:prefill", "fi_api:flashinfer.sparse.BlockSparseAttentionWrapper"],
    description="Attention under a block-sparse (BSR) mask of block_rows x block_cols blocks.",
)

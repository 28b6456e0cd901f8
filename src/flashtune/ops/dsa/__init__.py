"""DeepSeek Sparse Attention (DSA, DeepSeek-V3.2): a lightning indexer picks, per query token,
the topk cached tokens it attends to, then MLA attention runs over those tokens only.

- `dsa_topk_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table,
  topk=2048)`: per query row, score = sum_h weights[h] * relu(q_h . k_t) over its request's
  tokens (fp8 keys in deep_gemm's packed paged layout, dequantized by their per-token
  scale); returns the topk best as global cache slots (page * page_size + offset), in no
  particular order, -1 padding when the request has fewer tokens. [B, topk] int32.
- `dsa_sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale)`:
  MLA in absorbed form (the 512-wide latent is key and value, plus a 64-wide RoPE key) over
  each token's sparse_indices slots (-1 skipped); returns (output [T, H, 512] in q's dtype,
  lse [T, H] float32, base 2).

FlashInfer has no Python API of these two contracts (its sparse MLA is trtllm-gen's decode
with a sparse top-k, SM100, and an SM120 kernel), so the names are the FlashInfer-Trace
Definitions' (`dsa_topk_indexer_fp8_*`, `dsa_sparse_attention_*`) and the signatures their
inputs, in order. Layout: reference.py (the contract), cache.py (the packed key cache),
schema.py (the Definitions), kernels.py / launch.py (Triton), config.py (tactics).
docs/dsa.md: semantics, API, performance.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune import platform
from flashtune.env import FORCE_REFERENCE
from flashtune.model_shapes import ModelConfig
from flashtune.ops.dsa.cache import pack_index_cache, unpack_index_cache
from flashtune.ops.dsa.launch import run_indexer, run_sparse_attention
from flashtune.ops.dsa.reference import dsa_sparse_attention_ref, dsa_topk_indexer_ref
from flashtune.ops.dsa.schema import ATTENTION_SCHEMA, INDEXER_SCHEMA
from flashtune.schema import REGISTRY, ApiOp
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = [
    "DSA_OPS",
    "dsa_examples",
    "dsa_sparse_attention",
    "dsa_sparse_attention_ref",
    "dsa_topk_indexer",
    "dsa_topk_indexer_ref",
    "pack_index_cache",
    "unpack_index_cache",
]


def _kernels(t: Any) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and platform.kernels_available(t.device)
        and not FORCE_REFERENCE.get()
    )


def dsa_topk_indexer(
    q_index_fp8: torch.Tensor,
    k_index_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    topk: int = 2048,
) -> torch.Tensor:
    """DSA's top-k indexer: the topk cache slots each query row attends to.

    q_index_fp8 [B, H, D] float8_e4m3fn (DeepSeek-V3.2: H 64, D 128); k_index_cache_fp8
    [num_pages, page_size, 1, D + 4] int8, deep_gemm's packed layout (each page's
    page_size * D fp8 bytes, then its page_size float32 scales: `pack_index_cache` makes
    one); weights [B, H] float32 (the head weights, the q and softmax scales folded in);
    seq_lens [B] int32; block_table [B, max_num_pages] int32 (request b's token i is at page
    block_table[b, i // page_size], offset i % page_size). Returns topk_indices [B, topk]
    int32: the min(topk, seq_len) best tokens as slots page * page_size + offset, in no
    particular order (a set: the sparse attention weighs its slots the same in any order),
    then -1. Of tokens tying at the k-th score, the earliest positions are kept. Compare
    index sets, not sequences. For best first, `ops.dsa.launch.run_indexer(...,
    select=SelectTactic(method="torch"))` (ops.dsa.topk) selects with torch.topk.
    """
    if not isinstance(q_index_fp8, torch.Tensor) or q_index_fp8.dtype != torch.float8_e4m3fn:
        got = getattr(q_index_fp8, "dtype", type(q_index_fp8).__name__)
        raise TypeError(f"q_index_fp8 must be a float8_e4m3fn tensor, got {got}")
    if not _kernels(q_index_fp8):
        return dsa_topk_indexer_ref(
            q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk
        )
    return run_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk)


def dsa_sparse_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA attention over the cache slots each token selects (DSA's attention).

    q_nope [T, H, Dc] and q_pe [T, H, Dp] bfloat16 or float16 (DeepSeek-V3.2 at TP 8: H 16,
    Dc 512, Dp 64); ckv_cache [num_pages, page_size, Dc] and kpe_cache [num_pages,
    page_size, Dp] in q's dtype; sparse_indices [T, topk] int32
    slots page * page_size + offset (what dsa_topk_indexer returns), -1: padding; sm_scale
    (DeepSeek: 1/sqrt(192), the pre-absorption head dim). Returns (output [T, H, Dc] in q's
    dtype, lse [T, H] float32, base-2 log-sum-exp of the scaled logits), written into `out`
    / `lse` when given. A token whose slots are all -1 gets output 0 and LSE -inf.
    """
    if not _kernels(q_nope):
        result, result_lse = dsa_sparse_attention_ref(
            q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, float(sm_scale)
        )
        if out is None and lse is None:
            return result, result_lse
        out = result if out is None else out.copy_(result)
        lse = result_lse if lse is None else lse.copy_(result_lse)
        return out, lse
    return run_sparse_attention(
        q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, out=out, lse=lse
    )


# --------------------------------------------------------------------------- the schemas

dsa_topk_indexer = ApiOp(dsa_topk_indexer, INDEXER_SCHEMA, None)
dsa_sparse_attention = ApiOp(dsa_sparse_attention, ATTENTION_SCHEMA, None)

DSA_OPS: tuple[ApiOp, ...] = (dsa_topk_indexer, dsa_sparse_attention)
for _op in DSA_OPS:
    REGISTRY[_op.qualname] = _op


# --------------------------------------------------------------------------- model examples

EXAMPLE_TOKENS = 7
EXAMPLE_PAGES = 40


def _indexer_call(model: ModelConfig, tokens: int) -> Example:
    dsa = model.dsa
    assert dsa is not None
    f8 = torch.float8_e4m3fn
    max_pages = -(-dsa.index_topk // dsa.page_size)  # the constraint: topk fits the table
    args = (
        meta_tensor(tokens, dsa.index_n_heads, dsa.index_head_dim, dtype=f8),
        meta_tensor(EXAMPLE_PAGES, dsa.page_size, 1, dsa.index_head_dim + 4, dtype=torch.int8),
        meta_tensor(tokens, dsa.index_n_heads, dtype=torch.float32),
        meta_tensor(tokens, dtype=torch.int32),
        meta_tensor(tokens, max_pages, dtype=torch.int32),
    )
    return (dsa_topk_indexer, args, {"topk": dsa.index_topk})


def _attention_call(model: ModelConfig, tokens: int, page_size: int) -> Example:
    dsa, mla = model.dsa, model.mla
    assert dsa is not None and mla is not None
    heads = model.num_qo_heads
    args = (
        meta_tensor(tokens, heads, mla.kv_lora_rank),
        meta_tensor(tokens, heads, mla.qk_rope_head_dim),
        meta_tensor(EXAMPLE_PAGES, page_size, mla.kv_lora_rank),
        meta_tensor(EXAMPLE_PAGES, page_size, mla.qk_rope_head_dim),
        meta_tensor(tokens, dsa.index_topk, dtype=torch.int32),
        (mla.qk_nope_head_dim + mla.qk_rope_head_dim) ** -0.5,
    )
    return (dsa_sparse_attention, args, {})


@register_examples
def dsa_examples(model: ModelConfig) -> list[Example]:
    """A DSA model's indexer and its sparse attention over latent caches of pages of 1 and of
    the indexer's page size (the corpus's ps1 and ps64), on the meta device."""
    if model.dsa is None or model.mla is None:
        return []
    sizes = sorted({1, model.dsa.page_size})
    return [
        _indexer_call(model, EXAMPLE_TOKENS),
        *(_attention_call(model, EXAMPLE_TOKENS, ps) for ps in sizes),
    ]

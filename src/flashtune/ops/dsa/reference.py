"""The references of DeepSeek Sparse Attention (DSA, DeepSeek-V3.2) in plain PyTorch, float32
math: the contracts the kernels, the tests, the benchmark baseline and the schemas'
Definitions (schema.py) share.

- `dsa_topk_indexer_ref`: the lightning indexer. Per query row b, the score of each token t
  of its request is sum_h weights[b, h] * relu(q[b, h] . k[t]) (k dequantized: fp8 times
  its token's scale), and the row's output is the topk best tokens as *global cache slots*
  (page_id * page_size + offset, page_id from block_table), in descending score order;
  -1 pads a row whose request has fewer than topk tokens.
- `dsa_sparse_attention_ref`: MLA attention (absorbed form: the 512-wide latent is key and
  value, plus a 64-wide RoPE key) of each query token over the cache slots its
  sparse_indices row names (-1: none); the LSE is base 2.

Self-contained (only `math` and `torch`), since each function's source is emitted into the
Definitions as their reference.
"""

from __future__ import annotations

import math

import torch

__all__ = ["dsa_sparse_attention_ref", "dsa_topk_indexer_ref", "indexer_scores_at"]


@torch.no_grad()
def dsa_topk_indexer_ref(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk=2048):
    """The DSA indexer's top-k cache slots per query row; returns topk_indices [B, topk] int32.

    q_index_fp8 [B, H, D] (fp8 e4m3, or any float); k_index_cache_fp8 [num_pages, page_size,
    1, D + 4] int8 in deep_gemm's packed layout: per page, the page_size * D fp8 bytes of its
    keys first, then page_size float32 scales (so a page's bytes are not [token, D + 4]
    rows); weights [B, H] float32; seq_lens [B]; block_table [B, max_num_pages], request b's
    token i at page block_table[b, i // page_size], offset i % page_size. Output row b: the
    min(topk, seq_len) best tokens' slots page * page_size + offset, best first, then -1.
    """
    num_pages, page_size, _, width = k_index_cache_fp8.shape
    head_dim = width - 4
    raw = k_index_cache_fp8.view(torch.uint8).reshape(num_pages, page_size * width)
    keys = raw[:, : page_size * head_dim].contiguous().view(torch.float8_e4m3fn)
    scales = raw[:, page_size * head_dim :].contiguous().view(torch.float32)  # [P, page_size]
    k_all = keys.to(torch.float32).view(num_pages, page_size, head_dim) * scales[..., None]
    q = q_index_fp8.to(torch.float32)
    batch = q.shape[0]
    out = torch.full((batch, topk), -1, dtype=torch.int32, device=q.device)
    for b in range(batch):
        seq_len = int(seq_lens[b])
        if seq_len <= 0:
            continue
        pages = block_table[b, : (seq_len + page_size - 1) // page_size].to(torch.long)
        k = k_all[pages].reshape(-1, head_dim)[:seq_len]  # [seq_len, D]
        scores = (torch.relu(q[b] @ k.T) * weights[b].to(torch.float32)[:, None]).sum(0)
        n = min(topk, seq_len)
        best = torch.topk(scores, n).indices
        slots = pages[best // page_size] * page_size + best % page_size
        out[b, :n] = slots.to(torch.int32)
    return out


@torch.no_grad()
def dsa_sparse_attention_ref(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    """Sparse MLA attention over the cache slots each query token selects; returns (output,
    lse).

    q_nope [T, H, Dc], q_pe [T, H, Dp]; ckv_cache [num_pages, page_size, Dc], kpe_cache
    [num_pages, page_size, Dp]; sparse_indices [T, topk] int32 slots (page * page_size +
    offset, so the cache is read as [num_pages * page_size] token rows), -1: padding. Logit
    of head h and slot j: sm_scale * (q_nope . ckv[j] + q_pe . kpe[j]); the output is the
    softmax-weighted sum of ckv rows, in q_nope's dtype. lse [T, H] float32, base 2. A token
    with no valid slot gets output 0 and LSE -inf.
    """
    num_tokens, num_heads, head_dim_ckv = q_nope.shape
    ckv = ckv_cache.reshape(-1, head_dim_ckv)
    kpe = kpe_cache.reshape(-1, q_pe.shape[-1])
    output = torch.zeros_like(q_nope)
    lse = torch.full((num_tokens, num_heads), -math.inf, dtype=torch.float32, device=q_nope.device)
    chunk = 16  # tokens at a time: [chunk, topk, Dc] float32 gathers stay small
    for t0 in range(0, num_tokens, chunk):
        idx = sparse_indices[t0 : t0 + chunk].to(torch.long)  # [n, topk]
        valid = idx != -1
        safe = torch.where(valid, idx, 0)
        kc = ckv[safe].to(torch.float32)  # [n, topk, Dc]
        kp = kpe[safe].to(torch.float32)  # [n, topk, Dp]
        qn = q_nope[t0 : t0 + chunk].to(torch.float32)
        qp = q_pe[t0 : t0 + chunk].to(torch.float32)
        logits = (qn @ kc.transpose(1, 2) + qp @ kp.transpose(1, 2)) * sm_scale  # [n, H, topk]
        logits = logits.masked_fill(~valid[:, None, :], -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)  # natural log; -inf: no valid slot
        p = torch.exp(logits - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
        output[t0 : t0 + chunk] = (p @ kc).to(q_nope.dtype)
        lse[t0 : t0 + chunk] = row_lse / math.log(2.0)
    return output, lse


@torch.no_grad()
def indexer_scores_at(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, indices):
    """The indexer's score (as `dsa_topk_indexer_ref` computes it) of each slot in `indices`
    [B, K] (page * page_size + offset): float64 [B, K]; -inf for -1 padding, NaN for a slot
    its row's request does not hold (its page not among the request's first
    ceil(seq_len / page_size) block table entries, or its position past seq_len). What an
    index-set comparison judges a selection by (flashtune.bench.correctness)."""
    num_pages, page_size, _, width = k_index_cache_fp8.shape
    head_dim = width - 4
    raw = k_index_cache_fp8.view(torch.uint8).reshape(num_pages, page_size * width)
    keys = raw[:, : page_size * head_dim].contiguous().view(torch.float8_e4m3fn)
    scales = raw[:, page_size * head_dim :].contiguous().view(torch.float32)
    k_all = keys.to(torch.float32).view(num_pages, page_size, head_dim) * scales[..., None]
    q = q_index_fp8.to(torch.float32)
    idx = indices.to(torch.long)
    out = torch.full(idx.shape, math.nan, dtype=torch.float64, device=idx.device)
    for b in range(idx.shape[0]):
        seq_len = int(seq_lens[b])
        used = block_table[b, : max(0, (seq_len + page_size - 1) // page_size)].to(torch.long)
        where = torch.full((num_pages,), -1, dtype=torch.long, device=idx.device)
        where[used] = torch.arange(used.numel(), device=idx.device)
        row = idx[b]
        pad = row == -1
        page = torch.where((row >= 0) & (row < num_pages * page_size), row // page_size, 0)
        position = where[page] * page_size + row % page_size
        held = (row >= 0) & (row < num_pages * page_size) & (where[page] >= 0)
        held &= position < seq_len
        k = k_all[page, row.clamp_min(0) % page_size]  # [K, D]
        scores = (torch.relu(q[b] @ k.T) * weights[b].to(torch.float32)[:, None]).sum(0)
        out[b] = torch.where(held, scores.double(), math.nan)
        out[b][pad] = -math.inf
    return out

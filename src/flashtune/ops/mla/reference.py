"""The references of MLA attention in plain PyTorch (float32 math): the contracts the
kernels, the tests, the CPU path and the schema's Definitions (schema.py) share. Paged
(absorbed form, `mla_paged_ref`) and ragged prefill (non-absorbed form, `mla_ragged_ref`).

Self-contained (it uses only `math` and `torch`), since its source is emitted into the
Definitions as their reference.
"""

from __future__ import annotations

import math

import torch

__all__ = ["mla_paged_ref", "mla_ragged_prefill_ref"]


@torch.no_grad()
def mla_paged_ref(
    q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale, qo_indptr=None,
    kv_last_page_len=None, kv_len_arr=None, causal=True, kv_scale=None,
):  # fmt: skip
    """Multi-head Latent Attention over a paged latent cache; returns (output, lse).

    q_nope [total_q, H, Dc], q_pe [total_q, H, Dp]; ckv_cache [num_pages, page_size, Dc],
    kpe_cache [num_pages, page_size, Dp]. Request b's pages are kv_indices[kv_indptr[b] :
    kv_indptr[b + 1]] and its queries rows qo_indptr[b] : qo_indptr[b + 1] (None: one query
    per request, decode). Its KV length: kv_len_arr[b] (FlashInfer's plan), else full pages
    but the last, which holds kv_last_page_len[b] tokens, else full pages.
    Logit of query row i, head h, key t: sm_scale * (q_nope . ckv[t] + q_pe . kpe[t]); the
    output is the softmax-weighted sum of ckv. Causal: the queries are the last qo_len
    tokens of the request, query i sees keys t <= kv_len - qo_len + i. A query that sees no
    key gets output 0 and LSE -inf. lse [total_q, H] float32 is base 2 (log2 of the sum of
    exp of the logits). fp8 caches: kv_scale = (ckv_scale, kpe_scale), real = stored *
    scale, where ckv_scale is a float or [num_pages, page_size, Dc // 128] (one scale per
    token and 128 channels).
    """
    total_q, num_heads, head_dim_ckv = q_nope.shape
    page_size = ckv_cache.shape[1]
    batch = kv_indptr.shape[0] - 1
    device = q_nope.device
    if qo_indptr is None:
        qo_indptr = torch.arange(batch + 1, device=device)
    output = torch.zeros(total_q, num_heads, head_dim_ckv, dtype=q_nope.dtype, device=device)
    lse = torch.full((total_q, num_heads), -math.inf, dtype=torch.float32, device=device)
    ckv = ckv_cache.to(torch.float32)
    kpe = kpe_cache.to(torch.float32)
    if kv_scale is not None:
        ckv_scale, kpe_scale = kv_scale
        if isinstance(ckv_scale, torch.Tensor):
            groups = ckv_scale.shape[-1]
            ckv = ckv.unflatten(-1, (groups, head_dim_ckv // groups))
            ckv = (ckv * ckv_scale.to(torch.float32)[..., None]).flatten(-2)
        else:
            ckv = ckv * ckv_scale
        kpe = kpe * kpe_scale
    for b in range(batch):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        ps, pe = int(kv_indptr[b]), int(kv_indptr[b + 1])
        if kv_len_arr is not None:
            kv_len = int(kv_len_arr[b])
        elif pe == ps:
            kv_len = 0
        elif kv_last_page_len is not None:
            kv_len = (pe - ps - 1) * page_size + int(kv_last_page_len[b])
        else:
            kv_len = (pe - ps) * page_size
        if qe == qs or kv_len == 0:
            continue
        pages = kv_indices[ps:pe].to(torch.long)
        kc = ckv[pages].flatten(0, 1)[:kv_len]  # [kv_len, Dc]
        kp = kpe[pages].flatten(0, 1)[:kv_len]  # [kv_len, Dp]
        qn = q_nope[qs:qe].to(torch.float32)  # [qo_len, H, Dc]
        qp = q_pe[qs:qe].to(torch.float32)  # [qo_len, H, Dp]
        logits = torch.einsum("qhd,kd->qhk", qn, kc) + torch.einsum("qhd,kd->qhk", qp, kp)
        logits = logits * sm_scale
        if causal:
            last_key = torch.arange(qe - qs, device=device) + (kv_len - (qe - qs))
            keys = torch.arange(kv_len, device=device)
            logits = logits.masked_fill((keys[None, :] > last_key[:, None])[:, None, :], -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)  # [qo_len, H], natural log
        p = torch.exp(logits - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
        output[qs:qe] = torch.einsum("qhk,kd->qhd", p, kc).to(q_nope.dtype)
        lse[qs:qe] = row_lse / math.log(2.0)
    return output, lse


@torch.no_grad()
def mla_ragged_prefill_ref(q, k, v, qo_indptr, kv_indptr, sm_scale=None, causal=True):
    """MLA prefill in its non-absorbed form over ragged (packed) sequences; returns
    (output, lse). FlashInfer's BatchPrefillWithRaggedKVCacheWrapper with head_dim_qk 192,
    head_dim_vo 128.

    q [total_q, H, Dqk], k [total_kv, Hkv, Dqk], v [total_kv, Hkv, Dvo] (DeepSeek: Dqk =
    128 nope + 64 rope, Dvo = 128; Hkv == H, or H a multiple of Hkv: query head h reads kv
    head h // (H // Hkv)). Request b's queries are rows qo_indptr[b] : qo_indptr[b + 1] and
    its keys rows kv_indptr[b] : kv_indptr[b + 1]. Logit = sm_scale * q . k (sm_scale None:
    1 / sqrt(Dqk)). Causal: the queries are the request's last qo_len tokens (the mask is
    aligned to the bottom right), query i sees keys t <= kv_len - qo_len + i. A query that
    sees no key gets output 0 and LSE -inf. output [total_q, H, Dvo] in q's dtype; lse
    [total_q, H] float32, base 2 (log2 of the sum of exp of the logits).
    """
    total_q, num_heads, head_dim_qk = q.shape
    num_kv_heads, head_dim_vo = v.shape[1], v.shape[2]
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim_qk) if sm_scale is None else float(sm_scale)
    device = q.device
    output = torch.zeros(total_q, num_heads, head_dim_vo, dtype=q.dtype, device=device)
    lse = torch.full((total_q, num_heads), -math.inf, dtype=torch.float32, device=device)
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        ks, ke = int(kv_indptr[b]), int(kv_indptr[b + 1])
        qo_len, kv_len = qe - qs, ke - ks
        if qo_len == 0 or kv_len == 0:
            continue
        qb = q[qs:qe].to(torch.float32)  # [qo_len, H, Dqk]
        kb = k[ks:ke].to(torch.float32).repeat_interleave(group, dim=1)  # [kv_len, H, Dqk]
        vb = v[ks:ke].to(torch.float32).repeat_interleave(group, dim=1)  # [kv_len, H, Dvo]
        logits = torch.einsum("qhd,khd->qhk", qb, kb) * scale
        if causal:
            last_key = torch.arange(qo_len, device=device) + (kv_len - qo_len)
            keys = torch.arange(kv_len, device=device)
            logits = logits.masked_fill((keys[None, :] > last_key[:, None])[:, None, :], -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)  # [qo_len, H], natural log
        p = torch.exp(logits - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
        output[qs:qe] = torch.einsum("qhk,khd->qhd", p, vb).to(q.dtype)
        lse[qs:qe] = row_lse / math.log(2.0)
    return output, lse

"""Plain-PyTorch references for paged decode and prefill attention and attention-state merging.

They compute in float64 (or any `compute_dtype`) one request at a time, written for clarity,
not speed: tests, benchmarks and the CPU path import them. Conventions follow FlashInfer:
- caches are given as logical NHD views [num_pages, page_size, num_kv_heads, head_dim]
  (`page.split_kv_cache` turns any layout into that view);
- query head h reads KV head h // (num_qo_heads // num_kv_heads);
- the log-sum-exp (LSE) is in base 2: lse = logsumexp(logits) / ln 2;
- an empty sequence yields output 0 and LSE -inf.
"""

from __future__ import annotations

import functools
import math

import torch

from flashtune.ops.attention.variant import AttentionVariant

__all__ = [
    "paged_kv_lens",
    "gather_paged_kv",
    "paged_attention_ref",
    "gqa_paged_decode_ref",
    "batch_decode_ref",
    "single_decode_ref",
    "merge_state_ref",
    "merge_states_ref",
    "batch_prefill_ragged_ref",
    "batch_prefill_paged_ref",
    "single_prefill_ref",
    "apply_llama_rope_ref",
    "alibi_slopes",
]

_LOG2E = 1.4426950408889634


def paged_kv_lens(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> torch.Tensor:
    """KV length of each request [B] (int64): full pages plus the last page's tokens."""
    num_pages = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)
    lens = (num_pages - 1).clamp(min=0) * page_size + kv_last_page_len.to(torch.int64)
    return torch.where(num_pages > 0, lens, torch.zeros_like(lens))


def gather_paged_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    b: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Request b's keys and values as contiguous [kv_len, num_kv_heads, head_dim] tensors."""
    page_size = k_cache.shape[1]
    start, end = int(kv_indptr[b]), int(kv_indptr[b + 1])
    pages = kv_indices[start:end].to(torch.long)
    kv_len = 0 if end == start else (end - start - 1) * page_size + int(kv_last_page_len[b])
    k = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:kv_len]
    v = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:kv_len]
    return k, v


def _attend(
    q: torch.Tensor,  # [qo_len, H_qo, D]
    k: torch.Tensor,  # [kv_len, H_kv, D]
    v: torch.Tensor,  # [kv_len, H_kv, D]
    causal: bool,
    sm_scale: float,
    window_left: int,
    logits_soft_cap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one request in q's dtype: (out [qo_len, H_qo, D], lse2 [qo_len, H_qo])."""
    qo_len, num_qo_heads, head_dim = q.shape
    kv_len, num_kv_heads = k.shape[0], k.shape[1]
    group = num_qo_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if logits_soft_cap is not None and logits_soft_cap > 0:
        logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
    # Queries are aligned bottom-right: query i sits at KV position kv_len - qo_len + i.
    q_pos = torch.arange(qo_len, device=q.device)[:, None] + (kv_len - qo_len)
    k_pos = torch.arange(kv_len, device=q.device)[None, :]
    allowed = torch.ones(qo_len, kv_len, dtype=torch.bool, device=q.device)
    if causal:
        allowed &= k_pos <= q_pos
    if window_left >= 0:
        allowed &= k_pos >= q_pos - window_left
    logits = logits.masked_fill(~allowed[None], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # [H, qo]
    probs = torch.exp(logits - lse[..., None]).nan_to_num(0.0)  # rows with no key: all zeros
    out = torch.einsum("hqk,khd->qhd", probs, v)
    return out, (lse / math.log(2.0)).transpose(0, 1)


@torch.no_grad()
def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    variant: AttentionVariant = AttentionVariant(),
    compute_dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch attention over a paged KV cache: (out like q, lse2 [total_qo, H_qo] float32).

    q: [total_qo, H_qo, D], rows of request b are qo_indptr[b]:qo_indptr[b+1].
    k_cache, v_cache: [num_pages, page_size, H_kv, D] (NHD view).
    variant: causal, window, soft-cap, scale (None: 1/sqrt(D)) and RoPE's (rope_scale,
    rope_theta) of ROPE_LLAMA (see apply_llama_rope_ref); no ALiBi.
    """
    if variant.alibi:
        raise NotImplementedError("paged_attention_ref has no ALiBi: use batch_prefill_paged_ref")
    causal, window_left, rope = variant.causal, variant.window_left, variant.rope
    logits_soft_cap = variant.logits_soft_cap
    head_dim = q.shape[-1]
    sm_scale = 1.0 / math.sqrt(head_dim) if variant.sm_scale is None else float(variant.sm_scale)
    out = torch.zeros(q.shape, dtype=compute_dtype, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=compute_dtype, device=q.device)
    for b in range(len(kv_indptr) - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k, v = gather_paged_kv(k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, b)
        if q1 == q0 or k.shape[0] == 0:
            continue
        q_b = q[q0:q1]
        if rope is not None:
            kv_len = k.shape[0]
            q_b = apply_llama_rope_ref(q_b, torch.arange(q1 - q0) + (kv_len - (q1 - q0)), *rope)
            # An fp8 K is rotated from q's dtype, as the kernels round it (rotary.py).
            k = apply_llama_rope_ref(k.to(q.dtype), torch.arange(kv_len), *rope)
        o_b, lse_b = _attend(
            q_b.to(compute_dtype),
            k.to(compute_dtype),
            v.to(compute_dtype),
            causal,
            sm_scale,
            window_left,
            logits_soft_cap,
        )
        out[q0:q1], lse[q0:q1] = o_b, lse_b
    return out.to(q.dtype), lse.to(torch.float32)


@torch.no_grad()
def gqa_paged_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    sm_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch decode over a paged KV cache: the reference of the gqa_paged_decode schema.

    Self-contained (only torch and math), since its source is emitted into Definitions.
    q: [B, H_qo, D]; k_cache, v_cache: [num_pages, page_size, H_kv, D] (NHD view);
    kv_indptr [B+1], kv_indices [nnz], kv_last_page_len [B]: the CSR page table.
    Returns (output [B, H_qo, D] in q's dtype, lse [B, H_qo] float32, base 2); an empty
    request gives output 0 and lse -inf.
    """
    batch, num_qo_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_qo_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    out = torch.zeros((batch, num_qo_heads, head_dim), dtype=compute_dtype, device=q.device)
    lse = torch.full((batch, num_qo_heads), -math.inf, dtype=compute_dtype, device=q.device)
    for b in range(batch):
        start, end = int(kv_indptr[b]), int(kv_indptr[b + 1])
        if end <= start:
            continue
        kv_len = (end - start - 1) * page_size + int(kv_last_page_len[b])
        pages = kv_indices[start:end].to(device=k_cache.device, dtype=torch.long)
        # [kv_len, H_kv, D] -> [H_qo, kv_len, D]: query head h reads KV head h // group.
        k = k_cache[pages].reshape(-1, num_kv_heads, head_dim)[:kv_len].to(compute_dtype)
        v = v_cache[pages].reshape(-1, num_kv_heads, head_dim)[:kv_len].to(compute_dtype)
        k = k.transpose(0, 1).repeat_interleave(group, dim=0)
        v = v.transpose(0, 1).repeat_interleave(group, dim=0)
        logits = torch.einsum("hd,hkd->hk", q[b].to(compute_dtype), k) * scale
        if logits_soft_cap is not None and logits_soft_cap > 0:
            logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
        if window_left >= 0:  # the query sits at position kv_len - 1
            logits[:, : max(kv_len - 1 - window_left, 0)] = -math.inf
        lse_b = torch.logsumexp(logits, dim=-1)
        out[b] = torch.einsum("hk,hkd->hd", torch.exp(logits - lse_b[:, None]), v)
        lse[b] = lse_b / math.log(2.0)
    return out.to(q.dtype), lse.to(torch.float32)


def batch_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    sm_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    compute_dtype: torch.dtype = torch.float64,
    rope: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch decode (one query token per request, q [B, H_qo, D]): (out, lse2 float32).

    `gqa_paged_decode_ref` computing in float64 by default (the tests' ground truth); with
    rope (ROPE_LLAMA's (rope_scale, rope_theta)), `paged_attention_ref` rotating q and k.
    """
    if rope is not None:
        qo_indptr = torch.arange(q.shape[0] + 1, device=q.device)
        return paged_attention_ref(
            q,
            k_cache,
            v_cache,
            qo_indptr,
            kv_indptr,
            kv_indices,
            kv_last_page_len,
            AttentionVariant(
                sm_scale=sm_scale,
                window_left=window_left,
                logits_soft_cap=logits_soft_cap,
                rope=rope,
            ),
            compute_dtype=compute_dtype,
        )
    return gqa_paged_decode_ref(
        q,
        k_cache,
        v_cache,
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        sm_scale=sm_scale,
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        compute_dtype=compute_dtype,
    )


def single_decode_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    compute_dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request: q [H_qo, D], k/v [kv_len, H_kv, D] (NHD): (out [H_qo, D], lse2 [H_qo])."""
    kv_len = k.shape[0]
    dev = q.device
    indptr = torch.tensor([0, 1 if kv_len else 0], device=dev)
    out, lse = batch_decode_ref(
        q[None],
        k[None],
        v[None],
        indptr,
        torch.zeros(1, dtype=torch.int32, device=dev),
        torch.tensor([kv_len], device=dev),
        sm_scale=sm_scale,
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        compute_dtype=compute_dtype,
    )
    return out[0], lse[0]


def merge_states_ref(v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge n attention states: v [seq, n, H, D], s [seq, n, H] (base-2 LSE).

    Returns (v_merged [seq, H, D] in v's dtype, s_merged [seq, H] float32). States with
    s = -inf carry no weight; if all are -inf the result is (0, -inf).
    """
    s64 = s.to(torch.float64)
    s_max = s64.amax(dim=1, keepdim=True)
    s_max = torch.where(torch.isinf(s_max) & (s_max < 0), torch.zeros_like(s_max), s_max)
    w = torch.exp2(s64 - s_max)  # [seq, n, H]
    total = w.sum(dim=1)  # [seq, H]
    merged = (w[..., None] * v.to(torch.float64)).sum(dim=1) / total[..., None].clamp_min(1e-300)
    merged = torch.where(total[..., None] > 0, merged, torch.zeros_like(merged))
    s_out = torch.log2(total) + s_max[:, 0]
    return merged.to(v.dtype), s_out.to(torch.float32)


def merge_state_ref(
    v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attention states ([seq, H, D], [seq, H]) into one."""
    return merge_states_ref(torch.stack([v_a, v_b], dim=1), torch.stack([s_a, s_b], dim=1))


# --------------------------------------------------------------------------- prefill


def apply_llama_rope_ref(
    x: torch.Tensor, pos: torch.Tensor, rope_scale: float = 1.0, rope_theta: float = 1e4
) -> torch.Tensor:
    """FlashInfer's ROPE_LLAMA on x [n, H, D] at positions pos [n]: dimension i < D/2 pairs
    with i + D/2, frequency theta^(-2i/D) / rope_scale; computed in float64, returned in
    x's dtype (the kernels round the rotated tiles to it too)."""
    d = x.shape[-1]
    half = d // 2
    i = torch.arange(half, dtype=torch.float64, device=x.device)
    freq = rope_theta ** (-2.0 * i / d) / rope_scale
    angle = pos.to(device=x.device, dtype=torch.float64)[:, None] * freq[None, :]  # [n, D/2]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    x64 = x.to(torch.float64)
    lo, hi = x64[..., :half], x64[..., half:]
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1).to(x.dtype)


@torch.no_grad()
def batch_prefill_ragged_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    variant: AttentionVariant,
    custom_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch prefill over ragged KV: q [total_q, Hq, D], k/v [total_kv, Hkv, D].

    variant: causal, window, soft-cap, scale (None: 1/sqrt(D)), and the position encoding:
    rope (rope_scale, rope_theta) applies ROPE_LLAMA to q and k first (keys at their
    position in the request, queries at the last qo_len positions), as FlashInfer does;
    alibi is FlashInfer's ALiBi, logit + slope[head] * (key position - query index in the
    request); under a soft-cap FlashInfer multiplies that sum by sm_scale once more before
    cap * tanh(x / cap), and so does this reference.

    Returns (output [total_q, Hq, D] in q's dtype, lse [total_q, Hq] float32, base 2).
    Rows that see no key give output 0 and lse -inf. `custom_mask` is FlashInfer's flattened
    boolean mask (request after request, [qo_len, kv_len] row-major); it replaces `causal`.
    """
    causal, window_left, logits_soft_cap = (
        variant.causal,
        variant.window_left,
        variant.logits_soft_cap,
    )
    rope, alibi = variant.rope, variant.alibi
    total_q, num_qo_heads, head_dim = q.shape
    sm_scale = 1.0 / math.sqrt(head_dim) if variant.sm_scale is None else float(variant.sm_scale)
    num_kv_heads = k.shape[1]
    group = num_qo_heads // num_kv_heads
    out = torch.zeros(total_q, num_qo_heads, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((total_q, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)
    qo = [int(x) for x in qo_indptr.tolist()]
    kv = [int(x) for x in kv_indptr.tolist()]
    mask_off = 0
    for b in range(len(qo) - 1):
        qs, qe, ks, ke = qo[b], qo[b + 1], kv[b], kv[b + 1]
        qo_len, kv_len = qe - qs, ke - ks
        if qo_len == 0:
            continue
        q_req, k_req = q[qs:qe], k[ks:ke]
        if rope is not None:
            q_pos = torch.arange(qo_len, device=q.device) + (kv_len - qo_len)
            q_req = apply_llama_rope_ref(q_req, q_pos, *rope)
            k_pos = torch.arange(kv_len, device=k.device)
            k_req = apply_llama_rope_ref(k_req.to(q.dtype), k_pos, *rope)
        qb = q_req.to(compute_dtype).transpose(0, 1)  # [Hq, qo, D]
        kb = k_req.to(compute_dtype).transpose(0, 1).repeat_interleave(group, 0)
        vb = v[ks:ke].to(compute_dtype).transpose(0, 1).repeat_interleave(group, 0)
        logits = torch.matmul(qb, kb.transpose(1, 2)) * sm_scale  # [Hq, qo, kv]
        if alibi:
            rel = (
                torch.arange(kv_len, device=q.device)[None, :]
                - torch.arange(qo_len, device=q.device)[:, None]
            )
            slopes = alibi_slopes(num_qo_heads, q.device).to(compute_dtype)
            logits = logits + slopes[:, None, None] * rel.to(compute_dtype)
        if logits_soft_cap is not None and logits_soft_cap > 0:
            pre = logits * sm_scale if alibi else logits
            logits = logits_soft_cap * torch.tanh(pre / logits_soft_cap)
        i = torch.arange(qo_len, device=q.device)[:, None] + (kv_len - qo_len)
        j = torch.arange(kv_len, device=q.device)[None, :]
        keep = torch.ones(qo_len, kv_len, dtype=torch.bool, device=q.device)
        if custom_mask is not None:
            n = qo_len * kv_len
            keep = custom_mask[mask_off : mask_off + n].reshape(qo_len, kv_len).to(q.device)
            mask_off += n
        elif causal:
            keep = keep & (j <= i)
        if window_left >= 0:
            keep = keep & (j >= i - window_left)
        logits = logits.masked_fill(~keep, -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)  # [Hq, qo], -inf on empty rows
        probs = torch.exp(logits - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
        out[qs:qe] = torch.matmul(probs, vb).transpose(0, 1).to(q.dtype)
        lse[qs:qe] = (row_lse * _LOG2E).transpose(0, 1).float()
    return out, lse


def alibi_slopes(num_heads: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """FlashInfer's ALiBi slope per query head, float32 [num_heads] on `device` (one copy a
    device, made once: no host transfer per call, CUDA-graph safe after the first)."""
    if num_heads <= 0:
        raise ValueError(f"num_heads must be positive, got {num_heads}")
    return _alibi_slopes(num_heads, str(torch.device(device)))


@functools.lru_cache(maxsize=64)
def _alibi_slopes(num_heads: int, device: str) -> torch.Tensor:
    # The ALiBi paper's geometric slopes: with n the largest power of two <= num_heads,
    # head i < n gets 2^(-8 (i + 1) / n); the heads beyond n take every other slope of the
    # sequence for 2n heads, 2^(-4 (2 j + 1) / n) for j = 0, 1, ... (FlashInfer's choice).
    n = 1 << (num_heads.bit_length() - 1)
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * j + 1) / n) for j in range(num_heads - n)]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


def _gather_pages(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pages [P, page_size, H, D] -> ragged (k, v) [total_kv, H, D] and token kv_indptr."""
    page_size = k_cache.shape[1]
    ptr = [int(x) for x in kv_indptr.tolist()]
    last = [int(x) for x in kv_last_page_len.tolist()]
    ks, vs, tok_ptr = [], [], [0]
    for b in range(len(ptr) - 1):
        pages = kv_indices[ptr[b] : ptr[b + 1]].long().to(k_cache.device)
        n = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + last[b]
        ks.append(k_cache[pages].flatten(0, 1)[:n])
        vs.append(v_cache[pages].flatten(0, 1)[:n])
        tok_ptr.append(tok_ptr[-1] + n)
    shape = (0, *k_cache.shape[2:])
    k = torch.cat(ks) if ks else k_cache.new_empty(shape)
    v = torch.cat(vs) if vs else v_cache.new_empty(shape)
    return k, v, torch.tensor(tok_ptr, dtype=torch.int32)


@torch.no_grad()
def batch_prefill_paged_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    variant: AttentionVariant,
    custom_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch prefill over a paged KV cache given as NHD pages [P, page_size, Hkv, D]
    (pass split_kv_cache(...) views for HND). Same outputs as batch_prefill_ragged_ref."""
    k, v, tok_ptr = _gather_pages(k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len)
    return batch_prefill_ragged_ref(
        q, k, v, qo_indptr, tok_ptr, variant, custom_mask, compute_dtype
    )


def single_prefill_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    causal: bool = False,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    custom_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
    rope: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request: q [qo_len, Hq, D], k/v [kv_len, Hkv, D] (NHD); custom_mask [qo, kv]."""
    qo_indptr = torch.tensor([0, q.shape[0]], dtype=torch.int32)
    kv_indptr = torch.tensor([0, k.shape[0]], dtype=torch.int32)
    mask = None if custom_mask is None else custom_mask.reshape(-1)
    variant = AttentionVariant(
        sm_scale=sm_scale,
        causal=causal,
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        rope=rope,
    )
    return batch_prefill_ragged_ref(q, k, v, qo_indptr, kv_indptr, variant, mask, compute_dtype)

"""Entry points of the bundled solutions: adapters from a Definition's inputs (by name, in
definition order) to flashtune's ops, to FlashInfer, and to torch eager baselines.

In-place ops (fused_add_rmsnorm, paged attention plans) are wrapped so that the solution
never writes into its inputs: the fused-add adapters clone the two tensors the op updates,
for flashtune and FlashInfer alike, so their comparison stays fair. Attention adapters that use
a plan/run wrapper call `plan` and `run` on every call (the Definition has no separate
planning step), so the host-side planner is part of what is measured. flashtune's
attention adapters use its plan-free functions (`planless.paged_decode`,
`planless_prefill.paged_prefill` / `ragged_prefill`), which find their work on the device
and never sync; the planned wrappers are what FlashInfer's adapters use.

Imports are lazy: this module imports on a machine without FlashInfer or a GPU, and a
FlashInfer solution is SKIPPED there by its declared dependency before it is called.
"""

from __future__ import annotations

import math

import torch

RMS_EPS = 1e-5  # Llama-3.1 and Qwen3 (rms_norm_eps)
_WORKSPACE_BYTES = 128 * 2**20
_workspaces: dict[torch.device, torch.Tensor] = {}


def _workspace(device: torch.device) -> torch.Tensor:
    # FlashInfer's wrappers: one workspace per device, reused across calls like a serving
    # engine does.
    if device not in _workspaces:
        _workspaces[device] = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _workspaces[device]


# --------------------------------------------------------------------------- flashtune


def flashtune_rmsnorm(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    from flashtune.ops.norm import rmsnorm

    return rmsnorm(hidden_states, weight, eps=RMS_EPS)


def flashtune_fused_add_rmsnorm(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    from flashtune.ops.norm import fused_add_rmsnorm

    x, r = hidden_states.clone(), residual.clone()
    fused_add_rmsnorm(x, r, weight, eps=RMS_EPS)
    return x


def flashtune_silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    from flashtune.ops.activation import silu_and_mul

    return silu_and_mul(input)


def flashtune_gemm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    from flashtune.ops.gemm import mm

    return mm(A, B)


def flashtune_rope(
    q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    from flashtune.ops.rope import apply_rope_with_cos_sin_cache

    q_out, k_out = apply_rope_with_cos_sin_cache(
        positions, q, k, q.shape[-1], cos_sin_cache, is_neox=True
    )
    return q_out.view(q.shape), k_out.view(k.shape)


def flashtune_gqa_paged_decode(
    q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale
):
    # The plan-free path: the split is scheduled on the device from the page table, so a
    # call never syncs (the planned wrapper's plan() reads indptr on the host).
    from flashtune.ops.attention.planless import paged_decode

    return paged_decode(
        q, (k_cache, v_cache), kv_indptr, kv_indices, kv_last_page_len,
        sm_scale=float(sm_scale), return_lse=True,
    )  # fmt: skip


def flashtune_gqa_paged_prefill(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale
):
    # The plan-free path: work items are found on the device from the indptr arrays, so a
    # call never syncs (the planned wrapper's plan() reads them on the host).
    from flashtune.ops.attention.planless_prefill import paged_prefill

    return paged_prefill(
        q, (k_cache, v_cache), qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
        causal=True, sm_scale=float(sm_scale), return_lse=True,
    )  # fmt: skip


def flashtune_gqa_ragged_prefill(q, k, v, qo_indptr, kv_indptr, sm_scale):
    from flashtune.ops.attention.planless_prefill import ragged_prefill

    return ragged_prefill(
        q, k, v, qo_indptr, kv_indptr, causal=True, sm_scale=float(sm_scale), return_lse=True
    )


# --------------------------------------------------------------------------- FlashInfer


def flashinfer_rmsnorm(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    import flashinfer

    return flashinfer.norm.rmsnorm(hidden_states, weight, eps=RMS_EPS)


def flashinfer_fused_add_rmsnorm(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    import flashinfer

    x, r = hidden_states.clone(), residual.clone()
    flashinfer.norm.fused_add_rmsnorm(x, r, weight, eps=RMS_EPS)
    return x


def flashinfer_silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    import flashinfer

    return flashinfer.activation.silu_and_mul(input)


def flashinfer_rope(
    q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    import flashinfer

    q_out, k_out = flashinfer.rope.apply_rope_with_cos_sin_cache(
        positions, q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1), q.shape[-1],
        cos_sin_cache, is_neox=True,
    )  # fmt: skip
    return q_out.view(q.shape), k_out.view(k.shape)


def flashinfer_gqa_paged_decode(
    q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale
):
    import flashinfer

    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_workspace(q.device), "NHD")
    wrapper.plan(
        kv_indptr, kv_indices, kv_last_page_len, q.shape[1], k_cache.shape[2], q.shape[2],
        k_cache.shape[1], q_data_type=q.dtype, kv_data_type=k_cache.dtype,
        sm_scale=float(sm_scale),
    )  # fmt: skip
    return wrapper.run(q, (k_cache, v_cache), return_lse=True)


def flashinfer_gqa_paged_prefill(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale
):
    import flashinfer

    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace(q.device), "NHD")
    wrapper.plan(
        qo_indptr, kv_indptr, kv_indices, kv_last_page_len, q.shape[1], k_cache.shape[2],
        q.shape[2], k_cache.shape[1], causal=True, sm_scale=float(sm_scale),
        q_data_type=q.dtype, kv_data_type=k_cache.dtype,
    )  # fmt: skip
    return wrapper.run(q, (k_cache, v_cache), return_lse=True)


def flashinfer_gqa_ragged_prefill(q, k, v, qo_indptr, kv_indptr, sm_scale):
    import flashinfer

    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_workspace(q.device), "NHD")
    wrapper.plan(
        qo_indptr, kv_indptr, q.shape[1], k.shape[1], q.shape[2], causal=True,
        sm_scale=float(sm_scale), q_data_type=q.dtype, kv_data_type=k.dtype,
    )  # fmt: skip
    return wrapper.run(q, k, v, return_lse=True)


# --------------------------------------------------------------------------- torch eager


def torch_rmsnorm(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x = hidden_states.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * weight.float()
    return y.to(hidden_states.dtype)


def torch_fused_add_rmsnorm(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    return torch_rmsnorm(hidden_states.float() + residual.float(), weight).to(hidden_states.dtype)


def torch_silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    d = input.shape[-1] // 2
    return torch.nn.functional.silu(input[..., :d]) * input[..., d:]


def torch_gemm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.matmul(A, B.T)


def torch_rope(
    q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)  # [T, rd/2] each
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rd = cos_sin_cache.shape[-1]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        x1, x2 = xf[..., : rd // 2], xf[..., rd // 2 : rd]
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return torch.cat((rotated, xf[..., rd:]), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


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


def _paged_lens(kv_indptr, kv_last_page_len, page_size):
    n = (kv_indptr[1:] - kv_indptr[:-1]).long()
    return torch.where(n > 0, (n - 1).clamp(min=0) * page_size + kv_last_page_len.long(), 0)


def torch_gqa_paged_decode(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    # A paged decode is a prefill of one query token per request (attending to all KV).
    qo_indptr = torch.arange(q.shape[0] + 1, device=q.device, dtype=kv_indptr.dtype)
    return _paged_requests(
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale
    )


def torch_gqa_paged_prefill(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale
):
    return _paged_requests(
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale
    )


def _paged_requests(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale
):
    lens = _paged_lens(kv_indptr, kv_last_page_len, k_cache.shape[1])
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
            q[None, qo[b] : qo[b + 1]], k[None, kv[b] : kv[b + 1]], v[None, kv[b] : kv[b + 1]],
            q_pos, lens, sm_scale,
        )  # fmt: skip
        out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]] = o[0], s[0]
    return out, lse

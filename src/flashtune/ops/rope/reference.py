"""RoPE's references in plain PyTorch: the cos/sin-cache form (the schemas' reference: its
source is emitted into the Definitions), the ragged and Llama 3.1 forms, Llama 3.1's
frequencies by Meta's definition, and MLA's RoPE + fp8 quantization. The CPU path and the
tests' contract.
"""

from __future__ import annotations

import torch

__all__ = [
    "rope_with_cos_sin_cache_ref",
    "apply_rope_ref",
    "apply_llama31_rope_ref",
    "llama31_inv_freq",
    "mla_rope_quantize_ref",
]


def rope_with_cos_sin_cache_ref(q, k, cos_sin_cache, positions, head_size=None, is_neox=True):
    """(q_out, k_out) for q [nnz, Hq, D] or [nnz, Hq * D] (k likewise), rotating the first
    rotary_dim = cos_sin_cache.shape[-1] dimensions of each head."""
    import torch

    rotary_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache[positions.long()].to(torch.float32).chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]  # [nnz, 1, rotary_dim / 2]

    def rotate(x):
        d = head_size if head_size is not None else x.shape[-1]
        xf = x.to(torch.float32).reshape(x.shape[0], -1, d)
        if is_neox:
            x1, x2 = xf[..., : rotary_dim // 2], xf[..., rotary_dim // 2 : rotary_dim]
        else:
            x1, x2 = xf[..., 0:rotary_dim:2], xf[..., 1:rotary_dim:2]
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        if is_neox:
            rot = torch.cat((o1, o2), dim=-1)
        else:
            rot = torch.stack((o1, o2), dim=-1).flatten(-2)
        return torch.cat((rot, xf[..., rotary_dim:]), dim=-1).reshape(x.shape).to(x.dtype)

    return rotate(q), rotate(k)


def apply_rope_ref(
    q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1.0, rope_theta=1e4
):
    """(q_out, k_out) for a ragged batch q [nnz, Hq, D], k [nnz, Hk, D]: token i of request b
    at position offsets[b] + i - indptr[b], frequencies rope_theta ** (-2j / rotary_dim)."""
    rd = q.shape[-1] if rotary_dim is None else rotary_dim
    inv_freq = _inv_freq_ref(rd, rope_theta, q.device)
    return _rotate_ragged_ref(q, k, indptr, offsets, inv_freq / rope_scale, interleave)


def _inv_freq_ref(rotary_dim, rope_theta, device):
    """RoPE's inverse frequencies rope_theta ** (-2j / rotary_dim), [rotary_dim / 2] fp32."""
    exponents = torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim
    return 1.0 / (rope_theta**exponents)


def llama31_inv_freq(
    rotary_dim,
    rope_theta=5e5,
    rope_scale=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    old_context_len=8192,
    device=None,
):
    """Llama 3.1's scaled inverse frequencies [rotary_dim / 2], by Meta's definition:
    wavelengths shorter than old_context_len / high_freq_factor keep their frequency, longer
    than old_context_len / low_freq_factor are divided by rope_scale, a linear blend between."""
    import math

    import torch

    inv_freq = 1.0 / (
        rope_theta
        ** (torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float64) / rotary_dim)
    )
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / rope_scale + smooth * inv_freq
    scaled = torch.where(
        wavelen < old_context_len / high_freq_factor,
        inv_freq,
        torch.where(wavelen > old_context_len / low_freq_factor, inv_freq / rope_scale, blended),
    )
    return scaled.to(torch.float32)


def apply_llama31_rope_ref(
    q,
    k,
    indptr,
    offsets,
    rotary_dim=None,
    interleave=False,
    rope_scale=8.0,
    rope_theta=5e5,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    old_context_len=8192,
):
    """`apply_rope_ref` with Llama 3.1's frequencies (`llama31_inv_freq`)."""
    rd = q.shape[-1] if rotary_dim is None else rotary_dim
    inv_freq = llama31_inv_freq(
        rd, rope_theta, rope_scale, low_freq_factor, high_freq_factor, old_context_len, q.device
    )
    return _rotate_ragged_ref(q, k, indptr, offsets, inv_freq, interleave)


def _rotate_ragged_ref(q, k, indptr, offsets, inv_freq, interleave):
    """Rotate the first 2 * len(inv_freq) dimensions of each head by pos * inv_freq."""
    nnz = q.shape[0]
    counts = (indptr[1:] - indptr[:-1]).long()
    start = torch.repeat_interleave((indptr[:-1] - offsets).long(), counts, output_size=nnz)
    pos = torch.arange(nnz, device=q.device) - start
    return _rotate_ref(q, k, pos, inv_freq, interleave)


def _rotate_ref(q, k, pos, inv_freq, interleave):
    rd = 2 * inv_freq.shape[0]
    angle = pos.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]

    def rotate(x):
        xf = x.to(torch.float32)
        if interleave:
            x1, x2 = xf[..., 0:rd:2], xf[..., 1:rd:2]
        else:
            x1, x2 = xf[..., : rd // 2], xf[..., rd // 2 : rd]
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        rot = torch.stack((o1, o2), -1).flatten(-2) if interleave else torch.cat((o1, o2), -1)
        return torch.cat((rot, xf[..., rd:]), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def mla_rope_quantize_ref(
    q_rope,
    k_rope,
    q_nope,
    k_nope,
    cos_sin_cache,
    pos_ids,
    is_neox=True,
    quantize_dtype=None,
    quant_scale_q=1.0,
    quant_scale_kv=1.0,
):
    """(q_rope_out, k_rope_out, q_nope_out, k_nope_out) in quantize_dtype (default e4m3):
    q/k_rope rotated by the cache at pos_ids, every part multiplied by its scale (q's or the
    KV's) in fp32, then cast. k_rope/k_nope: [nnz, D] (one latent head) or [nnz, H, D]."""
    import torch

    dtype = quantize_dtype or torch.float8_e4m3fn
    rd = cos_sin_cache.shape[-1]
    k3 = k_rope if k_rope.dim() == 3 else k_rope.unsqueeze(1)
    q_rot, k_rot = rope_with_cos_sin_cache_ref(
        q_rope.float(), k3.float(), cos_sin_cache, pos_ids, rd, is_neox
    )
    return (
        (q_rot * quant_scale_q).to(dtype),
        (k_rot.reshape(k_rope.shape) * quant_scale_kv).to(dtype),
        (q_nope.float() * quant_scale_q).to(dtype),
        (k_nope.float() * quant_scale_kv).to(dtype),
    )

"""Stand-in for FlashInfer's tests/rope_reference.py (not in the sdist), written from the
RoPE definition. test_rope.py does `from rope_reference import *` and uses:

- precompute_freqs_cis(dim, end, theta, use_scaled, device): complex rotations
  e^(i * t * f_j), f_j = theta ** (-2j / dim), for t in [0, end); use_scaled applies Llama
  3.1's frequency scaling (Meta's: factor 8, low 1, high 4, original context 8192);
- apply_rotary_emb(xq, xk, freqs_cis): rotate consecutive pairs (x[2j], x[2j+1]) of
  [batch, seq, heads, dim] tensors by freqs_cis [seq, dim / 2] (GPT-J / interleaved style);
- RotaryEmbedding(head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
  dtype, device): vLLM's layer with its float32 cos | sin cache and forward_native;
- Optional and Tuple (the test's own annotations come through the star import).
Everything is computed in float32 and cast back to the input dtype.
"""

import math

# Re-exported: test_rope.py annotates with them and gets them through its star import.
from typing import Optional, Tuple  # noqa: UP035

import torch

__all__ = [
    "Optional",
    "Tuple",
    "apply_scaling",
    "precompute_freqs_cis",
    "reshape_for_broadcast",
    "apply_rotary_emb",
    "RotaryEmbedding",
]


def apply_scaling(
    freqs: torch.Tensor,
    scale_factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    old_context_len: float = 8192.0,
) -> torch.Tensor:
    """Llama 3.1: wavelengths shorter than old_context_len / high_freq_factor keep their
    frequency, longer than old_context_len / low_freq_factor are divided by scale_factor, and
    the band between blends the two linearly in old_context_len / wavelength."""
    wavelen = 2 * math.pi / freqs
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * freqs / scale_factor + smooth * freqs
    high_freq_wavelen = old_context_len / high_freq_factor
    low_freq_wavelen = old_context_len / low_freq_factor
    return torch.where(
        wavelen < high_freq_wavelen,
        freqs,
        torch.where(wavelen > low_freq_wavelen, freqs / scale_factor, blended),
    )


def precompute_freqs_cis(
    dim: int,
    end: int,
    theta: float = 10000.0,
    use_scaled: bool = False,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """[end, dim / 2] complex64: position t's rotation of pair j."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    if use_scaled:
        freqs = apply_scaling(freqs)
    t = torch.arange(end, device=freqs.device, dtype=torch.float32)
    angles = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(angles), angles)


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """freqs_cis [seq, dim / 2] viewed to broadcast over x [batch, seq, heads, dim / 2]."""
    if freqs_cis.shape != (x.shape[1], x.shape[-1]):
        raise ValueError(
            f"freqs_cis {tuple(freqs_cis.shape)} does not match x's (seq, pairs) "
            f"({x.shape[1]}, {x.shape[-1]})"
        )
    shape = [size if i in (1, x.dim() - 1) else 1 for i, size in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the pairs (x[2j], x[2j+1]) of xq, xk [batch, seq, heads, dim] as complex numbers
    by freqs_cis [seq, dim / 2]."""

    def rotate(x: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
        rotated = torch.view_as_real(pairs * reshape_for_broadcast(freqs_cis, pairs))
        return rotated.flatten(-2).to(x.dtype)

    return rotate(xq), rotate(xk)


class RotaryEmbedding(torch.nn.Module):
    """vLLM's rotary embedding: a float32 cache of cos | sin halves per position, applied to
    the first rotary_dim dimensions of each head; NeoX style rotates (x[j], x[j + rd/2]),
    GPT-J style (x[2j], x[2j+1])."""

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        is_neox_style: bool,
        dtype: torch.dtype,
        device: str = "cuda",
    ) -> None:
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.is_neox_style = is_neox_style
        self.dtype = dtype
        self.device = device
        inv_freq = 1.0 / (
            base
            ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim)
        )
        t = torch.arange(max_position_embeddings, dtype=torch.float32, device=device)
        angles = torch.outer(t, inv_freq)
        # float32 as FlashInfer's cos/sin-cache functions require
        self.cos_sin_cache = torch.cat((angles.cos(), angles.sin()), dim=-1)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        if self.is_neox_style:
            x1, x2 = torch.chunk(xf, 2, dim=-1)
        else:
            x1, x2 = xf[..., ::2], xf[..., 1::2]
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        if self.is_neox_style:
            return torch.cat((o1, o2), dim=-1)
        return torch.stack((o1, o2), dim=-1).flatten(-2)

    def forward_native(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        offsets: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(query, key) rotated at `positions` (+ offsets); query [nnz, heads * head_size] or
        [nnz, heads, head_size], key likewise; returned in their shapes and dtypes."""
        if offsets is not None:
            positions = positions + offsets
        positions = positions.flatten()
        nnz = positions.shape[0]
        cos, sin = self.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [nnz, 1, rotary_dim / 2]

        def apply(x: torch.Tensor) -> torch.Tensor:
            heads = x.reshape(nnz, -1, self.head_size)
            rot = self._rotate(heads[..., : self.rotary_dim], cos, sin)
            out = torch.cat((rot, heads[..., self.rotary_dim :].float()), dim=-1)
            return out.reshape(x.shape).to(x.dtype)

        return apply(query), apply(key)

    def forward(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        offsets: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_native(positions, query, key, offsets)

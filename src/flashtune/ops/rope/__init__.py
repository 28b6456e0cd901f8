"""Rotary position embedding (RoPE) for queries and keys, FlashInfer's API.

- `apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox)`:
  cos/sin looked up per token from a [max_pos, rotary_dim] fp32 cache (cos | sin halves),
  as in vLLM/SGLang; rotary_dim = cos_sin_cache.shape[-1] may be smaller than head_size.
- `apply_rope(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta)`: a
  ragged batch; token i of request b sits at position offsets[b] + i - indptr[b], and cos/sin
  are computed in the kernel: angle_j = pos / rope_scale * rope_theta ** (-2j / rotary_dim).
- `apply_rope_pos_ids(q, k, pos_ids, ...)`: the same with explicit positions.
- `apply_llama31_rope(...)` / `apply_llama31_rope_pos_ids(...)`: the same with Llama 3.1's
  frequency scaling (low_freq_factor, high_freq_factor, old_context_len; FlashInfer's
  defaults rope_scale=8, rope_theta=5e5).

Styles: NeoX (is_neox=True / interleave=False) rotates the pairs (x[j], x[j + rd/2]);
GPT-J (is_neox=False / interleave=True) rotates (x[2j], x[2j + 1]). Dimensions past
rotary_dim pass through unchanged. Math in fp32, results cast to the input dtype.

`mla_rope_quantize_fp8` (FlashInfer's `flashinfer.rope`, not its top level): RoPE on MLA's
rotary parts, then every part scaled and cast to fp8.

Layout: reference.py (the references in PyTorch), schema.py (the cos/sin-cache schemas and
the model examples), kernels.py (the one Triton kernel serving every form), config.py (its
tactics and the default), launch.py (launching, the autotuner's runner, validation, the
torch custom ops), mla.py (`mla_rope_quantize_fp8`). This module holds the public functions
only.
"""

from __future__ import annotations

import torch

from flashtune.flashinfer_names import SUBMODULE_ONLY, TOP_LEVEL
from flashtune.ops.rope.launch import _pos_ids, _ragged, _rope_cache
from flashtune.ops.rope.mla import mla_rope_quantize_fp8  # noqa: F401  (re-exported: __all__)
from flashtune.ops.rope.schema import ROPE_GPTJ, ROPE_NEOX, _rope_cache_schema
from flashtune.schema import api

# FlashInfer's names (flashtune.flashinfer_names): its top level's, and flashinfer.rope's own
__all__ = [*TOP_LEVEL["rope"], *SUBMODULE_ONLY["rope"]]


@api(schema=_rope_cache_schema, schemas=[ROPE_NEOX, ROPE_GPTJ])
def apply_rope_with_cos_sin_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE from a precomputed cache; returns (query_out, key_out).

    positions: [nnz] int; query: [nnz, Hq * head_size] or [nnz, Hq, head_size]; key likewise;
    cos_sin_cache: [max_seq_len, rotary_dim] float32, cos in the first half, sin in the
    second. Only the first rotary_dim dimensions of each head rotate.
    """
    return _rope_cache(positions, query, key, head_size, cos_sin_cache, is_neox, False)


@api(schema=_rope_cache_schema, schemas=[ROPE_NEOX, ROPE_GPTJ])
def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    """In-place form of `apply_rope_with_cos_sin_cache`."""
    _rope_cache(positions, query, key, head_size, cos_sin_cache, is_neox, True)


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE over a ragged batch, cos/sin computed in the kernel; returns (q_rope, k_rope).

    q: [nnz, Hq, D], k: [nnz, Hk, D]; indptr: [batch + 1] (request b owns rows
    indptr[b]:indptr[b+1]); offsets: [batch], the position of each request's first row.
    """
    return _ragged(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, False)


def apply_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """In-place form of `apply_rope`."""
    _ragged(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, True)


def apply_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE with explicit per-token positions pos_ids [nnz]; returns (q_rope, k_rope)."""
    return _pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, False)


def apply_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """In-place form of `apply_rope_pos_ids`."""
    _pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, True)


def apply_llama31_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`apply_rope` with Llama 3.1's frequency scaling: wavelengths shorter than
    old_context_len / high_freq_factor keep their frequency, longer than
    old_context_len / low_freq_factor are divided by rope_scale, a linear blend between (the
    positions themselves are not divided). Returns (q_rope, k_rope)."""
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    return _ragged(
        q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, False, llama31
    )


def apply_llama31_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """In-place form of `apply_llama31_rope`."""
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    _ragged(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, True, llama31)


def apply_llama31_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`apply_rope_pos_ids` with Llama 3.1's frequency scaling (see `apply_llama31_rope`)."""
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    return _pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, False, llama31)


def apply_llama31_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """In-place form of `apply_llama31_rope_pos_ids`."""
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    _pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, True, llama31)

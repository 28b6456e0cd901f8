"""FlashInfer's `mla_rope_quantize_fp8`: RoPE on the rotary part of MLA's queries and keys,
then every part (rotary and not) scaled and cast to fp8, as DeepSeek's attention stores them.

Not fused: the RoPE kernel (kernels.py, through launch.py) writes the rotated parts in fp32,
then PyTorch scales and casts each part. FlashInfer's one kernel computes the same values
(rotation in fp32, x * scale, one cast to fp8). The reference: reference.mla_rope_quantize_ref.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.ops.call import FLOATS, check_tensor
from flashtune.ops.rope.launch import RopeArgs, _run_rope

__all__ = ["mla_rope_quantize_fp8"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _check(name: str, t: Any, dim: tuple[int, ...]) -> None:
    check_tensor(name, t, FLOATS, contiguous=True)
    if t.dim() not in dim:
        raise ValueError(f"{name} must have {' or '.join(map(str, dim))} dimensions, got {t.dim()}")


def _output(name: str, given: Any, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if given is None:
        return torch.empty(like.shape, dtype=dtype, device=like.device)
    if not isinstance(given, torch.Tensor) or given.shape != like.shape or given.dtype != dtype:
        raise ValueError(
            f"{name} must be a {dtype} tensor of shape {tuple(like.shape)}, got "
            f"{getattr(given, 'dtype', type(given).__name__)} {tuple(getattr(given, 'shape', ()))}"
        )
    return given


def mla_rope_quantize_fp8(
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q_nope: torch.Tensor,
    k_nope: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    pos_ids: torch.Tensor,
    is_neox: bool = True,
    quantize_dtype: torch.dtype | None = None,
    quant_scale_q: float = 1.0,
    quant_scale_kv: float = 1.0,
    q_rope_out: torch.Tensor | None = None,
    k_rope_out: torch.Tensor | None = None,
    q_nope_out: torch.Tensor | None = None,
    k_nope_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """RoPE on q_rope [nnz, H, rd] and k_rope [nnz, rd] (or [nnz, Hk, rd]) from
    cos_sin_cache [max_pos, rd] (float32, cos | sin) at pos_ids [nnz], then all four parts
    times their scale (quant_scale_q for q, quant_scale_kv for k) cast to fp8: quantize_dtype,
    else the first given output's dtype, else e4m3. Returns the four outputs (given ones
    filled in place)."""
    for name, t, dims in (
        ("q_rope", q_rope, (3,)),
        ("k_rope", k_rope, (2, 3)),
        ("q_nope", q_nope, (3,)),
        ("k_nope", k_nope, (2, 3)),
    ):
        _check(name, t, dims)
    if not isinstance(cos_sin_cache, torch.Tensor) or cos_sin_cache.dtype != torch.float32:
        raise ValueError("cos_sin_cache should be float32")
    nnz = q_rope.shape[0]
    if not isinstance(pos_ids, torch.Tensor) or pos_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError("pos_ids must be an int32 or int64 tensor")
    if pos_ids.shape != (nnz,) or any(t.shape[0] != nnz for t in (k_rope, q_nope, k_nope)):
        raise ValueError(f"pos_ids and every input must have q_rope's {nnz} tokens first")
    rd = cos_sin_cache.shape[-1]
    if q_rope.shape[-1] != rd or k_rope.shape[-1] != rd:
        raise ValueError(
            f"q_rope and k_rope must have the cache's rotary dimension {rd} last, got "
            f"{q_rope.shape[-1]} and {k_rope.shape[-1]}"
        )
    outs = (q_rope_out, k_rope_out, q_nope_out, k_nope_out)
    if quantize_dtype is None:
        quantize_dtype = next((o.dtype for o in outs if o is not None), torch.float8_e4m3fn)
    if quantize_dtype not in _FP8:
        raise TypeError(
            f"quantize_dtype must be float8_e4m3fn or float8_e5m2, got {quantize_dtype}"
        )
    q_rope_out = _output("q_rope_out", q_rope_out, q_rope, quantize_dtype)
    k_rope_out = _output("k_rope_out", k_rope_out, k_rope, quantize_dtype)
    q_nope_out = _output("q_nope_out", q_nope_out, q_nope, quantize_dtype)
    k_nope_out = _output("k_nope_out", k_nope_out, k_nope, quantize_dtype)

    k3 = k_rope if k_rope.dim() == 3 else k_rope.unsqueeze(1)
    q_rot = torch.empty(q_rope.shape, dtype=torch.float32, device=q_rope.device)
    k_rot = torch.empty(k3.shape, dtype=torch.float32, device=k3.device)
    _run_rope(q_rope, k3, q_rot, k_rot, pos_ids, cos_sin_cache, RopeArgs(rd, not is_neox, True))
    q_rope_out.copy_(q_rot.mul_(quant_scale_q))
    k_rope_out.copy_(k_rot.mul_(quant_scale_kv).view(k_rope.shape))
    q_nope_out.copy_(q_nope.float().mul_(quant_scale_q))
    k_nope_out.copy_(k_nope.float().mul_(quant_scale_kv))
    return q_rope_out, k_rope_out, q_nope_out, k_nope_out

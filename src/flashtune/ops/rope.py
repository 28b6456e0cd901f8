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

One Triton kernel (rope_kernels.py) serves every form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from flashtune import platform
from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.model_shapes import ModelConfig
from flashtune.ops.rope_config import RopeTactic
from flashtune.ops.rope_kernels import RopeArgs, launch_rope, llama31_smoothing
from flashtune.schema import Const, OpSchema, Tensor, Var, api
from flashtune.schema.dump import Example, meta_tensor, register_examples
from flashtune.tune import (
    DEFAULT_TACTIC,
    DynamicDim,
    Tactic,
    TunableRunner,
    TuningConfig,
    choose_one,
)

__all__ = [
    *TOP_LEVEL["rope"],  # FlashInfer's names (flashtune.flashinfer_names)
    "run_rope",
    "rope_with_cos_sin_cache_ref",
    "apply_rope_ref",
    "apply_llama31_rope_ref",
    "llama31_inv_freq",
    "ROPE_NEOX",
    "ROPE_GPTJ",
    "RopeTactic",
    "RopeArgs",
    "RopeRunner",
    "ROPE_TUNING",
    "rope_examples",
]

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ----------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Schemas of the cos/sin-cache form (equal to the corpus file
# rope_with_cos_sin_cache_neox_style_d128_rd64.json in name, axes, inputs and outputs). They
# bind q/k as [num_tokens, num_heads, head_size]: a Definition for a call with 2-D
# [num_tokens, num_heads * head_size] query/key cannot be built (the schema layer has no way to
# split a dimension), so the definition dump skips such calls. The ragged `apply_rope` has no
# schema yet.
# ----------------------------------------------------------------------------------------------


def _rope_schema(style: str, neox: bool) -> OpSchema:
    heads = ["num_tokens", "num_qo_heads", "head_size"]
    kv_heads = ["num_tokens", "num_kv_heads", "head_size"]
    return OpSchema(
        op_type="rope",
        name_prefix=f"rope_with_cos_sin_cache_{style}_style",
        axes={
            "num_tokens": Var("Total number of tokens across all sequences."),
            "num_qo_heads": Var("Number of query heads."),
            "num_kv_heads": Var("Number of KV heads."),
            "head_size": Const("Full head dimension.", abbrev="d", param="head_size"),
            "rotary_dim": Const("Rotated leading dimensions of each head.", abbrev="rd"),
            "max_seq_len": Var("Maximum sequence length for the cos/sin cache."),
        },
        inputs={
            "q": Tensor(heads, dtype_from="query", param="query"),
            "k": Tensor(kv_heads, dtype_from="query", param="key"),
            "cos_sin_cache": Tensor(["max_seq_len", "rotary_dim"], dtype="float32"),
            "positions": Tensor(["num_tokens"], dtype="int64"),
        },
        outputs={
            "q_out": Tensor(heads, dtype_from="query"),
            "k_out": Tensor(kv_heads, dtype_from="query"),
        },
        reference=rope_with_cos_sin_cache_ref,
        bound=("head_size", "is_neox"),
        tags=["fi_api:flashinfer.rope.apply_rope_with_cos_sin_cache_inplace"],
        description=(
            "Rotary position embedding with a precomputed cos/sin cache (cos | sin halves of "
            "rotary_dim), "
            + (
                "NeoX style: pairs (x[j], x[j + rd/2])."
                if neox
                else "GPT-J style: pairs (x[2j], x[2j+1])."
            )
            + " Dimensions past rotary_dim pass through."
        ),
    )


ROPE_NEOX = _rope_schema("neox", True)
ROPE_GPTJ = _rope_schema("gptj", False)


def _rope_cache_schema(
    positions: Any, query: Any, key: Any, head_size: Any, cos_sin_cache: Any, is_neox: bool = True
) -> OpSchema:
    return ROPE_NEOX if is_neox else ROPE_GPTJ


# ----------------------------------------------------------------------------------------------
# Runner and tactics
# ----------------------------------------------------------------------------------------------


class RopeRunner(TunableRunner):
    """The Triton RoPE kernel. inputs: [q, k, q_out, k_out, pos, cos_sin_cache | None, args],
    tensors as [nnz, H, D] views."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        q, k = inputs[0], inputs[1]
        return list(RopeTactic.space(max(q.shape[1], k.shape[1]), q.shape[2]))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        q, k, q_out, k_out, pos, cache, args = inputs
        launch_rope(q, k, q_out, k_out, pos, cache, args, tactic)
        return q_out, k_out


_RUNNERS: tuple[TunableRunner, ...] = (RopeRunner(),)
ROPE_TUNING = TuningConfig(dynamic_dims=(DynamicDim(input_idx=0, dim=0),))


# ----------------------------------------------------------------------------------------------
# Validation and execution
# ----------------------------------------------------------------------------------------------


def _check_float(name: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension, got strides {tuple(t.stride())}"
        )


def _check_index(name: str, t: Any, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q/query is on {device}")


def _heads_view(name: str, t: torch.Tensor, head_size: int) -> torch.Tensor:
    """[nnz, H, D] view of a [nnz, H * D] or [nnz, H, D] tensor."""
    if t.dim() == 3:
        if t.shape[-1] != head_size:
            raise ValueError(
                f"{name} has head dimension {t.shape[-1]}, expected head_size={head_size}"
            )
        return t
    if t.dim() == 2:
        if t.shape[1] % head_size != 0:
            raise ValueError(
                f"{name} [nnz, num_heads * head_size] has {t.shape[1]} columns, not a multiple "
                f"of head_size={head_size}"
            )
        return t.view(t.shape[0], t.shape[1] // head_size, head_size)
    raise ValueError(
        f"{name} must be [nnz, num_heads * head_size] or [nnz, num_heads, head_size], got "
        f"shape {tuple(t.shape)}"
    )


def _validate_qk(q: Any, k: Any, qname: str, kname: str) -> None:
    _check_float(qname, q)
    _check_float(kname, k)
    if k.dtype != q.dtype:
        raise TypeError(f"{kname} must have dtype {q.dtype} (as {qname}), got {k.dtype}")
    if k.device != q.device:
        raise ValueError(f"{kname} is on {k.device} but {qname} is on {q.device}")
    if k.shape[0] != q.shape[0]:
        raise ValueError(
            f"{qname} and {kname} must have the same number of tokens, got {q.shape[0]} and "
            f"{k.shape[0]}"
        )


def run_rope(
    q3: torch.Tensor,
    k3: torch.Tensor,
    qo3: torch.Tensor,
    ko3: torch.Tensor,
    pos: torch.Tensor,
    cache: torch.Tensor | None,
    args: RopeArgs,
) -> None:
    """Rotate q3/k3 into qo3/ko3: [nnz, H, D] views with a contiguous last dimension, inputs
    validated by the caller. The outputs may alias the inputs, or have another float dtype
    (the kernel casts on store)."""
    if not platform.kernels_available(q3.device):
        if args.from_cache:
            qr, kr = rope_with_cos_sin_cache_ref(q3, k3, cache, pos, is_neox=not args.interleave)
        else:
            qr, kr = _pos_ids_ref(q3, k3, pos, args)
        qo3.copy_(qr)
        ko3.copy_(kr)
        return
    inputs = [q3, k3, qo3, ko3, pos, cache, args]
    runner, tactic = choose_one("flashtune::rope", _RUNNERS, ROPE_TUNING, inputs)
    runner.forward(inputs, tactic)


def _pos_ids_ref(q3, k3, pos, args: RopeArgs):
    # The kernel's frequencies (rope_kernels.py), computed in plain PyTorch.
    inv_freq = _inv_freq_ref(args.rotary_dim, args.rope_theta, q3.device)
    smooth = (inv_freq * args.smooth_a + args.smooth_b).clamp(0.0, 1.0)
    inv_freq = (1 - smooth) * inv_freq / args.rope_scale + smooth * inv_freq
    return _rotate_ref(q3, k3, pos, inv_freq, args.interleave)


def _rope_cache_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
) -> None:
    args = RopeArgs(cos_sin_cache.shape[-1], not is_neox, True)
    run_rope(
        _heads_view("query", q, head_size),
        _heads_view("key", k, head_size),
        _heads_view("query", q_out, head_size),
        _heads_view("key", k_out, head_size),
        positions,
        cos_sin_cache,
        args,
    )


# torch.compile traces through the custom op; eager calls skip it: the dispatcher boundary
# costs 18-21 us of host time per call (H200 machine, bench_norm.py "custom_op_overhead" rows).
_rope_cache_op = torch.library.custom_op(
    "flashtune::rope_cos_sin_cache", _rope_cache_impl, mutates_args=("q_out", "k_out")
)


@_rope_cache_op.register_fake
def _(q, k, q_out, k_out, positions, cos_sin_cache, head_size, is_neox) -> None:
    return None


@torch.library.custom_op("flashtune::rope_pos_ids", mutates_args=("q_out", "k_out"))
def _rope_pos_op(
    q: torch.Tensor,
    k: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int,
    interleave: bool,
    rope_scale: float,
    rope_theta: float,
    smooth_a: float,
    smooth_b: float,
) -> None:
    args = RopeArgs(rotary_dim, interleave, False, rope_scale, rope_theta, smooth_a, smooth_b)
    run_rope(q, k, q_out, k_out, pos_ids, None, args)


@_rope_pos_op.register_fake
def _(
    q, k, q_out, k_out, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, smooth_a, smooth_b
) -> None:
    return None


def _validate_cache(positions, query, key, head_size, cos_sin_cache) -> None:
    _validate_qk(query, key, "query", "key")
    if not isinstance(head_size, int) or head_size <= 0:
        raise ValueError(f"head_size must be a positive int, got {head_size!r}")
    _heads_view("query", query, head_size)
    _heads_view("key", key, head_size)
    _check_index("positions", positions, query.device)
    if positions.shape[0] != query.shape[0]:
        raise ValueError(
            f"positions must have one entry per token ({query.shape[0]}), got {positions.shape[0]}"
        )
    if not isinstance(cos_sin_cache, torch.Tensor):
        raise TypeError(f"cos_sin_cache must be a torch.Tensor, got {type(cos_sin_cache)}")
    if cos_sin_cache.dtype != torch.float32:
        raise TypeError(f"cos_sin_cache must be float32, got {cos_sin_cache.dtype}")
    if cos_sin_cache.device != query.device:
        raise ValueError(
            f"cos_sin_cache is on {cos_sin_cache.device} but query is on {query.device}"
        )
    if cos_sin_cache.dim() != 2 or cos_sin_cache.stride(-1) != 1:
        raise ValueError(
            "cos_sin_cache must be 2-D [max_seq_len, rotary_dim] with a contiguous last "
            f"dimension, got shape {tuple(cos_sin_cache.shape)}"
        )
    rd = cos_sin_cache.shape[1]
    if rd % 2 != 0 or rd == 0 or rd > head_size:
        raise ValueError(
            f"cos_sin_cache's rotary_dim (last dimension) must be even and <= head_size="
            f"{head_size}, got {rd}"
        )
    if positions.device.type == "cpu" and positions.numel() and not torch.compiler.is_compiling():
        # Cheap on CPU; on a GPU it would cost a sync, and the kernel masks stray positions.
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= cos_sin_cache.shape[0]:
            raise ValueError(
                f"positions must lie in [0, {cos_sin_cache.shape[0]}) (cos_sin_cache rows), "
                f"got range [{lo}, {hi}]"
            )


def _outputs(q: torch.Tensor, k: torch.Tensor, inplace: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the rotated q and k go: q and k themselves, or new contiguous tensors."""
    if inplace:
        return q, k
    fresh = torch.contiguous_format
    return torch.empty_like(q, memory_format=fresh), torch.empty_like(k, memory_format=fresh)


def _rope_cache(positions, query, key, head_size, cos_sin_cache, is_neox, inplace):
    _validate_cache(positions, query, key, head_size, cos_sin_cache)
    q_out, k_out = _outputs(query, key, inplace)
    if torch.compiler.is_compiling():
        _rope_cache_op(query, key, q_out, k_out, positions, cos_sin_cache, head_size, is_neox)
    else:
        _rope_cache_impl(query, key, q_out, k_out, positions, cos_sin_cache, head_size, is_neox)
    return q_out, k_out


def _validate_ragged(q, k, rotary_dim) -> int:
    _validate_qk(q, k, "q", "k")
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 3:
            raise ValueError(
                f"{name} must be [nnz, num_heads, head_dim], got shape {tuple(t.shape)}"
            )
    d = q.shape[-1]
    if k.shape[-1] != d:
        raise ValueError(f"k must have head_dim {d} (as q), got {k.shape[-1]}")
    rd = d if rotary_dim is None else rotary_dim
    if not isinstance(rd, int) or rd <= 0 or rd % 2 != 0 or rd > d:
        raise ValueError(f"rotary_dim must be an even int in (0, head_dim={d}], got {rd!r}")
    return rd


def _positions_from_ragged(indptr: torch.Tensor, offsets: torch.Tensor, nnz: int) -> torch.Tensor:
    counts = indptr[1:] - indptr[:-1]
    # output_size keeps repeat_interleave from syncing with the device to size its result.
    start = torch.repeat_interleave((indptr[:-1] - offsets).long(), counts, output_size=nnz)
    return torch.arange(nnz, device=indptr.device) - start


def _rope_pos(q, k, pos, args: RopeArgs, inplace):
    q_out, k_out = _outputs(q, k, inplace)
    if torch.compiler.is_compiling():
        _rope_pos_op(
            q,
            k,
            q_out,
            k_out,
            pos,
            args.rotary_dim,
            args.interleave,
            args.rope_scale,
            args.rope_theta,
            args.smooth_a,
            args.smooth_b,
        )
    else:
        run_rope(q, k, q_out, k_out, pos, None, args)
    return q_out, k_out


# (low_freq_factor, high_freq_factor, old_context_len) of a Llama 3.1 call
Llama31 = tuple[float, float, float]


def _freq_args(rd, interleave, rope_scale, rope_theta, llama31: Llama31 | None) -> RopeArgs:
    smooth = (0.0, 0.0) if llama31 is None else llama31_smoothing(*map(float, llama31))
    return RopeArgs(rd, bool(interleave), False, float(rope_scale), float(rope_theta), *smooth)


def _ragged(
    q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, inplace, llama31=None
):
    rd = _validate_ragged(q, k, rotary_dim)
    _check_index("indptr", indptr, q.device)
    _check_index("offsets", offsets, q.device)
    if indptr.shape[0] != offsets.shape[0] + 1:
        raise ValueError(
            f"indptr must have batch_size + 1 = {offsets.shape[0] + 1} entries (offsets has "
            f"{offsets.shape[0]}), got {indptr.shape[0]}"
        )
    if (
        indptr.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and int(indptr[-1]) != q.shape[0]
    ):
        raise ValueError(f"indptr[-1] must equal nnz={q.shape[0]}, got {int(indptr[-1])}")
    pos = _positions_from_ragged(indptr, offsets, q.shape[0])
    args = _freq_args(rd, interleave, rope_scale, rope_theta, llama31)
    return _rope_pos(q, k, pos, args, inplace)


def _pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, inplace, llama31=None):
    rd = _validate_ragged(q, k, rotary_dim)
    _check_index("pos_ids", pos_ids, q.device)
    if pos_ids.shape[0] != q.shape[0]:
        raise ValueError(f"pos_ids must have nnz={q.shape[0]} entries, got {pos_ids.shape[0]}")
    args = _freq_args(rd, interleave, rope_scale, rope_theta, llama31)
    return _rope_pos(q, k, pos_ids, args, inplace)


# ----------------------------------------------------------------------------------------------
# Public API (FlashInfer names and signatures)
# ----------------------------------------------------------------------------------------------


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


@register_examples
def rope_examples(model: ModelConfig) -> list[Example]:
    """RoPE over the model's heads (bf16, one token, full rotary dimension), NeoX style as the
    Llama/Qwen models use it; GPT-J style at the same shape so each schema has an example."""
    d = model.head_dim
    q = meta_tensor(1, model.num_qo_heads, d)
    k = meta_tensor(1, model.num_kv_heads, d)
    cache = meta_tensor(4096, d, dtype=torch.float32)
    pos = meta_tensor(1, dtype=torch.int64)
    return [
        (apply_rope_with_cos_sin_cache_inplace, (pos, q, k, d, cache), {"is_neox": neox})
        for neox in (True, False)
    ]

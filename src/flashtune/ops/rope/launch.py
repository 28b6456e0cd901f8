"""Host side of RoPE: the kernel's launch and its arguments, the autotuner's runner, input
validation, the CPU path (the references) and the torch custom ops that torch.compile traces
through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import triton

from flashtune.ops.call import (
    FLOATS,
    KernelOp,
    SchemaChecks,
    check_tensor,
    field_index,
    inputs_of,
    named,
    traced,
)
from flashtune.ops.rope.config import RopeTactic, default_tactic
from flashtune.ops.rope.kernels import _rope_kernel
from flashtune.ops.rope.reference import _inv_freq_ref, _rotate_ref, rope_with_cos_sin_cache_ref
from flashtune.ops.rope.schema import ROPE_GPTJ, ROPE_NEOX
from flashtune.tune import (
    DEFAULT_TACTIC,
    DynamicDim,
    Tactic,
    TunableRunner,
    TuningConfig,
)

__all__ = ["RopeArgs", "RopeInputs", "llama31_smoothing", "RopeRunner", "ROPE_TUNING"]


@dataclass(frozen=True)
class RopeArgs:
    """Everything but the tensors: how cos/sin are obtained and which pairs rotate.
    smooth_a/smooth_b: the frequency blend of kernels.py's docstring (0, 0: plain RoPE)."""

    rotary_dim: int
    interleave: bool
    from_cache: bool
    rope_scale: float = 1.0
    rope_theta: float = 1e4
    smooth_a: float = 0.0
    smooth_b: float = 0.0


def llama31_smoothing(
    low_freq_factor: float, high_freq_factor: float, old_context_len: float
) -> tuple[float, float]:
    """(smooth_a, smooth_b) of Llama 3.1's frequency scaling, as FlashInfer computes them:
    s = f * old_context_len / (2 pi (high - low)) - low / (high - low), clamped to [0, 1]."""
    if high_freq_factor <= low_freq_factor or low_freq_factor <= 0:
        raise ValueError(
            "high_freq_factor must exceed low_freq_factor > 0, got "
            f"low_freq_factor={low_freq_factor}, high_freq_factor={high_freq_factor}"
        )
    smooth_a = old_context_len / (2 * math.pi * high_freq_factor - 2 * math.pi * low_freq_factor)
    smooth_b = -1.0 / (high_freq_factor / low_freq_factor - 1.0)
    return smooth_a, smooth_b


def _launch_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    pos: torch.Tensor,
    cos_sin_cache: torch.Tensor | None,
    args: RopeArgs,
    tactic: Tactic,
) -> None:
    """Rotate q, k into q_out, k_out: [nnz, H, D] views (last dim contiguous; the outputs may
    alias the inputs)."""
    nnz, hq, d = q.shape
    hk = k.shape[1]
    if nnz == 0:
        return
    cfg = default_tactic(max(hq, hk), args.rotary_dim) if tactic == DEFAULT_TACTIC else tactic
    assert isinstance(cfg, RopeTactic)
    half = args.rotary_dim // 2
    copy_pass = args.rotary_dim < d and q_out.data_ptr() != q.data_ptr()
    if args.from_cache:
        assert cos_sin_cache is not None
        cs, max_pos, s_cs = cos_sin_cache, cos_sin_cache.shape[0], cos_sin_cache.stride(0)
    else:
        cs, max_pos, s_cs = pos, 0, 0  # any tensor; unused without the cache
    grid = (nnz, triton.cdiv(hq, cfg.block_h) + triton.cdiv(hk, cfg.block_h))
    _rope_kernel[grid](
        q,
        k,
        q_out,
        k_out,
        pos,
        cs,
        hq,
        hk,
        d,
        half,
        max_pos,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        q_out.stride(0),
        q_out.stride(1),
        k_out.stride(0),
        k_out.stride(1),
        s_cs,
        math.log2(args.rope_theta),
        1.0 / args.rope_scale,
        args.smooth_a,
        args.smooth_b,
        BLOCK_H=cfg.block_h,
        BLOCK_HALF=triton.next_power_of_2(max(half, 1)),
        BLOCK_PASS=triton.next_power_of_2(max(d - 2 * half, 1)),
        INTERLEAVE=args.interleave,
        FROM_CACHE=args.from_cache,
        COPY_PASS=copy_pass,
        SMOOTH=args.smooth_a != 0.0 or args.smooth_b != 0.0,
        num_warps=cfg.num_warps,
    )


# ----------------------------------------------------------------------------------------------
# Runner and tactics
# ----------------------------------------------------------------------------------------------


class RopeInputs(NamedTuple):
    """RopeRunner's inputs (all keyed on by the tuner)."""

    q: torch.Tensor  # [nnz, Hq, D] view, last dimension contiguous
    k: torch.Tensor  # [nnz, Hk, D]
    q_out: torch.Tensor  # like q; may alias it, or have another float dtype (cast on store)
    k_out: torch.Tensor  # like k
    pos: torch.Tensor  # [nnz] int32/int64 positions
    cos_sin_cache: torch.Tensor | None  # [max_pos, rotary_dim] fp32 (args.from_cache only)
    args: RopeArgs


class RopeRunner(TunableRunner):
    """The Triton RoPE kernel. inputs: RopeInputs."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        q, k = inputs[0], inputs[1]
        return list(RopeTactic.space(max(q.shape[1], k.shape[1]), q.shape[2]))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        q, k, q_out, k_out, pos, cos_sin_cache, args = named(RopeInputs, inputs)
        _launch_rope(q, k, q_out, k_out, pos, cos_sin_cache, args, tactic)
        return q_out, k_out


_RUNNERS: tuple[TunableRunner, ...] = (RopeRunner(),)
ROPE_TUNING = TuningConfig(
    dynamic_dims=(DynamicDim(input_idx=field_index(RopeInputs, "q"), dim=0),)
)


def _reference(a: RopeInputs) -> None:
    """The CPU path: the references, written into q_out and k_out."""
    if a.args.from_cache:
        qr, kr = rope_with_cos_sin_cache_ref(
            a.q, a.k, a.cos_sin_cache, a.pos, is_neox=not a.args.interleave
        )
    else:
        qr, kr = _pos_ids_ref(a.q, a.k, a.pos, a.args)
    a.q_out.copy_(qr)
    a.k_out.copy_(kr)


_ROPE = KernelOp("flashtune::rope", _RUNNERS, ROPE_TUNING, _reference)


# ----------------------------------------------------------------------------------------------
# Validation and execution
# ----------------------------------------------------------------------------------------------


def _check_index(name: str, t: Any, device: torch.device) -> None:
    check_tensor(name, t, (torch.int32, torch.int64), device, "q")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")


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


def _check_tokens(q: torch.Tensor, k: torch.Tensor, qname: str, kname: str) -> None:
    if k.shape[0] != q.shape[0]:
        raise ValueError(
            f"{qname} and {kname} must have the same number of tokens, got {q.shape[0]} and "
            f"{k.shape[0]}"
        )


def _run_rope(
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
    _ROPE(inputs_of(RopeInputs, (q3, k3, qo3, ko3, pos, cache, args)))


def _pos_ids_ref(q3, k3, pos, args: RopeArgs):
    # The kernel's frequencies (kernels.py), computed in plain PyTorch.
    inv_freq = _inv_freq_ref(args.rotary_dim, args.rope_theta, q3.device)
    smooth = (inv_freq * args.smooth_a + args.smooth_b).clamp(0.0, 1.0)
    inv_freq = (1 - smooth) * inv_freq / args.rope_scale + smooth * inv_freq
    return _rotate_ref(q3, k3, pos, inv_freq, args.interleave)


@traced("rope_cos_sin_cache", mutates=("q_out", "k_out"))
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
    _run_rope(
        _heads_view("query", q, head_size),
        _heads_view("key", k, head_size),
        _heads_view("query", q_out, head_size),
        _heads_view("key", k_out, head_size),
        positions,
        cos_sin_cache,
        args,
    )


def _rope_pos_fields(
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
    """The custom op's body: RopeArgs spelled out (a custom op takes no Python objects)."""
    args = RopeArgs(rotary_dim, interleave, False, rope_scale, rope_theta, smooth_a, smooth_b)
    _run_rope(q, k, q_out, k_out, pos_ids, None, args)


def _spell(q, k, q_out, k_out, pos_ids, args: RopeArgs) -> tuple[Any, ...]:
    """_rope_pos_into's arguments as _rope_pos_fields takes them."""
    a = args
    fields = (a.rotary_dim, a.interleave, a.rope_scale, a.rope_theta, a.smooth_a, a.smooth_b)
    return (q, k, q_out, k_out, pos_ids, *fields)


@traced("rope_pos_ids", mutates=("q_out", "k_out"), spelled=(_rope_pos_fields, _spell))
def _rope_pos_into(
    q: torch.Tensor,
    k: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    pos_ids: torch.Tensor,
    args: RopeArgs,
) -> None:
    _run_rope(q, k, q_out, k_out, pos_ids, None, args)


def _check_cache_call(arguments: Mapping[str, Any]) -> None:
    """What the schemas cannot say: query/key as [nnz, H * D] or [nnz, H, D] for head_size,
    the rotary dimension, and (on a CPU) the positions' range."""
    query, key, head_size = arguments["query"], arguments["key"], arguments["head_size"]
    positions, cos_sin_cache = arguments["positions"], arguments["cos_sin_cache"]
    _check_tokens(query, key, "query", "key")
    if not isinstance(head_size, int) or head_size <= 0:
        raise ValueError(f"head_size must be a positive int, got {head_size!r}")
    _heads_view("query", query, head_size)
    _heads_view("key", key, head_size)
    if positions.shape[0] != query.shape[0]:
        raise ValueError(
            f"positions must have one entry per token ({query.shape[0]}), got {positions.shape[0]}"
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


# q/k: [nnz, H * D] or [nnz, H, D] (read by the hook), float16/bfloat16/float32, k in q's
# dtype; cos_sin_cache float32 [max_seq_len, rotary_dim]; positions int32 or int64 [nnz].
_CHECK_CACHE = {
    is_neox: SchemaChecks(
        schema,
        dtypes={"q": FLOATS, "positions": (torch.int32, torch.int64)},
        ranks={"q": (2, 3), "k": (2, 3)},
        unbound=("q", "k"),
        contiguous=("q", "k", "cos_sin_cache"),
        check=_check_cache_call,
    )
    for is_neox, schema in ((True, ROPE_NEOX), (False, ROPE_GPTJ))
}


def _outputs(q: torch.Tensor, k: torch.Tensor, inplace: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the rotated q and k go: q and k themselves, or new contiguous tensors."""
    if inplace:
        return q, k
    fresh = torch.contiguous_format
    return torch.empty_like(q, memory_format=fresh), torch.empty_like(k, memory_format=fresh)


def _rope_cache(positions, query, key, head_size, cos_sin_cache, is_neox, inplace):
    arguments = {
        "query": query,
        "key": key,
        "cos_sin_cache": cos_sin_cache,
        "positions": positions,
        "head_size": head_size,
    }
    _CHECK_CACHE[bool(is_neox)].validate(arguments)
    q_out, k_out = _outputs(query, key, inplace)
    _rope_cache_impl(query, key, q_out, k_out, positions, cos_sin_cache, head_size, is_neox)
    return q_out, k_out


def _validate_ragged(q, k, rotary_dim) -> int:
    # The ragged forms have no schema yet (see schema.py): their checks are written here.
    check_tensor("q", q, FLOATS, contiguous=True)
    check_tensor("k", k, FLOATS, q.device, "q", contiguous=True)
    if k.dtype != q.dtype:
        raise TypeError(f"k must have dtype {q.dtype} (as q), got {k.dtype}")
    _check_tokens(q, k, "q", "k")
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
    _rope_pos_into(q, k, q_out, k_out, pos, args)
    return q_out, k_out


# (low_freq_factor, high_freq_factor, old_context_len) of a Llama 3.1 call
_Llama31 = tuple[float, float, float]


def _freq_args(rd, interleave, rope_scale, rope_theta, llama31: _Llama31 | None) -> RopeArgs:
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

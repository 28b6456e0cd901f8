"""Rotary position encoding inside the attention kernels (FlashInfer's pos_encoding_mode
"ROPE_LLAMA"): the Llama rotation of halves, applied to q and k as they are loaded.

Conventions (FlashInfer's): dimension i < D/2 pairs with i + D/2; the frequency of pair i is
theta^(-2i / D) / rope_scale; a key sits at its position in the request's KV (0-based), a
query at kv_len - qo_len + its index (the last qo_len positions). The rotation runs in fp32
and the result is rounded to q's dtype before the MMA, as FlashInfer rotates its fp16/bf16
tiles in shared memory. Paged decode at a power-of-two head_dim rotates by relative
position instead (decode.kernels.decode_item): K by its offset in a block from
`rope_table`, in q's dtype as packed FMAs, and q in fp32.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from flashtune import platform

__all__ = [
    "load_rotated",
    "rope_frequencies",
    "rotate_by",
    "rotate_halves",
    "ROPE_TABLE_ROWS",
    "rope_table",
    "rotation_table",
    "rope_arguments",
    "rope_for",
    "DEFAULT_ROPE_THETA",
]

DEFAULT_ROPE_THETA = 1e4

# sin/cos of the rotation angles, one pair per K element of every tile. libdevice's accurate
# sinf/cosf keep a slow path (Payne-Hanek, with a local-memory table) for huge arguments;
# in the decode loop that made fused RoPE 5-15x slower than plain decode on an H100
# (bench_decode.py --only variants). On a GPU the angle is first reduced to [-pi, pi]
# (Cody-Waite, 2*pi split so that k * _TWO_PI_HI is exact for k < 2^16), then the SFU's
# approximations (sin.approx / cos.approx: about 2^-21 absolute error there) take it. The
# interpreter has no libdevice: it keeps tl.sin / tl.cos.
_FAST_TRIG = tl.constexpr(not platform.triton_interpret())
_INV_TWO_PI = tl.constexpr(1.0 / (2.0 * math.pi))
_TWO_PI_HI = tl.constexpr(6.28125)  # 2*pi to 8 significant bits
_TWO_PI_LO = tl.constexpr(2.0 * math.pi - 6.28125)


def rope_arguments(rope_scale: float | None, rope_theta: float | None) -> tuple[float, float]:
    """The kernel's (rope_rcp_scale, rope_log2_theta) from FlashInfer's plan arguments."""
    scale = 1.0 if rope_scale is None else float(rope_scale)
    theta = DEFAULT_ROPE_THETA if rope_theta is None else float(rope_theta)
    if not scale > 0 or not theta > 0:
        raise ValueError(f"rope_scale and rope_theta must be > 0, got {scale} and {theta}")
    return 1.0 / scale, math.log2(theta)


def rope_for(
    pos_encoding_mode: str, rope_scale: float | None, rope_theta: float | None
) -> tuple[float, float] | None:
    """A plan's (rope_scale, rope_theta) for FlashInfer's pos_encoding_mode (None: no RoPE);
    modes the kernels do not have raise."""
    if pos_encoding_mode == "NONE":
        return None
    if pos_encoding_mode != "ROPE_LLAMA":
        raise NotImplementedError(
            f"pos_encoding_mode={pos_encoding_mode!r} is not supported here: flashtune's "
            "attention kernels have 'NONE' and 'ROPE_LLAMA', and 'ALIBI' in the prefill "
            "wrappers and single_prefill_with_kv_cache only"
        )
    rope = (
        1.0 if rope_scale is None else float(rope_scale),
        DEFAULT_ROPE_THETA if rope_theta is None else float(rope_theta),
    )
    rope_arguments(*rope)  # validates
    return rope


# Rows of `rope_table`: the offsets 0..127 of a KV block (BLOCK_N <= 128) and the rotation of
# a whole block (row BLOCK_N).
ROPE_TABLE_ROWS = 129


def rope_table(
    head_dim: int,
    rope: tuple[float, float],
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """cos and sin of j * freq_i for every row j < ROPE_TABLE_ROWS and pair i < head_dim / 2,
    [2, ROPE_TABLE_ROWS, head_dim // 2], computed in float64 and rounded to `dtype` (rope:
    (rope_scale, rope_theta)). The decode kernel rotates K rows by their offset in a block
    with it (in q's dtype: packed FMAs take it as loaded), and q by a whole block each block
    (fp32; decode.kernels.decode_item). One tensor per setting, device and dtype, kept: a
    plan's kernel launches (CUDA graphs included) read it by address."""
    key = (head_dim, float(rope[0]), float(rope[1]), str(torch.device(device)), dtype)
    return _rope_table(*key)


@functools.lru_cache(maxsize=64)
def _rope_table(
    head_dim: int, scale: float, theta: float, device: str, dtype: torch.dtype
) -> torch.Tensor:
    pair = torch.arange(head_dim // 2, dtype=torch.float64)
    freq = theta ** (-2.0 * pair / head_dim) / scale
    angle = torch.arange(ROPE_TABLE_ROWS, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.stack([angle.cos(), angle.sin()]).to(dtype).to(device)


@triton.jit
def _cos_sin(angle):
    if _FAST_TRIG:
        turns = tl.floor(angle * _INV_TWO_PI + 0.5)
        reduced = (angle - turns * _TWO_PI_HI) - turns * _TWO_PI_LO
        return libdevice.fast_cosf(reduced), libdevice.fast_sinf(reduced)
    else:
        return tl.cos(angle), tl.sin(angle)


@triton.jit
def rope_frequencies(pair, rope_rcp_scale, rope_log2_theta, HEAD_DIM: tl.constexpr):
    """The rotation frequency of each pair index in `pair` (fp32)."""
    return rope_rcp_scale * tl.exp2(-(2.0 * pair.to(tl.float32) / HEAD_DIM) * rope_log2_theta)


@triton.jit
def rotate_by(x1, x2, cos, sin):
    """The halves (x1, x2) rotated by the angles whose cos and sin are given (fp32)."""
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def rotation_table(pos, freq):
    """cos and sin of every (position, pair) angle: pos [R], freq [D/2] -> two [R, D/2]."""
    return _cos_sin(pos.to(tl.float32)[:, None] * freq[None, :])


@triton.jit
def rotate_halves(x1, x2, pos, freq):
    """The two halves of rows rotated at their positions: x1 = columns [0, D/2), x2 = columns
    [D/2, D) ([R, D/2] each), freq from `rope_frequencies` ([D/2]), pos [R]. In fp32.

    Each (pair, row) angle is computed once, where `load_rotated` computes it for both columns
    of the pair: half the sin/cos (SFU work, the cost of fused RoPE in decode) and one load of
    each K element instead of two."""
    cos, sin = rotation_table(pos, freq)
    return rotate_by(x1.to(tl.float32), x2.to(tl.float32), cos, sin)


@triton.jit
def load_rotated(
    row_ptrs,  # [R] pointers to the first element of each row (head_dim contiguous)
    offs_d,  # [BLOCK_D] column offsets (columns >= HEAD_DIM must be masked off)
    mask,  # [R, BLOCK_D]
    pos,  # [R] integer positions
    rope_rcp_scale,
    rope_log2_theta,
    HEAD_DIM: tl.constexpr,
):
    """Rows x [R, BLOCK_D] rotated at their positions, in fp32: the caller rounds to q's
    dtype (an fp8 K is rotated from its fp8 values and rounded to q's dtype, not to fp8).
    Any HEAD_DIM <= BLOCK_D; `rotate_halves` is the cheaper form where HEAD_DIM == BLOCK_D."""
    HALF: tl.constexpr = HEAD_DIM // 2
    x = tl.load(row_ptrs[:, None] + offs_d[None, :], mask=mask, other=0.0)
    partner = (offs_d + HALF) % HEAD_DIM
    xp = tl.load(row_ptrs[:, None] + partner[None, :], mask=mask, other=0.0)
    freq = rope_frequencies(offs_d % HALF, rope_rcp_scale, rope_log2_theta, HEAD_DIM)
    angle = pos.to(tl.float32)[:, None] * freq[None, :]
    sign = tl.where(offs_d < HALF, -1.0, 1.0)
    cos, sin = _cos_sin(angle)
    out = x.to(tl.float32) * cos + sign[None, :] * xp.to(tl.float32) * sin
    return out

"""mla_rope_quantize_fp8 against its reference: DeepSeek's shapes (one latent key head as a
2-D tensor, 64 rotary and 512 other dimensions), both styles and fp8 formats, scales,
given outputs (strided views into one buffer), bad input."""

from __future__ import annotations

import pytest
import torch

from flashtune.ops.rope import mla_rope_quantize_fp8
from flashtune.ops.rope.reference import mla_rope_quantize_ref


def _cache(max_pos: int, rd: int) -> torch.Tensor:
    inv_freq = 1.0 / 1e4 ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd)
    angle = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angle.cos(), angle.sin()], dim=-1)


def _fp8_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # One fp8 rounding apart at most (the rotation's fp32 rounding may cross a boundary).
    torch.testing.assert_close(actual.float(), expected.float(), atol=1e-2, rtol=0.13)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("tokens", [1, 19])
def test_matches_reference_into_given_outputs(is_neox, fp8, tokens, device):
    q = torch.randn(tokens, 3, 576, dtype=torch.float16, device=device)
    k = torch.randn(tokens, 576, dtype=torch.float16, device=device)
    cache = _cache(64, 64).to(device)
    pos = torch.randint(0, 64, (tokens,), device=device)
    q_out = torch.empty_like(q, dtype=fp8)
    k_out = torch.empty_like(k, dtype=fp8)
    parts = (q[..., :64], k[..., :64], q[..., 64:], k[..., 64:])
    outs = (q_out[..., :64], k_out[..., :64], q_out[..., 64:], k_out[..., 64:])
    names = ("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out")
    given = dict(zip(names, outs, strict=True))
    got = mla_rope_quantize_fp8(
        *parts, cache, pos, is_neox=is_neox, quant_scale_q=0.5, quant_scale_kv=2.0, **given
    )
    expected = mla_rope_quantize_ref(
        *parts, cache, pos, is_neox, fp8, quant_scale_q=0.5, quant_scale_kv=2.0
    )
    for given, returned, ref in zip(outs, got, expected, strict=True):
        assert returned is given and returned.dtype == fp8
        _fp8_close(returned, ref)


def test_allocates_e4m3_by_default(device):
    q = torch.randn(5, 2, 96, dtype=torch.bfloat16, device=device)
    k = torch.randn(5, 2, 96, dtype=torch.bfloat16, device=device)
    cache = _cache(16, 32).to(device)
    pos = torch.arange(5, device=device)
    got = mla_rope_quantize_fp8(q[..., :32], k[..., :32], q[..., 32:], k[..., 32:], cache, pos)
    assert [t.dtype for t in got] == [torch.float8_e4m3fn] * 4
    assert [t.shape for t in got] == [(5, 2, 32), (5, 2, 32), (5, 2, 64), (5, 2, 64)]
    expected = mla_rope_quantize_ref(q[..., :32], k[..., :32], q[..., 32:], k[..., 32:], cache, pos)
    for returned, ref in zip(got, expected, strict=True):
        _fp8_close(returned, ref)


def test_bad_inputs():
    q, k = torch.randn(4, 2, 96), torch.randn(4, 96)
    cache, pos = _cache(8, 32), torch.arange(4)
    parts = (q[..., :32], k[..., :32], q[..., 32:], k[..., 32:])
    with pytest.raises(ValueError, match="float32"):
        mla_rope_quantize_fp8(*parts, cache.half(), pos)
    with pytest.raises(ValueError, match="rotary dimension 16"):
        mla_rope_quantize_fp8(*parts, _cache(8, 16), pos)
    with pytest.raises(TypeError, match="quantize_dtype"):
        mla_rope_quantize_fp8(*parts, cache, pos, quantize_dtype=torch.float16)
    with pytest.raises(ValueError, match="tokens"):
        mla_rope_quantize_fp8(*parts, cache, pos[:3])
    with pytest.raises(TypeError, match="quantize_dtype"):  # taken from the given output
        mla_rope_quantize_fp8(*parts, cache, pos, q_nope_out=torch.empty(4, 2, 64))
    with pytest.raises(ValueError, match="q_nope_out"):
        wrong = torch.empty(4, 2, 60, dtype=torch.float8_e4m3fn)
        mla_rope_quantize_fp8(*parts, cache, pos, q_nope_out=wrong)

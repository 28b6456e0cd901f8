"""RoPE against its references: cos/sin-cache and ragged forms, NeoX and GPT-J styles, partial
rotary dims, 2-D and 3-D layouts, in place, bad input, torch.compile, and bf16 on the GPU."""

from __future__ import annotations

import json

import pytest
import torch

from flashtune.ops.rope import (
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
)
from flashtune.ops.rope.config import default_tactic
from flashtune.ops.rope.launch import RopeArgs, RopeRunner, llama31_smoothing
from flashtune.ops.rope.reference import (
    apply_llama31_rope_ref,
    apply_rope_ref,
    llama31_inv_freq,
    rope_with_cos_sin_cache_ref,
)

TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (3e-2, 3e-2),
}
# cos/sin computed in the kernel differ from torch's in the last bits of large angles.
TOL_COMPUTED = {
    torch.float32: (2e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (3e-2, 3e-2),
}
CPU_DTYPES = [torch.float16, torch.float32]


def _close(actual, expected, tol=TOL):
    atol, rtol = tol[expected.dtype]
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


def _cache(max_pos, rotary_dim, device, base=1e4):
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    angle = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angle.cos(), angle.sin()], dim=-1).to(device)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize(
    "nnz,hq,hk,head_size,rotary_dim",
    [(1, 4, 1, 64, 64), (5, 3, 1, 128, 64), (7, 2, 2, 20, 10), (3, 5, 3, 96, 32)],
)
@pytest.mark.parametrize("flat", [False, True], ids=["3d", "2d"])
def test_cos_sin_cache(is_neox, dtype, nnz, hq, hk, head_size, rotary_dim, flat, device):
    q = torch.randn(nnz, hq, head_size, dtype=dtype, device=device)
    k = torch.randn(nnz, hk, head_size, dtype=dtype, device=device)
    if flat:
        q, k = q.reshape(nnz, -1), k.reshape(nnz, -1)
    cache = _cache(64, rotary_dim, device)
    pos = torch.randint(0, 64, (nnz,), device=device)
    qr, kr = rope_with_cos_sin_cache_ref(q, k, cache, pos, head_size, is_neox)
    qo, ko = apply_rope_with_cos_sin_cache(pos, q, k, head_size, cache, is_neox)
    assert qo.shape == q.shape and ko.shape == k.shape
    _close(qo, qr)
    _close(ko, kr)
    q_ptr = q.data_ptr()
    assert apply_rope_with_cos_sin_cache_inplace(pos.int(), q, k, head_size, cache, is_neox) is None
    assert q.data_ptr() == q_ptr
    _close(q, qr)
    _close(k, kr)


@pytest.mark.parametrize("interleave", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("rotary_dim", [None, 32])
def test_ragged(interleave, dtype, rotary_dim, device):
    q = torch.randn(10, 4, 64, dtype=dtype, device=device)
    k = torch.randn(10, 2, 64, dtype=dtype, device=device)
    indptr = torch.tensor([0, 3, 3, 10], device=device, dtype=torch.int32)
    offsets = torch.tensor([5, 0, 300], device=device, dtype=torch.int32)
    args = (rotary_dim, interleave, 2.0, 5e5)
    qr, kr = apply_rope_ref(q, k, indptr, offsets, *args)
    qo, ko = apply_rope(q, k, indptr, offsets, *args)
    _close(qo, qr, TOL_COMPUTED)
    _close(ko, kr, TOL_COMPUTED)
    apply_rope_inplace(q, k, indptr, offsets, *args)
    _close(q, qr, TOL_COMPUTED)
    _close(k, kr, TOL_COMPUTED)


def test_pos_ids_equals_ragged(device):
    q = torch.randn(6, 2, 32, device=device)
    k = torch.randn(6, 1, 32, device=device)
    indptr = torch.tensor([0, 2, 6], device=device)
    offsets = torch.tensor([7, 1], device=device)
    pos = torch.tensor([7, 8, 1, 2, 3, 4], device=device)
    qr, kr = apply_rope_ref(q, k, indptr, offsets)
    qo, ko = apply_rope_pos_ids(q, k, pos)
    _close(qo, qr, TOL_COMPUTED)
    _close(ko, kr, TOL_COMPUTED)
    apply_rope_pos_ids_inplace(q, k, pos)
    _close(q, qr, TOL_COMPUTED)


def test_default_ragged_matches_cache_form(device):
    # apply_rope with theta 1e4, scale 1 == the cache form with a cache built from them.
    q = torch.randn(4, 2, 64, device=device)
    k = torch.randn(4, 2, 64, device=device)
    qa, ka = apply_rope(q, k, torch.tensor([0, 4], device=device), torch.tensor([3], device=device))
    pos = torch.arange(3, 7, device=device)
    qb, kb = apply_rope_with_cos_sin_cache(pos, q, k, 64, _cache(16, 64, device))
    _close(qa, qb, TOL_COMPUTED)
    _close(ka, kb, TOL_COMPUTED)


def test_every_tactic_is_correct(device):
    q = torch.randn(3, 6, 64, device=device)
    k = torch.randn(3, 2, 64, device=device)
    cache = _cache(8, 48, device)
    pos = torch.tensor([1, 7, 0], device=device)
    runner = RopeRunner()
    qr, kr = rope_with_cos_sin_cache_ref(q, k, cache, pos)
    args = RopeArgs(48, False, True)
    tactics = runner.get_valid_tactics([q, k], None)
    assert len(tactics) > 3
    for tactic in [-1, *tactics]:
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        runner.forward([q, k, qo, ko, pos, cache, args], tactic)
        _close(qo, qr)
        _close(ko, kr)


def test_bad_inputs():
    q, k = torch.randn(4, 2, 64), torch.randn(4, 1, 64)
    cache, pos = _cache(16, 64, "cpu"), torch.arange(4)
    with pytest.raises(TypeError, match="cos_sin_cache must be float32"):
        apply_rope_with_cos_sin_cache(pos, q, k, 64, cache.half())
    with pytest.raises(TypeError, match="key must have dtype torch.float32"):
        apply_rope_with_cos_sin_cache(pos, q, k.half(), 64, cache)
    with pytest.raises(ValueError, match="head dimension 64, expected head_size=128"):
        apply_rope_with_cos_sin_cache(pos, q, k, 128, cache)
    with pytest.raises(ValueError, match="not a multiple of head_size=48"):
        apply_rope_with_cos_sin_cache(pos, q.reshape(4, -1), k.reshape(4, -1), 48, cache)
    with pytest.raises(ValueError, match="rotary_dim .* must be even and <= head_size=64"):
        apply_rope_with_cos_sin_cache(pos, q, k, 64, torch.randn(16, 66))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 16\)"):
        apply_rope_with_cos_sin_cache(pos + 13, q, k, 64, cache)
    with pytest.raises(TypeError, match="positions must be int32 or int64"):
        apply_rope_with_cos_sin_cache(pos.float(), q, k, 64, cache)
    with pytest.raises(ValueError, match="one entry per token"):
        apply_rope_with_cos_sin_cache(pos[:3], q, k, 64, cache)
    with pytest.raises(ValueError, match="key is on meta but query is on cpu"):
        apply_rope_with_cos_sin_cache(pos, q, torch.randn(4, 1, 64, device="meta"), 64, cache)
    with pytest.raises(ValueError, match="cos_sin_cache is on meta"):
        apply_rope_with_cos_sin_cache(pos, q, k, 64, cache.to("meta"))
    indptr, offsets = torch.tensor([0, 4]), torch.tensor([0])
    with pytest.raises(ValueError, match="rotary_dim must be an even int"):
        apply_rope(q, k, indptr, offsets, rotary_dim=33)
    with pytest.raises(ValueError, match="indptr must have batch_size \\+ 1 = 2 entries"):
        apply_rope(q, k, torch.tensor([0, 2, 4]), offsets)
    with pytest.raises(ValueError, match="indptr\\[-1\\] must equal nnz=4"):
        apply_rope(q, k, torch.tensor([0, 3]), offsets)
    with pytest.raises(ValueError, match="same number of tokens"):
        apply_rope(q, k[:3], indptr, offsets)


def test_custom_ops_and_compile(device):
    q = torch.randn(3, 2, 32, device=device)
    k = torch.randn(3, 1, 32, device=device)
    cache, pos = _cache(8, 32, device), torch.tensor([0, 5, 2], device=device)
    torch.library.opcheck(
        torch.ops.flashtune.rope_cos_sin_cache.default,
        (q, k, torch.empty_like(q), torch.empty_like(k), pos, cache, 32, True),
    )

    def fn(q, k):
        apply_rope_with_cos_sin_cache_inplace(pos, q, k, 32, cache, False)
        return q * 1, k * 1

    qr, kr = rope_with_cos_sin_cache_ref(q, k, cache, pos, is_neox=False)
    # One eager call first: the @api wrapper reads its FLASHTUNE_* switches under a lock on
    # the first call of any op, which dynamo cannot trace (fullgraph would fail).
    apply_rope_with_cos_sin_cache(pos, q, k, 32, cache, False)
    qo, ko = torch.compile(fn, backend="aot_eager", fullgraph=True)(q.clone(), k.clone())
    _close(qo, qr)
    _close(ko, kr)
    compiled = torch.compile(
        lambda a, b: apply_rope_pos_ids(a, b, pos), fullgraph=True, backend="aot_eager"
    )
    _close(compiled(q, k)[0], apply_rope_pos_ids(q, k, pos)[0])


@pytest.mark.cuda
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "nnz,hq,hk,head_size,rotary_dim",
    [(1, 32, 8, 128, 128), (77, 32, 8, 128, 64), (4096, 40, 8, 128, 128), (300, 6, 2, 80, 40)],
)
def test_cuda_grid(is_neox, dtype, nnz, hq, hk, head_size, rotary_dim):
    q = torch.randn(nnz, hq, head_size, dtype=dtype, device="cuda")
    k = torch.randn(nnz, hk, head_size, dtype=dtype, device="cuda")
    cache = _cache(8192, rotary_dim, "cuda")
    pos = torch.randint(0, 8192, (nnz,), device="cuda")
    qr, kr = rope_with_cos_sin_cache_ref(q, k, cache, pos, head_size, is_neox)
    qo, ko = apply_rope_with_cos_sin_cache(pos, q, k, head_size, cache, is_neox)
    _close(qo, qr)
    _close(ko, kr)
    apply_rope_with_cos_sin_cache_inplace(pos, q, k, head_size, cache, is_neox)
    _close(q, qr)
    _close(k, kr)


# ------------------------------------------------------------------------------- Llama 3.1


def _llama31_inputs(device, dtype=torch.float32, heads=(3, 2), head_dim=64):
    # Odd request lengths and a zero-length request. The scaling's bands (kept, blended,
    # divided) are bands of frequencies: every position shows all three, so positions stay
    # small enough for fp32 angles to agree with the reference's.
    lens = [5, 0, 1, 19, 12]
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    offsets = torch.tensor([0, 3, 250, 97, 131], dtype=torch.int32)
    nnz = int(indptr[-1])
    q = torch.randn(nnz, heads[0], head_dim, dtype=dtype, device=device)
    k = torch.randn(nnz, heads[1], head_dim, dtype=dtype, device=device)
    return q, k, indptr.to(device), offsets.to(device)


def test_llama31_smoothing_is_metas_scaling():
    """The kernel's clamp(f * a + b, 0, 1) blend equals Meta's three-band definition."""
    rd, theta, scale, low, high, old = 128, 5e5, 8.0, 1.0, 4.0, 8192
    a, b = llama31_smoothing(low, high, old)
    f = 1.0 / theta ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    s = (f * a + b).clamp(0, 1)
    blended = (1 - s) * f / scale + s * f
    metas = llama31_inv_freq(rd, theta, scale, low, high, old).to(torch.float64)
    torch.testing.assert_close(blended, metas, rtol=1e-6, atol=0.0)
    # all three bands are present at these settings
    assert (metas == f.float().double()).any() and (metas < f / scale * 1.0001).any()
    with pytest.raises(ValueError, match="high_freq_factor"):
        llama31_smoothing(4.0, 1.0, 8192)


@pytest.mark.parametrize("interleave", [False, True], ids=["neox", "gptj"])
# rotary_dim 32 (~1.4 s a variant on 2 cores): in the slow step, beside the full and the odd
# partial dimension here (the main suite stays under 10 minutes)
@pytest.mark.parametrize("rotary_dim", [None, pytest.param(32, marks=pytest.mark.slow), 18])
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_llama31_ragged(interleave, rotary_dim, dtype, device):
    q, k, indptr, offsets = _llama31_inputs(device, dtype)
    qr, kr = apply_llama31_rope_ref(q, k, indptr, offsets, rotary_dim, interleave)
    qo, ko = apply_llama31_rope(q, k, indptr, offsets, rotary_dim, interleave)
    _close(qo, qr, TOL_COMPUTED)
    _close(ko, kr, TOL_COMPUTED)
    qi, ki = q.clone(), k.clone()
    apply_llama31_rope_inplace(qi, ki, indptr, offsets, rotary_dim, interleave)
    torch.testing.assert_close(qi, qo, atol=0, rtol=0)
    torch.testing.assert_close(ki, ko, atol=0, rtol=0)


def test_llama31_pos_ids_equals_ragged(device):
    q, k, indptr, offsets = _llama31_inputs(device, heads=(5, 1), head_dim=40)
    counts = (indptr[1:] - indptr[:-1]).long()
    pos = torch.repeat_interleave(offsets.long(), counts) + torch.cat(
        [torch.arange(int(n)) for n in counts]
    ).to(device)
    options = {"rope_scale": 4.0, "rope_theta": 1e4, "low_freq_factor": 2.0, "old_context_len": 512}
    qo, ko = apply_llama31_rope(q, k, indptr, offsets, 24, **options)
    qp, kp = apply_llama31_rope_pos_ids(q, k, pos, 24, **options)
    torch.testing.assert_close(qp, qo, atol=0, rtol=0)
    torch.testing.assert_close(kp, ko, atol=0, rtol=0)
    apply_llama31_rope_pos_ids_inplace(q, k, pos, 24, **options)
    torch.testing.assert_close(q, qo, atol=0, rtol=0)
    torch.testing.assert_close(k, ko, atol=0, rtol=0)


def test_llama31_without_scaling_is_plain_rope(device):
    """rope_scale 1: every band keeps its frequency, so the result is plain RoPE's."""
    q, k, indptr, offsets = _llama31_inputs(device)
    qo, ko = apply_llama31_rope(q, k, indptr, offsets, rope_scale=1.0, rope_theta=1e4)
    qr, kr = apply_rope(q, k, indptr, offsets, rope_theta=1e4)
    _close(qo, qr, TOL_COMPUTED)
    _close(ko, kr, TOL_COMPUTED)


def test_llama31_bad_inputs(device):
    q, k, indptr, offsets = _llama31_inputs(device)
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_llama31_rope(q, k, indptr, offsets, rotary_dim=7)
    with pytest.raises(ValueError, match="high_freq_factor"):
        apply_llama31_rope(q, k, indptr, offsets, low_freq_factor=4, high_freq_factor=4)
    with pytest.raises(ValueError, match="pos_ids"):
        apply_llama31_rope_pos_ids(q, k, offsets)


@pytest.mark.cuda
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize(
    "op, ref, first_positions, freq",
    [
        (apply_rope, apply_rope_ref, [4000, 0, 17], (1.0, 5e5)),
        (apply_llama31_rope, apply_llama31_rope_ref, [40000, 0, 8100], ()),  # its defaults
    ],
    ids=["rope", "llama31"],
)
def test_cuda_ragged(op, ref, first_positions, freq, interleave):
    q = torch.randn(1000, 32, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(1000, 8, 128, dtype=torch.bfloat16, device="cuda")
    indptr = torch.tensor([0, 1, 500, 1000], device="cuda", dtype=torch.int32)
    offsets = torch.tensor(first_positions, device="cuda", dtype=torch.int32)
    qr, kr = ref(q, k, indptr, offsets, None, interleave, *freq)
    qo, ko = op(q, k, indptr, offsets, None, interleave, *freq)
    _close(qo, qr)
    _close(ko, kr)


# ------------------------------------------------------------------------------------ schemas


def test_definition_equals_corpus(trace_corpus):
    rel = "definitions/rope/rope_with_cos_sin_cache_neox_style_d128_rd64.json"
    theirs = json.loads((trace_corpus / rel).read_text())
    q = torch.randn(5, 4, 128, dtype=torch.bfloat16)
    k = torch.randn(5, 2, 128, dtype=torch.bfloat16)
    cache = _cache(64, 64, "cpu")
    pos = torch.randint(0, 64, (5,))
    ours = apply_rope_with_cos_sin_cache_inplace.definition(pos, q, k, 128, cache, True)
    d = json.loads(ours.to_json())
    assert d["name"] == theirs["name"] and d["op_type"] == theirs["op_type"]
    assert {a: (v["type"], v.get("value")) for a, v in d["axes"].items()} == {
        a: (v["type"], v.get("value")) for a, v in theirs["axes"].items()
    }
    for kind in ("inputs", "outputs"):
        assert {n: (v["shape"], v["dtype"]) for n, v in d[kind].items()} == {
            n: (v["shape"], v["dtype"]) for n, v in theirs[kind].items()
        }
    runs = []
    for source in (ours.reference, theirs["reference"]):
        scope: dict = {}
        exec(source, scope)
        runs.append(scope["run"](q, k, cache, pos))
    for a, b in zip(*runs, strict=True):
        _close(a, b)
    gptj = apply_rope_with_cos_sin_cache.definition(pos, q, k, 128, cache, is_neox=False)
    assert gptj.name == "rope_with_cos_sin_cache_gptj_style_d128_rd64"


@pytest.mark.parametrize("heads", [1, 2, 5, 8, 32, 40, 48, 64])
@pytest.mark.parametrize("rotary_dim", [2, 10, 32, 40, 64, 80, 96, 128, 256])
def test_default_tactic_is_a_valid_launch(heads, rotary_dim):
    # Triton needs power-of-two warps and block sizes (the interpreter does not check).
    t = default_tactic(heads, rotary_dim)
    for value in (t.block_h, t.num_warps):
        assert value >= 1 and value & (value - 1) == 0, t
    assert t.num_warps <= 8

"""fp8 GEMMs (flashtune.gemm, FlashInfer's names): every op and runner against the references,
over odd shapes (M = 1, 7, 129; K and N not multiples of the tiles or the 128-wide scale
blocks; batches), every scale layout FlashInfer takes, and the errors of bad calls.

On CPU the Triton kernel runs in the interpreter (fp8 dots work there; fp16 outputs, since
bf16 loads do not); `-m cuda` runs the same checks with bf16 outputs, more tactics, the
cuBLAS runner and FlashInfer 0.2.14's test shapes on the GPU.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import flashtune
from flashtune import platform
from flashtune.ops.gemm.fp8 import config as cfg
from flashtune.ops.gemm.fp8 import launch as L
from flashtune.ops.gemm.fp8.reference import block_scaled_mm_ref, bmm_fp8_ref

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
G = flashtune.gemm


def _fp8(shape, dtype=E4M3, device="cpu", scale=1.0):
    """Random fp8 values of unit size (never zeros), as `scale` * N(0, 1) quantized."""
    return (torch.randn(shape, device=device) * scale).to(dtype)


def _per_tensor(x: torch.Tensor, dtype=E4M3):
    """FlashInfer's test quantization: x / s in fp8 with the dequant scale s (0-dim)."""
    amax = x.abs().max().clamp(min=1e-12)
    s = (amax / torch.finfo(dtype).max).float()
    return (x / s).to(dtype), s


def _bmm_operands(b, m, n, k, a_dtype=E4M3, b_dtype=E4M3, device="cpu"):
    A, sa = _per_tensor(torch.randn(b, m, k, device=device), a_dtype)
    # B [b, k, n] column-major, as FlashInfer's tests build it.
    Bt, sb = _per_tensor(torch.randn(b, n, k, device=device), b_dtype)
    return A, Bt.transpose(1, 2), sa, sb


def _block_scales(rows, k, block_rows, device="cpu", lead=()):
    """Positive scales of a [..., ceil(rows/block_rows), ceil(k/128)] K-major layout."""
    shape = (*lead, math.ceil(rows / block_rows), math.ceil(k / 128))
    return torch.rand(shape, device=device) + 0.5


def _close(C, expected, scale=1.0):
    """fp32 sums of fp8 products, rounded once: bf16/fp16 rounding of the result only."""
    assert C.shape == expected.shape and C.dtype == expected.dtype
    tol = 2e-2 if C.dtype == torch.bfloat16 else 4e-3
    torch.testing.assert_close(C.float(), expected.float(), atol=tol * scale, rtol=tol)


# ------------------------------------------------------------------ CPU: the interpreter

BMM_SHAPES = [(1, 1, 33, 70), (2, 7, 64, 128), (3, 129, 40, 96)]  # (b, m, n, k)
FORMATS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)]


@pytest.mark.interpreter
@pytest.mark.parametrize("b,m,n,k", BMM_SHAPES)
@pytest.mark.parametrize("formats", FORMATS, ids=["e4m3", "e4m3xe5m2", "e5m2xe4m3"])
def test_bmm_fp8_interpreter(b, m, n, k, formats):
    A, B, sa, sb = _bmm_operands(b, m, n, k, *formats)
    backend = "cutlass" if formats == (E4M3, E4M3) else "auto"
    C = G.bmm_fp8(A, B, sa, sb, torch.float16, backend=backend)
    expected = bmm_fp8_ref(A, B, sa, sb, torch.float16)
    _close(C, expected, scale=expected.abs().max().item())


@pytest.mark.interpreter
def test_bmm_fp8_writes_into_out_and_takes_row_major_b():
    A, B, sa, sb = _bmm_operands(2, 5, 24, 40)
    out = torch.empty(2, 5, 24, dtype=torch.float16)
    B_row_major = B.contiguous()  # [b, k, n] row-major: read through its strides too
    result = G.bmm_fp8(A, B_row_major, sa, sb, torch.float16, out, backend="cutlass")
    assert result is out
    expected = bmm_fp8_ref(A, B, sa, sb, torch.float16)
    _close(out, expected, scale=expected.abs().max().item())


@pytest.mark.interpreter
@pytest.mark.parametrize("m,n,k", [(1, 130, 256), (7, 64, 200), (129, 257, 384)])
@pytest.mark.parametrize("mode", ["K", "MN"])
def test_gemm_fp8_nt_groupwise_interpreter(m, n, k, mode):
    a, b = _fp8((m, k)), _fp8((n, k))
    sa, sb = _block_scales(m, k, 1), _block_scales(n, k, 128)
    args = (sa, sb) if mode == "K" else (sa.T.contiguous(), sb.T.contiguous())
    C = G.gemm_fp8_nt_groupwise(a, b, *args, scale_major_mode=mode, out_dtype=torch.float16)
    expected = block_scaled_mm_ref(a, b, sa, sb, (1, 128, 128), torch.float16)
    _close(C, expected, scale=expected.abs().max().item())


@pytest.mark.interpreter
@pytest.mark.parametrize("transposed", [False, True])
def test_gemm_fp8_nt_groupwise_trtllm_layout(transposed):
    """backend="trtllm": a_scale M-major ([k/128, m], or its [m, k/128] view), b_scale
    [n/128, k/128] (or its [k/128, n/128] view), as FlashInfer's test passes them."""
    m, n, k = 9, 136, 256
    a, b = _fp8((m, k)), _fp8((n, k))
    sa, sb = _block_scales(m, k, 1), _block_scales(n, k, 128)
    sa_arg = sa.T.contiguous()  # [k/128, m] contiguous: M-major memory
    sb_arg = sb.contiguous()
    if transposed:
        sa_arg, sb_arg = sa_arg.T, sb_arg.T  # the same memory seen in the other shapes
    C = G.gemm_fp8_nt_groupwise(
        a, b, sa_arg, sb_arg, "MN", out_dtype=torch.float16, backend="trtllm"
    )
    expected = block_scaled_mm_ref(a, b, sa, sb, (1, 128, 128), torch.float16)
    _close(C, expected, scale=expected.abs().max().item())


@pytest.mark.interpreter
@pytest.mark.parametrize("mode", ["K", "MN"])
def test_gemm_fp8_nt_blockscaled_interpreter(mode):
    m, n, k = 130, 72, 256  # 128 x 128 blocks for a too; m, n not multiples of 128
    a, b = _fp8((m, k)), _fp8((n, k))
    sa, sb = _block_scales(m, k, 128), _block_scales(n, k, 128)
    args = (sa, sb) if mode == "K" else (sa.T.contiguous(), sb.T.contiguous())
    C = G.gemm_fp8_nt_blockscaled(a, b, *args, mode, out_dtype=torch.float16)
    expected = block_scaled_mm_ref(a, b, sa, sb, (128, 128, 128), torch.float16)
    _close(C, expected, scale=expected.abs().max().item())


@pytest.mark.interpreter
@pytest.mark.parametrize("m,n,k", [(1, 40, 256), (7, 136, 384), (129, 64, 128)])
@pytest.mark.parametrize("with_alpha", [True, False])
def test_mm_fp8_interpreter(m, n, k, with_alpha):
    """FlashInfer's current mm_fp8: B in the [k/128, n, 128] block layout, read in place."""
    a, w = _fp8((m, k)), _fp8((n, k), scale=0.25)
    prepared = G.prepare_low_latency_gemm_weights(w, {})
    assert prepared.shape == (k // 128, n, 128)
    alpha = torch.rand(()) + 0.5 if with_alpha else None
    out = torch.empty(m, n, dtype=torch.bfloat16) if m == 7 else None
    C = G.mm_fp8(a, prepared, alpha, out=out)
    assert out is None or C.data_ptr() == out.data_ptr()
    scale = torch.ones(1) if alpha is None else alpha.reshape(1)
    expected = bmm_fp8_ref(a[None], w.T[None], scale, torch.ones(1), torch.bfloat16)[0]
    _close(C, expected, scale=expected.float().abs().max().item())


def _grouped_expected(a, b, sa, sb, groups_of_rows, out_dtype):
    """Row i times b[groups_of_rows[i]] (zeros for -1), from the block-scaled reference."""
    expected = torch.zeros(a.shape[0], b.shape[1], dtype=out_dtype)
    for g in range(b.shape[0]):
        full = block_scaled_mm_ref(a, b[g], sa, sb[g], (1, 128, 128), out_dtype)
        sel = groups_of_rows == g
        expected[sel] = full[sel]
    return expected


@pytest.mark.interpreter
@pytest.mark.parametrize("mode", ["K", "MN"])
def test_group_gemm_fp8_nt_groupwise_interpreter(mode):
    """Segments of 7, 0 and 10 rows (an empty group), then 3 rows past m_indptr[-1]."""
    k, n = 160, 48
    m_indptr = torch.tensor([0, 7, 7, 17], dtype=torch.int32)
    rows = 20
    a, b = _fp8((rows, k)), _fp8((3, n, k))
    sa, sb = _block_scales(rows, k, 1), _block_scales(n, k, 128, lead=(3,))
    if mode == "K":
        args = (sa, sb)
    else:
        args = (sa.T.contiguous(), sb.transpose(1, 2).contiguous())
    C = G.group_gemm_fp8_nt_groupwise(
        a, b, *args, m_indptr, scale_major_mode=mode, out_dtype=torch.float16
    )
    groups = torch.tensor([0] * 7 + [2] * 10 + [-1] * 3)
    expected = _grouped_expected(a, b, sa, sb, groups, torch.float16)
    _close(C, expected, scale=expected.abs().max().item())


@pytest.mark.interpreter
def test_group_deepgemm_fp8_nt_groupwise_interpreter():
    """Rows name their group in any order, padding rows (-1) included: a tile of rows from
    several groups loops over them."""
    m, n, k, groups = 37, 40, 256, 4
    m_indices = torch.randint(-1, groups, (m,), dtype=torch.int32)
    a, b = _fp8((m, k)), _fp8((groups, n, k))
    sa, sb = _block_scales(m, k, 1), _block_scales(n, k, 128, lead=(groups,))
    C = G.group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, m_indices, out_dtype=torch.float16)
    expected = _grouped_expected(a, b, sa, sb, m_indices, torch.float16)
    _close(C, expected, scale=expected.abs().max().item())


@pytest.mark.interpreter
def test_batch_deepgemm_fp8_nt_groupwise_interpreter():
    groups, m, n, k = 3, 19, 24, 200
    masked_m = torch.tensor([0, 5, 19], dtype=torch.int32)
    a, b = _fp8((groups, m, k)), _fp8((groups, n, k))
    sa = _block_scales(m, k, 1, lead=(groups,))
    sb = _block_scales(n, k, 128, lead=(groups,))
    C = G.batch_deepgemm_fp8_nt_groupwise(
        a, b, sa, sb, masked_m, expected_m=8, out_dtype=torch.float16
    )
    expected = block_scaled_mm_ref(a, b, sa, sb, (1, 128, 128), torch.float16)
    valid = torch.arange(m)[None, :] < masked_m[:, None]
    expected = expected * valid[..., None]
    _close(C, expected, scale=expected.abs().max().item())


# Tactics in the interpreter: small tiles; block_k 64 (two K steps per 128-wide scale
# block), group_m 1 and 8; split-K of 2 and 3 (K = 200: 4 tiles of 64 over 3 splits, the last
# split's range ends inside its tile; 2 tiles of 128 over 2 splits, one scale block each).
CPU_TACTICS = [
    -1,
    (16, 32, 64, 1, 1, 4, 2),
    (32, 16, 128, 8, 1, 4, 2),
    (16, 64, 32, 8, 1, 4, 2),
    (16, 32, 64, 8, 3, 4, 2),
    (16, 16, 128, 1, 2, 4, 2),
]


@pytest.mark.interpreter
@pytest.mark.parametrize("tactic", CPU_TACTICS, ids=str)
@pytest.mark.parametrize("block", [False, True], ids=["tensor", "block"])
def test_triton_runner_tactics_interpreter(tactic, block):
    b, m, n, k = 2, 33, 40, 200
    A, B_nk = _fp8((b, m, k)), _fp8((b, n, k))
    if block:
        sa = _block_scales(m, k, 1, lead=(b,))
        sb = _block_scales(n, k, 128, lead=(b,))
        expected = block_scaled_mm_ref(A, B_nk, sa, sb, (1, 128, 128), torch.float16)
        mode = "block"
    else:
        sa, sb = torch.rand(1) + 0.5, torch.rand(1) + 0.5
        expected = bmm_fp8_ref(A, B_nk.transpose(1, 2), sa, sb, torch.float16)
        mode = "tensor"
    inputs = L.Fp8Inputs(A, B_nk, sa, sb, torch.float16, mode=mode)
    C = L.TritonFp8Runner().forward(inputs, tactic)
    _close(C, expected, scale=expected.abs().max().item())


@pytest.mark.interpreter
@pytest.mark.parametrize("tactic", [(16, 32, 256, 1, 1, 4, 2), (32, 16, 256, 8, 2, 4, 2)], ids=str)
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_triton_runner_wide_k_steps_interpreter(tactic, tma):
    """256-wide K steps (per-tensor scales only): K = 608, a partial last step (16-byte rows
    for the TMA descriptors); split in two."""
    m, n, k = 33, 40, 608
    A, B_nk = _fp8((1, m, k)), _fp8((1, n, k))
    sa, sb = torch.rand(1) + 0.5, torch.rand(1) + 0.5
    expected = bmm_fp8_ref(A, B_nk.transpose(1, 2), sa, sb, torch.float16)
    inputs = L.Fp8Inputs(A, B_nk, sa, sb, torch.float16, mode="tensor")
    runner = L.TritonFp8TmaRunner() if tma else L.TritonFp8Runner()
    C = runner.forward(inputs, tactic)
    _close(C, expected, scale=expected.abs().max().item())


def _one_entry_case(
    block: bool, m: int = 33, n: int = 40, k: int = 208
) -> tuple[L.Fp8Inputs, torch.Tensor]:
    """One batch entry, by default M = 33 and N = 40 off the tiles, K = 208 (16-byte rows for
    the TMA descriptors, a partial last K tile and scale block): the inputs and the expected
    product, per-tensor or block scales."""
    A, B_nk = _fp8((1, m, k)), _fp8((1, n, k))
    if block:
        sa, sb = _block_scales(m, k, 1, lead=(1,)), _block_scales(n, k, 128, lead=(1,))
        expected = block_scaled_mm_ref(A, B_nk, sa, sb, (1, 128, 128), torch.float16)
    else:
        sa, sb = torch.rand(1) + 0.5, torch.rand(1) + 0.5
        expected = bmm_fp8_ref(A, B_nk.transpose(1, 2), sa, sb, torch.float16)
    inputs = L.Fp8Inputs(A, B_nk, sa, sb, torch.float16, mode="block" if block else "tensor")
    return inputs, expected


@pytest.mark.interpreter
@pytest.mark.parametrize("tactic", CPU_TACTICS, ids=str)
@pytest.mark.parametrize("block", [False, True], ids=["tensor", "block"])
def test_tma_runner_tactics_interpreter(tactic, block):
    """The TMA loads (tensor descriptors, zero fill past M, N and K) on `_one_entry_case`."""
    inputs, expected = _one_entry_case(block)
    assert L.tma_applies(inputs)
    C = L.TritonFp8TmaRunner().forward(inputs, tactic)
    _close(C, expected, scale=expected.abs().max().item())


@pytest.mark.interpreter
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("block", [False, True], ids=["tensor", "block"])
def test_tail_split_interpreter(tma, block, monkeypatch):
    """A tail split on 4 SMs: 9 output tiles of 16x16, the first 8 (two full waves) whole,
    the last in 3 parts (K = 208: 4 K tiles of 64, the last part's range ends inside a
    tile); TMA and pointer loads, per-tensor and block scales."""
    few = dataclasses.replace(platform.STAND_IN_LIMITS, sm_count=4)
    monkeypatch.setattr(platform, "device_limits", lambda device=None: few)
    assert cfg.tail_layout(9, 4, 3) == (8, 11)
    inputs, expected = _one_entry_case(block)
    runner = L.TritonFp8TmaRunner() if tma else L.TritonFp8Runner()
    tactic = (16, 16, 64, 8, 3, 4, 2, 1)
    C = runner.forward(inputs, tactic)
    _close(C, expected, scale=expected.abs().max().item())
    # The counters are left at zero: the same call again gives the same product.
    assert torch.equal(runner.forward(inputs, tactic), C)


def test_tail_split_candidates_where_the_last_wave_is_short():
    """M=4096, N=576 on 132 SMs: 160 tiles of 128x128 leave a 28-tile last wave, so the
    candidates split those tiles (K 7168: 56 K steps) in even parts; a shape whose tiles
    divide into the SMs, or one under a wave, gets no tail split."""
    tails = [t for t in cfg.fp8_candidates(4096, 576, 7168, 132) if t.tail == cfg.TAIL_SPLIT]
    big = [t for t in tails if (t.block_m, t.block_n) == (128, 128)]
    # Even parts: no split leaves a part with nothing to do.
    assert big and all(t.split_k > 1 and -(-56 // -(-56 // t.split_k)) == t.split_k for t in big)
    assert {t.split_k for t in big} & {4, 5}
    assert not [
        t
        for t in cfg.fp8_candidates(4096, 4224, 4096, 132)
        if t.tail == cfg.TAIL_SPLIT and (t.block_m, t.block_n) == (128, 128)
    ]  # 32 x 33 = 8 x 132 tiles: no tail
    assert not [t for t in cfg.fp8_candidates(1, 576, 7168, 132) if t.tail == cfg.TAIL_SPLIT]
    # Seven ints without the flag (the cache's older form), eight with it; both parse back.
    t = big[0]
    assert len(t.as_tactic()) == 8 and cfg.Fp8Tactic.from_tactic(t.as_tactic()) == t
    plain = dataclasses.replace(t, tail=0)
    assert len(plain.as_tactic()) == 7 and cfg.Fp8Tactic.from_tactic(plain.as_tactic()) == plain
    with pytest.raises(ValueError, match="7 ints"):
        cfg.Fp8Tactic.from_tactic((1, 2, 3))


# Stream-K in the interpreter: 32x32x32 tiles on shapes off the tiles (1 x 72: 3 tiles of
# 8 K steps; 37 x 200: 14 of 12; 130 x 96: 15 of 20). Programs (the interpreter's SM count
# patched to 1, so the tactic's programs per SM is the count): 1 (whole tiles, no
# workspace), 11 (not dividing the iterations: ranges start and end mid-tile) and 64 (more
# than the tiles: a tile in 4 to 8 parts of one to five K steps).
STREAM_K_SHAPES = [(1, 72, 256), (37, 200, 384), (130, 96, 640)]


# The main suite runs the smallest shape in all four forms (its 11- and 64-program cases
# start and end parts mid-tile); the rest runs in the slow step.
_STREAM_K_MAIN: set[tuple[int, int, int, bool, bool]] = set()
STREAM_K_CASES = [
    pytest.param(
        *shape,
        tma,
        block,
        id=f"{'block' if block else 'tensor'}-{'tma' if tma else 'pointers'}-{shape}",
        marks=()
        if shape == STREAM_K_SHAPES[0] or (*shape, tma, block) in _STREAM_K_MAIN
        else pytest.mark.slow,
    )
    for shape in STREAM_K_SHAPES
    for tma in (False, True)
    for block in (False, True)
]


@pytest.mark.interpreter
@pytest.mark.parametrize("m,n,k,tma,block", STREAM_K_CASES)
def test_stream_k_interpreter(m, n, k, tma, block, monkeypatch):
    one = dataclasses.replace(platform.STAND_IN_LIMITS, sm_count=1)
    monkeypatch.setattr(platform, "device_limits", lambda device=None: one)
    inputs, expected = _one_entry_case(block, m, n, k)
    runner = L.TritonFp8TmaRunner() if tma else L.TritonFp8Runner()
    counters = L.split_k_counters(inputs.A.device, 1)
    for programs in (1, 11, 64):
        tactic = (32, 32, 32, 8, programs, 4, 2, cfg.STREAM_K)
        C = runner.forward(inputs, tactic)
        _close(C, expected, scale=expected.abs().max().item())
        assert not torch.count_nonzero(counters), "the last arrivals reset their counters"
    # Zero counters: the same call again gives the same bits.
    assert torch.equal(runner.forward(inputs, tactic), C)


def test_stream_k_tactics_and_candidates():
    """The stream-K schedule is tail = 2 in the tactic's eighth int (split_k: programs per
    SM); 7-int and tail-split tactics read as before. Candidates go to shapes whose output
    tiles load the SMs unevenly, at most 4 a shape, one batch entry only."""
    sk = cfg.Fp8Tactic(128, 256, 128, 8, 1, 8, 3, tail=cfg.STREAM_K)
    assert sk.as_tactic() == (128, 256, 128, 8, 1, 8, 3, 2) and sk.stream_k
    assert cfg.Fp8Tactic.from_tactic(sk.as_tactic()) == sk
    old = cfg.Fp8Tactic.from_tactic((128, 128, 128, 8, 4, 8, 3, 1))
    assert old.tail == cfg.TAIL_SPLIT and not old.stream_k
    assert cfg.Fp8Tactic.from_tactic((64, 64, 128, 8, 2, 4, 5)).tail == 0
    with pytest.raises(ValueError, match="tail must be"):
        cfg.Fp8Tactic.from_tactic((128, 128, 128, 8, 1, 8, 3, 3))
    # (iterations a program, programs launched): empty ranges are not launched.
    assert cfg.stream_k_layout(15, 20, 11) == (28, 11)
    assert cfg.stream_k_layout(3, 8, 64) == (1, 24)
    assert cfg.stream_k_layout(96, 56, 132) == (41, 132)

    def stream_k(M, N, K, **kw):
        return [t for t in cfg.fp8_candidates(M, N, K, 132, **kw) if t.stream_k]

    # 128x256 tiles at M=4096 x N=576: 96 tiles on 132 SMs (H200: 37.9 us against cuBLAS's
    # 25.8); 64x64 at M=128 x N=4608: 144 tiles, a 12-tile second wave (17.5 against 12.8).
    wide = stream_k(4096, 576, 7168, per_tensor=True)
    assert cfg.Fp8Tactic(128, 256, 128, 8, 1, 8, 3, cfg.STREAM_K) in wide
    medium = stream_k(128, 4608, 7168, per_tensor=True)
    assert {(t.block_m, t.block_n, t.split_k) for t in medium} >= {(64, 64, 1), (64, 64, 2)}
    for M, N, K in ((4096, 576, 7168), (128, 4608, 7168), (1, 576, 7168), (1024, 1536, 7168)):
        for per_tensor in (False, True):
            cands = stream_k(M, N, K, per_tensor=per_tensor)
            assert 0 < len(cands) <= 4
            # Block scales: at most 64 accumulator values a thread.
            assert per_tensor or all(t.block_m * t.block_n <= 64 * 32 * t.num_warps for t in cands)
            assert all(cfg.tactic_fits(t, 128, 227 * 1024, M, N, K) for t in cands)
        assert not stream_k(M, N, K, batch=2)
    # 12 x 11 = 132 tiles of 128x128: one even wave, no stream-K of that tile (of others,
    # yes); past two waves (4096 x 4608: 4.4 waves of 128x256), none.
    even = stream_k(1536, 1408, 4096, per_tensor=True)
    assert even and all((t.block_m, t.block_n) != (128, 128) for t in even)
    assert not stream_k(4096, 4608, 7168, per_tensor=True)
    assert not stream_k(4096, 576, 64)  # one K step: no K range to share


def test_stream_k_only_where_it_applies():
    """The runners offer stream-K for one batch entry with per-tensor or block scales, and
    the launcher refuses it elsewhere (no kernel runs: the error comes first)."""
    A, B_nk, s = _fp8((1, 8, 256)), _fp8((1, 64, 256)), torch.ones(1)
    plain = L.Fp8Inputs(A, B_nk, s, s, torch.float16)
    for runner in (L.TritonFp8Runner(), L.TritonFp8TmaRunner()):
        tactics = [cfg.Fp8Tactic.from_tactic(t) for t in runner.get_valid_tactics(plain, None)]
        assert any(t.stream_k for t in tactics)
    others = {
        "two batch entries": plain._replace(A=_fp8((2, 8, 256)), B=_fp8((2, 64, 256))),
        "row groups": plain._replace(mode="row_groups", rows=torch.zeros(8, dtype=torch.int32)),
    }
    tactic = (16, 64, 128, 8, 1, 4, 2, cfg.STREAM_K)
    for why, inputs in others.items():
        assert not L.stream_k_applies(inputs), why
        tactics = L.TritonFp8Runner().get_valid_tactics(inputs, None)
        assert tactics and not any(cfg.Fp8Tactic.from_tactic(t).stream_k for t in tactics), why
        with pytest.raises(ValueError, match="stream-K takes one batch entry"):
            L.TritonFp8Runner().forward(inputs, tactic)


_STREAM_K_AOT = r"""
import re, sys, torch
sys.path.insert(0, sys.argv[1])
from sass_decode import first_launch_sass
from flashtune.ops.gemm.fp8 import launch as L
from flashtune.ops.gemm.fp8.kernels import _fp8_gemm_streamk_kernel

E4M3 = torch.float8_e4m3fn
M, N, K = 4096, 576, 7168
for block, tma, tactic in [(0, 0, (128, 256, 128, 8, 1, 8, 3, 2)),
                           (0, 1, (128, 256, 128, 8, 1, 8, 3, 2)),
                           (1, 1, (128, 128, 128, 8, 1, 8, 3, 2))]:
    A, B = torch.empty(1, M, K, dtype=E4M3), torch.empty(1, N, K, dtype=E4M3)
    if block:
        sa, sb = torch.ones(1, M, K // 128), torch.ones(1, -(-N // 128), K // 128)
    else:
        sa = sb = torch.ones(1)
    a = L.Fp8Inputs(A, B, sa, sb, torch.bfloat16, mode="block" if block else "tensor")
    runner = L.TritonFp8TmaRunner() if tma else L.TritonFp8Runner()
    sass = first_launch_sass(_fp8_gemm_streamk_kernel, lambda: runner.forward(a, tactic))
    mma = sum("QGMMA" in line for line in sass.splitlines())
    local = len(re.findall(r"(?:LDL|STL)", sass))
    print(block, tma, sass.splitlines()[0], f"QGMMA {mma} LDL/STL {local}")
"""


@pytest.mark.slow
def test_stream_k_compiles_for_sm90_without_spills():
    """The stream-K kernel at the tile it was made for (128x256x128, 8 warps, 3 stages;
    per-tensor scales, pointer and TMA loads) and at block scales' 128x128 with TMA loads
    compiles for sm_90 (no GPU: scripts/sass_decode.py's capture of the launch) to fp8
    wgmma without spills (a fixup that summed the whole [128, 256] tile beside the
    accumulator spilled 848 bytes a thread: it sums 64 columns at a time)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[2] / "scripts"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _STREAM_K_AOT, str(scripts)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("Triton's bundled ptxas is missing")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3, proc.stdout
    for line in lines:
        assert "STACK:0 " in line and "LDL/STL 0" in line and "QGMMA 0 " not in line, line


def test_tma_runner_offers_tactics_only_where_it_applies():
    runner = L.TritonFp8TmaRunner()
    A, B_nk, s = _fp8((1, 8, 256)), _fp8((1, 64, 256)), torch.ones(1)
    plain = L.Fp8Inputs(A, B_nk, s, s, torch.float16)
    assert L.tma_applies(plain) and runner.get_valid_tactics(plain, None)
    others = {
        "two batch entries": plain._replace(A=_fp8((2, 8, 256)), B=_fp8((2, 64, 256))),
        "rows of 200 bytes": plain._replace(A=_fp8((1, 8, 200)), B=_fp8((1, 64, 200))),
        "B not K-contiguous": plain._replace(B=_fp8((1, 256, 64)).transpose(1, 2)),
        "two fp8 formats": plain._replace(B=_fp8((1, 64, 256), E5M2)),
        "row groups": plain._replace(mode="row_groups", rows=torch.zeros(8, dtype=torch.int32)),
    }
    for why, inputs in others.items():
        assert not L.tma_applies(inputs), why
        assert runner.get_valid_tactics(inputs, None) == [], why


@pytest.mark.interpreter
def test_tma_runner_runs_what_it_does_not_take_on_the_pointer_kernel():
    A, B_nk = _fp8((2, 5, 200)), _fp8((2, 24, 200))
    sa, sb = torch.rand(1) + 0.5, torch.rand(1) + 0.5
    inputs = L.Fp8Inputs(A, B_nk, sa, sb, torch.float16)
    assert not L.tma_applies(inputs)
    C = L.TritonFp8TmaRunner().forward(inputs)
    expected = bmm_fp8_ref(A, B_nk.transpose(1, 2), sa, sb, torch.float16)
    _close(C, expected, scale=expected.abs().max().item())


# The decode kernel's tactics (block_m, block_n, block_k, split_k, warps, stages[,
# stream_k]): FMA tiles of 1 and 4 rows, a 16-row swap-AB dot, split K of 3 ending inside a
# tile (K = 200), and the stream-K schedule (its runs ending inside tiles) on 16 and 4 rows.
SMALL_M_TACTICS = [
    -1,
    (1, 16, 64, 1, 4, 1),
    (4, 16, 64, 3, 4, 1),
    (16, 32, 64, 2, 4, 1),
    (16, 32, 64, 1, 4, 1, 2),
    (4, 16, 64, 1, 4, 1, 1),
]


# An FMA tile holds the whole M (the runner offers no other): those pairs only.
SMALL_M_CASES = [
    (t, m) for t in SMALL_M_TACTICS for m in (1, 3, 16) if t == -1 or t[0] >= 16 or t[0] >= m
]


@pytest.mark.interpreter
@pytest.mark.parametrize("tactic,m", SMALL_M_CASES, ids=str)
@pytest.mark.parametrize("formats", [(E4M3, E4M3), (E5M2, E5M2)], ids=["e4m3", "e5m2"])
def test_small_m_runner_interpreter(tactic, m, formats):
    n, k = 40, 200
    A, B_nk = _fp8((1, m, k), formats[0]), _fp8((1, n, k), formats[1])
    sa, sb = torch.rand(1) + 0.5, torch.rand(1) + 0.5
    inputs = L.Fp8Inputs(A, B_nk, sa, sb, torch.float16)
    assert L.small_m_applies(inputs)
    C = L.TritonFp8SmallMRunner().forward(inputs, tactic)
    expected = bmm_fp8_ref(A, B_nk.transpose(1, 2), sa, sb, torch.float16)
    _close(C, expected, scale=expected.abs().max().item())


def test_small_m_runner_offers_tactics_only_where_it_applies():
    runner = L.TritonFp8SmallMRunner()
    A, B = _fp8((1, 8, 256)), _fp8((1, 64, 256))
    one = torch.ones(1)
    assert runner.get_valid_tactics(L.Fp8Inputs(A, B, one, one, torch.float16), None)
    others = [
        L.Fp8Inputs(A.expand(2, -1, -1), B.expand(2, -1, -1), one, one, torch.float16),  # batch
        L.Fp8Inputs(_fp8((1, 65, 256)), B, one, one, torch.float16),  # M over 64
        L.Fp8Inputs(A, B.to(E5M2), one, one, torch.float16),  # two formats
        L.Fp8Inputs(
            A,
            B,
            _block_scales(8, 256, 1, lead=(1,)),
            _block_scales(64, 256, 128, lead=(1,)),
            torch.float16,
            mode="block",
        ),  # fmt: skip
    ]
    for inputs in others:
        assert not L.small_m_applies(inputs)
        assert runner.get_valid_tactics(inputs, None) == []


@pytest.mark.interpreter
@pytest.mark.parametrize("tactic", [(16, 32, 64, 8, 3, 4, 2), (16, 16, 128, 1, 2, 4, 2)], ids=str)
def test_split_k_with_row_groups_and_masked_rows(tactic):
    """Split-K where each split loops over a tile's groups, and where tiles past a batch's
    valid rows only join the fixup."""
    m, n, k, groups = 21, 24, 300, 3
    a, b = _fp8((m, k)), _fp8((groups, n, k))
    sa, sb = _block_scales(m, k, 1), _block_scales(n, k, 128, lead=(groups,))
    m_indices = torch.randint(-1, groups, (m,), dtype=torch.int32)
    inputs = L.Fp8Inputs(a[None], b, sa[None], sb, torch.float16, rows=m_indices, mode="row_groups")
    C = L.TritonFp8Runner().forward(inputs, tactic)[0]
    expected = _grouped_expected(a, b, sa, sb, m_indices, torch.float16)
    _close(C, expected, scale=expected.abs().max().item())

    a3 = _fp8((groups, m, k))
    sa3 = _block_scales(m, k, 1, lead=(groups,))
    masked_m = torch.tensor([0, 17, 21], dtype=torch.int32)
    inputs = L.Fp8Inputs(a3, b, sa3, sb, torch.float16, rows=masked_m, mode="masked")
    C3 = L.TritonFp8Runner().forward(inputs, tactic)
    expected3 = block_scaled_mm_ref(a3, b, sa3, sb, (1, 128, 128), torch.float16)
    expected3 = expected3 * (torch.arange(m)[None, :] < masked_m[:, None])[..., None]
    _close(C3, expected3, scale=expected3.abs().max().item())


def test_reference_path_without_kernels(monkeypatch):
    """Where no kernel runs (a CPU without the interpreter) the references answer, in every
    mode."""
    monkeypatch.setattr(L.platform, "kernels_available", lambda device: False)
    launches = []
    monkeypatch.setattr(L, "launch_fp8", lambda *args: launches.append(args))
    A, B, sa, sb = _bmm_operands(2, 3, 16, 32)
    C = G.bmm_fp8(A, B, sa, sb, torch.bfloat16, backend="auto")
    _close(C, bmm_fp8_ref(A, B, sa, sb, torch.bfloat16), scale=C.float().abs().max().item())
    m_indices = torch.tensor([1, -1, 0, 1], dtype=torch.int32)
    a, b = _fp8((4, 256)), _fp8((2, 24, 256))
    sa2, sb2 = _block_scales(4, 256, 1), _block_scales(24, 256, 128, lead=(2,))
    C2 = G.group_deepgemm_fp8_nt_groupwise(a, b, sa2, sb2, m_indices, out_dtype=torch.float16)
    _close(C2, _grouped_expected(a, b, sa2, sb2, m_indices, torch.float16), scale=50.0)
    C3 = G.gemm_fp8_nt_groupwise(a, b[0], sa2, sb2[0], "K", out_dtype=torch.float16)
    _close(C3, block_scaled_mm_ref(a, b[0], sa2, sb2[0], out_dtype=torch.float16), scale=50.0)
    masked_m = torch.tensor([2, 0], dtype=torch.int32)
    C4 = G.batch_deepgemm_fp8_nt_groupwise(
        a.view(2, 2, 256), b, sa2.view(2, 2, 2), sb2, masked_m, 1, out_dtype=torch.float16
    )
    expected = block_scaled_mm_ref(
        a.view(2, 2, 256), b, sa2.view(2, 2, 2), sb2, out_dtype=torch.float16
    )
    expected[1] = 0
    _close(C4, expected, scale=50.0)
    assert not launches


@pytest.mark.interpreter
def test_flashinfer_autotune_example_runs_on_cpu():
    """FlashInfer's documented example, unchanged but for CPU tensors: the default backend
    (cuBLAS, whose runner runs the Triton kernel off CUDA) inside autotune()."""
    import flashtune as flashinfer

    A, B, A_scale, B_scale = _bmm_operands(2, 4, 32, 64)
    out_dtype = torch.bfloat16
    with flashinfer.autotune():
        out = flashinfer.gemm.bmm_fp8(A, B, A_scale, B_scale, dtype=out_dtype)
    expected = bmm_fp8_ref(A, B, A_scale, B_scale, out_dtype)
    _close(out, expected, scale=expected.float().abs().max().item())


@pytest.mark.slow  # about 15 s: every Triton tactic is profiled in the interpreter
@pytest.mark.interpreter
def test_autotune_auto_backend_saves_flashinfer_cache_on_cpu(tmp_path):
    """FlashInfer's documented example, unchanged but for CPU tensors and backend="auto":
    inside autotune() the tuner profiles cuBLAS's runner (the Triton default off CUDA) and
    the Triton tactics, picks one, and saves it in FlashInfer's cache format."""
    import ast
    import json

    import flashtune as flashinfer

    A, B, A_scale, B_scale = _bmm_operands(1, 4, 32, 64)
    out_dtype = torch.float16
    cache = tmp_path / "fp8.json"
    with flashinfer.autotune(cache=cache):
        out = flashinfer.gemm.bmm_fp8(A, B, A_scale, B_scale, dtype=out_dtype, backend="auto")
    expected = bmm_fp8_ref(A, B, A_scale, B_scale, out_dtype)
    _close(out, expected, scale=expected.abs().max().item())
    entries = json.loads(cache.read_text())
    assert "_metadata" in entries
    keys = [ast.literal_eval(k) for k in entries if not k.startswith("_")]
    # The file also holds what this process tuned before (other ops, other backends).
    (key,) = [k for k in keys if k[0] == "bmm_fp8"]
    op, runner, _profile = key
    assert entries[str(key)][0] == runner
    assert runner in (
        "CublasFp8Runner",
        "TritonFp8Runner",
        "TritonFp8TmaRunner",
        "TritonFp8SmallMRunner",
    )


# ------------------------------------------------------------------ errors (CPU, no kernel)


def _groupwise_args():
    a, b = _fp8((4, 256)), _fp8((8, 256))
    return a, b, _block_scales(4, 256, 1), _block_scales(8, 256, 128)


@pytest.mark.parametrize(
    "change,error,match",
    [
        ({"A": "bf16"}, TypeError, "A must be"),
        ({"dtype": torch.float32}, ValueError, "dtype must be"),
        ({"backend": "tensorrt"}, ValueError, "Unsupported backend"),
        ({"backend": "cutlass", "B": "e5m2"}, ValueError, "e5m2 is not supported"),
        ({"A": "e5m2", "B": "e5m2"}, ValueError, "both be float8_e5m2"),
        ({"B": "short_k"}, ValueError, "B must be"),
        ({"A_scale": "two"}, ValueError, "one .per-tensor. scale"),
        ({"A_scale": "f16"}, TypeError, "A_scale must be"),
        ({"out": "wrong_shape"}, ValueError, "out must have shape"),
    ],
)
def test_bmm_fp8_errors(change, error, match):
    A, B, sa, sb = _bmm_operands(2, 3, 16, 32)
    args = {"A": A, "B": B, "A_scale": sa, "B_scale": sb, "dtype": torch.bfloat16}
    make = {
        "bf16": lambda name: args[name].to(torch.bfloat16),
        "e5m2": lambda name: args[name].float().to(E5M2),
        "short_k": lambda name: B[:, :16],
        "two": lambda name: torch.ones(2),
        "f16": lambda name: sa.half(),
        "wrong_shape": lambda name: torch.empty(2, 3, 15, dtype=torch.bfloat16),
    }
    for name, value in change.items():
        args[name] = make[value](name) if isinstance(value, str) and value in make else value
    with pytest.raises(error, match=match):
        G.bmm_fp8(**args)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"scale_major_mode": None}, "scale_major_mode must be"),
        ({"scale_major_mode": "MN"}, "a_scale must have shape"),
        ({"scale_major_mode": "K", "mma_sm": 3}, "mma_sm must be 1 or 2"),
        ({"scale_major_mode": "K", "out_dtype": torch.float32}, "output dtype must be"),
        ({"scale_major_mode": "K", "backend": "cudnn"}, "backend must be"),
        (
            {"scale_major_mode": "K", "backend": "trtllm", "scale_granularity_mnk": (1, 128, 64)},
            "takes scale_granularity_mnk",
        ),
    ],
)
def test_gemm_fp8_nt_groupwise_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        G.gemm_fp8_nt_groupwise(*_groupwise_args(), **kwargs)


def test_mm_fp8_errors():
    a, w = _fp8((4, 256)), _fp8((8, 256))
    prepared = G.prepare_low_latency_gemm_weights(w)
    with pytest.raises(ValueError, match="Unsupported backend"):
        G.mm_fp8(a, prepared, backend="cutlass")
    with pytest.raises(ValueError, match="Unsupported output dtype"):
        G.mm_fp8(a, prepared, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="prepare_low_latency_gemm_weights"):
        G.mm_fp8(a, w)  # not in the block layout
    with pytest.raises(ValueError, match="b holds K = 128"):
        G.mm_fp8(a, prepared[:1])
    with pytest.raises(TypeError, match="a must be"):
        G.mm_fp8(a.float(), prepared)
    with pytest.raises(ValueError, match="multiple of 128"):
        G.prepare_low_latency_gemm_weights(w[:, :200])


def test_groupwise_shape_mismatch_and_indices_errors():
    a, b, sa, sb = _groupwise_args()
    with pytest.raises(ValueError, match="Shape mismatch"):
        G.gemm_fp8_nt_groupwise(a, b[:, :128], sa, sb, "K")
    bg, sbg = _fp8((2, 8, 256)), _block_scales(8, 256, 128, lead=(2,))
    with pytest.raises(ValueError, match="m_indptr must have 3 entries"):
        G.group_gemm_fp8_nt_groupwise(a, bg, sa, sbg, torch.tensor([0, 4], dtype=torch.int32))
    with pytest.raises(TypeError, match="m_indices must be"):
        G.group_deepgemm_fp8_nt_groupwise(a, bg, sa, sbg, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="masked_m must have shape"):
        G.batch_deepgemm_fp8_nt_groupwise(
            a[None], bg[:1], sa[None], sbg[:1], torch.zeros(2, dtype=torch.int32), 1
        )


def test_tactic_space_and_candidates():
    """Candidates fit Hopper's shared memory, their K step divides the scale block, the
    default is among them for every M, and decode shapes split K to fill the SMs."""
    smem, sms = 227 * 1024, 132
    for M in (1, 7, 64, 129, 4096):
        for N, K in ((4096, 7168), (576, 7168), (7168, 2048)):
            cands = cfg.fp8_candidates(M, N, K, sms)
            assert cands and all(cfg.tactic_fits(t, 128, smem, M, N, K) for t in cands)
            assert cfg.fp8_default_tactic(M, N, K, sms) in cands
            # Per-tensor scales: also 256-wide K steps, which block scales cannot take (and
            # their own stream-K tiles: block scales keep to 128 x 128 and below).
            wide = cfg.fp8_candidates(M, N, K, sms, per_tensor=True)
            assert {t for t in cands if not t.stream_k} < {t for t in wide if not t.stream_k}
            assert any(t.block_k == 256 for t in wide)
            assert all(cfg.tactic_fits(t, None, smem, M, N, K) for t in wide)
            assert not any(t.block_k == 256 for t in cands)
    decode = cfg.fp8_default_tactic(1, 576, 7168, sms)  # 9 output tiles on 132 SMs
    assert decode.split_k > 1
    assert cfg.fp8_default_tactic(1, 576, 7168, sms, batch=128).split_k == 1
    assert cfg.fp8_default_tactic(4096, 4096, 4096, sms).split_k == 1
    # The measured defaults (config.py): per-tensor scales take the wide tile at large M, block
    # scales and GPUs with less shared memory than its stages keep 128x128; medium M takes
    # 64x64 tiles with K split to about one wave.
    wide = cfg.fp8_default_tactic(4096, 4608, 7168, sms)
    assert (wide.block_m, wide.block_n) == (128, 256)
    assert cfg.fp8_default_tactic(4096, 4608, 7168, sms, block_scaled=True).block_n == 128
    assert cfg.fp8_default_tactic(4096, 4608, 7168, sms, smem=100 * 1024).block_n == 128
    medium = cfg.fp8_default_tactic(128, 576, 7168, sms)  # 18 output tiles on 132 SMs
    assert (medium.block_m, medium.block_n) == (64, 64) and medium.split_k > 1
    assert cfg.fp8_default_tactic(128, 7168, 2048, sms).split_k == 1  # 224 tiles: no split
    assert not cfg.tactic_fits(cfg.Fp8Tactic(128, 128, 128, 8, 1, 8, 3), 64, smem, 1, 64, 256)
    assert not cfg.tactic_fits(cfg.Fp8Tactic(16, 64, 128, 8, 4, 4, 3), None, smem, 1, 64, 256)
    assert len(list(cfg.Fp8Space())) > 100


def test_facade_names():
    import flashtune as flashinfer

    for name in ("bmm_fp8", "mm_fp8", "prepare_low_latency_gemm_weights"):
        assert getattr(flashinfer, name) is getattr(flashinfer.gemm, name)
        assert name in flashinfer.__all__
    for name in ("gemm_fp8_nt_groupwise", "group_gemm_fp8_nt_groupwise"):
        assert callable(getattr(flashinfer.gemm, name)) and name in flashinfer.gemm.__all__
        assert name not in flashinfer.__all__  # FlashInfer keeps them in flashinfer.gemm


# ------------------------------------------------------------------ GPU


def _gpu_formats():
    return [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)]


@pytest.mark.cuda
@pytest.mark.parametrize("b,m,n,k", [(1, 1, 1024, 7168), (16, 7, 80, 64), (4, 129, 520, 2000)])
@pytest.mark.parametrize("formats", _gpu_formats(), ids=["e4m3", "e4m3xe5m2", "e5m2xe4m3"])
@pytest.mark.parametrize("backend", ["cublas", "cutlass", "auto"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bmm_fp8_cuda(b, m, n, k, formats, backend, out_dtype):
    if backend == "cutlass" and E5M2 in formats:
        pytest.skip("FlashInfer's cutlass backend refuses e5m2")
    A, B, sa, sb = _bmm_operands(b, m, n, k, *formats, device="cuda")
    C = G.bmm_fp8(A, B, sa, sb, out_dtype, backend=backend)
    expected = bmm_fp8_ref(A, B, sa, sb, out_dtype)
    _close(C, expected, scale=expected.float().abs().max().item())


# The tiled kernel's runners and shapes: pointer loads (any batch, K off 16-byte rows) and TMA
# loads (one batch entry, 16-byte rows; M = 128 x N 4608 the medium-M tile's shape).
CANDIDATE_CASES = [
    ("pointer", (2, 1, 4096, 7168)),
    ("pointer", (3, 77, 200, 1000)),
    ("pointer", (1, 1024, 512, 384)),
    ("tma", (1, 1, 4096, 7168)),
    ("tma", (1, 77, 200, 1008)),
    ("tma", (1, 128, 4608, 7168)),
]


@pytest.mark.cuda
@pytest.mark.parametrize("loads,shape", CANDIDATE_CASES, ids=str)
@pytest.mark.parametrize("block", [False, True], ids=["tensor", "block"])
def test_every_candidate_tactic_cuda(loads, shape, block):
    b, m, n, k = shape
    A, B_nk = _fp8((b, m, k), device="cuda"), _fp8((b, n, k), device="cuda")
    if block:
        sa = _block_scales(m, k, 1, "cuda", lead=(b,))
        sb = _block_scales(n, k, 128, "cuda", lead=(b,))
        expected = block_scaled_mm_ref(A, B_nk, sa, sb, (1, 128, 128), torch.bfloat16)
    else:
        sa, sb = torch.rand(1, device="cuda") + 0.5, torch.rand(1, device="cuda") + 0.5
        expected = bmm_fp8_ref(A, B_nk.transpose(1, 2), sa, sb, torch.bfloat16)
    inputs = L.Fp8Inputs(A, B_nk, sa, sb, torch.bfloat16, mode="block" if block else "tensor")
    runner = L.TritonFp8TmaRunner() if loads == "tma" else L.TritonFp8Runner()
    assert loads == "pointer" or L.tma_applies(inputs)
    tactics = runner.get_valid_tactics(inputs, None)
    assert tactics
    for tactic in [-1, *tactics]:
        _close(runner.forward(inputs, tactic), expected, scale=expected.float().abs().max().item())


@pytest.mark.cuda
@pytest.mark.parametrize(
    "m,n,k", [(1, 7168, 2048), (5, 576, 7168), (16, 1536, 7168), (33, 72, 200)]
)
def test_every_small_m_tactic_cuda(m, n, k):
    A, B_nk = _fp8((1, m, k), device="cuda"), _fp8((1, n, k), device="cuda")
    sa, sb = torch.rand(1, device="cuda") + 0.5, torch.rand(1, device="cuda") + 0.5
    expected = bmm_fp8_ref(A, B_nk.transpose(1, 2), sa, sb, torch.bfloat16)
    inputs = L.Fp8Inputs(A, B_nk, sa, sb, torch.bfloat16)
    runner = L.TritonFp8SmallMRunner()
    tactics = runner.get_valid_tactics(inputs, None)
    assert tactics
    for tactic in [-1, *tactics]:
        _close(runner.forward(inputs, tactic), expected, scale=expected.float().abs().max().item())


@pytest.mark.cuda
@pytest.mark.parametrize("m,n,k", [(4096, 576, 7168), (128, 4608, 7168)])
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_stream_k_matches_scaled_mm_cuda(m, n, k, tma):
    """The shapes stream-K is for (wave quantization: 96 tiles of 128x256, 144 of 64x64 on
    132 SMs): every stream-K candidate against cuBLASLt, the same bits on a second call
    whichever program arrives last, and the counters left at zero."""
    A, B_nk = _fp8((1, m, k), device="cuda"), _fp8((1, n, k), device="cuda", scale=0.05)
    sa, sb = torch.rand(1, device="cuda") + 0.5, torch.rand(1, device="cuda") + 0.5
    expected = torch._scaled_mm(
        A[0], B_nk[0].T, scale_a=sa[0], scale_b=sb[0], out_dtype=torch.bfloat16
    )
    inputs = L.Fp8Inputs(A, B_nk, sa, sb, torch.bfloat16)
    runner = L.TritonFp8TmaRunner() if tma else L.TritonFp8Runner()
    tactics = [
        t for t in runner.get_valid_tactics(inputs, None) if len(t) == 8 and t[7] == cfg.STREAM_K
    ]
    assert tactics
    counters = L.split_k_counters(A.device, 1)
    for tactic in tactics:
        C = runner.forward(inputs, tactic)[0]
        _close(C, expected, scale=expected.float().abs().max().item())
        assert torch.equal(runner.forward(inputs, tactic)[0], C), tactic
        assert not torch.count_nonzero(counters), tactic


@pytest.mark.cuda
def test_cublas_runner_matches_scaled_mm_cuda():
    A, B, sa, sb = _bmm_operands(3, 64, 256, 512, device="cuda")
    C = G.bmm_fp8(A, B, sa, sb, torch.bfloat16, backend="cublas")
    for i in range(3):
        direct = torch._scaled_mm(A[i], B[i], scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        torch.testing.assert_close(C[i], direct, atol=0, rtol=0)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "m,n,k", [(1, 2112, 7168), (7, 576, 1536), (129, 7168, 2048), (4096, 4096, 4096)]
)
@pytest.mark.parametrize("mode", ["K", "MN"])
def test_gemm_fp8_nt_groupwise_cuda(m, n, k, mode):
    a, b = _fp8((m, k), device="cuda"), _fp8((n, k), device="cuda", scale=0.05)
    sa, sb = _block_scales(m, k, 1, "cuda"), _block_scales(n, k, 128, "cuda")
    args = (sa, sb) if mode == "K" else (sa.T.contiguous(), sb.T.contiguous())
    C = G.gemm_fp8_nt_groupwise(a, b, *args, scale_major_mode=mode)
    expected = block_scaled_mm_ref(a, b, sa, sb, (1, 128, 128), torch.bfloat16)
    _close(C, expected, scale=expected.float().abs().max().item())


@pytest.mark.cuda
@pytest.mark.parametrize("m,n,k", [(1, 2560, 32768), (16, 1536, 7168), (300, 576, 7168)])
def test_mm_fp8_cuda(m, n, k):
    a, w = _fp8((m, k), device="cuda"), _fp8((n, k), device="cuda", scale=0.05)
    alpha = torch.rand((), device="cuda") + 0.5
    C = G.mm_fp8(a, G.prepare_low_latency_gemm_weights(w, {}), alpha)
    one = torch.ones(1, device="cuda")
    expected = bmm_fp8_ref(a[None], w.T[None], alpha.reshape(1), one, torch.bfloat16)[0]
    _close(C, expected, scale=expected.float().abs().max().item())


@pytest.mark.cuda
def test_grouped_forms_cuda():
    groups, n, k = 8, 2048, 7168
    counts = torch.tensor([0, 1, 7, 129, 3, 300, 64, 17])
    m_indptr = torch.cat([torch.zeros(1), counts.cumsum(0)]).to(torch.int32).cuda()
    rows = int(counts.sum())
    a, b = _fp8((rows, k), device="cuda"), _fp8((groups, n, k), device="cuda", scale=0.05)
    sa, sb = _block_scales(rows, k, 1, "cuda"), _block_scales(n, k, 128, "cuda", lead=(groups,))
    groups_of_rows = torch.repeat_interleave(torch.arange(groups), counts).cuda()
    expected = torch.zeros(rows, n, dtype=torch.bfloat16, device="cuda")
    for g in range(groups):
        sel = groups_of_rows == g
        expected[sel] = block_scaled_mm_ref(a[sel], b[g], sa[sel], sb[g])
    C = G.group_gemm_fp8_nt_groupwise(a, b, sa, sb, m_indptr, scale_major_mode="K")
    _close(C, expected, scale=expected.float().abs().max().item())
    C2 = G.group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, groups_of_rows.to(torch.int32))
    _close(C2, expected, scale=expected.float().abs().max().item())


@pytest.mark.cuda
def test_autotune_example_cuda(tmp_path):
    """FlashInfer's documented example with backend="auto": the tuner measures cuBLAS and the
    Triton tactics, and the saved cache has the FlashInfer format."""
    import json

    import flashtune as flashinfer

    A, B, A_scale, B_scale = _bmm_operands(4, 48, 80, 64, device="cuda")
    out_dtype = torch.bfloat16
    cache = tmp_path / "fp8.json"
    with flashinfer.autotune(cache=cache):
        out = flashinfer.gemm.bmm_fp8(A, B, A_scale, B_scale, dtype=out_dtype, backend="auto")
    with flashinfer.autotune():  # FlashInfer's default backend (cuBLAS) as documented
        out2 = flashinfer.gemm.bmm_fp8(A, B, A_scale, B_scale, dtype=out_dtype)
    expected = bmm_fp8_ref(A, B, A_scale, B_scale, out_dtype)
    for C in (out, out2):
        _close(C, expected, scale=expected.float().abs().max().item())
    entries = json.loads(cache.read_text())
    runners = [v[0] for k, v in entries.items() if k != "_metadata" and "bmm_fp8" in k]
    assert runners and set(runners) <= {
        "CublasFp8Runner",
        "TritonFp8Runner",
        "TritonFp8SmallMRunner",
    }

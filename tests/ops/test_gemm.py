"""GEMM: every runner and a spread of tactics against gemm_ref.

On CPU the Triton kernels run in the interpreter (fp16/fp32, small odd shapes); bf16, fp8,
large shapes and every valid tactic run on the GPU (`-m cuda`).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from flashtune import platform
from flashtune.ops import gemm as G
from flashtune.ops.gemm import config as cfg
from flashtune.ops.gemm import launch as L
from flashtune.ops.gemm.reference import gemm_fp8_ref, gemm_ref
from flashtune.tune import TunableRunner

# (dtype, atol, rtol) with outputs of unit scale (B is divided by sqrt(K)).
TOL = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (3e-3, 3e-3),
    torch.bfloat16: (2e-2, 2e-2),
}
CPU_SHAPES = [(5, 123, 77), (1, 64, 33), (17, 40, 128)]  # K=128: EVEN_K, no K mask
RUNNERS = [L.CublasRunner(), L.TritonTiledRunner(), L.TritonSmallMRunner()]


def _inputs(M, N, K, dtype, device, layout="nk", bias=False):
    A = torch.randn(M, K, dtype=dtype, device=device)
    B = (torch.randn(N, K, dtype=torch.float32, device=device) / math.sqrt(K)).to(dtype)
    B_stored = B if layout == "nk" else B.T.contiguous()
    b = torch.randn(N, dtype=dtype, device=device) if bias else None
    return A, B, B_stored, b


def _check(C, A, B, bias=None, tol=None):
    atol, rtol = tol or TOL[A.dtype]
    expected = gemm_ref(A, B, bias)
    assert C.shape == expected.shape and C.dtype == expected.dtype
    torch.testing.assert_close(C.float(), expected.float(), atol=atol, rtol=rtol)


def _cpu_kernels(device):
    if device.type == "cpu" and not platform.kernels_available(device):
        pytest.skip("Triton interpreter not available")


# ------------------------------------------------------------------------------ CPU: kernels

# Tactics exercised in the interpreter: small blocks keep it fast; split-K of 2 and 3 (with
# an empty last split for K=33, block_k=32: 2 tiles over 3 splits).
TILED_TACTICS = [-1, (16, 32, 32, 1, 1, 4, 2), (32, 64, 32, 8, 2, 4, 2), (16, 32, 32, 8, 3, 4, 2)]
SMALL_M_TACTICS = [
    -1,
    (16, 32, 32, 1, 4, 2),
    (16, 16, 64, 3, 4, 2),
    (1, 16, 32, 2, 4, 2),
    (4, 16, 32, 1, 4, 2),
    (16, 32, 32, 1, 4, 2, 1),  # stream-K (split-K grid when M > block_m)
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape", CPU_SHAPES)
@pytest.mark.parametrize(
    "runner,tactic",
    [(L.CublasRunner(), -1)]
    + [(L.TritonTiledRunner(), t) for t in TILED_TACTICS]
    + [(L.TritonSmallMRunner(), t) for t in SMALL_M_TACTICS],
    ids=lambda x: x.name if isinstance(x, TunableRunner) else str(x),
)
def test_runner_tactics(runner, tactic, shape, dtype, device):
    _cpu_kernels(device)
    M, N, K = shape
    A, B, _, _ = _inputs(M, N, K, dtype, device)
    _check(runner.forward([A, B, None], tactic), A, B)


@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("runner", RUNNERS, ids=lambda r: r.name)
def test_runner_bias_layout_out(runner, layout, device):
    _cpu_kernels(device)
    M, N, K = 3, 45, 70
    A, B, B_stored, bias = _inputs(M, N, K, torch.float16, device, layout, bias=True)
    B_nk = B_stored if layout == "nk" else B_stored.T
    out = torch.empty(M, N, dtype=torch.float16, device=device)
    C = runner.forward([A, B_nk, bias, out], -1)
    assert C.data_ptr() == out.data_ptr()
    _check(out, A, B, bias)


@pytest.mark.parametrize("shape", [(1, 48, 96), (5, 40, 77)], ids=str)
def test_stream_k_schedules(shape, device):
    """Runs that cover several tiles, part of a tile, and tiles shared by 2-4 programs."""
    _cpu_kernels(device)
    M, N, K = shape
    A, B, _, bias = _inputs(M, N, K, torch.float16, device, bias=True)
    for block_m, programs in ((16, 1), (16, 3), (16, 7), (1 if M == 1 else 16, 5)):
        C = torch.empty(M, N, dtype=torch.float16, device=device)
        L.launch_small_m_streamk(
            A,
            B,
            C,
            bias,
            None,
            block_m=block_m,
            block_n=16,
            block_k=32,
            programs=programs,
            num_warps=4,
            num_stages=2,
        )
        _check(C, A, B, bias)
    assert int(L.split_k_counters(device, 1).abs().sum()) == 0


def test_split_k_leaves_counters_zero(device):
    _cpu_kernels(device)
    A, B, _, _ = _inputs(2, 50, 200, torch.float32, device)
    L.TritonSmallMRunner().forward([A, B, None], (16, 16, 32, 4, 4, 2))
    L.TritonTiledRunner().forward([A, B, None], (16, 32, 32, 1, 5, 4, 2))
    assert int(L.split_k_counters(device, 1).abs().sum()) == 0


# ------------------------------------------------------------------------- CPU: public API


@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("bias", [False, True])
def test_mm(layout, bias, device):
    A, B, B_stored, b = _inputs(7, 33, 65, torch.float16, device, layout, bias)
    _check(G.mm(A, B_stored, bias=b, b_layout=layout), A, B, b)
    out = torch.empty(7, 33, dtype=torch.float16, device=device)
    assert G.mm(A, B_stored, bias=b, out=out, b_layout=layout) is out
    _check(out, A, B, b)


def test_gemm_matches_definition_contract(device):
    A, B, _, _ = _inputs(4, 24, 40, torch.float16, device)
    _check(G.gemm(A, B), A, B)


def test_mm_empty(device):
    A = torch.randn(0, 16, dtype=torch.float16, device=device)
    B = torch.randn(8, 16, dtype=torch.float16, device=device)
    assert G.mm(A, B).shape == (0, 8)


def test_custom_op_and_compile(device):
    A, B, _, _ = _inputs(3, 20, 24, torch.float16, device)
    _check(torch.ops.flashtune.mm(A, B, None, "nk"), A, B)
    torch.library.opcheck(
        torch.ops.flashtune.mm.default,
        (A, B, None, "nk"),
        test_utils=("test_schema", "test_faketensor"),
    )
    compiled = torch.compile(lambda a, b: G.mm(a, b) * 2, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(A, B), G.mm(A, B) * 2)


def test_mm_fp8_reference_path():
    A = (torch.randn(4, 32) * 4).to(torch.float8_e4m3fn)
    B = (torch.randn(16, 32) * 4).to(torch.float8_e4m3fn)
    sa, sb = torch.tensor(0.5), torch.tensor([0.25])
    C = G.mm_fp8(A, B, sa, sb)
    assert C.dtype == torch.bfloat16 and C.shape == (4, 16)
    expected = (A.float() @ B.float().T) * 0.125
    torch.testing.assert_close(C.float(), expected, atol=0.0, rtol=1e-2)


BAD = [
    # (A, B, kwargs, exception, words in the message)
    ((4, 8), (6, 8), {"B_dtype": torch.float32}, TypeError, ["B", "float16", "float32"]),
    ((4, 8), (6, 9), {}, ValueError, ["K", "8", "(6, 9)"]),
    ((4, 8), (6, 8), {"b_layout": "kn"}, ValueError, ["[K, N]", "(6, 8)"]),
    ((8,), (6, 8), {}, ValueError, ["A", "2-D", "(8,)"]),
    ((4, 8), (6, 8), {"b_layout": "tn"}, ValueError, ["b_layout", "tn"]),
    ((4, 8), (6, 8), {"bias": (5,)}, ValueError, ["bias", "(6,)", "(5,)"]),
    ((4, 8), (6, 8), {"out": (4, 5)}, ValueError, ["out", "(4, 6)", "(4, 5)"]),
    ((4, 8), (6, 8), {"A_dtype": torch.int32}, TypeError, ["A", "int32"]),
]


@pytest.mark.parametrize("a_shape,b_shape,kw,exc,words", BAD)
def test_bad_input(a_shape, b_shape, kw, exc, words):
    A = torch.ones(a_shape, dtype=kw.pop("A_dtype", torch.float16))
    B = torch.randn(b_shape).to(kw.pop("B_dtype", torch.float16))
    for name in ("bias", "out"):
        if name in kw:
            kw[name] = torch.randn(kw[name]).half()
    with pytest.raises(exc) as info:
        G.mm(A, B, **kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_bad_input_not_a_tensor():
    with pytest.raises(TypeError, match="B must be a torch.Tensor"):
        G.mm(torch.randn(2, 3).half(), [[1.0]])


def test_bad_input_mixed_devices():
    A = torch.randn(2, 8).half()
    B = torch.randn(4, 8).half().to("meta")
    with pytest.raises(ValueError, match="B is on meta but A is on cpu"):
        G.mm(A, B)


# ------------------------------------------------------------------------------ tactic spaces


def test_tactic_spaces_enumerate_and_round_trip():
    tiled = list(cfg.TiledSpace(block_m=(16, 64), split_k=(1, 4)))
    assert len(tiled) == len(set(tiled)) == 2 * 4 * 3 * 2 * 2 * 2 * 4
    assert all(isinstance(t, cfg.TiledTactic) for t in tiled)
    t = tiled[5]
    assert cfg.TiledTactic.from_tactic(json.loads(json.dumps(t.as_tactic()))) == t
    small = list(cfg.SmallMSpace())
    assert small and all(s.block_m >= 16 or s.fma_registers() <= 64 for s in small)
    assert cfg.SmallMTactic.from_tactic(small[0].as_tactic()) == small[0]


def test_get_valid_tactics_are_json_tuples():
    A = torch.empty(8, 4096, dtype=torch.bfloat16, device="meta")
    B = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    for runner in RUNNERS:
        tactics = runner.get_valid_tactics([A, B, None], None)
        assert all(isinstance(t, tuple) for t in tactics)
        json.dumps(tactics)
    assert L.TritonSmallMRunner().get_valid_tactics([A, B, None], None)
    big = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    assert L.TritonSmallMRunner().get_valid_tactics([big, B, None], None) == []
    # The tuning config tunes M (input 0, dim 0) per power-of-two bucket.
    assert L.GEMM_TUNING.dynamic_dims[0].input_idx == 0
    assert L.GEMM_TUNING.dynamic_dims[0].bucket(17) == 32


# ---------------------------------------------------------------------------------- GPU


GPU_SHAPES = [
    (1, 4096, 4096),
    (7, 11008, 4096),
    (16, 128, 2048),
    (33, 5120, 2048),
    (300, 1000, 520),
    (1, 1024, 8192),
    (4096, 4096, 4096),
    (129, 4097, 4103),
]


@pytest.mark.cuda
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("runner", RUNNERS, ids=lambda r: r.name)
def test_gpu_bf16_default_tactic(runner, shape):
    M, N, K = shape
    A, B, _, _ = _inputs(M, N, K, torch.bfloat16, "cuda")
    _check(runner.forward([A, B, None], -1), A, B)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "shape", [(1, 4096, 4096), (8, 2048, 5376), (48, 3072, 3072), (257, 1536, 1000)], ids=str
)
@pytest.mark.parametrize("runner", RUNNERS[1:], ids=lambda r: r.name)
def test_gpu_every_valid_tactic(runner, shape):
    M, N, K = shape
    A, B, _, _ = _inputs(M, N, K, torch.bfloat16, "cuda")
    tactics = runner.get_valid_tactics([A, B, None], None)
    if runner.name == "TritonSmallMRunner" and M > 4 * cfg.SMALL_M:
        assert tactics == []
    for t in tactics:
        C = runner.forward([A, B, None], t)
        try:
            _check(C, A, B)
        except AssertionError as e:
            raise AssertionError(f"tactic {t}: {e}") from None


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_mm_bias_layout(layout, dtype):
    A, B, B_stored, b = _inputs(13, 3000, 2050, dtype, "cuda", layout, bias=True)
    B_nk = B_stored if layout == "nk" else B_stored.T
    # mm may pick cuBLAS, which reduces fp16 in reduced precision by default (torch's
    # allow_fp16_reduced_precision_reduction): 12 fp16 ulps seen at K=2050.
    cublas_tol = (1e-2, 1e-2) if dtype == torch.float16 else None
    _check(G.mm(A, B_stored, bias=b, b_layout=layout), A, B, b, tol=cublas_tol)
    for runner in RUNNERS[1:]:
        _check(runner.forward([A, B_nk, b], -1), A, B, b)
        _check(runner.forward([A, B_nk, b], runner.get_valid_tactics([A, B_nk], None)[-1]), A, B, b)


@pytest.mark.cuda
def test_gpu_split_k_in_cuda_graph():
    A, B, _, _ = _inputs(4, 4096, 4096, torch.bfloat16, "cuda")
    runner, tactic = L.TritonSmallMRunner(), (16, 64, 128, 8, 4, 3)
    runner.forward([A, B, None], tactic)  # warm up outside the graph
    out = torch.empty(4, 4096, dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner.forward([A, B, None, out], tactic)
    for _ in range(3):
        A.copy_(torch.randn_like(A))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, A, B)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(1, 4096, 4096), (16, 2048, 4096), (200, 1024, 1024)], ids=str)
def test_gpu_fp8(shape):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm89+")
    M, N, K = shape
    A = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
    B = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.tensor([0.1], device="cuda")
    sb = torch.tensor([0.02], device="cuda")
    expected = gemm_fp8_ref(A, B, sa, sb).float()
    for runner in RUNNERS:
        for t in [-1] + runner.get_valid_tactics([A, B, None], None)[:3]:
            C = runner.forward([A, B, None, None, (sa, sb)], t)
            assert C.dtype == torch.bfloat16
            torch.testing.assert_close(
                C.float(),
                expected,
                atol=2e-2 * math.sqrt(K) * 0.002,
                rtol=2e-2,
                msg=lambda m, r=runner, t=t: f"{r.name} {t}: {m}",
            )
    _ = G.mm_fp8(A, B, sa, sb)


# ---------------------------------------------------------------------------------- schema


def test_definition_equals_corpus(trace_corpus):
    from flashtune.data import Definition

    path = trace_corpus / "definitions" / "gemm" / "gemm_n4096_k4096.json"
    corpus = Definition.model_validate_json(path.read_text())
    # The corpus file is float16 (bf16 would differ only in the dtypes).
    A = torch.empty(7, 4096, dtype=torch.float16, device="meta")
    B = torch.empty(4096, 4096, dtype=torch.float16, device="meta")
    for op, args in ((G.gemm, (A, B)), (G.mm, (A, B))):
        ours = op.definition(*args)
        assert ours.name == corpus.name == "gemm_n4096_k4096"
        assert ours.op_type == corpus.op_type
        assert ours.axes == corpus.axes
        assert ours.inputs == corpus.inputs
        assert ours.outputs == corpus.outputs


def test_definition_variants_bias_and_kn():
    A = torch.empty(2, 64, dtype=torch.bfloat16, device="meta")
    B_kn = torch.empty(64, 96, dtype=torch.bfloat16, device="meta")
    bias = torch.empty(96, dtype=torch.bfloat16, device="meta")
    d = G.mm.definition(A, B_kn, bias=bias, b_layout="kn")
    assert d.name == "gemm_kn_n96_k64"
    assert d.inputs["B"].shape == ["K", "N"] and d.inputs["bias"].shape == ["N"]
    assert {s.dtype for s in [*d.inputs.values(), *d.outputs.values()]} == {"bfloat16"}

"""The fused-MoE decode path without the alignment (ops/moe/direct.py, MoETactic.direct).

On CPU the two kernels run in the interpreter: every quantization mode, routes to other
ranks' experts and tokens with no local route (exact zero rows), a token routed twice to one
expert, K split into parts (the interpreter gets 40 programs), odd H and I, repeat runs
giving the same bits and every counter left at zero; each for the three GEMM2 forms: route-
major (direct=1), by output tile (direct=2, with its top-k limit) and both GEMMs in one
launch (direct=3, one interpreter program). On the GPU (`-m cuda`) the real decode shapes
(DeepSeek-V3 EP8 fp8 block, Qwen3-30B-A3B fp8 and bf16) at T 1 and 4 in all three forms, and
a CUDA-graph capture that follows new routes (two launches and one).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from _moe_inputs import MODELS, assert_close_to_ref, draw_routes, make_inputs, need_kernels

from flashtune.ops.moe import config as cfg
from flashtune.ops.moe import direct as direct_module
from flashtune.ops.moe import grid
from flashtune.ops.moe.experts import (
    fused_experts,
    fused_experts_torch,
    resolve_tactic,
    split_k_counters,
)

# GEMM1 32 wide (several N tiles a route), GEMM2 64 wide; split up to 8 and never.
DIRECT = cfg.MoETactic(
    16, cfg.StageTile(32, 64, 1, 4, 2), cfg.StageTile(64, 64, 1, 4, 2), 1, 8, 1, 1
)
DIRECT_NO_SPLIT = cfg.MoETactic(
    16, cfg.StageTile(64, 32, 1, 4, 2), cfg.StageTile(32, 64, 1, 4, 2), 1, 1, 1, 1
)
# GEMM2 by output tile (direct=2): a tile's parts cut a token's (route, K step) sequence.
BY_TOKEN = replace(DIRECT, direct=2)
BY_TOKEN_NO_SPLIT = replace(DIRECT_NO_SPLIT, direct=2)
# Both GEMMs in one launch (direct=3): GEMM2's items wait on their routes' rows of C.
FUSED = replace(DIRECT, direct=3)
FUSED_NO_SPLIT = replace(DIRECT_NO_SPLIT, direct=3)


def _run_twice(x, w1, w2, ids, w, q, off, tactic):
    ref = fused_experts_torch(x, w1, w2, ids, w, quant=q, local_expert_offset=off)
    out = fused_experts(x, w1, w2, ids, w, quant=q, local_expert_offset=off, tactic=tactic)
    assert_close_to_ref(out, ref)
    again = fused_experts(x, w1, w2, ids, w, quant=q, local_expert_offset=off, tactic=tactic)
    assert torch.equal(out, again)  # parts summed in route and part order
    assert int(split_k_counters(x.device, 1).abs().sum()) == 0  # every counter back at 0
    return out


# Two cases in the main suite (about 8 s in the interpreter on 2 cores), the rest slow.
_MAIN = {("split", 3, "fp8_block"), ("token", 3, "fp8_per_tensor")}
DIRECT_CASES = [
    pytest.param(
        tactic,
        T,
        mode,
        id=f"{name}-{T}-{mode}",
        marks=() if (name, T, mode) in _MAIN else pytest.mark.slow,
    )
    for name, tactic in (
        ("split", DIRECT),
        ("whole", DIRECT_NO_SPLIT),
        ("token", BY_TOKEN),
        ("token-whole", BY_TOKEN_NO_SPLIT),
        ("fused", FUSED),
        ("fused-whole", FUSED_NO_SPLIT),
    )
    for T in (1, 3)
    for mode in ("bf16", "fp8_block", "fp8_per_tensor")
]


@pytest.mark.parametrize("tactic,T,mode", DIRECT_CASES)
def test_direct_matches_torch(tactic, T, mode, device, monkeypatch):
    need_kernels(device)
    monkeypatch.setattr(grid, "INTERPRETER_PROGRAMS", 40)
    # fp8 block scales need H and I in 128-blocks; the unquantized mode takes odd sizes.
    H, I = (256, 128) if mode != "bf16" else (200, 96)  # noqa: E741
    E, K, off = 4, 3, 2
    x, w1, w2, q = make_inputs(mode, T, H, I, E, device, torch.float16)
    ids, w = draw_routes(T, K, E + 4, device)
    _run_twice(x, w1, w2, ids, w, q, off, tactic)


@pytest.mark.slow  # about 6 s in the interpreter; the main suite keeps the zero-row test below
def test_direct_zero_rows_and_repeated_expert(device, monkeypatch):
    """Token 0 has no local route (an exact zero row), token 1 lists local expert 1 twice
    (both weights count), token 2 routes to all three local experts."""
    need_kernels(device)
    monkeypatch.setattr(grid, "INTERPRETER_PROGRAMS", 40)
    x, w1, w2, q = make_inputs("fp8_per_tensor", 3, 256, 128, 3, device)
    off = 5
    ids = torch.tensor([[0, 1, 9], [6, 6, 2], [7, 5, 6]], dtype=torch.int32, device=device)
    w = torch.rand(3, 3, device=device) + 0.1
    for tactic in (DIRECT, BY_TOKEN, FUSED):
        out = _run_twice(x, w1, w2, ids, w, q, off, tactic)
        assert (out[0] == 0).all()


def test_direct_no_local_route_overwrites_out(device):
    need_kernels(device)
    x, w1, w2, q = make_inputs("bf16", 2, 128, 64, 2, device, torch.float16)
    ids = torch.tensor([[4, 5], [6, 7]], dtype=torch.int32, device=device)
    for tactic in (DIRECT, BY_TOKEN, FUSED):
        out = torch.full((2, 128), 7.0, dtype=torch.bfloat16, device=device)
        got = fused_experts(x, w1, w2, ids, torch.rand(2, 2, device=device), out=out, tactic=tactic)
        assert got is out and (out == 0).all()


@pytest.mark.slow  # about 5 s in the interpreter
def test_by_token_past_its_top_k_takes_the_route_major_gemm2(device, monkeypatch):
    """Top-k 9 (more than GEMM2 by output tile packs): the route-major GEMM2 runs instead,
    GEMM1 leaving the route scale to it."""
    need_kernels(device)
    monkeypatch.setattr(grid, "INTERPRETER_PROGRAMS", 40)
    x, w1, w2, q = make_inputs("bf16", 2, 128, 64, 12, device, torch.float16)
    ids, w = draw_routes(2, 9, 12, device)
    _run_twice(x, w1, w2, ids, w, q, 0, BY_TOKEN)


@pytest.mark.slow  # about 8 s in the interpreter
@pytest.mark.parametrize("tactic", [DIRECT, None], ids=["direct", "general"])
def test_fp8_weights_with_fp16_c(tactic, device, monkeypatch):
    """FLASHTUNE_MOE_FP8_C_FP16=1: C in fp16 with fp8 weights, both paths."""
    need_kernels(device)
    monkeypatch.setenv("FLASHTUNE_MOE_FP8_C_FP16", "1")
    monkeypatch.setattr(grid, "INTERPRETER_PROGRAMS", 40)
    x, w1, w2, q = make_inputs("fp8_per_tensor", 3, 256, 128, 4, device)
    ids, w = draw_routes(3, 3, 6, device)
    t = tactic if tactic is not None else cfg.MoETactic(16, max_split=2)
    _run_twice(x, w1, w2, ids, w, q, 1, t)


@pytest.mark.slow  # about 12 s in the interpreter
@pytest.mark.parametrize("c16", ["bf16", "fp16"])
@pytest.mark.parametrize("tactic", [DIRECT, BY_TOKEN, None], ids=["direct", "token", "general"])
def test_intermediate_past_fp16_range(tactic, c16, device, monkeypatch):
    """An expert whose C passes 65504. By default C is bf16 and every row matches; with
    FLASHTUNE_MOE_FP8_C_FP16=1 its tokens get finite rows (C saturated, not inf, whose inf x 0
    would be NaN) and the other tokens their exact rows."""
    need_kernels(device)
    monkeypatch.setattr(grid, "INTERPRETER_PROGRAMS", 40)
    if c16 == "fp16":
        monkeypatch.setenv("FLASHTUNE_MOE_FP8_C_FP16", "1")
    x, w1, w2, q = make_inputs("fp8_per_tensor", 4, 256, 128, 2, device)
    up = q.output1_scales_scalar.clone()
    gate = q.output1_scales_gate_scalar.clone()
    up[1] *= 3e4  # expert 1's C is about 1e9 x C's unit scale
    gate[1] *= 3e4
    q = replace(q, output1_scales_scalar=up, output1_scales_gate_scalar=gate)
    ids = torch.tensor([[0, 0], [0, 1], [1, 0], [0, 0]], dtype=torch.int32, device=device)
    w = torch.rand(4, 2, device=device) + 0.1
    ref = fused_experts_torch(x, w1, w2, ids, w, quant=q)
    assert ref[1:3].abs().amax() > 1e5  # the case is the overflow, not its absence
    t = tactic if tactic is not None else cfg.MoETactic(16, max_split=2)
    out = fused_experts(x, w1, w2, ids, w, quant=q, tactic=t)
    assert torch.isfinite(out.float()).all()
    if c16 == "bf16":
        assert_close_to_ref(out, ref)
    else:
        assert_close_to_ref(out[0::3], ref[0::3])


def test_one_launch_grid_holds_only_programs_sure_to_be_resident():
    # GEMM2 items wait on GEMM1 items: a program off the GPU would hang the launch.
    assert direct_module._resident_per_sm(4) == 2  # 2 x 128 threads x 255 registers fit
    assert direct_module._resident_per_sm(8) == 1
    assert direct_module._resident_per_sm(16) == 1


def test_direct_tactic_form_and_limits(device):
    # Fifteen ints on the direct path; fourteen (as caches before it) off it.
    assert len(DIRECT.as_tactic()) == 15
    assert cfg.MoETactic.from_tactic(DIRECT.as_tactic()) == DIRECT
    assert len(cfg.MoETactic(16).as_tactic()) == 14
    x, w1, w2, q = make_inputs("bf16", cfg.DIRECT_MAX_ROUTES // 2 + 1, 64, 32, 2, device)
    with pytest.raises(ValueError, match="direct decode path"):
        resolve_tactic(DIRECT, x, w1, 2, q)
    assert not cfg.tactic_ok(
        cfg.MoETactic(16, direct=4), fp8_block=False, a_itemsize=2, w_itemsize=2
    )
    # A pick tuned at a bucket's T runs past the limit on the general path, same tiles.
    general = direct_module.within_direct_limit(DIRECT.as_tactic(), cfg.DIRECT_MAX_ROUTES + 1)
    assert general == replace(DIRECT, direct=0).as_tactic()
    assert direct_module.within_direct_limit(DIRECT.as_tactic(), 8) == DIRECT.as_tactic()
    # The default takes it where routes rarely share an expert (at most one a 4 experts).
    assert cfg.default_tactic(1, 8, 32, fp8_block=True, a_itemsize=1, w_itemsize=1).direct
    assert cfg.default_tactic(4, 8, 128).direct and not cfg.default_tactic(8, 8, 128).direct
    assert not cfg.default_tactic(4, 8, 32, fp8_block=True, a_itemsize=1, w_itemsize=1).direct
    # The tuner tries the direct path at decode sizes only.
    decode = cfg.candidates(1, 8, 32, fp8_block=True, a_itemsize=1, w_itemsize=1)
    assert any(t.direct for t in decode) and any(not t.direct for t in decode)
    assert not any(t.direct for t in cfg.candidates(64, 8, 32))


DIRECT_GPU = [
    (m, t) for m in ("deepseek-v3", "qwen3-30b-a3b", "qwen3-30b-a3b-bf16") for t in (1, 4)
]


@pytest.mark.cuda
@pytest.mark.parametrize("model,T", DIRECT_GPU, ids=[f"{m}-T{t}" for m, t in DIRECT_GPU])
def test_direct_real_shapes_cuda(model, T):
    mode, H, I, E, E_global, K = MODELS[model]  # noqa: E741
    device = torch.device("cuda")
    x, w1, w2, q = make_inputs(mode, T, H, I, E, device)
    off = E_global - E if E < E_global else 0
    for local in ((off, E), None):  # every token local at least once; spread over ranks
        ids, w = draw_routes(T, K, E_global, device, local=local)
        for t in [c for c in cfg.candidates(T, K, E, fp8_block=mode == "fp8_block",
                                            a_itemsize=x.element_size(),
                                            w_itemsize=w1.element_size()) if c.direct][:3]:  # fmt: skip
            _run_twice(x, w1, w2, ids, w, q, off, t)
            _run_twice(x, w1, w2, ids, w, q, off, replace(t, direct=2))
            _run_twice(x, w1, w2, ids, w, q, off, replace(t, direct=3))


@pytest.mark.cuda
@pytest.mark.parametrize("tactic", [DIRECT, FUSED], ids=["two-launches", "one-launch"])
def test_direct_cuda_graph_capture(tactic):
    device = torch.device("cuda")
    mode, H, I, E, E_global, K = MODELS["deepseek-v3"]  # noqa: E741
    T = 2
    x, w1, w2, q = make_inputs(mode, T, H, I, E, device)
    ids, w = draw_routes(T, K, E_global, device, local=(0, E))
    out = torch.empty(T, H, dtype=torch.bfloat16, device=device)
    fused_experts(x, w1, w2, ids, w, quant=q, out=out, tactic=tactic)  # compile first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_experts(x, w1, w2, ids, w, quant=q, out=out, tactic=tactic)
    ids.copy_(draw_routes(T, K, E_global, device, local=(0, E))[0])
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_ref(out, fused_experts_torch(x, w1, w2, ids, w, quant=q))

"""Fused-MoE experts (ops/moe/experts.py): the Triton path against the PyTorch path.

On CPU the Triton kernels run in the interpreter at small shapes (H=256, I=128/256, E 4-8,
K 2-3, T 1/3/17): experts with no tokens, routes to non-local experts, odd H and I in the
unquantized mode, fp8 block and per-tensor scales. On the GPU (`-m cuda`) the same tests
run on CUDA tensors, plus the real shapes (DeepSeek-V3 with 32 local experts, Qwen3-30B-A3B,
a gpt-oss-like H=I=2880) and a CUDA-graph capture.

Tolerances are the evaluator's for a bf16 output (bench/correctness.py): relative norm
1e-2, worst row 2.5e-2. The interpreter rounds bf16 toward zero (the GPU rounds to nearest),
which costs it about 6e-3 where the GPU's error is near 2e-3.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from _moe_inputs import (
    FP8,
    MODELS,
    assert_close_to_ref,
    draw_routes,
    make_inputs,
    need_kernels,
)

from flashtune.ops.moe import config as cfg
from flashtune.ops.moe import experts as experts_module
from flashtune.ops.moe import grid
from flashtune.ops.moe.align import align_routes, max_blocks
from flashtune.ops.moe.experts import (
    EXPERTS_TUNING,
    ExpertQuant,
    ExpertsInputs,
    FusedExpertsRunner,
    fused_experts,
    fused_experts_torch,
    fused_experts_triton,
)
from flashtune.tune import autotune
from flashtune.tune.runner import make_profile

# ------------------------------------------------------------------------ the PyTorch path


def _naive(x, w1, w2, ids, weights, offset):
    """One (token, k) at a time, in fp32: the contract as its prose says it."""
    T, H = x.shape
    E, two_i, _ = w1.shape
    inter = two_i // 2
    out = torch.zeros(T, H)
    for t in range(T):
        for k in range(ids.shape[1]):
            e = int(ids[t, k]) - offset
            if 0 <= e < E:
                g1 = w1[e].float() @ x[t].float()
                c = torch.nn.functional.silu(g1[inter:]) * g1[:inter]
                out[t] += float(weights[t, k]) * (w2[e].float() @ c)
    return out


def test_torch_path_matches_the_contract():
    T, H, I, E, K, off = 5, 64, 32, 4, 3, 2  # noqa: E741
    x, w1, w2, _ = make_inputs("bf16", T, H, I, E, "cpu", torch.float32)
    ids, w = draw_routes(T, K, E + 4, "cpu")
    got = fused_experts_torch(x, w1, w2, ids, w, local_expert_offset=off)
    torch.testing.assert_close(got, _naive(x, w1, w2, ids, w, off), atol=1e-5, rtol=1e-5)


def test_torch_path_fp8_block_dequantizes_like_the_definition():
    T, H, I, E, K = 3, 256, 128, 2, 2  # noqa: E741
    x, w1, w2, q = make_inputs("fp8_block", T, H, I, E, "cpu")
    ids, w = draw_routes(T, K, E, "cpu")
    b = cfg.QUANT_BLOCK
    xd = x.float() * q.hidden_states_scale.t().repeat_interleave(b, 1)
    w1d = w1.float() * q.gemm1_weights_scale.repeat_interleave(b, 1).repeat_interleave(b, 2)
    w2d = w2.float() * q.gemm2_weights_scale.repeat_interleave(b, 1).repeat_interleave(b, 2)
    got = fused_experts_torch(x, w1, w2, ids, w, quant=q)
    torch.testing.assert_close(got, _naive(xd, w1d, w2d, ids, w, 0), atol=1e-4, rtol=1e-4)


def test_matches_the_family_reference(device):
    # The MoE family's reference (ops/moe/reference.py, the Definitions' code) computes the
    # experts its own way: the Triton path must agree with it too, not only with ours.
    need_kernels(device)
    from flashtune.ops.moe.reference import run_experts_ref

    T, H, I, E, K, off = 9, 256, 128, 4, 3, 2  # noqa: E741
    x, w1, w2, q = make_inputs("fp8_per_tensor", T, H, I, E, device)
    ids, w = draw_routes(T, K, E + 4, device)

    def expert(e):
        s = q.output1_scales_scalar[e], q.output1_scales_gate_scalar[e]
        return w1[e].float(), w2[e].float(), *s, q.output2_scales_scalar[e]

    ref = run_experts_ref(x.float(), ids, w, off, E, expert)
    assert_close_to_ref(fused_experts(x, w1, w2, ids, w, quant=q, local_expert_offset=off), ref)


# ------------------------------------------------------------------------------ alignment


ALIGN_CASES = [
    (1, 8, 32, 0, 16),
    (17, 3, 4, 2, 16),
    (9, 2, 6, 0, 32),
    (40, 8, 128, 0, 16),
    pytest.param(130, 8, 33, 5, 64, marks=pytest.mark.slow),  # about 9 s in the interpreter
]


@pytest.mark.parametrize("T,K,E,off,block_m", ALIGN_CASES)
@pytest.mark.parametrize("method", ["torch", "kernel", "chunked"])
def test_alignment(T, K, E, off, block_m, method, device):
    use_kernel = method != "torch"
    if use_kernel:
        need_kernels(device)
    ids, _ = draw_routes(T, K, E + off + 3, device)
    # chunked: the two-launch kernels at chunks of 16 routes (several chunks, a last one
    # part full), as they run past ONE_PROGRAM_MAX_ROUTES routes.
    chunk = 16 if method == "chunked" else None
    al = align_routes(ids, E, off, block_m, use_kernel=use_kernel, chunk_routes=chunk)
    if use_kernel:  # the kernels give the PyTorch ops' tensors, row for row
        ref = align_routes(ids, E, off, block_m, use_kernel=False)
        for got, want in zip(al[:4], ref[:4], strict=True):
            assert torch.equal(got, want)
    ids, al = ids.cpu(), al._replace(**{f: getattr(al, f).cpu() for f in al._fields[:4]})
    assert int(al.used_blocks) == int((al.block_expert >= 0).sum())
    assert (al.block_expert[: int(al.used_blocks)] >= 0).all()
    flat = ids.reshape(-1).long() - off
    local = (flat >= 0) & (flat < E)
    assert al.num_blocks == max_blocks(T * K, E, block_m)
    assert al.sorted_ids.shape == (al.num_blocks * block_m,)
    rows = al.sorted_ids.long()
    real = rows < T * K
    # Every local route exactly once; no other route.
    assert sorted(rows[real].tolist()) == torch.nonzero(local).flatten().tolist()
    # Each block one expert's routes, padding only at a group's end.
    for b in range(al.num_blocks):
        blk = rows[b * block_m : (b + 1) * block_m]
        e = int(al.block_expert[b])
        if e < 0:
            assert (blk == T * K).all()
            continue
        r = blk[blk < T * K]
        assert len(r) > 0 and (flat[r] == e).all()
    # route_pos is the inverse.
    pos = al.route_pos.long()
    assert (pos[~local] == -1).all()
    assert (rows[pos[local]] == torch.nonzero(local).flatten()).all()


def test_alignment_decode_touches_only_routed_experts():
    # T=1, K=8 over 256 experts: 8 blocks at most, whatever the expert count.
    ids, _ = draw_routes(1, 8, 256, "cpu")
    al = align_routes(ids, 256, 0, 16)
    assert al.num_blocks == 8
    assert sorted(al.block_expert.tolist()) == sorted(ids.flatten().tolist())


# ------------------------------------------------------------------ Triton path vs PyTorch

CASES = [
    # mode, dtype, T, H, I, E, K, offset, ids drawn from
    ("bf16", torch.float16, 1, 256, 128, 4, 2, 0, 4),
    ("bf16", torch.float16, 3, 256, 256, 8, 3, 2, 12),
    ("bf16", torch.float16, 17, 256, 128, 6, 2, 1, 9),
    ("bf16", torch.bfloat16, 17, 256, 128, 4, 3, 0, 6),
    ("bf16", torch.float16, 5, 200, 96, 4, 2, 0, 4),  # H, I not multiples of the tiles
    ("fp8_block", FP8, 1, 256, 128, 4, 2, 0, 4),
    ("fp8_block", FP8, 3, 256, 256, 8, 3, 4, 16),
    ("fp8_block", FP8, 17, 256, 128, 5, 2, 1, 8),
    ("fp8_per_tensor", FP8, 1, 256, 128, 4, 3, 0, 4),
    ("fp8_per_tensor", FP8, 17, 256, 256, 6, 2, 2, 10),
]


@pytest.mark.parametrize(
    "mode,dtype,T,H,I,E,K,off,num_ids",
    # T=17 (several M-blocks per expert) runs in the slow step: the main suite's time limit.
    [pytest.param(*c, marks=pytest.mark.slow) if c[2] == 17 else c for c in CASES],
    ids=[f"{c[0]}-{c[1]}-T{c[2]}" for c in CASES],
)
def test_matches_torch(mode, dtype, T, H, I, E, K, off, num_ids, device):  # noqa: E741
    need_kernels(device)
    x, w1, w2, q = make_inputs(
        mode, T, H, I, E, device, dtype if mode == "bf16" else torch.bfloat16
    )
    ids, w = draw_routes(T, K, num_ids, device)
    out = fused_experts(x, w1, w2, ids, w, quant=q, local_expert_offset=off)
    ref = fused_experts_torch(x, w1, w2, ids, w, quant=q, local_expert_offset=off)
    assert_close_to_ref(out, ref)


def test_empty_experts_and_nonlocal_routes(device):
    # 8 local experts of which only 1 and 5 have tokens; the rest of the routes go to
    # experts of other ranks, and token 0 has no local route at all (an exact zero row).
    need_kernels(device)
    T, H, I, E, K, off = 6, 256, 128, 8, 3, 8  # noqa: E741
    x, w1, w2, q = make_inputs("fp8_block", T, H, I, E, device)
    ids = torch.tensor(
        [[0, 1, 2], [9, 30, 31], [13, 9, 3], [13, 20, 0], [9, 13, 7], [17, 18, 19]],
        dtype=torch.int32,
        device=device,
    )
    w = torch.rand(T, K, device=device) + 0.1
    out = fused_experts(x, w1, w2, ids, w, quant=q, local_expert_offset=off)
    ref = fused_experts_torch(x, w1, w2, ids, w, quant=q, local_expert_offset=off)
    assert_close_to_ref(out, ref)
    assert (out[0] == 0).all() and (out[5] == 0).all()


def test_no_local_route_gives_zeros(device):
    need_kernels(device)
    x, w1, w2, q = make_inputs("bf16", 3, 256, 128, 4, device, torch.float16)
    ids = torch.tensor([[4, 5], [6, 7], [100, 9]], dtype=torch.int32, device=device)
    out = torch.full((3, 256), 7.0, dtype=torch.bfloat16, device=device)
    got = fused_experts(x, w1, w2, ids, torch.rand(3, 2, device=device), quant=q, out=out)
    assert got is out and (out == 0).all()


TACTICS = [
    cfg.MoETactic(16, cfg.StageTile(32, 64, 8, 4, 2), cfg.StageTile(64, 32, 1, 4, 2)),
    (32, 64, 128, 1, 4, 3, 32, 128, 8, 4, 3),  # 11 ints: swap_ab 0
    cfg.MoETactic(16, cfg.StageTile(16, 128, 2, 4, 2), cfg.StageTile(16, 128, 2, 4, 2), 1),
    (16, 32, 64, 1, 4, 2, 64, 128, 1, 4, 2, 1),
    (32, 32, 64, 1, 4, 2, 32, 64, 1, 4, 2, 1),
    # 32-row blocks, GEMM1 on 16-row tiles (the second often only padding: skipped)
    cfg.MoETactic(32, cfg.StageTile(32, 64, 1, 4, 2), cfg.StageTile(64, 64, 1, 4, 2), 2, 1, 2),
]


# Every tactic with fp8 block scales; both orientations with 16-bit operands too. Three
# variants (~3 s each on 2 cores) run in the slow step: the main suite stays under 10 minutes.
_SLOW_TACTIC_CASES = {(2, "fp8_block"), (4, "fp8_block"), (2, "bf16")}
TACTIC_CASES = [
    pytest.param(
        t,
        mode,
        id="-".join(map(str, cfg.MoETactic.from_tactic(t).as_tactic())) + f"-{mode}",
        marks=pytest.mark.slow if (i, mode) in _SLOW_TACTIC_CASES else (),
    )
    for i, t in enumerate(TACTICS)
    for mode in ("fp8_block", "bf16")
    if mode == "fp8_block" or i in (0, 2)
]


@pytest.mark.parametrize("tactic,mode", TACTIC_CASES)
def test_tactics_agree(tactic, mode, device):
    need_kernels(device)
    T, H, I, E, K = 17, 256, 256, 4, 2  # noqa: E741
    x, w1, w2, q = make_inputs(mode, T, H, I, E, device, torch.float16)
    ids, w = draw_routes(T, K, E, device)
    ref = fused_experts_torch(x, w1, w2, ids, w, quant=q)
    out = fused_experts(x, w1, w2, ids, w, quant=q, tactic=tactic)
    assert_close_to_ref(out, ref)


# Decode tactics that cut tiles over K (max_split) in each orientation: swapped both GEMMs,
# GEMM2 only, neither.
SPLIT_TACTICS = [
    cfg.MoETactic(16, cfg.StageTile(32, 64, 1, 4, 2), cfg.StageTile(64, 64, 1, 4, 2), 1, 4),
    cfg.MoETactic(16, cfg.StageTile(32, 64, 1, 4, 2), cfg.StageTile(32, 64, 1, 4, 2), 2, 8),
    cfg.MoETactic(32, cfg.StageTile(64, 32, 1, 4, 2), cfg.StageTile(64, 64, 1, 4, 2), 0, 3),
    cfg.MoETactic(32, cfg.StageTile(32, 64, 1, 4, 2), cfg.StageTile(64, 64, 1, 4, 2), 2, 4, 2),
]


# The main suite runs the first tactic with fp8 block scales at T=1 (the main suite stays
# under 10 minutes); the rest of the grid runs in the slow step (each case is about 4 s in the
# interpreter on 2 cores).
SPLIT_CASES = [
    pytest.param(
        T,
        t,
        mode,
        id=f"{T}-{'-'.join(map(str, t.as_tactic()))}-{mode}",
        marks=() if T == 1 and mode == "fp8_block" and t is SPLIT_TACTICS[0] else pytest.mark.slow,
    )
    for T in (1, 3)
    for t in SPLIT_TACTICS
    for mode in ("fp8_block", "fp8_per_tensor", "bf16")
]


@pytest.mark.parametrize("T,tactic,mode", SPLIT_CASES)
def test_split_k_parts_agree_and_repeat(T, tactic, mode, device, monkeypatch):
    """Few tiles for many programs: each tile's K steps are cut into parts whose partials
    the last part to arrive sums (in part order: the same bits on every run). On CPU the
    interpreter gets 40 programs so that both GEMMs split; H 384 with 64-deep steps (6 steps,
    uneven parts) and odd H with 32-deep steps in the unquantized mode."""
    need_kernels(device)
    monkeypatch.setattr(grid, "INTERPRETER_PROGRAMS", 40)
    H = 384 if mode != "bf16" else 200
    x, w1, w2, q = make_inputs(mode, T, H, 128, 4, device, torch.float16)
    ids, w = draw_routes(T, 2, 4, device)
    ref = fused_experts_torch(x, w1, w2, ids, w, quant=q)
    out = fused_experts(x, w1, w2, ids, w, quant=q, tactic=tactic)
    assert_close_to_ref(out, ref)
    again = fused_experts(x, w1, w2, ids, w, quant=q, tactic=tactic)
    assert torch.equal(out, again)
    # The counters are left at zero for the next launch.
    locks = experts_module.split_k_counters(x.device, 1)
    assert int(locks[:64].abs().sum()) == 0


def test_deterministic_and_out(device):
    need_kernels(device)
    x, w1, w2, q = make_inputs("fp8_per_tensor", 9, 256, 128, 4, device)
    ids, w = draw_routes(9, 3, 4, device)
    a = fused_experts(x, w1, w2, ids, w, quant=q)
    out = torch.empty(9, 256, dtype=torch.bfloat16, device=device)
    b = fused_experts(x, w1, w2, ids, w, quant=q, out=out)
    assert b is out and torch.equal(a, b)


# ~3 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
@pytest.mark.slow
def test_runner_and_tuning_inputs(device):
    need_kernels(device)
    x, w1, w2, q = make_inputs("fp8_block", 3, 256, 128, 4, device)
    ids, w = draw_routes(3, 2, 6, device)
    runner = FusedExpertsRunner()
    inputs = ExpertsInputs.of(x, w1, w2, ids, w, q, 1)
    assert inputs.quant == q
    tactics = runner.get_valid_tactics(inputs, None)
    # 14 ints, 15 on the direct path; BLOCK_K divides 128
    assert tactics and all(len(t) in (14, 15) and t[2] <= 128 for t in tactics)
    ref = fused_experts_torch(x, w1, w2, ids, w, quant=q, local_expert_offset=1)
    assert_close_to_ref(runner.forward(inputs, tactics[0]), ref)
    assert_close_to_ref(runner.forward(inputs), ref)
    # The tuner's inputs at the profile's bucket (T=3 -> 4): valid, and the kernels run.
    profile = make_profile(inputs, EXPERTS_TUNING)
    assert profile[0] == (4, 256) and profile[5] == (2, 4)
    tuned = ExpertsInputs(*EXPERTS_TUNING.make_inputs(inputs, profile))
    assert tuned.hidden_states.shape == (4, 256) and tuned.hidden_states_scale.shape == (2, 4)
    assert tuned.topk_ids.shape == (4, 2) and tuned.gemm1_weights is w1
    local = tuned.topk_ids.long() - 1
    assert ((local >= 0) & (local < 4)).all()
    got = runner.forward(tuned)
    a = tuned
    assert_close_to_ref(
        got,
        fused_experts_torch(
            a.hidden_states,
            w1,
            w2,
            a.topk_ids,
            a.topk_weights,
            quant=a.quant,
            local_expert_offset=1,
        ),
    )


# ------------------------------------------------------------------------------ bad input


def _ok(mode="bf16"):
    x, w1, w2, q = make_inputs(mode, 3, 256, 128, 2, "cpu")
    ids = torch.zeros(3, 2, dtype=torch.int32)
    return x, w1, w2, ids, torch.rand(3, 2), q


def test_bad_input():
    x, w1, w2, ids, w, q = _ok()
    with pytest.raises(ValueError, match="gemm2_weights"):
        fused_experts(x, w1, w2[:, :, :64], ids, w, quant=q)
    with pytest.raises(ValueError, match="gemm1_weights"):
        fused_experts(x, w1[:, :, :128], w2, ids, w, quant=q)
    with pytest.raises(ValueError, match="topk_weights"):
        fused_experts(x, w1, w2, ids, w[:, :1], quant=q)
    with pytest.raises(TypeError, match="topk_ids"):
        fused_experts(x, w1, w2, ids.float(), w, quant=q)
    with pytest.raises(ValueError, match="out"):
        fused_experts(x, w1, w2, ids, w, quant=q, out=torch.empty(3, 256))
    with pytest.raises(ValueError, match="out"):
        strided = torch.empty(256, 3, dtype=torch.bfloat16).t()
        fused_experts(x, w1, w2, ids, w, quant=q, out=strided)
    with pytest.raises(ValueError, match="E_local"):
        fused_experts(x, w1[:0], w2[:0], ids, w, quant=q)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fused_experts(x, w1, w2, ids, w, quant=ExpertQuant("fp8_per_tensor"))
    xq, w1q, w2q, ids, w, qq = _ok("fp8_block")
    with pytest.raises(ValueError, match="gemm1_weights_scale"):
        fused_experts(xq, w1q, w2q, ids, w, quant=ExpertQuant("fp8_block", qq.hidden_states_scale))
    with pytest.raises(ValueError, match="hidden_states_scale"):
        bad = ExpertQuant(
            "fp8_block", qq.hidden_states_scale.t(), qq.gemm1_weights_scale, qq.gemm2_weights_scale
        )
        fused_experts(xq, w1q, w2q, ids, w, quant=bad)
    with pytest.raises(ValueError, match="multiples of 128"):
        fused_experts(xq[:, :200], w1q[:, :, :200], w2q[:, :200], ids, w, quant=qq)
    with pytest.raises(ValueError, match="quant.mode"):
        fused_experts(x, w1, w2, ids, w, quant=ExpertQuant("int4"))  # type: ignore[arg-type]


def test_bad_tactic(device):
    need_kernels(device)
    xq, w1q, w2q, ids, w, qq = _ok("fp8_block")
    # fp8 block scales need BLOCK_K dividing 128.
    t = cfg.MoETactic(16, cfg.StageTile(32, 256, 1, 4, 2), cfg.StageTile(32, 64, 1, 4, 2))
    with pytest.raises(ValueError, match="tactic"):
        fused_experts_triton(
            xq.to(device),
            w1q.to(device),
            w2q.to(device),
            ids.to(device),
            w.to(device),
            quant=ExpertQuant(
                "fp8_block",
                *(
                    s.to(device)
                    for s in (
                        qq.hidden_states_scale,
                        qq.gemm1_weights_scale,
                        qq.gemm2_weights_scale,
                    )
                ),
            ),
            tactic=t,
        )
    with pytest.raises(ValueError, match="14 ints"):
        cfg.MoETactic.from_tactic((16, 32))


# --------------------------------------------------------------------------------- config


def test_config():
    t = cfg.MoETactic(32, cfg.StageTile(64, 128, 8, 4, 3), cfg.StageTile(128, 64, 1, 8, 4))
    assert cfg.MoETactic.from_tactic(t.as_tactic()) == t
    for T, K, E in [(1, 8, 32), (16, 8, 32), (64, 8, 128), (512, 8, 32), (4096, 8, 32)]:
        for fp8_block, a, w in [(False, 2, 2), (True, 1, 1), (False, 1, 1)]:
            d = cfg.default_tactic(T, K, E, fp8_block=fp8_block, a_itemsize=a, w_itemsize=w)
            assert cfg.tactic_ok(d, fp8_block=fp8_block, a_itemsize=a, w_itemsize=w)
            cands = cfg.candidates(T, K, E, fp8_block=fp8_block, a_itemsize=a, w_itemsize=w)
            assert cands and all(
                cfg.tactic_ok(c, fp8_block=fp8_block, a_itemsize=a, w_itemsize=w) for c in cands
            )
    assert cfg.bucket_of(1, 8, 32) == "decode" and cfg.bucket_of(4096, 8, 32) == "large"


# ------------------------------------------------------------------------ GPU, real shapes

# (name, mode, H, I, E_local, E_global, K)
GPU_CASES = [
    ("deepseek-v3", 1),
    ("deepseek-v3", 16),
    ("deepseek-v3", 512),
    ("qwen3-30b-a3b", 1),
    ("qwen3-30b-a3b", 64),
    ("qwen3-30b-a3b-bf16", 1),
    ("qwen3-30b-a3b-bf16", 64),
    ("gpt-oss-like", 1),
    ("gpt-oss-like", 100),
]


@pytest.mark.cuda
@pytest.mark.parametrize("model,T", GPU_CASES, ids=[f"{m}-T{t}" for m, t in GPU_CASES])
def test_real_shapes_cuda(model, T):
    mode, H, I, E, E_global, K = MODELS[model]  # noqa: E741
    device = torch.device("cuda")
    x, w1, w2, q = make_inputs(mode, T, H, I, E, device)
    # This rank holds experts [off, off + E) of E_global; every token routes here at least once.
    off = E_global - E if E < E_global else 0
    ids, w = draw_routes(T, K, E_global, device, local=(off, E))
    out = fused_experts(x, w1, w2, ids, w, quant=q, local_expert_offset=off)
    ref = fused_experts_torch(x, w1, w2, ids, w, quant=q, local_expert_offset=off)
    assert_close_to_ref(out, ref)
    # Candidate tactics of the regime agree too: four spread over the list (each one
    # compiles two kernels; the whole file must fit one 10-minute GPU call).
    tactics = FusedExpertsRunner().get_valid_tactics(
        ExpertsInputs.of(x, w1, w2, ids, w, q, off), None
    )
    for t in tactics[:: max(1, -(-len(tactics) // 4))]:
        assert_close_to_ref(
            fused_experts(x, w1, w2, ids, w, quant=q, local_expert_offset=off, tactic=t), ref
        )


@pytest.mark.cuda
@pytest.mark.parametrize("T,E,block_m", [(4096, 32, 64), (3000, 256, 16), (129, 8, 128)])
def test_chunked_alignment_matches_torch_cuda(T, E, block_m):
    """The two-launch alignment at sizes past one program (DeepSeek-V3 EP8 at T=4096, 256
    local experts) gives the PyTorch ops' tensors, row for row."""
    device = torch.device("cuda")
    ids, _ = draw_routes(T, 8, E + 40, device)
    got = align_routes(ids, E, 20, block_m, use_kernel=True)
    want = align_routes(ids, E, 20, block_m, use_kernel=False)
    for g, w in zip(got[:4], want[:4], strict=True):
        assert torch.equal(g, w)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "blocks,factor", [("all", 1e-4), ("every_other", 1e-4), ("all", 40.0)]
)  # fmt: skip
def test_fp8_block_w2_scales_at_the_edges_of_fp16_cuda(blocks, factor, monkeypatch):
    """With C in fp16 (FLASHTUNE_MOE_FP8_C_FP16=1) GEMM2 dequantizes the W2 tile in fp16, its
    block scales pre-scaled by 64 (kernels._dequant_w2): scales 1e-4 x the usual ones
    (~1e-6, subnormal in fp16 without the pre-scale) in all blocks (the output is then
    theirs alone) or beside normal ones, and 40 x (~0.6: a block's largest weight ~270,
    w x s x 64 ~ 1e4), on the general path in both GEMM2 orientations."""
    monkeypatch.setenv("FLASHTUNE_MOE_FP8_C_FP16", "1")
    device = torch.device("cuda")
    T, H, I, E, K = 40, 512, 256, 4, 4  # noqa: E741
    x, w1, w2, q = make_inputs("fp8_block", T, H, I, E, device)
    scales = q.gemm2_weights_scale.clone()
    scales[:, :: 1 if blocks == "all" else 2] *= factor  # [E, H / 128, I / 128]: row blocks
    q = replace(q, gemm2_weights_scale=scales)
    ids, w = draw_routes(T, K, E, device)
    ref = fused_experts_torch(x, w1, w2, ids, w, quant=q)
    for tactic in (None, cfg.MoETactic(64), cfg.MoETactic(64, swap_ab=2)):
        assert_close_to_ref(fused_experts(x, w1, w2, ids, w, quant=q, tactic=tactic), ref)


@pytest.mark.cuda
def test_float32_weights_cuda():
    """16-bit activations with float32 weights (the fp4 Definitions' contract): the kernels
    cast each weight tile in registers; the same output as the float32 PyTorch path."""
    device = torch.device("cuda")
    T, H, I, E, K = 37, 512, 256, 16, 4  # noqa: E741
    x = torch.randn(T, H, device=device).bfloat16()
    w1 = torch.randn(E, 2 * I, H, device=device) / H**0.5
    w2 = torch.randn(E, H, I, device=device) / I**0.5
    ids, w = draw_routes(T, K, E, device)
    out = fused_experts(x, w1, w2, ids, w)
    assert_close_to_ref(out, fused_experts_torch(x, w1, w2, ids, w))


@pytest.mark.cuda
@pytest.mark.parametrize("T", [4, 200])  # 200 x top-8 routes: the chunked alignment kernels
def test_cuda_graph_capture(T):
    device = torch.device("cuda")
    mode, H, I, E, E_global, K = MODELS["deepseek-v3"]  # noqa: E741
    x, w1, w2, q = make_inputs(mode, T, H, I, E, device)
    ids, w = draw_routes(T, K, E_global, device, local=(0, E))
    out = torch.empty(T, H, dtype=torch.bfloat16, device=device)
    fused_experts(x, w1, w2, ids, w, quant=q, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_experts(x, w1, w2, ids, w, quant=q, out=out)
    # New routes and activations in place: the replay must follow them.
    ids2, w_new = draw_routes(T, K, E_global, device, local=(0, E))
    ids.copy_(ids2)
    w.copy_(w_new)
    x.copy_(torch.randn(T, H, device=device).to(x.dtype))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_ref(out, fused_experts_torch(x, w1, w2, ids, w, quant=q))


@pytest.mark.cuda
def test_autotune_cuda(monkeypatch):
    # Inside autotune() a call without a tactic profiles its bucket's candidates, then runs
    # the pick; the result must still match.
    device = torch.device("cuda")
    mode, H, I, E, E_global, K = MODELS["qwen3-30b-a3b"]  # noqa: E741
    x, w1, w2, q = make_inputs(mode, 16, H, I, E, device)
    ids, w = draw_routes(16, K, E_global, device)
    # Four candidates keep the profiling short (the full list compiles 100+ kernels).
    few = experts_module.candidates
    monkeypatch.setattr(experts_module, "candidates", lambda *a, **k: few(*a, **k)[:4])
    with autotune(True) as tuner:
        tuned_before = tuner.stats.shapes_tuned
        out = fused_experts(x, w1, w2, ids, w, quant=q)
        assert tuner.stats.shapes_tuned == tuned_before + 1
    assert_close_to_ref(out, fused_experts_torch(x, w1, w2, ids, w, quant=q))
    assert_close_to_ref(
        fused_experts(x, w1, w2, ids, w, quant=q), fused_experts_torch(x, w1, w2, ids, w, quant=q)
    )


# ------------------------------------------------------------- compiles for sm_90, no GPU

# Run in a child process: the test process's kernels are the interpreter's (TRITON_INTERPRET
# is set before triton is imported), which triton.compile cannot take.
_AOT_CHILD = r"""
import json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashtune.ops.moe import direct_kernels as D
from flashtune.ops.moe import kernels as K
from flashtune.ops.moe.config import MoETactic

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
# Arguments a real launch specializes to 1 (unit strides) and those left unaligned.
ONES = {"stride_ah", "stride_wk", "stride_cn", "stride_ck", "stride_on", "stride_wsk", "stride_ast",
        "stride_w1k", "stride_w2k", "stride_w1sk", "stride_w2sk"}
UNALIGNED = {"num_routes", "TOP_K", "num_experts", "offset", "num_rows", "num_blocks"}
PTRS = {"q0": ("*bf16", "*bf16"), "q1": ("*fp8e4nv", "*fp8e4nv"), "q2": ("*fp8e4nv", "*fp8e4nv")}
C_PTR = {"q0": "*bf16", "q1": "*bf16", "q2": "*bf16"}  # C's type (fp16: FLASHTUNE_MOE_FP8_C_FP16)

def compile_one(fn, ptrs, consts, warps, stages):
    consts, sig, attrs = dict(consts), {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in ONES:
            consts[n] = 1
        if n in consts:
            sig[n] = "constexpr"
        elif n.endswith("_ptr"):
            sig[n] = ptrs.get(n, "*fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[n] = "i32"
            if n not in UNALIGNED:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
    spills = 0
    if os.path.exists(PTXAS):
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(k.asm["ptx"])
        out = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
        spills = sum(int(v) for v in re.findall(r"(\d+) bytes spill stores", out))
    return spills

results = []
for q, t in json.loads(sys.argv[1]):
    a, w = PTRS[f"q{q}"]
    cp = C_PTR[f"q{q}"]
    m = MoETactic.from_tactic(t)
    t1, t2 = m.gemm1, m.gemm2
    if m.direct == 3:  # both direct GEMMs in one launch
        p = {"a_ptr": a, "w1_ptr": w, "w2_ptr": w, "c_ptr": cp, "out_ptr": "*bf16",
             "ids_ptr": "*i32", "lock1_ptr": "*i32", "lock2_ptr": "*i32", "ready_ptr": "*i32"}
        c = dict(QUANT=q, HAS_A_SCALE=q == 1, DOT_F32=False, EVEN_K1=True, EVEN_K2=True,
                 R_PAD=16, TOP_K=8, BLOCK_N1=t1.block_n, BLOCK_K1=t1.block_k,
                 BLOCK_N2=t2.block_n, BLOCK_K2=t2.block_k, MAX_SPLIT=m.max_split, PARTS_PAD1=8,
                 PARTS_PAD2=64, MIN_STEPS=1, MAX_ROUTES=64, USE_PDL=True)
        spills = compile_one(D._moe_direct_fused_kernel, p, c, t1.num_warps, t1.num_stages)
        results.append([q, t, spills, spills])
        continue
    if m.direct:  # the decode path without the alignment (direct_kernels.py)
        cd = dict(QUANT=q, DOT_F32=False, EVEN_K=True, MAX_SPLIT=m.max_split, TOP_K=8, R_PAD=16)
        p1 = {"a_ptr": a, "w_ptr": w, "c_ptr": cp, "ids_ptr": "*i32", "lock_ptr": "*i32"}
        p2 = {"c_ptr": cp, "w_ptr": w, "out_ptr": "*bf16", "ids_ptr": "*i32",
              "lock_ptr": "*i32"}
        c1 = dict(cd, HAS_A_SCALE=q == 1, BLOCK_N=t1.block_n, BLOCK_K=t1.block_k, PARTS_PAD=8,
                  MIN_STEPS=1, SCALE_C=m.direct == 2)
        c2 = dict(cd, BLOCK_N=t2.block_n, BLOCK_K=t2.block_k, PARTS_PAD=64, MIN_STEPS=1)
        k2 = D._moe_direct_gemm2_kernel
        if m.direct == 2:  # GEMM2 by output tile
            k2 = D._moe_direct_gemm2_by_token_kernel
            c2 = dict(cd, BLOCK_N=t2.block_n, BLOCK_K=t2.block_k, PARTS_PAD=8, KP=8)
        results.append([q, t,
                        compile_one(D._moe_direct_gemm1_kernel, p1, c1, t1.num_warps, t1.num_stages),
                        compile_one(k2, p2, c2, t2.num_warps, t2.num_stages)])
        continue
    common = dict(QUANT=q, DOT_F32=False, EVEN_K=True, MAX_SPLIT=m.max_split)
    p1 = {"a_ptr": a, "w_ptr": w, "c_ptr": cp, "sorted_ids_ptr": "*i32",
          "block_expert_ptr": "*i32", "used_blocks_ptr": "*i32", "lock_ptr": "*i32"}
    c1 = dict(common, HAS_A_SCALE=q == 1, BLOCK_N=t1.block_n, BLOCK_K=t1.block_k,
              GROUP_M=t1.group_m, SWAP_AB=m.swap1, BLOCK_M=m.gemm1_rows, SUB=m.gemm1_sub)
    p2 = {"c_ptr": cp, "w_ptr": w, "o_ptr": "*bf16", "sorted_ids_ptr": "*i32",
          "block_expert_ptr": "*i32", "used_blocks_ptr": "*i32", "lock_ptr": "*i32"}
    c2 = dict(common, BLOCK_N=t2.block_n, BLOCK_K=t2.block_k, GROUP_M=t2.group_m,
              SWAP_AB=m.swap2, BLOCK_M=m.block_m)
    results.append([q, t,
                    compile_one(K._moe_gemm1_swiglu_kernel, p1, c1, t1.num_warps, t1.num_stages),
                    compile_one(K._moe_gemm2_kernel, p2, c2, t2.num_warps, t2.num_stages)])
ids = {"topk_ids_ptr": "*i32", "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32",
       "route_pos_ptr": "*i32", "used_ptr": "*i32"}
compile_one(K._moe_align_kernel, ids, dict(BLOCK_M=16, NBINS=32, BLOCK=128), 8, 1)
compile_one(K._moe_combine_kernel, {"out_ptr": "*bf16", "route_pos_ptr": "*i32"},
            dict(BLOCK_H=1024), 4, 1)
print(json.dumps(results))
"""


@pytest.mark.slow
def test_kernels_compile_for_sm90_without_spills():
    """The default tactics of every mode at DeepSeek-V3 / Qwen3 regimes compile for sm_90
    (the H200) through ptxas, with no register spills: what the interpreter cannot check."""
    import json
    import os
    import subprocess
    import sys

    cases = []
    for q, (a_size, fp8_block) in enumerate([(2, False), (1, True), (1, False)]):
        for T, K, E, inter, hidden in [(1, 8, 32, 2048, 7168), (512, 8, 32, 2048, 7168),
                                       (4096, 8, 32, 2048, 7168), (64, 8, 128, 768, 2048)]:  # fmt: skip
            t = cfg.default_tactic(
                T, K, E, fp8_block=fp8_block, a_itemsize=a_size, w_itemsize=a_size,
                inter=inter, hidden=hidden,
            )  # fmt: skip
            cases.append((q, t.as_tactic()))
        # The direct path's candidates at decode (the tuner's; none is a default yet).
        cases += [
            (q, t.as_tactic())
            for t in cfg.candidates(
                1, 8, 32, fp8_block=fp8_block, a_itemsize=a_size, w_itemsize=a_size
            )  # fmt: skip
            if t.direct
        ]
        cases += [(q, replace(cfg._DIRECT, direct=d).as_tactic()) for d in (2, 3)]
    cases = list(dict.fromkeys(cases))  # the regimes share some defaults
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _AOT_CHILD, json.dumps(cases)],
        env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for q, tactic, spill1, spill2 in json.loads(proc.stdout.strip().splitlines()[-1]):
        if tuple(tactic) in cfg.MEASURED_SPILLING:
            continue  # kept by measurement on the GPU (config.py says which and why)
        assert spill1 == 0 and spill2 == 0, f"quant {q} tactic {tactic}: spills {spill1}, {spill2}"

"""flashtune.fused_moe under FlashInfer's names: the routing methods (each against a plain
per-token computation), the three MoE calls against their references (fp8 block scale,
fp8 per tensor, bf16; expert parallelism; Llama-4's weight on the input), FlashInfer's
signatures, and clear errors for bad arguments. CPU: small shapes; the same on a GPU."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import flashtune as flashinfer
from flashtune.ops.moe import (
    RoutingMethodType,
    moe_bf16_ref,
    moe_fp8_block_scale_ref,
    moe_fp8_per_tensor_scale_ref,
    select_experts,
    trtllm_bf16_moe,
    trtllm_fp8_block_scale_moe,
    trtllm_fp8_per_tensor_scale_moe,
)

F8 = torch.float8_e4m3fn


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- the enum


def test_routing_method_type_is_flashinfers():
    """FlashInfer's names and values (0.2.14 defines 0-5; later FlashInfer adds 6-9 and
    moves Unspecified to 10)."""
    assert {m.name: m.value for m in RoutingMethodType} == {
        "Default": 0,
        "Renormalize": 1,
        "DeepSeekV3": 2,
        "Llama4": 3,
        "RenormalizeNaive": 4,
        "TopK": 5,
        "SigmoidRenorm": 6,
        "MiniMax2": 7,
        "Sigmoid": 8,
        "TopKSigmoid": 9,
        "Unspecified": 10,
    }
    assert flashinfer.fused_moe.RoutingMethodType is RoutingMethodType
    assert flashinfer.RoutingMethodType.DeepSeekV3 == 2
    assert repr(RoutingMethodType.Llama4) == "RoutingMethodType.Llama4"


# --------------------------------------------------------------------------- routing


def _per_token(logits: torch.Tensor, bias: torch.Tensor | None, method: int, k: int,
               n_group: int, topk_group: int, scale: float) -> list[dict[int, float]]:  # fmt: skip
    """Each token's {expert: weight}, one token at a time in plain Python (float64)."""
    rows = []
    for row in logits.double().tolist():
        e = len(row)
        b = [0.0] * e if bias is None else bias.double().tolist()
        sig = [1 / (1 + math.exp(-x)) for x in row]
        if method in (2, 7):
            biased = [s + bb for s, bb in zip(sig, b, strict=True)]
            allowed = list(range(e))
            if method == 2 and n_group > 1:
                size = e // n_group
                groups = sorted(
                    range(n_group),
                    key=lambda g: -sum(sorted(biased[g * size : (g + 1) * size])[-2:]),
                )[:topk_group]
                allowed = [x for g in groups for x in range(g * size, (g + 1) * size)]
            ids = sorted(allowed, key=lambda x: -biased[x])[:k]
            total = sum(sig[i] for i in ids)
            rows.append({i: sig[i] / total * scale for i in ids})
            continue
        x = [v + bb for v, bb in zip(row, b, strict=True)]
        m = max(x)
        soft = [math.exp(v - m) / sum(math.exp(w - m) for w in x) for v in x]
        if method in (0, 4):
            ids = sorted(range(e), key=lambda i: -soft[i])[:k]
            w = {i: soft[i] for i in ids}
            if method == 4:
                total = sum(w.values())
                w = {i: v / total for i, v in w.items()}
        elif method in (1, 5, 9, 3):
            ids = sorted(range(e), key=lambda i: -x[i])[: 1 if method == 3 else k]
            top = max(x[i] for i in ids)
            denom = sum(math.exp(x[i] - top) for i in ids)
            w = {
                i: math.exp(x[i] - top) / denom
                if method == 1
                else 1 / k
                if method == 5
                else 1 / (1 + math.exp(-x[i]))
                for i in ids
            }
        else:  # 6, 8: sigmoid, top-k (6 renormalized)
            s = [1 / (1 + math.exp(-v)) for v in x]
            ids = sorted(range(e), key=lambda i: -s[i])[:k]
            w = {i: s[i] for i in ids}
            if method == 6:
                total = sum(w.values())
                w = {i: v / total for i, v in w.items()}
        rows.append({i: v * scale for i, v in w.items()})
    return rows


@pytest.mark.parametrize("method", [m for m in RoutingMethodType if m.value < 10])
@pytest.mark.parametrize("with_bias", [False, True])
def test_select_experts_matches_a_per_token_computation(method, with_bias):
    gen = _gen(int(method) * 2 + with_bias)
    tokens, experts = 9, 32
    logits = torch.randn(tokens, experts, generator=gen) * 2
    bias = torch.randn(experts, generator=gen) * 0.5 if with_bias else None
    k = 1 if method == RoutingMethodType.Llama4 else 6
    ids, weights = select_experts(logits, bias, int(method), k, 4, 2, 2.5)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert ids.shape == weights.shape == (tokens, k)
    expected = _per_token(logits, bias, int(method), k, 4, 2, 2.5)
    for t in range(tokens):
        got = dict(zip(ids[t].tolist(), weights[t].tolist(), strict=True))
        assert set(got) == set(expected[t]), (t, sorted(got), sorted(expected[t]))
        for i, w in expected[t].items():
            assert got[i] == pytest.approx(w, rel=1e-5, abs=1e-6)


def test_deepseek_routing_keeps_its_experts_within_the_best_groups():
    """With 8 groups of 8, topk_group 4: every token's 8 experts lie in 4 groups at most, and
    each group kept holds one of the token's two best biased scores' pair."""
    gen = _gen(7)
    logits = torch.randn(64, 64, generator=gen)
    bias = torch.randn(64, generator=gen) * 0.1
    ids, weights = select_experts(logits, bias, 2, 8, 8, 4, 1.0)
    groups = (ids // 8).tolist()
    assert all(len(set(g)) <= 4 for g in groups)
    torch.testing.assert_close(weights.sum(-1), torch.ones(64))


def test_routing_refuses_bad_arguments():
    logits = torch.randn(3, 16)
    with pytest.raises(ValueError, match="Llama4 routing selects one expert"):
        select_experts(logits, None, 3, 2)
    with pytest.raises(ValueError, match="top_k must be in 1..16"):
        select_experts(logits, None, 1, 17)
    with pytest.raises(ValueError, match="n_group must divide"):
        select_experts(logits, None, 2, 2, 5, 2)
    with pytest.raises(ValueError, match="exceeds"):
        select_experts(logits, None, 2, 8, 8, 1)
    with pytest.raises(ValueError, match="Unspecified"):
        trtllm_bf16_moe(*_bf16_args(1, 16, 128, 64, 4, 2), routing_method_type=10,
                        use_shuffled_weight=False, weight_layout=0)  # fmt: skip


# --------------------------------------------------------------------------- the calls


def _quant_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., R, C] -> fp8 and one float32 scale per 128 x 128 block [..., R/128, C/128]."""
    *lead, r, c = x.shape
    blocks = x.float().reshape(*lead, r // 128, 128, c // 128, 128)
    scale = blocks.abs().amax(dim=(-3, -1)) / 448.0 + 1e-12
    q = (blocks / scale[..., :, None, :, None]).to(F8).reshape(x.shape)
    return q, scale


def _block_args(tokens: int, experts: int, hidden: int, inter: int, local: int, offset: int,
                seed: int = 0, k: int = 4) -> tuple:  # fmt: skip
    gen = _gen(seed)
    a = torch.randn(tokens, hidden, generator=gen) * 2
    groups = a.reshape(tokens, hidden // 128, 128)
    a_scale = groups.abs().amax(-1) / 448.0 + 1e-12  # [T, H/128]
    hidden_states = (groups / a_scale[..., None]).to(F8).reshape(tokens, hidden)
    w13, s13 = _quant_blocks(torch.randn(local, 2 * inter, hidden, generator=gen) * 0.05)
    w2, s2 = _quant_blocks(torch.randn(local, hidden, inter, generator=gen) * 0.05)
    logits = torch.randn(tokens, experts, generator=gen)
    bias = (torch.randn(experts, generator=gen) * 0.1).to(torch.bfloat16)
    return (logits, bias, hidden_states, a_scale.t().contiguous(), w13, s13, w2, s2, experts,
            k, 4, 2, inter, offset, local, 2.5)  # fmt: skip


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within 3% of the reference's norm, and 5% of its largest value everywhere: the fp8
    kernels may round GEMM1's output to fp8 before GEMM2 (experts.py)."""
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    g, w = got.float(), want.float()
    assert w.abs().max() > 0  # some token reached this rank's experts
    assert (g - w).norm() <= 3e-2 * w.norm(), ((g - w).norm() / w.norm()).item()
    assert (g - w).abs().max() <= 5e-2 * w.abs().max()


@pytest.mark.parametrize(("local", "offset"), [(8, 0), (2, 4)])
def test_fp8_block_scale_moe_deepseek_routing_matches_the_reference(local, offset):
    args = _block_args(7, 8, 128, 128, local, offset)
    got = trtllm_fp8_block_scale_moe(*args, routing_method_type=RoutingMethodType.DeepSeekV3)
    (logits, bias, hs, hs_scale, w13, s13, w2, s2, _, k, ng, kg, _, off, _, rsf) = args
    want = moe_fp8_block_scale_ref(logits, hs, hs_scale, w13, s13, w2, s2, bias, off, rsf, 2, k,
                                   ng, kg)  # fmt: skip
    _close(got, want)


def test_fp8_block_scale_moe_fills_output_and_routing_replay():
    args = list(_block_args(5, 8, 128, 128, 8, 0, seed=1))
    args[1] = None  # Renormalize: no bias
    output = torch.empty(5, 128, dtype=torch.bfloat16)
    replay = torch.full((8, 4), -1, dtype=torch.int16)
    got = flashinfer.fused_moe.trtllm_fp8_block_scale_moe(
        *args, routing_method_type=1, output=output, routing_replay_out=replay
    )
    assert got is output
    ids, _ = select_experts(args[0], None, 1, 4)
    assert torch.equal(replay[:5].sort(-1).values, ids.to(torch.int16).sort(-1).values)
    assert (replay[5:] == -1).all()
    want = moe_fp8_block_scale_ref(*[args[i] for i in (0, 2, 3, 4, 5, 6, 7)],
                                   routing_method_type=1, top_k=4, routed_scaling_factor=2.5)  # fmt: skip
    _close(got, want)


def _per_tensor_args(tokens: int, experts: int, hidden: int, inter: int, k: int,
                     seed: int = 0) -> tuple:  # fmt: skip
    gen = _gen(seed)
    hs = (torch.randn(tokens, hidden, generator=gen) * 4).to(F8)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) * 4).to(F8)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) * 4).to(F8)
    s1, s1g, s2 = (torch.rand(experts, generator=gen) * 0.01 + 0.001 for _ in range(3))
    logits = torch.randn(tokens, experts, generator=gen).to(torch.bfloat16)
    bias = torch.randn(experts, generator=gen).to(torch.bfloat16)
    return (logits, bias, hs, w13, s1, s1g, w2, s2, experts, k, None, None, inter, 0, experts,
            2.5)  # fmt: skip


def test_fp8_per_tensor_moe_llama4_weights_the_input_and_ignores_bias_and_scale():
    args = _per_tensor_args(5, 8, 128, 64, 1)
    got = trtllm_fp8_per_tensor_scale_moe(*args, True, routing_method_type=3)
    logits, _, hs, w13, s1, s1g, w2, s2 = args[:8]
    want = moe_fp8_per_tensor_scale_ref(logits, hs, w13, s1, s1g, w2, s2,
                                        routing_method_type=3, top_k=1)  # fmt: skip
    _close(got, want)
    # by hand for one token: sigmoid(top logit) scales the input before GEMM1
    t = 0
    e = int(logits[t].float().argmax())
    w = torch.sigmoid(logits[t].float().max())
    g1 = (hs[t].float() * w) @ w13[e].float().t()
    up, gate = g1[:64] * s1[e], g1[64:] * s1g[e]
    o = (torch.nn.functional.silu(gate) * up) @ w2[e].float().t() * s2[e]
    torch.testing.assert_close(got[t].float(), o, atol=2e-2, rtol=2e-2)


def test_fp8_per_tensor_moe_renormalize_matches_the_reference():
    args = list(_per_tensor_args(6, 8, 128, 64, 4, seed=2))
    args[1] = None
    got = trtllm_fp8_per_tensor_scale_moe(*args, False, routing_method_type=1)
    want = moe_fp8_per_tensor_scale_ref(*[args[i] for i in range(8) if i != 1],
                                        routing_method_type=1, top_k=4,
                                        routed_scaling_factor=2.5)  # fmt: skip
    _close(got, want)


def _bf16_args(tokens: int, experts: int, hidden: int, inter: int, k: int, local: int,
               seed: int = 0) -> tuple:  # fmt: skip
    gen = _gen(seed)
    hs = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    w13 = (torch.randn(local, 2 * inter, hidden, generator=gen) * 0.05).to(torch.bfloat16)
    w2 = (torch.randn(local, hidden, inter, generator=gen) * 0.05).to(torch.bfloat16)
    logits = torch.randn(tokens, experts, generator=gen)
    return (logits, None, hs, w13, w2, experts, k, None, None, inter, 0, local)


@pytest.mark.parametrize("method", [0, 5])
def test_bf16_moe_matches_the_reference(method):
    args = _bf16_args(6, 8, 128, 64, 4, 8, seed=method)
    got = trtllm_bf16_moe(*args, routing_method_type=method, use_shuffled_weight=False,
                          weight_layout=0)  # fmt: skip
    logits, _, hs, w13, w2 = args[:5]
    want = moe_bf16_ref(logits, hs, w13, w2, routing_method_type=method, top_k=4)
    _close(got, want)


def test_signatures_are_flashinfers():
    """0.2.14's positional order (tile_tokens_dim before routing_method_type)."""
    block = list(inspect.signature(trtllm_fp8_block_scale_moe).parameters)
    assert block[:21] == [
        "routing_logits", "routing_bias", "hidden_states", "hidden_states_scale",
        "gemm1_weights", "gemm1_weights_scale", "gemm2_weights", "gemm2_weights_scale",
        "num_experts", "top_k", "n_group", "topk_group", "intermediate_size",
        "local_expert_offset", "local_num_experts", "routed_scaling_factor", "tile_tokens_dim",
        "routing_method_type", "use_shuffled_weight", "weight_layout", "enable_pdl",
    ]  # fmt: skip
    per_tensor = list(inspect.signature(trtllm_fp8_per_tensor_scale_moe).parameters)
    assert per_tensor[:20] == [
        "routing_logits", "routing_bias", "hidden_states", "gemm1_weights",
        "output1_scales_scalar", "output1_scales_gate_scalar", "gemm2_weights",
        "output2_scales_scalar", "num_experts", "top_k", "n_group", "topk_group",
        "intermediate_size", "local_expert_offset", "local_num_experts",
        "routed_scaling_factor", "use_routing_scales_on_input", "tile_tokens_dim",
        "routing_method_type", "enable_pdl",
    ]  # fmt: skip


def test_bad_arguments_are_named():
    args = list(_block_args(3, 16, 256, 128, 16, 0))  # fails before any kernel runs
    with pytest.raises(TypeError, match="hidden_states must be float8_e4m3fn"):
        trtllm_fp8_block_scale_moe(args[0], args[1], args[2].float(), *args[3:])
    with pytest.raises(ValueError, match=r"hidden_states_scale must have shape \(2, 3\)"):
        trtllm_fp8_block_scale_moe(*args[:3], args[3].t(), *args[4:])
    with pytest.raises(ValueError, match=r"routing_logits must have shape \(3, 16\)"):
        trtllm_fp8_block_scale_moe(args[0][:, :8], *args[1:])
    with pytest.raises(ValueError, match="local experts"):
        trtllm_fp8_block_scale_moe(*args[:13], 8, 16, *args[15:])
    with pytest.raises(ValueError, match=r"gemm2_weights must have shape \(16, 256, 128\)"):
        trtllm_fp8_block_scale_moe(*args[:6], args[6][:, :, :64], *args[7:])
    with pytest.raises(ValueError, match="use_shuffled_weight=True is not supported"):
        trtllm_fp8_block_scale_moe(*args, use_shuffled_weight=True)
    with pytest.raises(ValueError, match="weight_layout=0"):
        trtllm_bf16_moe(*_bf16_args(1, 16, 128, 64, 4, 16))  # FlashInfer's defaults: shuffled
    with pytest.raises(ValueError, match="routing_method_type must be one of"):
        trtllm_fp8_block_scale_moe(*args, routing_method_type=11)
    with pytest.raises(ValueError, match="use_routing_scales_on_input needs top_k == 1"):
        trtllm_fp8_per_tensor_scale_moe(*_per_tensor_args(2, 8, 128, 64, 2), True,
                                        routing_method_type=1)  # fmt: skip


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 37, 512])
def test_fp8_block_scale_moe_on_gpu_matches_the_reference(tokens):
    """DeepSeek-V3's routing (8 groups, top 4 groups, top 8) over 64 experts, this rank's 16
    (EP 4, the second rank), hidden 1024, experts of 512, on the GPU."""
    args = _block_args(tokens, 64, 1024, 512, 16, 16, seed=tokens, k=8)
    args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
    args = (*args[:10], 8, 4, *args[12:])
    got = trtllm_fp8_block_scale_moe(*args, routing_method_type=RoutingMethodType.DeepSeekV3)
    (logits, bias, hs, hs_scale, w13, s13, w2, s2, _, k, ng, kg, _, off, _, rsf) = args
    want = moe_fp8_block_scale_ref(logits, hs, hs_scale, w13, s13, w2, s2, bias, off, rsf, 2, k,
                                   ng, kg)  # fmt: skip
    _close(got, want)


def test_capture_records_a_moe_call_under_its_definition(tmp_path):
    """A DeepSeek-routed call (EP: the second rank) is captured under its FlashInfer-Trace
    name, its scalars as given; a call with routing_replay_out (no Definition lists that
    output) runs uncaptured."""
    from flashtune.capture import capture
    from flashtune.data import Dataset

    args = _block_args(3, 8, 128, 128, 2, 4, seed=5)
    with capture(dataset=tmp_path):
        trtllm_fp8_block_scale_moe(*args, routing_method_type=2)
        replay = torch.empty(3, 4, dtype=torch.int16)
        trtllm_fp8_block_scale_moe(*args, routing_method_type=2, routing_replay_out=replay)
    ds = Dataset(tmp_path)
    assert ds.load_all() == []
    (name,) = ds.definitions
    assert name == "moe_fp8_block_scale_ds_routing_topk4_ng4_kg2_e2_h128_i128"
    (record,) = ds.workloads_for(name)
    assert record.workload.axes == {"seq_len": 3}
    assert record.workload.inputs["local_expert_offset"].value == 4
    assert record.workload.inputs["routed_scaling_factor"].value == 2.5


@pytest.mark.slow  # ~4-5 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
def test_moe_calls_are_tune_targets():
    """`flashtune tune --ops trtllm_bf16_moe,...`: the MoE examples are re-made at any token
    count (their constraints read shapes only), fp8 operands kept fp8."""
    from flashtune.cli.tune import tune_targets_for

    targets = tune_targets_for("mini-moe")
    assert {
        "moe_fp8_block_scale_renorm_topk4",
        "trtllm_fp8_per_tensor_scale_moe_topk4",
        "trtllm_bf16_moe_renormalize_routing_topk4",
    } <= set(targets)
    (call,) = targets["moe_fp8_block_scale_renorm_topk4"]
    arguments = call.arguments(5, torch.bfloat16, "cpu")
    assert arguments["hidden_states"].shape == (5, 256)
    assert arguments["hidden_states"].dtype == F8
    assert arguments["hidden_states_scale"].shape == (2, 5)
    assert arguments["gemm1_weights"].shape == (32, 256, 256)
    assert arguments["top_k"] == 4 and arguments["routing_method_type"] == 1
    (bf16,) = targets["trtllm_bf16_moe_renormalize_routing_topk4"]
    args = bf16.arguments(3, torch.bfloat16, "cpu")
    out = bf16.op(**{**args, "gemm1_weights": args["gemm1_weights"] * 0.05})
    assert out.shape == (3, 256) and out.dtype == torch.bfloat16 and out.float().abs().sum() > 0

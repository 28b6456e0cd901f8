"""The DeepSeek-V3-shaped decoder with mixture-of-experts layers (flashtune.models.moe): the
tiny MoE config on CPU (torch backend against flashtune's, whose fused experts run in the
Triton interpreter, float16), the layer against a per-token computation of DeepSeek-V3's
MoE, expert parallelism (routes to another rank's experts dropped), the torch grouped-GEMM
path's routing-independent shapes; on a GPU (cuda): DeepSeek-V3 TP8 / EP8 shapes in bf16,
flashtune against torch's grouped GEMM, and the e2e command on the MoE config."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flashtune.models import DEEPSEEK_TINY_MOE, DEEPSEEK_V3_MOE_TP8, DeepseekV3
from flashtune.models.moe import MoEWeights, grouped_experts_torch, route

C = DEEPSEEK_TINY_MOE
DTYPE = torch.float16


def _per_token_moe(x: torch.Tensor, moe: MoEWeights) -> torch.Tensor:
    """DeepSeek-V3's MoE written token by token, float32: sigmoid scores, the bias only for
    choosing (groups by their top-2 sum, then top-k inside the kept groups), weights the
    chosen unbiased scores renormalized and scaled; the rank's experts plus the shared one."""
    m = C.moe
    assert m is not None
    out = torch.zeros(x.shape, dtype=torch.float32)
    per_group = m.num_experts // m.n_group
    for t in range(x.shape[0]):
        xt = x[t].float()
        scores = torch.sigmoid(moe.router.float() @ xt)
        biased = scores + moe.router_bias.float()
        group_rank = biased.view(m.n_group, per_group).topk(2, dim=-1).values.sum(-1)
        keep = group_rank.topk(m.topk_group).indices
        allowed = torch.full_like(biased, float("-inf"))
        for g in keep.tolist():
            allowed[g * per_group : (g + 1) * per_group] = biased[
                g * per_group : (g + 1) * per_group
            ]
        chosen = allowed.topk(m.top_k).indices
        w = scores[chosen] / scores[chosen].sum() * m.routed_scaling_factor
        for e, we in zip(chosen.tolist(), w.tolist(), strict=True):
            local = e - moe.local_offset
            if not 0 <= local < moe.gemm1.shape[0]:
                continue  # another rank's expert
            inter = moe.gemm1.shape[1] // 2
            g = moe.gemm1[local].float() @ xt
            h = F.silu(g[inter:]) * g[:inter]
            out[t] += we * (moe.gemm2[local].float() @ h)
        gate_up = moe.shared_gate_up.float() @ xt
        half = gate_up.shape[0] // 2
        out[t] += moe.shared_down.float() @ (F.silu(gate_up[:half]) * gate_up[half:])
    return out


@pytest.mark.parametrize("backend", ["torch", "flashtune"])
def test_the_moe_layer_equals_a_per_token_deepseek_moe(backend: str) -> None:
    model = DeepseekV3(C, backend, device="cpu", dtype=DTYPE, num_pages=16, seed=3)
    layer = model.weights.layers[1]
    assert layer.moe is not None and layer.gate_up is None  # layer 0 is the dense one
    assert model.weights.layers[0].moe is None
    x = torch.randn(7, C.hidden_size).to(DTYPE)
    got = model.mlp_block(1, layer, x)
    want = _per_token_moe(x, layer.moe)
    assert got.shape == x.shape and got.dtype == DTYPE
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


def test_expert_parallelism_drops_the_other_ranks_routes() -> None:
    model = DeepseekV3(C, "torch", device="cpu", dtype=torch.float32, num_pages=16, seed=1)
    moe = model.weights.layers[1].moe
    assert moe is not None and C.moe is not None
    assert moe.gemm1.shape[0] == C.moe.local_experts == 8 and moe.local_offset == 8
    x = torch.randn(32, C.hidden_size)
    ids, weights = route(F.linear(x, moe.router).float(), moe, C.moe)
    assert bool((ids < 8).any()) and bool((ids >= 8).any())  # both ranks are routed to
    routed = model.ops.experts(x, ids, weights, moe)
    # only the local routes count: zeroing the weights of the others changes nothing
    local = (ids >= 8) & (ids < 16)
    alone = model.ops.experts(x, ids, torch.where(local, weights, 0.0), moe)
    torch.testing.assert_close(routed, alone)
    assert float(routed.abs().sum()) > 0


@pytest.mark.slow
def test_the_decoder_runs_prefill_and_decode_on_both_backends() -> None:
    reference = DeepseekV3(C, "torch", device="cpu", dtype=DTYPE, page_size=16, num_pages=32)
    ours = DeepseekV3(
        C, "flashtune", device="cpu", dtype=DTYPE, page_size=16, num_pages=32,
        weights=reference.weights,
    )  # fmt: skip
    prompts = [5, 3]
    tokens = torch.randint(0, C.vocab_size, (sum(prompts),))
    logits = []
    for model in (reference, ours):
        table = model.page_table
        requests = [table.add_request() for _ in prompts]
        first = model.forward(tokens, table.step(requests, prompts))
        decode = model.decode_graph(len(prompts), max_kv_len=max(prompts) + 1)
        second = decode.step(model.sample(first), table.step(requests, [1, 1])).clone()
        logits.append((first, second))
    for want, got in zip(logits[0], logits[1], strict=True):
        assert got.shape == (len(prompts), C.vocab_size)
        torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


def test_the_moe_config_comes_from_model_shapes() -> None:
    m = DEEPSEEK_V3_MOE_TP8.moe
    assert m is not None and DEEPSEEK_V3_MOE_TP8.name == "deepseek-v3-moe-tp8"
    assert (m.num_experts, m.top_k, m.intermediate_size, m.local_experts) == (256, 8, 2048, 32)
    assert DEEPSEEK_V3_MOE_TP8.num_heads == 16 and DEEPSEEK_V3_MOE_TP8.first_k_dense == 1
    assert not DEEPSEEK_V3_MOE_TP8.is_moe_layer(0) and DEEPSEEK_V3_MOE_TP8.is_moe_layer(1)


@pytest.mark.cuda
def test_grouped_experts_have_routing_independent_shapes_and_match_the_loop() -> None:
    from flashtune.ops.moe.experts import fused_experts_torch

    torch.manual_seed(0)
    dev = "cuda"
    E, inter, hidden, T, K = 8, 256, 512, 33, 4
    gemm1 = (torch.randn(E, 2 * inter, hidden, device=dev) / hidden**0.5).bfloat16()
    gemm2 = (torch.randn(E, hidden, inter, device=dev) / inter**0.5).bfloat16()
    x = torch.randn(T, hidden, device=dev).bfloat16()
    ids = torch.stack([torch.randperm(2 * E, device=dev)[:K] for _ in range(T)]).int()
    w = torch.rand(T, K, device=dev)
    got = grouped_experts_torch(x, ids, w, gemm1, gemm2, local_offset=E)
    want = fused_experts_torch(x, gemm1, gemm2, ids, w, local_expert_offset=E)
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.cuda
def test_gpu_moe_decoder_flashtune_matches_torch_at_deepseek_v3_ep8_shapes() -> None:
    config = DEEPSEEK_V3_MOE_TP8.with_layers(2)
    reference = DeepseekV3(config, "torch", device="cuda", page_size=16, num_pages=64)
    ours = DeepseekV3(
        config, "flashtune", device="cuda", page_size=16, num_pages=64, weights=reference.weights
    )
    prompts = [37, 5, 64]
    tokens = torch.randint(0, config.vocab_size, (sum(prompts),), device="cuda")
    # Both models decode the same next tokens (random weights leave near-ties in the logits:
    # each model's own argmax could differ and make the second step compare other inputs).
    next_tokens = torch.randint(0, config.vocab_size, (len(prompts),), device="cuda").int()
    outs = []
    for model in (reference, ours):
        table = model.page_table
        requests = [table.add_request() for _ in prompts]
        first = model.forward(tokens, table.step(requests, prompts))
        decode = model.decode_graph(len(prompts), max_kv_len=128)
        second = decode.step(next_tokens, table.step(requests, [1] * 3)).clone()
        outs.append((first.float(), second.float()))
    # Per request row: both models route with the same PyTorch code, but on random weights a
    # token's 8th and 9th expert scores can be near-tied, and the attention's rounding (7e-3
    # of the logits' norm) flips the pick; one flipped expert moves that row's logits by
    # ~5-10% (H200, session 25: 0.067 on one draw, 7e-3 on others). A wrong kernel moves
    # every row: at most one row of a step may be off, by at most 0.2.
    for want, got in zip(outs[0], outs[1], strict=True):
        rels = ((got - want).norm(dim=-1) / want.norm(dim=-1)).tolist()
        assert sorted(rels)[-2] < 2e-2 and max(rels) < 0.2, rels


@pytest.mark.slow
def test_e2e_command_runs_the_moe_config_on_cpu() -> None:
    from typer.testing import CliRunner

    from flashtune.cli import app

    args = "e2e --config deepseek-tiny-moe --device cpu --dtype float16 --backends "
    args += "torch,flashtune --batches 2 --kv-lens 12 --repetitions 1 --no-tune --skip-prefill"
    result = CliRunner().invoke(app, args.split())
    assert result.exit_code == 0, result.output
    assert "e2e_decode    2 x     12 flashtune" in result.output
    assert "greedy=1.00" in result.output

"""The references of the fused MoE ops in plain PyTorch (float32 math, bfloat16 result): the
contracts the API, the tests, the bundled torch baseline and the Definitions (schema.py)
share.

A MoE layer, per token t: route (routing.select_experts: its top-k global expert ids and
weights), then for each of its experts e that is local to this rank (global id in
[local_expert_offset, local_expert_offset + E_local)):

    G1 = a_t @ W13_e^T              [2I]   (W13_e: [2I, H], up rows first, then gate rows)
    C  = silu(G1[I:]) * G1[:I]      [I]    (SwiGLU: silu of the SECOND half)
    O  = C @ W2_e^T                 [H]    (W2_e: [H, I])
    out_t += w_te * O

Quantized forms: fp8 block scale (DeepSeek's: hidden_states [T, H] fp8 with hidden_states_scale
[H/128, T], one scale per token and 128 channels, transposed; W13 and W2 fp8 with one scale per
128 x 128 block), fp8 per tensor (fp8 everything, per-expert scales on GEMM1's up half, its
gate half and GEMM2's output; the activation's own scale folded into them), bf16, and float32
weights with bf16 activations (the contract FlashInfer-Trace's `trtllm_fp4_block_scale_moe` /
`trtllm_fp4_block_scale_routed_moe` Definitions spell: their references run plain float32
weights, though FlashInfer's kernel reads MxFP4 ones).

Self-contained (only torch): each reference's source is emitted into its Definitions, with
`select_experts` and `run_experts_ref` before it (schema.py).
"""

from __future__ import annotations

import torch

from flashtune.ops.moe.routing import select_experts, unpack_topk_ids

__all__ = [
    "run_experts_ref",
    "moe_fp8_block_scale_ref",
    "moe_fp8_per_tensor_scale_ref",
    "moe_bf16_ref",
    "moe_fp32_weights_ref",
    "routed_moe_fp32_weights_ref",
]


@torch.no_grad()
def run_experts_ref(a, topk_ids, topk_weights, local_expert_offset, num_local_experts, expert,
                    scales_on_input=False):  # fmt: skip
    """The expert part of a MoE layer: a [T, H] float32 activations, topk_ids [T, K] global
    ids, topk_weights [T, K]; expert(e) gives local expert e's (W13 [2I, H], W2 [H, I], float32,
    and the scales of GEMM1's up half, its gate half and GEMM2's output: floats or 0-d
    tensors). Only experts with tokens are dequantized (one at a time: little memory).
    scales_on_input: the routing weight multiplies the token's activations before GEMM1
    (Llama-4's top-1) instead of the expert's output. Returns [T, H] float32."""
    num_tokens, hidden = a.shape
    output = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=a.device)
    local = topk_ids.to(torch.int64) - int(local_expert_offset)
    for e in torch.unique(local[(local >= 0) & (local < num_local_experts)]).tolist():
        tok, slot = torch.nonzero(local == e, as_tuple=True)
        w = topk_weights[tok, slot].to(torch.float32)[:, None]  # [n, 1]
        w13, w2, up_scale, gate_scale, out_scale = expert(e)
        x = a[tok] * w if scales_on_input else a[tok]
        g1 = x @ w13.t()  # [n, 2I]
        inter = g1.shape[1] // 2
        up, gate = g1[:, :inter] * up_scale, g1[:, inter:] * gate_scale
        o = (torch.nn.functional.silu(gate) * up) @ w2.t() * out_scale  # [n, H]
        output.index_add_(0, tok, o if scales_on_input else o * w)
    return output


@torch.no_grad()
def moe_fp8_block_scale_ref(
    routing_logits, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
    gemm2_weights, gemm2_weights_scale, routing_bias=None, local_expert_offset=0,
    routed_scaling_factor=None, routing_method_type=2, top_k=8, n_group=None, topk_group=None,
):  # fmt: skip
    """FlashInfer's trtllm_fp8_block_scale_moe: routing (select_experts) then the experts
    with fp8 block-scale dequantization (block 128). routing_logits [T, E_global];
    hidden_states [T, H] fp8, hidden_states_scale [H/128, T]; gemm1_weights [E_local, 2I, H],
    gemm1_weights_scale [E_local, 2I/128, H/128]; gemm2_weights [E_local, H, I],
    gemm2_weights_scale [E_local, H/128, I/128]. Returns [T, H] bfloat16."""
    block = 128
    num_tokens, hidden = hidden_states.shape
    num_local, two_inter, _ = gemm1_weights.shape
    inter = two_inter // 2
    ids, weights = select_experts(
        routing_logits, routing_bias, routing_method_type, top_k, n_group, topk_group,
        routed_scaling_factor,
    )  # fmt: skip
    a_scale = hidden_states_scale.to(torch.float32).t()  # [T, H/128]
    a = (hidden_states.to(torch.float32).view(num_tokens, hidden // block, block)
         * a_scale[:, :, None]).view(num_tokens, hidden)  # fmt: skip

    def dequant(w, s, rows, cols):  # [rows, cols] fp8, [rows/128, cols/128] scales
        blocks = w.to(torch.float32).view(rows // block, block, cols // block, block)
        return (blocks * s.to(torch.float32)[:, None, :, None]).view(rows, cols)

    def expert(e):
        w13 = dequant(gemm1_weights[e], gemm1_weights_scale[e], two_inter, hidden)
        w2 = dequant(gemm2_weights[e], gemm2_weights_scale[e], hidden, inter)
        return w13, w2, 1.0, 1.0, 1.0

    out = run_experts_ref(a, ids, weights, local_expert_offset, num_local, expert)
    return out.to(torch.bfloat16)


@torch.no_grad()
def moe_fp8_per_tensor_scale_ref(
    routing_logits, hidden_states, gemm1_weights, output1_scales_scalar,
    output1_scales_gate_scalar, gemm2_weights, output2_scales_scalar, routing_bias=None,
    local_expert_offset=0, routed_scaling_factor=None, routing_method_type=1, top_k=8,
    n_group=None, topk_group=None,
):  # fmt: skip
    """FlashInfer's trtllm_fp8_per_tensor_scale_moe: routing (select_experts) then the experts
    on fp8 values with per-expert scales: GEMM1's up half times output1_scales_scalar[e], its
    gate half times output1_scales_gate_scalar[e], GEMM2's output times
    output2_scales_scalar[e] (all [E_local]). Llama4 routing (3), as FlashInfer's kernel and
    FlashInfer-Trace's Definitions: no bias and no routed_scaling_factor, and the top-1 weight
    scales the token's activations before GEMM1 (use_routing_scales_on_input). Returns [T, H]
    bfloat16."""
    llama4 = int(routing_method_type) == 3
    ids, weights = select_experts(
        routing_logits, None if llama4 else routing_bias, routing_method_type, top_k, n_group,
        topk_group, None if llama4 else routed_scaling_factor,
    )  # fmt: skip
    s1 = output1_scales_scalar.to(torch.float32)
    s1_gate = output1_scales_gate_scalar.to(torch.float32)
    s2 = output2_scales_scalar.to(torch.float32)

    def expert(e):
        w13 = gemm1_weights[e].to(torch.float32)
        return w13, gemm2_weights[e].to(torch.float32), s1[e], s1_gate[e], s2[e]

    a = hidden_states.to(torch.float32)
    out = run_experts_ref(
        a, ids, weights, local_expert_offset, gemm1_weights.shape[0], expert,
        scales_on_input=llama4,
    )  # fmt: skip
    return out.to(torch.bfloat16)


@torch.no_grad()
def moe_bf16_ref(
    routing_logits, hidden_states, gemm1_weights, gemm2_weights, routing_bias=None,
    local_expert_offset=0, routed_scaling_factor=None, routing_method_type=1, top_k=8,
    n_group=None, topk_group=None,
):  # fmt: skip
    """A MoE layer on bf16 (or fp16/fp32) weights: routing (select_experts) then the experts,
    in float32. gemm1_weights [E_local, 2I, H], gemm2_weights [E_local, H, I]. Returns [T, H]
    bfloat16."""
    ids, weights = select_experts(
        routing_logits, routing_bias, routing_method_type, top_k, n_group, topk_group,
        routed_scaling_factor,
    )  # fmt: skip

    def expert(e):
        return gemm1_weights[e].to(torch.float32), gemm2_weights[e].to(torch.float32), 1.0, 1.0, 1.0

    a = hidden_states.to(torch.float32)
    out = run_experts_ref(a, ids, weights, local_expert_offset, gemm1_weights.shape[0], expert)
    return out.to(torch.bfloat16)


@torch.no_grad()
def moe_fp32_weights_ref(
    routing_logits, hidden_states, gemm1_weights, gemm2_weights, routing_bias=None,
    routing_method_type=1, top_k=8,
):  # fmt: skip
    """The fp4 MoE Definitions' contract (FlashInfer-Trace's trtllm_fp4_block_scale_moe):
    bf16 hidden_states [T, H], float32 gemm1_weights [E, 2I, H] and gemm2_weights [E, H, I],
    all experts local. Renormalize (1) or Llama4 (3) routing; Llama4 reads no bias (the
    Definitions list one, FlashInfer's kernel ignores it) and its top-1 weight scales the
    token before GEMM1. Returns [T, H] bfloat16."""
    llama4 = int(routing_method_type) == 3
    ids, weights = select_experts(
        routing_logits, None, routing_method_type, top_k, None, None, None
    )

    def expert(e):
        return gemm1_weights[e].to(torch.float32), gemm2_weights[e].to(torch.float32), 1.0, 1.0, 1.0

    a = hidden_states.to(torch.float32)
    out = run_experts_ref(a, ids, weights, 0, gemm1_weights.shape[0], expert,
                          scales_on_input=llama4)  # fmt: skip
    return out.to(torch.bfloat16)


@torch.no_grad()
def routed_moe_fp32_weights_ref(
    topk_ids, hidden_states, gemm1_weights, gemm2_weights, routing_method_type=1
):
    """moe_fp32_weights_ref with the routing done by the caller (FlashInfer-Trace's
    trtllm_fp4_block_scale_routed_moe): topk_ids [T, K] int32 packs each expert id (high 16
    bits) with its weight's bfloat16 bits (low 16; unpack_topk_ids). routing_method_type
    says only where the weight applies: Llama4 (3) on the token before GEMM1, else on the
    expert's output. Ids outside [0, E) contribute nothing. Returns [T, H] bfloat16."""
    ids, weights = unpack_topk_ids(topk_ids)

    def expert(e):
        return gemm1_weights[e].to(torch.float32), gemm2_weights[e].to(torch.float32), 1.0, 1.0, 1.0

    a = hidden_states.to(torch.float32)
    out = run_experts_ref(a, ids, weights, 0, gemm1_weights.shape[0], expert,
                          scales_on_input=int(routing_method_type) == 3)  # fmt: skip
    return out.to(torch.bfloat16)

"""MoE layers on float32 weights: the contract of FlashInfer-Trace's
`trtllm_fp4_block_scale_moe` / `trtllm_fp4_block_scale_routed_moe` Definitions (their
references run float32 weights; FlashInfer's kernel reads MxFP4). `moe_fp32_weights` routes
by itself; `routed_moe_fp32_weights` takes packed topk_ids. Both run flashtune's bf16 experts,
whose kernels read the float32 weights and cast each tile in registers.

These are the plain functions: the package (flashtune.ops.moe) wraps them in their ApiOps
(schema, capture, apply, the definition dump) under its own names, and callers use those.
They live here, apart from the FlashInfer-named entry points, to keep the package's module
within the project's file size limit (scripts/check_layers.py).
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.ops.moe.checks import check_output, check_routing, check_tensor
from flashtune.ops.moe.experts import ExpertQuant, fused_experts
from flashtune.ops.moe.routing import (
    RoutingMethodType,
    routing_method,
    select_experts,
    unpack_topk_ids,
)

__all__ = ["moe_fp32_weights", "routed_moe_fp32_weights"]


def _used_experts_16bit(
    gemm1_weights: torch.Tensor,
    gemm2_weights: torch.Tensor,
    ids: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The experts `ids` names, as `dtype` weights (the others are never read), and the ids
    renumbered over them (ids outside [0, E): one past the last, which the experts skip).
    None where no id names an expert. Costs a host sync (the count of used experts)."""
    experts = gemm1_weights.shape[0]
    flat = ids.reshape(-1).to(torch.int64)
    valid = (flat >= 0) & (flat < experts)
    used = torch.unique(flat[valid])
    n = int(used.numel())
    if n == 0:
        return None
    if n == experts:
        return gemm1_weights.to(dtype), gemm2_weights.to(dtype), ids
    # One expert at a time: an index_select of the float32 weights first would take a float32
    # copy of every used expert (tens of GB at Llama 4 Maverick's sizes).
    w13 = torch.empty((n, *gemm1_weights.shape[1:]), dtype=dtype, device=gemm1_weights.device)
    w2 = torch.empty((n, *gemm2_weights.shape[1:]), dtype=dtype, device=gemm2_weights.device)
    for j, e in enumerate(used.tolist()):
        w13[j].copy_(gemm1_weights[e])
        w2[j].copy_(gemm2_weights[e])
    remap = torch.full((experts + 1,), n, dtype=torch.int32, device=ids.device)
    remap[used] = torch.arange(n, dtype=torch.int32, device=ids.device)
    renumbered = remap[torch.where(valid, flat, experts)].view(ids.shape)
    return w13, w2, renumbered


def _fp32_weight_experts(
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm2_weights: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    on_input: bool,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """The experts of the fp4 Definitions' contract on flashtune's bf16 experts path."""
    dtype = hidden_states.dtype
    if dtype not in (torch.bfloat16, torch.float16):
        dtype = torch.bfloat16
    a = hidden_states
    if on_input:
        # The weight scales the token before GEMM1 (SwiGLU is not linear, so it cannot move
        # to the output); with one expert a token (top-1) the scaled token can run the
        # experts with weight 1, in float32 then rounded once to 16 bits.
        a = hidden_states.float() * weights.float()
        weights = torch.ones_like(weights, dtype=torch.float32)
    a = a.to(dtype)
    weights = weights.float()
    if gemm1_weights.dtype in (torch.float32, dtype) and gemm2_weights.dtype == (
        gemm1_weights.dtype
    ):
        # The experts kernels load float32 weight tiles and cast them in registers: each
        # weight is read once, nothing is copied, no host sync (CUDA-graph safe).
        return fused_experts(a, gemm1_weights, gemm2_weights, ids, weights, out=out)
    # 16-bit weights of the other type: the used experts converted.
    converted = _used_experts_16bit(gemm1_weights, gemm2_weights, ids, dtype)
    if converted is None:  # no token reached an expert
        zeros = torch.zeros(a.shape, dtype=torch.bfloat16, device=a.device)
        return zeros if out is None else out.copy_(zeros)
    w13, w2, local_ids = converted
    return fused_experts(a, w13, w2, local_ids, weights, quant=ExpertQuant("bf16"), out=out)


def _check_fp32_weights(
    hidden_states: Any, gemm1_weights: Any, gemm2_weights: Any
) -> tuple[int, int, int, int]:
    """(tokens, hidden, intermediate, experts) of an fp4-contract call, checked."""
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 2:
        raise ValueError("hidden_states must be a [seq_len, hidden_size] tensor")
    if not isinstance(gemm2_weights, torch.Tensor) or gemm2_weights.dim() != 3:
        raise ValueError("gemm2_weights must be a [num_experts, hidden, intermediate] tensor")
    tokens, hidden = hidden_states.shape
    experts, _, inter = gemm2_weights.shape
    floats = (torch.float32, torch.bfloat16, torch.float16)
    check_tensor("hidden_states", hidden_states, (tokens, hidden), (torch.bfloat16, torch.float16))
    check_tensor("gemm1_weights", gemm1_weights, (experts, 2 * inter, hidden), floats)
    check_tensor("gemm2_weights", gemm2_weights, (experts, hidden, inter), floats)
    for name, t in (("gemm1_weights", gemm1_weights), ("gemm2_weights", gemm2_weights)):
        if t.device != hidden_states.device:
            raise ValueError(f"{name} is on {t.device}, hidden_states on {hidden_states.device}")
    return tokens, hidden, inter, experts


def moe_fp32_weights(
    routing_logits: torch.Tensor,
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm2_weights: torch.Tensor,
    routing_bias: torch.Tensor | None = None,
    *,
    routing_method_type: int = 1,
    top_k: int = 8,
    output: torch.Tensor | None = None,
) -> torch.Tensor:
    """A MoE layer on float32 weights: the contract of FlashInfer-Trace's
    `trtllm_fp4_block_scale_moe_*` Definitions (their references run float32 weights; the
    FlashInfer kernel they name reads MxFP4 ones, which this op does not).

    routing_logits [T, E] float32/bf16; hidden_states [T, H] bf16; gemm1_weights [E, 2I, H]
    (up rows, then gate rows) and gemm2_weights [E, H, I], float32 (16-bit accepted), every
    expert local. Renormalize routing (1: top-k logits, softmax over them, weights on the
    outputs) or Llama4 (3: top-1, sigmoid, the weight on the token before GEMM1; routing_bias
    accepted and unread, as FlashInfer's kernel). Runs flashtune's bf16 experts on the
    float32 weights (each tile cast in registers). Returns [T, H] bfloat16 (into `output`
    when given).
    """
    tokens, hidden, _, experts = _check_fp32_weights(hidden_states, gemm1_weights, gemm2_weights)
    method = routing_method(routing_method_type)
    if method not in (RoutingMethodType.Renormalize, RoutingMethodType.Llama4):
        raise ValueError(
            f"routing_method_type={method!r} is not supported: Renormalize or Llama4 only"
        )
    llama4 = method == RoutingMethodType.Llama4
    if routing_bias is not None and not llama4:
        raise ValueError("routing_bias is not supported with Renormalize routing")
    check_routing(routing_logits, routing_bias, hidden_states, experts, top_k, 0, experts)
    out = check_output(output, tokens, hidden, hidden_states.device)
    ids, weights = select_experts(routing_logits, None, int(method), top_k)
    return _fp32_weight_experts(
        hidden_states, gemm1_weights, gemm2_weights, ids, weights, llama4, out
    )


def routed_moe_fp32_weights(
    topk_ids: torch.Tensor,
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm2_weights: torch.Tensor,
    *,
    routing_method_type: int = 1,
    output: torch.Tensor | None = None,
) -> torch.Tensor:
    """moe_fp32_weights with the routing done by the caller: the contract of
    FlashInfer-Trace's `trtllm_fp4_block_scale_routed_moe_*` Definitions. topk_ids [T, K]
    int32 packs each expert id (high 16 bits) with its weight's bfloat16 bits (low 16;
    routing.unpack_topk_ids); ids outside [0, E) contribute nothing. routing_method_type
    says where the weight applies: Llama4 (3, top-1 only) on the token before GEMM1,
    Renormalize (1) on the expert's output. Returns [T, H] bfloat16.
    """
    tokens, hidden, _, _ = _check_fp32_weights(hidden_states, gemm1_weights, gemm2_weights)
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2:
        raise ValueError("topk_ids must be a [seq_len, top_k] tensor")
    check_tensor("topk_ids", topk_ids, (tokens, topk_ids.shape[1]), (torch.int32,))
    if topk_ids.device != hidden_states.device:
        raise ValueError(
            f"topk_ids is on {topk_ids.device}, hidden_states on {hidden_states.device}"
        )
    method = routing_method(routing_method_type)
    if method not in (RoutingMethodType.Renormalize, RoutingMethodType.Llama4):
        raise ValueError(
            f"routing_method_type={method!r} is not supported: Renormalize or Llama4 only"
        )
    llama4 = method == RoutingMethodType.Llama4
    if llama4 and topk_ids.shape[1] != 1:
        raise ValueError(f"Llama4 routing is top-1; topk_ids has {topk_ids.shape[1]} columns")
    out = check_output(output, tokens, hidden, hidden_states.device)
    ids, weights = unpack_topk_ids(topk_ids)
    return _fp32_weight_experts(
        hidden_states, gemm1_weights, gemm2_weights, ids, weights, llama4, out
    )

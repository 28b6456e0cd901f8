"""The mixture-of-experts layer of the DeepSeek-V3-shaped decoder (deepseek.py): its weights
and the eager-PyTorch computation the "torch" backend runs.

A layer routes each token to top_k of the config's routed experts (DeepSeek-V3's grouped
sigmoid routing with a score-correction bias, `flashtune.ops.moe.select_experts`), runs the
experts this rank holds (expert parallelism: `MoEConfig.local_experts` of them from
`local_offset`) and adds a shared expert, a dense SwiGLU MLP every token takes:

    logits = x @ router.T (float32) -> ids, weights [T, top_k]
    routed = sum_k weights[t, k] * down_e(silu(gate_e(x)) * up_e(x))   (local experts only)
    out = routed + shared_down(silu(shared_gate(x)) * shared_up(x))

Expert weights are stored as FlashInfer's fused-MoE API takes them (flashtune.fused_moe):
gemm1 [E_local, 2I, H] (the up rows first, then the gate's), gemm2 [E_local, H, I].

`grouped_experts_torch` is the torch backend's expert computation: the routes sorted by
expert and two `torch._grouped_mm` calls (CUTLASS grouped GEMMs on Hopper), the best torch
peer of issue 35's MoE benchmark; its shapes do not depend on the routing, so a CUDA graph
captures it and torch.compile traces it. Where `torch._grouped_mm` does not run (CPU, or an
older torch), flashtune's PyTorch reference of the expert computation runs instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flashtune.model_shapes import MoEConfig
from flashtune.ops.moe.experts import fused_experts_torch
from flashtune.ops.moe.routing import RoutingMethodType, select_experts

__all__ = ["MoEWeights", "route", "grouped_experts_torch", "experts_torch"]


@dataclass
class MoEWeights:
    """One MoE layer's weights (module docstring)."""

    router: torch.Tensor  # [E, hidden]: every routed expert's logit weights
    router_bias: torch.Tensor  # [E] float32: DeepSeek-V3's e_score_correction_bias
    gemm1: torch.Tensor  # [E_local, 2I, hidden]: up rows, then gate rows
    gemm2: torch.Tensor  # [E_local, hidden, I]
    shared_gate_up: torch.Tensor  # [2 I_shared, hidden]: gate rows, then up (silu_and_mul's)
    shared_down: torch.Tensor  # [hidden, I_shared]
    local_offset: int = 0  # the global id of this rank's first expert


def route(
    logits: torch.Tensor, weights: MoEWeights, config: MoEConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids [T, K] int32 global ids, topk_weights [T, K] float32) for router logits
    [T, E] (float32), by the config's routing method."""
    ids, topk_weights = select_experts(
        logits,
        weights.router_bias,
        int(RoutingMethodType[config.routing]),
        config.top_k,
        config.n_group,
        config.topk_group,
        config.routed_scaling_factor,
    )
    return ids, topk_weights


def grouped_experts_torch(
    x: torch.Tensor,
    ids: torch.Tensor,
    topk_weights: torch.Tensor,
    gemm1: torch.Tensor,
    gemm2: torch.Tensor,
    local_offset: int = 0,
) -> torch.Tensor:
    """The routed experts with torch._grouped_mm: x [T, H] bf16, ids [T, K] global expert
    ids, topk_weights [T, K]; returns [T, H] in x's dtype.

    Every (token, k) route is kept, so the shapes are the same for every routing (a CUDA
    graph replays it): a route to another rank's expert goes to local expert 0 with weight
    0 (its product is computed and discarded, as a padded grouped GEMM would)."""
    num_tokens, hidden = x.shape
    experts, two_i, _ = gemm1.shape
    inter = two_i // 2
    local = ids.reshape(-1).long() - local_offset
    here = (local >= 0) & (local < experts)
    weight = torch.where(here, topk_weights.reshape(-1).float(), 0.0)
    local = torch.where(here, local, 0)
    order = torch.argsort(local, stable=True)
    token = order // ids.shape[1]  # the route's token: routes are laid out [T, K]
    counts = torch.zeros(experts, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, local, torch.ones_like(local, dtype=torch.int32))
    offs = counts.cumsum(0, dtype=torch.int32)
    # torch._grouped_mm takes [E, K, N] weights: transposed views of the stored [E, N, K]
    up_gate = torch._grouped_mm(x[token], gemm1.transpose(1, 2), offs=offs)  # [T K, 2I]
    hidden_act = F.silu(up_gate[:, inter:]) * up_gate[:, :inter]
    down = torch._grouped_mm(hidden_act, gemm2.transpose(1, 2), offs=offs)  # [T K, H]
    out = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=x.device)
    out.index_add_(0, token, down.float() * weight[order].unsqueeze(1))
    return out.to(x.dtype)


def _grouped_mm_runs(x: torch.Tensor) -> bool:
    """torch._grouped_mm exists and runs here: bf16 on a CUDA device of SM 9.0 or newer."""
    if not hasattr(torch, "_grouped_mm") or x.device.type != "cuda" or x.dtype != torch.bfloat16:
        return False
    return torch.cuda.get_device_capability(x.device) >= (9, 0)


def experts_torch(
    x: torch.Tensor,
    ids: torch.Tensor,
    topk_weights: torch.Tensor,
    weights: MoEWeights,
) -> torch.Tensor:
    """The torch backend's routed experts: grouped GEMMs where torch._grouped_mm runs, else
    the PyTorch reference (a loop over the experts with tokens; eager only)."""
    if _grouped_mm_runs(x):
        return grouped_experts_torch(
            x, ids, topk_weights, weights.gemm1, weights.gemm2, weights.local_offset
        )
    out = fused_experts_torch(
        x, weights.gemm1, weights.gemm2, ids, topk_weights, local_expert_offset=weights.local_offset
    )
    return out.to(x.dtype)

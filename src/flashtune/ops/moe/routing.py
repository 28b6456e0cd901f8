"""MoE routing in plain PyTorch: FlashInfer's `RoutingMethodType` and `select_experts`, which
turns router logits into each token's top-k GLOBAL expert ids and their weights.

The methods, as FlashInfer defines them (`flashinfer.tllm_enums.RoutingMethodType`; the
weights as FlashInfer-Trace's MoE references compute them; FlashInfer's bias and scaling
conventions below):

| value | name             | ids                                   | weights                         |
|-------|------------------|---------------------------------------|---------------------------------|
| 0     | Default          | top-k of softmax(logits)              | their softmax probabilities     |
| 1     | Renormalize      | top-k of logits                       | softmax over the k logits       |
| 2     | DeepSeekV3       | sigmoid + bias, grouped top-k (below) | unbiased sigmoids, normalized   |
| 3     | Llama4           | top-1 of logits                       | sigmoid(logit)                  |
| 4     | RenormalizeNaive | top-k of softmax(logits)              | probabilities / their sum       |
| 5     | TopK             | top-k of logits                       | uniform, 1 / k                  |
| 6     | SigmoidRenorm    | top-k of sigmoid(logits)              | sigmoids / their sum            |
| 7     | MiniMax2         | top-k of sigmoid(logits) + bias       | unbiased sigmoids / their sum   |
| 8     | Sigmoid          | top-k of sigmoid(logits)              | sigmoids                        |
| 9     | TopKSigmoid      | top-k of logits                       | sigmoid(logit)                  |
| 10    | Unspecified      | (refused)                             |                                 |

DeepSeekV3's grouped top-k: the E experts form n_group groups of E / n_group; a group scores
the sum of its two best biased scores; the topk_group best groups are kept and the top_k
best biased scores among their experts are the token's experts. Every method's weights are
multiplied by routed_scaling_factor (None: 1). A routing_bias is added to the logits before
routing for every method except DeepSeekV3 and MiniMax2, which add it to the sigmoid scores
and select by the biased scores while weighting by the unbiased ones (FlashInfer-Trace's
references: DeepSeekV3 always, the others when a bias is given).

FlashInfer 0.2.14 defines values 0-5 and Unspecified = 6; later FlashInfer adds 6-9 and moves
Unspecified to 10 (this enum is the later one; code names members, not numbers). Methods 6-9
follow FlashInfer's documentation of them; no FlashInfer-Trace reference covers them yet.

`select_experts` is self-contained (only torch): its source is emitted into the MoE
Definitions' references beside the reference function (schema.py). So is `unpack_topk_ids`,
the routing a caller did itself (FlashInfer's routed MoE, `trtllm_fp4_block_scale_routed_moe`):
each int32 of topk_ids packs the expert id (high 16 bits) and the weight's bfloat16 bits (low
16 bits).
"""

from __future__ import annotations

from enum import IntEnum

import torch

__all__ = ["RoutingMethodType", "select_experts", "routing_method", "unpack_topk_ids"]


class RoutingMethodType(IntEnum):
    """How a MoE layer picks each token's experts (FlashInfer's enum: same names, same
    values; the table in this module's docstring says what each does)."""

    Default = 0  # Softmax -> TopK
    Renormalize = 1  # TopK -> Softmax
    DeepSeekV3 = 2  # Sigmoid -> RoutingBiasAdd -> Top2 in group -> TopK groups -> TopK experts
    Llama4 = 3  # Top1 -> Sigmoid
    RenormalizeNaive = 4  # Softmax -> TopK -> Renormalize (Qwen3)
    TopK = 5  # TopK only (no softmax)
    SigmoidRenorm = 6  # Sigmoid -> TopK -> Renormalize
    MiniMax2 = 7  # Sigmoid + Bias -> TopK -> ScaledSumNormalize
    Sigmoid = 8  # Sigmoid -> TopK
    TopKSigmoid = 9  # TopK -> Sigmoid
    Unspecified = 10

    def __repr__(self) -> str:  # eval-safe, as FlashInfer's
        return f"{type(self).__name__}.{self.name}"


def routing_method(value: int | RoutingMethodType) -> RoutingMethodType:
    """`value` as a RoutingMethodType; ValueError for Unspecified or an unknown value."""
    try:
        method = RoutingMethodType(int(value))
    except ValueError:
        known = ", ".join(f"{m.value} ({m.name})" for m in RoutingMethodType)
        raise ValueError(f"routing_method_type must be one of {known}; got {value!r}") from None
    if method == RoutingMethodType.Unspecified:
        raise ValueError("routing_method_type Unspecified names no routing method")
    return method


@torch.no_grad()
def select_experts(
    routing_logits, routing_bias, routing_method_type, top_k, n_group=None, topk_group=None,
    routed_scaling_factor=None,
):  # fmt: skip
    """Each token's experts and weights: (topk_ids [T, top_k] int32 global expert ids,
    topk_weights [T, top_k] float32), from routing_logits [T, E] (any float dtype, routed in
    float32) and an optional routing_bias [E]. routing_method_type: an int (RoutingMethodType's
    values, see the table above). DeepSeekV3 (2) reads n_group and topk_group (None or 0: one
    group holding every expert) and needs a bias (None: zeros). The order of the k ids within
    a row is unspecified; each id appears once per row.
    """
    method = int(routing_method_type)
    k = int(top_k)
    logits = routing_logits.to(torch.float32)
    num_tokens, num_experts = logits.shape
    if not 1 <= k <= num_experts:
        raise ValueError(f"top_k must be in 1..{num_experts} (the experts), got {k}")
    scale = 1.0 if routed_scaling_factor is None else float(routed_scaling_factor)
    bias = None if routing_bias is None else routing_bias.to(torch.float32).reshape(-1)
    if method in (2, 7):
        scores = torch.sigmoid(logits)
        biased = scores if bias is None else scores + bias
        if method == 2 and n_group and int(n_group) > 1:
            groups, keep = int(n_group), int(topk_group or n_group)
            if num_experts % groups or not 1 <= keep <= groups:
                raise ValueError(
                    f"n_group must divide the {num_experts} experts and topk_group be in "
                    f"1..n_group, got n_group={groups}, topk_group={keep}"
                )
            if k > keep * (num_experts // groups):
                raise ValueError(
                    f"top_k={k} exceeds the {keep * (num_experts // groups)} experts of the "
                    f"topk_group={keep} kept groups"
                )
            grouped = biased.view(num_tokens, groups, num_experts // groups)
            group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
            kept = group_scores.topk(keep, dim=-1).indices  # [T, keep]
            group_mask = torch.zeros_like(group_scores).scatter_(1, kept, 1.0)
            expert_mask = group_mask.repeat_interleave(num_experts // groups, dim=1)
            biased = biased.masked_fill(expert_mask == 0, torch.finfo(torch.float32).min)
        ids = biased.topk(k, dim=-1).indices
        picked = scores.gather(1, ids)
        weights = picked / (picked.sum(dim=-1, keepdim=True) + 1e-20)
    else:
        if bias is not None:
            logits = logits + bias
        if method in (0, 4):  # Default, RenormalizeNaive: softmax, then top-k
            probs = torch.softmax(logits, dim=-1)
            weights, ids = probs.topk(k, dim=-1)
            if method == 4:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        elif method in (1, 5, 9):  # Renormalize, TopK, TopKSigmoid: top-k of the logits
            top, ids = logits.topk(k, dim=-1)
            if method == 1:
                weights = torch.softmax(top, dim=-1)
            elif method == 5:
                weights = torch.full_like(top, 1.0 / k)
            else:
                weights = torch.sigmoid(top)
        elif method == 3:  # Llama4: top-1, then sigmoid
            if k != 1:
                raise ValueError(f"Llama4 routing selects one expert per token; got top_k={k}")
            top, ids = logits.max(dim=-1, keepdim=True)
            weights = torch.sigmoid(top)
        elif method in (6, 8):  # SigmoidRenorm, Sigmoid
            weights, ids = torch.sigmoid(logits).topk(k, dim=-1)
            if method == 6:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        else:
            raise ValueError(f"routing_method_type {method} names no routing method (0-9)")
    return ids.to(torch.int32), (weights * scale).to(torch.float32)


@torch.no_grad()
def unpack_topk_ids(topk_ids):
    """Pre-computed routing (FlashInfer's routed MoE): topk_ids [T, K] int32, each packing
    the expert id in its high 16 bits and the routing weight's bfloat16 bits in its low 16.
    Returns (ids [T, K] int32, weights [T, K] float32), as select_experts does."""
    packed = topk_ids.to(torch.int32)
    ids = packed >> 16  # arithmetic shift: the high half as a signed 16-bit id, as FlashInfer's
    # the low half as int16 (a wrapping cast keeps the bits), then its bits as bfloat16
    bits = (packed & 0xFFFF).to(torch.int16)
    weights = bits.view(torch.bfloat16).to(torch.float32)
    return ids, weights

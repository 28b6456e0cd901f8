"""The MoE entry points' argument checks, and the routing step of those that route: shared
by the FlashInfer-named entry points (the package, flashtune.ops.moe) and the float32-weight
ones (fp32_weights.py).
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.ops.moe.routing import routing_method, select_experts

__all__ = [
    "SWIGLU",
    "check_output",
    "check_routing",
    "check_tensor",
    "check_unsupported",
    "route",
]

SWIGLU = 3  # FlashInfer's ActivationType.Swiglu


def check_tensor(
    name: str, t: Any, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]
) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must be {names}, got {str(t.dtype).removeprefix('torch.')}")


def check_unsupported(**options: Any) -> None:
    """Refuse what flashtune does not implement, by name (FlashInfer's defaults pass)."""
    defaults = {
        "use_shuffled_weight": False,
        "weight_layout": 0,
        "do_finalize": True,
        "activation_type": SWIGLU,
        "norm_topk_prob": True,
        "num_fused_shared_experts": 0,
        "gemm1_alpha": None,
        "gemm1_beta": None,
        "gemm1_clamp_limit": None,
    }
    why = {
        "use_shuffled_weight": "flashtune reads plain row-major (MajorK) weights: pass "
        "use_shuffled_weight=False and weight_layout=0 with unshuffled weights",
        "weight_layout": "flashtune reads MajorK weights ([E, 2I, H], [E, H, I]); pass "
        "weight_layout=0 (WeightLayout.MajorK)",
        "do_finalize": "flashtune always finalizes (returns the [T, H] output)",
        "activation_type": "flashtune's experts are SwiGLU (ActivationType.Swiglu = 3) only",
        "norm_topk_prob": "flashtune normalizes as the routing method defines",
        "num_fused_shared_experts": "fused shared experts are not implemented",
        "gemm1_alpha": "SwiGLU alpha/beta/clamp variants are not implemented",
        "gemm1_beta": "SwiGLU alpha/beta/clamp variants are not implemented",
        "gemm1_clamp_limit": "SwiGLU alpha/beta/clamp variants are not implemented",
    }
    for name, value in options.items():
        default = defaults[name]
        same = value is None if default is None else (value or 0) == default
        if not same:
            raise ValueError(f"{name}={value!r} is not supported: {why[name]}")


def check_routing(
    routing_logits: Any,
    routing_bias: Any,
    hidden_states: Any,
    num_experts: int,
    top_k: int,
    local_expert_offset: int,
    local_num_experts: int,
) -> int:
    """Checks shared by the MoE calls; returns the token count."""
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 2:
        raise ValueError("hidden_states must be a [seq_len, hidden_size] tensor")
    tokens = hidden_states.shape[0]
    check_tensor(
        "routing_logits", routing_logits, (tokens, num_experts), (torch.float32, torch.bfloat16)
    )
    if routing_bias is not None:
        check_tensor("routing_bias", routing_bias, (num_experts,), (torch.float32, torch.bfloat16))
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in 1..num_experts={num_experts}, got {top_k}")
    if local_num_experts < 1 or not 0 <= local_expert_offset <= num_experts - local_num_experts:
        raise ValueError(
            f"local experts [{local_expert_offset}, {local_expert_offset + local_num_experts}) "
            f"must lie within the {num_experts} experts"
        )
    for name, t in (("routing_logits", routing_logits), ("routing_bias", routing_bias)):
        if t is not None and t.device != hidden_states.device:
            raise ValueError(f"{name} is on {t.device}, hidden_states on {hidden_states.device}")
    return tokens


def route(
    routing_logits: torch.Tensor,
    routing_bias: torch.Tensor | None,
    routing_method_type: int,
    top_k: int,
    n_group: int | None,
    topk_group: int | None,
    routed_scaling_factor: float | None,
    routing_replay_out: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    method = routing_method(routing_method_type)
    ids, weights = select_experts(
        routing_logits, routing_bias, int(method), top_k, n_group, topk_group,
        routed_scaling_factor,
    )  # fmt: skip
    if routing_replay_out is not None:  # FlashInfer's: the selected ids, int16, rows [0, T)
        if routing_replay_out.dim() != 2 or routing_replay_out.shape[0] < ids.shape[0]:
            raise ValueError(
                f"routing_replay_out must be [>= {ids.shape[0]}, {top_k}], got "
                f"{tuple(routing_replay_out.shape)}"
            )
        routing_replay_out[: ids.shape[0], :top_k].copy_(ids)
    return ids, weights


def check_output(
    output: Any, tokens: int, hidden: int, device: torch.device
) -> torch.Tensor | None:
    if output is not None:
        check_tensor("output", output, (tokens, hidden), (torch.bfloat16,))
        if output.device != device:
            raise ValueError(f"output is on {output.device}, hidden_states on {device}")
    return output

"""Which MoE schema describes a call or a Definition: its key (`MoEKey`).

`moe_key` reads a call's key from its arguments (FlashInfer's API names) and raises
ValueError, naming why, for a call no Definition describes; `definition_key` reads a
dataset Definition's key back from its name and constants (the routing constants are in the
name only); `schema_for_call` / `schema_for_definition` make the schema of that key
(schema.schema_of). The variants and their Definitions: schema.py's module docstring.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from flashtune.data.models import Definition
from flashtune.ops.moe.routing import RoutingMethodType
from flashtune.ops.moe.schema import (
    BIASED_METHODS,
    ROUTING_SLUGS,
    ROUTING_STEPS,
    VARIANT_PREFIXES,
    MoEKey,
    MoESchema,
    schema_of,
)

__all__ = ["definition_key", "moe_key", "schema_for_call", "schema_for_definition"]


# --------------------------------------------------------------------------- a call's key


def _int(name: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _refuse(what: str) -> ValueError:
    return ValueError(f"no MoE Definition describes {what}")


def _fp32_weights_key(api: str, arguments: Mapping[str, Any]) -> MoEKey:
    """moe_key of moe_fp32_weights ("fp32w") and routed_moe_fp32_weights ("fp32w_routed")
    calls: the fp4 Definitions' contract, whose bf16 activations and float32 weights are
    fixed (a call of other dtypes runs, but no Definition describes it)."""
    method = _int("routing_method_type", arguments["routing_method_type"])
    gemm2, hidden = arguments["gemm2_weights"], arguments["hidden_states"]
    if not isinstance(gemm2, torch.Tensor) or gemm2.dim() != 3:
        raise ValueError("gemm2_weights must be a [num_experts, hidden, intermediate] tensor")
    experts, hidden_size, inter = (int(s) for s in gemm2.shape)
    routed = api == "fp32w_routed"
    if routed:
        ids = arguments["topk_ids"]
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise ValueError("topk_ids must be a [seq_len, top_k] tensor")
        top_k = int(ids.shape[1])
    else:
        top_k = _int("top_k", arguments["top_k"])
        if method != RoutingMethodType.Llama4 and arguments.get("routing_bias") is not None:
            raise _refuse("fp4-contract MoE with a routing_bias and Renormalize routing")
    if method not in (RoutingMethodType.Renormalize, RoutingMethodType.Llama4):
        name = RoutingMethodType(method).name if method in set(RoutingMethodType) else method
        raise _refuse(f"fp4-contract MoE with {name} routing (Renormalize or Llama4 only)")
    weights = (arguments["gemm1_weights"], gemm2)
    if any(w.dtype != torch.float32 for w in weights if isinstance(w, torch.Tensor)):
        raise _refuse("fp4-contract MoE with weights other than float32")
    if isinstance(hidden, torch.Tensor) and hidden.dtype != torch.bfloat16:
        raise _refuse("fp4-contract MoE with hidden_states other than bfloat16")
    variant = "fp32w_routed" if routed else "fp32w"
    return MoEKey(variant, method, top_k, 1, 1, experts, experts, hidden_size, inter)


def moe_key(api: str, arguments: Mapping[str, Any]) -> MoEKey:
    """The key of a call's schema. api: "fp8_block" (trtllm_fp8_block_scale_moe),
    "fp8_per_tensor", "bf16", "fp32w" (moe_fp32_weights) or "fp32w_routed"
    (routed_moe_fp32_weights); arguments: the call's, by parameter name. Raises ValueError
    for a call no Definition describes (see the module docstring), naming why."""
    if api in ("fp32w", "fp32w_routed"):
        return _fp32_weights_key(api, arguments)
    method = _int("routing_method_type", arguments["routing_method_type"])
    top_k = _int("top_k", arguments["top_k"])
    gemm2 = arguments["gemm2_weights"]
    logits = arguments["routing_logits"]
    if not isinstance(gemm2, torch.Tensor) or gemm2.dim() != 3:
        raise ValueError("gemm2_weights must be a [num_local_experts, hidden, intermediate] tensor")
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("routing_logits must be a [seq_len, num_experts] tensor")
    num_local, hidden, inter = (int(s) for s in gemm2.shape)
    num_experts = int(logits.shape[1])
    for name, value in (
        ("use_shuffled_weight", arguments.get("use_shuffled_weight")),
        ("num_fused_shared_experts", arguments.get("num_fused_shared_experts")),
        ("gemm1_alpha", arguments.get("gemm1_alpha")),
        ("gemm1_beta", arguments.get("gemm1_beta")),
        ("gemm1_clamp_limit", arguments.get("gemm1_clamp_limit")),
        ("routing_replay_out", arguments.get("routing_replay_out")),  # an output none lists
    ):
        if value is not None and value is not False and not (isinstance(value, int) and value == 0):
            raise _refuse(f"a call with {name}")
    if _int("weight_layout", arguments.get("weight_layout") or 0) != 0:
        raise _refuse("weights in a layout other than MajorK")
    if arguments.get("do_finalize", True) is False:
        raise _refuse("a call with do_finalize=False")
    local_only = num_local == num_experts and not arguments.get("local_expert_offset")
    plain = arguments.get("routing_bias") is None and arguments.get("routed_scaling_factor") in (
        None,
        1.0,
    )
    if api == "fp8_block" and method == RoutingMethodType.DeepSeekV3:
        n_group = _int("n_group", arguments.get("n_group") or 1)
        topk_group = _int("topk_group", arguments.get("topk_group") or 1)
        return MoEKey(
            "ds", method, top_k, n_group, topk_group, num_experts, num_local, hidden, inter
        )
    if api == "fp8_block" and method == RoutingMethodType.Renormalize and local_only and plain:
        return MoEKey("renorm", method, top_k, 1, 1, num_experts, num_local, hidden, inter)
    if api == "fp8_block" and method in ROUTING_STEPS:  # FlashInfer's template layout
        return MoEKey("standard", method, top_k, 1, 1, num_experts, num_local, hidden, inter)
    if api == "fp8_per_tensor" and method in (
        RoutingMethodType.Renormalize,
        RoutingMethodType.Llama4,
    ):
        llama4 = method == RoutingMethodType.Llama4
        if not local_only:
            raise _refuse("per-tensor fp8 MoE with experts of other ranks")
        if bool(arguments.get("use_routing_scales_on_input")) != llama4:
            raise _refuse(
                "per-tensor fp8 MoE with use_routing_scales_on_input="
                f"{bool(arguments.get('use_routing_scales_on_input'))} and "
                f"{RoutingMethodType(method).name} routing (its Definitions: True for Llama4, "
                "False for Renormalize)"
            )
        if not llama4 and not plain:
            raise _refuse("per-tensor Renormalize routing with a bias or a routed_scaling_factor")
        return MoEKey("per_tensor", method, top_k, 1, 1, num_experts, num_local, hidden, inter)
    if api == "bf16" and method in ROUTING_SLUGS:
        if method not in BIASED_METHODS and arguments.get("routing_bias") is not None:
            raise _refuse(
                f"bf16 MoE with a routing_bias and {RoutingMethodType(method).name} routing"
            )
        if method in BIASED_METHODS and arguments.get("routing_bias") is None:
            raise _refuse(f"bf16 MoE with {RoutingMethodType(method).name} routing and no bias")
        n_group = _int("n_group", arguments.get("n_group") or 1) if method == 2 else 1
        topk_group = _int("topk_group", arguments.get("topk_group") or 1) if method == 2 else 1
        return MoEKey(
            "bf16", method, top_k, n_group, topk_group, num_experts, num_local, hidden, inter
        )
    known = method in set(RoutingMethodType)
    name = RoutingMethodType(method).name if known else f"routing_method_type {method}"
    raise _refuse(f"{api} MoE with {name} routing")


def schema_for_call(api: str, arguments: Mapping[str, Any]) -> MoESchema:
    """The schema of a call (see moe_key)."""
    return schema_of(moe_key(api, arguments))


# --------------------------------------------------------------------------- a Definition's key

# Every MoE Definition's name, its head naming the variant and the routing method.
_DEFINITION_NAME = re.compile(
    r"^(?P<head>[a-z0-9_]+?)_topk(?P<top_k>\d+)(?:_ng(?P<n_group>\d+)_kg(?P<topk_group>\d+))?"
    r"_e(?P<experts>\d+)_h(?P<hidden>\d+)_i(?P<inter>\d+)$"
)
_METHODS = {slug: method for method, slug in ROUTING_SLUGS.items()}


def _variant_of(head: str, definition: Definition) -> tuple[str, int] | None:
    """(variant, routing_method_type) of a Definition name's head, or None."""
    # Llama4's per-tensor Definitions list the (unread) routing bias; Renormalize's have none.
    llama4 = "routing_bias" in definition.inputs
    # The routed fp4 Definitions list no bias: Llama4's say so in the description (and their
    # reference applies the weight on the input).
    routed_llama4 = "Llama4" in (definition.description or "") or (
        "use_routing_scales_on_input=True" in definition.reference
    )
    fixed = {
        "ds": 2,
        "renorm": 1,
        "per_tensor": 3 if llama4 else 1,
        "fp32w": 3 if llama4 else 1,
        "fp32w_routed": 3 if routed_llama4 else 1,
    }
    for variant, method in fixed.items():
        if head == VARIANT_PREFIXES[variant]:
            return variant, method
    for variant in ("bf16", "standard"):
        start = f"{VARIANT_PREFIXES[variant]}_"
        if head.startswith(start) and head.endswith("_routing"):
            method_of = _METHODS.get(head[len(start) : -len("_routing")])
            if method_of is not None:
                return variant, method_of
    return None


def definition_key(definition: Definition) -> MoEKey | None:
    """The key of the schema whose Definitions `definition` is one of, read from its name and
    its constants (the routing constants are in the name only), or None where it is no MoE
    Definition flashtune has a variant of."""
    match = _DEFINITION_NAME.match(definition.name)
    head = "" if match is None else match["head"]
    found = None if match is None else _variant_of(head, definition)
    if match is None or found is None:
        return None
    (variant, method), const = found, definition.const_axes
    if variant not in ("ds", "bf16") and match["n_group"] is not None:
        return None
    # The e axis: the local experts (all of them at EP 1).
    local = const.get("num_local_experts", int(match["experts"]))
    groups = int(match["n_group"] or 1), int(match["topk_group"] or 1)
    return MoEKey(
        variant, method, int(match["top_k"]), *groups, const.get("num_experts", local), local,
        int(match["hidden"]), int(match["inter"]),
    )  # fmt: skip


def schema_for_definition(
    definition: Definition, variants: tuple[str, ...] | None = None
) -> MoESchema | None:
    """The schema made for `definition`'s key (definition_key), or None where it has none or
    its variant is not among `variants` (whether the contracts agree is the caller's to check)."""
    key = definition_key(definition)
    if key is None or (variants is not None and key.variant not in variants):
        return None
    return schema_of(key)

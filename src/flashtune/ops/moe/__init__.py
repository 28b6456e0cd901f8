"""Fused mixture-of-experts layers in FlashInfer's API (`flashinfer.fused_moe`): routing, then
each token's top-k experts (SwiGLU MLPs) and their weighted sum, in one call.

- `trtllm_fp8_block_scale_moe`: fp8 e4m3 activations and weights with DeepSeek's block
  scales (activations: one scale per token and 128 channels, [H/128, T]; weights: one per
  128 x 128 block);
- `trtllm_fp8_per_tensor_scale_moe`: fp8 activations and weights with per-expert output
  scales (Llama 4, per-tensor quantized checkpoints);
- `trtllm_bf16_moe`: bf16 activations and weights;
- `moe_fp32_weights`, `routed_moe_fp32_weights`: bf16 activations and float32 weights, the
  contract of FlashInfer-Trace's `trtllm_fp4_block_scale_moe` /
  `trtllm_fp4_block_scale_routed_moe` Definitions (their references run float32 weights;
  FlashInfer's kernel reads MxFP4), the routed one taking packed topk_ids;
- `RoutingMethodType`: how experts are picked (routing.py's table: Default, Renormalize,
  DeepSeekV3, Llama4, RenormalizeNaive, TopK, ...).

Weights: gemm1_weights [E_local, 2I, H] (the up projection's I rows first, then the gate's:
the SwiGLU is silu(gate) * up), gemm2_weights [E_local, H, I], plain row-major ("MajorK",
FlashInfer's weight_layout 0, not shuffled). Expert parallelism: routing_logits cover all
num_experts experts; this rank holds local_num_experts of them from local_expert_offset and
sums only their contributions.

Layout: routing.py (the enum and the routing, PyTorch), reference.py (the contract),
schema.py (the FlashInfer-Trace Definitions), experts.py (the expert computation: grouped
GEMMs, Triton), checks.py (the entry points' argument checks), fp32_weights.py (the
float32-weight entry points, wrapped and public here). docs/moe.md: semantics, API, examples.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.data.models import Definition
from flashtune.model_shapes import ModelConfig
from flashtune.ops.moe.checks import (
    SWIGLU,
    check_output,
    check_routing,
    check_tensor,
    check_unsupported,
    route,
)
from flashtune.ops.moe.experts import ExpertQuant, fused_experts
from flashtune.ops.moe.fp32_weights import moe_fp32_weights as _moe_fp32_weights
from flashtune.ops.moe.fp32_weights import routed_moe_fp32_weights as _routed_moe_fp32_weights
from flashtune.ops.moe.keys import schema_for_call, schema_for_definition
from flashtune.ops.moe.reference import (
    moe_bf16_ref,
    moe_fp8_block_scale_ref,
    moe_fp8_per_tensor_scale_ref,
    moe_fp32_weights_ref,
    routed_moe_fp32_weights_ref,
)
from flashtune.ops.moe.routing import (
    RoutingMethodType,
    routing_method,
    select_experts,
)
from flashtune.ops.moe.schema import VARIANT_SCHEMAS
from flashtune.schema import REGISTRY, ApiOp, OpSchema
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = [
    "RoutingMethodType",
    "trtllm_fp8_block_scale_moe",
    "trtllm_fp8_per_tensor_scale_moe",
    "trtllm_bf16_moe",
    "moe_fp32_weights",
    "routed_moe_fp32_weights",
    "moe_fp32_weights_ref",
    "routed_moe_fp32_weights_ref",
    "select_experts",
    "moe_fp8_block_scale_ref",
    "moe_fp8_per_tensor_scale_ref",
    "moe_bf16_ref",
    "MOE_OPS",
    "moe_examples",
]

_FP8 = torch.float8_e4m3fn
_DEEPSEEK_FP8 = 1  # FlashInfer's Fp8QuantizationType.DeepSeekFp8
_BLOCK = 128


# --------------------------------------------------------------------------- the schema's view


class _MoEOp(ApiOp):
    """The schema's view of a MoE call: its key (keys.moe_key) picks the schema; routing
    constants become plain ints, a routed_scaling_factor of None is 1. Calls no Definition
    describes raise ValueError there (capture, apply and the dump leave them to the op)."""

    def __init__(self, fn: Any, api: str, variants: tuple[str, ...]) -> None:
        super().__init__(fn, self.schema_for, [VARIANT_SCHEMAS[v] for v in variants])
        self.api = api
        self.variants = variants

    def schema_for(self, *args: Any, **kwargs: Any) -> OpSchema:
        return schema_for_call(self.api, self.arguments(args, kwargs))

    def schema_for_definition(self, definition: Definition) -> OpSchema | None:
        """The schema of a dataset's MoE Definition of this op's variants, made for the key
        its name and constants give (keys.definition_key: the registered schemas are
        templates, one per variant, that name none of them), or None where it is none of
        this op's. A Definition flashtune has no kernel for (fp4) raises ValueError, why."""
        return schema_for_definition(definition, self.variants)

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        arguments["routing_method_type"] = int(arguments["routing_method_type"])
        arguments["top_k"] = int(arguments["top_k"])
        for name in ("n_group", "topk_group"):
            arguments[name] = int(arguments[name] or 1)
        arguments["local_expert_offset"] = int(arguments["local_expert_offset"])
        scale = arguments["routed_scaling_factor"]
        arguments["routed_scaling_factor"] = 1.0 if scale is None else float(scale)
        return arguments


# --------------------------------------------------------------------------- the API


def trtllm_fp8_block_scale_moe(
    routing_logits: torch.Tensor,
    routing_bias: torch.Tensor | None,
    hidden_states: torch.Tensor,
    hidden_states_scale: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm1_weights_scale: torch.Tensor,
    gemm2_weights: torch.Tensor,
    gemm2_weights_scale: torch.Tensor,
    num_experts: int,
    top_k: int,
    n_group: int | None,
    topk_group: int | None,
    intermediate_size: int,
    local_expert_offset: int,
    local_num_experts: int,
    routed_scaling_factor: float | None,
    tile_tokens_dim: int | None = 8,
    routing_method_type: int = 0,
    use_shuffled_weight: bool = False,
    weight_layout: int = 0,
    enable_pdl: bool | None = None,
    *,
    do_finalize: bool = True,
    tune_max_num_tokens: int = 8192,
    fp8_quantization_type: int | None = None,
    num_fused_shared_experts: int | None = None,
    activation_type: int = SWIGLU,
    norm_topk_prob: bool = True,
    routing_replay_out: torch.Tensor | None = None,
    gemm1_alpha: torch.Tensor | None = None,
    gemm1_beta: torch.Tensor | None = None,
    gemm1_clamp_limit: torch.Tensor | None = None,
    output: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 block-scale MoE: FlashInfer's `trtllm_fp8_block_scale_moe` (0.2.14's positional
    order; later FlashInfer's further arguments keyword-only).

    routing_logits [T, num_experts] float32/bf16; routing_bias [num_experts] or None;
    hidden_states [T, H] fp8 e4m3 with hidden_states_scale [H/128, T] float32; gemm1_weights
    [local_num_experts, 2 * intermediate_size, H] fp8 (up rows, then gate rows) with
    gemm1_weights_scale [E_local, 2I/128, H/128]; gemm2_weights [E_local, H, I] fp8 with
    gemm2_weights_scale [E_local, H/128, I/128]. Routing by routing_method_type (a
    RoutingMethodType; DeepSeekV3 reads n_group, topk_group and routed_scaling_factor).
    Returns [T, H] bfloat16 (written into `output` when given).

    enable_pdl: the expert kernels chain with programmatic dependent launch (None: on where
    the GPU has it, ops/pdl.py). Accepted and unused (FlashInfer's tuning knobs):
    tile_tokens_dim, tune_max_num_tokens (flashtune's experts pick their tiles per shape
    through its autotuner). `routing_replay_out` ([>= T, top_k] int16) receives the selected expert ids.
    Refused by name: shuffled or block-major weights, do_finalize=False, activations other
    than SwiGLU, fused shared experts, SwiGLU alpha/beta/clamp, MxFp8.
    """
    check_unsupported(
        use_shuffled_weight=use_shuffled_weight,
        weight_layout=weight_layout,
        do_finalize=do_finalize,
        activation_type=activation_type,
        norm_topk_prob=norm_topk_prob,
        num_fused_shared_experts=num_fused_shared_experts,
        gemm1_alpha=gemm1_alpha,
        gemm1_beta=gemm1_beta,
        gemm1_clamp_limit=gemm1_clamp_limit,
    )
    if fp8_quantization_type is not None and int(fp8_quantization_type) != _DEEPSEEK_FP8:
        raise ValueError(
            f"fp8_quantization_type={fp8_quantization_type!r} is not supported: flashtune's "
            "block-scale MoE is DeepSeek's fp8 (Fp8QuantizationType.DeepSeekFp8)"
        )
    tokens = check_routing(
        routing_logits, routing_bias, hidden_states, num_experts, top_k, local_expert_offset,
        local_num_experts,
    )  # fmt: skip
    hidden, inter = hidden_states.shape[1], intermediate_size
    if hidden % _BLOCK or inter % _BLOCK:
        raise ValueError(
            f"hidden_size ({hidden}) and intermediate_size ({inter}) must be multiples of 128 "
            "(the fp8 block size)"
        )
    e, b = local_num_experts, _BLOCK
    check_tensor("hidden_states", hidden_states, (tokens, hidden), (_FP8,))
    check_tensor(
        "hidden_states_scale", hidden_states_scale, (hidden // b, tokens), (torch.float32,)
    )
    check_tensor("gemm1_weights", gemm1_weights, (e, 2 * inter, hidden), (_FP8,))
    check_tensor("gemm1_weights_scale", gemm1_weights_scale, (e, 2 * inter // b, hidden // b),
                 (torch.float32,))  # fmt: skip
    check_tensor("gemm2_weights", gemm2_weights, (e, hidden, inter), (_FP8,))
    check_tensor("gemm2_weights_scale", gemm2_weights_scale, (e, hidden // b, inter // b),
                 (torch.float32,))  # fmt: skip
    out = check_output(output, tokens, hidden, hidden_states.device)
    ids, weights = route(
        routing_logits, routing_bias, routing_method_type, top_k, n_group, topk_group,
        routed_scaling_factor, routing_replay_out,
    )  # fmt: skip
    quant = ExpertQuant(
        "fp8_block",
        hidden_states_scale=hidden_states_scale,
        gemm1_weights_scale=gemm1_weights_scale,
        gemm2_weights_scale=gemm2_weights_scale,
    )
    return fused_experts(
        hidden_states, gemm1_weights, gemm2_weights, ids, weights, quant=quant,
        local_expert_offset=local_expert_offset, out=out, enable_pdl=enable_pdl,
    )  # fmt: skip


def trtllm_fp8_per_tensor_scale_moe(
    routing_logits: torch.Tensor,
    routing_bias: torch.Tensor | None,
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    output1_scales_scalar: torch.Tensor,
    output1_scales_gate_scalar: torch.Tensor,
    gemm2_weights: torch.Tensor,
    output2_scales_scalar: torch.Tensor,
    num_experts: int,
    top_k: int,
    n_group: int | None,
    topk_group: int | None,
    intermediate_size: int,
    local_expert_offset: int,
    local_num_experts: int,
    routed_scaling_factor: float | None,
    use_routing_scales_on_input: bool,
    tile_tokens_dim: int | None = 8,
    routing_method_type: int = 0,
    enable_pdl: bool | None = None,
    *,
    do_finalize: bool = True,
    tune_max_num_tokens: int = 8192,
    activation_type: int = SWIGLU,
    norm_topk_prob: bool = True,
    routing_replay_out: torch.Tensor | None = None,
    output: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 per-tensor-scale MoE: FlashInfer's `trtllm_fp8_per_tensor_scale_moe` (0.2.14's
    positional order; later FlashInfer's further arguments keyword-only).

    hidden_states [T, H] fp8 e4m3; gemm1_weights [local_num_experts, 2I, H] and gemm2_weights
    [E_local, H, I] fp8; per local expert, output1_scales_scalar [E_local] scales GEMM1's up
    half, output1_scales_gate_scalar its gate half, output2_scales_scalar GEMM2's output (the
    activation's and weights' per-tensor scales folded in). use_routing_scales_on_input: the
    routing weight multiplies the token before GEMM1 (Llama 4, top_k 1) instead of the
    expert's output. Llama4 routing reads neither routing_bias nor routed_scaling_factor (as
    FlashInfer's kernel; FlashInfer-Trace's Definitions say so). Returns [T, H] bfloat16.

    enable_pdl as trtllm_fp8_block_scale_moe's. Accepted and unused: tile_tokens_dim,
    tune_max_num_tokens.
    """
    check_unsupported(do_finalize=do_finalize, activation_type=activation_type,
                      norm_topk_prob=norm_topk_prob)  # fmt: skip
    tokens = check_routing(
        routing_logits, routing_bias, hidden_states, num_experts, top_k, local_expert_offset,
        local_num_experts,
    )  # fmt: skip
    hidden, inter, e = hidden_states.shape[1], intermediate_size, local_num_experts
    check_tensor("hidden_states", hidden_states, (tokens, hidden), (_FP8,))
    check_tensor("gemm1_weights", gemm1_weights, (e, 2 * inter, hidden), (_FP8,))
    check_tensor("gemm2_weights", gemm2_weights, (e, hidden, inter), (_FP8,))
    for name, t in (
        ("output1_scales_scalar", output1_scales_scalar),
        ("output1_scales_gate_scalar", output1_scales_gate_scalar),
        ("output2_scales_scalar", output2_scales_scalar),
    ):
        check_tensor(name, t, (e,), (torch.float32,))
    out = check_output(output, tokens, hidden, hidden_states.device)
    llama4 = routing_method(routing_method_type) == RoutingMethodType.Llama4
    if use_routing_scales_on_input and top_k != 1:
        raise ValueError(
            f"use_routing_scales_on_input needs top_k == 1 (one weight per token), got {top_k}"
        )
    ids, weights = route(
        routing_logits, None if llama4 else routing_bias, routing_method_type, top_k, n_group,
        topk_group, None if llama4 else routed_scaling_factor, routing_replay_out,
    )  # fmt: skip
    quant = ExpertQuant(
        "fp8_per_tensor",
        output1_scales_scalar=output1_scales_scalar,
        output1_scales_gate_scalar=output1_scales_gate_scalar,
        output2_scales_scalar=output2_scales_scalar,
    )
    if use_routing_scales_on_input:
        # The weight scales the token before GEMM1 (a nonlinear SwiGLU follows, so it cannot
        # move to the output). One fp8 activation scale cannot hold a weight per token, so
        # the scaled tokens go in as bf16 (GEMM1 upcasts the fp8 weight tiles) with weight 1
        # on the outputs. The PyTorch expert loop this replaced synced with the host per
        # expert and took 1.2 ms at T=1 (H200, e16 x 5120 x 8192).
        hidden_states = (hidden_states.float() * weights.float()).to(torch.bfloat16)
        weights = torch.ones_like(weights, dtype=torch.float32)
    return fused_experts(
        hidden_states, gemm1_weights, gemm2_weights, ids, weights, quant=quant,
        local_expert_offset=local_expert_offset, out=out, enable_pdl=enable_pdl,
    )  # fmt: skip


def trtllm_bf16_moe(
    routing_logits: torch.Tensor,
    routing_bias: torch.Tensor | None,
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm2_weights: torch.Tensor,
    num_experts: int,
    top_k: int,
    n_group: int | None,
    topk_group: int | None,
    intermediate_size: int,
    local_expert_offset: int,
    local_num_experts: int,
    routed_scaling_factor: float | None = None,
    routing_method_type: int = 0,
    use_shuffled_weight: bool = True,
    weight_layout: int = 2,
    do_finalize: bool = True,
    enable_pdl: bool = True,
    tune_max_num_tokens: int = 8192,
    activation_type: int = SWIGLU,
    norm_topk_prob: bool = True,
    routing_replay_out: torch.Tensor | None = None,
    gemm1_alpha: torch.Tensor | None = None,
    gemm1_beta: torch.Tensor | None = None,
    gemm1_clamp_limit: torch.Tensor | None = None,
    output: torch.Tensor | None = None,
) -> torch.Tensor:
    """BF16 MoE: later FlashInfer's `trtllm_bf16_moe` (its signature and defaults).

    hidden_states [T, H] bf16, gemm1_weights [local_num_experts, 2I, H], gemm2_weights
    [E_local, H, I] bf16, row-major. FlashInfer's defaults (use_shuffled_weight=True,
    weight_layout=BlockMajorK) describe its own shuffled layout, which flashtune does not
    read: pass use_shuffled_weight=False, weight_layout=0 (MajorK) with plain weights (else
    ValueError). Returns [T, H] bfloat16. enable_pdl as trtllm_fp8_block_scale_moe's.
    Accepted and unused: tune_max_num_tokens.
    """
    check_unsupported(
        use_shuffled_weight=use_shuffled_weight,
        weight_layout=weight_layout,
        do_finalize=do_finalize,
        activation_type=activation_type,
        norm_topk_prob=norm_topk_prob,
        gemm1_alpha=gemm1_alpha,
        gemm1_beta=gemm1_beta,
        gemm1_clamp_limit=gemm1_clamp_limit,
    )
    tokens = check_routing(
        routing_logits, routing_bias, hidden_states, num_experts, top_k, local_expert_offset,
        local_num_experts,
    )  # fmt: skip
    hidden, inter, e = hidden_states.shape[1], intermediate_size, local_num_experts
    check_tensor("hidden_states", hidden_states, (tokens, hidden), (torch.bfloat16,))
    check_tensor("gemm1_weights", gemm1_weights, (e, 2 * inter, hidden), (torch.bfloat16,))
    check_tensor("gemm2_weights", gemm2_weights, (e, hidden, inter), (torch.bfloat16,))
    out = check_output(output, tokens, hidden, hidden_states.device)
    ids, weights = route(
        routing_logits, routing_bias, routing_method_type, top_k, n_group, topk_group,
        routed_scaling_factor, routing_replay_out,
    )  # fmt: skip
    return fused_experts(
        hidden_states, gemm1_weights, gemm2_weights, ids, weights,
        quant=ExpertQuant("bf16"), local_expert_offset=local_expert_offset, out=out,
        enable_pdl=enable_pdl,
    )  # fmt: skip


class _FP32WeightsOp(_MoEOp):
    """The schema's view of moe_fp32_weights / routed_moe_fp32_weights calls (no groups,
    offsets or scaling factors to normalize)."""

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = ApiOp.arguments(self, args, kwargs)
        arguments["routing_method_type"] = int(arguments["routing_method_type"])
        if "top_k" in arguments:
            arguments["top_k"] = int(arguments["top_k"])
        return arguments


trtllm_fp8_block_scale_moe = _MoEOp(
    trtllm_fp8_block_scale_moe, "fp8_block", ("ds", "renorm", "standard")
)
trtllm_fp8_per_tensor_scale_moe = _MoEOp(
    trtllm_fp8_per_tensor_scale_moe, "fp8_per_tensor", ("per_tensor",)
)
trtllm_bf16_moe = _MoEOp(trtllm_bf16_moe, "bf16", ("bf16",))
moe_fp32_weights = _FP32WeightsOp(_moe_fp32_weights, "fp32w", ("fp32w",))
routed_moe_fp32_weights = _FP32WeightsOp(
    _routed_moe_fp32_weights, "fp32w_routed", ("fp32w_routed",)
)
# The public names, not fp32_weights.py's (flashtune.schema.family_op looks them up by them).
moe_fp32_weights.qualname = f"{__name__}.moe_fp32_weights"
routed_moe_fp32_weights.qualname = f"{__name__}.routed_moe_fp32_weights"

# The schema'd ops of the family, registered by their qualname in flashtune.schema.REGISTRY
# (the definition dump, apply's mirror and capture list them from there).
MOE_OPS: tuple[ApiOp, ...] = (
    trtllm_fp8_block_scale_moe,
    trtllm_fp8_per_tensor_scale_moe,
    trtllm_bf16_moe,
    moe_fp32_weights,
    routed_moe_fp32_weights,
)
for _op in MOE_OPS:
    REGISTRY[_op.qualname] = _op


# --------------------------------------------------------------------------- model examples

EXAMPLE_TOKENS = 7


def _block_scale_call(model: ModelConfig, tokens: int) -> Example:
    moe = model.moe
    assert moe is not None
    h, i, e, b = model.hidden_size, moe.intermediate_size, moe.local_experts, _BLOCK
    ds = moe.routing == "DeepSeekV3"
    f8 = _FP8
    args = (
        # DeepSeek's router logits are float32 (its bias bf16), Qwen3's bf16 (no bias), as the
        # corpus's Definitions have them
        meta_tensor(tokens, moe.num_experts, dtype=torch.float32 if ds else torch.bfloat16),
        meta_tensor(moe.num_experts) if ds else None,
        meta_tensor(tokens, h, dtype=f8),
        meta_tensor(h // b, tokens, dtype=torch.float32),
        meta_tensor(e, 2 * i, h, dtype=f8),
        meta_tensor(e, 2 * i // b, h // b, dtype=torch.float32),
        meta_tensor(e, h, i, dtype=f8),
        meta_tensor(e, h // b, i // b, dtype=torch.float32),
        moe.num_experts, moe.top_k, moe.n_group, moe.topk_group, i,
        e if moe.expert_parallel > 1 else 0,  # the second rank's experts
        e,
        moe.routed_scaling_factor if ds else None,
    )  # fmt: skip
    method = int(RoutingMethodType[moe.routing])
    return (trtllm_fp8_block_scale_moe, args, {"routing_method_type": method})


def _per_tensor_call(model: ModelConfig, tokens: int) -> Example:
    moe = model.moe
    assert moe is not None
    h, i, e = model.hidden_size, moe.intermediate_size, moe.local_experts
    llama4 = moe.routing == "Llama4"
    f8 = _FP8
    args = (
        meta_tensor(tokens, e),
        meta_tensor(e) if llama4 else None,
        meta_tensor(tokens, h, dtype=f8),
        meta_tensor(e, 2 * i, h, dtype=f8),
        meta_tensor(e, dtype=torch.float32),
        meta_tensor(e, dtype=torch.float32),
        meta_tensor(e, h, i, dtype=f8),
        meta_tensor(e, dtype=torch.float32),
        e, moe.top_k, None, None, i, 0, e, None, llama4,
    )  # fmt: skip
    method = int(RoutingMethodType[moe.routing])
    return (trtllm_fp8_per_tensor_scale_moe, args, {"routing_method_type": method})


def _bf16_call(model: ModelConfig, tokens: int) -> Example:
    moe = model.moe
    assert moe is not None
    h, i, e = model.hidden_size, moe.intermediate_size, moe.local_experts
    ds = moe.routing == "DeepSeekV3"
    args = (
        meta_tensor(tokens, moe.num_experts, dtype=torch.float32),
        meta_tensor(moe.num_experts) if ds else None,
        meta_tensor(tokens, h),
        meta_tensor(e, 2 * i, h),
        meta_tensor(e, h, i),
        moe.num_experts, moe.top_k, moe.n_group, moe.topk_group, i,
        e if moe.expert_parallel > 1 else 0,
        e,
        moe.routed_scaling_factor if ds else None,
    )  # fmt: skip
    method = int(RoutingMethodType[moe.routing])
    kwargs = {"routing_method_type": method, "use_shuffled_weight": False, "weight_layout": 0}
    return (trtllm_bf16_moe, args, kwargs)


def _fp32_weights_calls(model: ModelConfig, tokens: int) -> list[Example]:
    """The float32-weight calls (FlashInfer-Trace's fp4 Definitions' contract): routed by
    the op, and routed by the caller (packed topk_ids)."""
    moe = model.moe
    assert moe is not None
    h, i, e = model.hidden_size, moe.intermediate_size, moe.local_experts
    llama4 = moe.routing == "Llama4"
    f32, bf16 = torch.float32, torch.bfloat16
    weights = (meta_tensor(e, 2 * i, h, dtype=f32), meta_tensor(e, h, i, dtype=f32))
    method = int(RoutingMethodType[moe.routing])
    routed = (
        meta_tensor(tokens, moe.top_k, dtype=torch.int32),
        meta_tensor(tokens, h, dtype=bf16),
        *weights,
    )
    logits = (
        meta_tensor(tokens, e, dtype=bf16),
        meta_tensor(tokens, h, dtype=bf16),
        *weights,
        meta_tensor(e, dtype=bf16) if llama4 else None,
    )
    return [
        (moe_fp32_weights, logits, {"routing_method_type": method, "top_k": moe.top_k}),
        (routed_moe_fp32_weights, routed, {"routing_method_type": method}),
    ]


@register_examples
def moe_examples(model: ModelConfig) -> list[Example]:
    """The MoE layer of a MoE model at its per-GPU shapes (experts split by expert
    parallelism) on the meta device: FlashInfer's fp8 block-scale call with the model's
    routing (DeepSeekV3, Renormalize), its per-tensor call (Renormalize, Llama4) where
    FlashInfer-Trace has a Definition of it (all experts local), the bf16 call, and the
    float32-weight calls (the fp4 Definitions' contract: Renormalize, Llama4, EP 1)."""
    moe = model.moe
    if moe is None:
        return []
    examples: list[Example] = [_bf16_call(model, EXAMPLE_TOKENS)]
    if moe.routing in ("DeepSeekV3", "Renormalize"):
        examples.append(_block_scale_call(model, EXAMPLE_TOKENS))
    if moe.routing in ("Renormalize", "Llama4") and moe.expert_parallel == 1:
        examples.append(_per_tensor_call(model, EXAMPLE_TOKENS))
        examples.extend(_fp32_weights_calls(model, EXAMPLE_TOKENS))
    return examples

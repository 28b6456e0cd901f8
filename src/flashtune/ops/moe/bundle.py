"""The bundled dataset's fused MoE ops at reduced shapes a 2-core CPU runs the references of
(model_shapes' mini-moe-ds and mini-moe: hidden 256, experts of 128, one fp8 block), named
as FlashInfer-Trace names them: the fp8 block-scale MoE with DeepSeek-V3's routing (64
experts in 8 groups, top 8 of the 4 best groups, this rank's 8 of them: EP 8) and with
Qwen3's Renormalize routing (32 experts, top 4), and the per-tensor fp8 MoE with Renormalize
routing, and the bf16 MoE with Renormalize routing, and the float32-weight MoE (the contract
of FlashInfer-Trace's `trtllm_fp4_block_scale_moe` / `..._routed_moe` Definitions, named as
those are) with Renormalize routing, routed by the op and by the caller (packed topk_ids);
flashtune's solutions and torch's (the ops' references).

The routing constants are in each op's name (topk8_ng8_kg4), not among its inputs or shapes:
each entry takes them as keywords (routing_method_type, top_k, and n_group / topk_group for
DeepSeek routing), their defaults the bundled op's, so the bundled solutions call the entries
as they are. A dataset's other MoE Definitions (FlashInfer-Trace's Kimi K2 ng1_kg1, Qwen3
topk10, Llama 4's per-tensor top-1 with Llama4 routing, its routing bias listed last) get
these entries with their constants passed (flashtune.ops.bundle.supply, through the op's
`schema_for_definition`); expert counts, sizes, local_expert_offset and
routed_scaling_factor come from the inputs. FlashInfer's MoE (trtllm-gen kernels) runs on
Blackwell (SM100) only, so no op has a FlashInfer entry: neither the bundled Definitions nor
FlashInfer-Trace's get a FlashInfer solution. Its fp4 MoE Definitions (float32 weights in
their contract) get the float32-weight entries, Llama4's told routing_method_type=3.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from flashtune.data import Definition, Workload
from flashtune.data.models import ScalarInput
from flashtune.ops.bundle import (
    NO_SETUP,
    TORCH_EAGER,
    BundledOp,
    Entry,
    WorkloadContext,
    runs_the_op,
)
from flashtune.ops.bundle.workloads import token_sweep
from flashtune.ops.moe.schema import MoEKey, schema_of

TOKENS = [1, 8, 64, 512, 4096]  # seq_len: decode steps to prefill chunks
DS_MODELS = ("mini-moe-ds",)
RENORM_MODELS = ("mini-moe",)
# The bundled ops' routing constants (their names' topk / ng / kg).
DS_TOP_K, DS_N_GROUP, DS_TOPK_GROUP = 8, 8, 4
RENORM_TOP_K = 4
_DS, _RENORMALIZE, _LLAMA4 = 2, 1, 3  # RoutingMethodType.DeepSeekV3, .Renormalize, .Llama4
_EP_RANK = 1  # the workloads' rank under expert parallelism: local experts from 1 * E_local


def _moe_sweep(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
    """token_sweep's workloads with this rank's expert offset and DeepSeek-V3's routed
    scaling factor where the definition takes them."""
    workloads = token_sweep(TOKENS)(definition, ctx)
    scalars: dict[str, ScalarInput] = {}
    if "local_expert_offset" in definition.inputs:
        offset = _EP_RANK * definition.const_axes["num_local_experts"]
        if offset + definition.const_axes["num_local_experts"] > definition.const_axes.get(
            "num_experts", 0
        ):
            offset = 0
        scalars["local_expert_offset"] = ScalarInput(type="scalar", value=offset)
    if "routed_scaling_factor" in definition.inputs:
        scalars["routed_scaling_factor"] = ScalarInput(type="scalar", value=2.5)
    return [w.model_copy(update={"inputs": {**w.inputs, **scalars}}) for w in workloads]


# --------------------------------------------------------------------------- entries


@runs_the_op
def flashtune_moe_fp8_block_scale_ds_routing(
    routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
    gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
    routed_scaling_factor, *, routing_method_type=_DS, top_k=DS_TOP_K, n_group=DS_N_GROUP,
    topk_group=DS_TOPK_GROUP,
):  # fmt: skip
    from flashtune.ops.moe import trtllm_fp8_block_scale_moe

    return trtllm_fp8_block_scale_moe(
        routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
        gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, routing_logits.shape[1],
        top_k, n_group, topk_group, gemm2_weights.shape[2], int(local_expert_offset),
        gemm1_weights.shape[0], float(routed_scaling_factor),
        routing_method_type=routing_method_type,
    )  # fmt: skip


def torch_moe_fp8_block_scale_ds_routing(
    routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
    gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
    routed_scaling_factor, *, routing_method_type=_DS, top_k=DS_TOP_K, n_group=DS_N_GROUP,
    topk_group=DS_TOPK_GROUP,
):  # fmt: skip
    from flashtune.ops.moe.reference import moe_fp8_block_scale_ref

    return moe_fp8_block_scale_ref(
        routing_logits, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, routing_bias, int(local_expert_offset),
        float(routed_scaling_factor), routing_method_type, top_k, n_group, topk_group,
    )  # fmt: skip


@runs_the_op
def flashtune_moe_fp8_block_scale_renorm(
    routing_logits, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
    gemm2_weights, gemm2_weights_scale, *, routing_method_type=_RENORMALIZE, top_k=RENORM_TOP_K,
):  # fmt: skip
    from flashtune.ops.moe import trtllm_fp8_block_scale_moe

    experts = routing_logits.shape[1]
    return trtllm_fp8_block_scale_moe(
        routing_logits, None, hidden_states, hidden_states_scale, gemm1_weights,
        gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, experts, top_k, None,
        None, gemm2_weights.shape[2], 0, experts, None, routing_method_type=routing_method_type,
    )  # fmt: skip


def torch_moe_fp8_block_scale_renorm(
    routing_logits, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
    gemm2_weights, gemm2_weights_scale, *, routing_method_type=_RENORMALIZE, top_k=RENORM_TOP_K,
):  # fmt: skip
    from flashtune.ops.moe.reference import moe_fp8_block_scale_ref

    return moe_fp8_block_scale_ref(
        routing_logits, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, routing_method_type=routing_method_type, top_k=top_k,
    )  # fmt: skip


@runs_the_op
def flashtune_moe_fp8_per_tensor_renorm(
    routing_logits, hidden_states, gemm1_weights, output1_scales_scalar,
    output1_scales_gate_scalar, gemm2_weights, output2_scales_scalar, routing_bias=None, *,
    routing_method_type=_RENORMALIZE, top_k=RENORM_TOP_K,
):  # fmt: skip
    # Llama4's Definitions list its routing bias (last); the kernel reads it not (FlashInfer's).
    from flashtune.ops.moe import trtllm_fp8_per_tensor_scale_moe

    experts = routing_logits.shape[1]
    return trtllm_fp8_per_tensor_scale_moe(
        routing_logits, routing_bias, hidden_states, gemm1_weights, output1_scales_scalar,
        output1_scales_gate_scalar, gemm2_weights, output2_scales_scalar, experts, top_k,
        None, None, gemm2_weights.shape[2], 0, experts, None, routing_method_type == _LLAMA4,
        routing_method_type=routing_method_type,
    )  # fmt: skip


def torch_moe_fp8_per_tensor_renorm(
    routing_logits, hidden_states, gemm1_weights, output1_scales_scalar,
    output1_scales_gate_scalar, gemm2_weights, output2_scales_scalar, routing_bias=None, *,
    routing_method_type=_RENORMALIZE, top_k=RENORM_TOP_K,
):  # fmt: skip
    from flashtune.ops.moe.reference import moe_fp8_per_tensor_scale_ref

    return moe_fp8_per_tensor_scale_ref(
        routing_logits, hidden_states, gemm1_weights, output1_scales_scalar,
        output1_scales_gate_scalar, gemm2_weights, output2_scales_scalar, routing_bias,
        routing_method_type=routing_method_type, top_k=top_k,
    )  # fmt: skip


@runs_the_op
def flashtune_moe_bf16_renormalize(
    routing_logits, hidden_states, gemm1_weights, gemm2_weights, local_expert_offset,
    routed_scaling_factor, *, routing_method_type=_RENORMALIZE, top_k=RENORM_TOP_K,
):  # fmt: skip
    from flashtune.ops.moe import trtllm_bf16_moe

    return trtllm_bf16_moe(
        routing_logits, None, hidden_states, gemm1_weights, gemm2_weights,
        routing_logits.shape[1], top_k, None, None, gemm2_weights.shape[2],
        int(local_expert_offset), gemm1_weights.shape[0], float(routed_scaling_factor),
        routing_method_type=routing_method_type, use_shuffled_weight=False, weight_layout=0,
    )  # fmt: skip


def torch_moe_bf16_renormalize(
    routing_logits, hidden_states, gemm1_weights, gemm2_weights, local_expert_offset,
    routed_scaling_factor, *, routing_method_type=_RENORMALIZE, top_k=RENORM_TOP_K,
):  # fmt: skip
    from flashtune.ops.moe.reference import moe_bf16_ref

    return moe_bf16_ref(
        routing_logits, hidden_states, gemm1_weights, gemm2_weights, None,
        int(local_expert_offset), float(routed_scaling_factor), routing_method_type, top_k,
    )  # fmt: skip


@runs_the_op
def flashtune_moe_fp32_weights(
    routing_logits, hidden_states, gemm1_weights, gemm2_weights, routing_bias=None, *,
    routing_method_type=_RENORMALIZE, top_k=RENORM_TOP_K,
):  # fmt: skip
    # Llama4's Definitions list its routing bias (last); the op reads it not (FlashInfer's).
    from flashtune.ops.moe import moe_fp32_weights

    return moe_fp32_weights(
        routing_logits, hidden_states, gemm1_weights, gemm2_weights, routing_bias,
        routing_method_type=routing_method_type, top_k=top_k,
    )  # fmt: skip


def torch_moe_fp32_weights(
    routing_logits, hidden_states, gemm1_weights, gemm2_weights, routing_bias=None, *,
    routing_method_type=_RENORMALIZE, top_k=RENORM_TOP_K,
):  # fmt: skip
    from flashtune.ops.moe.reference import moe_fp32_weights_ref

    return moe_fp32_weights_ref(
        routing_logits, hidden_states, gemm1_weights, gemm2_weights, routing_bias,
        routing_method_type, top_k,
    )  # fmt: skip


@runs_the_op
def flashtune_routed_moe_fp32_weights(
    topk_ids, hidden_states, gemm1_weights, gemm2_weights, *, routing_method_type=_RENORMALIZE
):
    from flashtune.ops.moe import routed_moe_fp32_weights

    return routed_moe_fp32_weights(
        topk_ids, hidden_states, gemm1_weights, gemm2_weights,
        routing_method_type=routing_method_type,
    )  # fmt: skip


def torch_routed_moe_fp32_weights(
    topk_ids, hidden_states, gemm1_weights, gemm2_weights, *, routing_method_type=_RENORMALIZE
):
    from flashtune.ops.moe.reference import routed_moe_fp32_weights_ref

    return routed_moe_fp32_weights_ref(
        topk_ids, hidden_states, gemm1_weights, gemm2_weights, routing_method_type
    )


# --------------------------------------------------------------------------- declarations

_FLASHTUNE = (
    "flashtune's fused MoE through its public API ({call}): routing in PyTorch, then the "
    "experts' grouped GEMMs (ops.moe.experts.fused_experts). " + NO_SETUP
)
_TORCH = f"{TORCH_EAGER} The op's reference (ops.moe.reference): a loop over experts, fp32."
_FLASHTUNE_FP32W = (
    "flashtune's fused MoE on float32 weights through its public API ({call}): routing in "
    "PyTorch, then the used experts' float32 weights converted to bf16 inside the call (on "
    "every call: streaming float32 weights converts per call, and the count of used experts "
    "is a host sync; a kernel reading float32 weights directly is the faster follow-up), "
    "then flashtune's bf16 experts' grouped GEMMs (ops.moe.experts.fused_experts). " + NO_SETUP
)


def _prefix(variant: str, method: int, top_k: int, n_group: int = 1, topk_group: int = 1) -> str:
    """The name prefix of the schema of a variant's calls with these routing constants."""
    return schema_of(
        MoEKey(variant, method, top_k, n_group, topk_group, 64, 8, 256, 128)
    ).name_prefix


def _op(
    prefix: str,
    models: tuple[str, ...],
    flashtune: Callable[..., torch.Tensor],
    reference: Callable[..., torch.Tensor],
    call: str,
    described: str = _FLASHTUNE,
) -> BundledOp:
    return BundledOp(
        prefix=prefix,
        workloads=_moe_sweep,
        models=models,
        entries=(
            Entry("flashtune", flashtune, described.format(call=call)),
            Entry("torch", reference, _TORCH),
        ),
    )


BUNDLED = (
    _op(
        _prefix("ds", _DS, DS_TOP_K, DS_N_GROUP, DS_TOPK_GROUP),
        DS_MODELS,
        flashtune_moe_fp8_block_scale_ds_routing,
        torch_moe_fp8_block_scale_ds_routing,
        "fused_moe.trtllm_fp8_block_scale_moe, DeepSeekV3 routing",
    ),
    _op(
        _prefix("renorm", _RENORMALIZE, RENORM_TOP_K),
        RENORM_MODELS,
        flashtune_moe_fp8_block_scale_renorm,
        torch_moe_fp8_block_scale_renorm,
        "fused_moe.trtllm_fp8_block_scale_moe, Renormalize routing",
    ),
    _op(
        _prefix("per_tensor", _RENORMALIZE, RENORM_TOP_K),
        RENORM_MODELS,
        flashtune_moe_fp8_per_tensor_renorm,
        torch_moe_fp8_per_tensor_renorm,
        "fused_moe.trtllm_fp8_per_tensor_scale_moe, Renormalize routing",
    ),
    _op(
        _prefix("bf16", _RENORMALIZE, RENORM_TOP_K),
        RENORM_MODELS,
        flashtune_moe_bf16_renormalize,
        torch_moe_bf16_renormalize,
        "fused_moe.trtllm_bf16_moe, Renormalize routing",
    ),
    _op(
        _prefix("fp32w", _RENORMALIZE, RENORM_TOP_K),
        RENORM_MODELS,
        flashtune_moe_fp32_weights,
        torch_moe_fp32_weights,
        "ops.moe.moe_fp32_weights, Renormalize routing",
        _FLASHTUNE_FP32W,
    ),
    _op(
        _prefix("fp32w_routed", _RENORMALIZE, RENORM_TOP_K),
        RENORM_MODELS,
        flashtune_routed_moe_fp32_weights,
        torch_routed_moe_fp32_weights,
        "ops.moe.routed_moe_fp32_weights, packed topk_ids",
        _FLASHTUNE_FP32W,
    ),
)

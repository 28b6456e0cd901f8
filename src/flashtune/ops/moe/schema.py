"""Schemas of the fused MoE ops: the FlashInfer-Trace MoE Definitions, field for field
(`moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048`,
`moe_fp8_block_scale_renorm_topk8_e128_h2048_i768`,
`trtllm_fp8_per_tensor_scale_moe_topk1_e16_h5120_i8192`, ...), with `reference.py`'s functions
emitted as their reference (after `routing.select_experts` and `reference.run_experts_ref`).

The corpus spells one contract per routing and layout, and bakes the routing constants into
the name (topk8_ng8_kg4) though no axis holds them; so a call's schema is made for its key
(variant, top_k, n_group, topk_group, expert counts and sizes; keys.py's `schema_for_call`):
- `ds`: trtllm_fp8_block_scale_moe with DeepSeekV3 routing (any expert parallelism);
- `renorm`: trtllm_fp8_block_scale_moe with Renormalize routing, all experts local, no bias;
- `standard`: trtllm_fp8_block_scale_moe with any other routing method (and Renormalize calls
  the renorm Definitions do not describe), as FlashInfer's trace templates name and lay them
  out (`moe_fp8_block_scale_default_routing_topk8_e32_h7168_i2048`, ...);
- `per_tensor`: trtllm_fp8_per_tensor_scale_moe with Renormalize or Llama4 routing (Llama4's
  bias and scaling factor unread, its weight on the input), all experts local;
- `bf16`: trtllm_bf16_moe with any routing method (flashtune's own Definitions, named as
  `trtllm_bf16_moe_<method>_routing_topk8[_ng8_kg4]_e.._h.._i..`: FlashInfer-Trace has none);
- `fp32w` / `fp32w_routed`: FlashInfer-Trace's `trtllm_fp4_block_scale_moe` /
  `trtllm_fp4_block_scale_routed_moe` Definitions, whose contract (despite the names) is bf16
  hidden_states and float32 weights (their references' plain fp32 math; FlashInfer's kernel
  reads MxFP4 weights), Renormalize or Llama4 routing, all experts local; the routed one takes
  the routing as packed topk_ids (routing.unpack_topk_ids). flashtune's ops
  `moe_fp32_weights` / `routed_moe_fp32_weights` are that contract.
Other calls (per-tensor routings other than those, fused shared experts, SwiGLU variants)
have no Definition:
keys.py's `schema_for_call` raises ValueError and capture, apply and the dump leave them to the op.

Descriptions are the corpus's: verbatim for the shapes it has (DeepSeek-V3 at EP 8, Kimi K2
at EP 1 and 8, Qwen3-30B-A3B / -235B-A22B / -Next-80B, Llama 4 Scout / Maverick), in its
wording otherwise. `VARIANT_SCHEMAS` holds one schema per variant under the variant's short
prefix (what apply's prefix match, the registry checks and the op's `schemas` list read):
every Definition of a variant starts with it. A dataset's Definition gets its key back
from its name and constants (keys.py: `definition_key`; `schema_for_definition`, for
supply.py).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flashtune.data.models import Definition
from flashtune.ops.moe.reference import (
    moe_bf16_ref,
    moe_fp8_block_scale_ref,
    moe_fp8_per_tensor_scale_ref,
    moe_fp32_weights_ref,
    routed_moe_fp32_weights_ref,
    run_experts_ref,
)
from flashtune.ops.moe.routing import RoutingMethodType, select_experts, unpack_topk_ids
from flashtune.schema import Const, OpSchema, Scalar, Tensor, Var
from flashtune.schema.core import BoundCall

__all__ = [
    "BF16_FI_API",
    "BLOCK_FI_API",
    "FP4_FI_API",
    "FP4_ROUTED_FI_API",
    "PER_TENSOR_FI_API",
    "MoEKey",
    "MoESchema",
    "VARIANT_PREFIXES",
    "VARIANT_SCHEMAS",
    "BIASED_METHODS",
    "ROUTING_SLUGS",
    "ROUTING_STEPS",
    "schema_of",
]

BLOCK_FI_API = "fi_api:flashinfer.fused_moe.trtllm_fp8_block_scale_moe"
PER_TENSOR_FI_API = "fi_api:flashinfer.fused_moe.trtllm_fp8_per_tensor_scale_moe"
_QUANT_TAG = "quantization:float8_e4m3fn"
VARIANT_PREFIXES = {
    "ds": "moe_fp8_block_scale_ds_routing",
    "renorm": "moe_fp8_block_scale_renorm",
    "per_tensor": "trtllm_fp8_per_tensor_scale_moe",
    "bf16": "trtllm_bf16_moe",
    "standard": "moe_fp8_block_scale",
    "fp32w": "trtllm_fp4_block_scale_moe",
    "fp32w_routed": "trtllm_fp4_block_scale_routed_moe",
}
FP4_FI_API = "fi_api:flashinfer.fused_moe.trtllm_fp4_block_scale_moe"
FP4_ROUTED_FI_API = "fi_api:flashinfer.fused_moe.trtllm_fp4_block_scale_routed_moe"
_FP4_QUANT_TAG = "quantization:float4_e2m1fn_mxfp4"
BF16_FI_API = "fi_api:flashinfer.fused_moe.trtllm_bf16_moe"
_BLOCK = 128
# The bf16 Definitions' names of the routing methods (flashtune's own: FlashInfer-Trace has
# no bf16 MoE Definition; in the style of FlashInfer's trace templates' block-scale names).
ROUTING_SLUGS = {
    0: "default",
    1: "renormalize",
    2: "ds",
    3: "llama4",
    4: "renormalize_naive",
    5: "topk",
    6: "sigmoid_renorm",
    7: "minimax2",
    8: "sigmoid",
    9: "topk_sigmoid",
}
BIASED_METHODS = (2, 7)  # the methods that add the bias to the sigmoid scores (its own input)


@functools.cache
def _source_of(fn: Callable[..., Any]) -> str:
    return textwrap.dedent(inspect.getsource(fn)).rstrip()


@dataclass(frozen=True)
class MoESchema(OpSchema):
    """An OpSchema whose emitted reference also defines the helpers its reference calls
    (`helpers`, in order), and whose Definition description is the schema's own: the routing
    constants baked into the reference (top_k, n_group, ...) are in the name already."""

    helpers: tuple[Callable[..., Any], ...] = ()
    key: MoEKey | None = field(default=None, compare=False)  # None: a template

    @property
    def definition_constants(self) -> dict[str, Any]:
        """The bound constants (routing_method_type, top_k, n_group, topk_group: those the
        schema binds) its Definitions carry in their names only: what a solution must be told
        where a Definition's reference does not say them (ops.bundle.supply). {}: a template."""
        key = {} if self.key is None else dataclasses.asdict(self.key)
        return {name: key[name] for name in self.bound if name in key}

    def reference_source(self, call: BoundCall | None = None) -> str:
        source = super().reference_source(call)
        head = "import math\n\nimport torch\n\n\n"
        assert source.startswith(head)
        helpers = "".join(_source_of(fn) + "\n\n\n" for fn in self.helpers)
        return head + helpers + source[len(head) :]

    def build_definition(self, call: BoundCall) -> Definition:
        definition = super().build_definition(call)
        return definition.model_copy(update={"description": self.description or None})


@dataclass(frozen=True)
class MoEKey:
    """What fixes a MoE call's schema: the variant (see the module docstring), the routing
    constants its name carries, and the expert counts and sizes its descriptions name."""

    variant: str  # "ds" | "renorm" | "per_tensor" | "bf16" | "standard" | "fp32w[_routed]"
    routing_method_type: int
    top_k: int
    n_group: int
    topk_group: int
    num_experts: int
    num_local_experts: int
    hidden_size: int
    intermediate_size: int

    @property
    def expert_parallel(self) -> int:
        return max(1, self.num_experts // self.num_local_experts)


# --------------------------------------------------------------------------- descriptions

# The corpus's models, by (num_experts, hidden_size, intermediate_size).
_MODEL_NAMES = {
    (384, 7168, 2048): "Kimi K2",
    (128, 2048, 512): "Qwen3-Next 80B A3B",
    (128, 2048, 768): "Qwen3-30B-A3B",
    (128, 4096, 1536): "Qwen3-235B-A22B",
}
# The per-tensor Definitions' descriptions, by (routing, experts, hidden, intermediate, top_k).
_LLAMA4 = "Routing: Llama4 (sigmoid+top-k, routing_method_type=3)."
_RENORM = "Routing: Renormalize (TopK->Softmax, routing_method_type=1)."
_PER_TENSOR_DESCRIPTIONS = {
    (3, 128, 5120, 8192, 1): "FP8 per-tensor scale MoE (TRT-LLM style). Llama 4 Maverick "
    f"17B-128E (EP=1). Llama4 routing. {_LLAMA4}",
    (3, 16, 5120, 8192, 1): "FP8 per-tensor scale MoE (TRT-LLM style). Llama 4 Scout 17B-16E. "
    f"Llama4 routing (sigmoid+top-1). {_LLAMA4}",
    (1, 128, 2048, 768, 8): "FP8 per-tensor scale MoE (TRT-LLM style). Qwen3-30B-A3B (EP=1). "
    f"Renormalize routing (TopK->Softmax). {_RENORM}",
}
# DeepSeek-V3/R1 at EP 8 (the corpus's first MoE Definition, in its own wording).
_DEEPSEEK_V3_EP8 = MoEKey("ds", 2, 8, 8, 4, 256, 32, 7168, 2048)
_SHAPE_CONSTRAINTS = (
    "gemm1_weights.shape[1] == 2 * intermediate_size",
    "gemm2_weights.shape[1] == hidden_size",
    "gemm2_weights.shape[2] == intermediate_size",
)


def _blocks(axis: str, size: int, verbose: bool) -> str:
    detail = f", {size}/128={size // _BLOCK}" if verbose else ""
    where = f"along {axis}" if verbose else f"along the {axis} dimension"
    return f"Number of quantized blocks {where} (block_size=128{detail})."


def _model_of(key: MoEKey) -> str:
    return _MODEL_NAMES.get((key.num_experts, key.hidden_size, key.intermediate_size), "")


# --------------------------------------------------------------------------- the schemas


def _block_axes(key: MoEKey, v3: bool) -> dict[str, Var | Const]:
    """The fp8 block-scale Definitions' axes (v3: the DeepSeek-V3 Definition's wording)."""
    ep = key.expert_parallel
    axes: dict[str, Var | Const] = {
        "seq_len": Var("Sequence length (number of tokens)" if v3 else "Number of input tokens.")
    }
    if key.variant == "ds":
        axes["num_experts"] = Const(
            "Total number of experts (global)." if ep > 1 and not v3 else "Total number of experts."
        )
    if v3:
        local = f"Number of local experts with EP size {ep}."
    elif ep > 1:
        local = (
            f"Number of local experts per device (EP={ep} → {key.num_experts}/{ep}="
            f"{key.num_local_experts})."
        )
    else:
        local = "Number of local experts (EP=1 → all experts)."
    axes["num_local_experts"] = Const(local, abbrev="e")
    axes["hidden_size"] = Const("Hidden dimension size.", abbrev="h")
    axes["intermediate_size"] = Const(
        "MoE intermediate layer size." if v3 else "MoE expert intermediate size.", abbrev="i"
    )
    axes["gemm1_out_size"] = Const(
        "Output size of the first GEMM (W13). Should be 2 * intermediate_size" + ("" if v3 else ".")
    )
    if not v3:
        axes["top_k"] = Const("Number of experts selected per token.", param="top_k")
    axes["num_hidden_blocks"] = Const(_blocks("hidden_size", key.hidden_size, not v3))
    axes["num_intermediate_blocks"] = Const(
        _blocks("intermediate_size", key.intermediate_size, not v3)
    )
    axes["num_gemm1_out_blocks"] = Const(
        _blocks("gemm1_out_size", 2 * key.intermediate_size, not v3)
    )
    return axes


def _block_inputs(key: MoEKey, v3: bool) -> dict[str, Tensor | Scalar]:
    experts = "num_experts" if key.variant == "ds" else "num_local_experts"
    inputs: dict[str, Tensor | Scalar] = {
        "routing_logits": Tensor(
            ["seq_len", experts],
            dtype_from="routing_logits",
            description="Tensor of routing logits for expert selection" if v3 else "Router logits.",
        )
    }
    if key.variant == "ds":
        inputs["routing_bias"] = Tensor(
            ["num_experts"],
            dtype_from="routing_bias",
            description="Bias tensor for routing. Pass all zeros for no bias."
            if v3
            else "Routing bias added to sigmoid scores.",
        )
    inputs["hidden_states"] = Tensor(
        ["seq_len", "hidden_size"],
        dtype_from="hidden_states",
        description="Input hidden states tensor (FP8 quantized)"
        if v3
        else "Input hidden states (FP8 block-scale quantized).",
    )
    inputs["hidden_states_scale"] = Tensor(
        ["num_hidden_blocks", "seq_len"],
        dtype="float32",
        description="Block-wise scaling factors for hidden states."
        if v3
        else "Block scales for hidden_states, shape [num_hidden_blocks, seq_len] (transposed).",
    )
    weights = {
        "gemm1_weights": (
            ["num_local_experts", "gemm1_out_size", "hidden_size"],
            "First GEMM weights for all local experts (gate and up projections).",
            "FC1 weights (gate+up), FP8 block-scale.",
        ),
        "gemm1_weights_scale": (
            ["num_local_experts", "num_gemm1_out_blocks", "num_hidden_blocks"],
            "Block-wise scaling factors for first GEMM weights.",
            "Block scales for gemm1_weights.",
        ),
        "gemm2_weights": (
            ["num_local_experts", "hidden_size", "intermediate_size"],
            "Second GEMM weights for all local experts (down projection).",
            "FC2 weights (down), FP8 block-scale.",
        ),
        "gemm2_weights_scale": (
            ["num_local_experts", "num_hidden_blocks", "num_intermediate_blocks"],
            "Block-wise scaling factors for second GEMM weights.",
            "Block scales for gemm2_weights.",
        ),
    }
    for name, (dims, v3_text, text) in weights.items():
        scale = name.endswith("_scale")
        inputs[name] = Tensor(
            dims,
            dtype="float32" if scale else None,
            dtype_from=None if scale else name,
            description=v3_text if v3 else text,
        )
    if key.variant == "ds":
        ep = key.expert_parallel
        offsets = ", ".join(str(i * key.num_local_experts) for i in range(3))
        inputs["local_expert_offset"] = Scalar(
            "int32",
            description="Offset of local experts in global expert space"
            + (f" ({offsets}, ... for each EP rank)." if ep > 1 and not v3 else "."),
        )
        inputs["routed_scaling_factor"] = Scalar(
            "float32", description="Scaling factor for routing weights."
        )
    return inputs


def _block_description(key: MoEKey, v3: bool) -> str:
    if v3:
        return "FP8 block scale MoE operation. Routing and two grouped-GEMM included."
    ep = key.expert_parallel
    model = _model_of(key)
    where = f"{model} (EP={ep})" if model else f"EP={ep}"
    if key.variant == "renorm":
        return (
            f"FP8 block-scale MoE (DeepSeek-style). {where}. Renormalize routing (TopK->Softmax)."
        )
    text = (
        f"FP8 block-scale MoE (DeepSeek-style). {where}. DeepSeek routing, "
        f"n_group={key.n_group}, topk_group={key.topk_group}."
    )
    if ep > 1:
        text += (
            f" {key.num_local_experts} local experts per device ({key.num_experts} total / "
            f"{ep} EP)."
        )
    return text


def _block_schema(key: MoEKey) -> MoESchema:
    v3 = key == _DEEPSEEK_V3_EP8
    if key.variant == "ds":
        prefix = f"{VARIANT_PREFIXES['ds']}_topk{key.top_k}_ng{key.n_group}_kg{key.topk_group}"
        bound: tuple[str, ...] = ("routing_method_type", "top_k", "n_group", "topk_group")
    else:
        prefix = f"{VARIANT_PREFIXES['renorm']}_topk{key.top_k}"
        bound = ("routing_method_type", "top_k")
    return MoESchema(
        op_type="moe",
        name_prefix=prefix,
        axes=_block_axes(key, v3),
        inputs=_block_inputs(key, v3),
        outputs={
            "output": Tensor(
                ["seq_len", "hidden_size"],
                dtype="bfloat16",
                description="Final MoE output tensor" + ("" if v3 else "."),
            )
        },
        reference=moe_fp8_block_scale_ref,
        constraints=() if v3 else _SHAPE_CONSTRAINTS,
        tags=[_QUANT_TAG, BLOCK_FI_API, f"ep:{key.expert_parallel}"],
        description=_block_description(key, v3),
        bound=bound,
        helpers=(select_experts, run_experts_ref),
        key=key,
    )


def _standard_schema(key: MoEKey) -> MoESchema:
    """The block-scale calls of the other routing methods (and Renormalize calls the renorm
    Definitions do not describe), as FlashInfer's trace templates define them
    (`moe_fp8_block_scale_<method>_routing_topk8_e32_h7168_i2048`: top_k an axis and an
    input, an optional bias)."""
    method = key.routing_method_type
    blocks = "Number of quantized blocks along the {} dimension (block_size=128)."
    experts = ["num_local_experts"]
    scale = "Block-wise scaling factors for {}."
    name = RoutingMethodType(method).name
    return MoESchema(
        op_type="moe",
        name_prefix=f"{VARIANT_PREFIXES['standard']}_{ROUTING_SLUGS[method]}_routing",
        axes={
            "seq_len": Var("Sequence length (number of tokens)"),
            "num_experts": Const("Total number of experts."),
            "top_k": Const(
                "Number of experts to route to per token.", abbrev="topk", param="top_k"
            ),
            "num_local_experts": Const("Number of local experts.", abbrev="e"),
            "hidden_size": Const("Hidden dimension size.", abbrev="h"),
            "intermediate_size": Const("MoE intermediate layer size.", abbrev="i"),
            "gemm1_out_size": Const(
                "Output size of the first GEMM (W13). Should be 2 * intermediate_size."
            ),
            "num_hidden_blocks": Const(blocks.format("hidden_size")),
            "num_intermediate_blocks": Const(blocks.format("intermediate_size")),
            "num_gemm1_out_blocks": Const(blocks.format("gemm1_out_size")),
        },
        inputs={
            "routing_logits": Tensor(
                ["seq_len", "num_experts"],
                dtype_from="routing_logits",
                description="Routing logits for expert selection.",
            ),
            "routing_bias": Tensor(
                ["num_experts"],
                dtype_from="routing_bias",
                optional=True,
                description="Bias added to logits before routing. Pass None for no bias.",
            ),
            "hidden_states": Tensor(
                ["seq_len", "hidden_size"],
                dtype_from="hidden_states",
                description="Input hidden states tensor (FP8 quantized).",
            ),
            "hidden_states_scale": Tensor(
                ["num_hidden_blocks", "seq_len"],
                dtype="float32",
                description=scale.format("hidden states"),
            ),
            "gemm1_weights": Tensor(
                [*experts, "gemm1_out_size", "hidden_size"],
                dtype_from="gemm1_weights",
                description="First GEMM weights for all local experts (gate and up projections).",
            ),
            "gemm1_weights_scale": Tensor(
                [*experts, "num_gemm1_out_blocks", "num_hidden_blocks"],
                dtype="float32",
                description=scale.format("first GEMM weights"),
            ),
            "gemm2_weights": Tensor(
                [*experts, "hidden_size", "intermediate_size"],
                dtype_from="gemm2_weights",
                description="Second GEMM weights for all local experts (down projection).",
            ),
            "gemm2_weights_scale": Tensor(
                [*experts, "num_hidden_blocks", "num_intermediate_blocks"],
                dtype="float32",
                description=scale.format("second GEMM weights"),
            ),
            "top_k": Scalar("int32", description="Number of experts to route to per token."),
            "local_expert_offset": Scalar(
                "int32", description="Offset of local experts in global expert space."
            ),
            "routed_scaling_factor": Scalar(
                "float32", description="Scaling factor applied to routing weights."
            ),
        },
        outputs={
            "output": Tensor(
                ["seq_len", "hidden_size"], dtype="bfloat16", description="Final MoE output tensor."
            )
        },
        reference=moe_fp8_block_scale_ref,
        tags=[_QUANT_TAG, BLOCK_FI_API, f"ep:{key.expert_parallel}"],
        description=f"FP8 block scale MoE with {name} routing ({ROUTING_STEPS[method]}).",
        bound=("routing_method_type",),
        helpers=(select_experts, run_experts_ref),
        key=key,
    )


# FlashInfer's one-line account of each routing method (its trace templates' descriptions).
ROUTING_STEPS = {
    0: "Softmax → TopK",
    1: "TopK → Softmax",
    3: "Top1 → Sigmoid",
    4: "Softmax → TopK → Renormalize",
    5: "TopK only, uniform weights",
    6: "Sigmoid → TopK → Renormalize",
    7: "Sigmoid + Bias → TopK → ScaledSumNormalize",
    8: "Sigmoid → TopK",
    9: "TopK → Sigmoid",
}


def _local_expert_axes(top_k_param: str | None) -> dict[str, Var | Const]:
    """The axes of the Definitions whose experts are all local (per-tensor fp8 and the
    float32-weight ones), as the corpus spells them."""
    return {
        "seq_len": Var("Number of input tokens."),
        "num_experts": Const("Total number of local experts.", abbrev="e"),
        "hidden_size": Const("Hidden dimension size.", abbrev="h"),
        "intermediate_size": Const("MoE expert intermediate size.", abbrev="i"),
        "gemm1_out_size": Const("FC1 output size (2 * intermediate_size for SwiGLU)."),
        "top_k": Const("Number of experts selected per token.", param=top_k_param),
    }


def _per_tensor_schema(key: MoEKey) -> MoESchema:
    llama4 = key.routing_method_type == RoutingMethodType.Llama4
    experts = ["num_experts"]
    inputs: dict[str, Tensor | Scalar] = {
        "routing_logits": Tensor(
            ["seq_len", "num_experts"],
            dtype_from="routing_logits",
            description="Routing logits for expert selection.",
        ),
        "hidden_states": Tensor(
            ["seq_len", "hidden_size"],
            dtype_from="hidden_states",
            description="Input hidden states (FP8 per-tensor quantized).",
        ),
        "gemm1_weights": Tensor(
            ["num_experts", "gemm1_out_size", "hidden_size"],
            dtype_from="gemm1_weights",
            description="FC1 weights (gate+up projections), FP8 quantized.",
        ),
        "output1_scales_scalar": Tensor(
            experts,
            dtype="float32",
            description="Per-expert dequant scale for activation output of GEMM1.",
        ),
        "output1_scales_gate_scalar": Tensor(
            experts,
            dtype="float32",
            description="Per-expert dequant scale for gate output of GEMM1.",
        ),
        "gemm2_weights": Tensor(
            ["num_experts", "hidden_size", "intermediate_size"],
            dtype_from="gemm2_weights",
            description="FC2 weights (down projection), FP8 quantized.",
        ),
        "output2_scales_scalar": Tensor(
            experts, dtype="float32", description="Per-expert dequant scale for output of GEMM2."
        ),
    }
    if llama4:  # unread (see the reference); the Definitions list it where the call has one
        inputs["routing_bias"] = Tensor(
            experts,
            dtype_from="routing_bias",
            optional=True,
            description="Routing bias added to logits before sigmoid (Llama4 routing).",
        )
    shape = (key.num_experts, key.hidden_size, key.intermediate_size, key.top_k)
    description = _PER_TENSOR_DESCRIPTIONS.get(
        (key.routing_method_type, *shape),
        "FP8 per-tensor scale MoE (TRT-LLM style). " + (_LLAMA4 if llama4 else _RENORM),
    )
    return MoESchema(
        op_type="moe",
        name_prefix=f"{VARIANT_PREFIXES['per_tensor']}_topk{key.top_k}",
        axes=_local_expert_axes("top_k"),
        inputs=inputs,
        outputs={
            "output": Tensor(
                ["seq_len", "hidden_size"], dtype="bfloat16", description="Final MoE output tensor."
            )
        },
        reference=moe_fp8_per_tensor_scale_ref,
        constraints=_SHAPE_CONSTRAINTS,
        tags=[_QUANT_TAG, PER_TENSOR_FI_API, "ep:1"],
        description=description,
        bound=("routing_method_type", "top_k"),
        helpers=(select_experts, run_experts_ref),
        key=key,
    )


def _bf16_schema(key: MoEKey) -> MoESchema:
    """flashtune's bf16 MoE Definitions: one per routing method and its constants (a bias
    input for the methods that read one as their own input, DeepSeekV3 and MiniMax2)."""
    method = key.routing_method_type
    prefix = f"{VARIANT_PREFIXES['bf16']}_{ROUTING_SLUGS[method]}_routing_topk{key.top_k}"
    bound: tuple[str, ...] = ("routing_method_type", "top_k")
    if method == RoutingMethodType.DeepSeekV3:
        prefix += f"_ng{key.n_group}_kg{key.topk_group}"
        bound += ("n_group", "topk_group")
    local = ["num_local_experts"]
    inputs: dict[str, Tensor | Scalar] = {
        "routing_logits": Tensor(
            ["seq_len", "num_experts"], dtype_from="routing_logits", description="Router logits."
        )
    }
    if method in BIASED_METHODS:
        inputs["routing_bias"] = Tensor(
            ["num_experts"],
            dtype_from="routing_bias",
            description="Routing bias added to sigmoid scores.",
        )
    inputs.update(
        hidden_states=Tensor(
            ["seq_len", "hidden_size"],
            dtype_from="hidden_states",
            description="Input hidden states.",
        ),
        gemm1_weights=Tensor(
            [*local, "gemm1_out_size", "hidden_size"],
            dtype_from="gemm1_weights",
            description="FC1 weights (up rows, then gate rows), row-major.",
        ),
        gemm2_weights=Tensor(
            [*local, "hidden_size", "intermediate_size"],
            dtype_from="gemm2_weights",
            description="FC2 weights (down), row-major.",
        ),
        local_expert_offset=Scalar(
            "int32", description="Offset of local experts in global expert space."
        ),
        routed_scaling_factor=Scalar("float32", description="Scaling factor for routing weights."),
    )
    name = RoutingMethodType(method).name
    return MoESchema(
        op_type="moe",
        name_prefix=prefix,
        axes={
            "seq_len": Var("Number of input tokens."),
            "num_experts": Const("Total number of experts."),
            "num_local_experts": Const("Number of local experts.", abbrev="e"),
            "hidden_size": Const("Hidden dimension size.", abbrev="h"),
            "intermediate_size": Const("MoE expert intermediate size.", abbrev="i"),
            "gemm1_out_size": Const(
                "Output size of the first GEMM (W13). Should be 2 * intermediate_size."
            ),
            "top_k": Const("Number of experts selected per token.", param="top_k"),
        },
        inputs=inputs,
        outputs={
            "output": Tensor(
                ["seq_len", "hidden_size"], dtype="bfloat16", description="Final MoE output tensor."
            )
        },
        reference=moe_bf16_ref,
        constraints=_SHAPE_CONSTRAINTS,
        tags=[BF16_FI_API, f"ep:{key.expert_parallel}"],
        description=f"BF16 MoE with {name} routing: routing and two grouped GEMMs (SwiGLU).",
        bound=bound,
        helpers=(select_experts, run_experts_ref),
        key=key,
    )


# The fp4 Definitions' models, by (routing, experts, hidden, intermediate, top_k): the model
# and routing sentences of their descriptions, and the expert parallelism of the model's tags.
_FP4_MODELS = {
    (1, 128, 2048, 512, 10): (
        "Qwen3 Next 80B A3B (EP=4, 512/4=128 local experts). Renormalize routing.",
        4,
    ),
    (3, 128, 5120, 8192, 1): ("Llama 4 Maverick 17B-128E (EP=1). Llama4 routing.", 1),
    (3, 16, 5120, 8192, 1): ("Llama 4 Scout 17B-16E. Llama4 routing (sigmoid+top-1).", 1),
    (1, 128, 2048, 768, 8): ("Qwen3-30B-A3B (EP=1). Renormalize routing.", 1),
    (1, 64, 4096, 1536, 8): (
        "Qwen3-235B-A22B (EP=2, 128/2=64 local experts). Renormalize routing.",
        2,
    ),
}


def _fp32_weights_schema(key: MoEKey) -> MoESchema:
    """FlashInfer-Trace's fp4 MoE Definitions (see the module docstring): float32 weights in
    the contract, MxFP4 only in the descriptions (FlashInfer's kernel's)."""
    routed = key.variant == "fp32w_routed"
    llama4 = key.routing_method_type == RoutingMethodType.Llama4
    inputs: dict[str, Tensor | Scalar] = {}
    if routed:
        inputs["topk_ids"] = Tensor(
            ["seq_len", "top_k"],
            dtype="int32",
            description="Packed topk_ids: high 16 bits = expert_idx, low 16 bits = bfloat16 "
            "weight.",
        )
    else:
        inputs["routing_logits"] = Tensor(
            ["seq_len", "num_experts"],
            dtype_from="routing_logits",
            description="Routing logits for expert selection.",
        )
    kernel = "" if routed else "; kernel uses MxFP4-quantized weights"
    inputs.update(
        hidden_states=Tensor(
            ["seq_len", "hidden_size"],
            dtype_from="hidden_states",
            description="Input hidden states (bfloat16"
            + (")." if routed else " for MxFP4+BF16 mode)."),
        ),
        gemm1_weights=Tensor(
            ["num_experts", "gemm1_out_size", "hidden_size"],
            dtype_from="gemm1_weights",
            description=f"FC1 weights (gate+up). Float32 in definition{kernel}.",
        ),
        gemm2_weights=Tensor(
            ["num_experts", "hidden_size", "intermediate_size"],
            dtype_from="gemm2_weights",
            description=f"FC2 weights (down). Float32 in definition{kernel}.",
        ),
    )
    if llama4 and not routed:  # unread (see the reference); listed where the call has one
        inputs["routing_bias"] = Tensor(
            ["num_experts"],
            dtype_from="routing_bias",
            optional=True,
            description="Routing bias added to logits before sigmoid (Llama4 routing).",
        )
    shape = (key.num_experts, key.hidden_size, key.intermediate_size, key.top_k)
    model, ep = _FP4_MODELS.get((key.routing_method_type, *shape), ("", 0))
    if routed:
        head = "FP4 block scale routed MoE (MxFP4+BF16, TRT-LLM style)."
        how = "Llama4" if llama4 else "Renormalize"
        method = key.routing_method_type
        routing = f"Routing: {how} (pre-computed topk_ids, routing_method_type={method})."
        middle = f"{model} Pre-computed routing." if model else ""
    else:
        head = "FP4 block scale MoE (MxFP4+BF16, TRT-LLM style)."
        routing, middle = _LLAMA4 if llama4 else _RENORM, model
    description = " ".join(part for part in (head, middle, routing) if part)
    tags = [_FP4_QUANT_TAG, FP4_ROUTED_FI_API if routed else FP4_FI_API]
    if routed:
        tags.append("routing:pre-computed")
    if ep:  # the model's expert parallelism (these Definitions' experts are the local ones)
        tags.append(f"ep:{ep}")
    variant = VARIANT_PREFIXES[key.variant]
    return MoESchema(
        op_type="moe",
        name_prefix=f"{variant}_topk{key.top_k}",
        # routed: topk_ids' width says top_k; else the call's top_k
        axes=_local_expert_axes(None if routed else "top_k"),
        inputs=inputs,
        outputs={
            "output": Tensor(
                ["seq_len", "hidden_size"], dtype="bfloat16", description="Final MoE output tensor."
            )
        },
        reference=routed_moe_fp32_weights_ref if routed else moe_fp32_weights_ref,
        constraints=_SHAPE_CONSTRAINTS,
        tags=tags,
        description=description,
        bound=("routing_method_type",) if routed else ("routing_method_type", "top_k"),
        helpers=(unpack_topk_ids, run_experts_ref) if routed else (select_experts, run_experts_ref),
        key=key,
    )


@functools.lru_cache(maxsize=256)
def schema_of(key: MoEKey) -> MoESchema:
    """The schema of calls with this key (made once per key)."""
    if key.variant in ("fp32w", "fp32w_routed"):
        return _fp32_weights_schema(key)
    if key.variant == "bf16":
        return _bf16_schema(key)
    if key.variant == "standard":
        return _standard_schema(key)
    return _per_tensor_schema(key) if key.variant == "per_tensor" else _block_schema(key)


# One schema per variant under its short prefix: the op's `schemas` (see the module docstring).
_REPRESENTATIVE = {
    "ds": MoEKey("ds", 2, 8, 1, 1, 64, 8, 256, 128),
    "renorm": MoEKey("renorm", 1, 4, 1, 1, 32, 32, 256, 128),
    "per_tensor": MoEKey("per_tensor", 1, 4, 1, 1, 32, 32, 256, 128),
    "bf16": MoEKey("bf16", 1, 4, 1, 1, 32, 32, 256, 128),
    "standard": MoEKey("standard", 0, 4, 1, 1, 32, 32, 256, 128),
    "fp32w": MoEKey("fp32w", 1, 4, 1, 1, 32, 32, 256, 128),
    "fp32w_routed": MoEKey("fp32w_routed", 1, 4, 1, 1, 32, 32, 256, 128),
}
VARIANT_SCHEMAS: dict[str, MoESchema] = {
    variant: dataclasses.replace(schema_of(key), name_prefix=VARIANT_PREFIXES[variant], key=None)
    for variant, key in _REPRESENTATIVE.items()
}

"""Schemas of the fp8 GEMMs, equal to FlashInfer-Trace's `bmm_fp8`, `gemm_fp8_nt_groupwise`
and `batch_deepgemm_fp8_nt_groupwise` templates (flashinfer/trace/templates/gemm.py: names, axes, inputs,
outputs, descriptions), the schemas' views of a call, and the model examples.

FlashInfer's calls take layouts the Definitions do not have (0-dim scales, MN-major or
TRT-LLM scales, fp16 outputs); each op's view (`BmmFp8Op`, `GroupwiseOp`, `MaskedOp`) turns a
call into
the Definition's inputs, or refuses it (ValueError) where no Definition describes it, so
capture, apply and the definition dump leave such calls to the op's own code.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from flashtune.model_shapes import ModelConfig
from flashtune.ops.gemm.fp8.layouts import OUTPUT_DTYPE_ENUM, scale_views
from flashtune.ops.gemm.fp8.reference import (
    batch_deepgemm_fp8_nt_groupwise_ref,
    bmm_fp8_ref,
    gemm_fp8_nt_groupwise_ref,
)
from flashtune.schema import REGISTRY, ApiOp, Const, OpSchema, Scalar, Tensor, Var, family_op
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = [
    "BMM_FP8",
    "GEMM_FP8_NT_GROUPWISE",
    "BATCH_DEEPGEMM_FP8_NT_GROUPWISE",
    "BmmFp8Op",
    "GroupwiseOp",
    "MaskedOp",
    "fp8_api",
    "fp8_gemm_examples",
]

_QUANT_TAG = "quantization:float8_e4m3fn"

BMM_FP8 = OpSchema(
    op_type="bmm_fp8",
    name_prefix="bmm_fp8",
    # FlashInfer-Trace names a const axis without an abbreviation by the axis itself:
    # bmm_fp8_N64_K128.
    axes={
        "batch_size": Var(),
        "M": Var(),
        "N": Const(abbrev="N"),
        "K": Const(abbrev="K"),
        "scalar": Var(description="A/B scale tensor length (typically 1)."),
    },
    inputs={
        "A": Tensor(["batch_size", "M", "K"], dtype_from="A"),
        "B": Tensor(["batch_size", "K", "N"], dtype_from="B"),
        "A_scale": Tensor(
            ["scalar"], dtype="float32", description="Per-tensor dequant scale for A."
        ),
        "B_scale": Tensor(
            ["scalar"], dtype="float32", description="Per-tensor dequant scale for B."
        ),
        "dtype": Scalar("int32", description="Output dtype enum."),
    },
    outputs={"C": Tensor(["batch_size", "M", "N"], dtype="bfloat16")},
    reference=bmm_fp8_ref,
    description=(
        "Per-tensor FP8 batched matmul. A and B are float8_e4m3fn; "
        "A_scale/B_scale are scalar tensors holding the dequant scales."
    ),
    tags=["fi_api:flashinfer.gemm.bmm_fp8", _QUANT_TAG],
)

GEMM_FP8_NT_GROUPWISE = OpSchema(
    op_type="gemm_fp8",
    name_prefix="gemm_fp8_nt_groupwise",
    axes={
        "M": Var(),
        "N": Const(abbrev="n"),
        "K": Const(abbrev="k"),
        "K_div_block": Var(description="K // scale_block_size_k."),
        "N_div_block": Var(description="N // scale_block_size_n."),
    },
    inputs={
        "a": Tensor(["M", "K"], dtype_from="a"),
        "b": Tensor(["N", "K"], dtype_from="b"),
        "a_scale": Tensor(["M", "K_div_block"], dtype="float32"),
        "b_scale": Tensor(["N_div_block", "K_div_block"], dtype="float32"),
    },
    outputs={"out": Tensor(["M", "N"], dtype="bfloat16")},
    reference=gemm_fp8_nt_groupwise_ref,
    # FlashInfer-Trace's description, word for word (it speaks of FlashInfer's own files).
    description=(
        "FP8 group-wise GEMM C = A @ B.T with per-block scales. Backends: "
        "``cutlass`` (SM100/SM120) and ``trtllm`` (SM90+/SM100). Block "
        "granularity defaults to (1, 128, 128). Template captures the "
        "trtllm canonical layout: ``a_scale=[M, K//bk]``, "
        "``b_scale=[N//bk, K//bk]`` (note: this is the transposed form "
        "of the layout described in flashinfer's gemm_base.py docstring; "
        "the kernel actually expects the transpose, matching "
        "tests/gemm/test_groupwise_scaled_gemm_fp8.py:128-129 which "
        "does ``b_scale.t().contiguous()`` for the trtllm path). The "
        "cutlass scale layouts differ; their calls won't axis-match "
        "this template and will be skipped by the auto-dump."
    ),
    tags=["fi_api:flashinfer.gemm.gemm_fp8_nt_groupwise", _QUANT_TAG],
)


BATCH_DEEPGEMM_FP8_NT_GROUPWISE = OpSchema(
    op_type="gemm_fp8",
    name_prefix="batch_deepgemm_fp8_nt_groupwise",
    axes={
        "batch_size": Var(),
        "M_max": Var(),
        "N": Const(abbrev="n"),
        "K": Const(abbrev="k"),
        "K_div_128": Var(description="K // 128 (input block scale dim)."),
        "N_div_128": Var(description="N // 128."),
    },
    inputs={
        "a": Tensor(["batch_size", "M_max", "K"], dtype_from="a"),
        "b": Tensor(["batch_size", "N", "K"], dtype_from="b"),
        "a_scale": Tensor(["batch_size", "M_max", "K_div_128"], dtype="float32"),
        "b_scale": Tensor(["batch_size", "N_div_128", "K_div_128"], dtype="float32"),
        "masked_m": Tensor(["batch_size"], dtype="int32"),
        "expected_m": Scalar("int32"),
    },
    outputs={"out": Tensor(["batch_size", "M_max", "N"], dtype="bfloat16")},
    reference=batch_deepgemm_fp8_nt_groupwise_ref,
    description=(
        "Batched FP8 group-wise GEMM (DeepGEMM backend). 1x128 scale "
        "granularity along K for input; 128x128 for weight. Mask-M "
        "variant — only the first ``masked_m[g]`` rows of group g "
        "participate."
    ),
    tags=["fi_api:flashinfer.gemm.batch_deepgemm_fp8_nt_groupwise", _QUANT_TAG],
)


def _check_described(arguments: dict[str, Any], op: str) -> None:
    """Refuse a block-scaled call no Definition describes: the Definitions have DeepSeek's
    granularity (1, 128, 128) and a bfloat16 output."""
    granularity = tuple(arguments.get("scale_granularity_mnk", (1, 128, 128)))
    if granularity != (1, 128, 128):
        raise ValueError(f"{op}: no Definition has granularity {granularity}")
    out, out_dtype = arguments.get("out"), arguments.get("out_dtype")
    dtype = out.dtype if out is not None else out_dtype or torch.bfloat16
    if dtype != torch.bfloat16:
        raise ValueError(f"{op}: no Definition has a {dtype} output")


class BmmFp8Op(ApiOp):
    """bmm_fp8 seen as its Definition: scales of any one-element shape become [1], the output
    dtype its enum; an fp16 output (the Definitions' is bfloat16) has no Definition."""

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        dtype = arguments.get("dtype")
        if dtype not in OUTPUT_DTYPE_ENUM.values():  # else already the Definition's enum
            if dtype not in OUTPUT_DTYPE_ENUM:
                raise ValueError(f"bmm_fp8: no Definition has a {dtype} output")
            arguments["dtype"] = OUTPUT_DTYPE_ENUM[dtype]
        for name in ("A_scale", "B_scale"):
            scale = arguments.get(name)
            if isinstance(scale, torch.Tensor) and scale.numel() == 1:
                arguments[name] = scale.reshape(1)
        return arguments


class GroupwiseOp(ApiOp):
    """gemm_fp8_nt_groupwise seen as its Definition: the scales as the canonical [M, K/128]
    and [N/128, K/128] views of whatever layout the call used; calls with another
    granularity than (1, 128, 128) or an fp16 output have no Definition."""

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        _check_described(arguments, "gemm_fp8_nt_groupwise")
        a, b = arguments["a"], arguments["b"]
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return arguments  # the schema reports it
        arguments["a_scale"], arguments["b_scale"] = scale_views(
            arguments["a_scale"],
            arguments["b_scale"],
            a.shape[0],
            b.shape[0],
            a.shape[1],
            (1, 128, 128),
            arguments.get("scale_major_mode"),
            arguments.get("backend", "cutlass"),
            a.device,
        )
        return arguments


class MaskedOp(ApiOp):
    """batch_deepgemm_fp8_nt_groupwise seen as its Definition: DeepSeek's granularity and a
    bfloat16 output only."""

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        _check_described(arguments, "batch_deepgemm_fp8_nt_groupwise")
        return arguments


def fp8_api(view: type[ApiOp], schema: OpSchema) -> Any:
    """Register `fn` as a schema'd op seen through `view` (`@api` with a view of its own)."""

    def wrap(fn: Any) -> ApiOp:
        op = view(fn, schema, None)
        REGISTRY[op.qualname] = op
        return op

    return wrap


def _op(name: str) -> ApiOp:
    # __init__.py defines the ops and imports this module: looked up at call time.
    return family_op(__name__, name)


@register_examples
def fp8_gemm_examples(model: ModelConfig) -> list[Example]:
    """A decode step's linear layers in DeepSeek's block-scaled fp8 (one token, 1x128
    activation scales, 128x128 weight blocks); the masked batched GEMM of an MoE's down
    projection (8 experts of up to 4 tokens each, DeepGEMM's decode layout); and one
    per-tensor fp8 bmm: MLA's absorbed key projection (one bmm per head) where the model has
    MLA, else the first linear layer."""
    examples: list[Example] = []
    fp8 = torch.float8_e4m3fn
    groupwise = _op("gemm_fp8_nt_groupwise")
    for n, k in model.gemm_nk():
        a, b = meta_tensor(1, k, dtype=fp8), meta_tensor(n, k, dtype=fp8)
        a_scale = meta_tensor(1, math.ceil(k / 128), dtype=torch.float32)
        b_scale = meta_tensor(math.ceil(n / 128), math.ceil(k / 128), dtype=torch.float32)
        kwargs = {"scale_major_mode": "K", "out_dtype": torch.bfloat16}
        examples.append((groupwise, (a, b, a_scale, b_scale), kwargs))
    # MoE's masked expert GEMM (DeepGEMM's decode layout): the down projection per expert.
    n, k = model.gemm_nk()[-1]
    experts = 8
    a = meta_tensor(experts, 4, k, dtype=fp8)
    scales_a = meta_tensor(experts, 4, math.ceil(k / 128), dtype=torch.float32)
    w = meta_tensor(experts, n, k, dtype=fp8)
    scales_w = meta_tensor(experts, math.ceil(n / 128), math.ceil(k / 128), dtype=torch.float32)
    masked_m = meta_tensor(experts, dtype=torch.int32)
    args = (a, w, scales_a, scales_w, masked_m, 4)
    examples.append((_op("batch_deepgemm_fp8_nt_groupwise"), args, {}))
    if model.mla is not None:
        batch, n, k = model.num_qo_heads, model.mla.kv_lora_rank, model.mla.qk_nope_head_dim
    else:
        (n, k), batch = model.gemm_nk()[0], 1
    A = meta_tensor(batch, 1, k, dtype=fp8)
    B = meta_tensor(batch, n, k, dtype=fp8).transpose(1, 2)  # column-major, as FlashInfer's
    scale = meta_tensor(1, dtype=torch.float32)
    examples.append((_op("bmm_fp8"), (A, B, scale, scale, torch.bfloat16), {}))
    return examples

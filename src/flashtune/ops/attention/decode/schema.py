"""Schema of batch decode: the Definition of the FlashInfer-Trace gqa_paged_decode ops, the
wrapper's run() as the schema sees it, and the page table of the model examples (shared by
the planned wrapper's and the plan-free call's examples, which emit the same Definition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from flashtune.ops.attention.page import split_kv_cache
from flashtune.ops.attention.reference import gqa_paged_decode_ref
from flashtune.schema import REGISTRY, ApiOp, Const, OpSchema, Scalar, Tensor, Var

__all__ = ["GQA_PAGED_DECODE", "PagedKV", "EXAMPLE_PAGE_SIZE", "EXAMPLE_KV_LENS"]

_KV_DIMS = ["num_pages", "page_size", "num_kv_heads", "head_dim"]
_QO_DIMS = ["batch_size", "num_qo_heads", "head_dim"]

# Axes, inputs and outputs as in the FlashInfer-Trace corpus (gqa_paged_decode_*.json).
# The page table and sm_scale are plan() state, read from the wrapper (`self`); the cache
# comes from run()'s paged_kv_cache as a logical NHD (k, v) pair (see _WrapperRunOp).
GQA_PAGED_DECODE = OpSchema(
    op_type="gqa_paged",
    name_prefix="gqa_paged_decode",
    axes={
        "batch_size": Var("Total number of query tokens."),
        "num_qo_heads": Const("Number of query/output attention heads.", abbrev="h"),
        "num_kv_heads": Const("Number of key-value attention heads.", abbrev="kv"),
        "head_dim": Const("Dimension of each attention head.", abbrev="d"),
        "num_pages": Var("Total number of allocated pages in the KV cache."),
        "page_size": Const("Number of tokens stored per page.", abbrev="ps"),
        "len_indptr": Var("Length of kv_indptr array."),
        "num_kv_indices": Var("Total number of KV page indices."),
    },
    inputs={
        "q": Tensor(_QO_DIMS, dtype_from="q", description="Query tensor for decode."),
        "k_cache": Tensor(
            _KV_DIMS,
            dtype_from="k_cache",
            param="paged_kv_cache.k",
            description="Paged key cache.",
        ),
        "v_cache": Tensor(
            _KV_DIMS,
            dtype_from="k_cache",
            param="paged_kv_cache.v",
            description="Paged value cache.",
        ),
        "kv_indptr": Tensor(
            ["len_indptr"],
            dtype="int32",
            param="self._kv_indptr",
            description="KV page offsets for each sequence.",
        ),
        "kv_indices": Tensor(
            ["num_kv_indices"],
            dtype="int32",
            param="self._kv_indices",
            description="Page IDs for KV cache lookups.",
        ),
        "kv_last_page_len": Tensor(
            ["batch_size"],
            dtype="int32",
            param="self._kv_last_page_len",
            description="Number of valid tokens in the last page for each sequence.",
        ),
        "sm_scale": Scalar(
            "float32",
            param="self._sm_scale",
            description="Softmax scale. Default is (1/sqrt(head_dim)).",
        ),
    },
    outputs={
        "output": Tensor(_QO_DIMS, dtype_from="q", description="Attention output tensor."),
        "lse": Tensor(
            ["batch_size", "num_qo_heads"],
            dtype="float32",
            description="The 2-based log-sum-exp of attention logits.",
        ),
    },
    reference=gqa_paged_decode_ref,
    bound=("window_left", "logits_soft_cap"),
    constraints=["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"],
    tags=["stage:decode", "fi_api:flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper"],
    description="Batched Grouped Query Attention decode with a paged KV cache.",
)


@dataclass(frozen=True)
class PagedKV:
    """run()'s paged_kv_cache as the schema sees it: logical NHD views of K and V."""

    k: torch.Tensor
    v: torch.Tensor


class _WrapperRunOp(ApiOp):
    """`@api` for the wrapper's run method: the bound arguments see paged_kv_cache split into
    (k, v) in NHD order (a 5-D tensor or an HND pair would give wrong axes) plus the plan's
    window and soft-cap, which the emitted reference bakes in."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        wrapper = args[0] if args else kwargs["self"]
        plan = wrapper._planner.plan
        if plan is not None and plan.rope is not None:
            # No Definition describes RoPE decode: the kernel runs itself, so capture never
            # records it as plain decode and apply never hands it to a plain solution.
            return self.fn(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        wrapper = arguments["self"]
        k, v = split_kv_cache(arguments["paged_kv_cache"], wrapper._kv_layout)
        arguments["paged_kv_cache"] = PagedKV(k, v)
        plan = wrapper._planner.plan
        if plan is not None:
            # Only non-defaults, so a plain decode's Definition matches the corpus.
            if plan.window_left >= 0:
                arguments["window_left"] = plan.window_left
            if plan.logits_soft_cap:
                arguments["logits_soft_cap"] = float(plan.logits_soft_cap)
        return arguments


def _schema_run(fn: Any) -> _WrapperRunOp:
    op = _WrapperRunOp(fn, GQA_PAGED_DECODE, None)
    REGISTRY[op.qualname] = op
    return op


# Page size 16: the common serving default (vLLM, SGLang); the corpus also has 1 and 64.
# Shared with the plan-free decode's example (plan_free.py), which emits the same Definition.
EXAMPLE_PAGE_SIZE = 16
EXAMPLE_KV_LENS = (37, 100, 16)

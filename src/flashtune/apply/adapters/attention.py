"""The attention family under apply.

Result conventions of flashtune's attention ops: a solution returns (output, lse); the
planned wrapper's run and the plan-free calls fill the caller's `out=` buffer when given and
return (out, lse) only when asked (`return_lse`); the schema'd ops behind the prefill
wrappers write into the wrapper's out/lse buffers.

FlashInfer's plan()/run() wrappers: plan() is recorded per wrapper, and run() is described
as the plan-free call with the same meaning (`paged_decode`, `paged_prefill`,
`ragged_prefill`), whose schema then names the Definition and binds its inputs. Features no
Definition covers (positional encodings, soft caps, windows, masks, fp8 scales, another
head dim for V, an HND cache) run the original.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from flashtune.apply.patching import AdapterSpec, ArgBinder, ContextStore, available
from flashtune.apply.results import register_result_adapter
from flashtune.apply.runtime import route
from flashtune.ops.attention import (
    BatchDecodeWithPagedKVCacheWrapper,
    paged_decode,
    paged_prefill,
    ragged_prefill,
)
from flashtune.ops.attention.prefill import gqa_paged_prefill, gqa_ragged_prefill
from flashtune.schema import NOT_HANDLED, ApiOp

__all__ = ["adapters", "planned_call", "run_result", "wrapper_buffers_result"]


def run_result(arguments: dict[str, Any], outputs: dict[str, Any]) -> Any:
    """A wrapper's run(q, ..., out=None, lse=None, return_lse=False) and the plan-free calls:
    fill the caller's buffers when given, return (out, lse) only when asked for."""
    out, lse = outputs["output"], outputs.get("lse")
    if isinstance(arguments.get("out"), torch.Tensor):
        arguments["out"].copy_(out.reshape(arguments["out"].shape))
        out = arguments["out"]
    if isinstance(arguments.get("lse"), torch.Tensor) and lse is not None:
        arguments["lse"].copy_(lse.reshape(arguments["lse"].shape))
        lse = arguments["lse"]
    return (out, lse) if arguments.get("return_lse") else out


def wrapper_buffers_result(arguments: dict[str, Any], outputs: dict[str, Any]) -> None:
    """The schema'd ops behind the prefill wrappers write into the wrapper's out/lse."""
    arguments["out"].copy_(outputs["output"].reshape(arguments["out"].shape))
    if isinstance(arguments.get("lse"), torch.Tensor):
        arguments["lse"].copy_(outputs["lse"].reshape(arguments["lse"].shape))


_DECODE_RUN: ApiOp = BatchDecodeWithPagedKVCacheWrapper.run  # the class attribute: the op
for _op in (_DECODE_RUN, paged_decode, paged_prefill, ragged_prefill):
    register_result_adapter(_op, run_result)
for _op in (gqa_paged_prefill, gqa_ragged_prefill):
    register_result_adapter(_op, wrapper_buffers_result)


# --------------------------------------------------------------------------- FlashInfer wrappers

_PLANS = ContextStore()


def _covered(plan: Mapping[str, Any], wrapper: Any) -> bool:
    """Only what the gqa Definitions cover: no rope, soft cap, window or mask; NHD; one head
    dim for K and V."""
    head_dim = plan.get("head_dim", plan.get("head_dim_qk"))
    return (
        plan.get("pos_encoding_mode", "NONE") == "NONE"
        and plan.get("logits_soft_cap") in (None, 0.0)
        and plan.get("window_left", -1) in (-1, None)
        and plan.get("custom_mask") is None
        and plan.get("packed_custom_mask") is None
        and plan.get("head_dim_vo") in (None, head_dim)
        and getattr(wrapper, "_kv_layout", "NHD") == "NHD"  # FlashInfer's own attribute
    )


def planned_call(
    kind: str, plan: Mapping[str, Any], run: Mapping[str, Any]
) -> tuple[ApiOp, dict[str, Any]]:
    """The plan-free op and its arguments that mean the same as a FlashInfer wrapper's
    run() (`run`: its arguments) after its plan() (`plan`: its arguments)."""
    sm_scale = plan.get("sm_scale")
    common = {
        "q": run["q"],
        "sm_scale": None if sm_scale is None else float(sm_scale),
        "out": run.get("out"),
        "return_lse": True,  # the lse buffer, when given, is filled from the result
    }
    if kind == "decode":
        return paged_decode, {
            **common,
            "paged_kv_cache": run["paged_kv_cache"],
            "kv_indptr": plan["indptr"],
            "kv_indices": plan["indices"],
            "kv_last_page_len": plan["last_page_len"],
        }
    if kind == "paged":
        return paged_prefill, {
            **common,
            "paged_kv_cache": run["paged_kv_cache"],
            "qo_indptr": plan["qo_indptr"],
            "kv_indptr": plan["paged_kv_indptr"],
            "kv_indices": plan["paged_kv_indices"],
            "kv_last_page_len": plan["paged_kv_last_page_len"],
            "causal": bool(plan.get("causal", False)),
        }
    return ragged_prefill, {
        **common,
        "k": run["k"],
        "v": run["v"],
        "qo_indptr": plan["qo_indptr"],
        "kv_indptr": plan["kv_indptr"],
        "causal": bool(plan.get("causal", False)),
    }


def _wrapper_plan(original: Callable[..., Any]) -> Callable[..., Any]:
    binder = ArgBinder(original)

    @functools.wraps(original)
    def plan(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _PLANS.set(self, **binder.bind((self, *args), kwargs))
        except TypeError:
            _PLANS.clear(self)
        return original(self, *args, **kwargs)

    return plan


def _wrapper_run(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        binder = ArgBinder(original)

        @functools.wraps(original)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            plan = _PLANS.get(self)
            try:
                r = binder.bind((self, *args), kwargs)
            except TypeError:
                return original(self, *args, **kwargs)
            scaled = any(r.get(s) is not None for s in ("q_scale", "k_scale", "v_scale"))
            windowed = r.get("window_left") not in (None, -1)  # run()'s own override
            if not plan or scaled or windowed or not _covered(plan, self):
                return original(self, *args, **kwargs)
            op, arguments = planned_call(kind, plan, r)
            result = route(op, arguments)
            if result is NOT_HANDLED:
                return original(self, *args, **kwargs)
            out, lse = result
            if not r.get("return_lse"):
                return out
            if isinstance(r.get("lse"), torch.Tensor):
                r["lse"].copy_(lse)
                lse = r["lse"]
            return out, lse

        return run

    return make


_WRAPPERS = {
    "BatchDecodeWithPagedKVCacheWrapper": "decode",
    "BatchPrefillWithPagedKVCacheWrapper": "paged",
    "BatchPrefillWithRaggedKVCacheWrapper": "ragged",
}
_MODULES = ("flashinfer.decode", "flashinfer.prefill")


def adapters() -> list[AdapterSpec]:
    """plan/run of FlashInfer's wrappers (the classes its decode and prefill modules have)."""
    specs = []
    for module in _MODULES:
        for cls, kind in _WRAPPERS.items():
            specs.append(AdapterSpec(f"{module}.{cls}.plan", _wrapper_plan))
            specs.append(AdapterSpec(f"{module}.{cls}.run", _wrapper_run(kind)))
    return available(specs)

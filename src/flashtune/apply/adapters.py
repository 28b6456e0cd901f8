"""Adapters: dispatch call sites that cannot be decorated (torch.nn.functional.linear,
FlashInfer's functions and plan()/run() wrappers) to the apply table, by patching them.

- PatchManager patches functions and methods by dotted path and restores them exactly
  (staticmethod/classmethod descriptors and inherited attributes included).
- ArgBinder normalizes a call's args/kwargs to {parameter: value} (defaults applied), with
  an optional renaming to definition input names.
- ContextStore keeps per-object state between a wrapper's plan() and run().

Whatever matches no definition in the table (or hits an unsupported feature) runs the
original call unchanged. Schema'd flashtune ops need no adapter: the apply hook sees them.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import logging
import math
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "RESULT_ADAPTERS",
    "ArgBinder",
    "ContextStore",
    "PatchManager",
    "builtin_adapters",
    "dispatch",
    "enable_adapters",
    "register_result_adapter",
    "resolve_target",
]

log = logging.getLogger("flashtune.apply")

# --------------------------------------------------------------------------- result adapters

RESULT_ADAPTERS: dict[str, Callable[[dict[str, Any], dict[str, Any]], Any]] = {}
"""By op qualname or op_type: turn a solution's outputs (by definition output name) into what
the op returns, given the op's bound arguments (in-place ops write into their arguments)."""


def register_result_adapter(key: str, fn: Callable[[dict[str, Any], dict[str, Any]], Any]) -> None:
    RESULT_ADAPTERS[key] = fn


def _fused_add_rmsnorm_result(arguments: dict[str, Any], outputs: dict[str, Any]) -> None:
    # FlashInfer semantics, in place: residual <- input + residual; input <- rmsnorm(residual).
    # The definition's only output is the normalized value; the residual update is the sum.
    arguments["residual"].add_(arguments["input"])
    arguments["input"].copy_(outputs["output"].reshape(arguments["input"].shape))
    return None


register_result_adapter("fused_add_rmsnorm", _fused_add_rmsnorm_result)


def _attention_run_result(arguments: dict[str, Any], outputs: dict[str, Any]) -> Any:
    # A wrapper's run(q, ..., out=None, lse=None, return_lse=False) and the plan-free calls:
    # fill the caller's buffers when given, return (out, lse) only when asked for.
    out, lse = outputs["output"], outputs.get("lse")
    if isinstance(arguments.get("out"), torch.Tensor):
        arguments["out"].copy_(out.reshape(arguments["out"].shape))
        out = arguments["out"]
    if isinstance(arguments.get("lse"), torch.Tensor) and lse is not None:
        arguments["lse"].copy_(lse.reshape(arguments["lse"].shape))
        lse = arguments["lse"]
    return (out, lse) if arguments.get("return_lse") else out


def _prefill_op_result(arguments: dict[str, Any], outputs: dict[str, Any]) -> None:
    # The schema'd ops behind the prefill wrappers write into the wrapper's out/lse buffers.
    arguments["out"].copy_(outputs["output"].reshape(arguments["out"].shape))
    if isinstance(arguments.get("lse"), torch.Tensor):
        arguments["lse"].copy_(outputs["lse"].reshape(arguments["lse"].shape))


for _qualname in (
    "flashtune.ops.attention.decode.BatchDecodeWithPagedKVCacheWrapper.run",
    "flashtune.ops.attention.planless.paged_decode",
    "flashtune.ops.attention.planless_prefill.paged_prefill",
    "flashtune.ops.attention.planless_prefill.ragged_prefill",
):
    register_result_adapter(_qualname, _attention_run_result)
for _qualname in (
    "flashtune.ops.attention.prefill.gqa_paged_prefill",
    "flashtune.ops.attention.prefill.gqa_ragged_prefill",
):
    register_result_adapter(_qualname, _prefill_op_result)


# --------------------------------------------------------------------------- patching


def resolve_target(target: str) -> tuple[Any, str]:
    """(owner, attribute) for a dotted path "pkg.mod.func" or "pkg.mod.Class.method"."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for part in parts[i:-1]:
                owner = getattr(owner, part)
        except AttributeError:
            raise AttributeError(f"{target}: {'.'.join(parts[:-1])} does not exist") from None
        if not hasattr(owner, parts[-1]):
            raise AttributeError(f"{target}: {parts[-1]!r} not found in {owner!r}")
        return owner, parts[-1]
    raise ImportError(f"{target}: no importable module in the path")


@dataclass
class _Patch:
    owner: Any
    attr: str
    original: Any  # the raw attribute (descriptor) as found in owner.__dict__
    own: bool  # whether owner defined it itself (else it was inherited: delete to restore)


class PatchManager:
    """Patch callables by dotted path; `unpatch`/`unpatch_all` restore them exactly."""

    def __init__(self) -> None:
        self._patches: dict[str, _Patch] = {}

    def patch(self, target: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Replace `target` with `make(original)` (original: the plain function or the
        bound-less method). Patching an already patched target replaces the patch."""
        if target in self._patches:
            self.unpatch(target)
        owner, attr = resolve_target(target)
        raw = inspect.getattr_static(owner, attr)
        own = attr in getattr(owner, "__dict__", {})
        if isinstance(raw, staticmethod):
            new: Any = staticmethod(make(raw.__func__))
        elif isinstance(raw, classmethod):
            new = classmethod(make(raw.__func__))
        else:
            new = make(raw)
        setattr(owner, attr, new)
        self._patches[target] = _Patch(owner, attr, raw, own)

    def original(self, target: str) -> Any:
        return self._patches[target].original

    def is_patched(self, target: str) -> bool:
        return target in self._patches

    @property
    def targets(self) -> list[str]:
        return list(self._patches)

    def unpatch(self, target: str) -> None:
        p = self._patches.pop(target)
        if p.own:
            setattr(p.owner, p.attr, p.original)
        else:
            delattr(p.owner, p.attr)

    def unpatch_all(self) -> None:
        for target in reversed(list(self._patches)):
            self.unpatch(target)

    def __enter__(self) -> PatchManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unpatch_all()


class ArgBinder:
    """Normalize (args, kwargs) of calls to one function into {name: value}, defaults
    applied, names optionally renamed (`rename={"input": "hidden_states"}`)."""

    def __init__(
        self, fn: Callable[..., Any] | inspect.Signature, rename: Mapping[str, str] | None = None
    ) -> None:
        self.signature = fn if isinstance(fn, inspect.Signature) else inspect.signature(fn)
        params = list(self.signature.parameters.values())
        self._positional = [
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        self._simple = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)
        self._defaults = {
            p.name: p.default for p in params if p.default is not inspect.Parameter.empty
        }
        self.rename = dict(rename or {})

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        if self._simple and len(args) <= len(self._positional):
            out = dict(self._defaults)
            out.update(zip(self._positional, args, strict=False))
            for k in kwargs:
                if k not in self.signature.parameters:
                    raise TypeError(f"unexpected keyword argument {k!r}")
            out.update(kwargs)
            missing = [n for n in self.signature.parameters if n not in out]
            if missing:
                raise TypeError(f"missing arguments {missing}")
        else:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            out = dict(bound.arguments)
        if self.rename:
            out = {self.rename.get(k, k): v for k, v in out.items()}
        return out


class ContextStore:
    """State kept per object between calls (a wrapper's plan() arguments for its run()).
    Weakly keyed: the state goes with the object."""

    def __init__(self) -> None:
        self._weak: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        self._by_id: dict[int, dict[str, Any]] = {}

    def set(self, obj: Any, /, **state: Any) -> None:
        try:
            self._weak[obj] = dict(state)
        except TypeError:  # not weak-referenceable
            self._by_id[id(obj)] = dict(state)

    def get(self, obj: Any) -> dict[str, Any]:
        try:
            return self._weak.get(obj) or {}
        except TypeError:
            return self._by_id.get(id(obj), {})

    def clear(self, obj: Any) -> None:
        try:
            self._weak.pop(obj, None)
        except TypeError:
            self._by_id.pop(id(obj), None)


# --------------------------------------------------------------------------- dispatch


def _runtime() -> Any:
    from flashtune.apply.runtime import _active_runtime

    return _active_runtime(None)


_WARNED: set[str] = set()


def dispatch(name: str, inputs: Mapping[str, Any], runtime: Any = None) -> list[Any] | None:
    """Run the winner of definition `name` on `inputs` (by input name): its outputs in
    definition order, or None when the table has no solution (the caller falls back)."""
    rt = runtime if runtime is not None else _runtime()
    if name not in rt.table.definitions:
        return None
    definition = rt.dataset.definitions.get(name)
    if definition is None:  # without it the solution's argument order is unknown
        if name not in _WARNED:
            _WARNED.add(name)
            log.warning(
                "apply adapters: definition %s is not in %s; falling back", name, rt.dataset
            )
        return None
    if not rt.kwargs_dtypes_match(name, inputs):  # names carry no dtype: see runtime
        return None
    axes = rt.axes_from_kwargs(name, inputs)
    runner = rt.runner(name, axes)
    if runner is None:
        return None
    from flashtune.apply.runtime import SolutionFailed

    try:
        result = runner(axes, [inputs[n] for n in definition.inputs if n in inputs])
        if isinstance(result, Mapping):
            return [result[n] for n in definition.outputs]
    except SolutionFailed:
        return None  # disabled (warned once): the caller runs the original function
    except KeyError as exc:  # an output the solution did not return: its fault too
        runner.fail(exc)
        return None
    if isinstance(result, (tuple, list)):
        return list(result)
    return [result]


@dataclass(frozen=True)
class AdapterSpec:
    """One patch: dotted target and the factory building the replacement from the original."""

    target: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]


def _linear(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Any:
        if bias is not None or weight.dim() != 2 or input.dim() < 1:
            return original(input, weight, bias)
        n, k = weight.shape
        outs = dispatch(f"gemm_n{n}_k{k}", {"A": input.reshape(-1, k), "B": weight})
        if outs is None:
            return original(input, weight, bias)
        return outs[0].reshape(*input.shape[:-1], n)

    return linear


def _rmsnorm(original: Callable[..., Any]) -> Callable[..., Any]:
    binder = ArgBinder(original)

    @functools.wraps(original)
    def rmsnorm(*args: Any, **kwargs: Any) -> Any:
        a = binder.bind(args, kwargs)
        x, w = a["input"], a["weight"]
        outs = dispatch(
            f"rmsnorm_h{w.shape[-1]}", {"hidden_states": x.reshape(-1, w.shape[-1]), "weight": w}
        )
        if outs is None:
            return original(*args, **kwargs)
        y = outs[0].reshape(x.shape)
        if a.get("out") is not None:
            a["out"].copy_(y)
            return a["out"]
        return y

    return rmsnorm


def _fused_add_rmsnorm(original: Callable[..., Any]) -> Callable[..., Any]:
    binder = ArgBinder(original)

    @functools.wraps(original)
    def fused_add_rmsnorm(*args: Any, **kwargs: Any) -> Any:
        a = binder.bind(args, kwargs)
        x, r, w = a["input"], a["residual"], a["weight"]
        h = w.shape[-1]
        outs = dispatch(
            f"fused_add_rmsnorm_h{h}",
            {"hidden_states": x.reshape(-1, h), "residual": r.reshape(-1, h), "weight": w},
        )
        if outs is None:
            return original(*args, **kwargs)
        return _fused_add_rmsnorm_result(a, {"output": outs[0]})

    return fused_add_rmsnorm


_PLANS = ContextStore()


def _split_kv(paged_kv_cache: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    if isinstance(paged_kv_cache, (tuple, list)) and len(paged_kv_cache) == 2:
        return paged_kv_cache[0], paged_kv_cache[1]
    if isinstance(paged_kv_cache, torch.Tensor) and paged_kv_cache.dim() == 5:
        return paged_kv_cache[:, 0], paged_kv_cache[:, 1]  # [pages, 2, page, heads, dim]
    return None


def _plain_attention(plan: Mapping[str, Any], wrapper: Any) -> bool:
    """Only the features every gqa definition covers: no rope, soft cap, window, or mask."""
    return (
        plan.get("pos_encoding_mode", "NONE") == "NONE"
        and plan.get("logits_soft_cap") in (None, 0.0)
        and plan.get("window_left", -1) in (-1, None)
        and plan.get("custom_mask") is None
        and plan.get("packed_custom_mask") is None
        and getattr(wrapper, "_kv_layout", "NHD") == "NHD"
    )


def _attention_result(outs: list[Any], run_args: Mapping[str, Any]) -> Any:
    out, lse = outs[0], outs[1] if len(outs) > 1 else None
    if run_args.get("out") is not None:
        run_args["out"].copy_(out)
        out = run_args["out"]
    if run_args.get("return_lse"):
        if run_args.get("lse") is not None and lse is not None:
            run_args["lse"].copy_(lse)
            lse = run_args["lse"]
        return out, lse
    return out


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
            p = _PLANS.get(self)
            try:
                r = binder.bind((self, *args), kwargs)
            except TypeError:
                return original(self, *args, **kwargs)
            call = _attention_call(kind, p, r) if p and _plain_attention(p, self) else None
            if call is None or any(r.get(s) is not None for s in ("q_scale", "k_scale", "v_scale")):
                return original(self, *args, **kwargs)
            outs = dispatch(*call)
            if outs is None:
                return original(self, *args, **kwargs)
            return _attention_result(outs, r)

        return run

    return make


def _attention_call(
    kind: str, p: Mapping[str, Any], r: Mapping[str, Any]
) -> tuple[str, dict[str, Any]] | None:
    """(definition name, inputs) of a wrapper's run() from its plan() and run() arguments."""
    h, kv = p.get("num_qo_heads"), p.get("num_kv_heads")
    d = p.get("head_dim", p.get("head_dim_qk"))
    if p.get("head_dim_vo") not in (None, d):
        return None
    sm_scale = p.get("sm_scale")
    sm_scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(d)
    if kind == "ragged":
        if not p.get("causal"):
            return None
        return f"gqa_ragged_prefill_causal_h{h}_kv{kv}_d{d}", {
            "q": r["q"],
            "k": r["k"],
            "v": r["v"],
            "qo_indptr": p["qo_indptr"],
            "kv_indptr": p["kv_indptr"],
            "sm_scale": sm_scale,
        }
    kv_pair = _split_kv(r.get("paged_kv_cache"))
    if kv_pair is None:
        return None
    ps = p.get("page_size")
    if kind == "decode":
        return f"gqa_paged_decode_h{h}_kv{kv}_d{d}_ps{ps}", {
            "q": r["q"],
            "k_cache": kv_pair[0],
            "v_cache": kv_pair[1],
            "kv_indptr": p["indptr"],
            "kv_indices": p["indices"],
            "kv_last_page_len": p["last_page_len"],
            "sm_scale": sm_scale,
        }
    if not p.get("causal"):
        return None
    return f"gqa_paged_prefill_causal_h{h}_kv{kv}_d{d}_ps{ps}", {
        "q": r["q"],
        "k_cache": kv_pair[0],
        "v_cache": kv_pair[1],
        "qo_indptr": p["qo_indptr"],
        "kv_indptr": p["paged_kv_indptr"],
        "kv_indices": p["paged_kv_indices"],
        "kv_last_page_len": p["paged_kv_last_page_len"],
        "sm_scale": sm_scale,
    }


_WRAPPERS = {
    "BatchDecodeWithPagedKVCacheWrapper": "decode",
    "BatchPrefillWithPagedKVCacheWrapper": "paged",
    "BatchPrefillWithRaggedKVCacheWrapper": "ragged",
}
_WRAPPER_MODULES = {
    "flashinfer": ("flashinfer.decode", "flashinfer.prefill"),
    "flashtune": ("flashtune.ops.attention.decode", "flashtune.ops.attention.prefill"),
}


def builtin_adapters() -> list[AdapterSpec]:
    """The built-in adapters whose targets exist in this process."""
    specs = [AdapterSpec("torch.nn.functional.linear", _linear)]
    for family, modules in _WRAPPER_MODULES.items():
        if importlib.util.find_spec(family) is None:
            continue
        for module_name in modules:
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:  # noqa: BLE001 - an optional peer that fails to import
                log.info("apply adapters: %s not importable: %s", module_name, exc)
                continue
            for cls, kind in _WRAPPERS.items():
                if hasattr(module, cls):
                    specs.append(AdapterSpec(f"{module_name}.{cls}.plan", _wrapper_plan))
                    specs.append(AdapterSpec(f"{module_name}.{cls}.run", _wrapper_run(kind)))
    for target, make in (
        ("flashinfer.norm.rmsnorm", _rmsnorm),
        ("flashinfer.rmsnorm", _rmsnorm),
        ("flashinfer.norm.fused_add_rmsnorm", _fused_add_rmsnorm),
        ("flashinfer.fused_add_rmsnorm", _fused_add_rmsnorm),
    ):
        try:
            resolve_target(target)
        except Exception:  # noqa: BLE001 - absent or broken peer: no adapter
            continue
        specs.append(AdapterSpec(target, make))
    return specs


def enable_adapters(
    specs: Iterable[AdapterSpec] | None = None, manager: PatchManager | None = None
) -> PatchManager:
    """Patch the given (default: built-in) adapters; `.unpatch_all()` restores everything.
    Targets that are schema'd flashtune ops are skipped: the apply hook already sees them."""
    from flashtune.schema.api import ApiOp

    manager = manager or PatchManager()
    for spec in specs if specs is not None else builtin_adapters():
        try:
            owner, attr = resolve_target(spec.target)
            if isinstance(inspect.getattr_static(owner, attr), ApiOp):
                continue
            manager.patch(spec.target, spec.make)
        except Exception as exc:  # noqa: BLE001 - one missing target must not stop the rest
            log.warning("apply adapters: cannot patch %s: %s", spec.target, exc)
    return manager

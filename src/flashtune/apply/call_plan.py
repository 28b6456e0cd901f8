"""How one call signature of a schema'd op runs an applied solution (ApplyHook's cache
entry): where each definition input comes from, which need leading dims merged, where the
outputs go."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from flashtune.apply.results import result_adapter_for
from flashtune.apply.solutions import Guarded
from flashtune.schema.api import ApiOp
from flashtune.schema.core import BoundCall, Tensor

__all__ = ["CallPlan", "derived"]


class CallPlan:
    """How one call signature of one op runs a solution: where each definition input comes
    from (positional index, keyword, default), which need leading dims merged, and where the
    outputs go (an `out=` argument) — computed once, replayed with list indexing."""

    def __init__(
        self,
        op: ApiOp,
        call: BoundCall,
        runner: Guarded,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> None:
        self.runner = runner
        self.axes = dict(call.axes)
        self.schema = call.schema
        params = list(op.signature.parameters.values())
        position = {
            p.name: i
            for i, p in enumerate(params)
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        }
        self.sources: list[tuple[str, Any, int]] = []  # (kind, where, rank)
        # An input read through another object (a wrapper's plan state "self._kv_indptr", a
        # field of an argument "paged_kv_cache.k") is not a plain argument: such calls are
        # bound again every time (their values and var axes change between calls).
        self.derived = False
        for name in call.inputs:
            param = self.schema.param_of(name)
            spec = self.schema.inputs[name]
            rank = len(spec.dims) if isinstance(spec, Tensor) else 0
            # An op may turn its arguments into what the schema sees (ApiOp.arguments: a
            # default sm_scale for None): an input is read off the call only as passed.
            passed = param in kwargs or (param in position and position[param] < len(args))
            as_passed = passed and call.inputs[name] is (
                kwargs[param] if param in kwargs else args[position[param]]
            )
            if as_passed and param in kwargs:
                self.sources.append(("kw", param, rank))
            elif as_passed:
                self.sources.append(("arg", position[param], rank))
            elif param in call.bound and not passed:
                self.sources.append(("const", call.bound[param], rank))
            else:
                self.derived = True
                self.sources.append(("bound", name, rank))
        # Output arguments (out=): where each would come from, so a call that passes none
        # skips binding its arguments altogether. An output without an argument of its own
        # name goes to `out=` when it is the only one (FlashInfer's convention).
        self.out_sources: list[tuple[int, str, int]] = []  # (output index, param, position)
        parameters = op.signature.parameters
        for i, o in enumerate(self.schema.outputs):
            param = self.schema.param_of(o)
            if param not in parameters and len(self.schema.outputs) == 1:
                param = "out"
            if param in parameters:
                self.out_sources.append((i, param, position.get(param, -1)))
        self.result_adapter = result_adapter_for(op)
        self.output_names = list(self.schema.outputs)

    def run(self, op: ApiOp, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        inputs = []
        lead: tuple[int, ...] | None = None
        axes = self.axes
        call = op.bind(*args, **kwargs) if self.derived else None
        if call is not None:
            axes = dict(call.axes)
        for kind, where, rank in self.sources:
            if kind == "bound":
                value = call.inputs[where]  # type: ignore[union-attr]
            else:
                value = args[where] if kind == "arg" else kwargs[where] if kind == "kw" else where
            if rank and isinstance(value, torch.Tensor) and value.dim() > rank:
                lead = tuple(value.shape[: value.dim() - rank + 1])
                value = value.reshape(-1, *value.shape[value.dim() - rank + 1 :])
            inputs.append(value)
        result = self.runner(axes, inputs)
        if isinstance(result, torch.Tensor) or not isinstance(result, (tuple, list, Mapping)):
            result = (result,)
        if isinstance(result, Mapping):
            try:
                outputs = [result[n] for n in self.output_names]
            except KeyError as exc:  # the solution's fault, like an exception it raises
                raise self.runner.fail(exc) from exc
        else:
            outputs = list(result)
        if lead is not None:
            n = 1
            for s in lead:
                n *= s
            outputs = [
                o.reshape(*lead, *o.shape[1:])
                if isinstance(o, torch.Tensor) and o.dim() >= 1 and o.shape[0] == n
                else o
                for o in outputs
            ]
        if self.result_adapter is not None:
            arguments = op.arguments(args, dict(kwargs))
            return self.result_adapter(
                arguments, dict(zip(self.output_names, outputs, strict=False))
            )
        for i, param, pos in self.out_sources:
            dest = (
                kwargs.get(param)
                if param in kwargs
                else (args[pos] if 0 <= pos < len(args) else None)
            )
            if isinstance(dest, torch.Tensor) and i < len(outputs):
                dest.copy_(outputs[i].reshape(dest.shape))
                outputs[i] = dest
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def derived(call: BoundCall) -> bool:
    """Whether some input is read through another object (see CallPlan.derived)."""
    return any("." in call.schema.param_of(name) for name in call.inputs)

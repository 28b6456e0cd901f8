"""What `flashtune tune --ops NAME` calls, derived from the op schemas.

The op modules register example calls of every op at a model's shapes (on the meta device,
see `flashtune.schema.dump`). A tune target re-makes such a call at a given token count with
real tensors: the op's schema says which argument holds which input, which axis is the token
dimension (the first var axis of its inputs), and which input dtypes are fixed. Calling the
public op asks the autotuner, which profiles the bucket.

An op is a target when each of its inputs is a plain argument (not an attribute of a planned
wrapper) and no constraint reads an input's values (its shape is fine): index tensors such as
a page table cannot be made up at another size. Targets are named by their schema's name prefix, the
start of their Definitions' names (rmsnorm, gemm, silu_and_mul, ...).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from flashtune.data.synth import torch_dtype
from flashtune.schema import BoundCall, OpSchema, Tensor, Var

__all__ = ["TuneCall", "tune_targets", "token_axis"]


@dataclass(frozen=True)
class TuneCall:
    """One example call of an op, to be re-made at any token count."""

    op: Any  # the public op (an ApiOp, or a schema'd method bound to its instance)
    call: BoundCall  # the example's arguments seen through the op's schema
    token_axis: str

    @property
    def definition_name(self) -> str:
        return self.call.name

    def arguments(self, tokens: int, dtype: torch.dtype, device: str) -> dict[str, Any]:
        """The example's arguments with every input tensor made anew: `tokens` along the token
        axis, random values (zeros for integers, valid as indices), `dtype` unless the schema
        fixes the input's dtype or the example's is not floating point."""
        schema = self.call.schema
        axes = {**self.call.axes, self.token_axis: tokens}
        arguments = dict(self.call.bound)
        for name, example in self.call.inputs.items():
            spec = schema.inputs[name]
            if not isinstance(spec, Tensor):
                continue  # a scalar input keeps the example's value
            shape = [axes[dim] for dim in spec.dims]
            if spec.dtype is not None:
                want = torch_dtype(spec.dtype)
            else:
                # fp8 operands (one byte) keep their format: `dtype` is the activations'.
                wide_float = example.dtype.is_floating_point and example.dtype.itemsize > 1
                want = dtype if wide_float else example.dtype
            if want.is_floating_point:
                # randn in fp32 then cast: randn has no fp8 kernels.
                value = torch.randn(shape, dtype=torch.float32, device=device).to(want)
            else:
                value = torch.zeros(shape, dtype=want, device=device)
            arguments[schema.param_of(name)] = value
        return arguments

    def run(self, tokens: int, dtype: torch.dtype, device: str) -> None:
        self.op(**self.arguments(tokens, dtype, device))


def token_axis(schema: OpSchema) -> str | None:
    """The first var axis that an input tensor has (None: the op has no token dimension)."""
    dims = {d for spec in schema.inputs.values() if isinstance(spec, Tensor) for d in spec.dims}
    return next((a for a, spec in schema.axes.items() if isinstance(spec, Var) and a in dims), None)


def _reads_values(constraint: str) -> set[str]:
    """The names a constraint reads other than through `.shape` (a MoE definition's
    `gemm1_weights.shape[1] == 2 * intermediate_size` holds for tensors made from the axes)."""
    tree = ast.parse(constraint, mode="eval")
    shapes = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr == "shape" and isinstance(n.value, ast.Name)
    }
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in shapes}


def _tunable(call: BoundCall) -> str | None:
    """The call's token axis when it can be re-made at another size (see the docstring)."""
    schema = call.schema
    if any("." in schema.param_of(name) for name in schema.inputs):
        return None
    for constraint in schema.constraints:
        if _reads_values(constraint) & set(schema.inputs):
            return None
    input_params = {schema.param_of(name) for name in call.inputs}
    for param, value in call.bound.items():
        if isinstance(value, torch.Tensor) and param not in input_params:
            return None  # a tensor the schema does not describe: its shape is unknown
    return token_axis(schema)


def tune_targets(
    examples: Iterable[tuple[Any, tuple[Any, ...], dict[str, Any]]],
) -> dict[str, list[TuneCall]]:
    """Example calls (op, args, kwargs) grouped by schema name prefix, one per Definition,
    keeping only the ops that can be tuned at any token count."""
    targets: dict[str, list[TuneCall]] = {}
    seen: set[str] = set()
    for op, args, kwargs in examples:
        call = op.bind(*args, **kwargs)
        axis = _tunable(call)
        if axis is None or call.name in seen:
            continue
        seen.add(call.name)
        targets.setdefault(call.schema.name_prefix, []).append(TuneCall(op, call, axis))
    return targets

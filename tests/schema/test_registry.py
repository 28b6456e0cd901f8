"""Consistency checks run automatically over every schema'd op in the registry."""

from __future__ import annotations

import ast
import functools
import inspect
import math

import pytest
import torch

from flashtune.data import (
    Definition,
    resolve_axes,
    run_reference,
    small_workload,
    synthesize_inputs,
    torch_dtype,
)
from flashtune.data.models import CONSTRAINT_FUNCTIONS
from flashtune.model_shapes import MODELS
from flashtune.ops import load_all
from flashtune.schema import ApiOp, Const, OpSchema, Scalar, Tensor, registered_ops
from flashtune.schema.dump import EXAMPLES, model_definitions

OPS = load_all()
# Ops defined inside the tests themselves are not part of the library.
OPS = {name: op for name, op in OPS.items() if name.startswith("flashtune.")}
CASES = [(name, i) for name, op in sorted(OPS.items()) for i in range(len(op.schemas))]


def _schema(case: tuple[str, int]) -> tuple[ApiOp, OpSchema]:
    name, i = case
    return OPS[name], OPS[name].schemas[i]


def _ids(cases):
    return [f"{n.rsplit('.', 1)[-1]}-{OPS[n].schemas[i].name_prefix}" for n, i in cases]


def test_registry_is_populated() -> None:
    assert OPS, "no schema'd op registered under flashtune.ops"
    assert set(OPS) <= set(registered_ops())  # load_all registers what it returns


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_schema_params_exist_in_signature(case) -> None:
    op, schema = _schema(case)
    params = set(op.signature.parameters)
    for name in schema.inputs:
        head = schema.param_of(name).split(".")[0]
        assert head in params, (
            f"{schema.name_prefix}: input {name!r} reads argument {head!r}, not in {sorted(params)}"
        )
    for axis, spec in schema.axes.items():
        if isinstance(spec, Const) and spec.param:
            assert spec.param.split(".")[0] in params, (
                f"const axis {axis!r} reads missing argument {spec.param!r}"
            )


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_every_const_axis_is_resolvable(case) -> None:
    _, schema = _schema(case)
    dims = {d for spec in schema.inputs.values() if isinstance(spec, Tensor) for d in spec.dims}
    for axis, spec in schema.axes.items():
        if isinstance(spec, Const):
            assert spec.param or axis in dims, (
                f"{schema.name_prefix}: const axis {axis!r} has no source"
            )


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_constraints_name_declared_things_only(case) -> None:
    _, schema = _schema(case)
    declared = (
        set(schema.axes)
        | set(schema.inputs)
        | set(schema.outputs)
        | {"torch", *CONSTRAINT_FUNCTIONS}
    )
    for expr in schema.constraints:
        names = {n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)}
        assert names <= declared, (
            f"{schema.name_prefix}: constraint {expr!r} names {sorted(names - declared)}"
        )


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_reference_accepts_the_definition_inputs(case) -> None:
    _, schema = _schema(case)
    params = inspect.signature(schema.reference).parameters
    for name in [*schema.inputs, *schema.bound]:
        assert name in params, (
            f"{schema.name_prefix}: reference {schema.reference.__name__} lacks parameter {name!r}"
        )


def _example_definitions() -> dict[str, list[Definition]]:
    """Definitions per schema prefix, from the registered model examples (meta tensors)."""
    by_prefix: dict[str, list[Definition]] = {}
    for definition in model_definitions().values():
        by_prefix.setdefault(definition.name.split("_")[0], []).append(definition)
    return by_prefix


def test_every_op_has_model_examples() -> None:
    """`flashtune definitions dump --model` covers every op family."""
    names = set(model_definitions())
    assert EXAMPLES, "no model examples registered"
    for _, schema in map(_schema, CASES):
        assert any(
            n.startswith(schema.name_prefix + "_") or n == schema.name_prefix for n in names
        ), f"no model example produces a {schema.name_prefix} definition"


@functools.cache
def _all_model_definitions() -> tuple[Definition, ...]:
    """Every model example's Definition, made once for the module: each case below reads
    them, and making them (every model's examples, every op) takes seconds."""
    return tuple(model_definitions().values())


def _smallest(defs: list[Definition]) -> Definition:
    return min(defs, key=lambda d: math.prod(d.const_axes.values() or [1]))


@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_definitions_have_no_unknown_dtype_or_const(model) -> None:
    for definition in model_definitions([model]).values():
        for spec in [*definition.inputs.values(), *definition.outputs.values()]:
            torch_dtype(spec.dtype)
            assert all(a in definition.axes for a in spec.shape or ())
        assert all(isinstance(v, int) and v > 0 for v in definition.const_axes.values()), (
            definition.name
        )


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_reference_returns_declared_shapes_and_dtypes(case) -> None:
    _, schema = _schema(case)
    defs = [d for d in _all_model_definitions() if d.name.startswith(schema.name_prefix + "_")]
    if not defs:
        pytest.fail(f"no example definition for {schema.name_prefix}")
    definition = _smallest(defs)
    workload = small_workload(definition)
    inputs = synthesize_inputs(definition, workload, seed=0)
    outputs = run_reference(definition, inputs)
    axes = resolve_axes(definition, workload)
    for name, spec in definition.outputs.items():
        assert tuple(outputs[name].shape) == tuple(axes[a] for a in spec.shape or ()), name
        assert outputs[name].dtype == torch_dtype(spec.dtype), name
        if outputs[name].dtype.is_floating_point:
            # -inf is a legal log-sum-exp (an empty request attends to nothing); NaN never is.
            assert not torch.isnan(outputs[name].float()).any(), name


def test_scalar_specs_have_known_dtypes() -> None:
    unknown = []
    for _, schema in map(_schema, CASES):
        for name, spec in schema.inputs.items():
            if isinstance(spec, Scalar):
                try:
                    torch_dtype(spec.dtype)
                except ValueError:
                    unknown.append((schema.name_prefix, name, spec.dtype))
    assert unknown == []

"""Declarative op schemas: axes, inputs, outputs and a reference, from which a Definition is
built for any call's arguments without running a kernel."""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from flashtune.data.constraints import evaluate_constraint
from flashtune.data.models import ConstAxis, Definition, DType, TensorSpec, VarAxis

__all__ = [
    "Var",
    "Const",
    "Tensor",
    "Scalar",
    "OpSchema",
    "BoundCall",
    "dtype_name",
    "reference_constants",
    "constant_mismatches",
]


@dataclass(frozen=True)
class Var:
    """An axis whose value varies between calls (batch size, sequence length)."""

    description: str = ""


@dataclass(frozen=True)
class Const:
    """An axis fixed per Definition (hidden size, head count); part of the name as
    `<abbrev><value>` when `abbrev` is set. Resolved from tensor shapes, or from the
    argument `param` (a name, or a dotted path such as "self.page_size") when given."""

    description: str = ""
    abbrev: str | None = None
    param: str | None = None


@dataclass(frozen=True)
class Tensor:
    """A tensor input or output. `dims` names its axes; a tensor with more dimensions than
    `dims` has its leading dimensions merged into the first (3-D activations of a 2-D op).
    dtype is fixed, or copied from another argument/input with `dtype_from`."""

    dims: Sequence[str]
    dtype: DType | None = None
    dtype_from: str | None = None
    optional: bool = False
    param: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if (self.dtype is None) == (self.dtype_from is None):
            raise ValueError("Tensor needs exactly one of dtype= or dtype_from=")
        object.__setattr__(self, "dims", tuple(self.dims))


@dataclass(frozen=True)
class Scalar:
    """A Python scalar input (shape null in the Definition)."""

    dtype: DType
    param: str | None = None
    optional: bool = False
    description: str = ""


Spec = Union[Tensor, Scalar]

_DTYPE_NAMES: dict[torch.dtype, DType] = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def dtype_name(dtype: torch.dtype) -> DType:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} has no FlashInfer Trace name") from None


def _lookup(arguments: Mapping[str, Any], path: str) -> Any:
    """`name` or a dotted path `name.attr.attr` into the call's arguments."""
    head, *rest = path.split(".")
    if head not in arguments:
        raise KeyError(head)
    value = arguments[head]
    for attr in rest:
        value = getattr(value, attr)
    return value


@dataclass
class BoundCall:
    """A call's arguments seen through a schema: axis values, inputs by Definition name."""

    schema: OpSchema
    axes: dict[str, int]
    inputs: dict[str, Any]
    dtypes: dict[str, DType]
    bound: dict[str, Any]

    @property
    def const_axes(self) -> dict[str, int]:
        return {k: v for k, v in self.axes.items() if isinstance(self.schema.axes[k], Const)}

    @property
    def var_axes(self) -> dict[str, int]:
        return {k: v for k, v in self.axes.items() if isinstance(self.schema.axes[k], Var)}

    @property
    def name(self) -> str:
        return self.schema.name_for(self.axes)

    @property
    def constants(self) -> dict[str, Any]:
        """The value of each of the schema's bound parameters that this call's Definition
        bakes into its reference (the norm's eps, a rope's is_neox): the call's own, else the
        reference's default. Definition names carry none of them."""
        return self.schema.constants_of(self.bound)

    def definition(self) -> Definition:
        return self.schema.build_definition(self)


@dataclass(frozen=True)
class OpSchema:
    """The contract of one op: see the package docstring for an example."""

    op_type: str
    name_prefix: str
    axes: Mapping[str, Var | Const]
    inputs: Mapping[str, Spec]
    outputs: Mapping[str, Tensor]
    reference: Callable[..., Any]
    constraints: Sequence[str] = ()
    tags: Sequence[str] = ()
    description: str = ""
    bound: Sequence[str] = ()
    _reference_source: list[str] = field(default_factory=list, compare=False, repr=False)
    _bound_defaults: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for kind, specs in (("inputs", self.inputs), ("outputs", self.outputs)):
            for name, spec in specs.items():
                for dim in getattr(spec, "dims", ()):
                    if dim not in self.axes:
                        raise ValueError(
                            f"{self.name_prefix}: {kind}.{name} names undeclared axis {dim!r}"
                        )
        both = set(self.inputs) & set(self.outputs)
        if both:
            raise ValueError(
                f"{self.name_prefix}: names used as both input and output: {sorted(both)}"
            )

    # ----------------------------------------------------------------- binding
    def param_of(self, name: str) -> str:
        spec = self.inputs.get(name) or self.outputs.get(name)
        return (spec.param if spec is not None and spec.param else None) or name

    def bind(self, arguments: Mapping[str, Any]) -> BoundCall:
        """Resolve axes, dtypes and inputs from a call's bound arguments (no kernel runs).

        Raises ValueError when tensors disagree on an axis or a const cannot be resolved."""
        axes: dict[str, int] = {}
        inputs: dict[str, Any] = {}
        dtypes: dict[str, DType] = {}

        def set_axis(axis: str, value: int, where: str) -> None:
            if axis in axes and axes[axis] != value:
                raise ValueError(
                    f"{self.name_prefix}: axis {axis!r} is {axes[axis]} from an earlier argument but {value} from {where}"
                )
            axes[axis] = int(value)

        for axis, axis_spec in self.axes.items():
            if isinstance(axis_spec, Const) and axis_spec.param:
                value = _lookup(arguments, axis_spec.param)
                if value is not None:
                    set_axis(axis, int(value), axis_spec.param)

        for name, spec in self.inputs.items():
            param = self.param_of(name)
            try:
                value = _lookup(arguments, param)
            except (KeyError, AttributeError):
                if spec.optional:
                    continue
                raise ValueError(
                    f"{self.name_prefix}: argument {param!r} (input {name!r}) is missing"
                ) from None
            if value is None:
                if spec.optional:
                    continue
                raise ValueError(f"{self.name_prefix}: argument {param!r} (input {name!r}) is None")
            inputs[name] = value
            if isinstance(spec, Scalar):
                dtypes[name] = spec.dtype
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"{self.name_prefix}: argument {param!r} must be a tensor, got {type(value).__name__}"
                )
            dtypes[name] = dtype_name(value.dtype)
            for axis, size in zip(spec.dims, _logical_shape(value, len(spec.dims)), strict=True):
                set_axis(axis, size, param)

        for name, spec in self.inputs.items():
            if isinstance(spec, Tensor) and name in inputs and spec.dtype is not None:
                dtypes[name] = spec.dtype
        for axis, value in self._derived_axes(axes).items():
            set_axis(axis, value, "a constraint")
        for axis, axis_spec in self.axes.items():
            if isinstance(axis_spec, Const) and axis not in axes:
                raise ValueError(
                    f"{self.name_prefix}: const axis {axis!r} cannot be resolved from the arguments"
                )
        return BoundCall(self, axes, inputs, dtypes, dict(arguments))

    def _derived_axes(self, axes: Mapping[str, int]) -> dict[str, int]:
        """Var axes no input shows (an output's width: silu_and_mul's hidden_size) but a
        constraint `axis == expr` of the known axes fixes: without them a captured Workload
        lacks a var axis of its Definition and is invalid."""
        derived: dict[str, int] = {}
        for constraint in self.constraints:
            axis, sep, expr = constraint.partition("==")
            axis = axis.strip()
            if not sep or axis in axes or not isinstance(self.axes.get(axis), Var):
                continue
            try:
                derived[axis] = int(evaluate_constraint(expr.strip(), axes))
            except Exception:  # noqa: BLE001 - a constraint over inputs, not axes alone
                continue
        return derived

    def _dtype_of(self, spec: Tensor, call: BoundCall) -> DType:
        if spec.dtype is not None:
            return spec.dtype
        source = spec.dtype_from
        assert source is not None
        if source in call.dtypes:
            return call.dtypes[source]
        for name in self.inputs:
            if self.param_of(name) == source and name in call.dtypes:
                return call.dtypes[name]
        try:
            value = _lookup(call.bound, source)
        except (KeyError, AttributeError):
            value = None
        if isinstance(value, torch.Tensor):
            return dtype_name(value.dtype)
        if isinstance(value, torch.dtype):
            return dtype_name(value)
        if isinstance(value, str):
            return dtype_name(getattr(torch, value))
        raise ValueError(
            f"{self.name_prefix}: dtype_from={source!r} names no tensor or dtype argument"
        )

    def constants_of(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The bound parameters' values for a call with these arguments (see
        BoundCall.constants): the argument, else the reference's default."""
        if len(self._bound_defaults) != len(self.bound):  # once: signatures are slow to read
            parameters = inspect.signature(self.reference).parameters
            self._bound_defaults.update({n: parameters[n].default for n in self.bound})
        values: dict[str, Any] = {}
        for name in self.bound:
            value = arguments.get(name)
            values[name] = self._bound_defaults[name] if value is None else value
        return values

    # ----------------------------------------------------------------- definition
    def name_for(self, axes: Mapping[str, int]) -> str:
        parts = [self.name_prefix]
        for axis, axis_spec in self.axes.items():
            if isinstance(axis_spec, Const) and axis_spec.abbrev:
                parts.append(f"{axis_spec.abbrev}{axes[axis]}")
        return "_".join(parts)

    def reference_source(self, call: BoundCall | None = None) -> str:
        """Self-contained Python source defining `run(<input names>)`."""
        if not self._reference_source:
            self._reference_source.append(textwrap.dedent(inspect.getsource(self.reference)))
        fn_source = self._reference_source[0]
        params = [
            n
            for n in self.inputs
            if call is None or n in call.inputs or not self.inputs[n].optional
        ]
        keywords = [f"{p}={p}" for p in params]
        for name, value in self.constants_of(call.bound if call is not None else {}).items():
            keywords.append(f"{name}={_literal(value)}")
        return (
            "import math\n\nimport torch\n\n\n"
            f"{fn_source.rstrip()}\n\n\n"
            f"def run({', '.join(params)}):\n"
            f"    return {self.reference.__name__}({', '.join(keywords)})\n"
        )

    def build_definition(self, call: BoundCall) -> Definition:
        axes: dict[str, Any] = {}
        for axis, axis_spec in self.axes.items():
            if isinstance(axis_spec, Const):
                axes[axis] = ConstAxis(type="const", value=call.axes[axis], **_described(axis_spec))
            else:
                axes[axis] = VarAxis(type="var", **_described(axis_spec))
        inputs = {}
        for name, spec in self.inputs.items():
            if spec.optional and name not in call.inputs:
                continue
            if isinstance(spec, Scalar):
                inputs[name] = TensorSpec(shape=None, dtype=spec.dtype, **_described(spec))
            else:
                inputs[name] = TensorSpec(
                    shape=list(spec.dims),
                    dtype=self._dtype_of(spec, call),
                    **_described(spec),
                )
        outputs = {
            name: TensorSpec(
                shape=list(spec.dims),
                dtype=self._dtype_of(spec, call),
                **_described(spec),
            )
            for name, spec in self.outputs.items()
        }
        description = self.description
        bound_desc = ", ".join(
            f"{n}={_literal(call.bound.get(n))}"
            for n in self.bound
            if call.bound.get(n) is not None
        )
        if bound_desc:
            description = f"{description} ({bound_desc})" if description else bound_desc
        return Definition(
            name=self.name_for(call.axes),
            op_type=self.op_type,
            **({"description": description} if description else {}),
            tags=list(self.tags),
            axes=axes,
            constraints=list(self.constraints),
            inputs=inputs,
            outputs=outputs,
            reference=self.reference_source(call),
        )


def reference_constants(reference: str, names: Sequence[str]) -> dict[str, Any]:
    """The values a Definition's reference fixes for the bound parameters `names`, by name;
    a name it does not reveal is left out. Two spellings are read: flashtune's (the
    generated `run` passes `eps=1e-05` to the reference function: OpSchema.reference_source)
    and FlashInfer's (an upper-case constant assigned in the source: `EPS = 1e-5`). A
    reference that does not parse reveals nothing."""
    try:
        tree = ast.parse(reference)
    except SyntaxError:
        return {}
    wanted = set(names)
    upper = {name.upper(): name for name in names}
    found: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "run":
            for call in ast.walk(node):
                if isinstance(call, ast.Call):
                    for keyword in call.keywords:
                        if keyword.arg in wanted:
                            _take_literal(found, keyword.arg, keyword.value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and upper.get(target.id) not in (None, *found):
                _take_literal(found, upper[target.id], node.value)
    return found


def _take_literal(found: dict[str, Any], name: str, node: ast.expr) -> None:
    try:
        found[name] = ast.literal_eval(node)
    except ValueError:  # an expression, not a literal: unknown
        pass


def constant_mismatches(
    call_constants: Mapping[str, Any], definition_constants: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """{name: (the call's value, the definition's)} for every constant a call and a
    Definition both fix to different values ({} when they agree): a solution proven on the
    definition (eps=1e-5) computes something else for the call (eps=1e-6). None on either
    side means "the reference's default" in one of two spellings and is not compared."""
    return {
        name: (value, definition_constants[name])
        for name, value in call_constants.items()
        if value is not None
        and definition_constants.get(name) is not None
        and value != definition_constants[name]
    }


def _described(spec: Any) -> dict[str, str]:
    # Only write a description that exists: absent, not null, like the corpus files.
    return {"description": spec.description} if spec.description else {}


def _logical_shape(value: torch.Tensor, rank: int) -> tuple[int, ...]:
    shape = tuple(value.shape)
    if len(shape) == rank:
        return shape
    if len(shape) > rank and rank >= 1:
        return (math.prod(shape[: len(shape) - rank + 1]), *shape[len(shape) - rank + 1 :])
    raise ValueError(f"expected a tensor of at least {rank} dimensions, got shape {shape}")


def _literal(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (int, bool, str)) or value is None:
        return repr(value)
    if isinstance(value, torch.dtype):
        return str(value)
    raise TypeError(f"cannot bake {value!r} into a reference")

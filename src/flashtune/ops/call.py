"""The call path every op shares, written once: checking a call's tensors against the op's
schema, launching the kernel the autotuner picks (or the reference where no kernel can run),
and the eager vs torch.compile choice.

An op declares its call path in its family's launch.py, in three parts::

    class NormInputs(NamedTuple):             # what its runners take, by name
        x: torch.Tensor
        weight: torch.Tensor
        out: torch.Tensor
        eps: float
        pdl: bool = False                     # a launch option: past `tuned`, not keyed on

    _CHECKS = SchemaChecks(RMSNORM, dtypes={"hidden_states": FLOATS}, outputs={"output": "out"})
    _NORM = KernelOp("flashtune::rmsnorm", _RUNNERS, TUNING, reference=_norm_ref, tuned=4)

    @traced("rmsnorm_out", mutates=("out",))  # a torch custom op under torch.compile only
    def _rmsnorm_into(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float,
                      pdl: bool) -> None:
        _NORM(NormInputs(x, weight, out, eps, pdl))

and its public function calls `_CHECKS.validate({"input": input, ...})`, allocates the
output and calls `_rmsnorm_into(...)`.

- `SchemaChecks`: the schema's tensor specs say which arguments are tensors, their axes (the
  same axis name is the same size everywhere) and their dtypes (fixed, or another argument's);
  the declaration adds what a Definition does not carry: the dtypes a call may use, the ranks
  it accepts (leading dimensions merged into the first axis, as the schema binds them), which
  output an argument such as `out` holds, and last-dimension contiguity. Checks a schema
  cannot express stay in the op, as a short `check` hook.
- `KernelOp`: where kernels can run, `choose_one` picks the (runner, tactic) and the runner
  launches directly; elsewhere (a CPU without the interpreter) the op's reference runs.
- `traced`: eager calls run the function itself; under torch.compile they go through a torch
  custom op (made once, with its fake). The custom-op boundary costs 18-21 us of host time
  per call (H200 machine, custom op 41 us vs the direct launch 21-23 us, bench_norm.py
  "custom_op_overhead" rows), so the eager path stays a direct launch.

Runner inputs are NamedTuples: named fields for the runners and the reference, and still the
sequence the autotuner keys, profiles and clones by position (`TuningConfig.dynamic_dims`
names inputs by index: `field_index` gives it by name). The tuner's own copies come back as
lists: a runner reads them with `named(NormInputs, inputs)`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from flashtune import platform
from flashtune.schema import OpSchema, Tensor
from flashtune.tune import Tactic, TunableRunner, TuningConfig, choose_one

__all__ = [
    "FLOATS",
    "SchemaChecks",
    "KernelOp",
    "traced",
    "check_tensor",
    "dtype_list",
    "inputs_of",
    "named",
    "field_index",
]

FLOATS: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
"""The dtypes of most ops' activations."""

T = TypeVar("T", bound=tuple[Any, ...])


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------


def dtype_list(dtypes: Sequence[torch.dtype]) -> str:
    """'float16, bfloat16 or float32'."""
    names = [str(d).removeprefix("torch.") for d in dtypes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def check_tensor(
    name: str,
    t: Any,
    dtypes: Sequence[torch.dtype] | None = None,
    device: torch.device | None = None,
    device_of: str = "",
    contiguous: bool = False,
) -> torch.Tensor:
    """One argument's own checks (the ones `SchemaChecks` runs per tensor), for a call that
    has no schema: a tensor, of one of `dtypes`, on `device` (that of the argument
    `device_of`), with a contiguous last dimension."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must be {dtype_list(dtypes)}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but {device_of} is on {device}")
    if contiguous and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension (stride 1), got strides "
            f"{tuple(t.stride())}"
        )
    return t


@dataclass(frozen=True, slots=True)
class _Check:
    """One tensor argument's checks, compiled from its spec and the declaration."""

    param: str  # the argument's name: what messages call it
    dims: tuple[str, ...]
    low: int  # the ranks accepted
    high: int
    dtypes: tuple[torch.dtype, ...] | None  # allowed, or None: any / another argument's
    dtype_from: str | None  # the argument whose dtype this one must have
    optional: bool
    contiguous: bool
    bind: bool  # its shape gives the axes
    like: str | None  # an earlier argument declared with the same axes: the same shape


def _allowed(
    name: str,
    param: str,
    spec: Tensor,
    dtypes: Mapping[str, Sequence[torch.dtype]],
    dtype_from: Mapping[str, str],
) -> tuple[tuple[torch.dtype, ...] | None, str | None]:
    """(the dtypes allowed, or None; the argument whose dtype it must have, or None)."""
    if name in dtypes:
        return tuple(dtypes[name]), None
    if name in dtype_from:
        return None, dtype_from[name]
    if spec.dtype is not None:
        return (getattr(torch, spec.dtype),), None
    source = spec.dtype_from
    return None, (None if source == param else source)  # its own: the call chooses


_ANY_RANK = 1 << 30


def _rank_words(c: _Check) -> str:
    lo, hi, n = c.low, c.high, len(c.dims)
    exact = f"{n}-D [{', '.join(c.dims)}]"
    if lo == hi == n:
        return exact
    if lo < n:  # a shape the op reads its own way (rope's [nnz, H * D] query)
        ranks = f"{lo}-D or {hi}-D" if hi == lo + 1 else f"{lo}-D to {hi}-D"
        return f"{ranks} ({exact})" if hi != _ANY_RANK else f"at least {lo}-D ({exact})"
    merged = f"leading dimensions merged into {c.dims[0]}"
    if hi == _ANY_RANK:
        return f"at least {lo}-D ({exact}, {merged})"
    if hi == lo + 1:
        return f"{exact} or {hi}-D ({merged})"
    return f"{exact} to {hi}-D ({merged})"


class SchemaChecks:
    """The checks of one op's call, derived from its schema's tensor specs (see the module
    docstring). `validate(arguments)` raises TypeError (not a tensor, wrong dtype) or
    ValueError (rank, shape, device, layout) naming the argument, what was expected and what
    it got.

    schema: the op's schema; its inputs in order, then the outputs named in `outputs`.
    dtypes: {spec name: allowed dtypes}, for the specs whose dtype the call chooses (their
      `dtype_from` names themselves), or to widen a fixed one (int32 positions of an int64
      spec); a spec with `dtype_from` another argument must have that argument's dtype.
    ranks: {spec name: (lowest, highest or None: any)} ranks accepted (default: exactly its
      dims).
    outputs: {output spec name: argument}: outputs the caller may pass (`out`); optional.
    contiguous: last-dimension stride 1 for every tensor (True), none (False) or these names.
    unbound: specs whose shape the op reads its own way (checked by `check`): no axes.
    dtype_from: {spec name: argument} overriding the schema's (a dtype argument is allowed).
    check: the op's own checks, called with the arguments after the schema's.
    """

    def __init__(
        self,
        schema: OpSchema,
        *,
        dtypes: Mapping[str, Sequence[torch.dtype]] | None = None,
        ranks: Mapping[str, tuple[int, int | None]] | None = None,
        outputs: Mapping[str, str] | None = None,
        contiguous: bool | Collection[str] = True,
        unbound: Collection[str] = (),
        dtype_from: Mapping[str, str] | None = None,
        check: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> None:
        dtypes, ranks, outputs = dtypes or {}, ranks or {}, outputs or {}
        dtype_from = dtype_from or {}
        specs: list[tuple[str, str, Tensor, bool]] = [
            (name, schema.param_of(name), spec, spec.optional)
            for name, spec in schema.inputs.items()
            if isinstance(spec, Tensor)
        ]
        specs += [(name, param, schema.outputs[name], True) for name, param in outputs.items()]
        self.schema = schema
        self.check = check
        listed = () if isinstance(contiguous, bool) else contiguous
        for name in (*dtypes, *ranks, *unbound, *dtype_from, *listed):
            if name not in schema.inputs and name not in outputs:
                raise ValueError(f"{schema.name_prefix}: no tensor spec {name!r} to check")
        self.checks: tuple[_Check, ...] = tuple(
            _Check(
                param=param,
                dims=tuple(spec.dims),
                low=ranks.get(name, (len(spec.dims),) * 2)[0],
                high=ranks.get(name, (len(spec.dims),) * 2)[1] or _ANY_RANK,
                dtypes=_allowed(name, param, spec, dtypes, dtype_from)[0],
                dtype_from=_allowed(name, param, spec, dtypes, dtype_from)[1],
                optional=optional,
                contiguous=contiguous if isinstance(contiguous, bool) else name in contiguous,
                bind=name not in unbound,
                like=None,
            )
            for name, param, spec, optional in specs
        )
        # A tensor declared with the axes of an earlier one that may merge leading dimensions
        # has that one's shape (the axes alone would let [2, 2, h] pass for [4, h]).
        checks = list(self.checks)
        for i, c in enumerate(checks):
            for d in checks[:i]:
                if d.bind and c.bind and d.dims == c.dims and (d.low, d.high) != (len(d.dims),) * 2:
                    checks[i] = dataclasses.replace(c, like=d.param)
                    break
        self.checks = tuple(checks)
        self.validate = _compile(self.checks, self._fail, check)  # type: ignore[method-assign,assignment]

    def validate(self, arguments: Mapping[str, Any]) -> None:
        """Check the call's `arguments` (by parameter name; a missing one is None), then run
        the op's own `check`. (Replaced per instance by the same checks as generated code.)"""
        self.explain(arguments)
        if self.check is not None:
            self.check(arguments)

    def _fail(self, arguments: Mapping[str, Any]) -> None:
        self.explain(arguments)
        raise AssertionError(f"{self.schema.name_prefix}: the checks disagree on {arguments}")

    def explain(self, arguments: Mapping[str, Any]) -> None:
        """Raise the error of the first check `arguments` fail, if any: the checks, read
        top to bottom (`validate` runs the same conditions as generated code)."""
        axes: dict[str, int] = {}
        device: torch.device | None = None
        first = ""
        for c in self.checks:
            t = arguments.get(c.param)
            if t is None and c.optional:
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{c.param} must be a torch.Tensor, got {type(t).__name__}")
            shape = t.shape
            nd = len(shape)
            if nd < c.low or nd > c.high:
                raise ValueError(f"{c.param} must be {_rank_words(c)}, got shape {tuple(shape)}")
            if c.dtypes is not None:
                if t.dtype not in c.dtypes:
                    raise TypeError(f"{c.param} must be {dtype_list(c.dtypes)}, got {t.dtype}")
            elif c.dtype_from is not None:
                source = arguments.get(c.dtype_from)
                want = source.dtype if isinstance(source, torch.Tensor) else source
                if t.dtype != want:
                    raise TypeError(
                        f"{c.param} must have dtype {want} (as {c.dtype_from}), got {t.dtype}"
                    )
            if device is None:
                device, first = t.device, c.param
            elif t.device != device:
                raise ValueError(f"{c.param} is on {t.device} but {first} is on {device}")
            if c.contiguous and nd and shape[-1] > 1 and t.stride(-1) != 1:
                raise ValueError(
                    f"{c.param} must be contiguous in its last dimension (stride 1), got "
                    f"strides {tuple(t.stride())}"
                )
            if c.like is not None:
                # Declared alike (residual and input): the same shape, merged dimensions too.
                same = arguments.get(c.like)
                if isinstance(same, torch.Tensor) and shape != same.shape:
                    raise ValueError(
                        f"{c.param} must have {c.like}'s shape {tuple(same.shape)}, got "
                        f"{tuple(shape)}"
                    )
                continue
            if not c.bind:
                continue
            sizes = shape if nd == len(c.dims) else _sizes(shape, len(c.dims))
            for axis, size in zip(c.dims, sizes, strict=True):
                known = axes.setdefault(axis, size)
                if known != size:
                    raise ValueError(self._shape_message(c, shape, axis, axes, arguments))

    def _shape_message(
        self,
        c: _Check,
        shape: torch.Size,
        axis: str,
        axes: dict[str, int],
        arguments: Mapping[str, Any],
    ) -> str:
        source = next(
            d.param
            for d in self.checks
            if d.bind and axis in d.dims and isinstance(arguments.get(d.param), torch.Tensor)
        )
        expected = ", ".join(str(axes[a]) if a in axes else a for a in c.dims)
        expected = f"({expected},)" if len(c.dims) == 1 else f"({expected})"
        return (
            f"{c.param} must have shape {expected} ([{', '.join(c.dims)}]: {axis} = "
            f"{axes[axis]} from {source}), got {tuple(shape)}"
        )


def _compile(
    checks: Sequence[_Check],
    fail: Callable[[Mapping[str, Any]], None],
    check: Callable[[Mapping[str, Any]], None] | None,
) -> Callable[[Mapping[str, Any]], None]:
    """`validate(arguments)` as straight-line Python made for these checks: `explain`'s
    conditions in its order, calling `fail(arguments)` (which explains) on the first that
    does not hold, then `check(arguments)`. Eager calls run it on every call: the loop of
    `explain` cost the norm 2-3 us of host time per call more than the hand-written checks it
    replaced (a 2-core CPU machine); this costs what they did."""
    env: dict[str, Any] = {"Tensor": torch.Tensor, "_sizes": _sizes, "fail": fail, "check": check}
    lines = ["def validate(arguments):", "    get = arguments.get"]
    sources = {c.dtype_from for c in checks}
    bound: dict[str, bool] = {}  # axis -> surely bound (else maybe: a local that may be None)
    axes_maybe = {a for c in checks for a in c.dims if c.bind}
    lines += [f"    a_{i} = None" for i, _ in enumerate(sorted(axes_maybe))]
    axis_var = {a: f"a_{i}" for i, a in enumerate(sorted(axes_maybe))}
    device = "none"  # "none", "sure" (local dev is set), "maybe" (dev may be None)
    lines.append("    dev = None")
    required: dict[str, str] = {}  # param -> local holding it (a tensor, surely)
    for i, c in enumerate(checks):
        t, pad = f"t{i}", "    "
        lines.append(f"{pad}{t} = get({c.param!r})")
        if c.optional:
            lines.append(f"{pad}if {t} is not None:")
            pad += "    "
        lines.append(f"{pad}if not isinstance({t}, Tensor): return False")
        lines.append(f"{pad}s = {t}.shape")
        lines.append(f"{pad}n = len(s)")
        if c.low == c.high:
            lines.append(f"{pad}if n != {c.low}: return False")
        else:
            lines.append(f"{pad}if n < {c.low} or n > {c.high}: return False")
        dtype = f"{t}.dtype"
        if c.param in sources and not c.optional:  # read once: later checks compare to it
            lines.append(f"{pad}d{i} = {t}.dtype")
            dtype = f"d{i}"
        if c.dtypes is not None:
            env[f"dtypes_{i}"] = c.dtypes
            lines.append(f"{pad}if {dtype} not in dtypes_{i}: return False")
        elif c.dtype_from is not None:
            source = required.get(c.dtype_from)
            if source is not None:
                lines.append(f"{pad}if {dtype} != d{source[1:]}: return False")
            else:
                lines.append(f"{pad}src = get({c.dtype_from!r})")
                lines.append(f"{pad}want = src.dtype if isinstance(src, Tensor) else src")
                lines.append(f"{pad}if {t}.dtype != want: return False")
        if device == "sure":
            lines.append(f"{pad}if {t}.device != dev: return False")
        elif device == "none" and not c.optional:
            lines.append(f"{pad}dev = {t}.device")
        else:
            lines.append(f"{pad}if dev is None: dev = {t}.device")
            lines.append(f"{pad}elif {t}.device != dev: return False")
        device = "sure" if device == "sure" or not c.optional else "maybe"
        if c.contiguous:
            n_ok = "" if c.low else "n and "
            lines.append(f"{pad}if {n_ok}s[-1] > 1 and {t}.stride(-1) != 1: return False")
        if c.like is not None:
            like = required.get(c.like)
            if like is None:  # optional: None, or checked above
                lines.append(f"{pad}like = get({c.like!r})")
            test = "" if like else "isinstance(like, Tensor) and "
            lines.append(f"{pad}if {test}s != {like or 'like'}.shape: return False")
        elif c.bind:
            n = len(c.dims)
            if c.low != n or c.high != n:
                lines.append(f"{pad}if n != {n}: s = _sizes(s, {n})")
            for k, axis in enumerate(c.dims):
                var = axis_var[axis]
                if bound.get(axis):
                    lines.append(f"{pad}if s[{k}] != {var}: return False")
                elif axis in bound:
                    lines.append(f"{pad}if {var} is None: {var} = s[{k}]")
                    lines.append(f"{pad}elif s[{k}] != {var}: return False")
                else:
                    lines.append(f"{pad}{var} = s[{k}]")
            for axis in c.dims:
                bound[axis] = bound.get(axis, False) or not c.optional
        if not c.optional:
            required[c.param] = t
    if check is not None:
        lines.append("    check(arguments)")
    source = "\n".join(lines).replace("return False", "return fail(arguments)")
    exec(source, env)  # noqa: S102 - our own source, made from the schema
    validate: Callable[[Mapping[str, Any]], None] = env["validate"]
    validate.__doc__ = source  # what runs, for a reader in a debugger
    return validate


def _sizes(shape: torch.Size, n: int) -> tuple[int, ...]:
    """The sizes of n axes read from a shape: leading dimensions merged into the first,
    missing leading ones read as 1 (a 1-D row of a [rows, width] op)."""
    if len(shape) > n:
        k = len(shape) - n + 1
        return (math.prod(shape[:k]), *shape[k:])
    return (1,) * (n - len(shape)) + tuple(shape)


# ----------------------------------------------------------------------------------------------
# Launch: the tuner's choice, or the reference
# ----------------------------------------------------------------------------------------------


inputs_of = tuple.__new__
"""`inputs_of(RMSNormInputs, (x, weight, ...))`: the NamedTuple of these values, every field
given, without the class's generated `__new__` (0.3 us of host time less per eager call on
the 2-core CPU machine: 0.18 us against 0.50 us; a list took 0.11 us)."""


def named(cls: type[T], inputs: Sequence[Any]) -> T:
    """`inputs` as the NamedTuple `cls`: itself on the eager path, else (the tuner's copies
    are lists) rebuilt; fields with defaults may be left off."""
    return inputs if type(inputs) is cls else cls(*inputs)


def field_index(cls: type[tuple[Any, ...]], name: str) -> int:
    """The position of field `name` of the NamedTuple `cls`: `DynamicDim(input_idx=...)`."""
    return cls._fields.index(name)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class KernelOp:
    """One op's launch: `op(inputs)` runs `reference(inputs)` where no kernel can run on the
    first input's device, else the (runner, tactic) `choose_one(name, runners, tuning, ...)`
    picks for the first `tuned` inputs (all when None; the rest are launch options such as
    PDL, not keyed on), launched directly with all of them. `name` (the tuner's op name, a
    key of its caches) may be given per call."""

    name: str
    runners: tuple[TunableRunner, ...]
    tuning: TuningConfig
    reference: Callable[[Any], Any]
    tuned: int | None = None
    kernels_available: Callable[[torch.device], bool] = field(
        default=platform.kernels_available, repr=False
    )

    def __call__(self, inputs: Sequence[Any], name: str | None = None) -> Any:
        if not self.kernels_available(inputs[0].device):
            return self.reference(inputs)
        keyed = inputs if self.tuned is None else inputs[: self.tuned]
        runner, tactic = choose_one(name or self.name, self.runners, self.tuning, keyed)
        return runner.forward(inputs, tactic)

    def choose(
        self, inputs: Sequence[Any], name: str | None = None
    ) -> tuple[TunableRunner, Tactic]:
        """The autotuner's (runner, tactic) for `inputs`."""
        keyed = inputs if self.tuned is None else inputs[: self.tuned]
        return choose_one(name or self.name, self.runners, self.tuning, keyed)


# ----------------------------------------------------------------------------------------------
# Eager or traced
# ----------------------------------------------------------------------------------------------


def _no_result(*args: Any, **kwargs: Any) -> None:
    return None


def traced(
    name: str,
    *,
    mutates: Sequence[str] = (),
    fake: Callable[..., Any] | None = None,
    schema: str | None = None,
    out: bool = False,
    spelled: tuple[Callable[..., Any], Callable[..., tuple[Any, ...]]] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the function runs directly in eager mode and as the torch custom op
    `flashtune::<name>` (made here, once, with its fake) under torch.compile. mutates: the
    arguments it writes; fake: the meta function (default: returns None, for an op that
    writes into its arguments only); schema: the custom op's schema where the annotations
    cannot give it. out=True: the last argument is an optional destination (None: the result
    is allocated); the custom op is the function without it (functional), its result copied
    into the destination. spelled=(op_fn, to_op): for a function taking a Python object a
    custom op cannot (RopeArgs): the custom op is op_fn, called with to_op(*arguments), so
    eager calls pass the object as it is. The decorated function keeps the custom op as
    `.custom_op`."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if spelled is not None:
            body, to_op = spelled
        else:
            # An `out` op's custom op is functional: fn without its trailing out argument.
            body, to_op = ((lambda *args: fn(*args, None)) if out else fn), None
        op = torch.library.custom_op(
            f"flashtune::{name}", body, mutates_args=tuple(mutates), schema=schema
        )
        op.register_fake(fake or _no_result)
        is_compiling = torch.compiler.is_compiling

        if out:

            def call(*args: Any) -> Any:
                if is_compiling():
                    *inputs, dest = args
                    result = op(*inputs)
                    return dest.copy_(result) if dest is not None else result
                return fn(*args)

        elif to_op is not None:

            def call(*args: Any) -> Any:
                return op(*to_op(*args)) if is_compiling() else fn(*args)

        else:

            def call(*args: Any) -> Any:
                return op(*args) if is_compiling() else fn(*args)

        functools.update_wrapper(call, fn)
        call.custom_op = op  # type: ignore[attr-defined]
        return call

    return wrap

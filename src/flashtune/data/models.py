"""The FlashInfer Trace data model: Definition, Solution, Workload, Trace, Evaluation.

Field names and JSON shapes follow the FlashInfer Trace format field for field. Unknown
fields are kept (``extra="allow"``) and fields absent from a file stay absent when it is
written back, so load -> dump -> load round-trips files written by other tools.
"""

from __future__ import annotations

import ast
import json
import math
import unicodedata
from enum import Enum
from pathlib import PurePosixPath, PureWindowsPath
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from flashtune.data.constraints import (
    CONSTRAINT_FUNCTIONS,
    ConstraintNotAllowed,
    check_constraint,
)

__all__ = [
    "DTYPES",
    "CONSTRAINT_FUNCTIONS",
    "check_path_component",
    "ConstAxis",
    "VarAxis",
    "Axis",
    "TensorSpec",
    "Definition",
    "SourceFile",
    "BuildSpec",
    "Solution",
    "RandomInput",
    "ScalarInput",
    "SafetensorsInput",
    "InputSpec",
    "Workload",
    "EvaluationStatus",
    "Correctness",
    "Performance",
    "Evaluation",
    "metrics_for_status",
    "correct_not_timed",
    "Trace",
    "dumps",
    "json_value",
    "LANGUAGES",
]

# FlashInfer-Bench's dtypes, plus float64 and uint8 (flashtune extensions: FlashInfer-Bench
# rejects them; see docs/compatibility.md).
DType = Literal[
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float4_e2m1",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
]
DTYPES: tuple[str, ...] = DType.__args__  # type: ignore[attr-defined]


# How FlashInfer-Bench writes non-finite floats (pydantic's ser_json_inf_nan="strings"): JSON
# has no NaN, so a bare NaN would make the file unreadable by strict JSON parsers.
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def json_value(value: Any) -> Any:
    """`value` with every NaN / infinite float replaced by FlashInfer-Bench's strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE[repr(value)]
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_value(v) for v in value]
    return value


def _in_key_order(model: Any, dumped: Any) -> Any:
    """`dumped` (model's JSON form) with each object's keys in the order the model was read
    with (new keys last), so a file written back keeps the key order it was read with, and
    without the fields a model writes only when known (`_absent_when_none`)."""
    if isinstance(model, _Model) and isinstance(dumped, dict):
        dumped = {
            k: v for k, v in dumped.items() if not (v is None and k in model._absent_when_none)
        }
        order = [k for k in model._key_order if k in dumped]
        keys = order + [k for k in dumped if k not in order]
        return {k: _in_key_order(getattr(model, k, None), dumped[k]) for k in keys}
    if isinstance(model, dict) and isinstance(dumped, dict):
        return {k: _in_key_order(model.get(k), v) for k, v in dumped.items()}
    if isinstance(model, list) and isinstance(dumped, list):
        return [_in_key_order(m, d) for m, d in zip(model, dumped, strict=False)]
    return dumped


class _Model(BaseModel):
    """Base: keep unknown fields, validate on assignment, dump only what was set, in the key
    order read; remember the text a model was read from (see `file_text`)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, populate_by_name=True)
    _absent_when_none: ClassVar[tuple[str, ...]] = ()
    _key_order: tuple[str, ...] = PrivateAttr(default=())
    _source: tuple[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_key_order(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        model = handler(data)
        if isinstance(data, dict):  # (on assignment `data` is the model itself)
            model._key_order = tuple(data)
        return model

    def __eq__(self, other: object) -> bool:
        # Equal content is equal whatever text or key order each was read with (pydantic's
        # own __eq__ compares private attributes too).
        if type(self) is not type(other):
            return NotImplemented
        assert isinstance(other, BaseModel)
        return self.__dict__ == other.__dict__ and self.model_extra == other.model_extra

    __hash__ = None  # type: ignore[assignment]  # mutable, as pydantic's models are

    def to_dict(self) -> dict[str, Any]:
        dumped = self.model_dump(mode="json", exclude_unset=True, by_alias=True)
        return json_value(_in_key_order(self, dumped))

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def remember_source(self, text: str, raw: Any) -> None:
        """Record the text (and its parsed JSON) this model was read from."""
        self._source = (text, json_value(raw))

    def file_text(self, indent: int | None = 2, end: str = "\n") -> str:
        """The text to write this model back with: the text it was read from, byte for byte,
        while its content is unchanged (a hand-formatted file stays as it was); else its JSON
        followed by `end`."""
        if self._source is not None and self._source[1] == self.to_dict():
            return self._source[0]
        return self.to_json(indent=indent) + end


def dumps(model: _Model, indent: int | None = 2) -> str:
    return model.to_json(indent=indent)


def check_path_component(value: str, field: str = "name") -> str:
    """Return `value` if it can be one component of a dataset path; else raise ValueError
    naming `field` and the value.

    Names (definition, op_type, solution, author) become folders and files of a Dataset;
    one holding `/`, `\\`, `..` or a drive would place files outside the dataset root.
    """
    problem = None
    if not value:
        problem = "is empty"
    elif value in {".", ".."}:
        problem = "is a relative path"
    elif "/" in value or "\\" in value:
        problem = "contains a path separator"
    elif PureWindowsPath(value).drive or PurePosixPath(value).is_absolute():
        problem = "is an absolute path"
    elif any(unicodedata.category(c) == "Cc" for c in value):
        problem = "contains a control character"
    if problem is not None:
        raise ValueError(
            f"{field} {value!r} {problem}; it names a dataset file or folder "
            "(no '/', '\\', '.', '..', drive or control characters)"
        )
    return value


# --------------------------------------------------------------------------- definitions


class ConstAxis(_Model):
    type: Literal["const"]
    value: int
    description: str | None = None

    @field_validator("value")
    @classmethod
    def _non_negative(cls, value: int) -> int:
        # FlashInfer-Bench allows 0 (an empty tensor); a negative size describes no tensor.
        if value < 0:
            raise ValueError(f"const axis value must be a non-negative integer, got {value}")
        return value


class VarAxis(_Model):
    type: Literal["var"]
    description: str | None = None


Axis = Annotated[Union[ConstAxis, VarAxis], Field(discriminator="type")]


class TensorSpec(_Model):
    """An input or output: `shape` lists axis names; None is a Python scalar, [] a 0-d tensor."""

    shape: list[str] | None
    dtype: DType
    description: str | None = None


# Why flashtune refuses constraints FlashInfer-Bench accepts (it only checks they parse).
_WHY_CONSTRAINTS = (
    " (flashtune evaluates constraints on the axes and inputs to synthesize valid inputs, "
    "and interprets them from a whitelist rather than running a stranger's code)"
)


def _check_python(source: str, what: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"{what} does not parse: {exc.msg} (line {exc.lineno})") from None


class Definition(_Model):
    """An operator's contract: axes, inputs, outputs, constraints and a reference `run`."""

    name: str
    op_type: str
    description: str | None = None
    tags: list[str] = Field(default_factory=list)
    axes: dict[str, Axis]
    constraints: list[str] = Field(default_factory=list)
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    reference: str

    @field_validator("axes", mode="before")
    @classmethod
    def _axis_types(cls, axes: Any) -> Any:
        # FlashInfer-Bench's own Python API (AxisVar(), AxisConst(value=N), then its save)
        # writes axes without "type": a "value" makes an axis const, none makes it var, as
        # FlashInfer-Bench reads them back. An axis's other fields pass unchanged.
        if not isinstance(axes, dict):
            return axes
        return {
            name: (
                {"type": "const" if "value" in axis else "var", **axis}
                if isinstance(axis, dict) and "type" not in axis
                else axis
            )
            for name, axis in axes.items()
        }

    @field_validator("name", "op_type")
    @classmethod
    def _non_empty(cls, value: str, info: ValidationInfo) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return check_path_component(value, info.field_name or "name")  # None only outside a field

    @field_validator("reference")
    @classmethod
    def _reference_defines_run(cls, source: str) -> str:
        # As FlashInfer-Bench checks it: a top-level `def run` (not `run = ...`, not async).
        tree = _check_python(source, "reference")
        if not any(isinstance(node, ast.FunctionDef) and node.name == "run" for node in tree.body):
            raise ValueError("reference must define a top-level function `def run(...)`")
        return source

    @field_validator("tags", "constraints")
    @classmethod
    def _no_empty_strings(cls, values: list[str]) -> list[str]:
        if any(not value for value in values):
            raise ValueError("must not hold an empty string")
        return values

    @field_validator("constraints")
    @classmethod
    def _constraints_parse(cls, constraints: list[str]) -> list[str]:
        # The form only (names are checked once axes and inputs are known, below): a
        # constraint is data for flashtune.data.constraints, never code to run.
        for i, expr in enumerate(constraints):
            try:
                check_constraint(expr)
            except ConstraintNotAllowed as exc:
                raise ValueError(
                    f"constraint [{i}] {expr!r} {exc.reason}{_WHY_CONSTRAINTS}"
                ) from None
        return constraints

    @model_validator(mode="after")
    def _shapes_use_declared_axes(self) -> Definition:
        both = set(self.inputs) & set(self.outputs)
        if both:
            raise ValueError(f"names used as both input and output: {sorted(both)}")
        for kind, specs in (("inputs", self.inputs), ("outputs", self.outputs)):
            for tensor_name, spec in specs.items():
                for axis in spec.shape or ():
                    if axis not in self.axes:
                        raise ValueError(
                            f"{kind}.{tensor_name}.shape names axis {axis!r}, which is not declared in "
                            f"axes (declared: {sorted(self.axes)})"
                        )
        # Constraints are evaluated on axes and inputs (outputs do not exist yet then).
        names = set(self.axes) | set(self.inputs)
        for i, expr in enumerate(self.constraints):
            try:
                check_constraint(expr, names)
            except ConstraintNotAllowed as exc:
                raise ValueError(
                    f"constraint [{i}] {expr!r} {exc.reason}{_WHY_CONSTRAINTS}"
                ) from None
        return self

    # convenience -------------------------------------------------------------------
    @property
    def const_axes(self) -> dict[str, int]:
        return {k: a.value for k, a in self.axes.items() if isinstance(a, ConstAxis)}

    @property
    def var_axes(self) -> list[str]:
        return [k for k, a in self.axes.items() if isinstance(a, VarAxis)]

    def tags_with(self, prefix: str) -> list[str]:
        return [t[len(prefix) :] for t in self.tags if t.startswith(prefix)]

    def contract(self) -> dict[str, Any]:
        """What a solution of this definition is written and judged against: name, op_type,
        axes (kinds and const values), constraints, inputs and outputs in order (a solution
        is called `run(*inputs)` and returns its outputs in that order; shapes and dtypes),
        the reference, and the `tol:` tags (the bench's tolerances). Descriptions and the
        other tags (`fi_api:`, `model:`: where the definition is used) describe it and are
        left out, so the same contract captured from a program, dumped from a schema or
        shipped in the bundled dataset compares equal."""
        return {
            "name": self.name,
            "op_type": self.op_type,
            "axes": {
                n: (a.type, a.value if isinstance(a, ConstAxis) else None)
                for n, a in sorted(self.axes.items())
            },
            "constraints": list(self.constraints),
            "inputs": [(n, s.shape, s.dtype) for n, s in self.inputs.items()],
            "outputs": [(n, s.shape, s.dtype) for n, s in self.outputs.items()],
            "reference": self.reference,
            "tags": sorted(t for t in self.tags if t.startswith("tol:")),
        }

    def contract_differences(self, other: Definition) -> list[str]:
        """How `other`'s contract differs from this one's, one phrase per difference, this
        one's first ("inputs.A: float16[M, K] vs bfloat16[M, K]"); [] when they are the
        same contract."""
        mine, theirs = self.contract(), other.contract()
        out: list[str] = []
        for key, value in mine.items():
            if theirs[key] == value:
                continue
            if key in ("inputs", "outputs"):
                here = {n: (shape, dtype) for n, shape, dtype in value}
                there = {n: (shape, dtype) for n, shape, dtype in theirs[key]}
                for name in [*here, *(n for n in there if n not in here)]:
                    a, b = here.get(name), there.get(name)
                    if a != b:
                        out.append(f"{key}.{name}: {_spec_text(a)} vs {_spec_text(b)}")
                if here == there:  # the same tensors in another order: another call
                    out.append(f"{key}: order {list(here)} vs {list(there)}")
            elif key == "reference":
                out.append("reference: another function")
            else:
                out.append(f"{key}: {value} vs {theirs[key]}")
        return out


def _spec_text(spec: tuple[list[str] | None, str] | None) -> str:
    if spec is None:
        return "absent"
    shape, dtype = spec
    return f"scalar {dtype}" if shape is None else f"{dtype}[{', '.join(shape)}]"


# --------------------------------------------------------------------------- solutions


def _safe_relative_path(path: str) -> str:
    p = PurePosixPath(path.replace("\\", "/"))
    if not path or p.is_absolute() or ".." in p.parts or (len(path) > 1 and path[1] == ":"):
        raise ValueError(f"unsafe source path {path!r}: must be relative, without '..'")
    return path


class SourceFile(_Model):
    path: str
    content: str

    @field_validator("path")
    @classmethod
    def _safe(cls, path: str) -> str:
        return _safe_relative_path(path)


# FlashInfer-Bench's languages, plus "torch" (older flashtune files: a Python solution).
Language = Literal["python", "triton", "cuda", "cpp", "tilelang", "torch"]
LANGUAGES: tuple[str, ...] = Language.__args__  # type: ignore[attr-defined]
# How cuda / cpp sources are bound to Python (FlashInfer-Bench: tvm-ffi when absent).
Binding = Literal["tvm-ffi", "torch"]


class BuildSpec(_Model):
    """How to build a solution. `entry_point` is "file.py::function" (a file among the
    sources) or the flashtune extension "package.module:function" (an installed package,
    no sources needed)."""

    language: Language
    target_hardware: list[str] = Field(default_factory=list)
    entry_point: str
    dependencies: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    # True: outputs are pre-allocated and passed after the inputs, `run(*inputs, *outputs)`.
    # False: `run(*inputs)` returns the outputs. Absent: True, as in FlashInfer-Bench, except
    # for a "package.module:function" entry point (flashtune's own form: value-returning).
    destination_passing_style: bool = True
    binding: Binding | None = None

    @model_validator(mode="after")
    def _importable_returns_values(self) -> BuildSpec:
        if "destination_passing_style" not in self.model_fields_set and self.is_importable:
            # Not marked as set: a file written back stays without the field.
            self.__dict__["destination_passing_style"] = False
        return self

    @field_validator("entry_point")
    @classmethod
    def _entry_point_form(cls, value: str) -> str:
        if "::" in value:
            file, _, func = value.partition("::")
            _safe_relative_path(file)
            if not func.isidentifier():
                raise ValueError(f"entry_point {value!r}: {func!r} is not a function name")
        elif ":" in value:
            module, _, func = value.partition(":")
            if not all(part.isidentifier() for part in module.split(".")) or not all(
                part.isidentifier() for part in func.split(".")
            ):
                raise ValueError(f"entry_point {value!r}: expected 'package.module:function'")
        else:
            raise ValueError(
                f"entry_point {value!r}: expected 'file.py::function' or 'package.module:function'"
            )
        return value

    @property
    def is_importable(self) -> bool:
        return "::" not in self.entry_point


class Solution(_Model):
    name: str
    definition: str
    author: str
    description: str | None = None
    spec: BuildSpec
    sources: list[SourceFile] = Field(default_factory=list)

    @field_validator("name", "definition", "author")
    @classmethod
    def _path_component(cls, value: str, info: ValidationInfo) -> str:
        # Each becomes a folder or file: solutions/<author>/<op_type>/<definition>/<name>.json
        # and traces/<author>/<op_type>/<definition>.jsonl.
        return check_path_component(value, info.field_name or "name")  # None only outside a field

    @model_validator(mode="after")
    def _entry_file_present(self) -> Solution:
        paths = [s.path for s in self.sources]
        if len(paths) != len(set(paths)):
            raise ValueError(
                f"duplicate source paths: {sorted(p for p in paths if paths.count(p) > 1)}"
            )
        if not self.spec.is_importable:
            entry_file = self.spec.entry_point.partition("::")[0]
            if entry_file not in paths:
                raise ValueError(
                    f"entry_point file {entry_file!r} is not among the sources {paths}"
                )
        return self


# --------------------------------------------------------------------------- workloads


class RandomInput(_Model):
    type: Literal["random"]


class ScalarInput(_Model):
    type: Literal["scalar"]
    value: Union[int, float, bool]


class SafetensorsInput(_Model):
    type: Literal["safetensors"]
    path: str
    tensor_key: str

    @field_validator("path")
    @classmethod
    def _no_absolute(cls, path: str) -> str:
        if PurePosixPath(path).is_absolute():
            raise ValueError(f"blob path {path!r} must be relative to the dataset root")
        return path


InputSpec = Annotated[
    Union[RandomInput, ScalarInput, SafetensorsInput], Field(discriminator="type")
]


class Workload(_Model):
    uuid: str = Field(min_length=1)
    axes: dict[str, int]
    inputs: dict[str, InputSpec] = Field(default_factory=dict)

    @field_validator("axes")
    @classmethod
    def _non_negative_axes(cls, axes: dict[str, int]) -> dict[str, int]:
        negative = {name: value for name, value in axes.items() if value < 0}
        if negative:
            raise ValueError(f"axis values must be non-negative, got {negative}")
        return axes

    def check_against(self, definition: Definition) -> None:
        """Raise ValueError if this workload does not fit `definition`."""
        unknown = set(self.axes) - set(definition.axes)
        if unknown:
            raise ValueError(
                f"workload {self.uuid}: unknown axes {sorted(unknown)} for {definition.name}"
            )
        missing = [a for a in definition.var_axes if a not in self.axes]
        if missing:
            raise ValueError(
                f"workload {self.uuid}: var axes {missing} of {definition.name} are not set"
            )
        for name, value in self.axes.items():
            if value < 0:
                raise ValueError(f"workload {self.uuid}: axis {name}={value} is negative")
            axis = definition.axes[name]
            if isinstance(axis, ConstAxis) and axis.value != value:
                raise ValueError(
                    f"workload {self.uuid}: axis {name}={value} but {definition.name} fixes it to {axis.value}"
                )
        unknown_inputs = set(self.inputs) - set(definition.inputs)
        if unknown_inputs:
            raise ValueError(
                f"workload {self.uuid}: unknown inputs {sorted(unknown_inputs)} for {definition.name}"
            )


# --------------------------------------------------------------------------- traces


class EvaluationStatus(str, Enum):
    PASSED = "PASSED"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    COMPILE_ERROR = "COMPILE_ERROR"
    TIMEOUT = "TIMEOUT"
    SKIPPED = "SKIPPED"


class Correctness(_Model):
    max_absolute_error: float | None = None
    max_relative_error: float | None = None
    matched_ratio: float | None = None
    # flashtune extension: ||out - ref||_2 / ||ref||_2, the worst over the outputs
    rel_norm_error: float | None = None
    # flashtune extension: the worst per-row ||out_row - ref_row|| / max(||ref_row||, floor)
    # over the outputs (rows: every dimension but the last; flashtune.bench.correctness)
    row_rel_norm_error: float | None = None
    # flashtune extensions: the element-wise tolerance matched_ratio was measured with (an
    # element matches when |out - ref| <= atol + rtol * |ref|), the loosest over the outputs
    # as the figures are the worst. Without it a matched_ratio proves nothing: 1.0 at atol=1
    # reads like 1.0 at atol=1.6e-2 (apply re-judges traces by it: flashtune.apply.table).
    # FlashInfer-Bench ignores fields it does not know, as it does rel_norm_error.
    atol: float | None = None
    rtol: float | None = None

    @field_validator("max_absolute_error", "max_relative_error")
    @classmethod
    def _non_negative_or_nan(cls, value: float | None) -> float | None:
        # As FlashInfer-Bench checks them: an error is never negative; NaN means unknown.
        if value is not None and value < 0:
            raise ValueError(f"must be non-negative or NaN, got {value}")
        return value

    # FlashInfer-Bench's metrics are floats (null is invalid there): one not measured is
    # written as absent, which it reads as its default.
    _absent_when_none: ClassVar[tuple[str, ...]] = ("max_absolute_error", "max_relative_error")


class Performance(_Model):
    # FlashInfer-Bench's three fields default to 0.0 and are never negative.
    latency_ms: float = Field(default=0.0, ge=0.0)
    latency_spread_ms: float | None = None
    reference_latency_ms: float | None = Field(default=None, ge=0.0)
    speedup_factor: float | None = Field(default=None, ge=0.0)
    baseline_solution: str | None = None
    baseline_latency_ms: float | None = None
    speedup_vs_baseline: float | None = None
    # flashtune extensions (see flashtune.timing.measure_robust): how latency was measured
    # ("cuda_graph", "cuda_events" or "cpu"), each trial's median, calls per timed sample,
    # and how the reference was measured.
    timing_method: str | None = None
    timing_trials_ms: list[float] | None = None
    timing_calls_per_sample: int | None = None
    # How many timed samples were checked call by call (bench/checked_timing.py).
    timing_checked_samples: int | None = None
    reference_timing_method: str | None = None
    # The 95% confidence intervals [low, high] of latency_ms and reference_latency_ms (each a
    # median: `flashtune.timing.median_ci`, order statistics of the samples, so no shape of
    # the distribution is assumed). The reports claim a speedup only where the intervals do
    # not overlap (report/tables.py); FlashInfer-Bench ignores these fields.
    latency_ci_ms: tuple[float, float] | None = None
    reference_latency_ci_ms: tuple[float, float] | None = None

    _absent_when_none: ClassVar[tuple[str, ...]] = ("reference_latency_ms", "speedup_factor")


# FlashInfer-Bench's rule, by status: which metrics an evaluation carries (True: must,
# False: must not). Every other status (errors, TIMEOUT, flashtune's SKIPPED) carries none,
# except that flashtune's SKIPPED may carry a correctness (below).
_METRICS_BY_STATUS: dict[str, tuple[bool, bool]] = {  # status -> (correctness, performance)
    "PASSED": (True, True),
    "INCORRECT_NUMERICAL": (True, False),
}
# SKIPPED is flashtune's status (kept in skipped/, where FlashInfer-Bench does not read), so
# its rule is flashtune's: a SKIPPED evaluation with a correctness is a solution that was
# checked correct but not timed (a Triton solution run in Triton's interpreter on a CPU,
# bench/interpreter.py). It is not PASSED because PASSED must carry a performance, and a
# latency of 0 would rank first in FlashInfer-Bench's `best` and in apply.
_CORRECTNESS_OPTIONAL = frozenset({"SKIPPED"})


def correct_not_timed(evaluation: Evaluation | None) -> bool:
    """Whether `evaluation` is a solution checked correct but not timed: SKIPPED, with a
    correctness (its reason says where it was checked)."""
    return (
        evaluation is not None
        and evaluation.status.value in _CORRECTNESS_OPTIONAL
        and evaluation.correctness is not None
    )


def metrics_for_status(
    status: EvaluationStatus, correctness: Correctness | None, performance: Performance | None
) -> tuple[Correctness | None, Performance | None]:
    """The (correctness, performance) an evaluation of `status` carries under
    FlashInfer-Bench's rule: figures the status does not carry are dropped, and a required
    correctness that was not measured (an output checked by distribution, inputs written
    into) is an empty one, which FlashInfer-Bench reads as its defaults."""
    wants_correctness, wants_performance = _METRICS_BY_STATUS.get(status.value, (False, False))
    if wants_correctness and correctness is None:
        correctness = Correctness()
    keep = wants_correctness or status.value in _CORRECTNESS_OPTIONAL
    return (
        correctness if keep else None,
        performance if wants_performance else None,
    )


class Evaluation(_Model):
    status: EvaluationStatus
    environment: dict[str, Any] = Field(default_factory=dict)
    timestamp: str = Field(min_length=1)
    log: str = ""
    reason: str | None = None
    # flashtune extension: content hash of the solution evaluated (what --resume matches on).
    solution_hash: str | None = None
    correctness: Correctness | None = None
    performance: Performance | None = None

    @field_validator("environment")
    @classmethod
    def _hardware_named(cls, environment: dict[str, Any]) -> dict[str, Any]:
        hardware = environment.get("hardware")
        if "hardware" in environment and not (isinstance(hardware, str) and hardware):
            raise ValueError(f"environment.hardware must be a non-empty string, got {hardware!r}")
        libs = environment.get("libs", {})
        # (null: a library that is not installed; FlashInfer-Bench wants strings only)
        if not (
            isinstance(libs, dict) and all(isinstance(v, (str, type(None))) for v in libs.values())
        ):
            raise ValueError(f"environment.libs must map library names to versions, got {libs!r}")
        return environment

    @model_validator(mode="after")
    def _metrics_match_status(self) -> Evaluation:
        # As FlashInfer-Bench validates it (see metrics_for_status).
        wanted = _METRICS_BY_STATUS.get(self.status.value, (False, False))
        for field, want in zip(("correctness", "performance"), wanted, strict=True):
            present = getattr(self, field) is not None
            if want and not present:
                raise ValueError(
                    f"an evaluation with status {self.status.value} must include {field}"
                )
            optional = field == "correctness" and self.status.value in _CORRECTNESS_OPTIONAL
            if present and not want and not optional:
                raise ValueError(
                    f"an evaluation with status {self.status.value} must not include {field}"
                )
        return self


class Trace(_Model):
    definition: str
    workload: Workload
    solution: str | None = None
    evaluation: Evaluation | None = None
    # flashtune extension: the harness's HMAC over the rest of the trace, made by the
    # runner with this user's key (flashtune.data.signing: {"alg", "key_id", "mac"}); apply
    # trusts only traces whose MAC verifies. FlashInfer-Bench ignores it.
    signature: dict[str, Any] | None = None

    @field_validator("definition")
    @classmethod
    def _definition_is_path_component(cls, value: str) -> str:
        # traces/<author>/<op_type>/<definition>.jsonl
        return check_path_component(value, "definition")

"""The shared call path (flashtune.ops.call): schema-driven checks, the kernel-or-reference
launch, the eager/compiled choice."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
import torch

from flashtune.ops.call import (
    FLOATS,
    KernelOp,
    SchemaChecks,
    check_tensor,
    field_index,
    inputs_of,
    named,
    traced,
)
from flashtune.schema import Const, OpSchema, Tensor, Var
from flashtune.tune import DEFAULT_TACTIC, DynamicDim, TunableRunner, TuningConfig


def _ref(x, w, bias=None):
    return x @ w.T


# A toy GEMM-like op: x [rows, k] (3-D merges into rows), w [n, k], bias [n] optional, an
# int64 index, and the output `out` [rows, n].
TOY = OpSchema(
    op_type="toy",
    name_prefix="toy",
    axes={"rows": Var(), "n": Const(abbrev="n"), "k": Const(abbrev="k")},
    inputs={
        "x": Tensor(["rows", "k"], dtype_from="x"),
        "w": Tensor(["n", "k"], dtype_from="x"),
        "bias": Tensor(["n"], dtype_from="x", optional=True),
        "idx": Tensor(["rows"], dtype="int64", optional=True),
    },
    outputs={"y": Tensor(["rows", "n"], dtype_from="x")},
    reference=_ref,
)
CHECKS = SchemaChecks(
    TOY,
    dtypes={"x": FLOATS, "idx": (torch.int32, torch.int64)},
    ranks={"x": (2, 3)},
    outputs={"y": "out"},
    contiguous=("x", "y"),
)


def _args(**kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"x": torch.randn(4, 8), "w": torch.randn(6, 8)}
    args.update(kw)
    return args


BAD = [
    # (arguments, exception, message pattern)
    (_args(x=[1.0]), TypeError, r"x must be a torch.Tensor, got list"),
    (_args(w=None), TypeError, r"w must be a torch.Tensor, got NoneType"),
    (_args(x=torch.randn(8)), ValueError, r"x must be 2-D \[rows, k\] or 3-D .*got shape \(8,\)"),
    (_args(w=torch.randn(6, 8, 1)), ValueError, r"w must be 2-D \[n, k\], got shape"),
    (
        _args(x=torch.ones(4, 8, dtype=torch.int32)),
        TypeError,
        r"x must be float16, bfloat16 or float32, got torch.int32",
    ),
    (
        _args(w=torch.randn(6, 8).half()),
        TypeError,
        r"w must have dtype torch.float32 \(as x\), got torch.float16",
    ),
    (
        _args(w=torch.randn(6, 9)),
        ValueError,
        r"w must have shape \(6, 8\) \(\[n, k\]: k = 8 from x\), got \(6, 9\)",
    ),
    (
        _args(bias=torch.randn(5)),
        ValueError,
        r"bias must have shape \(6,\) \(\[n\]: n = 6 from w\), got \(5,\)",
    ),
    (_args(idx=torch.zeros(4)), TypeError, r"idx must be int32 or int64, got torch.float32"),
    (_args(idx=torch.zeros(3, dtype=torch.int32)), ValueError, r"idx must have shape \(4,\)"),
    (_args(w=torch.randn(6, 8, device="meta")), ValueError, r"w is on meta but x is on cpu"),
    (_args(x=torch.randn(8, 4).t()), ValueError, r"x must be contiguous in its last dimension"),
    (_args(out=torch.randn(4, 5)), ValueError, r"out must have shape \(4, 6\)"),
    (_args(out=torch.randn(6, 4).t()), ValueError, r"out must be contiguous"),
    (_args(out=torch.randn(4, 6).double()), TypeError, r"out must have dtype torch.float32"),
]


@pytest.mark.parametrize("args,exc,pattern", BAD)
def test_bad_arguments_get_clear_errors(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        CHECKS.validate(args)
    # The generated checks and the readable ones agree.
    with pytest.raises(exc, match=pattern):
        CHECKS.explain(args)


GOOD = [
    _args(),
    _args(x=torch.randn(2, 2, 8), out=torch.empty(4, 6)),
    _args(bias=torch.randn(6), idx=torch.zeros(4, dtype=torch.int64)),
    _args(w=torch.randn(8, 6).t()),  # w may have any strides
    _args(x=torch.randn(0, 8), out=torch.empty(0, 6)),
]


@pytest.mark.parametrize("args", GOOD)
def test_good_arguments_pass(args):
    # Both paths accept the call: the generated validate and the readable explain return
    # None without raising (a wrong check would raise here).
    assert CHECKS.validate(args) is None
    assert CHECKS.explain(args) is None


def test_tensors_declared_alike_have_the_same_shape():
    """Two specs with the same axes, one of them merging leading dimensions: the shapes
    must be equal, not only the merged sizes."""
    schema = OpSchema(
        op_type="toy",
        name_prefix="alike",
        axes={"rows": Var(), "h": Const(abbrev="h")},
        inputs={
            "a": Tensor(["rows", "h"], dtype_from="a"),
            "b": Tensor(["rows", "h"], dtype_from="a"),
        },
        outputs={"y": Tensor(["rows", "h"], dtype_from="a")},
        reference=_ref,
    )
    checks = SchemaChecks(schema, ranks={"a": (2, 3), "b": (2, 3)})
    checks.validate({"a": torch.randn(2, 2, 4), "b": torch.randn(2, 2, 4)})
    with pytest.raises(ValueError, match=r"b must have a's shape \(2, 2, 4\), got \(4, 4\)"):
        checks.validate({"a": torch.randn(2, 2, 4), "b": torch.randn(4, 4)})


def test_the_op_hook_runs_after_the_schema_checks():
    seen = []
    checks = SchemaChecks(TOY, dtypes={"x": FLOATS}, check=lambda a: seen.append(sorted(a)))
    checks.validate(_args())
    assert seen == [["w", "x"]]
    with pytest.raises(TypeError):
        checks.validate(_args(x=1))
    assert len(seen) == 1


def test_a_declaration_naming_no_spec_is_refused():
    with pytest.raises(ValueError, match="no tensor spec 'nope'"):
        SchemaChecks(TOY, dtypes={"nope": FLOATS})


def test_check_tensor():
    t = torch.randn(3, 4)
    assert check_tensor("t", t, FLOATS, t.device, "q", contiguous=True) is t
    with pytest.raises(TypeError, match="t must be a torch.Tensor, got int"):
        check_tensor("t", 3)
    with pytest.raises(TypeError, match="t must be int32 or int64, got torch.float32"):
        check_tensor("t", t, (torch.int32, torch.int64))
    with pytest.raises(ValueError, match="t is on cpu but q is on meta"):
        check_tensor("t", t, device=torch.device("meta"), device_of="q")


# ------------------------------------------------------------------------------ KernelOp


class _Inputs(NamedTuple):
    x: torch.Tensor
    out: torch.Tensor
    scale: float
    flag: bool = False  # a launch option: not keyed on


class _Runner(TunableRunner):
    calls: list[Any] = []

    def get_valid_tactics(self, inputs, profile):
        return []

    def forward(self, inputs, tactic=DEFAULT_TACTIC):
        a = named(_Inputs, inputs)
        type(self).calls.append((type(inputs).__name__, a.flag, tactic))
        return a.out.copy_(a.x * a.scale)


def test_kernel_op_launches_the_choice_or_runs_the_reference(monkeypatch):
    chosen = []

    def fake_choose(name, runners, tuning, inputs):
        chosen.append((name, len(inputs)))
        return runners[0], DEFAULT_TACTIC

    monkeypatch.setattr("flashtune.ops.call.choose_one", fake_choose)
    tuning = TuningConfig(dynamic_dims=(DynamicDim(input_idx=field_index(_Inputs, "x"), dim=0),))
    refs = []
    op = KernelOp(
        "toy",
        (_Runner(),),
        tuning,
        reference=refs.append,
        tuned=3,
        kernels_available=lambda d: True,
    )
    x = torch.randn(3)
    inputs = inputs_of(_Inputs, (x, torch.empty(3), 2.0, True))
    assert isinstance(inputs, _Inputs) and inputs.flag
    torch.testing.assert_close(op(inputs), x * 2)
    assert chosen == [("toy", 3)]  # the tuner keys on the first `tuned` inputs only
    assert _Runner.calls[-1] == ("_Inputs", True, DEFAULT_TACTIC)
    op(inputs, name="toy_other")
    assert chosen[-1] == ("toy_other", 3)
    # The tuner's copies are lists: the runner reads them by name all the same.
    _Runner().forward([x, torch.empty(3), 1.0])
    assert _Runner.calls[-1] == ("list", False, DEFAULT_TACTIC)

    cpu = KernelOp(
        "toy", (_Runner(),), tuning, reference=refs.append, kernels_available=lambda d: False
    )
    cpu(inputs)
    assert refs == [inputs]


# -------------------------------------------------------------------------------- traced


@traced("test_call_scale_into", mutates=("out",))
def _scale_into(x: torch.Tensor, out: torch.Tensor, scale: float) -> None:
    out.copy_(x * scale)


def _scaled_fake(x, scale):
    return torch.empty_like(x)


@traced("test_call_scaled", fake=_scaled_fake, schema="(Tensor x, float scale) -> Tensor", out=True)
def _scaled(x: torch.Tensor, scale: float, out: torch.Tensor | None) -> torch.Tensor:
    y = x * scale
    return out.copy_(y) if out is not None else y


def test_traced_runs_directly_in_eager_mode_and_as_a_custom_op_when_compiled():
    x = torch.randn(5)
    out = torch.empty(5)
    _scale_into(x, out, 3.0)
    torch.testing.assert_close(out, x * 3)
    assert _scale_into.custom_op is not None
    torch.testing.assert_close(_scaled(x, 2.0, None), x * 2)

    def block(x):
        out = torch.empty_like(x)
        _scale_into(x, out, 2.0)
        dest = torch.empty_like(x)
        _scaled(out, 0.5, dest)
        return dest + _scaled(x, 1.0, None)

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), block(x))
    results = torch.library.opcheck(torch.ops.flashtune.test_call_scaled.default, (x, 2.0))
    assert set(results.values()) == {"SUCCESS"}

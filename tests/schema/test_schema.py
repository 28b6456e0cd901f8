"""Schemas: Definitions built from arguments without running a kernel, naming, the dump
switch, hooks, and the cost of the call wrapper."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flashtune.data import Definition, run_reference, small_workload, synthesize_inputs
from flashtune.schema import (
    NOT_HANDLED,
    Const,
    OpSchema,
    Scalar,
    Tensor,
    Var,
    add_hook,
    api,
    refresh_hooks,
    remove_hook,
)


def scale_ref(x, w, bias=None, beta=None, alpha=1.0):
    y = x.float() * w.float() * alpha
    if bias is not None:
        y = y + bias * (beta if beta is not None else 1.0)
    return y.to(x.dtype)


SCALE = OpSchema(
    op_type="scale",
    name_prefix="scale",
    axes={
        "rows": Var("rows"),
        "hidden": Const("hidden size", abbrev="h"),
        "groups": Const(abbrev="g", param="groups"),
    },
    inputs={
        "x": Tensor(["rows", "hidden"], dtype_from="input", param="input"),
        "w": Tensor(["hidden"], dtype_from="input", param="weight"),
        "bias": Tensor(["hidden"], dtype="float32", optional=True),
        "beta": Scalar("float32", optional=True),
    },
    outputs={"y": Tensor(["rows", "hidden"], dtype_from="input")},
    reference=scale_ref,
    bound=("alpha",),
    constraints=["rows >= 0"],
    tags=["demo"],
)

calls: list[int] = []


@api(schema=SCALE)
def scale(input, weight, groups=1, bias=None, beta=None, alpha=1.0):
    calls.append(1)
    return scale_ref(input, weight, bias, beta, alpha=alpha)


def test_definition_from_meta_tensors_runs_no_kernel() -> None:
    calls.clear()
    x = torch.empty(3, 7, 64, dtype=torch.bfloat16, device="meta")  # 3-D: rows = 3 * 7
    w = torch.empty(64, dtype=torch.bfloat16, device="meta")
    d = scale.definition(x, w, groups=4, alpha=0.5)
    assert calls == []
    assert isinstance(d, Definition)
    assert d.name == "scale_h64_g4"
    assert d.const_axes == {"hidden": 64, "groups": 4}
    assert d.var_axes == ["rows"]
    assert d.inputs["x"].dtype == "bfloat16" and d.inputs["x"].shape == ["rows", "hidden"]
    assert "bias" not in d.inputs  # optional and not given
    assert d.outputs["y"].dtype == "bfloat16"
    assert d.tags == ["demo"] and d.constraints == ["rows >= 0"]
    assert "alpha=0.5" in d.description


def test_emitted_reference_runs_with_bound_arguments() -> None:
    x = torch.randn(5, 8)
    d = scale.definition(x, torch.randn(8), alpha=3.0, bias=torch.randn(8), beta=0.5)
    inputs = synthesize_inputs(d, small_workload(d), seed=0)
    out = run_reference(d, inputs)["y"]
    torch.testing.assert_close(
        out, inputs["x"] * inputs["w"] * 3.0 + inputs["bias"] * inputs["beta"]
    )
    plain = scale.definition(x, torch.randn(8))
    assert "bias" not in plain.reference.split("def run(")[1].split(")")[0]
    # round-trips as JSON
    assert Definition.model_validate_json(d.to_json()) == d


def test_disagreeing_shapes_are_named() -> None:
    with pytest.raises(ValueError, match="axis 'hidden' is 8 .* but 9 from weight"):
        scale.definition(torch.randn(2, 8), torch.randn(9))


def test_missing_tensor_argument_is_named() -> None:
    with pytest.raises(ValueError, match="argument 'weight'"):
        scale.definition(torch.randn(2, 8), None)


def test_schema_rejects_undeclared_axis() -> None:
    with pytest.raises(ValueError, match="undeclared axis 'nope'"):
        OpSchema(
            "t",
            "t",
            {"a": Var()},
            {"x": Tensor(["nope"], dtype="float32")},
            {},
            reference=scale_ref,
        )


def test_hooks_observe_and_can_replace_results() -> None:
    seen = []

    def observer(op, args, kwargs):
        seen.append(op.bind(*args, **kwargs).var_axes)
        return NOT_HANDLED

    def replacer(op, args, kwargs):
        return "replaced"

    add_hook(observer)
    try:
        scale(torch.randn(3, 4), torch.randn(4))
        assert seen == [{"rows": 3}]
        add_hook(replacer)
        assert scale(torch.randn(3, 4), torch.randn(4)) == "replaced"
    finally:
        remove_hook(observer)
        remove_hook(replacer)
    assert isinstance(scale(torch.randn(3, 4), torch.randn(4)), torch.Tensor)


def test_dump_definitions_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHTUNE_DUMP_DEFINITIONS", "1")
    monkeypatch.setenv("FLASHTUNE_DUMP_DIR", str(tmp_path))
    refresh_hooks()
    try:
        for rows in (1, 2, 3):
            scale(torch.randn(rows, 16), torch.randn(16))
        scale(torch.randn(2, 32), torch.randn(32))
    finally:
        monkeypatch.delenv("FLASHTUNE_DUMP_DEFINITIONS")
        refresh_hooks()
    files = sorted(p.name for p in (tmp_path / "scale").iterdir())
    assert files == ["scale_h16_g1.json", "scale_h32_g1.json"]  # once per unique name
    assert (
        json.loads((tmp_path / "scale" / "scale_h16_g1.json").read_text())["name"] == "scale_h16_g1"
    )


def test_first_call_inside_torch_compile_traces_past_hooks() -> None:
    import importlib

    api_module = importlib.import_module(
        "flashtune.schema.api"
    )  # `api` in the package is the decorator

    # The state of a fresh process: the FLASHTUNE_* switches not read yet, hooks pending.
    with api_module._HOOKS.lock:
        api_module._HOOKS.env_read = False
        api_module._HOOKS.rebuild()
    calls.clear()  # dynamo guards on the global list the toy op appends to: keep it short
    compiled = torch.compile(
        lambda x, w: scale(x, w, alpha=2.0), fullgraph=True, backend="aot_eager"
    )
    x, w = torch.randn(3, 8), torch.randn(8)
    torch.testing.assert_close(compiled(x, w), x * w * 2.0)

"""The fp8 GEMM schemas against FlashInfer-Trace's `bmm_fp8`, `gemm_fp8_nt_groupwise` and
`batch_deepgemm_fp8_nt_groupwise` Definitions (tests/ops/data/gemm_fp8: produced by FlashInfer's own trace templates, see the
README there): the same name, op type, description, axes, inputs, outputs and constraints;
every scale layout FlashInfer takes maps to the one Definition; calls no Definition describes
are refused; the Definitions' references compute what the ops compute."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from flashtune.data import run_reference
from flashtune.model_shapes import get_model
from flashtune.ops.gemm.fp8 import (
    batch_deepgemm_fp8_nt_groupwise,
    bmm_fp8,
    fp8_gemm_examples,
    gemm_fp8_nt_groupwise,
)
from flashtune.ops.gemm.fp8.reference import block_scaled_mm_ref, bmm_fp8_ref

DATA = Path(__file__).parent / "data" / "gemm_fp8"
EXPECTED = sorted(p.stem for p in DATA.glob("*.json"))
FP8 = torch.float8_e4m3fn


def _expected(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def _ours() -> dict[str, list]:
    """Definitions of the model examples of the models the expected files were made at."""
    out: dict[str, list] = {}
    for model in ("deepseek-v3-tp8", "llama-3.1-8b"):
        for op, args, kwargs in fp8_gemm_examples(get_model(model)):
            d = op.definition(*args, **kwargs)
            out.setdefault(d.name, []).append(d)
    return out


def _fields(specs) -> dict:
    return {k: v.model_dump(exclude_none=True) for k, v in specs.items()}


def _no_nulls(specs: dict) -> dict:
    return {k: {f: x for f, x in v.items() if x is not None} for k, v in specs.items()}


def test_expected_files_are_here():
    assert len(EXPECTED) == 6


@pytest.mark.parametrize("name", EXPECTED)
def test_definitions_equal_flashinfer_traces(name):
    expected = _expected(name)
    (ours,) = {d.to_json(): d for d in _ours()[name]}.values()
    assert ours.name == expected["name"]
    assert ours.op_type == expected["op_type"]
    assert ours.description == expected["description"]
    assert _fields(ours.axes) == expected["axes"]
    assert list(ours.axes) == list(expected["axes"])  # same order, so the same name
    assert _fields(ours.inputs) == _no_nulls(expected["inputs"])
    assert list(ours.inputs) == list(expected["inputs"])
    assert _fields(ours.outputs) == _no_nulls(expected["outputs"])
    assert ours.constraints == expected.get("constraints", [])
    # Tags: the same function (FlashInfer-Trace names its defining module gemm.gemm_base,
    # flashtune the module FlashInfer 0.2.14 exports it from, which apply's mirror patches);
    # the rest are the template's.
    (fi_api,) = [t for t in ours.tags if t.startswith("fi_api:")]
    (theirs,) = [t for t in expected["tags"] if t.startswith("fi_api:")]
    assert fi_api.rsplit(".", 1)[1] == theirs.rsplit(".", 1)[1]
    assert fi_api.startswith("fi_api:flashinfer.gemm.")
    assert set(ours.tags) - {fi_api} <= set(expected["tags"])


def _groupwise_call(m=3, n=576, k=7168):
    a, b = torch.empty(m, k, dtype=FP8), torch.empty(n, k, dtype=FP8)
    sa = torch.rand(m, math.ceil(k / 128))
    sb = torch.rand(math.ceil(n / 128), math.ceil(k / 128))
    return a, b, sa, sb


def test_every_scale_layout_has_the_one_definition():
    a, b, sa, sb = _groupwise_call()
    k_major = gemm_fp8_nt_groupwise.definition(a, b, sa, sb, "K")
    mn_major = gemm_fp8_nt_groupwise.definition(a, b, sa.T.contiguous(), sb.T.contiguous(), "MN")
    trtllm = gemm_fp8_nt_groupwise.definition(a, b, sa.T.contiguous(), sb, "MN", backend="trtllm")
    assert k_major == mn_major == trtllm
    assert k_major.name == "gemm_fp8_nt_groupwise_n576_k7168"
    call = gemm_fp8_nt_groupwise.bind(a, b, sa.T.contiguous(), sb.T.contiguous(), "MN")
    assert call.axes["K_div_block"] == 56 and call.axes["N_div_block"] == 5
    torch.testing.assert_close(call.inputs["a_scale"], sa)  # the canonical view
    torch.testing.assert_close(call.inputs["b_scale"], sb)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scale_major_mode": "K", "out_dtype": torch.float16},
        {"scale_major_mode": "K", "scale_granularity_mnk": (128, 128, 128)},
    ],
    ids=["fp16_out", "blockscaled"],
)
def test_calls_without_a_definition_are_refused(kwargs):
    a, b, sa, sb = _groupwise_call()
    if kwargs.get("scale_granularity_mnk"):
        sa = torch.rand(1, 56)
    with pytest.raises(ValueError, match="no Definition"):
        gemm_fp8_nt_groupwise.definition(a, b, sa, sb, **kwargs)
    A, B = torch.empty(2, 4, 128, dtype=FP8), torch.empty(2, 128, 64, dtype=FP8)
    with pytest.raises(ValueError, match="no Definition"):
        bmm_fp8.definition(A, B, torch.rand(()), torch.rand(()), torch.float16)


def test_bmm_fp8_call_with_0dim_scales():
    """FlashInfer's tests pass 0-dim scales (to_float8's reciprocal): the Definition's
    `scalar` axis is 1 and the dtype scalar the enum."""
    A = torch.empty(16, 7, 128, dtype=FP8)
    B = torch.empty(16, 512, 128, dtype=FP8).transpose(1, 2)
    call = bmm_fp8.bind(A, B, torch.rand(()), torch.rand(()), torch.bfloat16)
    assert call.name == "bmm_fp8_N512_K128"
    assert call.axes == {"batch_size": 16, "M": 7, "K": 128, "N": 512, "scalar": 1}
    assert call.inputs["dtype"] == 1


def test_references_compute_what_the_ops_compute():
    """The Definitions' emitted references, run on real inputs, against the ops' own
    references (the kernels are checked against those in test_gemm_fp8.py)."""
    a = torch.randn(5, 300).to(FP8)
    b = torch.randn(200, 300).to(FP8)
    sa, sb = torch.rand(5, 3) + 0.5, torch.rand(2, 3) + 0.5
    definition = gemm_fp8_nt_groupwise.definition(a, b, sa, sb, "K")
    got = run_reference(definition, {"a": a, "b": b, "a_scale": sa, "b_scale": sb})["out"]
    torch.testing.assert_close(got, block_scaled_mm_ref(a, b, sa, sb), atol=0, rtol=0)

    A = torch.randn(3, 4, 64).to(FP8)
    B = torch.randn(3, 64, 24).to(FP8)
    s1, s2 = torch.rand(1) + 0.1, torch.rand(1) + 0.1
    definition = bmm_fp8.definition(A, B, s1, s2, torch.bfloat16)
    inputs = {"A": A, "B": B, "A_scale": s1, "B_scale": s2, "dtype": 1}
    got = run_reference(definition, inputs)["C"]
    expected = (torch.matmul(A.float(), B.float()) * (s1 * s2)).to(torch.bfloat16)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    torch.testing.assert_close(got, bmm_fp8_ref(A, B, s1, s2, torch.bfloat16), atol=0, rtol=0)

    a3, b3 = torch.randn(3, 6, 300).to(FP8), torch.randn(3, 130, 300).to(FP8)
    sa3, sb3 = torch.rand(3, 6, 3) + 0.5, torch.rand(3, 2, 3) + 0.5
    masked_m = torch.tensor([0, 4, 6], dtype=torch.int32)
    definition = batch_deepgemm_fp8_nt_groupwise.definition(a3, b3, sa3, sb3, masked_m, 4)
    inputs = {"a": a3, "b": b3, "a_scale": sa3, "b_scale": sb3, "masked_m": masked_m}
    got = run_reference(definition, {**inputs, "expected_m": 4})["out"]
    expected = block_scaled_mm_ref(a3, b3, sa3, sb3)
    expected[0] = 0
    expected[1, 4:] = 0
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


@pytest.mark.interpreter
def test_a_call_from_the_definitions_inputs_runs():
    """The Definition's inputs (the dtype as its enum) are a valid call of the op."""
    A = torch.randn(2, 3, 64).to(FP8)
    B = torch.randn(2, 64, 16).to(FP8)
    s1, s2 = torch.rand(1) + 0.1, torch.rand(1) + 0.1
    C = bmm_fp8(A=A, B=B, A_scale=s1, B_scale=s2, dtype=1)
    assert C.dtype == torch.bfloat16
    assert bmm_fp8.definition(A, B, s1, s2, 1).name == "bmm_fp8_N16_K64"


def test_tune_targets_remake_fp8_operands():
    """`flashtune tune --ops gemm_fp8_nt_groupwise,bmm_fp8`: the re-made calls keep the fp8
    operands (the tune dtype is the activations') and run."""
    from flashtune.tune.targets import tune_targets

    targets = tune_targets(fp8_gemm_examples(get_model("deepseek-v3-tp8")))
    assert {"gemm_fp8_nt_groupwise", "bmm_fp8"} <= set(targets)
    call = targets["gemm_fp8_nt_groupwise"][0]
    arguments = call.arguments(5, torch.bfloat16, "cpu")
    assert arguments["a"].dtype == FP8 and arguments["a"].shape[0] == 5
    assert arguments["a_scale"].dtype == torch.float32
    bmm = targets["bmm_fp8"][0].arguments(2, torch.bfloat16, "cpu")
    assert bmm["A"].dtype == FP8 and bmm["B"].dtype == FP8

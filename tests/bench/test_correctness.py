"""Tolerances, element-wise comparison and the distribution check for sampling ops."""

from __future__ import annotations

import pytest
import torch

from flashtune.bench.correctness import (
    DEFAULT_TOLERANCES,
    Tolerance,
    compare_outputs,
    distribution_check,
    inputs_modified,
    is_stochastic,
    tolerance_for,
)
from flashtune.data import Definition, EvaluationStatus


def _definition(op_type="toy", dtype="bfloat16", tags=(), name="toy_h8") -> Definition:
    return Definition.model_validate(
        {
            "name": name,
            "op_type": op_type,
            "tags": list(tags),
            "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 8}},
            "inputs": {"x": {"shape": ["n", "h"], "dtype": dtype}},
            "outputs": {"y": {"shape": ["n", "h"], "dtype": dtype}},
            "reference": "def run(x):\n    return x\n",
        }
    )


def test_tolerance_priority_default_op_type_tag_cli():
    d = _definition()
    assert tolerance_for(d, "bfloat16") == DEFAULT_TOLERANCES["bfloat16"]
    assert tolerance_for(_definition("gqa_paged"), "float32").atol == 1e-2
    tagged = _definition(tags=["tol:atol=0.5", "tol:float32:rtol=0.25", "tol:matched_ratio=0.9"])
    assert tolerance_for(tagged, "bfloat16") == Tolerance(
        0.5, DEFAULT_TOLERANCES["bfloat16"].rtol, 0.9
    )
    assert tolerance_for(tagged, "float32").rtol == 0.25
    assert tolerance_for(tagged, "bfloat16", atol=1.0, rtol=2.0) == Tolerance(1.0, 2.0, 0.9)
    assert tolerance_for(d, "int32") == Tolerance(0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="non-numeric"):
        tolerance_for(_definition(tags=["tol:atol=abc"]), "bfloat16")


@pytest.mark.parametrize(
    "dtype, mutate, status",
    [
        ("float32", lambda y: y, "PASSED"),
        ("float32", lambda y: y + 1e-4, "PASSED"),
        ("float32", lambda y: y + 1e-1, "INCORRECT_NUMERICAL"),
        ("float32", lambda y: y[:, :4], "INCORRECT_SHAPE"),
        ("float32", lambda y: y.double(), "INCORRECT_DTYPE"),
        (
            "float32",
            lambda y: y.index_fill(0, torch.tensor([0]), float("nan")),
            "INCORRECT_NUMERICAL",
        ),
        (
            "float32",
            lambda y: y.index_fill(0, torch.tensor([0]), float("inf")),
            "INCORRECT_NUMERICAL",
        ),
        ("float32", lambda y: None, "INCORRECT_SHAPE"),
        ("bfloat16", lambda y: (y.float() * 1.004).bfloat16(), "PASSED"),
        ("float16", lambda y: (y.float() * 1.1).half(), "INCORRECT_NUMERICAL"),
    ],
)
def test_compare_outputs_statuses(dtype, mutate, status):
    d = _definition(dtype=dtype)
    ref = torch.randn(5, 8).to(getattr(torch, dtype))
    verdict = compare_outputs(d, {"y": ref}, {"y": mutate(ref.clone())})
    assert verdict.status.value == status, verdict.reason
    if status == "PASSED":
        assert verdict.correctness.matched_ratio == 1.0


def test_matched_ratio_tolerates_few_outliers_in_low_precision():
    d = _definition(dtype="bfloat16")
    ref = torch.randn(100, 8 * 200).bfloat16()[:, :8].contiguous().repeat(20, 1)  # 2000 x 8
    out = ref.clone()
    out.view(-1)[:10] += 1  # 10 of 16000 elements: 99.94% matched >= 99.9%
    verdict = compare_outputs(d, {"y": ref}, {"y": out})
    assert verdict.status is EvaluationStatus.PASSED
    assert verdict.correctness.matched_ratio == pytest.approx(1 - 10 / 16000)
    out.view(-1)[:100] += 1
    assert compare_outputs(d, {"y": ref}, {"y": out}).status is EvaluationStatus.INCORRECT_NUMERICAL


def test_nan_in_both_matches():
    d = _definition(dtype="float32")
    ref = torch.randn(3, 8)
    ref[0, 0] = float("nan")
    assert compare_outputs(d, {"y": ref}, {"y": ref.clone()}).status is EvaluationStatus.PASSED


def test_inputs_modified_names_the_input():
    x = torch.randn(4)
    after = {"x": x.clone(), "w": torch.zeros(2)}
    after["x"][0] += 1
    assert inputs_modified({"x": x, "w": torch.zeros(2)}, after) == ["x"]


def test_stochastic_is_chosen_by_op_type_not_name():
    assert is_stochastic(_definition("sampling", name="anything"))
    assert not is_stochastic(_definition("toy", name="top_p_sampling_from_probs"))


def _sampler(probs: torch.Tensor, gen: torch.Generator):
    return lambda: {"y": torch.multinomial(probs, 1, generator=gen).squeeze(1)}


def test_distribution_check_passes_same_distribution_and_fails_argmax():
    d = _definition("sampling", dtype="int64")
    probs = torch.softmax(torch.randn(3, 12) * 1.5, dim=-1)
    ref = _sampler(probs, torch.Generator().manual_seed(1))
    same = _sampler(probs, torch.Generator().manual_seed(2))
    verdict = distribution_check(d, same, ref, draws=2000)
    assert verdict.status is EvaluationStatus.PASSED, verdict.reason
    argmax = lambda: {"y": probs.argmax(-1)}  # deterministic: the wrong distribution
    verdict = distribution_check(d, argmax, ref, draws=2000)
    assert verdict.status is EvaluationStatus.INCORRECT_NUMERICAL
    assert "total variation distance" in verdict.reason

"""ApplyTable: winners per bucket, tolerances (the bench's element-wise rule and the max-error
rule), nearest bucket, default, persistence."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _apply_helpers import add_definition, trace
from _apply_helpers import add_traces as _add_traces

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from _capture_toys import toy_norm  # noqa: E402

from flashtune.apply.table import (  # noqa: E402
    ApplyConfig,
    ApplyTable,
    bucket,
    correctness_bounds,
    correctness_problem,
)
from flashtune.bench.correctness import DEFAULT_TOLERANCES, compare_outputs  # noqa: E402
from flashtune.data import Correctness, Dataset, Definition, Trace  # noqa: E402

NAME = "toy_norm_h16"


def add_traces(ds: Dataset, traces: list) -> None:
    # These tests are about ranking: each traced solution exists (its traces verify).
    _add_traces(ds, traces, stub_missing=True)


@pytest.fixture
def ds(tmp_path: Path) -> Dataset:
    ds = Dataset(tmp_path)
    add_definition(
        ds, toy_norm.definition(torch.randn(2, 16, dtype=torch.float16), torch.randn(16))
    )
    return ds


def test_bucket() -> None:
    assert [bucket(v) for v in (0, 1, 2, 3, 4, 5, 1000)] == [0, 1, 2, 4, 4, 8, 1024]


def test_fastest_passing_solution_wins_each_bucket(ds: Dataset) -> None:
    add_traces(
        ds,
        [
            trace(NAME, "a", {"batch_size": 1}, 1.0),
            trace(NAME, "b", {"batch_size": 1}, 2.0),
            trace(NAME, "a", {"batch_size": 64}, 5.0),
            trace(NAME, "b", {"batch_size": 64}, 3.0),
            trace(NAME, "c", {"batch_size": 64}, 0.1, status="INCORRECT_NUMERICAL", abs_err=9.0),
        ],
    )
    table = ApplyTable.build(ds)
    dt = table.definitions[NAME]
    assert dt.buckets[(1,)].solution == "a"
    assert dt.buckets[(64,)].solution == "b"
    assert dt.buckets[(64,)].runners_up == ["a"]
    assert table.lookup(NAME, {"batch_size": 1}) == "a"
    assert table.lookup(NAME, {"batch_size": 60}) == "b"  # same bucket (64)
    assert table.lookup("other_def", {"batch_size": 1}) is None


def test_tolerance_is_dtype_aware_and_configurable(ds: Dataset) -> None:
    # float16 output: default max error 1e-2; "fast" passed the bench but with 0.5 error.
    add_traces(
        ds,
        [
            trace(NAME, "fast", {"batch_size": 4}, 1.0, abs_err=0.5),
            trace(NAME, "exact", {"batch_size": 4}, 2.0, abs_err=1e-3),
        ],
    )
    assert ApplyTable.build(ds).lookup(NAME, {"batch_size": 4}) == "exact"
    loose = ApplyConfig(max_atol=1.0, max_rtol=1.0)
    assert ApplyTable.build(ds, loose).lookup(NAME, {"batch_size": 4}) == "fast"


def test_solution_failing_any_workload_of_a_bucket_does_not_win_it(ds: Dataset) -> None:
    add_traces(
        ds,
        [
            trace(NAME, "flaky", {"batch_size": 5}, 1.0),
            trace(NAME, "flaky", {"batch_size": 7}, None, status="RUNTIME_ERROR"),
            trace(NAME, "solid", {"batch_size": 5}, 2.0),
            trace(NAME, "solid", {"batch_size": 7}, 2.0),
        ],
    )
    table = ApplyTable.build(ds)
    assert table.lookup(NAME, {"batch_size": 6}) == "solid"
    assert table.definitions[NAME].default == "solid"


def test_latest_rerun_replaces_older_result(ds: Dataset) -> None:
    add_traces(
        ds,
        [
            trace(NAME, "a", {"batch_size": 2}, 1.0, timestamp="2026-01-01T00:00:00"),
            trace(NAME, "a", {"batch_size": 2}, 9.0, timestamp="2026-02-01T00:00:00"),
            trace(NAME, "b", {"batch_size": 2}, 5.0),
        ],
    )
    assert ApplyTable.build(ds).lookup(NAME, {"batch_size": 2}) == "b"


def test_nearest_bucket_distance_and_default(ds: Dataset) -> None:
    add_traces(
        ds,
        [
            trace(NAME, "small", {"batch_size": 2}, 1.0),
            trace(NAME, "big", {"batch_size": 2}, 2.0),
            trace(NAME, "big", {"batch_size": 256}, 1.0),
            trace(NAME, "big", {"batch_size": 512}, 1.0),
            trace(NAME, "small", {"batch_size": 256}, 2.0),
            trace(NAME, "small", {"batch_size": 512}, 2.0),
        ],
    )
    table = ApplyTable.build(ds)
    assert table.definitions[NAME].default == "big"  # wins 2 of 3 buckets
    assert table.lookup(NAME, {"batch_size": 3}) == "small"  # nearest: bucket 2 (log2 dist 1)
    assert table.lookup(NAME, {"batch_size": 5000}) == "big"  # nearest: bucket 512
    near = ApplyTable.build(ds, ApplyConfig(max_distance=1.0))
    assert near.lookup(NAME, {"batch_size": 16}) == "big"  # too far from all: default
    strict = ApplyTable.build(ds, ApplyConfig(max_distance=1.0, use_default=False))
    assert strict.lookup(NAME, {"batch_size": 16}) is None  # fall back to the op
    assert strict.lookup(NAME, {"batch_size": 3}) == "small"


def test_persisted_and_rebuilt_only_when_traces_change(ds: Dataset, monkeypatch) -> None:
    add_traces(ds, [trace(NAME, "a", {"batch_size": 2}, 1.0)])
    table = ApplyTable.load(ds)
    path = ApplyTable.path_for(ds)
    saved = json.loads(path.read_text())
    assert saved["hash"] == table.content_hash
    assert saved["definitions"][NAME]["buckets"][0]["solution"] == "a"

    builds = []
    real_build = ApplyTable.build.__func__

    def counting_build(cls, *a, **k):
        builds.append(1)
        return real_build(cls, *a, **k)

    monkeypatch.setattr(ApplyTable, "build", classmethod(counting_build))
    assert ApplyTable.load(ds).lookup(NAME, {"batch_size": 2}) == "a"
    assert builds == []  # unchanged: read from the file
    for f in (ds.root / "traces").rglob("*.jsonl"):  # touched, same content: no rebuild
        os.utime(f, ns=(1, 1))
    assert ApplyTable.load(ds).lookup(NAME, {"batch_size": 2}) == "a"
    assert builds == []
    add_traces(ds, [trace(NAME, "b", {"batch_size": 2}, 0.5)])
    assert ApplyTable.load(ds).lookup(NAME, {"batch_size": 2}) == "b"
    assert builds == [1]
    assert ApplyTable.load(ds, ApplyConfig(max_atol=1.0)).content_hash != table.content_hash


def test_apply_show_cli(ds: Dataset) -> None:
    from typer.testing import CliRunner

    from flashtune.cli import app

    add_traces(
        ds, [trace(NAME, "a", {"batch_size": 2}, 1.0), trace(NAME, "b", {"batch_size": 2}, 2.0)]
    )
    result = CliRunner().invoke(app, ["apply", "show", "--dataset", str(ds.root)])
    assert result.exit_code == 0, result.output
    assert NAME in result.output and "default: a" in result.output and "<=2" in result.output


# --------------------------------------------------------------------------- the bench's rule

GEMM = "gemm_n256_k4096"
BF16 = DEFAULT_TOLERANCES["bfloat16"]  # what the bench judges a bf16 output by


def _gemm_definition(op_type: str = "gemm", tags: tuple[str, ...] = ()) -> Definition:
    return Definition.model_validate(
        {
            "name": GEMM,
            "op_type": op_type,
            "tags": list(tags),
            "axes": {
                "M": {"type": "var"},
                "N": {"type": "const", "value": 256},
                "K": {"type": "const", "value": 4096},
            },
            "inputs": {
                "A": {"shape": ["M", "K"], "dtype": "bfloat16"},
                "B": {"shape": ["N", "K"], "dtype": "bfloat16"},
            },
            "outputs": {"C": {"shape": ["M", "N"], "dtype": "bfloat16"}},
            "reference": "def run(A, B):\n    return A @ B.T\n",
        }
    )


# An honest bf16 GEMM with K >= 4096 as the bench records it (the H100 loop's figures): an
# error of one bf16 spacing (1.0) where |C| ~ 100, a large relative error near zero, 99.95%
# within the bench's element-wise tolerance and a small relative norm error.
GEMM_FIGURES: dict[str, Any] = {
    "max_absolute_error": 1.0,
    "max_relative_error": 3.2358,
    "matched_ratio": 0.9995,
    "rel_norm_error": 3e-3,
    "atol": BF16.atol,
    "rtol": BF16.rtol,
}


def _gemm_trace(solution: str = "flashtune", latency: float = 1.0, **figures: Any) -> Trace:
    t = trace(GEMM, solution, {"M": 64}, latency)
    recorded = {k: v for k, v in {**GEMM_FIGURES, **figures}.items() if v is not None}
    t.evaluation.correctness = Correctness(**recorded)
    return t


@pytest.mark.parametrize(
    ("figures", "why"),
    [
        ({}, None),  # the bench's own tolerance, met
        ({"atol": 1e-3, "rtol": 1e-3}, None),  # a stricter bench than the definition's
        # Without the tolerance, matched_ratio proves nothing: the max-error rule, as before.
        ({"atol": None, "rtol": None}, "no element-wise tolerance recorded"),
        ({"atol": None}, "no element-wise tolerance recorded"),
        # Judged by a looser bench (a command-line --atol, another tool).
        ({"atol": 5e-2}, "looser than atol=0.016, rtol=0.016"),
        ({"rtol": 1.0}, "looser than atol=0.016, rtol=0.016"),
        ({"matched_ratio": 0.998}, "matched_ratio 0.998 < 0.999"),
        ({"matched_ratio": None}, "no matched_ratio recorded"),
        ({"rel_norm_error": None}, "no relative norm error recorded"),
        ({"rel_norm_error": 2e-2}, "relative norm error 0.02 > 0.01"),
        ({"atol": math.nan}, "correctness.atol is nan"),
        ({"rtol": -1.0}, "correctness.rtol is -1.0"),
    ],
)
def test_bf16_gemm_passes_by_the_bench_rule_only_when_its_tolerance_is_recorded(
    figures: dict[str, Any], why: str | None
) -> None:
    bounds = correctness_bounds(_gemm_definition(), ApplyConfig())
    assert (bounds.elementwise_atol, bounds.elementwise_rtol) == (BF16.atol, BF16.rtol)
    problem = correctness_problem(_gemm_trace(**figures), bounds)
    if why is None:
        assert problem is None
    else:
        assert problem is not None and why in problem, problem


def test_gemm_without_recorded_tolerance_is_refused_as_before() -> None:
    bounds = correctness_bounds(_gemm_definition(), ApplyConfig())
    problem = correctness_problem(_gemm_trace(atol=None, rtol=None), bounds)
    assert problem is not None
    assert problem.startswith(
        "max error (absolute 1.0, relative 3.2358) exceeds atol=0.05 and rtol=0.05"
    )
    # Small max errors still pass that rule without a recorded tolerance.
    small = _gemm_trace(atol=None, rtol=None, max_absolute_error=1e-2, max_relative_error=9.0)
    assert correctness_problem(small, bounds) is None


def test_the_bench_rule_keeps_a_max_abs_cap() -> None:
    capped = correctness_bounds(_gemm_definition(tags=("tol:max_abs=0.5",)), ApplyConfig())
    problem = correctness_problem(_gemm_trace(), capped)
    assert problem == "max absolute error 1 > 0.5"
    unrecorded = _gemm_trace(max_absolute_error=None, max_relative_error=9.0)
    problem = correctness_problem(unrecorded, capped)
    assert problem is not None and "no max absolute error recorded" in problem


def test_definition_tags_loosen_the_bench_rule_for_bench_and_apply_alike() -> None:
    bounds = correctness_bounds(_gemm_definition(tags=("tol:atol=0.05",)), ApplyConfig())
    assert (bounds.elementwise_atol, bounds.elementwise_rtol) == (0.05, BF16.rtol)
    assert correctness_problem(_gemm_trace(atol=0.05), bounds) is None
    # A bound the definition turns off is no longer required of the trace.
    off = correctness_bounds(_gemm_definition(tags=("tol:max_rel_norm=inf",)), ApplyConfig())
    assert correctness_problem(_gemm_trace(rel_norm_error=None), off) is None


def test_config_overrides_only_tighten_the_bench_rule() -> None:
    definition = _gemm_definition()
    strict = correctness_bounds(definition, ApplyConfig(max_atol=1e-3))
    assert (strict.elementwise_atol, strict.elementwise_rtol) == (1e-3, BF16.rtol)
    problem = correctness_problem(_gemm_trace(), strict)
    assert problem is not None and "looser than atol=0.001" in problem
    # A looser override loosens the max-error rule alone: a trace judged at atol=0.5 does
    # not pass by the bench's rule (max errors 2.0 and 3.2 exceed the max-error bounds too).
    loose = correctness_bounds(definition, ApplyConfig(max_atol=1.0, max_rtol=1.0))
    assert (loose.atol, loose.rtol) == (1.0, 1.0)
    assert (loose.elementwise_atol, loose.elementwise_rtol) == (BF16.atol, BF16.rtol)
    judged_loosely = _gemm_trace(atol=0.5, rtol=0.5, max_absolute_error=2.0)
    problem = correctness_problem(judged_loosely, loose)
    assert problem is not None and "looser than atol=0.016" in problem
    assert correctness_problem(_gemm_trace(), loose) is None


def test_multi_output_bounds_are_the_loosest_and_stochastic_ops_have_none() -> None:
    attention = Definition.model_validate(
        {
            "name": "gqa_toy",
            "op_type": "gqa_paged",
            "axes": {"n": {"type": "var"}, "d": {"type": "const", "value": 8}},
            "inputs": {"q": {"shape": ["n", "d"], "dtype": "bfloat16"}},
            "outputs": {
                "output": {"shape": ["n", "d"], "dtype": "bfloat16"},
                "lse": {"shape": ["n"], "dtype": "float32"},  # atol 1e-3, rtol 0
            },
            "reference": "def run(q):\n    return q, q.float().sum(-1)\n",
        }
    )
    bounds = correctness_bounds(attention, ApplyConfig())
    assert (bounds.elementwise_atol, bounds.elementwise_rtol) == (BF16.atol, BF16.rtol)
    assert bounds.max_abs == math.inf  # the LSE's cap of 1e-3 does not bound the bf16 output
    sampling = _gemm_definition(op_type="sampling")
    stochastic = correctness_bounds(sampling, ApplyConfig())
    assert (stochastic.elementwise_atol, stochastic.elementwise_rtol) == (None, None)
    assert correctness_bounds(None, ApplyConfig()).elementwise_atol is None


def _gemm_like_outputs() -> tuple[torch.Tensor, torch.Tensor]:
    """(reference, output) as an honest bf16 GEMM with K >= 4096 gives them: |C| ~ 100, where
    the bf16 spacing is 0.5-1, and a few outputs near zero off by a few hundredths."""
    gen = torch.Generator().manual_seed(0)
    ref = (torch.randn(64, 256, generator=gen) * 100).to(torch.bfloat16)
    # One bf16 spacing (0.5 or 1) further from zero, the next bit pattern, on every third
    # output of 64 <= |C| < 256, as another accumulation order can give.
    nudge = torch.zeros_like(ref, dtype=torch.bool)
    nudge.view(-1)[::3] = True
    nudge &= (ref.float().abs() >= 64) & (ref.float().abs() < 256)
    out = torch.where(nudge, (ref.view(torch.int16) + 1).view(torch.bfloat16), ref)
    ref[0, :4] = torch.tensor([1e-2, -1e-2, 2e-2, 5e-3], dtype=torch.bfloat16)
    out[0, :4] = torch.tensor([4e-2, -4e-2, 5e-2, 2e-2], dtype=torch.bfloat16)
    return ref, out


def test_a_trace_the_bench_passed_passes_apply_by_the_tolerance_it_recorded() -> None:
    definition = _gemm_definition()
    ref, out = _gemm_like_outputs()
    verdict = compare_outputs(definition, {"C": ref}, {"C": out})
    c = verdict.correctness
    assert verdict.status.value == "PASSED" and c is not None, verdict.reason
    # As on the H100: max errors far beyond the max-error rule's 5e-2, the norm error small.
    assert (c.max_absolute_error, c.max_relative_error) == (1.0, 3.0)
    assert c.rel_norm_error is not None and c.rel_norm_error < 5e-3
    assert (c.atol, c.rtol) == (BF16.atol, BF16.rtol)
    bounds = correctness_bounds(definition, ApplyConfig())
    t = trace(GEMM, "flashtune", {"M": 64}, 1.0)
    t.evaluation.correctness = c
    assert correctness_problem(t, bounds) is None
    # The same figures from an older bench, which did not record its tolerance: refused.
    older = trace(GEMM, "flashtune", {"M": 64}, 1.0)
    older.evaluation.correctness = c.model_copy(update={"atol": None, "rtol": None})
    problem = correctness_problem(older, bounds)
    assert problem is not None and "exceeds atol=0.05" in problem
    # A looser bench (--atol 1 --rtol 1) records what it judged by: refused too.
    loose = compare_outputs(definition, {"C": ref}, {"C": out}, 1.0, 1.0)
    assert loose.correctness is not None and (loose.correctness.atol, loose.correctness.rtol) == (
        1.0,
        1.0,
    )
    t.evaluation.correctness = loose.correctness
    problem = correctness_problem(t, bounds)
    assert problem is not None and "looser" in problem


def test_table_picks_the_gemm_that_records_its_tolerance(tmp_path: Path) -> None:
    gemm_ds = Dataset(tmp_path / "gemm")
    add_definition(gemm_ds, _gemm_definition())
    add_traces(
        gemm_ds,
        [
            _gemm_trace("flashtune", 1.0),
            _gemm_trace("older_bench", 0.5, atol=None, rtol=None),
        ],
    )
    table = ApplyTable.build(gemm_ds)
    assert table.lookup(GEMM, {"M": 64}) == "flashtune"
    [rejection] = table.rejected
    assert rejection.solution == "older_bench"
    assert "no element-wise tolerance recorded" in rejection.reason

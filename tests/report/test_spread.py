"""Spread in the reports: each latency's 95% interval, speedups flagged (not claimed) where
the intervals say so, rankings that tie overlapping results, correct-not-timed rows."""

from __future__ import annotations

from io import StringIO

import pytest
from rich.console import Console

from _gemm_traces import gemm_trace
from flashtune.data import Correctness, EvaluationStatus, Trace
from flashtune.report.html import render_html
from flashtune.report.render import comparison_table, ranking_table, summary_table
from flashtune.report.tables import (
    compare,
    rank,
    ratio_interval,
    speedup_flag,
    spread_of,
    summarize,
)

ENV = {"hardware": "cpu", "torch": "2.x"}


def _trace(
    sol: str,
    m: int,
    latency: float,
    ci: tuple[float, float] | None,
    reference: float = 10.0,
    reference_ci: tuple[float, float] | None = (9.9, 10.1),
    baseline: tuple[str, float] | None = None,
) -> Trace:
    t = gemm_trace(sol, m, latency, environment=ENV, reference_latency=reference, baseline=baseline)
    assert t.evaluation is not None and t.evaluation.performance is not None
    t.evaluation.performance.latency_ci_ms = ci
    t.evaluation.performance.reference_latency_ci_ms = reference_ci
    return t


def _text(renderable: object) -> str:
    out = StringIO()
    Console(file=out, width=400, color_system=None).print(renderable)
    return out.getvalue()


def test_ratio_interval_and_flags() -> None:
    assert ratio_interval((9.0, 11.0), (0.9, 1.1)) == pytest.approx((9.0 / 1.1, 11.0 / 0.9))
    assert ratio_interval(None, (1.0, 1.0)) is None
    assert speedup_flag((0.9, 1.2)) == "within noise"  # reaches both sides of 1
    assert speedup_flag((3.0, 800.0)) == "uncertain"  # the "789x" of a noisy reference
    assert speedup_flag((9.0, 11.0)) is None  # claimed
    assert speedup_flag(None) is None  # nothing to judge by: old traces are not flagged


def test_summary_flags_noisy_latencies_and_unclaimed_speedups() -> None:
    traces = [
        _trace("torch", 1, 2.0, (1.95, 2.05), baseline=("torch", 2.0)),
        # 1.05x the baseline, but the intervals overlap: within noise
        _trace("close", 1, 1.9, (1.8, 2.0), baseline=("torch", 2.0)),
        # 790x the reference from a reference whose interval spans 1-160 ms
        _trace("noisy_ref", 1, 0.2, (0.19, 0.21), reference=158.0, reference_ci=(1.0, 160.0)),
        # its own spread is ±50%: too wide to rank
        _trace("wide", 1, 1.0, (0.5, 1.5), baseline=("torch", 2.0)),
        _trace("clear", 1, 1.0, (0.98, 1.02), baseline=("torch", 2.0)),
    ]
    rows = {s.solution: s for s in summarize(traces)}
    assert rows["torch"].noisy_baseline == 0  # the baseline is not compared with itself
    assert rows["close"].noisy_baseline == 1 and "within noise" in (
        rows["close"].noise_reason or ""
    )
    noisy = rows["noisy_ref"]
    assert noisy.speedup_vs_reference == pytest.approx(790.0)  # shown, not hidden
    assert noisy.noisy_reference == 1 and "uncertain" in (noisy.noise_reason or "")
    assert rows["wide"].spread == pytest.approx(0.5)
    clear = rows["clear"]
    assert clear.noisy_baseline == clear.noisy_reference == 0
    assert clear.spread == pytest.approx(0.02)

    table = _text(summary_table(list(rows.values())))
    assert "790.00x?" in table and "1.05x?" in table  # flagged next to the number
    (clear_line,) = [line for line in table.splitlines() if " clear " in line]
    assert "2.00x" in clear_line and "?" not in clear_line  # claimed
    assert "±50%" in table and "too noisy to rank" in table and "±2%" in table


def test_rank_ties_overlapping_results_and_shows_untimed() -> None:
    traces = [
        _trace("a", 1, 1.0, (0.9, 1.1)),
        _trace("b", 1, 1.05, (1.0, 1.1)),  # overlaps a: tied
        _trace("c", 1, 2.0, (1.9, 2.1)),  # clearly slower than b
    ]
    untimed = gemm_trace("interp", 1, None, environment=ENV, status="SKIPPED")
    assert untimed.evaluation is not None
    untimed.evaluation.correctness = Correctness()
    traces.append(untimed)
    (r,) = rank(traces)
    assert [name for name, _, _ in r.entries] == ["a", "b", "c"]
    assert r.tied(0) and not r.tied(1)
    assert r.untimed == {"interp"} and r.failed == [("interp", EvaluationStatus.SKIPPED.value)]
    text = _text(ranking_table([r]))
    assert "≈  b" in text and ">  c" in text
    assert "interp: correct, not timed" in text
    assert spread_of(traces[0]) == pytest.approx(0.1)
    page = render_html(traces, {})
    assert "&asymp; b" in page and "interp (correct, not timed)" in page


def test_compare_counts_pairs_within_noise() -> None:
    traces = [
        _trace("x", 1, 1.0, (0.9, 1.1)),
        _trace("y", 1, 1.05, (1.0, 1.1)),
        _trace("x", 16, 1.0, (0.99, 1.01)),
        _trace("y", 16, 2.0, (1.98, 2.02)),
    ]
    rows, overall = compare(traces, "x", "y")
    (row,) = rows
    assert row.workloads == 2 and row.within_noise == 1
    assert "within noise" in _text(comparison_table(rows, "x", "y", overall))

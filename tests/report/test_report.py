"""Report tables, comparisons, the HTML page and the `flashtune report` commands."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from flashtune.cli import app
from flashtune.data import Dataset, Evaluation, EvaluationStatus, Performance, Trace, Workload
from flashtune.report.tables import compare, geomean, rank, summarize

ENV = {"hardware": "NVIDIA H100 80GB HBM3", "torch": "2.x"}


def _trace(sol: str, m: int, latency: float | None, status="PASSED", baseline=None) -> Trace:
    perf = None
    if latency is not None:
        perf = Performance(latency_ms=latency, reference_latency_ms=10.0,
                           speedup_factor=10.0 / latency)  # fmt: skip
        if baseline:
            perf.baseline_solution, perf.baseline_latency_ms = baseline
            perf.speedup_vs_baseline = baseline[1] / latency
    return Trace(
        definition="gemm_n64_k64",
        workload=Workload(uuid=f"w{m}", axes={"M": m}),
        solution=sol,
        evaluation=Evaluation(
            status=EvaluationStatus(status),
            environment=ENV,
            timestamp="t",
            reason=None if status == "PASSED" else "boom",
            performance=perf,
        ),  # fmt: skip
    )


@pytest.fixture
def traces() -> list[Trace]:
    out = []
    for m, (t, f, fi) in {1: (2.0, 1.0, 4.0), 16: (4.0, 1.0, 1.0), 256: (8.0, 0.5, 4.0)}.items():
        out.append(_trace("torch", m, t, baseline=("torch", t)))
        out.append(_trace("flashtune", m, f, baseline=("torch", t)))
        out.append(_trace("flashinfer", m, fi, baseline=("torch", t)))
    out.append(_trace("cheater", 1, 0.1, baseline=("torch", 2.0)))  # 20x the baseline
    out.append(_trace("broken", 1, None, status="RUNTIME_ERROR"))
    out.append(_trace("broken", 16, None, status="SKIPPED"))
    return out


def test_geomean_ignores_missing_and_nonpositive():
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert geomean([None, 0.0, 9.0]) == pytest.approx(9.0)  # type: ignore[list-item]
    assert geomean([]) is None


def test_summary_pass_rates_speedups_and_flags(traces):
    rows = {s.solution: s for s in summarize(traces)}
    ft = rows["flashtune"]
    assert ft.passed == 3 and ft.pass_rate == 1.0
    assert ft.speedup_vs_baseline == pytest.approx(geomean([2.0, 4.0, 16.0]))
    assert ft.speedup_vs_reference == pytest.approx(geomean([10.0, 10.0, 20.0]))
    assert rows["cheater"].suspicious == 1 and ft.suspicious == 1  # 16x at M=256
    broken = rows["broken"]
    assert broken.pass_rate == 0.0 and broken.reason == "boom"


def test_latest_trace_wins(traces):
    traces.append(_trace("flashtune", 1, 3.0, baseline=("torch", 2.0)))
    ft = {s.solution: s for s in summarize(traces)}["flashtune"]
    assert ft.latency_ms == pytest.approx(geomean([3.0, 1.0, 0.5]))


def test_compare_geomean_min_max(traces):
    rows, overall = compare(traces, "flashtune", "flashinfer")
    (row,) = rows
    assert row.workloads == 3
    assert row.min == pytest.approx(1.0) and row.max == pytest.approx(8.0)
    assert row.geomean == pytest.approx(math.pow(4 * 1 * 8, 1 / 3))
    assert overall == pytest.approx(row.geomean)


def test_rank_orders_fastest_first(traces):
    by_m = {r.axes["M"]: r for r in rank(traces)}
    assert [e[0] for e in by_m[16].entries] == ["flashinfer", "flashtune", "torch"] or [
        e[0] for e in by_m[16].entries
    ] == ["flashtune", "flashinfer", "torch"]
    assert by_m[1].entries[0][0] == "cheater" and by_m[1].entries[0][2]  # flagged
    assert ("broken", "RUNTIME_ERROR") in by_m[1].failed


def _write(root, traces):
    ds = Dataset(root)
    for t in traces:
        ds.append_trace(t, author=t.solution or "x")


def test_report_cli_commands(tmp_path, traces):
    _write(tmp_path / "res", traces)
    bad = next((tmp_path / "res" / "traces").rglob("*.jsonl"))
    with open(bad, "a") as f:
        f.write("not json\n")
    runner = CliRunner()
    d = ["-d", str(tmp_path / "res")]
    out = runner.invoke(app, ["report", "summary", *d])
    assert out.exit_code == 0, out.output
    assert "flashtune" in out.output and "pass rates" in out.output
    assert f"{bad}:" in out.output  # the corrupt line, by file:line, skipped
    out = runner.invoke(app, ["report", "compare", "flashtune", "flashinfer", *d])
    assert out.exit_code == 0 and "geomean" in out.output, out.output
    out = runner.invoke(app, ["report", "best", *d])
    assert out.exit_code == 0 and "review" in out.output, out.output
    html = tmp_path / "html" / "index.html"
    out = runner.invoke(app, ["report", "html", *d, "-o", str(html)])
    assert out.exit_code == 0, out.output
    text = html.read_text()
    assert "gemm_n64_k64" in text and "review" in text
    out = runner.invoke(app, ["report", "compare", "nobody", "flashinfer", *d])
    assert out.exit_code == 1

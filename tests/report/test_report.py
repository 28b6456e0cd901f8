"""Report tables, comparisons, the HTML page and the `flashtune report` commands."""

from __future__ import annotations

import math
from typing import Any

import pytest
from typer.testing import CliRunner

from _gemm_traces import gemm_trace
from flashtune.cli import app
from flashtune.data import Dataset, Trace
from flashtune.report.tables import TIMING_DIFFERS, compare, geomean, rank, summarize

ENV = {"hardware": "NVIDIA H100 80GB HBM3", "torch": "2.x"}


def _trace(sol: str, m: int, latency: float | None, **kwargs: Any) -> Trace:
    return gemm_trace(sol, m, latency, environment=ENV, timestamp="t", **kwargs)


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


# --------------------------------------------------------------------------- like for like


def _unlike_traces() -> list[Trace]:
    """flashtune graph-timed everywhere; flashinfer event-timed at M=1, unknown at M=16,
    graph-timed at M=256; torch (the baseline) graph-timed except at M=16 (unknown)."""
    out = []
    methods = {1: "cuda_events", 16: None, 256: "cuda_graph"}
    for m, (t, f, fi) in {1: (2.0, 1.0, 4.0), 16: (4.0, 1.0, 1.0), 256: (8.0, 0.5, 4.0)}.items():
        torch_method = None if m == 16 else "cuda_graph"
        out.append(_trace("torch", m, t, baseline=("torch", t), method=torch_method))
        out.append(_trace("flashtune", m, f, baseline=("torch", t)))
        out.append(
            _trace(
                "flashinfer",
                m,
                fi,
                baseline=("torch", t),
                method=methods[m],
                ref_method="cuda_graph",
            )
        )
    return out


def test_summary_refuses_speedups_timed_differently():
    rows = {s.solution: s for s in summarize(_unlike_traces())}
    ft = rows["flashtune"]
    # vs torch: M=16's torch trace has no timing method -> left out, counted.
    assert ft.speedup_vs_baseline == pytest.approx(geomean([2.0, 16.0]))
    assert ft.excluded_baseline == 1 and TIMING_DIFFERS in (ft.timing_reason or "")
    assert ft.speedup_vs_reference == pytest.approx(geomean([10.0, 10.0, 20.0]))
    assert ft.excluded_reference == 0
    fi = rows["flashinfer"]
    # Only M=256 is graph-timed on both sides (vs torch and vs the reference).
    assert fi.speedup_vs_baseline == pytest.approx(2.0)
    assert fi.excluded_baseline == 2 and fi.excluded_reference == 2
    assert fi.speedup_vs_reference == pytest.approx(10.0 / 4.0)


def test_summary_all_refused_shows_na():
    traces = [
        _trace("torch", 1, 2.0, baseline=("torch", 2.0), method=None, ref_method=None),
        _trace("flashtune", 1, 1.0, baseline=("torch", 2.0), method="cpu", ref_method=None),
    ]
    rows = {s.solution: s for s in summarize(traces)}
    ft = rows["flashtune"]
    assert ft.speedup_vs_baseline is None and ft.speedup_vs_reference is None
    assert ft.excluded_baseline == 1 and ft.excluded_reference == 1
    assert "cpu vs unknown" in (ft.timing_reason or "")
    assert rows["torch"].speedup_vs_baseline is None  # unknown is not like itself


def test_compare_excludes_pairs_timed_differently():
    rows, overall = compare(_unlike_traces(), "flashtune", "flashinfer")
    (row,) = rows
    assert row.workloads == 1 and row.excluded == 2
    assert row.geomean == pytest.approx(8.0) and overall == pytest.approx(8.0)
    assert TIMING_DIFFERS in (row.reason or "")
    # Every pair refused: a row with no speedup, and no overall figure.
    only = [t for t in _unlike_traces() if t.workload.axes["M"] != 256]
    rows, overall = compare(only, "flashtune", "flashinfer")
    (row,) = rows
    assert row.workloads == 0 and row.excluded == 2
    assert row.geomean is None and overall is None


def test_rank_marks_mixed_timing():
    by_m = {r.axes["M"]: r for r in rank(_unlike_traces())}
    assert by_m[1].mixed_timing and by_m[1].timing["flashinfer"] == "cuda_events"
    assert not by_m[256].mixed_timing


def test_report_cli_shows_timing_differs(tmp_path):
    _write(tmp_path / "res", _unlike_traces())
    runner = CliRunner()
    d = ["-d", str(tmp_path / "res")]
    wide = {"COLUMNS": "250"}
    out = runner.invoke(app, ["report", "summary", *d], env=wide)
    assert out.exit_code == 0, out.output
    assert "excluded" in out.output and TIMING_DIFFERS in out.output
    out = runner.invoke(app, ["report", "compare", "flashtune", "flashinfer", *d], env=wide)
    assert out.exit_code == 0, out.output
    assert "2 pair(s)" in out.output and TIMING_DIFFERS in out.output
    assert "8.00x" in out.output
    out = runner.invoke(app, ["report", "best", *d], env=wide)
    assert out.exit_code == 0 and "cuda_events" in out.output, out.output
    only = [t for t in _unlike_traces() if t.workload.axes["M"] == 16]
    _write(tmp_path / "na", only)
    out = runner.invoke(
        app, ["report", "compare", "flashtune", "flashinfer", "-d", str(tmp_path / "na")], env=wide
    )
    assert out.exit_code == 0, out.output
    assert TIMING_DIFFERS in out.output and "1.00x" not in out.output
    html = tmp_path / "html" / "index.html"
    out = runner.invoke(app, ["report", "html", *d, "-o", str(html)])
    assert out.exit_code == 0, out.output
    text = html.read_text()
    assert TIMING_DIFFERS in text and "excluded" in text and "timing unknown" in text


# --------------------------------------------------------------------------- GEMM benchmark


def _bench_gemm():
    """benchmarks/bench_gemm.py as a module (it is a script, not part of the package)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gemm.py"
    if "bench_gemm" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_gemm", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["bench_gemm"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules["bench_gemm"]


def test_gemm_summary_reports_triton_only_and_remeasured():
    bg = _bench_gemm()
    cub, small, tiled = (
        ("CublasRunner", -1, 1.0),
        ("TritonSmallMRunner", (1,), 0.8),
        ("TritonTiledRunner", (2,), 1.25),
    )
    picks = bg.select([cub, small, tiled])
    assert picks == {"cublas": cub, "best": small, "triton": small}
    assert bg.select([cub]) == {"cublas": cub, "best": cub}  # no Triton tactic ran
    won = bg.ShapeResult(1, 64, 64, picks, {"cublas": 1.0, "best": 1.1, "triton": 1.1})
    lost = bg.ShapeResult(
        32, 64, 64, bg.select([cub, tiled]), {"cublas": 1.0, "best": 1.0, "triton": 1.2}
    )
    assert won.ratio("best", "selection") == pytest.approx(1.25)
    assert won.ratio("best", "remeasured") == pytest.approx(1 / 1.1)
    assert lost.ratio("best", "selection") == 1.0  # cuBLAS won: >= 1 by construction
    lines = bg.summary_lines([won, lost])
    text = "\n".join(lines)
    assert "Triton only" in text and "best incl. cuBLAS" in text
    assert "selection" in text and "re-measured" in text
    (all_row,) = [line for line in lines if line.startswith("all shapes")]
    # best incl. cuBLAS: selection 1.25 & 1.0; re-measured 0.909 & 1.0
    assert f"{math.sqrt(1.25):.3f} min 1.000" in all_row
    assert f"{math.sqrt(1 / 1.1):.3f} min {1 / 1.1:.3f}" in all_row
    # Triton only, re-measured: 1/1.1 and 1/1.2
    assert f"{math.sqrt(1 / 1.1 / 1.2):.3f} min {1 / 1.2:.3f} max {1 / 1.1:.3f}" in all_row
    wrong = bg.ShapeResult(1, 64, 64, picks, {"cublas": 1.0, "best": None, "triton": None})
    assert "1 pick(s) wrong on fresh inputs" in "\n".join(bg.summary_lines([wrong]))


def test_gemm_remeasure_uses_fresh_inputs_and_times_each_pick_once():
    import torch

    bg = _bench_gemm()
    seen = []

    def timer(fn, sets, est_ms):
        seen.append(sets[0][0].clone())
        return 2.0

    cub = ("CublasRunner", -1, 1.0)
    out = bg.remeasure(
        3, 16, 32, torch.device("cpu"), {"cublas": cub, "best": cub}, 0.01, timer=timer
    )
    assert out == {"cublas": 2.0, "best": 2.0} and len(seen) == 1  # one timing, shared
    again = bg.remeasure(3, 16, 32, torch.device("cpu"), {"cublas": cub}, 0.01, seed=1, timer=timer)
    assert again == {"cublas": 2.0}
    assert not torch.equal(seen[0], seen[1])  # another seed: other inputs

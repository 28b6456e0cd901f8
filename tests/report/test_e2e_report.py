"""The HTML report's End to end section (report/e2e.py) on synthetic `flashtune e2e` rows."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from _gemm_traces import gemm_trace
from _html_page import parse_page
from flashtune.cli import app
from flashtune.data import Dataset
from flashtune.report.e2e import decode_series, e2e_section, read_e2e_rows, setups, speedups
from flashtune.report.html import render_html

GPU = "NVIDIA H100 80GB HBM3"
SETUP = (GPU, "llama-3.1-8b", "4", "bfloat16")
# Latency per backend: a base time times a factor per backend, so ratios are known exactly.
FACTORS = {"torch": 4.0, "torch_compile": 2.0, "flashinfer": 1.25, "flashtune": 1.0}


def _row(op: str, backend: str, latency: float | None, **shape: Any) -> dict[str, Any]:
    shape = {**shape, "model": "llama-3.1-8b", "layers": 4, "dtype": "bfloat16"}
    row = {"op": op, "shape": shape, "solution": backend, "latency_ms": latency, "gpu": GPU}
    if op == "e2e_prefill" and latency:
        row["tokens_per_s"] = 1000.0 / latency
    return row


def _rows() -> list[dict[str, Any]]:
    rows = []
    for batch in (1, 16, 64):
        for kv in (1024, 4096):
            for backend, factor in FACTORS.items():
                rows.append(
                    _row("e2e_decode", backend, factor * batch * kv / 1024, batch=batch, kv_len=kv)
                )
    # flashinfer failed at (64, 4096): batch 64's points cover KV 1024 only, for everyone.
    rows = [
        r
        for r in rows
        if not (
            r["solution"] == "flashinfer"
            and r["shape"]["batch"] == 64
            and r["shape"]["kv_len"] == 4096
        )
    ]
    rows.append(_row("e2e_decode", "flashinfer", None, batch=64, kv_len=4096) | {"error": "OOM"})
    rows.append(_row("e2e_prefill", "torch", 8.0, batch=1, prompt_len=2048))
    rows.append(_row("e2e_prefill", "flashtune", 2.0, batch=1, prompt_len=2048))
    rows.append(
        {
            "op": "e2e_loop",
            "shape": {"model": "llama-3.1-8b", "layers": 4},
            "solution": "flashtune+apply",
            "latency_ms": 9.0,
            "before_ms": 10.0,
            "winners": {"gemm_n4096_k4096": "flashtune@gemm_n4096_k4096", "rmsnorm_h4096": None},
            "own_path": ["gemm_n4096_k4096"],
            "before_graph_ms": 1.122,
            "after_graph_ms": 1.123,
            "commit": "7cdf651aa",
            "same_tokens": True,
            "gpu": GPU,
        }
    )
    return rows


def test_decode_series_are_like_for_like_geomeans_per_batch() -> None:
    rows = _rows()
    assert setups(rows) == [SETUP]
    series = decode_series(rows, SETUP)
    assert set(series) == set(FACTORS)
    for backend, factor in FACTORS.items():
        batches = [b for b, _ in series[backend]]
        assert batches == [1.0, 16.0, 64.0]
        # Batches 1 and 16: geomean over KV 1024 and 4096 (1x and 4x the base: 2x).
        assert math.isclose(series[backend][0][1], factor * 2.0)
        assert math.isclose(series[backend][1][1], factor * 16 * 2.0)
        # Batch 64: flashinfer has no 4096 point, so every backend's geomean is KV 1024's.
        assert math.isclose(series[backend][2][1], factor * 64)


def test_speedups_over_the_points_both_timed() -> None:
    ratios = speedups(_rows(), SETUP)
    assert set(ratios) == {"torch", "torch_compile", "flashinfer"}
    assert math.isclose(ratios["torch"][0], 4.0) and ratios["torch"][1] == 6
    assert math.isclose(ratios["flashinfer"][0], 1.25) and ratios["flashinfer"][1] == 5


def test_the_section_plots_one_series_per_backend() -> None:
    page = parse_page(e2e_section(_rows(), "results/e2e.jsonl"))
    assert page.find("section", id="e2e")
    (plot,) = page.find("svg", class_="plot")
    assert plot["data-kind"] == "e2e-decode"
    names = [g["data-name"] for g in page.find("g", class_="series")]
    assert sorted(names) == sorted(FACTORS)
    assert len(page.find("circle", class_="point")) == 3 * len(FACTORS)  # one per batch
    words = " ".join(page.text)
    assert "batch (log)" in words and "latency per token (ms)" in words
    for table in ("e2e-decode", "e2e-speedups", "e2e-prefill", "e2e-loop"):
        assert page.find("table", class_=table), table
    assert "4.00x" in words and "results/e2e.jsonl" in words
    assert "flashtune@gemm_n4096_k4096 (its own op)" in words and "rmsnorm_h4096: itself" in words
    assert "1.122" in words and "1.123" in words and "7cdf651a" in words  # graph step, commit


def test_a_setup_per_model_and_an_empty_file_says_so() -> None:
    other = [dict(r, gpu="NVIDIA H200") for r in _rows() if r["op"] == "e2e_decode"]
    page = parse_page(e2e_section(_rows() + other))
    assert len(page.find("svg", class_="plot")) == 2
    assert len(page.find("h3", class_="e2e-setup")) == 2
    assert "no decode or prefill rows" in e2e_section([])


def test_the_report_has_the_section_only_with_rows() -> None:
    traces = [gemm_trace("torch@gemm_n64_k64", 1, 1.0, environment={"hardware": GPU})]
    with_rows = parse_page(render_html(traces, {}, e2e_rows=_rows()))
    assert with_rows.find("section", id="e2e") and with_rows.find("a", href="#e2e")
    assert not parse_page(render_html(traces, {})).find("section", id="e2e")


def test_report_html_cli_reads_the_rows(tmp_path: Path) -> None:
    ds = Dataset(tmp_path / "res")
    ds.append_trace(
        gemm_trace("torch@gemm_n64_k64", 1, 1.0, environment={"hardware": GPU}), author="torch"
    )
    rows_file = tmp_path / "e2e.jsonl"
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    out = tmp_path / "report.html"
    argv = ["report", "html", "-d", str(tmp_path / "res"), "-o", str(out)]
    result = CliRunner().invoke(app, [*argv, "--e2e", str(rows_file)])
    assert result.exit_code == 0, result.output
    page = parse_page(out.read_text())
    assert len(page.find("g", class_="series")) >= len(FACTORS)
    assert page.find("svg", class_="plot", **{"data-kind": "e2e-decode"})
    rows_file.write_text('{"op": "e2e_decode"}\nnot json\n')
    result = CliRunner().invoke(app, [*argv, "--e2e", str(rows_file)])
    assert result.exit_code == 1 and "e2e.jsonl:2" in " ".join(result.output.split())


def test_read_rows_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"op": "e2e_decode"}\n\n[1, 2]\n')
    with pytest.raises(ValueError, match="rows.jsonl:3"):
        read_e2e_rows(path)
    path.write_text('{"op": "e2e_decode"}\n')
    assert read_e2e_rows(path) == [{"op": "e2e_decode"}]

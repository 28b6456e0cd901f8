"""The HTML report's structure, checked by parsing it: one self-contained file with an
environment header, a summary, fast_p curves per family, and per definition the solutions
(skipped in its own column), the ranking and two inline SVG plots."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from _gemm_traces import gemm_trace
from _html_page import parse_page
from flashtune.cli import app
from flashtune.data import Dataset, Definition, Trace
from flashtune.report.fast_p import family, fast_p
from flashtune.report.html import render_html, write_html
from flashtune.report.roofline import GBPS, TFLOPS, bytes_moved, peak_for, throughput, unit_for
from flashtune.report.svg import RefLine, line_chart

ENV = {
    "hardware": "NVIDIA H100 80GB HBM3",
    "driver": "580.1",
    "cuda": "13.0",
    "torch": "2.11",
    "triton": "3.6",
    "flashtune": "0.1.0",
    "code": {"commit": "0123456789abcdef", "dirty": True},
    "run_started": "2026-11-24T00:00:00+00:00",
}
GEMM = Definition.model_validate(
    {
        "name": "gemm_n64_k64",
        "op_type": "gemm",
        "axes": {
            "M": {"type": "var"},
            "N": {"type": "const", "value": 64},
            "K": {"type": "const", "value": 64},
        },
        "inputs": {
            "A": {"shape": ["M", "K"], "dtype": "bfloat16"},
            "B": {"shape": ["N", "K"], "dtype": "bfloat16"},
        },
        "outputs": {"C": {"shape": ["M", "N"], "dtype": "bfloat16"}},
        "reference": "import torch\n\ndef run(A, B):\n    return A @ B.T\n",
    }
)


def _trace(solution: str, m: int, latency: float | None, status: str = "PASSED") -> Trace:
    return gemm_trace(
        solution,
        m,
        latency,
        environment=ENV,
        status=status,
        timestamp="2026-11-24T00:01:00+00:00",
        reason="needs a GPU",
        baseline=("torch@gemm_n64_k64", 2.0 * m),
    )


@pytest.fixture
def traces() -> list[Trace]:
    out = []
    for m in (1, 16, 256):
        out.append(_trace("torch@gemm_n64_k64", m, 2.0 * m))
        out.append(_trace("flashtune@gemm_n64_k64", m, 0.5 * m))  # 4x the baseline
        out.append(_trace("triton_only@gemm_n64_k64", m, None, status="SKIPPED"))
    out.append(_trace("broken@gemm_n64_k64", 1, None, status="RUNTIME_ERROR"))
    return out


def test_report_structure(traces: list[Trace]) -> None:
    text = render_html(traces, {"gemm_n64_k64": GEMM})
    page = parse_page(text)
    for section in ("environment", "summary", "fast-p"):
        assert page.find("section", id=section), section
    (section,) = page.find("section", class_="definition")
    assert section["data-definition"] == "gemm_n64_k64"
    kinds = [a["data-kind"] for a in page.find("svg", class_="plot")]
    assert kinds == ["fast_p", "latency", "throughput"]
    words = " ".join(page.text)
    for shown in ("NVIDIA H100 80GB HBM3", "580.1", "13.0", "2.11", "0123456789ab (dirty)"):
        assert shown in words
    assert "2026-11-24T00:00:00+00:00" in words
    assert "&amp;" not in text  # no entity escaped twice
    # Self-contained: no image, script, stylesheet or anything fetched.
    assert not page.find("img") and not page.find("script") and not page.find("link")
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")


def test_skipped_is_its_own_column(traces: list[Trace]) -> None:
    page = parse_page(render_html(traces, {"gemm_n64_k64": GEMM}))
    text = " ".join(page.text)
    assert "skipped" in text
    # The per-solution table: triton_only has 0 passed, 0 failed, 3 skipped, no pass rate.
    html = render_html(traces, {"gemm_n64_k64": GEMM})
    row = html[html.index("<td>triton_only@gemm_n64_k64</td>") :].split("</tr>")[0]
    cells = [c.split(">", 1)[1] for c in row.split("</td>")[:5]]
    assert cells[1:] == ["0", "0", "3", "&ndash;"]
    ranking = html[html.index("class='ranking'") :].split("</table>")[0]
    assert "triton_only@gemm_n64_k64: SKIPPED" not in ranking  # not listed as a failure
    assert "broken@gemm_n64_k64: RUNTIME_ERROR" in ranking


def test_plots_have_a_series_per_solution_and_the_peak(traces: list[Trace]) -> None:
    html = render_html(traces, {"gemm_n64_k64": GEMM})
    latency = html[html.index("data-kind='latency'") :].split("</svg>")[0]
    page = parse_page(latency)
    names = sorted(a["data-name"] for a in page.find("g", class_="series"))
    assert names == ["flashtune", "torch"]  # the definition's suffix is the section's title
    assert len(page.find("circle", class_="point")) == 6
    throughput = html[html.index("data-kind='throughput'") :].split("</svg>")[0]
    # A 64x64 GEMM moves more bytes than the H100 can compute on: memory-bound, GB/s.
    assert "GB/s" in throughput and "ref-line" in throughput  # H100 datasheet peak
    assert "peak 3.35 TB/s" in throughput


def test_throughput_unit_follows_the_ridge_point() -> None:
    fields = GEMM.model_dump() | {"name": "gemm_n8192_k8192"}
    fields["axes"] = {**fields["axes"], "N": {"type": "const", "value": 8192}}
    fields["axes"]["K"] = {"type": "const", "value": 8192}
    big = Definition.model_validate(fields)
    wide = [_trace("flashtune@x", 8192, 1.0)]
    narrow = [_trace("flashtune@x", 1, 1.0)]
    h100 = peak_for("NVIDIA H100 80GB HBM3")
    assert unit_for(big, wide, h100) == TFLOPS  # 8192^3: compute-bound
    assert unit_for(big, narrow, h100) == GBPS  # M=1: reads the weight once, memory-bound
    assert unit_for(big, narrow, None) == TFLOPS  # no peak known: FLOPs where counted
    value = throughput(big, wide[0], TFLOPS)
    assert value == pytest.approx(2 * 8192**3 / 1e-3 / 1e12)


def test_plots_say_why_when_empty() -> None:
    skipped = [_trace("triton_only@gemm_n64_k64", m, None, status="SKIPPED") for m in (1, 2)]
    html = render_html(skipped, {})
    page = parse_page(html)
    assert len(page.find("svg", class_="plot")) == 3  # always present
    assert "no solution passed here" in html


def test_fast_p_counts_correct_and_faster(traces: list[Trace]) -> None:
    by_family = {r.family: r for r in fast_p(traces)}
    ft = by_family["flashtune"]
    assert ft.workloads == 3 and ft.share(0) == 1.0
    assert ft.share(4.0) == 1.0 and ft.share(4.05) == 0.0
    broken = by_family["broken"]
    assert broken.workloads == 1 and broken.share(0) == 0.0
    assert by_family["triton_only"].workloads == 0 and by_family["triton_only"].skipped == 3
    page = render_html(traces, {})
    table = page[page.index("<table class='fast-p'>") :]
    row = table[table.index("<td>triton_only</td>") :].split("</tr>")[0]
    assert "&ndash;" in row
    assert "%" not in row  # never evaluated: no share, not 0%
    assert by_family["torch"].share(1.0) == 1.0 and by_family["torch"].share(1.05) == 0.0
    assert family("flashtune@gemm_n64_k64") == "flashtune" and family("plain") == "plain"


def test_line_chart_log_axes_and_reference_line() -> None:
    svg = line_chart(
        {"a": [(1, 0.01), (1000, 10.0)]},
        kind="k",
        title="t",
        x_label="x",
        y_label="y",
        log_x=True,
        log_y=True,
        ref_lines=[RefLine(100.0, "peak")],
    )
    page = parse_page(svg)
    assert page.find("svg", class_="plot") and page.find("g", class_="ref-line")
    assert "x (log)" in " ".join(page.text) and "peak" in " ".join(page.text)
    empty = line_chart({}, kind="k", title="t", x_label="x", y_label="y", empty_message="none")
    assert "class='no-data'" in empty and "none" in empty


def test_report_html_cli_writes_one_file(tmp_path: Path, traces: list[Trace]) -> None:
    ds = Dataset(tmp_path / "res")
    ds.add_definition(GEMM)
    for t in traces:
        ds.append_trace(t, author=family(t.solution or "x"))
    out = tmp_path / "out" / "report.html"
    result = CliRunner().invoke(
        app, ["report", "html", "-d", str(tmp_path / "res"), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]  # nothing beside it
    assert parse_page(out.read_text()).find("section", id="fast-p")
    written = write_html(traces, {}, tmp_path / "direct.html")
    assert written.read_text().startswith("<!doctype html>")


def test_report_files_are_ignored_by_git() -> None:
    ignore = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    assert "/flashtune-report.html" in ignore and "/flashtune-results/" in ignore


def test_interpreter_warnings_are_filtered(pytestconfig: pytest.Config) -> None:
    filters = pytestconfig.getini("filterwarnings")
    assert "ignore::RuntimeWarning:triton.runtime.interpreter" in filters
    assert "ignore::DeprecationWarning:triton.runtime.interpreter" in filters


def test_paged_cache_counts_the_pages_read() -> None:
    paged = Definition.model_validate(
        {
            "name": "toy_paged",
            "op_type": "gqa_paged",
            "axes": {"num_pages": {"type": "var"}, "num_kv_indices": {"type": "var"}},
            "inputs": {
                "k_cache": {"shape": ["num_pages"], "dtype": "float32"},
                "kv_indices": {"shape": ["num_kv_indices"], "dtype": "int32"},
            },
            "outputs": {"out": {"shape": None, "dtype": "float32"}},
            "reference": "def run(k_cache, kv_indices):\n    return k_cache.sum()\n",
        }
    )
    # 8 of 72 pages referenced: 8 float32 pages + 8 int32 indices
    assert bytes_moved(paged, {"num_pages": 72, "num_kv_indices": 8}) == 8 * 4 + 8 * 4

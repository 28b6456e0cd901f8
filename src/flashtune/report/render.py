"""rich tables for the summaries of report/tables.py (terminal output of run and report)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from flashtune.data.models import EvaluationStatus
from flashtune.report.tables import Comparison, Ranking, SolutionSummary

__all__ = ["summary_table", "ranking_table", "comparison_table", "status_text", "fmt_x"]

_SHORT = {
    EvaluationStatus.PASSED: "passed",
    EvaluationStatus.INCORRECT_SHAPE: "shape",
    EvaluationStatus.INCORRECT_DTYPE: "dtype",
    EvaluationStatus.INCORRECT_NUMERICAL: "numerical",
    EvaluationStatus.RUNTIME_ERROR: "runtime error",
    EvaluationStatus.COMPILE_ERROR: "compile error",
    EvaluationStatus.TIMEOUT: "timeout",
    EvaluationStatus.SKIPPED: "skipped",
}


def fmt_x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _fmt_ms(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1e3:.1f} us" if value < 1 else f"{value:.2f} ms"


def status_text(s: SolutionSummary) -> str:
    parts = []
    for status, n in sorted(
        s.statuses.items(), key=lambda kv: kv[0] is not EvaluationStatus.PASSED
    ):
        color = {"PASSED": "green", "SKIPPED": "dim"}.get(status.value, "red")
        parts.append(f"[{color}]{n} {_SHORT[status]}[/{color}]")
    return ", ".join(parts)


def summary_table(summaries: Sequence[SolutionSummary], title: str = "summary") -> Table:
    table = Table(title=title)
    for col, justify, width in (
        ("definition", "left", 20),
        ("solution", "left", 10),
        ("workloads", "left", 10),
        ("latency", "right", 9),
        ("vs ref", "right", 7),
        ("vs base", "right", 7),
        ("note", "left", 10),
    ):
        # One line per row: long reasons are cut, not wrapped (`report best` has them all).
        table.add_column(
            col,
            justify=justify,
            no_wrap=True,
            overflow="ellipsis",
            min_width=width,  # type: ignore[arg-type]
        )
    last = None
    for s in summaries:
        note = s.reason or ""
        if len(note) > 60:
            note = note[:57] + "..."
        if s.suspicious:
            note = (
                f"[yellow]{s.suspicious} result(s) >10x the best baseline: review[/yellow] " + note
            )
        table.add_row(
            s.definition if s.definition != last else "",
            s.solution,
            status_text(s),
            _fmt_ms(s.latency_ms),
            fmt_x(s.speedup_vs_reference),
            fmt_x(s.speedup_vs_baseline),
            note,
        )
        last = s.definition
    baselines = sorted({s.baseline for s in summaries if s.baseline})
    table.caption = (
        "latency: geomean over passed workloads; vs ref / vs base: geomean speedup over the "
        f"definition's reference / the baseline solution ({', '.join(baselines) or 'none'})"
    )
    return table


def ranking_table(rankings: Sequence[Ranking], title: str = "best solution per workload") -> Table:
    table = Table(title=title)
    for col in ("definition", "workload axes", "ranking (fastest first)", "failed"):
        table.add_column(col, overflow="fold")
    for r in rankings:
        axes = ", ".join(f"{k}={v}" for k, v in r.axes.items())
        ranking = "  >  ".join(
            f"{name} {_fmt_ms(ms)}" + (" [yellow](>10x: review)[/yellow]" if flag else "")
            for name, ms, flag in r.entries
        )
        failed = ", ".join(f"{n}: {s}" for n, s in r.failed)
        table.add_row(r.definition, axes, ranking, failed)
    return table


def comparison_table(rows: Sequence[Comparison], a: str, b: str, overall: float | None) -> Table:
    table = Table(title=f"speedup of {a} over {b} (latency {b} / latency {a})")
    for col, justify in (
        ("definition", "left"),
        ("workloads", "right"),
        ("geomean", "right"),
        ("min", "right"),
        ("max", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(r.definition, str(r.workloads), fmt_x(r.geomean), fmt_x(r.min), fmt_x(r.max))
    table.add_row("[bold]all[/bold]", str(sum(r.workloads for r in rows)), fmt_x(overall), "", "")
    return table

"""rich tables for the summaries of report/tables.py (terminal output of run and report)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import JustifyMethod
from rich.markup import escape
from rich.table import Table

from flashtune.data.models import EvaluationStatus
from flashtune.report.tables import (
    GPU_DIFFERS,
    NOISY_SPREAD,
    TIMING_DIFFERS,
    UNCERTAIN_FACTOR,
    Comparison,
    Ranking,
    SolutionSummary,
)

__all__ = [
    "summary_table",
    "ranking_table",
    "comparison_table",
    "status_text",
    "fmt_x",
    "fmt_speedup",
    "excluded_note",
    "fmt_spread",
    "noise_note",
]

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


def fmt_speedup(value: float | None, excluded: int) -> str:
    """A geomean speedup; "n/a: timing differs" where every pair was refused as unlike."""
    if value is None and excluded:
        return TIMING_DIFFERS
    return fmt_x(value)


def excluded_note(s: SolutionSummary) -> str:
    """How many speedups were left out of the geomeans, and why (empty when none)."""
    parts = []
    if s.excluded_reference:
        parts.append(f"{s.excluded_reference} vs ref")
    if s.excluded_baseline:
        parts.append(f"{s.excluded_baseline} vs base")
    if not parts:
        return ""
    # Short, so the row stays on one line; `report html` gives the methods that differed.
    return f"{TIMING_DIFFERS}: {', '.join(parts)} excluded"


def _fmt_ms(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1e3:.1f} us" if value < 1 else f"{value:.2f} ms"


def status_text(s: SolutionSummary) -> str:
    parts = []
    for status, n in sorted(
        s.statuses.items(), key=lambda kv: kv[0] is not EvaluationStatus.PASSED
    ):
        if status is EvaluationStatus.SKIPPED and s.correct_untimed:
            parts.append(f"[cyan]{s.correct_untimed} correct, not timed[/cyan]")
            n -= s.correct_untimed
            if not n:
                continue
        color = {"PASSED": "green", "SKIPPED": "dim"}.get(status.value, "red")
        parts.append(f"[{color}]{n} {_SHORT[status]}[/{color}]")
    return ", ".join(parts)


def fmt_spread(spread: float | None) -> str:
    """'±4%' (yellow past NOISY_SPREAD: too noisy to rank); '' when unknown."""
    if spread is None:
        return ""
    text = f"±{spread:.0%}" if spread >= 0.01 else "±<1%"
    return f"[yellow]{text}[/yellow]" if spread > NOISY_SPREAD else text


def _flagged_x(value: float | None, excluded: int, noisy: int) -> str:
    """A geomean speedup, with '?' when some of its workloads' speedups are not claimed."""
    text = fmt_speedup(value, excluded)
    return f"[yellow]{text}?[/yellow]" if noisy and value is not None else text


def noise_note(s: SolutionSummary) -> str:
    """Why the row's timing is not to be trusted as is (empty when it is)."""
    parts = []
    if s.spread is not None and s.spread > NOISY_SPREAD:
        parts.append(f"too noisy to rank (±{s.spread:.0%})")
    noisy = s.noisy_reference + s.noisy_baseline
    if noisy and s.noise_reason:
        parts.append(f"{noisy} speedup(s) not claimed: {s.noise_reason}")
    return "; ".join(parts)


def summary_table(summaries: Sequence[SolutionSummary], title: str = "summary") -> Table:
    table = Table(title=title)
    columns: tuple[tuple[str, JustifyMethod, int], ...] = (
        ("definition", "left", 20),
        ("solution", "left", 10),
        ("workloads", "left", 10),
        ("latency", "right", 9),
        ("±", "right", 4),
        ("vs ref", "right", 7),
        ("vs base", "right", 7),
        ("note", "left", 10),
    )
    for col, justify, width in columns:
        # One line per row: long reasons are cut, not wrapped (`report best` has them all).
        table.add_column(
            col,
            justify=justify,
            no_wrap=True,
            overflow="ellipsis",
            min_width=width,
        )
    last = None
    for s in summaries:
        note = s.reason or ""
        if len(note) > 60:
            note = note[:57] + "..."
        if excluded_note(s):
            note = f"[yellow]{escape(excluded_note(s))}[/yellow] " + note
        if noise_note(s):
            note = f"[yellow]{escape(noise_note(s))}[/yellow] " + note
        if s.suspicious:
            note = (
                f"[yellow]{s.suspicious} result(s) >10x the best baseline: review[/yellow] " + note
            )
        if s.gpu_reason:  # several GPU models: no mean of them (`report best` per workload)
            note = f"[yellow]{escape(s.gpu_reason)}[/yellow] " + note
        gpus = GPU_DIFFERS if s.gpu_reason else None
        table.add_row(
            s.definition if s.definition != last else "",
            s.solution,
            status_text(s),
            gpus or _fmt_ms(s.latency_ms),
            "" if gpus else fmt_spread(s.spread),
            gpus or _flagged_x(s.speedup_vs_reference, s.excluded_reference, s.noisy_reference),
            gpus or _flagged_x(s.speedup_vs_baseline, s.excluded_baseline, s.noisy_baseline),
            note,
        )
        last = s.definition
    baselines = sorted({s.baseline for s in summaries if s.baseline})
    excluded = sum(s.excluded_reference + s.excluded_baseline for s in summaries)
    noisy = sum(s.spread is not None and s.spread > NOISY_SPREAD for s in summaries)
    table.caption = (
        "latency: geomean over passed workloads; ±: the widest 95% interval of a workload's "
        "median, relative (min-max below 6 samples); vs ref / vs base: geomean speedup over the "
        f"definition's reference / the baseline solution ({', '.join(baselines) or 'none'}), "
        "over workloads where both were timed by one method; ?: not claimed for some "
        f"workloads (the intervals overlap, or span over {UNCERTAIN_FACTOR:g}x)"
        + (f"; {noisy} row(s) spread over ±{NOISY_SPREAD:.0%}: too noisy to rank" if noisy else "")
        + (
            f"; {TIMING_DIFFERS}: {excluded} speedup(s) timed differently or unknown, excluded"
            if excluded
            else ""
        )
    )
    return table


def ranking_table(rankings: Sequence[Ranking], title: str = "best solution per workload") -> Table:
    table = Table(title=title)
    for col in ("definition", "workload axes", "ranking (fastest first)", "failed"):
        table.add_column(col, overflow="fold")
    for r in rankings:
        axes = ", ".join(f"{k}={v}" for k, v in r.axes.items())
        mixed = r.mixed_timing  # not like for like: say how each was timed
        parts = [
            f"{name} {_fmt_ms(ms)}"
            + (f" {fmt_spread(r.spreads.get(name))}" if r.spreads.get(name) is not None else "")
            + (f" [dim]({r.timing.get(name) or 'timing unknown'})[/dim]" if mixed else "")
            + (f" [dim]on {escape(r.gpus.get(name) or '?')}[/dim]" if r.mixed_gpus else "")
            + (" [yellow](>10x: review)[/yellow]" if flag else "")
            for name, ms, flag in r.entries
        ]
        # "≈": the two intervals overlap, so the order between them is not claimed
        ranking = "".join(
            part + (("  ≈  " if r.tied(i) else "  >  ") if i + 1 < len(parts) else "")
            for i, part in enumerate(parts)
        )
        failed = ", ".join(
            f"{n}: correct, not timed" if n in r.untimed else f"{n}: {s}" for n, s in r.failed
        )
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
    table.add_column("within noise", justify="right")
    table.add_column("excluded", justify="left")
    for r in rows:
        table.add_row(
            r.definition,
            str(r.workloads),
            fmt_speedup(r.geomean, r.excluded),
            fmt_x(r.min),
            fmt_x(r.max),
            f"[yellow]{r.within_noise}[/yellow]" if r.within_noise else "",
            escape(f"{r.excluded}: {r.reason}") if r.excluded else "",
        )
    excluded = sum(r.excluded for r in rows)
    gpus = sorted({r.gpu or "?" for r in rows if r.workloads})
    table.add_row(
        "[bold]all[/bold]",
        str(sum(r.workloads for r in rows)),
        # Rows from several GPU models are not one population: no overall mean.
        GPU_DIFFERS if len(gpus) > 1 else fmt_speedup(overall, excluded),
        "",
        "",
        str(sum(r.within_noise for r in rows) or ""),
        f"{excluded} pair(s): {TIMING_DIFFERS}" if excluded else "",
    )
    table.caption = (
        "geomean over workloads where both passed and were timed by one method; pairs timed "
        f"differently (or unknown) are excluded and counted ({TIMING_DIFFERS}); within noise: "
        "pairs whose 95% intervals overlap (in the geomean, no speedup claimed)"
    )
    return table

"""`flashtune report summary | best | compare A B | html` over the Traces of datasets."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from flashtune.cli.common import (
    RESULTS,
    dataset_roots,
    default_dataset,
    fail,
    open_dataset,
    warn,
)
from flashtune.cli.output import CSV, JSON, Format, emit_rows, output_format, result_console

if TYPE_CHECKING:
    from flashtune.data import Dataset, Trace

__all__ = ["register", "report_app"]

console = result_console()
report_app = typer.Typer(help="Tables, comparisons and HTML from Traces.", no_args_is_help=True)

_DATASET = typer.Option(
    None,
    "--dataset",
    "-d",
    help="dataset roots with traces/ (repeatable; default: $FLASHTUNE_DATASET, else the "
    "bundled dataset; and ./flashtune-results, where `flashtune run` writes)",
)


def _load(dataset: Optional[list[Path]], definition: Optional[str]) -> tuple[Dataset, list[Trace]]:
    roots = dataset_roots(dataset)
    # The default dataset's definitions come last: traces of the bundled run find theirs.
    ds = open_dataset(roots, lookup=[default_dataset()])
    every = ds.all_traces()
    traces = [t for t in every if definition is None or fnmatchcase(t.definition, definition)]
    for error in ds.errors:  # a corrupt line: reported with file:line, skipped
        warn(f"{error} (skipped)")
    where = ", ".join(map(str, roots))
    if not every:
        fail(f"no traces under {where} (`flashtune run` writes them to ./{RESULTS})")
    if not traces:
        names = sorted({t.definition for t in every})
        fail(
            f"--definition {definition!r} matches none of the {len(names)} traced definitions "
            f"under {where} ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
        )
    return ds, traces


@report_app.command("summary")
def summary(
    dataset: Optional[list[Path]] = _DATASET,
    definition: Optional[str] = typer.Option(None, "--definition", help="definition glob"),
    as_json: bool = JSON,
    as_csv: bool = CSV,
) -> None:
    """Per definition and solution: statuses, pass rate, geomean latency and speedups."""
    from flashtune.report.render import summary_table
    from flashtune.report.tables import summarize

    fmt = output_format(as_json, as_csv)
    _, traces = _load(dataset, definition)
    rows = summarize(traces)
    emit_rows(rows, fmt, lambda: summary_table(rows), console)
    if fmt is not Format.TABLE:
        return
    by_solution: dict[str, list[int]] = {}
    for s in rows:
        ran = s.total - s.statuses.get("SKIPPED", 0)
        acc = by_solution.setdefault(s.solution, [0, 0, 0])
        acc[0] += s.passed
        acc[1] += ran
        acc[2] += s.correct_untimed  # checked correct, not timed (SKIPPED, with a correctness)

    def rate(name: str, passed: int, ran: int, untimed: int) -> str:
        parts = [f"{passed}/{ran} ({passed / ran:.0%})"] if ran else []
        if untimed:
            parts.append(f"{untimed} correct, not timed")
        return f"{name} {', '.join(parts) or 'skipped'}"

    rates = ", ".join(rate(name, *acc) for name, acc in sorted(by_solution.items()))
    console.print(f"pass rates (of triples that ran): {rates}")


@report_app.command("best")
def best(
    dataset: Optional[list[Path]] = _DATASET,
    definition: Optional[str] = typer.Option(None, "--definition", help="definition glob"),
    as_json: bool = JSON,
    as_csv: bool = CSV,
) -> None:
    """Per definition and workload: passed solutions ranked fastest first."""
    from flashtune.report.render import ranking_table
    from flashtune.report.tables import rank

    fmt = output_format(as_json, as_csv)
    _, traces = _load(dataset, definition)
    rankings = rank(traces)
    # For programs: one row per (workload, solution), passed ones by rank, then the failed.
    rows = [
        {
            "definition": r.definition,
            "workload": r.workload,
            "axes": r.axes,
            "solution": solution,
            "rank": place,
            "latency_ms": latency,
            "flagged": flagged,
            "status": "PASSED",
            "timing": r.timing.get(solution),
            "gpu": r.gpus.get(solution),
        }
        for r in rankings
        for place, (solution, latency, flagged) in enumerate(r.entries, 1)
    ] + [
        {"definition": r.definition, "workload": r.workload, "axes": r.axes}
        | {"solution": solution, "rank": None, "latency_ms": None, "status": status}
        for r in rankings
        for solution, status in r.failed
    ]
    emit_rows(rows, fmt, lambda: ranking_table(rankings), console)


@report_app.command("compare")
def compare(
    a: str = typer.Argument(..., help="solution name glob (e.g. flashtune)"),
    b: str = typer.Argument(..., help="solution name glob (e.g. flashinfer)"),
    dataset: Optional[list[Path]] = _DATASET,
    definition: Optional[str] = typer.Option(None, "--definition", help="definition glob"),
    as_json: bool = JSON,
    as_csv: bool = CSV,
) -> None:
    """Speedup of A over B (latency B / latency A) per definition: geomean, min, max.
    --json/--csv give the rows per definition (the overall geomean is the table's)."""
    from flashtune.report.render import comparison_table
    from flashtune.report.tables import compare as compare_traces

    fmt = output_format(as_json, as_csv)
    _, traces = _load(dataset, definition)
    rows, overall = compare_traces(traces, a, b)
    if not rows:
        fail(f"no workload where both {a!r} and {b!r} passed")
    emit_rows(rows, fmt, lambda: comparison_table(rows, a, b, overall), console)


@report_app.command("html")
def html_command(
    out: Path = typer.Option(
        Path("flashtune-report.html"), "--out", "-o", help="the HTML file to write"
    ),
    dataset: Optional[list[Path]] = _DATASET,
    definition: Optional[str] = typer.Option(None, "--definition", help="definition glob"),
    e2e: Optional[Path] = typer.Option(
        None, "--e2e", help="`flashtune e2e` rows (JSONL): adds the End to end section"
    ),
) -> None:
    """Write one self-contained HTML file (inline SVG plots, no other files): environment,
    summary, and per definition the ranking, latency and throughput plots, fast_p curves."""
    from flashtune.report.e2e import read_e2e_rows
    from flashtune.report.html import write_html

    ds, traces = _load(dataset, definition)
    try:
        e2e_rows = read_e2e_rows(e2e) if e2e is not None else None
    except (OSError, ValueError) as exc:
        fail(f"--e2e: {exc}")
    path = write_html(traces, ds.definitions, out, e2e_rows, str(e2e or ""))
    console.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Mount `report` on the flashtune command."""
    app.add_typer(report_app, name="report")

"""The `flashtune` command: the top layer, above everything it drives.

One module per sub-command group (run.py: `flashtune run`, report.py, tune.py, capture.py,
apply.py, traces.py), mounted here by plain imports; this module holds the dataset commands
(validate, list, env, definitions).
"""

from __future__ import annotations

# First, before the imports below take their seconds (torch): from here on a stop signal
# ends the program cleanly (flashtune/cli/stopping.py), not with a traceback.
from flashtune.cli import stopping  # isort: skip

import json
import logging
import sys
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.table import Table

from flashtune import __version__, env
from flashtune.cli import apply, capture, e2e, report, run, serve, solutions, traces, tune
from flashtune.cli.common import (
    bundled_dataset,
    dataset_roots,
    default_dataset,
    fail,
    missing_blobs,
    not_a_dataset,
    open_dataset,
    shadowed_definitions,
    warn,
)
from flashtune.cli.output import CSV, JSON, Format, emit_rows, output_format, result_console

if TYPE_CHECKING:
    from flashtune.data import Dataset

__all__ = ["app", "bundled_dataset", "main"]

app = typer.Typer(
    name="flashtune",
    help="Fast, autotuned LLM-inference kernels and a FlashInfer-Trace benchmark database.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
definitions_app = typer.Typer(
    help="Generate Definitions from flashtune's op schemas.", no_args_is_help=True
)
app.add_typer(definitions_app, name="definitions")

console = Console()
err_console = Console(stderr=True)


@app.callback()
def _main(
    log_level: Optional[str] = typer.Option(
        None, "--log-level", help="DEBUG, INFO, WARNING or ERROR"
    ),
) -> None:
    level = (log_level or env.LOG_LEVEL.get()).upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.WARNING), format="%(levelname)s %(name)s: %(message)s"
    )


@app.command()
def version() -> None:
    """Print flashtune's version."""
    console.print(__version__)


@app.command("env")
def env_command(
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Print the platform snapshot and every FLASHTUNE_* setting with its value and source."""
    from flashtune import platform

    snap = platform.snapshot()
    settings = env.describe()
    if as_json:
        payload = {
            "platform": snap,
            "settings": {n: {"value": v, "source": s} for n, v, s, _ in settings},
        }
        console.print_json(json.dumps(payload))
        return
    table = Table(title="platform", show_header=False)
    for key, value in snap.items():
        table.add_row(key, str(value))
    console.print(table)
    table = Table(title="settings")
    for column in ("name", "value", "source", "meaning"):
        table.add_column(column, overflow="fold")
    for row in settings:
        table.add_row(*row)
    console.print(table)


@app.command()
def validate(
    paths: Optional[list[Path]] = typer.Argument(
        None,
        help="dataset roots (default: $FLASHTUNE_DATASET, else the bundled dataset; "
        "and ./flashtune-results when it exists)",
    ),
) -> None:
    """Check datasets: print counts per kind and every error found; exit 1 on errors."""
    from flashtune.data import Dataset

    total_errors = 0
    roots = dataset_roots(paths)
    for message in shadowed_definitions(roots):
        warn(message)
    for path in roots:
        problem = not_a_dataset(path)
        if problem is not None:
            err_console.print(f"[red]error[/red]: {problem}", highlight=False)
            total_errors += 1
            continue
        ds = Dataset(path)
        counts = ds.counts()
        errors = ds.errors
        total_errors += len(errors)
        summary = ", ".join(f"{n} {kind}" for kind, n in counts.items())
        status = "[green]ok[/green]" if not errors else f"[red]{len(errors)} error(s)[/red]"
        console.print(f"{path}: {summary}: {status}")
        for error in errors:
            console.print(f"  {error}", markup=False, highlight=False)
        _report_missing_blobs(ds)
    raise typer.Exit(1 if total_errors else 0)


_BLOBS_SHOWN = 5


def _report_missing_blobs(ds: Dataset) -> None:
    """Absent blobs are not errors (a published dataset often ships without them: `run`
    synthesizes those inputs), but the numbers then come from other data: say so."""
    blobs = missing_blobs(ds, ds.definitions.values())
    if not blobs:
        return
    workloads = len({(b.definition, b.workload) for b in blobs})
    console.print(
        f"  {len(blobs)} safetensors input(s) of {workloads} workload(s) have no blob file: "
        "`flashtune run` synthesizes them (seeded random data that satisfies the constraints)",
        highlight=False,
    )
    for blob in blobs[:_BLOBS_SHOWN]:
        console.print(
            f"    {blob.definition} {blob.workload} {blob.input}: {blob.path}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if len(blobs) > _BLOBS_SHOWN:
        console.print(f"    ... and {len(blobs) - _BLOBS_SHOWN} more")


_KINDS = ("definitions", "solutions", "workloads", "traces")


@app.command("list")
def list_command(
    kind: str = typer.Argument(..., help="definitions | solutions | workloads | traces"),
    dataset: Optional[list[Path]] = typer.Option(
        None,
        "--dataset",
        "-d",
        help="dataset roots (repeatable; default: $FLASHTUNE_DATASET, else the bundled "
        "dataset; and ./flashtune-results when it exists)",
    ),
    op_type: Optional[str] = typer.Option(None, "--op-type", help="only this op_type"),
    name: Optional[str] = typer.Option(None, "--name", help="definition name glob"),
    as_json: bool = JSON,
    as_csv: bool = CSV,
) -> None:
    """List what a dataset holds; exit 1 when nothing matches."""
    if kind not in _KINDS:
        fail(f"kind must be one of {', '.join(_KINDS)}, got {kind!r}", code=2)
    fmt = output_format(as_json, as_csv)
    roots = dataset_roots(dataset)
    # Traces find their definitions (for --op-type) in the default dataset too.
    ds = open_dataset(roots, lookup=[default_dataset()] if kind == "traces" else [])
    rows = _list_rows(ds, kind, op_type, name)
    for error in ds.errors:
        warn(f"{error}")
    if not rows:
        filters = " ".join(
            f"{flag} {value!r}"
            for flag, value in (("--op-type", op_type), ("--name", name))
            if value
        )
        fail(
            f"no {kind} in {', '.join(map(str, roots))}"
            + (f" matching {filters}" if filters else "")
        )

    def table() -> Table:
        out = Table()
        for column in rows[0]:
            out.add_column(column.replace("_", " "), overflow="fold")
        for row in rows:
            out.add_row(*(_cell(v) for v in row.values()))
        return out

    console = result_console()
    emit_rows(rows, fmt, table, console)
    if fmt is Format.TABLE:
        console.print(f"{len(rows)} {kind}")


def _cell(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return "" if value is None else str(value)


def _list_rows(
    ds: Dataset, kind: str, op_type: Optional[str], name: Optional[str]
) -> list[dict[str, object]]:
    """One dict per listed item; the table's columns are its keys."""
    defs = ds.find_definitions(op_type=op_type, name=name)
    if kind == "definitions":
        return [
            {
                "name": d.name,
                "op_type": d.op_type,
                "const_axes": dict(d.const_axes),
                "var_axes": list(d.var_axes),
            }
            for d in defs
        ]
    if kind == "solutions":
        return [
            {
                "name": s.name,
                "definition": s.definition,
                "author": s.author,
                "language": s.spec.language,
                "entry_point": s.spec.entry_point,
            }
            for d in defs
            for s in ds.solutions_for(d.name)
        ]
    if kind == "workloads":
        return [
            {"definition": d.name, "uuid": w.workload.uuid, "axes": dict(w.workload.axes)}
            for d in defs
            for w in ds.workloads_for(d.name)
        ]
    rows: list[dict[str, object]] = []
    # Every trace, whether or not its definition is in these roots (a results folder holds
    # traces only); --op-type needs the definition.
    for t in ds.all_traces():
        known = ds.definitions.get(t.definition)
        if name is not None and not fnmatchcase(t.definition, name):
            continue
        if op_type is not None and (known is None or known.op_type != op_type):
            continue
        ev = t.evaluation
        if ev is None:
            continue
        rows.append(
            {
                "definition": t.definition,
                "solution": t.solution or "",
                "workload": t.workload.uuid,
                "status": ev.status.value,
                "latency_ms": ev.performance.latency_ms if ev.performance else None,
            }
        )
    return rows


@definitions_app.command("dump")
def definitions_dump(
    out: Path = typer.Argument(..., help="folder to write definitions/<op_type>/<name>.json into"),
    model: Optional[list[str]] = typer.Option(
        None, "--model", help="model configuration (repeatable); default all"
    ),
) -> None:
    """Write the Definitions of every schema'd op at the shapes of known models."""
    from flashtune.ops import load_all
    from flashtune.schema.dump import dump_definitions

    load_all()  # the op modules register their example calls
    try:
        written = dump_definitions(out, model or None)
    except ValueError as exc:
        fail(str(exc), code=2)
    console.print(f"wrote {len(written)} definitions under {out}")


run.register(app)
report.register(app)
tune.register(app)
capture.register(app)
apply.register(app)
traces.register(app)
solutions.register(app)
e2e.register(app)
serve.register(app)


def main() -> None:
    stopping.install()
    try:
        with stopping.guarded():
            app()
    except stopping.Stopped as stop:
        stopping.finish(stop.signum)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)

"""`flashtune apply show`: which solution wins which buckets, per definition."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from flashtune.apply.table import ApplyTable

__all__ = ["register"]

app = typer.Typer(help="Run-time dispatch to the best traced solutions.", no_args_is_help=True)
console = Console()


@app.command("show")
def show(
    dataset: Optional[Path] = typer.Option(
        None, "--dataset", "-d", help="dataset root (default FLASHTUNE_DATASET)"
    ),
    definition: Optional[str] = typer.Option(None, "--definition", help="only this definition"),
    rebuild: bool = typer.Option(False, "--rebuild", help="ignore the saved table"),
) -> None:
    """Print, per definition, the winning solution of each var-axes bucket."""
    from flashtune import env
    from flashtune.apply.table import ApplyTable
    from flashtune.data import Dataset

    ds = Dataset(dataset if dataset is not None else env.DATASET.get())
    table = ApplyTable.build(ds) if rebuild else ApplyTable.load(ds)
    _show_rejected(table, definition)
    if not table.definitions:
        console.print(f"no passing traces in {ds.root}: nothing to apply")
        return
    for name, dt in sorted(table.definitions.items()):
        if definition is not None and name != definition:
            continue
        t = Table(title=f"{name}  (default: {dt.default or 'fallback'})")
        t.add_column("bucket (" + ", ".join(dt.axes) + ")")
        for col in ("solution", "latency ms", "score", "workloads", "runners-up"):
            t.add_column(col)
        for key, w in sorted(dt.buckets.items()):
            t.add_row(
                ", ".join(f"<={v}" for v in key),
                w.solution,
                f"{w.latency_ms:.4f}",
                f"{w.score:.3f}",
                str(w.workloads),
                ", ".join(w.runners_up),
            )
        console.print(t)


_REJECTED_SHOWN = 20


def _show_rejected(table: ApplyTable, definition: Optional[str]) -> None:
    """The traces the trust checks left out (or counted as failed), and why."""
    rejected = [r for r in table.rejected if definition is None or r.definition == definition]
    if not rejected:
        return
    t = Table(title=f"{len(rejected)} traces not used or counted as failed")
    for col in ("definition", "solution", "workload", "reason"):
        t.add_column(col)
    for r in rejected[:_REJECTED_SHOWN]:
        t.add_row(r.definition, str(r.solution), r.workload, r.reason)
    console.print(t)
    if len(rejected) > _REJECTED_SHOWN:
        console.print(f"... and {len(rejected) - _REJECTED_SHOWN} more")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="apply")

"""`flashtune apply show`: which solution wins which buckets, per definition."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.table import Table

from flashtune.cli.common import (
    bundled_dataset,
    dataset_roots,
    default_dataset,
    fail,
    open_dataset,
)

if TYPE_CHECKING:
    from flashtune.apply.table import ApplyTable

__all__ = ["register"]

app = typer.Typer(help="Run-time dispatch to the best traced solutions.", no_args_is_help=True)
console = Console()


@app.command("show")
def show(
    dataset: Optional[list[Path]] = typer.Option(
        None,
        "--dataset",
        "-d",
        help="dataset roots (repeatable; default: $FLASHTUNE_DATASET, else the bundled "
        "dataset; and ./flashtune-results when it exists)",
    ),
    definition: Optional[str] = typer.Option(None, "--definition", help="only this definition"),
    rebuild: bool = typer.Option(False, "--rebuild", help="ignore the saved table"),
) -> None:
    """Print, per definition, the winning solution of each var-axes bucket (writes nothing:
    the saved table is used when current, else one is built in memory)."""
    from flashtune.apply.table import ApplyTable

    roots = dataset_roots(dataset)
    # The bundled solutions attach as apply attaches them (ApplyRuntime): a run on a
    # captured dataset traced them.
    ds = open_dataset(roots, lookup=[default_dataset()], solutions_from=[bundled_dataset()])
    # Read-only: a rebuilt table is not saved (the folder may be someone else's, or the
    # installed package); `flashtune.apply()` saves its own.
    table = ApplyTable.build(ds) if rebuild else ApplyTable.load(ds, persist=False)
    _show_rejected(table, definition)
    where = ", ".join(map(str, roots))
    if not table.definitions:
        if table.rejected:  # the table above says why each was left out: not silent
            console.print(f"no trusted passing traces in {where}: nothing to apply")
            return
        fail(f"no passing traces in {where}: nothing to apply")
    if definition is not None and definition not in table.definitions:
        fail(
            f"--definition {definition!r}: no passing traces for it in {where} "
            f"(definitions with some: {', '.join(sorted(table.definitions))})"
        )
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
# The reasons of flashtune.data.signing.trace_signature_problem that `traces trust` cures.
_NOT_OURS = ("not signed", "signed with another key")


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
    unsigned = sum(r.reason.startswith(_NOT_OURS) for r in rejected)
    if unsigned:
        console.print(
            f"{unsigned} of them were not signed by `flashtune run` here: apply trusts only "
            "its own traces; `flashtune traces trust PATH` imports traces you trust "
            "(docs/capture-and-apply.md)"
        )


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="apply")

"""`flashtune run`'s sources of solutions: the datasets read for their solutions only.

A dataset written by capture has definitions and workloads but no solutions. `run` therefore
attaches the solutions of the bundled dataset (unless --no-bundled-solutions) and of every
--solutions-from dataset to the definitions of the --dataset roots whose contract they were
written for (`Dataset(solution_sources=...)`, `Definition.contract`): only the roots'
workloads run. A definition of the same name but another contract (another dtype, eps,
layout) gets none of them, and the run says so before it starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from flashtune.cli.common import bundled_dataset, err_console, warn

if TYPE_CHECKING:
    from flashtune.cli.run_checks import Selection
    from flashtune.data import Dataset

__all__ = ["solution_sources", "say_attachments"]

_SHOWN = 5  # unattached definitions named one by one; the rest are counted


def solution_sources(given: Sequence[Path] | None, bundled: bool) -> list[Path]:
    """--solutions-from, then the bundled dataset unless --no-bundled-solutions."""
    sources = list(given or [])
    if bundled:
        sources.append(bundled_dataset())
    return sources


def say_attachments(ds: Dataset, roots: Sequence[Path], selection: Selection) -> None:
    """Before the run: which sources' solutions attach to the selected definitions (a note),
    which do not because the contracts differ (a warning each), and a note when the bundled
    dataset is one of the roots beside others (its workloads run too)."""
    bundled = bundled_dataset()
    resolved = [r.expanduser().resolve() for r in roots]
    if len(roots) > 1 and bundled in resolved:
        err_console.print(
            f"note: -d {bundled} (the bundled dataset) runs its own workloads too; for its "
            "solutions alone leave it out: they attach to the definitions of the same "
            "contract by default",
            highlight=False,
        )
    selected = ds.find_definitions(selection.op_type, selection.definitions)
    attached: dict[Path, set[str]] = {}
    for definition in selected:
        for solution in ds.solutions_for(definition.name, selection.solutions):
            source = ds.attached_from(definition.name, solution.name)
            if source is not None:
                attached.setdefault(source, set()).add(definition.name)
    for source, names in attached.items():
        err_console.print(
            f"note: solutions from {source} run on {len(names)} definition"
            f"{'s' if len(names) != 1 else ''} of the same contract; only the workloads of "
            f"{', '.join(map(str, roots))} run",
            highlight=False,
        )
    names = {d.name for d in selected}
    unattached = [u for u in ds.unattached if u.definition in names]
    for u in unattached[:_SHOWN]:
        warn(u.message())
    if len(unattached) > _SHOWN:
        warn(f"... and {len(unattached) - _SHOWN} more definitions whose contract differs")

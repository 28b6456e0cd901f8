"""`flashtune solutions add DATASET`, and what `flashtune run --with` / `--reference-only` use:
solutions for any dataset's definitions, made from the op schemas.

A FlashInfer-Trace dataset has definitions and workloads but few solutions or none. For each
definition whose contract an op schema has (flashtune.ops.bundle.supply), flashtune's,
FlashInfer's and torch's solutions are written next to a copy of the definition they were
made for, so `flashtune run` attaches them to it (`Dataset(solution_sources=...)`) and
FlashInfer-Bench reads them as any other solution files. `--reference-only` writes each
definition's own reference as its one solution (author "baseline", FlashInfer-Bench's
baseline author): a run checks the reference on every workload and times it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape

from flashtune.cli.common import dataset_roots, err_console, fail, not_a_dataset, warn

if TYPE_CHECKING:
    from flashtune.data import Dataset, Definition
    from flashtune.ops.bundle.supply import Supply

__all__ = ["parse_kinds", "register", "say_supplied", "write_supplied"]

app = typer.Typer(help="Solutions for a dataset's definitions, made from flashtune's op schemas.")
_SHOWN = 5  # definitions without solutions named one by one; the rest are counted


def parse_kinds(text: str) -> list[str]:
    """`flashtune,flashinfer,torch` -> the kinds, checked (exit 2 on an unknown one)."""
    from flashtune.ops.bundle.supply import KINDS

    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if not kinds or unknown:
        fail(f"--with {text}: expected a comma-separated list of {', '.join(KINDS)}", code=2)
    return kinds


def write_supplied(
    definitions: Iterable[Definition],
    into: Path,
    kinds: Sequence[str] = (),
    reference_only: bool = False,
    overwrite: bool = False,
) -> list[Supply]:
    """Write the solutions of `kinds` (or each reference, `reference_only`) of `definitions`
    into the dataset root `into`, with each definition beside them unless `into` holds one
    of that name already (the dataset's own). Returns what was found per definition; a
    solution file already there is kept unless `overwrite`."""
    from flashtune.data import Dataset
    from flashtune.ops import load_all
    from flashtune.ops.bundle.supply import Supply, reference_solution, supply_all

    load_all()  # the op modules register their schemas
    definitions = list(definitions)
    if reference_only:
        found = [Supply(d, None, [reference_solution(d)]) for d in definitions]
    else:
        found = supply_all(definitions, kinds)
    target = Dataset(into)
    for item in found:
        if not item.solutions:
            continue
        if item.definition.name not in target.definitions:
            target.add_definition(item.definition)
        for solution in item.solutions:
            try:
                target.add_solution(solution, overwrite=overwrite)
            except FileExistsError:
                continue  # written by an earlier run, or the user's own: kept
    return found


def say_supplied(found: Sequence[Supply], what: str) -> None:
    """One note with the counts per op type; a warning per definition left without."""
    supplied = Counter(s.definition.op_type for s in found if s.supplied)
    total = Counter(s.definition.op_type for s in found)
    per_type = ", ".join(f"{t} {supplied[t]}/{total[t]}" for t in sorted(total))
    count = sum(len(s.solutions) for s in found)
    err_console.print(
        f"note: {what}: {count} solutions for {sum(supplied.values())} of {len(found)} "
        f"definitions ({per_type})",
        highlight=False,
    )
    missing = [s for s in found if not s.supplied]
    for s in missing[:_SHOWN]:
        warn(f"no solutions for {s.definition.name}: {'; '.join(s.problems)[:400]}")
    if len(missing) > _SHOWN:
        warn(f"... and {len(missing) - _SHOWN} more definitions without solutions")
    for s in found:  # an entry that cannot take the definition's constants
        if s.supplied and s.problems:
            warn("; ".join(s.problems))


def _selected(ds: Dataset, op_type: str | None, glob: str | None) -> list[Definition]:
    return ds.find_definitions(op_type, glob)


@app.command("add")
def add(
    dataset: Path = typer.Argument(..., help="dataset root to write solutions/ into"),
    with_kinds: str = typer.Option(
        "flashtune,flashinfer,torch",
        "--with",
        help="the solutions to write: a comma-separated list of flashtune, flashinfer, torch",
    ),
    definitions: Optional[str] = typer.Option(
        None, "--definitions", help="definition name glob, e.g. 'gqa_paged_*'"
    ),
    op_type: Optional[str] = typer.Option(
        None, "--op-type", help="only definitions of this op_type"
    ),
    reference_only: bool = typer.Option(
        False,
        "--reference-only",
        help="write each definition's reference as its one solution instead (author baseline)",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace solution files there"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="say what would be written; write nothing"
    ),
) -> None:
    """Write flashtune's, FlashInfer's and torch's solutions for every definition of DATASET
    whose contract an op schema has (name, axes, inputs, outputs, the reference's constants);
    say which definitions get none and why."""
    from flashtune.data import Dataset
    from flashtune.ops import load_all
    from flashtune.ops.bundle.supply import Supply, reference_solution, supply_all

    kinds = parse_kinds(with_kinds)
    problem = not_a_dataset(dataset)
    if problem is not None:
        fail(problem, code=2)
    ds = Dataset(dataset)
    selected = _selected(ds, op_type, definitions)
    if not selected:
        fail(f"{dataset}: no definition selected", code=2)
    if dry_run:
        load_all()
        found = (
            [Supply(d, None, [reference_solution(d)]) for d in selected]
            if reference_only
            else supply_all(selected, kinds)
        )
    else:
        found = write_supplied(selected, dataset, kinds, reference_only, overwrite)
    say_supplied(found, f"{'would write' if dry_run else 'wrote'} to {escape(str(dataset))}")


@app.command("coverage")
def coverage(
    dataset: Optional[list[Path]] = typer.Argument(
        None, help="dataset roots (default: $FLASHTUNE_DATASET, else the bundled dataset)"
    ),
) -> None:
    """Per op type: definitions, those whose contract an op schema has, those that get
    solutions (and of which kinds); nothing is written."""
    from rich.table import Table

    from flashtune.cli.output import result_console
    from flashtune.data import Dataset
    from flashtune.ops import load_all
    from flashtune.ops.bundle.supply import supply_all

    roots = dataset_roots(dataset, with_results=False)
    load_all()
    found = supply_all(Dataset(roots).find_definitions(None, None))
    table = Table("op_type", "definitions", "schema matches", "with solutions", "solutions")
    for op_type in sorted({s.definition.op_type for s in found}):
        mine = [s for s in found if s.definition.op_type == op_type]
        kinds = Counter(sol.name.split("@")[0] for s in mine for sol in s.solutions)
        table.add_row(
            op_type,
            str(len(mine)),
            str(sum(s.match is not None for s in mine)),
            str(sum(s.supplied for s in mine)),
            ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "-",
        )
    result_console().print(table)
    for op_type in sorted({s.definition.op_type for s in found}):
        for why, count in _why_none([s for s in found if s.definition.op_type == op_type]):
            err_console.print(
                f"note: {op_type}: {count} without solutions: {escape(why)}", highlight=False
            )


def _why_none(found: Sequence[Supply]) -> list[tuple[str, int]]:
    """Why definitions get no solutions, each reason once with how many it concerns (the
    definition's name left out, so that one reason shared by several reads once)."""
    reasons: Counter[str] = Counter()
    for s in found:
        if s.supplied:
            continue
        why = "; ".join(s.problems) or "no reason given"
        why = why.replace(f"{s.definition.name}: ", "").replace(s.definition.name, "it")
        reasons[why if len(why) <= 240 else why[:237] + "..."] += 1
    return sorted(reasons.items(), key=lambda item: (-item[1], item[0]))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="solutions")

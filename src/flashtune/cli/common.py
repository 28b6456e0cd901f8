"""What the sub-commands share: the one rule for which datasets a command reads, and the
checks that make a mistake say so instead of succeeding silently.

The default dataset rule, the same for every command: the roots given with --dataset/-d
(repeatable); without -d, $FLASHTUNE_DATASET when it is set, else the bundled dataset, and
after it ./flashtune-results (where `flashtune run` writes by default) when that folder
exists. `run` reads the same dataset for what to run and writes to --out (default
./flashtune-results), which it also reads for --resume; the solutions of the bundled dataset
(and of each --solutions-from) run too, on the definitions whose contract they were written
for (a captured dataset has none of its own), and contribute no workloads. Commands that
read traces look their definitions up in the default dataset too, so the traces of a
bundled run find theirs.
Read-only commands (list, validate, report summary/best/compare, apply show) never write.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

from flashtune import env

if TYPE_CHECKING:  # the data layer imports torch: `flashtune --help` should not wait for it
    from flashtune.data import Dataset, Definition

__all__ = [
    "RESULTS",
    "DATASET_PARTS",
    "MissingBlob",
    "bundled_dataset",
    "default_dataset",
    "dataset_roots",
    "open_dataset",
    "not_a_dataset",
    "shadowed_definitions",
    "missing_blobs",
    "fail",
    "warn",
]

# Where `flashtune run` writes by default (its --out), relative to the current folder.
RESULTS = Path("flashtune-results")
# A folder is a dataset when it holds at least one of these (a results folder: traces/ only).
DATASET_PARTS = ("definitions", "solutions", "workloads", "traces", "skipped")

err_console = Console(stderr=True, soft_wrap=True)  # paths stay on one line


def bundled_dataset() -> Path:
    """The dataset shipped inside the package (the default benchmark); the folder of
    `flashtune.data.dataset.bundled_root`, found here without importing the data layer
    (torch)."""
    return Path(__file__).resolve().parents[1] / "dataset"


def default_dataset() -> Path:
    """$FLASHTUNE_DATASET when set, else the bundled dataset."""
    if env.DATASET.name in os.environ:
        return env.DATASET.get()
    return bundled_dataset()


def dataset_roots(given: Optional[Sequence[Path]], with_results: bool = True) -> list[Path]:
    """The roots a command reads: `given` (-d), else the default dataset and the results
    folder of `flashtune run` when it exists (`with_results`)."""
    if given:
        return list(given)
    roots = [default_dataset()]
    if with_results and RESULTS.is_dir():
        roots.append(RESULTS)
    return roots


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `error: message` on stderr and exit with `code` (2: a bad argument)."""
    err_console.print(f"[red]error[/red]: {escape(message)}", highlight=False)
    raise typer.Exit(code)


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning[/yellow]: {escape(message)}", highlight=False)


def not_a_dataset(root: Path) -> str | None:
    """Why `root` cannot be read as a dataset (None: it can)."""
    if not root.exists():
        return f"{root}: no such folder"
    if not root.is_dir():
        return f"{root}: not a folder"
    if not any((root / part).is_dir() for part in DATASET_PARTS):
        parts = ", ".join(f"{p}/" for p in DATASET_PARTS)
        return f"{root}: not a dataset (it has none of {parts})"
    return None


def open_dataset(
    roots: Sequence[Path], lookup: Sequence[Path] = (), solutions_from: Sequence[Path] = ()
) -> Dataset:
    """A Dataset over `roots` (then `lookup`, roots read for their definitions only), with
    the solutions of `solutions_from` attached to the definitions of the same contract
    (`Dataset(solution_sources=...)`), after refusing (exit 2) any of `roots` or
    `solutions_from` that is not a dataset and warning about definitions that one root hides
    in another."""
    for root in [*roots, *solutions_from]:
        problem = not_a_dataset(root)
        if problem is not None:
            fail(problem, code=2)
    every: list[Path] = []
    for root in [*roots, *lookup]:
        if root.expanduser().resolve() not in [r.expanduser().resolve() for r in every]:
            every.append(root)
    for message in shadowed_definitions(every):
        warn(message)
    from flashtune.data import Dataset

    return Dataset(every, solution_sources=solutions_from)


def _definition_file(root: Path, definition: Definition) -> Path:
    expected = root / "definitions" / definition.op_type / f"{definition.name}.json"
    if expected.is_file():
        return expected
    found = sorted((root / "definitions").rglob(f"{definition.name}.json"))
    return found[0] if found else root / "definitions"


def shadowed_definitions(roots: Sequence[Path]) -> list[str]:
    """One message per definition that an earlier root defines differently from a later one
    (another contract: `Definition.contract_differences`; a description or a `model:` tag
    changes nothing a solution computes, and a captured definition differs from the bundled
    one in those): the earlier one is used (a Dataset's first root wins), the later one is
    hidden."""
    if len(roots) < 2:
        return []
    from flashtune.data import Dataset

    first: dict[str, tuple[Definition, Path]] = {}
    messages = []
    for root in roots:
        if not (root / "definitions").is_dir():
            continue
        for name, definition in sorted(Dataset(root).definitions.items()):
            if name not in first:
                first[name] = (definition, root)
                continue
            used, used_root = first[name]
            differ = used.contract_differences(definition)
            if differ:
                messages.append(
                    f"definition {name!r} differs ({'; '.join(differ)}) between "
                    f"{_definition_file(used_root, used)} (used) and "
                    f"{_definition_file(root, definition)} (ignored: an earlier -d wins)"
                )
    return messages


@dataclass(frozen=True)
class MissingBlob:
    """A workload input stored as safetensors whose file is absent."""

    definition: str
    workload: str
    input: str
    path: Path


def missing_blobs(ds: Dataset, definitions: Iterable[Definition]) -> list[MissingBlob]:
    """The safetensors inputs of the workloads of `definitions` whose blob file is absent
    (the benchmark synthesizes those inputs instead of loading them)."""
    from flashtune.data import SafetensorsInput

    out = []
    for definition in definitions:
        for record in ds.workloads_for(definition.name):
            for name, spec in record.workload.inputs.items():
                if not isinstance(spec, SafetensorsInput):
                    continue
                try:
                    path = ds.blob_path(spec.path)
                except ValueError:
                    continue  # a path escaping its root: `validate` reports it as an error
                if not path.exists():
                    out.append(MissingBlob(definition.name, record.workload.uuid, name, path))
    return out

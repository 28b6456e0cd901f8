"""How the commands write their results: tables for people, JSON and CSV for programs.

On a terminal a table fits the window. Piped (into `tee`, a file, CI's log) rich would wrap
or cut it at 80 or 150 columns, and a definition name ending in "…" cannot be pasted into
`--definitions`: so a piped console is as wide as the table needs, and nothing is cut.

`--json` and `--csv` print the same rows as the table, one object (JSON) or line (CSV) per
row, with the same field names as the Python objects they come from (`plain` turns
dataclasses, enums, paths and counters into plain values).
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

__all__ = ["result_console", "plain", "Format", "output_format", "emit_rows", "JSON", "CSV"]

# Wide enough for any table of ours on one line; rich sizes a table to its content.
_PIPED_WIDTH = 100_000

JSON = typer.Option(False, "--json", help="print the rows as one JSON array (for programs)")
CSV = typer.Option(False, "--csv", help="print the rows as CSV with a header line")


def result_console() -> Console:
    """stdout: the terminal's width on a terminal, never cut when piped."""
    if Console().is_terminal:
        return Console()
    return Console(width=_PIPED_WIDTH, soft_wrap=True)


def plain(value: Any) -> Any:
    """`value` as JSON-ready data: dataclasses become dicts, enums their value, paths
    strings, mappings keep their (plain) keys, NaN and infinities become None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "model_dump"):  # a pydantic model (a Definition, a Workload)
        return plain(value.model_dump(mode="json"))
    return value


class Format(enum.Enum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


def output_format(as_json: bool, as_csv: bool) -> Format:
    """The format `--json` / `--csv` ask for (both: a usage error, exit 2)."""
    if as_json and as_csv:
        from flashtune.cli.common import fail

        fail("--json and --csv: pick one", code=2)
    return Format.JSON if as_json else Format.CSV if as_csv else Format.TABLE


def _csv_cell(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else value


def emit_rows(
    rows: Sequence[Any],
    fmt: Format,
    table: Callable[[], Any],
    console: Console | None = None,
) -> None:
    """Print `rows` as JSON or CSV on stdout, or the rich renderable `table()` builds."""
    if fmt is Format.TABLE:
        (console or result_console()).print(table())
        return
    records = [plain(r) for r in rows]
    if fmt is Format.JSON:
        typer.echo(json.dumps(records, indent=1))
        return
    columns: list[str] = []
    for record in records:
        for key in record:
            if key not in columns:
                columns.append(key)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: _csv_cell(record.get(k)) for k in columns})
    typer.echo(buffer.getvalue(), nl=False)

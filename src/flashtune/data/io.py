"""Reading and writing dataset files: strict JSON, errors that name file, line and field,
atomic writes and whole-line appends."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

__all__ = [
    "LoadError",
    "read_json",
    "parse_model",
    "atomic_write_text",
    "append_line",
    "iter_jsonl",
]

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class LoadError:
    """One problem found while loading a dataset file."""

    path: Path
    message: str
    line: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else str(self.path)
        field = f" [{self.field}]" if self.field else ""
        return f"{where}:{field} {self.message}"


class DatasetFileError(ValueError):
    """A file that could not be read; carries the LoadError(s) describing why."""

    def __init__(self, errors: list[LoadError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def loads_strict(text: str) -> Any:
    """json.loads that rejects duplicate keys (they would silently shadow one another)."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys)


def read_json(path: Path) -> Any:
    try:
        return loads_strict(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetFileError(
            [LoadError(path, f"malformed JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})")]
        ) from None
    except ValueError as exc:  # duplicate keys
        raise DatasetFileError([LoadError(path, str(exc))]) from None
    except OSError as exc:
        raise DatasetFileError([LoadError(path, f"cannot read: {exc.strerror}")]) from None


def _field(loc: tuple[Any, ...]) -> str:
    # Drop pydantic's discriminator tags ("const", "random") so the path reads like the JSON.
    parts = [str(p) for p in loc if p not in {"const", "var", "random", "scalar", "safetensors"}]
    return ".".join(parts) or "<root>"


def parse_model(model: type[M], raw: Any, path: Path, line: int | None = None) -> M:
    """Validate `raw` as `model`; on failure raise DatasetFileError naming each bad field."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = [
            LoadError(
                path, err["msg"].removeprefix("Value error, "), line=line, field=_field(err["loc"])
            )
            for err in exc.errors()
        ]
        raise DatasetFileError(errors) from None


def iter_jsonl(path: Path):
    """Yield (line_number, parsed_json | DatasetFileError) for each non-blank line."""
    with open(path, encoding="utf-8") as f:
        for lineno, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                yield lineno, loads_strict(text)
            except ValueError as exc:
                msg = (
                    f"malformed JSON: {exc.msg}"
                    if isinstance(exc, json.JSONDecodeError)
                    else str(exc)
                )
                yield lineno, DatasetFileError([LoadError(path, msg, line=lineno)])


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and os.replace,
    so a killed process leaves either the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_line(path: Path, line: str) -> None:
    """Append one JSONL record as a single write() on an O_APPEND file under an exclusive
    flock, then fsync: processes appending to the same file never interleave inside a line."""
    if "\n" in line:
        raise ValueError("a JSONL record must be a single line")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (line + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # Appenders take turns: the check below must not see another writer's line half
        # copied into the file (it would then start a needless blank line).
        fcntl.flock(fd, fcntl.LOCK_EX)
        # A file left without a final newline by a killed writer: start on a fresh line so
        # the new record is not glued to the broken one.
        if os.fstat(fd).st_size > 0:
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    data = b"\n" + data
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)

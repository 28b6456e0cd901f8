"""Reading and writing dataset files: strict JSON, errors that name file, line and field,
atomic writes and whole-line appends."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
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
    "iter_jsonl_lines",
    "parse_json",
    "read_text",
    "current_umask",
    "make_temp_file",
    "remove_stale_temp_files",
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
            raise ValueError(
                f"duplicate key {key!r} (flashtune refuses it: one value would silently "
                "shadow the other)"
            )
        seen[key] = value
    return seen


def loads_strict(text: str) -> Any:
    """json.loads that rejects duplicate keys (they would silently shadow one another)."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys)


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetFileError([LoadError(path, f"cannot read: {exc.strerror}")]) from None


def read_json(path: Path) -> Any:
    return parse_json(read_text(path), path)


def parse_json(text: str, path: Path) -> Any:
    """`text` (the content of `path`) as JSON; DatasetFileError naming the problem."""
    try:
        return loads_strict(text)
    except json.JSONDecodeError as exc:
        raise DatasetFileError(
            [LoadError(path, f"malformed JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})")]
        ) from None
    except ValueError as exc:  # duplicate keys
        raise DatasetFileError([LoadError(path, str(exc))]) from None


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


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield (line_number, parsed_json | DatasetFileError) for each non-blank line."""
    for lineno, _, raw in iter_jsonl_lines(path):
        yield lineno, raw


def iter_jsonl_lines(path: Path) -> Iterator[tuple[int, str, Any]]:
    """Yield (line_number, the line without its newline, parsed_json | DatasetFileError)
    for each non-blank line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            text = line.rstrip("\n")
            if not text.strip():
                continue
            try:
                yield lineno, text, loads_strict(text)
            except ValueError as exc:
                msg = (
                    f"malformed JSON: {exc.msg}"
                    if isinstance(exc, json.JSONDecodeError)
                    else str(exc)
                )
                yield lineno, text, DatasetFileError([LoadError(path, msg, line=lineno)])


# --------------------------------------------------------------------------- file modes

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows.

    os.umask can only be read by setting it, which for a moment changes the mode of files
    other threads create: /proc/self/status (Linux >= 4.7) is read instead, and elsewhere
    the umask is set to 0o077 for that moment (too strict for an instant, never too open)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


# --------------------------------------------------------------------------- temporary files

# A temporary file is named .<target>.tmp-<pid>-<host tag>-<random>.tmp next to its target,
# so a later writer can tell an orphan (its writer died) from a file being written now.
_TEMP_TAG = ".tmp-"
# A temporary file this old is an orphan whoever wrote it (a write takes milliseconds): this
# covers writers on other hosts (a shared folder), whose pids mean nothing here, and files
# of older flashtune versions, whose names carry no pid.
STALE_TEMP_AGE_S = 15 * 60


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def make_temp_file(path: Path) -> tuple[int, Path]:
    """Create the temporary file an atomic write of `path` goes through: (fd, its path).

    It is created next to `path` (same filesystem, for os.replace), named after this process
    (see remove_stale_temp_files), with the mode a plain open() would give: mkstemp creates
    0600 files, which would make every file written this way private whatever the umask."""
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}{_TEMP_TAG}{os.getpid()}-{_host_tag()}-",
        suffix=".tmp",
        dir=path.parent,
    )
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    except BaseException:
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
    return fd, Path(tmp)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except OSError:
        return True  # cannot tell: keep its file
    return True


def _temp_writer(name: str) -> tuple[int, str] | None:
    """(pid, host tag) of the writer of a temporary file named by make_temp_file."""
    at = name.rfind(_TEMP_TAG)  # the target's own name may hold the tag too: the last one
    if at < 0 or not name.endswith(".tmp"):
        return None
    fields = name[at + len(_TEMP_TAG) : -len(".tmp")].split("-")
    if len(fields) != 3 or not fields[0].isdigit():
        return None
    return int(fields[0]), fields[1]


def remove_stale_temp_files(
    path: Path, max_age_s: float = STALE_TEMP_AGE_S, any_target: bool = False
) -> int:
    """Remove temporary files of atomic writes of `path` (with `any_target`: of any file of
    its folder) left by writers that died between creating and renaming them. A file is
    removed when its writer was a process of this host that is gone, or when it is older
    than `max_age_s` (a writer elsewhere, or a name without a pid). Files of live writers,
    this process included, are kept. Returns how many were removed; never raises (cleaning
    up must not fail a write)."""
    prefix = "." if any_target else f".{path.name}."
    removed = 0
    now = time.time()
    host = _host_tag()
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return 0
    for entry in entries:
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        writer = _temp_writer(name)
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        orphan = (
            writer is not None
            and writer[1] == host
            and writer[0] != os.getpid()
            and not _pid_alive(writer[0])
        )
        if orphan or age > max_age_s:
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    return removed


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and os.replace,
    so a killed process leaves either the old file or the new one, never half of one; the
    temporary files of writers killed earlier are removed. The file's mode follows the umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(path)
    fd, tmp = make_temp_file(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def append_line(path: Path, line: str) -> None:
    """Append one JSONL record as a single write() on an O_APPEND file under an exclusive
    flock, then fsync: processes appending to the same file never interleave inside a line.

    A write that fails or is cut short (a full disk) is undone by truncating the file back
    to its size before it, and raises OSError: the file never ends in a partial record."""
    if "\n" in line:
        raise ValueError("a JSONL record must be a single line")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (line + "\n").encode("utf-8")
    # 0o666: like open(), the umask decides who may read the dataset.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        # Appenders take turns: the check below must not see another writer's line half
        # copied into the file (it would then start a needless blank line), and the size
        # read here stays the end of the file until this write (the truncation point).
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        # A file left without a final newline by a killed writer: start on a fresh line so
        # the new record is not glued to the broken one.
        if size > 0:
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    data = b"\n" + data
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(
                    errno.ENOSPC,
                    f"short write: {written} of {len(data)} bytes (is the disk full?)",
                    str(path),
                )
            os.fsync(fd)  # delayed allocation can report a full disk only here
        except OSError:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass  # nothing more can be done; the original error says why
            raise
    finally:
        os.close(fd)

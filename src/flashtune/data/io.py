"""Reading and writing dataset files: strict JSON, errors that name file, line and field,
atomic writes and whole-line appends.

A dataset may come from a stranger, so reading one never fails as a whole: a file (or a
JSONL line) too large (`env.MAX_JSON_MB`), too deeply nested (`MAX_JSON_DEPTH`), not UTF-8,
or malformed in any other way is one `LoadError` naming the file and the cause, and the
rest of the dataset loads. Writes into a dataset (`atomic_write_text`, `append_line` with
its `root`) refuse a path that leads outside the root through a symbolic link
(`UnsafePathError`), and open every component without following links
(O_NOFOLLOW, relative to the folder already opened), so a link swapped in after the check
cannot redirect them either."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from flashtune import env

__all__ = [
    "MAX_JSON_DEPTH",
    "LoadError",
    "UnsafePathError",
    "atomic_write_bytes",
    "confined_path",
    "json_depth_problem",
    "links_leading_outside",
    "loads_strict",
    "read_json",
    "parse_model",
    "atomic_write_text",
    "write_text_if_changed",
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


# Deeper JSON than any FlashInfer Trace file needs (a trace nests about 5 levels): refused
# before parsing, as Python's parser would raise RecursionError at about 1000.
MAX_JSON_DEPTH = 100
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def json_depth_problem(text: str, limit: int = MAX_JSON_DEPTH) -> str | None:
    """Why `text` nests arrays and objects too deeply to be read, or None (strings are
    skipped; the scan runs only when the text holds more brackets than `limit`)."""
    if text.count("[") + text.count("{") <= limit:
        return None
    depth = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                return f"JSON nested more than {limit} levels deep (refused unparsed)"
        elif token in "]}":
            depth -= 1
    return None


def _cap_bytes() -> int:
    return max(env.MAX_JSON_MB.get(), 0) * 1024 * 1024


def _too_large(size: int, cap: int) -> str:
    return (
        f"{size / 2**20:.1f} MiB is over the {cap // 2**20} MiB cap on a dataset JSON file "
        f"or line ({env.MAX_JSON_MB.name})"
    )


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def _open_regular(path: Path) -> Any:
    """`path` opened for binary reading; OSError unless it is a regular file (a named pipe
    named like a dataset file must not block the reader forever)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(path: Path) -> str:
    """The UTF-8 text of a dataset file; DatasetFileError if it cannot be read, is larger
    than the cap (env.MAX_JSON_MB) or is not UTF-8."""
    cap = _cap_bytes()
    try:
        with _open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > cap:
                raise DatasetFileError([LoadError(path, _too_large(size, cap))])
            data = f.read(cap + 1)
    except OSError as exc:
        raise DatasetFileError([LoadError(path, f"cannot read: {exc.strerror}")]) from None
    if len(data) > cap:  # grew while read
        raise DatasetFileError([LoadError(path, _too_large(len(data), cap))])
    try:
        return _decode(data)
    except ValueError as exc:
        raise DatasetFileError([LoadError(path, str(exc))]) from None


def read_json(path: Path) -> Any:
    return parse_json(read_text(path), path)


def _loads_checked(text: str, position: bool = True) -> Any:
    """loads_strict after the depth check; ValueError (with the message to show) on any
    problem, RecursionError included (`position`: say where malformed JSON broke)."""
    problem = json_depth_problem(text)
    if problem is not None:
        raise ValueError(problem)
    try:
        return loads_strict(text)
    except json.JSONDecodeError as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if position else ""
        raise ValueError(f"malformed JSON: {exc.msg}{where}") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply to be read") from None


def parse_json(text: str, path: Path) -> Any:
    """`text` (the content of `path`) as JSON; DatasetFileError naming the problem."""
    try:
        return _loads_checked(text)
    except ValueError as exc:  # malformed, duplicate keys, too deep
        raise DatasetFileError([LoadError(path, str(exc))]) from None


def _field(loc: tuple[Any, ...]) -> str:
    # Drop pydantic's discriminator tags ("const", "random") so the path reads like the JSON.
    parts = [str(p) for p in loc if p not in {"const", "var", "random", "scalar", "safetensors"}]
    return ".".join(parts) or "<root>"


def parse_model(model: type[M], raw: Any, path: Path, line: int | None = None) -> M:
    """Validate `raw` as `model`; on failure raise DatasetFileError naming each bad field
    (or the one cause, for a failure that is not a validation error)."""
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
    except RecursionError:
        raise DatasetFileError(
            [LoadError(path, "nested too deeply to be read", line=line)]
        ) from None
    except Exception as exc:  # noqa: BLE001 - a hostile file is one error, never a crash
        message = f"cannot be loaded: {type(exc).__name__}: {exc}"
        raise DatasetFileError([LoadError(path, message, line=line)]) from None


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield (line_number, parsed_json | DatasetFileError) for each non-blank line."""
    for lineno, _, raw in iter_jsonl_lines(path):
        yield lineno, raw


def _lines(f: Any, cap: int) -> Iterator[tuple[bytes | None, int]]:
    """(line without its newline, or None when longer than `cap`; its length) per line."""
    while True:
        line = f.readline(cap + 1)
        if not line:
            return
        if len(line) > cap and not line.endswith(b"\n"):
            size = len(line)
            while line and not line.endswith(b"\n"):  # skip the rest, a chunk at a time
                line = f.readline(1 << 20)
                size += len(line)
            yield None, size
            continue
        yield line.rstrip(b"\r\n"), len(line)


def iter_jsonl_lines(path: Path) -> Iterator[tuple[int, str, Any]]:
    """Yield (line_number, the line without its newline, parsed_json | DatasetFileError)
    for each non-blank line. A line that is too long (env.MAX_JSON_MB), not UTF-8, too
    deeply nested or malformed is one DatasetFileError; a file that cannot be opened is one
    (line number 0)."""
    cap = _cap_bytes()
    try:
        f = _open_regular(path)
    except OSError as exc:
        yield 0, "", DatasetFileError([LoadError(path, f"cannot read: {exc.strerror}")])
        return
    with f:
        for lineno, (data, size) in enumerate(_lines(f, cap), start=1):
            if data is None:
                error = LoadError(path, _too_large(size, cap), line=lineno)
                yield lineno, "", DatasetFileError([error])
                continue
            try:
                text = _decode(data)
            except ValueError as exc:
                yield lineno, "", DatasetFileError([LoadError(path, str(exc), line=lineno)])
                continue
            if not text.strip():
                continue
            try:
                yield lineno, text, _loads_checked(text, position=False)
            except ValueError as exc:
                yield lineno, text, DatasetFileError([LoadError(path, str(exc), line=lineno)])


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


# --------------------------------------------------------------------------- confined writes


class UnsafePathError(OSError):
    """A write into a dataset refused: the path leads outside its root (through a symbolic
    link), or a link appeared on it while it was being written."""


def confined_path(root: Path, path: Path) -> Path:
    """`path` with every symbolic link resolved, if it stays inside `root` (itself resolved);
    else UnsafePathError naming the link that leads out. The same rule as reads of a
    dataset's blobs: nothing a dataset holds may send flashtune outside it."""
    try:
        real_root = root.resolve()
        resolved = path.resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links
        raise UnsafePathError(f"refusing to write {path}: {exc}") from None
    if resolved.is_relative_to(real_root):
        return resolved
    probe = real_root
    try:
        parts = path.absolute().relative_to(real_root).parts
    except ValueError:
        try:
            parts = path.absolute().relative_to(root.absolute()).parts
        except ValueError:
            raise UnsafePathError(f"{path} is not inside {root}") from None
    for part in parts:
        probe = probe / part
        if probe.is_symlink():
            raise UnsafePathError(
                f"refusing to write {path}: {probe} is a symbolic link to "
                f"{probe.resolve()}, outside {real_root}"
            )
    raise UnsafePathError(f"refusing to write {path}: it leads outside {real_root}")


def links_leading_outside(root: Path, folders: tuple[str, ...]) -> list[str]:
    """One message per symbolic link under `root`/`folder` (or the folder itself) that leads
    outside `root`: what a write into those folders would follow out of the dataset."""
    real_root = root.resolve()
    found: list[str] = []

    def check(path: Path) -> None:
        if not path.is_symlink():
            return
        try:
            target = path.resolve()
        except (OSError, RuntimeError):
            found.append(f"{path} is a loop of symbolic links")
            return
        if not target.is_relative_to(real_root):
            found.append(f"{path} is a symbolic link to {target}, outside {real_root}")

    for folder in folders:
        top = real_root / folder
        check(top)
        if top.is_symlink() or not top.is_dir():
            continue
        for parent, dirs, files in os.walk(top, followlinks=False):
            for name in (*dirs, *files):
                check(Path(parent) / name)
    return found


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _open_parent(root: Path, path: Path) -> tuple[int, str, Path]:
    """(fd of `path`'s folder, its file name, the resolved path) for a write confined to
    `root`: the folders are created and opened one at a time from the root, none followed
    if it is (or has become) a symbolic link."""
    resolved = confined_path(root, path)
    real_root = root.resolve()
    parts = resolved.relative_to(real_root).parts
    if not parts:
        raise UnsafePathError(f"{path} is the dataset root itself, not a file in it")
    real_root.mkdir(parents=True, exist_ok=True)
    fd = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePathError(
                        f"refusing to write {path}: {part} became a symbolic link or a file"
                    ) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1], resolved


def _unsafe_final(exc: OSError, path: Path) -> OSError:
    if exc.errno == errno.ELOOP:
        return UnsafePathError(f"refusing to write {path}: it is a symbolic link")
    return exc


def atomic_write_bytes(path: Path, data: bytes, root: Path | None = None) -> None:
    """Write `data` to `path` through a temporary file in the same folder and os.replace,
    so a killed process leaves either the old file or the new one, never half of one; the
    temporary files of writers killed earlier are removed. The file's mode follows the umask.

    With `root` (a dataset's), the write is confined to it: UnsafePathError for a path that
    leads outside through a symbolic link; the folders are opened without following links
    and the file is renamed into the folder opened (see `_open_parent`)."""
    if root is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temp_files(path)
        fd, tmp = make_temp_file(path)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return
    dir_fd, name, resolved = _open_parent(root, path)
    try:
        remove_stale_temp_files(resolved)
        tmp_name = f".{name}{_TEMP_TAG}{os.getpid()}-{_host_tag()}-{secrets.token_hex(6)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(tmp_name, flags, 0o666, dir_fd=dir_fd)  # the umask applies, as for open()
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp_name, dir_fd=dir_fd)
            except OSError:
                pass
            raise
    finally:
        os.close(dir_fd)


def atomic_write_text(path: Path, text: str, root: Path | None = None) -> None:
    """`atomic_write_bytes` of `text` in UTF-8 (with `root`: confined to that dataset)."""
    if not isinstance(text, str):
        raise TypeError(f"atomic_write_text writes str, not {type(text).__name__}")
    atomic_write_bytes(path, text.encode("utf-8"), root=root)


def write_text_if_changed(path: Path, text: str) -> None:
    """`atomic_write_text` unless `path` already holds `text` (a solution's sources written
    under their content hash: an unchanged file keeps its mtime, so builds see it current)."""
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        atomic_write_text(path, text)


def append_line(path: Path, line: str, root: Path | None = None) -> None:
    """Append one JSONL record as a single write() on an O_APPEND file under an exclusive
    flock, then fsync: processes appending to the same file never interleave inside a line.

    A write that fails or is cut short (a full disk) is undone by truncating the file back
    to its size before it, and raises OSError: the file never ends in a partial record.

    The file is opened with O_NOFOLLOW (a symbolic link in its place is refused); with
    `root` (a dataset's), the whole path is confined to it (see `atomic_write_bytes`)."""
    if "\n" in line:
        raise ValueError("a JSONL record must be a single line")
    data = (line + "\n").encode("utf-8")
    # 0o666: like open(), the umask decides who may read the dataset.
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    try:
        if root is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, flags, 0o666)
        else:
            dir_fd, name, _ = _open_parent(root, path)
            try:
                fd = os.open(name, flags, 0o666, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
    except OSError as exc:
        raise _unsafe_final(exc, path) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePathError(f"refusing to append to {path}: not a regular file")
        # Appenders take turns: the check below must not see another writer's line half
        # copied into the file (it would then start a needless blank line), and the size
        # read here stays the end of the file until this write (the truncation point).
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        # A file left without a final newline by a killed writer: start on a fresh line so
        # the new record is not glued to the broken one.
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
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

"""The background writer of capture: a bounded queue drained by one thread into the dataset.

The hot path only snapshots tensors (a clone on CPU; on CUDA an asynchronous copy on a side
stream into pinned host memory) and appends a record; blobs (safetensors) and workload lines
are written here, off the program's thread. A full queue drops the record (one warning) and
never blocks. Everything queued is flushed on close, at exit and on SIGTERM/SIGINT, after
which the previous signal handler runs.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flashtune.data.dataset import Dataset
from flashtune.data.io import (
    confined_path,
    current_umask,
    make_temp_file,
    remove_stale_temp_files,
)
from flashtune.data.models import Definition, Workload

__all__ = ["CaptureRecord", "CaptureWriter", "flush_all", "host_copies"]

log = logging.getLogger("flashtune.capture")


@dataclass
class CaptureRecord:
    """One captured call: the workload line, its definition and the tensors of its blob."""

    definition: Definition
    workload: Workload
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    blob: str | None = None  # path relative to the dataset root
    event: Any = None  # a CUDA event the host copies are complete after
    nbytes: int = 0


# --------------------------------------------------------------------------- host copies

_SIDE_STREAMS: dict[int, Any] = {}


def _side_stream(device: torch.device) -> Any:
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _SIDE_STREAMS.get(index)
    if stream is None:
        stream = _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return stream


def host_copies(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Any]:
    """Host snapshots of `tensors` and the CUDA event to wait on (None for CPU tensors).

    CUDA tensors are copied on a side stream (ordered after the current stream, so the copy
    sees the values the op reads) into pinned buffers, without a host sync: the program's
    stream never waits for the copy. record_stream keeps the source alive until it is done.
    """
    out: dict[str, torch.Tensor] = {}
    event = None
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        if t.device.type == "cuda":
            by_device.setdefault(t.device, []).append((name, t))
        else:
            out[name] = t.detach().clone(memory_format=torch.contiguous_format)
    for device, items in by_device.items():
        stream = _side_stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for name, t in items:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t.detach(), non_blocking=True)
                t.record_stream(stream)
                out[name] = host
            event = torch.cuda.Event()
            event.record(stream)
    return out, event


# --------------------------------------------------------------------------- writer


class CaptureWriter:
    """Bounded queue (records and bytes) drained into `dataset` by a daemon thread."""

    def __init__(
        self, dataset: Dataset, max_records: int = 1024, max_bytes: int = 256 << 20
    ) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        self.dataset = dataset
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.written = 0
        self.dropped = 0
        self.errors = 0
        # deque.append/popleft are atomic under the GIL: the hot path takes no lock, so a
        # signal handler that flushes from the main thread can never deadlock on it.
        self._queue: deque[CaptureRecord] = deque()
        # Bytes in (producers) and out (the consumer, under _io): each counter has one kind
        # of writer, so no lock is shared with the hot path.
        self._bytes_in = 0
        self._bytes_out = 0
        self._io = threading.RLock()  # one record written at a time (thread or flush)
        self._wake = threading.Event()
        self._stop = False
        self._warned = False
        self._write_warned = False
        self._defs_written: set[str] = set()
        self._thread: threading.Thread | None = None
        self._closed = False

    # ----------------------------------------------------------------- producer side
    def start(self) -> CaptureWriter:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="flashtune-capture-writer", daemon=True
            )
            self._thread.start()
            _register(self)
        return self

    def submit(self, nbytes: int, make: Callable[[], CaptureRecord]) -> bool:
        """Queue the record `make()` builds if `nbytes` more fit; never blocks.

        The capacity is checked before `make` runs, so a dropped record costs no copy."""
        if self._closed:
            return False
        if len(self._queue) >= self.max_records or self.queued_bytes + nbytes > self.max_bytes:
            self.dropped += 1
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"flashtune capture: the queue is full ({self.max_records} records / "
                    f"{self.max_bytes >> 20} MiB); dropping captured workloads (warned once)",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return False
        record = make()
        record.nbytes = nbytes
        self._bytes_in += nbytes
        self._queue.append(record)
        if not self._wake.is_set():
            self._wake.set()
        return True

    @property
    def queued_bytes(self) -> int:
        return self._bytes_in - self._bytes_out

    @property
    def pending(self) -> int:
        return len(self._queue)

    # ----------------------------------------------------------------- consumer side
    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(timeout=0.05)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        while True:
            with self._io:
                try:
                    record = self._queue.popleft()
                except IndexError:
                    return
                try:
                    self._write(record)
                    self.written += 1  # only once its line is whole in the file
                except Exception as exc:  # noqa: BLE001 - a bad record must not stop capture
                    self.errors += 1
                    self._report(record, exc)
                finally:
                    self._bytes_out += record.nbytes

    def _report(self, record: CaptureRecord, exc: Exception) -> None:
        # A full disk fails every record after the first: one warning says so, the rest
        # go to the debug log and the `errors` count, not to the program's stderr.
        if self._write_warned:
            log.debug("capture: could not write a workload of %s: %s", record.definition.name, exc)
            return
        self._write_warned = True
        warnings.warn(
            f"flashtune capture: could not write a workload of {record.definition.name} to "
            f"{self.dataset.root}: {exc}; capture goes on, records that fail are counted in "
            "stats['errors'] (warned once)",
            RuntimeWarning,
            stacklevel=2,
        )

    def _write(self, record: CaptureRecord) -> None:
        definition = record.definition
        if definition.name not in self._defs_written:
            if definition.name not in self.dataset.definitions:
                try:
                    self.dataset.add_definition(definition)
                except FileExistsError:  # another process wrote it first
                    pass
            self._defs_written.add(definition.name)
        blob = None
        if record.tensors and record.blob:
            if record.event is not None:
                record.event.synchronize()
            # Inside the dataset: not through a link that leads out (UnsafePathError).
            blob = confined_path(self.dataset.root, self.dataset.root / record.blob)
            _save_safetensors(blob, record.tensors)
        try:
            self.dataset.add_workloads(definition, [record.workload])
        except BaseException:
            if blob is not None:  # no line points at it: do not leave it filling the disk
                blob.unlink(missing_ok=True)
            raise

    # ----------------------------------------------------------------- flush and close
    def flush(self, timeout: float | None = None) -> bool:
        """Write everything queued now, from the calling thread; True when all is written."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._queue:
            self._drain()
            if deadline is not None and time.monotonic() > deadline:
                break
        return not self._queue

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush, stop the thread and stop accepting records."""
        if self._closed:
            return
        self._closed = True
        self.flush(timeout)
        self._stop = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        _unregister(self)


_CLEANED: set[Path] = set()


def _save_safetensors(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Atomic safetensors write (temporary file in the same folder, then os.replace); the
    blob's mode follows the umask, like the workload lines that point at it."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    # Every blob has a name of its own, so the orphans of a killed capture are those of
    # other files of the folder: looked for once per folder and process (not per blob).
    if path.parent not in _CLEANED:
        _CLEANED.add(path.parent)
        remove_stale_temp_files(path, any_target=True)
    fd, tmp = make_temp_file(path)
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
        # safetensors writes a file of its own (mode 0600) and renames it over `tmp`.
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- exit and signals

_LIVE: weakref.WeakSet[CaptureWriter] = weakref.WeakSet()
_PREVIOUS: dict[int, Any] = {}
_GLOBAL_LOCK = threading.Lock()
_ATEXIT = [False]
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
FLUSH_ON_SIGNAL_S = 10.0  # a signal asks the process to stop: flush, but not forever


def flush_all(timeout: float | None = None) -> None:
    """Flush every live writer (atexit and the signal handlers call this)."""
    for writer in list(_LIVE):
        try:
            writer.flush(timeout)
        except Exception as exc:  # noqa: BLE001 - flushing at exit must not raise
            log.warning("capture: flush failed: %s", exc)


def _at_exit() -> None:
    for writer in list(_LIVE):
        writer.close()


def _on_signal(signum: int, frame: Any) -> None:
    flush_all(FLUSH_ON_SIGNAL_S)
    previous = _PREVIOUS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # SIG_DFL or a handler installed outside Python: die the way it would have
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _register(writer: CaptureWriter) -> None:
    with _GLOBAL_LOCK:
        _LIVE.add(writer)
        if not _ATEXIT[0]:
            atexit.register(_at_exit)
            _ATEXIT[0] = True
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be installed from the main thread
        for sig in _SIGNALS:
            current = signal.getsignal(sig)
            if current is not _on_signal:
                _PREVIOUS[sig] = current
                signal.signal(sig, _on_signal)


def _unregister(writer: CaptureWriter) -> None:
    with _GLOBAL_LOCK:
        _LIVE.discard(writer)
        if _LIVE or threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            if signal.getsignal(sig) is _on_signal and sig in _PREVIOUS:
                signal.signal(sig, _PREVIOUS.pop(sig))

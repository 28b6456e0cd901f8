"""What a run shows while it works: a live bar on a terminal, lines on stderr everywhere else.

A live display (rich) draws only on a terminal: piped into `tee`, under nohup, in CI or a
batch job it showed nothing until the run's last line (18 minutes on a CPU). So without a
terminal the run prints plain lines on stderr, flushed at once, never redrawn:

- one when the workers start, and one when the work is known (triples, definitions);
- one per finished definition, with its statuses, the triples done of the total, the time
  elapsed and an ETA;
- a heartbeat when nothing was printed for `heartbeat_s` seconds (a long compile, a slow
  workload), naming what is running, so a log never looks dead.

stdout keeps only the results (the closing table), so `flashtune run > table.txt` works too.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import IO, Any

from flashtune.data.models import EvaluationStatus, Trace

__all__ = ["RunProgress", "format_seconds"]

HEARTBEAT_S = 30.0


def format_seconds(seconds: float) -> str:
    """'42 s', '3m05s', '1h02m'."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class RunProgress:
    """Progress of one run, thread-safe (each device's feeder thread reports here).

    `per_definition`: the triples expected per definition (a line when one completes);
    `per_node` (a cluster run): the triples finished on each node (its `host`) and the
    workers each node lost. `enabled=False` (--quiet) shows nothing; `console` decides the
    mode: a terminal gets the live bar, anything else the lines on `stream` (stderr)."""

    def __init__(
        self,
        total: int,
        console: Any,
        enabled: bool,
        per_node: bool = False,
        per_definition: dict[str, int] | None = None,
        stream: IO[str] | None = None,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.total = total
        self.done = 0
        self.failures = 0
        self.current: dict[str, str] = {}
        self.per_node = per_node
        self.done_on: dict[str, int] = {}
        self.lost_on: dict[str, int] = {}
        self.expected = dict(per_definition or {})
        self.statuses: dict[str, Counter[str]] = {}
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.last_line = self.started
        self.heartbeat_s = heartbeat_s
        self.stream = stream
        self.progress: Any = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        terminal = console is not None and bool(getattr(console, "is_terminal", False))
        self.lines = enabled and not terminal
        if self.lines and self.stream is None:
            self.stream = sys.stderr
        if enabled and terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(
                TextColumn("[bold]flashtune run[/bold]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("failures: {task.fields[failures]}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[nodes]}"),
                TextColumn("{task.description}"),
                console=console,
                transient=False,
            )
            self.task = self.progress.add_task("", total=total, failures=0, nodes="")

    # -- lines (no terminal) ------------------------------------------------------------

    def say(self, message: str) -> None:
        """One line on the stream (line mode only), flushed now."""
        if not self.lines or self.stream is None:
            return
        with self.lock:
            self._write(message)

    def _write(self, message: str) -> None:
        assert self.stream is not None
        elapsed = format_seconds(time.monotonic() - self.started)
        self.stream.write(f"flashtune run [{elapsed}] {message}\n")
        self.stream.flush()
        self.last_line = time.monotonic()

    def _counts(self) -> str:
        text = f"{self.done}/{self.total} triples"
        if self.done and self.done < self.total:
            rate = (time.monotonic() - self.started) / self.done
            text += f", eta {format_seconds(rate * (self.total - self.done))}"
        if self.failures:
            text += f", {self.failures} not passed"
        return text

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(5.0, self.heartbeat_s)):
            with self.lock:
                if time.monotonic() - self.last_line < self.heartbeat_s:
                    continue
                running = ", ".join(sorted(set(self.current.values()))) or "starting"
                self._write(f"running {running}; {self._counts()}")

    # -- the run's events ---------------------------------------------------------------

    def expect(self, total: int, per_definition: dict[str, int]) -> None:
        """The work, once it is known (the display may say things before: workers starting)."""
        with self.lock:
            self.total = total
            self.expected = dict(per_definition)
            if self.progress is not None:
                self.progress.update(self.task, total=total)

    def __enter__(self) -> RunProgress:
        if self.progress is not None:
            self.progress.start()
        if self.lines:
            definitions = len(self.expected)
            of = (
                f" of {definitions} definition{'s' if definitions != 1 else ''}"
                if definitions
                else ""
            )
            self.say(f"{self.total} triples{of} to evaluate")
            self._beat = threading.Thread(target=self._heartbeat, daemon=True)
            self._beat.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=1.0)
        if self.progress is not None:
            self.progress.stop()

    def working_on(self, device: str, definition: str) -> None:
        with self.lock:
            self.current[device] = definition
            self._refresh()

    def finished(self, trace: Trace) -> None:
        with self.lock:
            self.done += 1
            status = trace.evaluation.status if trace.evaluation else None
            if status not in (EvaluationStatus.PASSED, EvaluationStatus.SKIPPED):
                self.failures += 1
            if self.per_node and trace.evaluation is not None:
                node = str(trace.evaluation.environment.get("host", "?"))
                self.done_on[node] = self.done_on.get(node, 0) + 1
            counts = self.statuses.setdefault(trace.definition, Counter())
            counts[status.value.lower() if status is not None else "no evaluation"] += 1
            if self.lines and sum(counts.values()) == self.expected.get(trace.definition):
                finished = sum(
                    1
                    for name, n in self.expected.items()
                    if sum(self.statuses.get(name, {}).values()) == n
                )
                breakdown = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                self._write(
                    f"[{finished}/{len(self.expected)}] {trace.definition}: {breakdown}; "
                    f"{self._counts()}"
                )
            self._refresh()

    def worker_lost(self, node: str) -> None:
        """A worker on `node` died (or its node did): counted beside the node's triples."""
        with self.lock:
            self.lost_on[node] = self.lost_on.get(node, 0) + 1
            if self.lines:
                self._write(f"lost a worker on {node}; its work is queued again")
            self._refresh()

    def nodes_text(self) -> str:
        """'host-a 12, host-b 9 (1 worker lost)': triples done per node, losses beside."""
        parts = []
        for node in sorted(set(self.done_on) | set(self.lost_on)):
            lost = self.lost_on.get(node, 0)
            text = f"{node} {self.done_on.get(node, 0)}"
            if lost:
                text += f" ({lost} worker{'s' if lost > 1 else ''} lost)"
            parts.append(text)
        return ", ".join(parts)

    def _refresh(self) -> None:
        if self.progress is not None:
            self.progress.update(
                self.task,
                completed=self.done,
                failures=self.failures,
                nodes=self.nodes_text(),
                description=", ".join(sorted(set(self.current.values()))),
            )

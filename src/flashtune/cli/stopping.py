"""Clean stops of the `flashtune` program on SIGTERM, SIGINT and SIGHUP, at any moment.

`timeout`, systemd, Kubernetes and Slurm end a program with SIGTERM; a terminal sends
SIGINT (Ctrl-C) and SIGHUP (hangup) to its whole foreground process group. Whenever one
comes, the program
- ends every process it started: `flashtune run`'s workers, their sandboxes and what those
  started (bench/runner.py aborts the pool as the stop unwinds it), then whatever is left
  below this process (multiprocessing's fork server and resource tracker);
- keeps the traces finished so far (each was appended as a whole line when it finished);
- prints one line on stderr (for `flashtune run`: how many triples were traced, where, and
  that `flashtune run --resume` continues), and no traceback;
- exits with 128 + the signal's number: 130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP).

Importing this module in the program itself (`python -m flashtune.cli`, the `flashtune`
script: flashtune/cli/__init__.py imports it before anything slow) installs the handlers.
Until `main` runs its command (the imports take seconds: torch) a signal ends the program at
once: nothing has started that needs ending. While the command runs (`guarded`) the first
signal raises `Stopped` in the main thread, which unwinds what runs (the runner's abort) up
to `main`, which calls `finish`; a second one finishes at once, and so does a watchdog
STOP_GRACE_S after the first (a `Stopped` Python swallowed must not leave it running). A
program that merely imports flashtune.cli (the tests, through typer's CliRunner) keeps its
own handlers.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

from flashtune.bench.process_tree import kill_descendants

__all__ = ["STOP_SIGNALS", "Stopped", "install", "guarded", "set_last_words", "finish"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A stop signal, raised in the main thread while `guarded`. A BaseException, as
    KeyboardInterrupt is: `except Exception` clauses on its way let it through."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_raising = False  # inside `guarded`, until a first signal
_started = False  # `guarded` was entered: the command runs
_last_words: Callable[[str], str] | None = None


# Raised into the main thread, `Stopped` can land where Python swallows exceptions (a weakref
# callback or a __del__ running at that instant: "Exception ignored in ..."): seen when
# `timeout` stopped `flashtune e2e` inside torch.compile, which then ran on, `timeout` sending
# one SIGTERM only. So a first signal also arms a watchdog that finishes the program after
# STOP_GRACE_S, whether or not the unwinding got anywhere.
STOP_GRACE_S = 30.0


def _handle(signum: int, frame: FrameType | None) -> None:
    global _raising
    if _raising:
        _raising = False  # the next one finishes at once
        watchdog = threading.Timer(STOP_GRACE_S, finish, args=(signum,))
        watchdog.daemon = True
        watchdog.start()
        raise Stopped(signum)
    finish(signum)


def install() -> None:
    """Handle the stop signals as the module's docstring says (main thread only)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _handle)


@contextmanager
def guarded() -> Iterator[None]:
    """Around the command: a first stop signal raises `Stopped` in it."""
    global _raising, _started
    _raising = _started = True
    try:
        yield
    finally:
        _raising = False


def set_last_words(words: Callable[[str], str]) -> None:
    """What `finish` prints, from the signal's name (`flashtune run`: its triples so far)."""
    global _last_words
    _last_words = words


def finish(signum: int) -> NoReturn:
    """End the program for stop signal `signum`: kill every process below this one, print
    the last words on stderr, exit with 128 + `signum` (no atexit handler, no traceback)."""
    if threading.current_thread() is threading.main_thread():  # the watchdog's thread may not
        for other in STOP_SIGNALS:  # a signal now (a second Ctrl-C) leaves at once
            signal.signal(other, lambda n, _: os._exit(128 + n))
    kill_descendants(os.getpid())
    name = signal.Signals(signum).name
    if _last_words is not None:
        line = _last_words(name)
    elif _started:
        line = f"interrupted by {name}"
    else:
        line = f"interrupted by {name} while starting; nothing ran"
    for stream in (sys.stdout, sys.stderr):
        try:  # what was printed before the stop, as far as it got
            stream.flush()
        except Exception:  # noqa: BLE001 - a broken pipe, a write this signal cut short
            pass
    try:
        os.write(2, f"flashtune: {line}\n".encode())
    except OSError:
        pass
    os._exit(128 + signum)


def _is_program() -> bool:
    """Whether this process is the flashtune program, not one that imports flashtune.cli:
    `python -m flashtune.cli` while Python imports the package to run (its argv[0] is then
    "-m"), or the `flashtune` script."""
    argv = list(getattr(sys, "orig_argv", []))
    if sys.argv[:1] == ["-m"] and "-m" in argv:
        return argv[argv.index("-m") + 1 :][:1] == ["flashtune.cli"]
    return os.path.basename(sys.argv[0]) == "flashtune"


if _is_program():
    install()

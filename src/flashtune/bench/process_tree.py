"""The process tree under the benchmark worker: find, kill and reap what sandboxes leave.

The worker becomes a subreaper (`become_reaper`), so the orphans of a dead sandbox's
descendants are adopted by it rather than by init and stay findable; `kill_tree`,
`kill_descendants` and `reap_strays` walk /proc's parent links (`process_table`) to kill
them. Linux only where it matters; elsewhere the functions find nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable

from flashtune.bench import confine

__all__ = [
    "become_reaper",
    "kill_descendants",
    "kill_tree",
    "process_table",
    "reap_strays",
    "stat_fields",
]

_REAPER = False


def become_reaper() -> bool:
    """Adopt the orphans of this process's descendants (the worker): a sandbox's leftovers
    stay findable after the sandbox died, and `reap_strays` kills them."""
    global _REAPER
    try:
        confine.set_subreaper()
    except (OSError, AttributeError):
        return False
    _REAPER = True
    return True


def process_table() -> list[tuple[int, int, int, int]]:
    """(pid, ppid, process group, session) of every process /proc shows."""
    table: list[tuple[int, int, int, int]] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields is not None and len(fields) >= 4:
            table.append((int(entry), int(fields[1]), int(fields[2]), int(fields[3])))
    return table


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name: the state first, then ppid,
    process group, session, ... (proc(5)'s fields 3 on); None when it cannot be read (the
    process is gone, or there is no /proc). The name may hold spaces and parentheses: the
    fields start after its last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _below(table: list[tuple[int, int, int, int]], roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid, _, _ in table:
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s descendants, then `pid` (a few rounds: they may fork meanwhile). Its
    descendants first: orphans of a dead process move to init, out of sight."""
    kill_descendants(pid)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def kill_descendants(pid: int) -> None:
    """SIGKILL every process below `pid` (stopped ones too), in a few rounds: they may fork
    meanwhile, and a subreaper `pid` (the worker) adopts the orphans of those killed."""
    for _ in range(4):
        victims = _below(process_table(), [pid])
        for victim in victims:
            with contextlib.suppress(OSError):
                os.kill(victim, signal.SIGKILL)
        if not victims:
            break


def reap_strays() -> list[int]:
    """In a subreaper (`become_reaper`): kill and reap the children of this process that are
    not in its session, with everything below them. Those are processes a sandbox left
    (every sandbox has a session of its own, and the worker's own children share its
    session); the sandboxes themselves are children of the fork server, not of this
    process. -> the pids killed."""
    if not _REAPER:
        return []
    me, session = os.getpid(), os.getsid(0)
    table = process_table()
    strays = [pid for pid, ppid, _, sid in table if ppid == me and sid != session]
    if not strays:
        return []
    for victim in _below(table, strays) | set(strays):
        with contextlib.suppress(OSError):
            os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 5
    for pid in strays:
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            time.sleep(0.01)
    return strays

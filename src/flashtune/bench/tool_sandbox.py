"""A CUDA tool (compute-sanitizer, ncu) inside the sandbox's namespaces, its target (the
probe) inside the rest of the sandbox.

Why: the tool's front-end and the injection library it loads into the probe at cuInit talk
over a local channel (TCP on localhost by default: both tools have a `--port`). The probe
used to enter its own network namespace (loopback down) before CUDA started, so the
injection could never reach its front-end and the tool waited for ever. Now

    python -m flashtune.bench.tool_sandbox --scratch S --status F -- TOOL ARGS... python -m flashtune.bench.probe JOB

enters the sandbox's user + network + mount namespaces (`isolation.enter_tool_namespaces`,
the same as a sandbox's, with the shared caches mounted for the probe's scratch S), brings
the new network namespace's loopback up, writes what it did to F (JSON) and execs the tool.
The front-end (NVIDIA's binary: trusted) then runs in the namespaces with no Landlock and
no seccomp; the probe it starts applies every other layer (`isolation.enter_sandbox(...,
in_tool_namespaces=True)`): a private scratch, Landlock, seccomp, no capabilities. What the
solution can reach over the network is that loopback: the tool's front-end and nothing
else (no other interface, no route out).

The contract with the probe (`MARK`): the launcher names its pid and its namespaces; the
probe (only it reads the variable) skips entering namespaces only when `verify` finds the
launcher among its ancestors (the tool keeps the launcher's pid across exec), itself in
those very namespaces, a network namespace with nothing but a loopback, and a user namespace
that is not the host's. A stray or forged value changes nothing: the probe then enters its
own namespaces as before. `flashtune run`'s sandboxes never read it.

Where user namespaces are not available (or FLASHTUNE_SANDBOX=0), the launcher execs the
tool as it is (the old behaviour: the probe enters what it can by itself) and says so in F;
`describe_status` turns that into a line for the result's sandbox description.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flashtune import env

__all__ = ["MARK", "NAMESPACES", "command", "describe_status", "main", "read_status", "verify"]

MARK = "FLASHTUNE_TOOL_NAMESPACES"
NAMESPACES = ("user", "net", "mnt")


def command(tool: Sequence[str], scratch: Path, status: Path) -> list[str]:
    """The command line that runs `tool` (the front-end with its target's command at the
    end) in the sandbox's namespaces; `scratch`: the probe's; `status`: where the launcher
    writes what it did (a folder the probe cannot write)."""
    return [
        sys.executable,
        "-m",
        "flashtune.bench.tool_sandbox",
        "--scratch",
        str(scratch),
        "--status",
        str(status),
        "--",
        *tool,
    ]


def _namespace_ids() -> dict[str, str]:
    return {name: os.readlink(f"/proc/self/ns/{name}") for name in NAMESPACES}


def _mark() -> str:
    return json.dumps({"pid": os.getpid(), **_namespace_ids()})


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        text = f.read().decode(errors="replace")
    return int(text[text.rfind(")") + 2 :].split()[1])


def _is_ancestor(pid: int) -> bool:
    current = os.getppid()
    for _ in range(64):
        if current == pid:
            return True
        if current <= 1:
            return False
        try:
            current = _parent_of(current)
        except (OSError, ValueError, IndexError):
            return False
    return False


def verify(mark: str | None) -> tuple[bool, str]:
    """Whether this process may take `mark` (the `MARK` variable's value) as true: -> (yes,
    why not)."""
    if not mark:
        return False, "no mark"
    try:
        said = json.loads(mark)
        pid = int(said["pid"])
        named = {name: str(said[name]) for name in NAMESPACES}
    except (ValueError, TypeError, KeyError):
        return False, "unreadable mark"
    if not _is_ancestor(pid):
        return False, f"process {pid} (the launcher, now the tool) is not an ancestor"
    try:
        mine = _namespace_ids()
    except OSError as exc:
        return False, f"cannot read this process's namespaces: {exc}"
    if mine != named:
        return False, f"not in the launcher's namespaces ({mine} != {named})"
    try:
        interfaces = sorted(name for _, name in socket.if_nameindex())
    except OSError as exc:
        return False, f"cannot list the network interfaces: {exc}"
    if interfaces != ["lo"]:
        return False, f"the network namespace has interfaces {interfaces} (expected only lo)"
    try:
        with open("/proc/self/uid_map") as f:
            uid_map = f.read().split()
    except OSError as exc:
        return False, f"cannot read the uid map: {exc}"
    if uid_map[:3] == ["0", "0", "4294967295"]:
        return False, "the host's user namespace"
    return True, ""


def read_status(path: Path) -> dict[str, Any] | None:
    """What the launcher wrote (None: it never got that far)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def describe_status(status: dict[str, Any] | None) -> str:
    """A line for a tool result's sandbox description: where the tool ran."""
    if status is None:
        return "tool: the launcher said nothing (it failed before the tool started)"
    if status.get("namespaces"):
        return "tool: inside the sandbox's user/net/mount namespaces (loopback up)"
    return (
        "tool: OUTSIDE the sandbox's namespaces (fallback: "
        f"{status.get('reason') or 'unknown'}); the probe isolates itself as before"
    )


def _parse(argv: Sequence[str]) -> tuple[Path, Path, list[str]]:
    args = list(argv)
    if "--" not in args:
        raise ValueError("expected: --scratch S --status F -- TOOL ARGS...")
    split = args.index("--")
    options, tool = args[:split], args[split + 1 :]
    values: dict[str, str] = {}
    for i in range(0, len(options), 2):
        if i + 1 >= len(options) or options[i] not in ("--scratch", "--status"):
            raise ValueError(f"unexpected arguments {options[i:]}")
        values[options[i]] = options[i + 1]
    if set(values) != {"--scratch", "--status"} or not tool:
        raise ValueError("expected: --scratch S --status F -- TOOL ARGS...")
    return Path(values["--scratch"]), Path(values["--status"]), tool


def main(argv: list[str] | None = None) -> int:
    try:
        scratch, status_path, tool = _parse(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        sys.stderr.write(f"flashtune.bench.tool_sandbox: {exc}\n")
        return 2
    from flashtune.bench import confine, isolation

    os.environ.pop(MARK, None)  # never one from further up
    status: dict[str, Any] = {"namespaces": False, "loopback": False}
    if not env.SANDBOX.get():
        status["reason"] = "FLASHTUNE_SANDBOX=0"
    else:
        report = isolation.enter_tool_namespaces(scratch)
        status.update(errors=report["errors"], mounted=report["mounted"])
        if not report["userns"]:
            status["reason"] = f"no user namespace: {report['errors'].get('userns')}"
        else:
            try:
                confine.bring_loopback_up()
                status["loopback"] = True
            except OSError as exc:
                status["reason"] = f"loopback not up: {exc}"
            if status["loopback"]:
                os.environ[MARK] = _mark()
                status["namespaces"] = True
    try:
        status_path.write_text(json.dumps(status), encoding="utf-8")
    except OSError as exc:
        sys.stderr.write(f"flashtune.bench.tool_sandbox: cannot write {status_path}: {exc}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(tool[0], tool)
    except OSError as exc:
        sys.stderr.write(f"flashtune.bench.tool_sandbox: cannot run {tool[0]}: {exc}\n")
    return 127


if __name__ == "__main__":
    raise SystemExit(main())

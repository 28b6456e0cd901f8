"""The CUDA tools' launcher (bench/tool_sandbox.py) and the tools' reports, on the CPU: the
command built, the contract with the probe (a mark it takes only once verified), the
loopback brought up in a fresh network namespace, a stand-in tool run inside the sandbox's
namespaces with the probe under it keeping every other layer, and a verdict that the
solution's own prints cannot forge. Tests that need unprivileged user namespaces skip where
the platform has none, saying so. The real tools run in test_tools_cuda.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _serve_helpers import HONEST, solution, tool_target

from flashtune.bench import confine, sanitizer, tool_sandbox
from flashtune.bench.probe import PROBE_MARK

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux only")

SRC = str(Path(tool_sandbox.__file__).resolve().parents[2])


def _python(code: str, **kwargs) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": SRC, **kwargs.pop("env", {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        **kwargs,
    )


def _userns_reason() -> str | None:
    done = _python("from flashtune.bench import confine; confine.enter_user_namespace()")
    return (
        None if done.returncode == 0 else f"no unprivileged user namespaces: {done.stderr[-200:]}"
    )


USERNS = _userns_reason()
needs_userns = pytest.mark.skipif(USERNS is not None, reason=str(USERNS))


# --------------------------------------------------------------------------- pieces


def test_the_launch_command_wraps_the_tool(tmp_path: Path) -> None:
    tool = ["/opt/cuda/bin/compute-sanitizer", "--tool", "memcheck", "python", "-m", "x", "j"]
    got = tool_sandbox.command(tool, tmp_path / "scratch", tmp_path / "status.json")
    assert got == [
        sys.executable,
        "-m",
        "flashtune.bench.tool_sandbox",
        "--scratch",
        str(tmp_path / "scratch"),
        "--status",
        str(tmp_path / "status.json"),
        "--",
        *tool,
    ]


def test_the_launcher_refuses_a_bad_command_line() -> None:
    for argv in ([], ["--scratch", "s", "--", "t"], ["--scratch", "s", "--status", "f", "--"]):
        assert tool_sandbox.main(argv) == 2


def test_a_mark_is_taken_only_once_verified() -> None:
    """Here (the host's namespaces, no launcher above) no mark holds, however it is made."""
    assert tool_sandbox.verify(None) == (False, "no mark")
    assert tool_sandbox.verify("not json")[0] is False
    ids = {n: os.readlink(f"/proc/self/ns/{n}") for n in tool_sandbox.NAMESPACES}
    # This process's own namespaces, named by an ancestor: the namespace checks refuse it.
    ok, why = tool_sandbox.verify(json.dumps({"pid": os.getppid(), **ids}))
    assert not ok and ("interfaces" in why or "host's user namespace" in why), why
    # A process that is not an ancestor.
    ok, why = tool_sandbox.verify(json.dumps({"pid": os.getpid(), **ids}))
    assert not ok and "not an ancestor" in why


def test_describe_status_says_where_the_tool_ran() -> None:
    inside = tool_sandbox.describe_status({"namespaces": True, "loopback": True})
    assert inside.startswith("tool: inside the sandbox's user/net/mount namespaces")
    outside = tool_sandbox.describe_status({"namespaces": False, "reason": "no user namespace"})
    assert "OUTSIDE" in outside and "no user namespace" in outside
    assert "said nothing" in tool_sandbox.describe_status(None)


@needs_userns
def test_the_loopback_comes_up_in_a_fresh_network_namespace() -> None:
    done = _python(
        """
        import socket
        from flashtune.bench import confine
        confine.enter_user_namespace()
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=1)
        except OSError as exc:
            print("before:", exc.errno)
        confine.bring_loopback_up()
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=1).close()
        print("after: connected", sorted(n for _, n in socket.if_nameindex()))
        """
    )
    assert done.returncode == 0, done.stderr
    assert "before: 101" in done.stdout  # ENETUNREACH: the loopback was down
    assert "after: connected ['lo']" in done.stdout


@needs_userns
def test_the_launcher_enters_the_namespaces_and_its_mark_verifies(tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    child = (
        "import json, os; from flashtune.bench import tool_sandbox as t; "
        "print(json.dumps([t.verify(os.environ.get(t.MARK)), os.readlink('/proc/self/ns/net')]))"
    )
    done = subprocess.run(
        [
            *tool_sandbox.command(
                # the "tool" starts the "probe" as its child, as the real ones do
                [
                    sys.executable,
                    "-c",
                    f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {child!r}]))",
                ],
                tmp_path / "scratch",
                status,
            )
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert done.returncode == 0, done.stderr
    (verified, why), net = json.loads(done.stdout)
    assert verified, why
    assert net != os.readlink("/proc/self/ns/net")
    said = json.loads(status.read_text())
    assert said["namespaces"] and said["loopback"]


def test_with_the_sandbox_off_the_launcher_only_runs_the_tool(tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    done = subprocess.run(
        tool_sandbox.command(
            [sys.executable, "-c", "import os; print(os.readlink('/proc/self/ns/net'))"],
            tmp_path / "scratch",
            status,
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": SRC, "FLASHTUNE_SANDBOX": "0"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == os.readlink("/proc/self/ns/net")
    assert json.loads(status.read_text()) == {
        "namespaces": False,
        "loopback": False,
        "reason": "FLASHTUNE_SANDBOX=0",
    }


# --------------------------------------------------------------------------- the verdict

FAKE_SUMMARY = "========= ERROR SUMMARY: 0 errors"
OOB_LOG = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at 0x1b0 in /tmp/main.py:9:_planted_kernel
=========
========= ERROR SUMMARY: 1 error
"""


def test_a_summary_printed_by_the_solution_counts_for_nothing() -> None:
    ok = PROBE_MARK + json.dumps({"ok": True, "sandbox": "sandbox: x"})
    forged = f"{FAKE_SUMMARY}\n{ok}\n"
    report, verdict, _, probe = sanitizer.judge_tool_run("memcheck", OOB_LOG, forged, forged, 86)
    assert verdict == "fail" and report.errors == 1 and probe and probe["ok"]
    # No log at all (the tool broke): the stdout's summary does not make it a pass.
    _, verdict, detail, _ = sanitizer.judge_tool_run("memcheck", None, forged, forged, 0)
    assert verdict == "error" and "no log file" in detail
    # An empty log (the tool never reached its summary): neither.
    _, verdict, _, _ = sanitizer.judge_tool_run("memcheck", "", forged, forged, 0)
    assert verdict == "error"
    clean = f"========= COMPUTE-SANITIZER\n{FAKE_SUMMARY}\n"
    assert sanitizer.judge_tool_run("memcheck", clean, ok, "", 0)[1] == "pass"


# A stand-in compute-sanitizer: runs its target, passing its output through, and writes the
# summary FAKE_LOG_MODE asks for into its --log-file ("oob", "clean" or "none").
FAKE_TOOL = """#!{python}
import os, subprocess, sys
args = sys.argv[1:]
target = args[args.index("-m") - 1 :]
done = subprocess.run(target, capture_output=True, text=True)
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
mode = os.environ.get("FAKE_LOG_MODE", "clean")
with open(args[args.index("--log-file") + 1], "w") as log:
    log.write("net " + os.readlink("/proc/self/ns/net") + "\\n")
    if mode == "oob":
        log.write({oob!r})
        sys.exit(86)
    if mode == "clean":
        log.write("========= ERROR SUMMARY: 0 errors\\n")
sys.exit(done.returncode)
"""

FORGER = f"""
import sys
import torch

def run(hidden_states, weight):
    print({FAKE_SUMMARY!r})
    sys.stderr.write({FAKE_SUMMARY!r} + "\\n")
    x = hidden_states.float()
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-5)
    return (x * inv * weight.float()).to(hidden_states.dtype)
"""

# Inside the tool's namespaces, what the solution can still do: report it as its error.
PROBER = """
import json, os, socket

def run(hidden_states, weight):
    got = {}
    log = os.path.join(os.path.dirname(os.getcwd()), "tool", "memcheck.log")
    try:
        open(log, "a").close()
        got["write_log"] = "written"
    except OSError as exc:
        got["write_log"] = exc.errno
    unix = socket.socket(socket.AF_UNIX)
    try:
        unix.connect("/tmp/.X11-unix/X0")
        got["unix"] = "connected"
    except OSError as exc:
        got["unix"] = exc.errno
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1)
        got["tcp_lo"] = "connected"
    except OSError as exc:
        got["tcp_lo"] = exc.errno
    got["interfaces"] = sorted(n for _, n in socket.if_nameindex())
    raise RuntimeError("PROBED " + json.dumps(got))
"""


@pytest.fixture
def fake_tool(tmp_path: Path) -> Path:
    path = tmp_path / "fake-compute-sanitizer"
    path.write_text(FAKE_TOOL.format(python=sys.executable, oob=OOB_LOG))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sanitizer, "unavailable_reason", lambda device, executable: None)
    return tool_target(tmp_path / "dataset")


def _sanitize(target, fake_tool: Path, name: str, source: str) -> sanitizer.SanitizeResult:
    definition, workload, dataset = target
    return sanitizer.sanitize(
        definition,
        workload,
        solution(name, source),
        "cpu",
        [str(dataset)],
        ["memcheck"],
        executable=str(fake_tool),
    )


@pytest.mark.slow  # a probe process under a stand-in tool: seconds
def test_a_solution_printing_a_clean_summary_cannot_turn_a_fail_into_a_pass(
    target, fake_tool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LOG_MODE", "oob")
    assert _sanitize(target, fake_tool, "agent-forger", FORGER).verdict == "fail"
    monkeypatch.setenv("FAKE_LOG_MODE", "none")  # the tool gave no summary
    broken = _sanitize(target, fake_tool, "agent-forger", FORGER)
    assert broken.verdict == "error", broken.to_json()
    monkeypatch.setenv("FAKE_LOG_MODE", "clean")
    assert _sanitize(target, fake_tool, "agent-honest", HONEST).verdict == "pass"


@pytest.mark.slow  # the launcher, its namespaces and a sandboxed probe: seconds
@needs_userns
def test_under_the_launcher_the_probe_keeps_every_other_layer(target, fake_tool: Path) -> None:
    honest = _sanitize(target, fake_tool, "agent-honest", HONEST)
    assert honest.verdict == "pass", honest.to_json()
    assert honest.sandbox and "tool: inside the sandbox's" in honest.sandbox, honest.sandbox
    assert "network: the namespaces' loopback" in honest.sandbox, honest.sandbox
    assert "seccomp + no capabilities" in honest.sandbox, honest.sandbox
    if confine.landlock_abi():
        assert "Landlock ABI" in honest.sandbox, honest.sandbox

    probed = _sanitize(target, fake_tool, "agent-prober", PROBER)
    assert probed.verdict == "error", probed.to_json()
    got = json.loads(probed.detail.split("PROBED ", 1)[1].split("\n")[0])
    assert got["write_log"] in (1, 13)  # EPERM/EACCES: Landlock, the tool's log is not its
    assert got["unix"] == 2  # ENOENT: seccomp's connect(), as in every sandbox
    # ENOENT: seccomp's connect() again; the tool's channel opened at cuInit, before it.
    assert got["tcp_lo"] == 2
    assert got["interfaces"] == ["lo"]

"""`flashtune run` stopped by SIGINT, SIGTERM or SIGHUP at any moment (flashtune/cli/stopping.py):
every process of the run ends, the traces so far stay, one line says so, no traceback, exit
128 + the signal; `--resume` then runs what is left. And when the runner is SIGKILLed, its
workers end the rest themselves (their lifeline to it closes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _bench_helpers import make_dataset
from typer.testing import CliRunner

from flashtune.cli import app

GOOD = "def run(x, w):\n    return x * w\n"
BURN = "def run(x, w):\n    while True:\n        pass\n"
# The hanging solution starts a child first: a process of the run the kill must reach
# although it is neither the runner's nor a sandbox of the run (found by its `sleep` time).
SLEEP_S = f"86{os.getpid() % 1000:03d}.25"
HANG = (
    "import subprocess\nimport time\n\ndef run(x, w):\n"
    f"    subprocess.Popen(['sleep', '{SLEEP_S}'])\n    time.sleep(10**6)\n"
)
WAIT_S = 120.0  # for a moment of the run to come; a CI machine may be slow and shared


def _dataset(tmp_path: Path) -> Path:
    # 6 triples: per workload, a_good (passes), b_burn (a whole CPU in its first call),
    # c_hang (sleeps in its first call, its child too).
    root = tmp_path / "ds"
    make_dataset(root, {"a_good": GOOD, "b_burn": BURN, "c_hang": HANG}, sizes=[1, 2])
    return root


def _start(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "flashtune.cli", "run", "-d", "ds", "-o", "out"]
    cmd += ["--devices", "cpu", "-q", *extra]
    # Its own session and process group (a terminal's signals go to the group); the run's
    # folder is the working directory, which the fork servers' command lines name (sys.path),
    # and so do the workers and sandboxes forked from them.
    return subprocess.Popen(
        cmd, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def _stat(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text[text.rfind(")") + 2 :].split()


def _processes_of_run(runner: int, folder: Path) -> list[str]:
    """The live processes of the run: in the runner's session, or whose command line names
    the run's folder or the hanging solution's `sleep` (zombies are dead: left out)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        fields = _stat(int(entry))
        if not fields or fields[0] == "Z":
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[3]) == runner or str(folder) in cmdline or SLEEP_S in cmdline:
            found.append(f"{entry}: {cmdline[:120]}")
    return found


def _wait_for(what: str, ready: Callable[[], bool], proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"never saw {what}: {proc.communicate()}")
        time.sleep(0.05)


def _has_children(pid: int) -> bool:
    return any(e.isdigit() and _stat(int(e))[1:2] == [str(pid)] for e in os.listdir("/proc"))


def _trace_lines(out: Path) -> list[str]:
    # Traces only: --out is a whole dataset (its workloads are JSONL files too).
    files = sorted((out / "traces").rglob("*.jsonl")) if (out / "traces").is_dir() else []
    return [line for p in files for line in p.read_text().splitlines()]


def _stop(proc: subprocess.Popen[str], signum: int, group: bool) -> tuple[int, str]:
    if group:  # as a terminal does (Ctrl-C, hangup), and `timeout`
        os.killpg(proc.pid, signum)
    else:  # as systemd, Kubernetes do
        os.kill(proc.pid, signum)
    _, stderr = proc.communicate(timeout=WAIT_S)
    return proc.returncode, stderr


def _assert_nothing_left(proc: subprocess.Popen[str], tmp_path: Path) -> None:
    # The runner kills everything before it exits; what it killed last may still be dying.
    deadline = time.monotonic() + 10
    while _processes_of_run(proc.pid, tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_of_run(proc.pid, tmp_path) == []


@pytest.mark.slow
def test_stop_while_starting_and_while_workers_start(tmp_path):
    _dataset(tmp_path)
    # During the imports (seconds: torch): nothing has started.
    proc = _start(tmp_path)
    time.sleep(0.5)
    code, stderr = _stop(proc, signal.SIGINT, group=True)
    assert code == 130, stderr
    assert "interrupted by SIGINT" in stderr and "Traceback" not in stderr
    _assert_nothing_left(proc, tmp_path)
    # As the worker starts: the fork server and resource tracker are the runner's first
    # children, and they get the terminal's hangup as well.
    proc = _start(tmp_path)
    _wait_for("the workers start", lambda: _has_children(proc.pid), proc)
    code, stderr = _stop(proc, signal.SIGHUP, group=True)
    assert code == 129, stderr
    assert "interrupted by SIGHUP after 0" in stderr and "Traceback" not in stderr
    _assert_nothing_left(proc, tmp_path)


@pytest.mark.slow
def test_sigterm_while_a_solution_burns_cpu_then_resume(tmp_path, monkeypatch):
    _dataset(tmp_path)
    out = tmp_path / "out"
    proc = _start(tmp_path)
    # a_good's first trace is written; b_burn runs next, spinning in its first call.
    _wait_for("the first trace", lambda: out.exists() and len(_trace_lines(out)) >= 1, proc)
    time.sleep(1.0)
    code, stderr = _stop(proc, signal.SIGTERM, group=False)
    assert code == 143, stderr
    assert "Traceback" not in stderr
    assert f"interrupted by SIGTERM after 1 of 6 triples; traces so far in {out.name}" in stderr
    assert "`flashtune run --resume` continues" in stderr
    _assert_nothing_left(proc, tmp_path)
    # The triple cut short left no trace (it is not a result): one line, a_good's.
    lines = _trace_lines(out)
    assert len(lines) == 1 and '"a_good"' in lines[0]

    # --resume runs the other 5; both misbehaving solutions end at the first-call limit
    # (b_burn uses a CPU, c_hang has a child process: neither is taken for a hang).
    monkeypatch.chdir(tmp_path)  # -d ds -o out, as above
    result = CliRunner().invoke(
        app,
        ["run", "-d", "ds", "-o", "out", "--devices", "cpu", "-q", "--resume",
         "--first-call-timeout", "3"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "5 triples" in result.output and "1 already traced" in result.output
    lines = _trace_lines(out)
    assert len(lines) == 6
    for name, status, count in (("a_good", "PASSED", 2), ("b_burn", "TIMEOUT", 2)):
        assert sum(f'"{name}"' in t and f'"{status}"' in t for t in lines) == count, lines
    assert sum('"c_hang"' in t and '"TIMEOUT"' in t for t in lines) == 2


@pytest.mark.slow
def test_runner_sigkilled_while_a_solution_hangs(tmp_path):
    _dataset(tmp_path)
    # b_burn ends at the first-call limit; then c_hang starts its child and sleeps.
    proc = _start(tmp_path, "--first-call-timeout", "2")

    def sleeping() -> bool:
        return any(SLEEP_S in p for p in _processes_of_run(proc.pid, tmp_path))

    _wait_for("the hanging solution's child", sleeping, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=WAIT_S)
    # No handler ran: the worker sees its lifeline close and kills what is below it.
    _assert_nothing_left(proc, tmp_path)


SWALLOWING = """
import sys, time
from flashtune.cli import stopping
stopping.STOP_GRACE_S = 1.0
stopping.install()
with stopping.guarded():
    try:  # "ready" inside: the signal may land while print returns (a loaded machine)
        print("ready", flush=True)
        time.sleep(60)
    except stopping.Stopped:
        pass  # swallowed, as a weakref callback or __del__ would: the program must end anyway
    time.sleep(60)
    print("ran on", flush=True)
"""


# ~3 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
@pytest.mark.slow
def test_a_swallowed_stop_still_ends_the_program() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SWALLOWING], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    assert "ran on" not in out and "interrupted by SIGTERM" in err

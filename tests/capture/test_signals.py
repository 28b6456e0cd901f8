"""Everything queued is flushed on SIGTERM, SIGINT (chaining to the previous handler) and at
exit; FLASHTUNE_CAPTURE=1 turns capture on without code. Each case runs in a subprocess
whose writer thread is stalled, so the records are still queued when the signal arrives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

_PRELUDE = """
import os, signal, sys, time
sys.path.insert(0, {here!r})
import torch
from _capture_toys import toy_gemm
import flashtune.capture
from flashtune.capture import CaptureConfig, capture
from flashtune.capture.writer import CaptureWriter

# Stall the background thread: records stay queued until a flush writes them.
def _stalled(self):
    while not self._stop:
        time.sleep(0.01)
CaptureWriter._run = _stalled
"""


def _run_child(body: str, root: Path, sig: int | None, env: dict | None = None):
    code = _PRELUDE.format(here=str(HERE)) + textwrap.dedent(body)
    child_env = {**os.environ, "FLASHTUNE_DATASET": str(root), **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "ready" once the calls are queued
    assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
    if sig is not None:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def _count(root: Path) -> int:
    path = root / "workloads" / "toy_gemm" / "toy_gemm_n4_k4.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


BODY_CAPTURE = """
with capture(dataset={root!r}, default=CaptureConfig("dump_all", "keep_all")) as cap:
    for m in range(1, 6):
        toy_gemm(torch.randn(m, 4), torch.randn(4, 4))
    assert cap.writer.pending == 5
    print("ready", flush=True)
    time.sleep(60)
"""


def test_sigterm_flushes_then_dies_by_sigterm(tmp_path: Path) -> None:
    rc, _, err = _run_child(BODY_CAPTURE.format(root=str(tmp_path)), tmp_path, signal.SIGTERM)
    assert rc == -signal.SIGTERM, err
    assert _count(tmp_path) == 5
    blobs = list((tmp_path / "blob").rglob("*.safetensors"))
    assert len(blobs) == 5


def test_sigint_flushes_and_chains_to_previous_handler(tmp_path: Path) -> None:
    body = textwrap.dedent("""
        def previous(signum, frame):
            print("previous handler ran", flush=True)
            sys.exit(7)
        signal.signal(signal.SIGINT, previous)
    """) + BODY_CAPTURE.format(root=str(tmp_path))
    rc, out, err = _run_child(body, tmp_path, signal.SIGINT)
    assert rc == 7, err
    assert "previous handler ran" in out
    assert _count(tmp_path) == 5


def test_sigint_default_raises_keyboard_interrupt_after_flush(tmp_path: Path) -> None:
    # Python's own SIGINT handler, set explicitly: a child of a background job (`cmd &` in a
    # non-interactive shell) starts with SIGINT ignored, and Python then installs none, so
    # the signal would do nothing and the child sleep out the test's timeout.
    body = (
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "try:\n"
        + textwrap.indent(BODY_CAPTURE.format(root=str(tmp_path)), "    ")
        + "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n"
    )
    rc, out, err = _run_child(body, tmp_path, signal.SIGINT)
    assert rc == 0, err
    assert "interrupted" in out
    assert _count(tmp_path) == 5


def test_env_switch_captures_and_flushes_at_exit(tmp_path: Path) -> None:
    body = """
    for m in (1, 2, 2, 3):
        toy_gemm(torch.randn(m, 4), torch.randn(4, 4))
    print("ready", flush=True)
    # no close(): the atexit handler writes what is queued
    """
    env = {
        "FLASHTUNE_CAPTURE": "1",
        "FLASHTUNE_CAPTURE_DUMP_POLICY": "dump_none",
        "FLASHTUNE_CAPTURE_FILTER_POLICY": "shape_only",
    }
    rc, _, err = _run_child(body, tmp_path, None, env)
    assert rc == 0, err
    assert _count(tmp_path) == 3
    rows = (tmp_path / "workloads" / "toy_gemm" / "toy_gemm_n4_k4.jsonl").read_text().splitlines()
    assert [json.loads(r)["workload"]["axes"]["M"] for r in rows] == [1, 2, 3]


@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_handlers_restored_after_capture(tmp_path: Path, sig: int) -> None:
    from flashtune.capture import capture

    before = signal.getsignal(sig)
    with capture(dataset=tmp_path):
        assert signal.getsignal(sig) is not before
    assert signal.getsignal(sig) is before

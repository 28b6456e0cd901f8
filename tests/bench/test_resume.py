"""--resume, kill-and-resume, corrupt trace lines, and harness overhead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _bench_helpers import make_dataset
from typer.testing import CliRunner

from flashtune.bench.evaluate import BenchConfig
from flashtune.bench.runner import RunOptions, run_benchmark
from flashtune.cli import app
from flashtune.data import Trace

GOOD = "def run(x, w):\n    return x * w\n"


def _trace_lines(out: Path) -> list[str]:
    lines = []
    for path in sorted((out / "traces").rglob("*.jsonl")):
        lines += [line for line in path.read_text().splitlines() if line.strip()]
    return lines


def _keys(lines: list[str]) -> list[tuple[str, str, str]]:
    keys = []
    for line in lines:
        try:
            t = Trace.model_validate_json(line)
        except ValueError:
            continue
        keys.append((t.definition, t.solution, t.workload.uuid))
    return keys


def _opts(root: Path, out: Path, **kw) -> RunOptions:
    return RunOptions(
        datasets=[root],
        out=out,
        devices=["cpu"],
        timeout=30,
        config=BenchConfig(warmup=1, iterations=3, trials=1),
        max_workloads=1000,
        **kw,
    )


@pytest.mark.slow  # processes for seconds (the main suite stays under 10 minutes)
def test_resume_skips_finished_triples_and_reports_corrupt_lines(tmp_path):
    root = tmp_path / "ds"
    make_dataset(root, {"a": GOOD, "b": GOOD}, sizes=[1, 2, 3])
    out = tmp_path / "out"
    first = run_benchmark(_opts(root, out), progress=False)
    assert len(first.traces) == 6
    trace_file = next((out / "traces").rglob("*.jsonl"))
    # A corrupt line (a killed writer from another tool): reported, skipped, never rewritten.
    with open(trace_file, "a") as f:
        f.write('{"definition": "toy_scale_h8", "broken\n')
    before = trace_file.read_text()
    result = CliRunner().invoke(
        app,
        [
            "run",
            "-d",
            str(root),
            "-o",
            str(out),
            "--devices",
            "cpu",
            "--resume",
            "-q",
            "--max-workloads",
            "9",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"{trace_file}:7" in result.output  # file:line of the corrupt record
    assert "6 already traced" in result.output
    assert trace_file.read_text() == before  # nothing redone, nothing rewritten
    # A changed solution (new content hash) is evaluated again on --resume.
    make_dataset(tmp_path / "ds2", {"a": GOOD + "\n# v2\n", "b": GOOD}, sizes=[1, 2, 3])
    again = run_benchmark(_opts(tmp_path / "ds2", out, resume=True), progress=False)
    assert sorted({t.solution for t in again.traces}) == ["a"]
    assert again.resumed == 3


@pytest.mark.slow
def test_sigkill_then_resume_loses_nothing(tmp_path):
    root = tmp_path / "ds"
    slow = "import time\n\ndef run(x, w):\n    time.sleep(0.02)\n    return x * w\n"
    make_dataset(root, {f"s{i}": slow for i in range(4)}, sizes=list(range(1, 11)))
    out = tmp_path / "out"
    args = "--devices cpu --warmup 1 --iterations 5 -q --max-workloads 99".split()
    cmd = [sys.executable, "-m", "flashtune.cli", "run", "-d", str(root), "-o", str(out), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(_trace_lines(out) if out.exists() else []) < 8:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = _keys(_trace_lines(out))
    assert 8 <= len(done_before) < 40, "the run should have been killed mid-way"
    result = CliRunner().invoke(app, ["run", "-d", str(root), "-o", str(out), "--resume", *args])
    assert result.exit_code == 0, result.output
    keys = _keys(_trace_lines(out))
    assert set(done_before) <= set(keys)  # nothing finished was lost
    assert len(keys) == len(set(keys)) == 40  # every triple once: none redone, none missing


@pytest.mark.slow
def test_100_trivial_triples_all_pass(tmp_path):
    # How long they take is measured by benchmarks/bench_harness.py, not asserted here
    # (CI machines are shared: no wall-clock thresholds in unit tests).
    root = tmp_path / "ds"
    make_dataset(root, {f"s{i}": GOOD for i in range(4)}, sizes=list(range(1, 26)))
    result = run_benchmark(_opts(root, tmp_path / "out"), progress=False)
    assert len(result.traces) == 100
    assert all(t.evaluation.status.value == "PASSED" for t in result.traces)


def test_autotune_flag_runs_inside_the_tuner(tmp_path):
    root = tmp_path / "ds"
    make_dataset(root, {"a": GOOD}, sizes=[1])
    out = tmp_path / "out"
    autotune = ["--autotune", "--autotune-cache", str(tmp_path / "tune.json")]
    result = CliRunner().invoke(
        app, ["run", "-d", str(root), "-o", str(out), "--devices", "cpu", "-q", *autotune]
    )
    assert result.exit_code == 0, result.output
    assert "1 passed" in result.output


def test_out_inside_the_package_is_refused(tmp_path):
    from flashtune.cli import bundled_dataset

    result = CliRunner().invoke(app, ["run", "-o", str(bundled_dataset() / "x"), "-q"])
    assert result.exit_code == 2
    assert "inside the installed package" in result.output


@pytest.mark.slow
def test_work_is_spread_over_several_workers(tmp_path):
    root = tmp_path / "ds"
    make_dataset(root, {"a": GOOD, "b": GOOD}, sizes=list(range(1, 9)))
    opts = _opts(root, tmp_path / "out")
    opts.devices = ["cpu", "cpu"]  # two workers on one device: the same code path as 2 GPUs
    result = run_benchmark(opts, progress=False)
    keys = [(t.solution, t.workload.uuid) for t in result.traces]
    assert len(keys) == len(set(keys)) == 16
    assert all(t.evaluation.status.value == "PASSED" for t in result.traces)

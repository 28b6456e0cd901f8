"""The agent tools' target process (`python -m flashtune.bench.probe`) on the CPU: it calls the
solution once and reports, and it does so inside the benchmark's sandbox, so a hostile
candidate under compute-sanitizer or ncu reaches no more than one under `flashtune run`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _serve_helpers import DEFINITION, HONEST, hostile, report_of, small_dataset, solution

from flashtune.bench import isolation
from flashtune.bench.probe import parse_probe_line, write_job
from flashtune.data import Dataset


def _probe(folder: Path, dataset: Path, body: str) -> tuple[int, dict]:
    ds = Dataset(dataset)
    definition = ds.definition(DEFINITION)
    workload = ds.workloads_for(DEFINITION)[0].workload
    folder.mkdir()
    job = write_job(
        folder, definition, workload, solution("agent-probe", body), "cpu", [str(dataset)]
    )
    done = subprocess.run(
        [sys.executable, "-m", "flashtune.bench.probe", str(job)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    line = parse_probe_line(done.stdout)
    assert line is not None, done.stdout + done.stderr
    return done.returncode, line


def test_probe_calls_an_honest_solution(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path / "dataset")
    code, line = _probe(tmp_path / "job", dataset, HONEST)
    assert (code, line["ok"], line["stage"]) == (0, True, "done"), line
    assert line["sandbox"]


def test_probe_runs_a_hostile_solution_in_the_sandbox(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path / "dataset")
    secret = tmp_path / "cache" / "serve" / "token"
    secret.parent.mkdir(parents=True)
    secret.write_text("s" * 40)
    out = tmp_path / "out"
    out.mkdir()
    body = hostile("s" * 40, secret, 9, dataset, out)
    code, line = _probe(tmp_path / "job", dataset, body)
    assert (code, line["ok"], line["stage"]) == (3, False, "call"), line
    report = report_of(line["traceback"] + "\n" + line["error"])
    assert report["token_in_environ"] == []
    if not isolation.isolated(line["sandbox_report"]):
        pytest.skip(f"this machine's sandbox lacks layers: {line['sandbox']}")
    assert report["token_file"].startswith("blocked"), report
    assert report["connect"].startswith("blocked"), report
    assert report["write_dataset"].startswith("blocked"), report
    assert report["write_traces"].startswith("blocked"), report
    assert not (dataset / "definitions" / "pwned.json").exists()

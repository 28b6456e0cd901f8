"""The evaluator's queue logic with a stand-in for the runner (no worker, no sandbox): which
submissions share a run, cancellation of a running batch, a run that fails. The real runner
is exercised end to end in test_serve.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from _serve_helpers import DEFINITION, HONEST, small_dataset, solution

from flashtune.bench.evaluate import make_trace
from flashtune.bench.runner import RunOptions, RunResult
from flashtune.data import Dataset
from flashtune.data.models import EvaluationStatus
from flashtune.serve.tasks import EvaluationSettings, Evaluator, SubmissionError, TaskState


class FakeRun:
    """Records each run's (definition, solution) pairs; a trace for each of them (status
    RUNTIME_ERROR: a PASSED trace needs measurements a stand-in does not have). With
    `gate`, each run waits for it (a run in progress the test can act on)."""

    def __init__(self, dataset: Path, gate: threading.Event | None = None) -> None:
        self.runs: list[frozenset[tuple[str, str]]] = []
        self.started = threading.Event()
        self.gate = gate
        self.aborted = False
        self.ds = Dataset(dataset)

    def __call__(self, options: RunOptions, progress: bool, pool: Any) -> RunResult:
        assert options.only is not None and progress is False
        self.runs.append(options.only)
        original_abort = pool.abort

        def abort() -> None:
            self.aborted = True
            original_abort()

        pool.abort = abort
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        source = Dataset([options.datasets[0]], solution_sources=options.solutions_from)
        workload = self.ds.workloads_for(DEFINITION)[0].workload
        traces = [
            make_trace(d, workload, s, EvaluationStatus.RUNTIME_ERROR, {}, "stand-in")
            for d, name in sorted(options.only)
            for s in source.solutions_for(d, name)
        ]
        return RunResult(traces, options.out, 0.0, len(traces), 0, [], {})


def _evaluator(tmp_path: Path, run: FakeRun, **kwargs: Any) -> Evaluator:
    settings = EvaluationSettings(
        datasets=[tmp_path / "dataset"], out=tmp_path / "out", devices=["cpu"]
    )
    return Evaluator(settings, run=run, **kwargs)


def test_same_name_waits_for_the_next_run(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path / "dataset")
    run = FakeRun(dataset)
    evaluator = _evaluator(tmp_path, run)
    first = evaluator.submit(solution("agent-a", HONEST))
    again = evaluator.submit(solution("agent-a", HONEST))
    other = evaluator.submit(solution("agent-b", HONEST))
    evaluator.start()
    try:
        for task in (first, again, other):
            assert evaluator.wait(task.id, 30).state == TaskState.DONE
    finally:
        evaluator.stop()
    assert run.runs == [
        frozenset({(DEFINITION, "agent-a"), (DEFINITION, "agent-b")}),
        frozenset({(DEFINITION, "agent-a")}),
    ]
    assert [t.solution for t in first.traces] == ["agent-a"] and first.verdict == "RUNTIME_ERROR"
    assert [t.solution for t in again.traces] == ["agent-a"]


def test_cancelling_every_running_task_aborts_the_run(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path / "dataset")
    gate = threading.Event()
    run = FakeRun(dataset, gate)
    evaluator = _evaluator(tmp_path, run)
    task = evaluator.submit(solution("agent-a", HONEST))
    evaluator.start()
    try:
        assert run.started.wait(30)
        assert evaluator.get(task.id).state == TaskState.RUNNING
        evaluator.cancel(task.id)
        assert run.aborted
        gate.set()
        done = evaluator.wait(task.id, 30)
    finally:
        gate.set()
        evaluator.stop()
    assert done.state == TaskState.CANCELLED and done.traces == [] and done.verdict is None


def test_a_failing_run_fails_its_tasks_and_the_service_goes_on(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path / "dataset")
    good = FakeRun(dataset)
    calls = []

    def flaky(options: RunOptions, progress: bool, pool: Any) -> RunResult:
        calls.append(options.only)
        if len(calls) == 1:
            raise RuntimeError("worker for cpu did not start")
        return good(options, progress, pool)

    evaluator = _evaluator(tmp_path, good)
    evaluator._run = flaky  # the runner the thread calls
    first = evaluator.submit(solution("agent-a", HONEST))
    evaluator.start()
    try:
        failed = evaluator.wait(first.id, 30)
        second = evaluator.submit(solution("agent-b", HONEST))
        later = evaluator.wait(second.id, 30)
    finally:
        evaluator.stop()
    assert failed.state == TaskState.FAILED and "did not start" in (failed.error or "")
    assert later.state == TaskState.DONE and later.verdict == "RUNTIME_ERROR"


def test_queue_bound_and_refusals(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path / "dataset")
    evaluator = _evaluator(tmp_path, FakeRun(dataset), max_queue=1)
    evaluator.submit(solution("agent-a", HONEST))
    with pytest.raises(SubmissionError) as full:
        evaluator.submit(solution("agent-b", HONEST))
    assert full.value.status == 429
    with pytest.raises(SubmissionError) as unknown:
        evaluator.submit(solution("agent-c", HONEST, definition="nope"))
    assert unknown.value.status == 404
    with pytest.raises(ValueError):
        _evaluator(tmp_path, FakeRun(dataset), max_queue=0)

"""The evaluation service on a Ray cluster (`flashtune serve --ray`): submissions evaluated by
the cluster's worker actors (a local cluster of 2 CPU slots here, one a GPU on a real one) get
the verdicts a local run gives; the command refuses --ray with --devices."""

from __future__ import annotations

from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason='needs the ray extra: pip install "flashtune[ray]"')

from _serve_helpers import HONEST, WRONG, small_dataset, solution  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from flashtune.cli import app  # noqa: E402
from flashtune.serve.tasks import EvaluationSettings, Evaluator, TaskState  # noqa: E402


@pytest.mark.slow
def test_submissions_are_judged_by_the_clusters_workers(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path / "dataset")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        settings = EvaluationSettings(datasets=[dataset], out=tmp_path / "out", ray="local")
        evaluator = Evaluator(settings)
        honest = evaluator.submit(solution("agent-honest", HONEST))
        wrong = evaluator.submit(solution("agent-wrong", WRONG))
        evaluator.start()
        try:
            done = [evaluator.wait(t.id, 240) for t in (honest, wrong)]
        finally:
            evaluator.stop()
    finally:
        ray.shutdown()
    assert all(t is not None and t.state == TaskState.DONE for t in done), done
    assert honest.verdict == "PASSED", [t.evaluation for t in honest.traces]
    assert wrong.verdict == "INCORRECT_NUMERICAL"


def test_serve_refuses_ray_with_devices(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path / "dataset")
    args = ["serve", "-d", str(dataset), "--ray", "local", "--devices", "cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--devices and --ray" in result.output

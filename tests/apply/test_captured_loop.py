"""The documented loop on a dataset written by capture (docs/capture-and-apply.md, "The loop
on your program"): capture a flashtune op call -> `flashtune run -d CAPTURED --out CAPTURED`
(the bundled solutions attach to the captured definition of the same contract; only the
captured workload runs) -> `enable_apply(dataset=CAPTURED)` routes a call at the captured
shape to the winner, which lives in the bundled dataset, only while its trace is signed by
this user's key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import flashtune
from flashtune.apply import ApplyRuntime
from flashtune.cli import app, bundled_dataset
from flashtune.data import Dataset, EvaluationStatus
from flashtune.ops.gemm import gemm

runner = CliRunner()
WIDE = {"COLUMNS": "300"}

# A bundled definition (gemm_n8192_k1024: float16, N and K fixed) at a small M: the op runs on
# CPU in milliseconds, and the bundled dataset has a torch solution that runs on a CPU beside
# flashtune's Triton one (SKIPPED there without CUDA, unless the bench runs Triton in its
# interpreter).
M, N, K = 3, 8192, 1024
NAME = f"gemm_n{N}_k{K}"
TORCH = f"torch@{NAME}"


def _capture(root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(N, K, dtype=torch.float16)
    with flashtune.capture(dataset=root) as cap:
        gemm(a, b)
    assert cap.stats["written"] == 1
    return a, b


@pytest.mark.slow
def test_captured_dataset_runs_the_bundled_solutions_and_applies_the_winner(
    tmp_path: Path,
) -> None:
    root = tmp_path / "captured"
    a, b = _capture(root)
    assert not (root / "solutions").exists()  # capture writes definitions and workloads only
    (captured,) = Dataset(root).workloads_for(NAME)

    # 1. flashtune run -d CAPTURED --out CAPTURED, on the CPU
    result = runner.invoke(
        app, ["run", "-d", str(root), "--out", str(root), "--devices", "cpu", "-q"], env=WIDE
    )
    assert result.exit_code == 0, result.output
    assert f"solutions from {bundled_dataset()} run on 1 definition" in result.stderr
    traces = Dataset(root).all_traces()
    # Only the captured workload ran (the bundled dataset's workloads of NAME did not), with
    # every bundled solution of the definition.
    assert {(t.definition, t.workload.uuid) for t in traces} == {(NAME, captured.workload.uuid)}
    status = {t.solution: t.evaluation.status for t in traces if t.evaluation is not None}
    assert set(status) == {s.name for s in Dataset(bundled_dataset()).solutions_for(NAME)}
    assert status[TORCH] == EvaluationStatus.PASSED  # the torch baseline runs on a CPU
    # --out is a whole dataset (issue 36: what FlashInfer-Bench reads): the solutions its
    # traces name are written beside them, the bundled ones unchanged.
    exported = {s.name: s for s in Dataset(root).solutions_for(NAME)}
    bundled = {s.name: s for s in Dataset(bundled_dataset()).solutions_for(NAME)}
    assert exported.keys() == set(status)
    assert all(exported[name] == bundled[name] for name in exported)

    # 2. flashtune apply show -d CAPTURED
    shown = runner.invoke(app, ["apply", "show", "-d", str(root)], env=WIDE)
    assert shown.exit_code == 0, shown.output
    assert "warning" not in shown.stderr

    # 3. enable_apply(dataset=CAPTURED): the captured shape goes to the winner of its bucket
    # (torch's, unless flashtune's own solution also passed here and won: then the op runs
    # itself, ApplyHook.own).
    with flashtune.enable_apply(dataset=root) as handle:
        runtime = handle.runtime
        winner = runtime.table.lookup(NAME, {"M": M})
        assert winner is not None and status[winner] == EvaluationStatus.PASSED
        assert runtime.table.rejected == []
        assert winner.split("@")[0] in shown.stdout
        routed = gemm(a, b)
        if runtime.winner_runs_the_op_itself(NAME, winner):
            assert (handle.hook.own, handle.hook.hits, handle.hook.misses) == (1, 0, 0)
        else:
            assert (handle.hook.hits, handle.hook.misses) == (1, 0)
            chosen = runtime.runner(NAME, {"M": M})
            assert chosen is not None and chosen.solution == winner
    expected = (a.float() @ b.float().T).to(torch.float16)
    torch.testing.assert_close(routed, expected, atol=0.1, rtol=1e-2)

    # 4. the trust checks still hold for a solution found in the bundled dataset: the same
    # traces without this user's signature are no evidence.
    for path in (root / "traces").rglob("*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line]
        for trace in lines:
            del trace["signature"]
        path.write_text("".join(json.dumps(trace) + "\n" for trace in lines))
    unsigned = ApplyRuntime(root)
    assert unsigned.table.lookup(NAME, {"M": M}) is None
    assert unsigned.runner(NAME, {"M": M}) is None
    assert unsigned.table.rejected and all(
        r.reason.startswith("not signed") for r in unsigned.table.rejected
    )

"""The loop closed on CPU: a small model runs flashtune ops under capture -> workloads ->
the benchmark runner (`flashtune run`'s Python API) -> traces -> enable_apply -> the ops
dispatch to the planted winner, and fall back for shapes outside the table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _apply_helpers import NORM_SRC, calls_of, plant

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from _capture_toys import ToyModel  # noqa: E402

import flashtune  # noqa: E402
from flashtune.apply import ApplyTable  # noqa: E402
from flashtune.bench.runner import RunOptions, run_benchmark  # noqa: E402
from flashtune.data import Dataset, EvaluationStatus  # noqa: E402

SLOW_SRC = NORM_SRC.replace("import torch\n", "import time\nimport torch\n").replace(
    "    CALLS.append", "    time.sleep(0.002)\n    CALLS.append"
)
WRONG_SRC = "def run(hidden_states, weight):\n    return hidden_states * 0 + 1\n"


@pytest.mark.slow  # processes for seconds (the main suite stays under 10 minutes)
def test_capture_bench_apply_loop(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    model = ToyModel(hidden=16, layers=2)

    # 1. capture what the model runs
    with flashtune.capture(dataset=root) as cap:
        for batch in (1, 3, 3, 8):
            model(torch.randn(batch, 16))
    assert cap.stats["written"] == 6  # 3 shapes x (norm, gemm)
    ds = Dataset(root)
    assert [w.workload.axes["batch_size"] for w in ds.workloads_for("toy_norm_h16")] == [1, 3, 8]

    # 2. plant solutions: the fastest correct one must win, the wrong one never
    fast = plant(ds, "toy_norm_h16", "fast_norm", NORM_SRC)
    plant(ds, "toy_norm_h16", "slow_norm", SLOW_SRC)
    plant(ds, "toy_norm_h16", "wrong_norm", WRONG_SRC)

    # 3. benchmark: traces land in the same dataset
    result = run_benchmark(
        RunOptions(datasets=[root], out=root, devices=["cpu"], max_workloads=10), progress=False
    )
    status = {
        (t.solution, t.workload.axes["batch_size"]): t.evaluation.status for t in result.traces
    }
    assert len(status) == 9
    assert all(status[("fast_norm", b)] == EvaluationStatus.PASSED for b in (1, 3, 8))
    assert all(status[("wrong_norm", b)] != EvaluationStatus.PASSED for b in (1, 3, 8))
    table = ApplyTable.load(Dataset(root))
    assert {w.solution for w in table.definitions["toy_norm_h16"].buckets.values()} == {"fast_norm"}

    # 4. apply: benchmarked and unseen batch sizes dispatch to the winner
    x3, x5 = torch.randn(3, 16), torch.randn(5, 16)
    expected3, expected5 = model(x3), model(x5)
    calls = calls_of(fast)
    calls.clear()
    with flashtune.enable_apply(dataset=root) as handle:
        torch.testing.assert_close(model(x3), expected3)
        torch.testing.assert_close(model(x5), expected5)  # batch 5: nearest bucket (<=8)
        assert calls == [(3, 16), (3, 16), (5, 16), (5, 16)]
        # another hidden size is another definition, absent from the table: the op's own path
        other = ToyModel(hidden=24)
        other(torch.randn(3, 24))
        assert len(calls) == 4
        assert handle.hook.hits == 4
        assert handle.hook.misses == 4 + 4  # gemm (no solutions) x 4, then 2 layers at h24
    model(x3)
    assert len(calls) == 4  # apply off again

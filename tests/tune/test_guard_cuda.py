"""Issue 38 on the GPU (for the lead's GPU session: `python -m pytest -q -m cuda
tests/tune/test_guard_cuda.py`): the tuned GEMM is never slower than cuBLAS beyond the
noise, re-timed independently the way the benchmark times; and two GPUs tune together."""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tune_helpers as H  # noqa: E402

from flashtune import timing  # noqa: E402
from flashtune.tune import AutoTuner, autotune, choose_one  # noqa: E402

# The shapes where the H100 measurement of issue 38 found tuned picks 3-7.5% slower than
# cuBLAS: 2048x4096x4096, 8192x4096x14336, the 128256-wide LM head at M=16 and 64.
LOSERS = [(2048, 4096, 4096), (8192, 4096, 14336), (16, 128256, 4096), (64, 128256, 4096)]


def retime(runner, tactic, A, B) -> float:
    def call(a, b):
        return runner.forward([a, b, None], tactic)

    return timing.measure_robust(call, [A, B], timing.TimingPolicy(cold_l2=True)).median_ms


@pytest.mark.cuda
@pytest.mark.parametrize("m,n,k", LOSERS)
def test_the_tuned_gemm_is_not_slower_than_cublas(m: int, n: int, k: int) -> None:
    from flashtune.ops.gemm.launch import GEMM_RUNNERS, GEMM_TUNING

    AutoTuner.get().clear()
    A = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    with autotune(True) as tuner:
        runner, tactic = choose_one("gemm", GEMM_RUNNERS, GEMM_TUNING, [A, B, None])
    (decision,) = tuner.decisions.values()
    pick_ms = retime(runner, tactic, A, B)
    cublas_ms = retime(GEMM_RUNNERS[0], -1, A, B)
    print(f"{m}x{n}x{k}: {runner.name}:{tactic} {pick_ms:.4f} ms, cuBLAS {cublas_ms:.4f} ms; "
          f"{decision.kind}: {decision.reason}")  # fmt: skip
    # Issue 38's bar is 1%; the extra 1% is this re-measurement's own noise.
    assert pick_ms <= cublas_ms * 1.02, decision


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_tune_together_and_restart_warm(tmp_path: Path) -> None:
    def run(phase: str) -> list[dict]:
        ctx = mp.get_context("spawn")
        init = tmp_path / f"init-{phase}"
        procs = [
            ctx.Process(target=H.gemm_rank_worker, args=(r, 2, str(init), str(tmp_path), phase))
            for r in range(2)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
        assert not any(p.is_alive() for p in procs), "a rank hung"
        assert all(p.exitcode == 0 for p in procs)
        return [json.loads((tmp_path / f"{phase}-rank{r}.json").read_text()) for r in range(2)]

    cold = run("cold")
    assert cold[0]["picks"] == cold[1]["picks"]
    # Buckets 1, 16, 64, 512: four in all, each tuned on one rank (16 by only one of the two).
    assert sum(r["tuned"] for r in cold) == 4
    warm = run("warm")
    assert [r["timed"] for r in warm] == [0, 0]
    assert warm[0]["picks"] == warm[1]["picks"] == cold[0]["picks"]

"""Results of a cluster with several GPU models: never divided or averaged across models."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from _gemm_traces import gemm_trace
from flashtune.bench.ray import ClusterError
from flashtune.bench.ray.spread import one_kind
from flashtune.cli import app
from flashtune.data import Dataset, Trace
from flashtune.report.fast_p import fast_p
from flashtune.report.tables import GPU_DIFFERS, compare, rank, summarize

H100 = {"hardware": "NVIDIA H100 80GB HBM3", "torch": "2.13.0", "triton": "3.6.0"}
A100 = {**H100, "hardware": "NVIDIA A100-SXM4-80GB"}


def _trace(sol: str, m: int, latency: float, env: dict, baseline: float) -> Trace:
    return gemm_trace(sol, m, latency, environment=env, baseline=("torch", baseline))


def _mixed() -> list[Trace]:
    """M=1 measured on an H100, M=16 on an A100 (each with its own torch baseline)."""
    return [
        _trace("torch", 1, 2.0, H100, 2.0),
        _trace("flashtune", 1, 1.0, H100, 2.0),
        _trace("torch", 16, 8.0, A100, 8.0),
        _trace("flashtune", 16, 2.0, A100, 8.0),
    ]


def test_summary_of_one_solution_over_two_gpu_models_is_not_averaged():
    rows = {s.solution: s for s in summarize(_mixed())}
    ft = rows["flashtune"]
    assert ft.passed == 2
    assert ft.latency_ms is None and ft.speedup_vs_baseline is None
    assert ft.speedup_vs_reference is None
    assert GPU_DIFFERS in ft.gpu_reason and "A100" in ft.gpu_reason and "H100" in ft.gpu_reason
    # One model: the geomeans stand.
    one = {s.solution: s for s in summarize(_mixed()[:2])}["flashtune"]
    assert one.gpu_reason is None and one.speedup_vs_baseline == 2.0


def test_compare_refuses_pairs_and_means_across_gpu_models():
    # flashtune on the H100 against flashinfer on the A100, same workload: refused.
    traces = [_trace("flashtune", 1, 1.0, H100, 2.0), _trace("flashinfer", 1, 2.0, A100, 2.0)]
    (row,), overall = compare(traces, "flashtune", "flashinfer")
    assert row.workloads == 0 and row.excluded == 1 and GPU_DIFFERS in row.reason
    assert overall is None
    # Each pair on one model, but the definition's pairs on two: no geomean either.
    traces = _mixed() + [
        _trace("flashinfer", 1, 2.0, H100, 2.0),
        _trace("flashinfer", 16, 4.0, A100, 8.0),
    ]
    (row,), overall = compare(traces, "flashtune", "flashinfer")
    assert row.geomean is None and row.excluded == 2 and GPU_DIFFERS in row.reason
    assert overall is None


def test_rank_and_fast_p_say_which_gpu():
    traces = [_trace("flashtune", 1, 1.0, H100, 2.0), _trace("torch", 1, 2.0, A100, 2.0)]
    (ranking,) = rank(traces)
    assert ranking.mixed_gpus and ranking.gpus["torch"] == A100["hardware"]
    assert not rank(_mixed()[:2])[0].mixed_gpus
    # Its baseline ran on another model: correct, but no speedup taken.
    (ft,) = [f for f in fast_p(traces) if f.family == "flashtune"]
    assert ft.correct == 1 and ft.unjudged == 1 and ft.speedups == []


def test_report_summary_shows_different_gpus(tmp_path: Path):
    root = tmp_path / "res"
    ds = Dataset(root)
    for t in _mixed():
        ds.append_trace(t, author="tests")
    out = CliRunner().invoke(app, ["report", "summary", "-d", str(root)], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert GPU_DIFFERS in out.output


def test_tuning_refuses_a_cluster_of_several_gpu_models():
    assert one_kind([H100, H100]) == H100["hardware"]
    with pytest.raises(
        ClusterError, match=r"several kinds \(1 x NVIDIA A100-SXM4-80GB, 2 x NVIDIA H100"
    ):
        one_kind([H100, A100, H100])

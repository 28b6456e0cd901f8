"""Traces of one small GEMM definition ("gemm_n64_k64", a workload per M) that the report and
CLI tests build their datasets from; imported as `_gemm_traces` (see _examples.py)."""

from __future__ import annotations

from typing import Any

from flashtune.data import Correctness, Evaluation, EvaluationStatus, Performance, Trace, Workload


def gemm_trace(
    solution: str,
    m: int,
    latency: float | None,
    *,
    environment: dict[str, Any],
    status: str = "PASSED",
    timestamp: str = "2026-11-24T00:00:00+00:00",
    reason: str = "boom",
    reference_latency: float = 10.0,
    method: str | None = "cuda_graph",
    ref_method: str | None = "cuda_graph",
    baseline: tuple[str, float] | None = None,
) -> Trace:
    """A trace of `solution` at M=m: measured `latency` ms (None: no performance) against a
    reference of `reference_latency` ms and, when given, a (baseline solution, its latency);
    `reason` is kept only when `status` is not PASSED."""
    perf = None
    if latency is not None:
        perf = Performance(
            latency_ms=latency,
            reference_latency_ms=reference_latency,
            speedup_factor=reference_latency / latency,
            timing_method=method,
            reference_timing_method=ref_method,
        )
        if baseline:
            perf.baseline_solution, perf.baseline_latency_ms = baseline
            perf.speedup_vs_baseline = baseline[1] / latency
    passed = status == "PASSED"
    return Trace(
        definition="gemm_n64_k64",
        workload=Workload(uuid=f"w{m}", axes={"M": m}),
        solution=solution,
        evaluation=Evaluation(
            status=EvaluationStatus(status),
            environment=environment,
            timestamp=timestamp,
            reason=None if passed else reason,
            correctness=Correctness(max_absolute_error=0.0, max_relative_error=0.0)
            if passed
            else None,
            performance=perf,
        ),
    )

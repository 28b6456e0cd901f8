"""What a measurement achieved against the hardware's limits: bytes moved and FLOPs counted
from the Definition, turned into GB/s or TFLOP/s, and the peak figures of known GPUs.

Bytes moved are the definition's inputs read once plus its outputs written once; FLOPs are
counted for GEMM (2MNK) and attention (4 * query tokens * attended KV tokens * heads * d, KV
halved for causal prefill). Peaks are nominal datasheet numbers (dense bf16), not measured:
a line at the peak says how far a kernel is from the hardware, not from what is reachable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flashtune.data.models import Definition, Trace
from flashtune.data.synth import resolve_axes, torch_dtype

__all__ = [
    "PEAKS",
    "Peak",
    "peak_for",
    "bytes_moved",
    "flops",
    "TFLOPS",
    "GBPS",
    "unit_for",
    "throughput",
]


@dataclass(frozen=True)
class Peak:
    tflops: float  # dense bf16 tensor-core TFLOP/s
    tb_per_s: float  # HBM bandwidth, TB/s


# Nominal datasheet figures; the first key found in the trace's hardware name is used.
PEAKS: dict[str, Peak] = {
    "H100": Peak(989.0, 3.35),
    "H200": Peak(989.0, 4.8),
    "A100": Peak(312.0, 2.0),
    "B200": Peak(2250.0, 8.0),
}


def peak_for(hardware: str) -> Peak | None:
    for key, value in PEAKS.items():
        if key in hardware:
            return value
    return None


def bytes_moved(definition: Definition, axes: Mapping[str, int]) -> int:
    """Inputs read once plus outputs written once. A paged KV cache is read only where the
    page table points: `num_kv_indices` pages, not the `num_pages` allocated."""
    if "num_pages" in axes and "num_kv_indices" in axes:
        axes = {**axes, "num_pages": min(axes["num_pages"], axes["num_kv_indices"])}
    total = 0
    for spec in [*definition.inputs.values(), *definition.outputs.values()]:
        if spec.shape is None:
            continue
        total += math.prod(axes.get(a, 1) for a in spec.shape) * torch_dtype(spec.dtype).itemsize
    return total


def flops(definition: Definition, axes: Mapping[str, int]) -> float | None:
    """FLOPs of one call, for the compute-bound op types (None: count bytes instead)."""
    if definition.op_type == "gemm":
        return 2.0 * axes["M"] * axes["N"] * axes["K"]
    if definition.op_type in ("gqa_paged", "gqa_ragged"):
        hq, d = axes.get("num_qo_heads", 0), axes.get("head_dim", 0)
        if "batch_size" in axes and "total_q" not in axes:  # decode: one token per request
            kv = axes.get("num_kv_indices", 0) * axes.get("page_size", 1)
            return 4.0 * kv * hq * d
        q = axes.get("total_q", 0)
        kv = axes.get("total_kv", axes.get("num_kv_indices", 0) * axes.get("page_size", 1))
        # causal, q == kv per request: each query sees half the keys on average
        return 4.0 * hq * d * q * kv / max(axes.get("len_indptr", 2) - 1, 1) / 2
    return None


TFLOPS, GBPS = "TFLOP/s", "GB/s"


def _axes(definition: Definition, trace: Trace) -> dict[str, int] | None:
    try:
        return resolve_axes(definition, trace.workload)
    except (KeyError, ValueError):
        return None


def unit_for(definition: Definition, traces: Sequence[Trace], peak: Peak | None) -> str:
    """TFLOP/s where the definition's work is compute-bound, else GB/s: compute-bound when
    most workloads' arithmetic intensity (FLOPs per byte) is above the GPU's ridge point
    (peak FLOP/s over peak bytes/s). Decode attention and small-M GEMM are memory-bound and
    read best as GB/s; without a known peak, TFLOP/s wherever FLOPs are counted."""
    above = below = 0
    for t in traces:
        axes = _axes(definition, t)
        work = flops(definition, axes) if axes is not None else None
        if axes is None or work is None:
            continue
        if peak is None:
            return TFLOPS
        moved = bytes_moved(definition, axes)
        ridge = peak.tflops / peak.tb_per_s  # FLOPs per byte (the 1e12s cancel)
        if moved and work / moved >= ridge:
            above += 1
        else:
            below += 1
    return TFLOPS if above > below else GBPS


def throughput(definition: Definition, trace: Trace, unit: str) -> float | None:
    """What a timed trace achieved in `unit` (TFLOP/s or GB/s); None when it has no latency,
    its axes do not resolve against the definition, or the op's FLOPs are not counted."""
    perf = trace.evaluation.performance if trace.evaluation else None
    axes = _axes(definition, trace)
    if perf is None or perf.latency_ms <= 0 or axes is None:
        return None
    seconds = perf.latency_ms / 1e3
    if unit == TFLOPS:
        work = flops(definition, axes)
        return None if work is None else work / seconds / 1e12
    return bytes_moved(definition, axes) / seconds / 1e9

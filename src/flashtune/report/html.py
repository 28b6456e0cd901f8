"""A self-contained HTML report of Traces, with PNG plots when matplotlib is installed
(`pip install flashtune[plot]`): per definition, latency against the workload's main var
axis for each solution, and achieved bandwidth (GB/s) or TFLOP/s against a roofline.

Bytes moved are counted from the Definition (inputs read once + outputs written once);
FLOPs for GEMM (2MNK) and attention (4 * query tokens * attended KV tokens * heads * d,
KV halved for causal prefill). Peak figures per GPU are nominal datasheet numbers.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from flashtune.data.models import Definition, EvaluationStatus, Trace
from flashtune.data.synth import resolve_axes, torch_dtype
from flashtune.report.tables import TIMING_DIFFERS, latest, rank, summarize

__all__ = ["write_html", "bytes_moved", "flops", "PEAKS"]

# Nominal dense bf16 TFLOP/s and HBM TB/s per GPU (datasheets), for the roofline lines.
PEAKS: dict[str, tuple[float, float]] = {
    "H100": (989.0, 3.35),
    "H200": (989.0, 4.8),
    "A100": (312.0, 2.0),
    "B200": (2250.0, 8.0),
}


def _peak(hardware: str) -> tuple[float, float] | None:
    for key, value in PEAKS.items():
        if key in hardware:
            return value
    return None


def bytes_moved(definition: Definition, axes: Mapping[str, int]) -> int:
    total = 0
    for spec in [*definition.inputs.values(), *definition.outputs.values()]:
        if spec.shape is None:
            continue
        total += math.prod(axes.get(a, 1) for a in spec.shape) * torch_dtype(spec.dtype).itemsize
    return total


def flops(definition: Definition, axes: Mapping[str, int]) -> float | None:
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


def _main_axis(traces: list[Trace]) -> str | None:
    varying = defaultdict(set)
    for t in traces:
        for k, v in t.workload.axes.items():
            varying[k].add(v)
    ordered = sorted(varying, key=lambda k: -len(varying[k]))
    return ordered[0] if ordered else None


def _plot(definition: Definition | None, traces: list[Trace], folder: Path, name: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    axis = _main_axis(traces)
    if axis is None:
        return []
    passed = [
        t
        for t in traces
        if t.evaluation
        and t.evaluation.status is EvaluationStatus.PASSED
        and t.evaluation.performance
    ]
    by_sol: dict[str, list[Trace]] = defaultdict(list)
    for t in passed:
        by_sol[t.solution or ""].append(t)
    files = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for sol, ts in sorted(by_sol.items()):
        pts = sorted((t.workload.axes[axis], t.evaluation.performance.latency_ms) for t in ts)  # type: ignore[union-attr]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=sol)
    ax.set(xscale="log", yscale="log", xlabel=axis, ylabel="latency (ms)", title=name)
    ax.legend()
    path = folder / f"{name}_latency.png"
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    files.append(path.name)
    if definition is not None and passed:
        hardware = str(passed[0].evaluation.environment.get("hardware", ""))  # type: ignore[union-attr]
        peak = _peak(hardware)
        fig, ax = plt.subplots(figsize=(6, 4))
        use_flops = flops(definition, resolve_axes(definition, passed[0].workload)) is not None
        for sol, ts in sorted(by_sol.items()):
            pts = []
            for t in ts:
                axes = resolve_axes(definition, t.workload)
                sec = t.evaluation.performance.latency_ms / 1e3  # type: ignore[union-attr]
                value = (
                    (flops(definition, axes) or 0) / sec / 1e12
                    if use_flops
                    else (bytes_moved(definition, axes) / sec / 1e9)
                )
                pts.append((t.workload.axes[axis], value))
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=sol)
        if peak:
            ax.axhline(
                peak[0] if use_flops else peak[1] * 1e3,
                color="k",
                ls="--",
                label=f"{hardware} peak",
            )
        ax.set(xscale="log", xlabel=axis, ylabel="TFLOP/s" if use_flops else "GB/s", title=name)
        ax.legend()
        path = folder / f"{name}_roofline.png"
        fig.savefig(path, dpi=90, bbox_inches="tight")
        plt.close(fig)
        files.append(path.name)
    return files


def write_html(traces: Iterable[Trace], definitions: Mapping[str, Definition], out: Path) -> Path:
    """Write `out` (an .html file) and its PNGs beside it; return the HTML path."""
    traces = latest(traces)
    out.parent.mkdir(parents=True, exist_ok=True)
    by_def: dict[str, list[Trace]] = defaultdict(list)
    for t in traces:
        by_def[t.definition].append(t)
    summaries = summarize(traces)
    rankings = rank(traces)
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>flashtune report</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}.bad{color:#b00}"
        ".flag{background:#ffd}</style></head><body><h1>flashtune report</h1>",
        "<p>Speedups are geomeans over the workloads where both latencies were timed by one "
        f"method; pairs timed differently (or by an unknown method) show {TIMING_DIFFERS} and "
        "are left out of the geomeans, counted in the note.</p>",
    ]
    for name in sorted(by_def):
        parts.append(
            f"<h2>{e(name)}</h2><table><tr><th>solution</th><th>passed</th>"
            "<th>pass rate</th><th>latency (geomean)</th><th>vs reference</th>"
            "<th>vs baseline</th><th>note</th></tr>"
        )
        for s in (s for s in summaries if s.definition == name):
            lat = f"{s.latency_ms:.4f} ms" if s.latency_ms else ""
            flag = " class='flag'" if s.suspicious else ""
            note = (
                f"{s.suspicious} result(s) &gt;10x the best baseline: review. "
                if s.suspicious
                else ""
            ) + e(s.reason or "")
            excluded = []
            if s.excluded_reference:
                excluded.append(f"{s.excluded_reference} vs reference")
            if s.excluded_baseline:
                excluded.append(f"{s.excluded_baseline} vs baseline")
            if excluded:  # left out of the geomeans: timed differently, or unknown
                note = (
                    f"excluded ({TIMING_DIFFERS}): {', '.join(excluded)}; "
                    f"{e(s.timing_reason or '')}. " + note
                )
            parts.append(
                f"<tr{flag}><td>{e(s.solution)}</td><td>{s.passed}/{s.total}</td>"
                f"<td>{s.pass_rate:.0%}</td><td>{lat}</td>"
                f"<td>{_x(s.speedup_vs_reference, s.excluded_reference)}</td>"
                f"<td>{_x(s.speedup_vs_baseline, s.excluded_baseline)}</td>"
                f"<td class='bad'>{note}</td></tr>"
            )
        parts.append(
            "</table><h3>per workload (fastest first)</h3><table>"
            "<tr><th>axes</th><th>ranking</th><th>failed</th></tr>"
        )
        for r in (r for r in rankings if r.definition == name):
            axes = ", ".join(f"{k}={v}" for k, v in r.axes.items())
            mixed = r.mixed_timing  # not like for like: say how each was timed
            ranking = " &gt; ".join(
                f"{e(n)} {ms:.4f} ms"
                + (f" ({e(r.timing.get(n) or 'timing unknown')})" if mixed else "")
                + (" <b>(&gt;10x: review)</b>" if f else "")
                for n, ms, f in r.entries
            )
            failed = ", ".join(f"{e(n)}: {s}" for n, s in r.failed)
            parts.append(f"<tr><td>{e(axes)}</td><td>{ranking}</td><td>{failed}</td></tr>")
        parts.append("</table>")
        for png in _plot(definitions.get(name), by_def[name], out.parent, name):
            parts.append(f"<img src='{e(png)}' alt='{e(png)}'>")
    parts.append("</body></html>")
    out.write_text("\n".join(parts), encoding="utf-8")
    return out


def _x(value: float | None, excluded: int = 0) -> str:
    if value is None:
        return TIMING_DIFFERS if excluded else ""
    return f"{value:.2f}x"

"""Summaries of Traces: per-solution pass rates and speedups, per-workload rankings, A-vs-B
comparisons. Pure functions over Trace lists, rendered with rich by the CLI (cli/report.py).

Speedups are geometric means over workloads (the right mean for ratios). A solution more
than `SUSPICIOUS_SPEEDUP` times faster than the best baseline is flagged: such results are
usually a measurement or correctness hole (caching, skipped work), not a real kernel.

Like for like: a speedup is a ratio of two latencies, and only means something when both were
timed by the same method (`Performance.timing_method`: a CUDA graph of many calls, CUDA
events around each call, the CPU clock...). Where the methods differ, or either is unknown
(absent), no speedup is computed: it shows as "n/a: timing differs", is left out of every
geomean, and the number left out is reported beside it.

One GPU model, one population: latencies taken on different GPU models (the environment's
`hardware`, e.g. the nodes of a mixed Ray cluster) are never divided by one another nor
averaged together. A pair measured on two models is refused like a timing difference; a
solution or definition whose results span several models gets "n/a: different GPUs" in place
of its geomeans, with the models named.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fnmatch import fnmatchcase

from flashtune.data.models import EvaluationStatus, Trace
from flashtune.data.timestamps import recency

__all__ = [
    "SUSPICIOUS_SPEEDUP",
    "TIMING_DIFFERS",
    "GPU_DIFFERS",
    "timing_method",
    "gpu_model",
    "unlike",
    "SolutionSummary",
    "Ranking",
    "Comparison",
    "geomean",
    "summarize",
    "rank",
    "compare",
    "latest",
    "flagged",
]

SUSPICIOUS_SPEEDUP = 10.0
TIMING_DIFFERS = "n/a: timing differs"
GPU_DIFFERS = "n/a: different GPUs"


def timing_method(trace: Trace) -> str | None:
    """How the trace's latency was measured; None when it does not say."""
    perf = trace.evaluation.performance if trace.evaluation else None
    return getattr(perf, "timing_method", None) if perf is not None else None


def gpu_model(trace: Trace) -> str | None:
    """The GPU model (or CPU) the trace was measured on: its environment's `hardware`."""
    hardware = trace.evaluation.environment.get("hardware") if trace.evaluation else None
    return str(hardware) if hardware is not None else None


def _gpus_differ(models: Iterable[str | None]) -> str | None:
    """GPU_DIFFERS naming the models, when there is more than one (None: one population)."""
    found = sorted({m or "unknown" for m in models})
    return f"{GPU_DIFFERS} ({', '.join(found)})" if len(found) > 1 else None


def unlike(method_a: str | None, method_b: str | None) -> str | None:
    """Why latencies timed by these two methods cannot be divided (None: they can).
    An unknown method is never like anything, itself included."""
    if method_a is not None and method_a == method_b:
        return None
    return f"{TIMING_DIFFERS} ({method_a or 'unknown'} vs {method_b or 'unknown'})"


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def latest(traces: Iterable[Trace]) -> list[Trace]:
    """One trace per (definition, solution, workload): the newest measurement (resumed and
    repeated runs append), by parsed time (`flashtune.data.timestamps.recency`: a time zone
    is honoured, none is UTC, and a timestamp that does not parse or lies in the future
    counts as the oldest, so it never shadows a real later result); of equal times, the one
    recorded last."""
    now = datetime.now(timezone.utc)
    keep: dict[tuple[str, str, str], tuple[datetime, Trace]] = {}
    for t in traces:
        if t.solution is None or t.evaluation is None:
            continue
        key = (t.definition, t.solution, t.workload.uuid)
        when = recency(t.evaluation.timestamp, now)
        if key not in keep or when >= keep[key][0]:
            keep[key] = (when, t)
    return [t for _, t in keep.values()]


@dataclass
class SolutionSummary:
    definition: str
    solution: str
    total: int = 0
    statuses: Counter = field(default_factory=Counter)
    latency_ms: float | None = None  # geomean over passed workloads
    speedup_vs_reference: float | None = None
    speedup_vs_baseline: float | None = None
    baseline: str | None = None
    reason: str | None = None  # the first non-PASSED reason
    suspicious: int = 0
    # Speedups refused because the two latencies were timed differently (or unknown):
    # left out of the geomeans above, counted here.
    excluded_reference: int = 0
    excluded_baseline: int = 0
    timing_reason: str | None = None  # the first refusal's reason
    # Set when the passed results were measured on several GPU models: GPU_DIFFERS with the
    # models; latency and speedups are then None (not one population).
    gpu_reason: str | None = None

    @property
    def passed(self) -> int:
        return self.statuses[EvaluationStatus.PASSED]

    @property
    def pass_rate(self) -> float:
        ran = self.total - self.statuses[EvaluationStatus.SKIPPED]
        return self.passed / ran if ran else 0.0


def _best_baseline(traces: Sequence[Trace]) -> dict[tuple[str, str, str | None], float]:
    """(definition, workload uuid, GPU model) -> the fastest baseline latency recorded."""
    best: dict[tuple[str, str, str | None], float] = {}
    for t in traces:
        perf = t.evaluation.performance if t.evaluation else None
        if perf and perf.baseline_solution == t.solution:
            key = (t.definition, t.workload.uuid, gpu_model(t))
            best[key] = min(best.get(key, math.inf), perf.latency_ms)
    return best


def flagged(trace: Trace, best_baseline: dict[tuple[str, str, str | None], float]) -> bool:
    """Whether the trace is more than SUSPICIOUS_SPEEDUP x faster than the best baseline
    measured on the same GPU model."""
    perf = trace.evaluation.performance if trace.evaluation else None
    base = best_baseline.get((trace.definition, trace.workload.uuid, gpu_model(trace)))
    if perf is None or base is None or perf.latency_ms <= 0:
        return False
    return base / perf.latency_ms > SUSPICIOUS_SPEEDUP


def summarize(traces: Iterable[Trace]) -> list[SolutionSummary]:
    """Per (definition, solution): status counts, pass rate and geomean speedups, each over
    the workloads where both latencies were timed by one method (see `unlike`)."""
    traces = latest(traces)
    best = _best_baseline(traces)
    methods = {(t.definition, t.workload.uuid, t.solution): timing_method(t) for t in traces}
    groups: dict[tuple[str, str], list[Trace]] = defaultdict(list)
    for t in traces:
        groups[(t.definition, t.solution or "")].append(t)
    out = []
    for (definition, solution), ts in sorted(groups.items()):
        s = SolutionSummary(definition, solution, total=len(ts))
        lat, ref, base = [], [], []
        for t in ts:
            ev = t.evaluation
            assert ev is not None
            s.statuses[ev.status] += 1
            if ev.status is not EvaluationStatus.PASSED and s.reason is None:
                s.reason = ev.reason
            perf = ev.performance
            if ev.status is EvaluationStatus.PASSED and perf is not None:
                lat.append(perf.latency_ms)
                method = getattr(perf, "timing_method", None)
                if perf.speedup_factor is not None:
                    why = unlike(method, getattr(perf, "reference_timing_method", None))
                    if why is None:
                        ref.append(perf.speedup_factor)
                    else:
                        s.excluded_reference += 1
                        s.timing_reason = s.timing_reason or f"vs reference: {why}"
                if perf.speedup_vs_baseline is not None:
                    s.baseline = perf.baseline_solution
                    key = (t.definition, t.workload.uuid, perf.baseline_solution)
                    # The baseline's own trace says how it was timed; none found: unknown.
                    why = unlike(method, methods.get(key))
                    if why is None:
                        base.append(perf.speedup_vs_baseline)
                    else:
                        s.excluded_baseline += 1
                        s.timing_reason = s.timing_reason or f"vs {s.baseline}: {why}"
                s.suspicious += flagged(t, best)
        s.gpu_reason = _gpus_differ(
            gpu_model(t)
            for t in ts
            if t.evaluation and t.evaluation.status is EvaluationStatus.PASSED
        )
        if s.gpu_reason is None:
            s.latency_ms, s.speedup_vs_reference = geomean(lat), geomean(ref)
            s.speedup_vs_baseline = geomean(base)
        out.append(s)
    return out


@dataclass
class Ranking:
    definition: str
    workload: str
    axes: dict[str, int]
    entries: list[tuple[str, float, bool]]  # (solution, latency_ms, flagged), fastest first
    failed: list[tuple[str, str]]  # (solution, status)
    # solution -> timing method, for the entries; `mixed_timing`: not all timed one way, so
    # the order is not a like-for-like ranking (renderers then show each entry's method).
    timing: dict[str, str | None] = field(default_factory=dict)
    # solution -> GPU model it was measured on; `mixed_gpus`: the order compares GPUs, not
    # solutions (renderers then show each entry's GPU).
    gpus: dict[str, str | None] = field(default_factory=dict)

    @property
    def mixed_timing(self) -> bool:
        methods = {self.timing.get(name) for name, _, _ in self.entries}
        return len(methods) > 1

    @property
    def mixed_gpus(self) -> bool:
        return _gpus_differ(self.gpus.get(name) for name, _, _ in self.entries) is not None


def rank(traces: Iterable[Trace]) -> list[Ranking]:
    """Per (definition, workload): passed solutions fastest first, then the others."""
    traces = latest(traces)
    best = _best_baseline(traces)
    groups: dict[tuple[str, str], list[Trace]] = defaultdict(list)
    for t in traces:
        groups[(t.definition, t.workload.uuid)].append(t)
    out = []
    for (definition, uuid), ts in sorted(groups.items()):
        ok = [t for t in ts if t.evaluation and t.evaluation.status is EvaluationStatus.PASSED]
        entries = sorted(
            (
                (t.solution or "", t.evaluation.performance.latency_ms, flagged(t, best))
                for t in ok
                if t.evaluation and t.evaluation.performance
            ),
            key=lambda e: e[1],
        )
        failed = [
            (t.solution or "", t.evaluation.status.value)  # type: ignore[union-attr]
            for t in ts
            if t not in ok
        ]
        timing = {t.solution or "": timing_method(t) for t in ok}
        gpus = {t.solution or "": gpu_model(t) for t in ok}
        axes = dict(ts[0].workload.axes)
        out.append(Ranking(definition, uuid, axes, entries, failed, timing, gpus))
    return out


@dataclass
class Comparison:
    definition: str
    a: str
    b: str
    workloads: int  # compared: both passed, timed by one method
    geomean: float | None  # latency_b / latency_a: > 1 means A is faster
    min: float | None
    max: float | None
    excluded: int = 0  # workloads where both passed but were timed differently (or unknown)
    reason: str | None = None  # the first exclusion's reason ("n/a: timing differs (...)")
    gpu: str | None = None  # the GPU model of the compared pairs (one per row)


def compare(traces: Iterable[Trace], a: str, b: str) -> tuple[list[Comparison], float | None]:
    """Speedup of solutions matching glob `a` over those matching `b`, per definition, on the
    workloads where both passed (the fastest match of each side) and were timed by one
    method on one GPU model; and the geomean over all those workloads. Pairs timed
    differently or on two GPU models are counted in `Comparison.excluded`, never divided; a
    definition with only such pairs, or with pairs from several GPU models, has a row with
    no speedup; the overall geomean is None when the rows come from several GPU models."""
    traces = latest(traces)
    lat: dict[tuple[str, str], dict[str, tuple[str, float, str | None, str | None]]] = defaultdict(
        dict
    )
    for t in traces:
        ev = t.evaluation
        if ev is None or ev.status is not EvaluationStatus.PASSED or ev.performance is None:
            continue
        for side, pattern in (("a", a), ("b", b)):
            if fnmatchcase(t.solution or "", pattern):
                prev = lat[(t.definition, t.workload.uuid)].get(side)
                if prev is None or ev.performance.latency_ms < prev[1]:
                    lat[(t.definition, t.workload.uuid)][side] = (
                        t.solution or "",
                        ev.performance.latency_ms,
                        timing_method(t),
                        gpu_model(t),
                    )
    per_def: dict[str, list[tuple[str, str, float, str | None]]] = defaultdict(list)
    refused: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for (definition, _), sides in sorted(lat.items()):
        if "a" in sides and "b" in sides and sides["a"][1] > 0:
            (name_a, ms_a, method_a, gpu_a), (name_b, ms_b, method_b, gpu_b) = (
                sides["a"],
                sides["b"],
            )
            why = _gpus_differ((gpu_a, gpu_b)) or unlike(method_a, method_b)
            if why is None:
                per_def[definition].append((name_a, name_b, ms_b / ms_a, gpu_a))
            else:
                refused[definition].append((name_a, name_b, why))
    for definition, items in list(per_def.items()):
        why = _gpus_differ(gpu for _, _, _, gpu in items)
        if why is not None:  # one definition's workloads measured on several GPU models
            refused[definition] = [(a_, b_, why) for a_, b_, _, _ in items] + refused[definition]
            del per_def[definition]
    rows, every = [], []
    for definition in sorted(set(per_def) | set(refused)):
        items, skipped = per_def.get(definition, []), refused.get(definition, [])
        ratios = [r for _, _, r, _ in items]
        every += ratios
        first = items[0][:2] if items else skipped[0][:2]
        rows.append(
            Comparison(
                definition,
                first[0],
                first[1],
                len(items),
                geomean(ratios),
                min(ratios, default=None),
                max(ratios, default=None),
                excluded=len(skipped),
                reason=skipped[0][2] if skipped else None,
                gpu=items[0][3] if items else None,
            )
        )
    if _gpus_differ(r.gpu for r in rows if r.workloads) is not None:
        return rows, None  # definitions measured on different GPU models: no overall mean
    return rows, geomean(every)

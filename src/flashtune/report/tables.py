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
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from flashtune.data.models import EvaluationStatus, Trace

__all__ = [
    "SUSPICIOUS_SPEEDUP",
    "TIMING_DIFFERS",
    "timing_method",
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


def timing_method(trace: Trace) -> str | None:
    """How the trace's latency was measured; None when it does not say."""
    perf = trace.evaluation.performance if trace.evaluation else None
    return getattr(perf, "timing_method", None) if perf is not None else None


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
    """One trace per (definition, solution, workload): the last one recorded (resumed and
    repeated runs append; the newest measurement wins)."""
    keep: dict[tuple[str, str, str], Trace] = {}
    for t in traces:
        if t.solution is None or t.evaluation is None:
            continue
        keep[(t.definition, t.solution, t.workload.uuid)] = t
    return list(keep.values())


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

    @property
    def passed(self) -> int:
        return self.statuses[EvaluationStatus.PASSED]

    @property
    def pass_rate(self) -> float:
        ran = self.total - self.statuses[EvaluationStatus.SKIPPED]
        return self.passed / ran if ran else 0.0


def _best_baseline(traces: Sequence[Trace]) -> dict[tuple[str, str], float]:
    """(definition, workload uuid) -> the fastest baseline latency recorded in the traces."""
    best: dict[tuple[str, str], float] = {}
    for t in traces:
        perf = t.evaluation.performance if t.evaluation else None
        if perf and perf.baseline_solution == t.solution:
            key = (t.definition, t.workload.uuid)
            best[key] = min(best.get(key, math.inf), perf.latency_ms)
    return best


def flagged(trace: Trace, best_baseline: dict[tuple[str, str], float]) -> bool:
    """Whether the trace is more than SUSPICIOUS_SPEEDUP x faster than the best baseline."""
    perf = trace.evaluation.performance if trace.evaluation else None
    base = best_baseline.get((trace.definition, trace.workload.uuid))
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

    @property
    def mixed_timing(self) -> bool:
        methods = {self.timing.get(name) for name, _, _ in self.entries}
        return len(methods) > 1


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
        out.append(Ranking(definition, uuid, dict(ts[0].workload.axes), entries, failed, timing))
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


def compare(traces: Iterable[Trace], a: str, b: str) -> tuple[list[Comparison], float | None]:
    """Speedup of solutions matching glob `a` over those matching `b`, per definition, on the
    workloads where both passed (the fastest match of each side) and were timed by one
    method; and the geomean over all those workloads. Pairs timed differently are counted
    in `Comparison.excluded`, never divided; a definition with only such pairs has a row
    with no speedup."""
    traces = latest(traces)
    lat: dict[tuple[str, str], dict[str, tuple[str, float, str | None]]] = defaultdict(dict)
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
                    )
    per_def: dict[str, list[tuple[str, str, float]]] = defaultdict(list)
    refused: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for (definition, _), sides in sorted(lat.items()):
        if "a" in sides and "b" in sides and sides["a"][1] > 0:
            (name_a, ms_a, method_a), (name_b, ms_b, method_b) = sides["a"], sides["b"]
            why = unlike(method_a, method_b)
            if why is None:
                per_def[definition].append((name_a, name_b, ms_b / ms_a))
            else:
                refused[definition].append((name_a, name_b, why))
    rows, every = [], []
    for definition in sorted(set(per_def) | set(refused)):
        items, skipped = per_def.get(definition, []), refused.get(definition, [])
        ratios = [r for _, _, r in items]
        every += ratios
        first = items[0] if items else skipped[0]
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
            )
        )
    return rows, geomean(every)

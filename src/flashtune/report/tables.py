"""Summaries of Traces: per-solution pass rates and speedups, per-workload rankings, A-vs-B
comparisons. Pure functions over Trace lists, rendered with rich by report/cli.py.

Speedups are geometric means over workloads (the right mean for ratios). A solution more
than `SUSPICIOUS_SPEEDUP` times faster than the best baseline is flagged: such results are
usually a measurement or correctness hole (caching, skipped work), not a real kernel.
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
    """Per (definition, solution): status counts, pass rate and geomean speedups."""
    traces = latest(traces)
    best = _best_baseline(traces)
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
                ref.append(perf.speedup_factor)
                if perf.speedup_vs_baseline is not None:
                    base.append(perf.speedup_vs_baseline)
                    s.baseline = perf.baseline_solution
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


def rank(traces: Iterable[Trace]) -> list[Ranking]:
    """Per (definition, workload): passed solutions fastest first, then the others."""
    traces = latest(traces)
    best = _best_baseline(traces)
    groups: dict[tuple[str, str], list[Trace]] = defaultdict(list)
    for t in traces:
        groups[(t.definition, t.workload.uuid)].append(t)
    out = []
    for (definition, uuid), ts in sorted(groups.items()):
        ok = [t for t in ts if t.evaluation.status is EvaluationStatus.PASSED]  # type: ignore[union-attr]
        entries = sorted(
            ((t.solution or "", t.evaluation.performance.latency_ms, flagged(t, best))  # type: ignore[union-attr]
             for t in ok if t.evaluation.performance),  # type: ignore[union-attr]
            key=lambda e: e[1],
        )  # fmt: skip
        failed = [
            (t.solution or "", t.evaluation.status.value)  # type: ignore[union-attr]
            for t in ts
            if t not in ok
        ]
        out.append(Ranking(definition, uuid, dict(ts[0].workload.axes), entries, failed))
    return out


@dataclass
class Comparison:
    definition: str
    a: str
    b: str
    workloads: int
    geomean: float | None  # latency_b / latency_a: > 1 means A is faster
    min: float | None
    max: float | None


def compare(traces: Iterable[Trace], a: str, b: str) -> tuple[list[Comparison], float | None]:
    """Speedup of solutions matching glob `a` over those matching `b`, per definition, on the
    workloads where both passed; and the geomean over all those workloads."""
    traces = latest(traces)
    lat: dict[tuple[str, str], dict[str, tuple[str, float]]] = defaultdict(dict)
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
                    )
    per_def: dict[str, list[tuple[str, str, float]]] = defaultdict(list)
    for (definition, _), sides in lat.items():
        if "a" in sides and "b" in sides and sides["a"][1] > 0:
            per_def[definition].append(
                (sides["a"][0], sides["b"][0], sides["b"][1] / sides["a"][1])
            )
    rows, every = [], []
    for definition, items in sorted(per_def.items()):
        ratios = [r for _, _, r in items]
        every += ratios
        rows.append(
            Comparison(
                definition,
                items[0][0],
                items[0][1],
                len(items),
                geomean(ratios),
                min(ratios),
                max(ratios),
            )  # fmt: skip
        )
    return rows, geomean(every)

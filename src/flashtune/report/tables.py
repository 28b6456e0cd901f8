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

Spread: a trace records the 95% interval of each median it measured (`Performance.
latency_ci_ms`, `reference_latency_ci_ms`). A latency whose interval reaches further than
`NOISY_SPREAD` from it is too noisy to rank; a speedup is claimed only where the two
intervals say so: its own interval (the ratio of the intervals' ends) must lie on one side
of 1 and span less than `UNCERTAIN_FACTOR`; otherwise it is still shown, flagged
(`speedup_flag`), never hidden and never claimed. Rankings tie solutions whose intervals
overlap. Traces without intervals (older runs) are not flagged.

A triple that was checked correct but not timed (a Triton solution in Triton's interpreter
on a CPU: `flashtune.data.correct_not_timed`) is counted apart from the skipped ones.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fnmatch import fnmatchcase

from flashtune.data.models import EvaluationStatus, Trace, correct_not_timed
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
    "NOISY_SPREAD",
    "UNCERTAIN_FACTOR",
    "Interval",
    "latency_interval",
    "reference_interval",
    "spread_of",
    "ratio_interval",
    "speedup_flag",
    "overlap",
]

SUSPICIOUS_SPEEDUP = 10.0
# A latency whose 95% interval reaches further than this from it is too noisy to rank.
NOISY_SPREAD = 0.10
# A speedup whose own interval spans more than this factor is flagged as uncertain (the
# "789x" of a CPU reference timed at 160 ms once, 0.2 ms the next time).
UNCERTAIN_FACTOR = 2.0

Interval = tuple[float, float]
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


def _interval(value: object) -> Interval | None:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        low, high = value
        if isinstance(low, (int, float)) and isinstance(high, (int, float)) and 0 < low <= high:
            return (float(low), float(high))
    return None


def latency_interval(trace: Trace) -> Interval | None:
    """The 95% interval of the trace's latency (None: not recorded, or not positive)."""
    perf = trace.evaluation.performance if trace.evaluation else None
    return _interval(getattr(perf, "latency_ci_ms", None)) if perf is not None else None


def reference_interval(trace: Trace) -> Interval | None:
    perf = trace.evaluation.performance if trace.evaluation else None
    return _interval(getattr(perf, "reference_latency_ci_ms", None)) if perf else None


def spread_of(trace: Trace) -> float | None:
    """How far the latency's interval reaches from it, relative (0.05: within 5%)."""
    perf = trace.evaluation.performance if trace.evaluation else None
    interval = latency_interval(trace)
    if perf is None or interval is None or perf.latency_ms <= 0:
        return None
    ms = perf.latency_ms
    return max(ms - interval[0], interval[1] - ms) / ms


def ratio_interval(slower: Interval | None, faster: Interval | None) -> Interval | None:
    """The interval of slower / faster from the intervals of both (their far ends)."""
    if slower is None or faster is None:
        return None
    return (slower[0] / faster[1], slower[1] / faster[0])


def overlap(a: Interval | None, b: Interval | None) -> bool:
    """Whether two latencies' intervals overlap (False when either is unknown)."""
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def speedup_flag(interval: Interval | None) -> str | None:
    """Why a speedup with this interval is not claimed: "within noise" (it reaches both
    sides of 1: the two latencies' intervals overlap), "uncertain" (it spans more than
    UNCERTAIN_FACTOR); None: claimed, or no interval to judge by."""
    if interval is None:
        return None
    if interval[0] <= 1.0 <= interval[1]:
        return "within noise"
    if interval[1] > UNCERTAIN_FACTOR * interval[0]:
        return "uncertain"
    return None


def _speedup_note(what: str, value: float, interval: Interval, flag: str) -> str:
    return f"{what} {value:.3g}x {flag} (95% interval {interval[0]:.3g}x-{interval[1]:.3g}x)"


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
    # The widest relative spread of the passed latencies (None: no interval recorded); the
    # speedups flagged by their intervals (`speedup_flag`), counted, and the first's note.
    spread: float | None = None
    noisy_reference: int = 0
    noisy_baseline: int = 0
    noise_reason: str | None = None
    # SKIPPED triples that were checked correct, not timed (counted in statuses too).
    correct_untimed: int = 0

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
    intervals = {(t.definition, t.workload.uuid, t.solution): latency_interval(t) for t in traces}
    groups: dict[tuple[str, str], list[Trace]] = defaultdict(list)
    for t in traces:
        groups[(t.definition, t.solution or "")].append(t)
    out = []
    for (definition, solution), ts in sorted(groups.items()):
        s = SolutionSummary(definition, solution, total=len(ts))
        lat, ref, base = [], [], []
        spreads: list[float] = []
        for t in ts:
            ev = t.evaluation
            assert ev is not None
            s.statuses[ev.status] += 1
            s.correct_untimed += correct_not_timed(ev)
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
                        span = ratio_interval(reference_interval(t), latency_interval(t))
                        flag = speedup_flag(span)
                        if flag is not None and span is not None:
                            s.noisy_reference += 1
                            s.noise_reason = s.noise_reason or _speedup_note(
                                "vs ref", perf.speedup_factor, span, flag
                            )
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
                        span = ratio_interval(intervals.get(key), latency_interval(t))
                        flag = speedup_flag(span) if perf.baseline_solution != solution else None
                        if flag is not None and span is not None:
                            s.noisy_baseline += 1
                            s.noise_reason = s.noise_reason or _speedup_note(
                                f"vs {s.baseline}", perf.speedup_vs_baseline, span, flag
                            )
                    else:
                        s.excluded_baseline += 1
                        s.timing_reason = s.timing_reason or f"vs {s.baseline}: {why}"
                s.suspicious += flagged(t, best)
                spread = spread_of(t)
                if spread is not None:
                    spreads.append(spread)
        s.spread = max(spreads, default=None)
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
    # solution -> its latency's 95% interval; solution -> relative spread (entries only).
    intervals: dict[str, Interval | None] = field(default_factory=dict)
    spreads: dict[str, float | None] = field(default_factory=dict)
    # the `failed` solutions that were checked correct but not timed
    untimed: set[str] = field(default_factory=set)

    def tied(self, i: int) -> bool:
        """Whether entries i and i + 1 cannot be ordered: their intervals overlap."""
        a, b = self.entries[i][0], self.entries[i + 1][0]
        return overlap(self.intervals.get(a), self.intervals.get(b))

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
        ranking = Ranking(definition, uuid, axes, entries, failed, timing, gpus)
        ranking.intervals = {t.solution or "": latency_interval(t) for t in ok}
        ranking.spreads = {t.solution or "": spread_of(t) for t in ok}
        ranking.untimed = {t.solution or "" for t in ts if correct_not_timed(t.evaluation)}
        out.append(ranking)
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
    # compared pairs whose latencies' intervals overlap: in the geomean, not a speedup
    within_noise: int = 0


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
    spans: dict[tuple[str, str, str], Interval | None] = {}
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
                    spans[(t.definition, t.workload.uuid, side)] = latency_interval(t)
    per_def: dict[str, list[tuple[str, str, float, str | None]]] = defaultdict(list)
    refused: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    noise: Counter = Counter()
    for (definition, uuid), sides in sorted(lat.items()):
        if "a" in sides and "b" in sides and sides["a"][1] > 0:
            (name_a, ms_a, method_a, gpu_a), (name_b, ms_b, method_b, gpu_b) = (
                sides["a"],
                sides["b"],
            )
            why = _gpus_differ((gpu_a, gpu_b)) or unlike(method_a, method_b)
            if why is None:
                per_def[definition].append((name_a, name_b, ms_b / ms_a, gpu_a))
                a_span, b_span = (
                    spans.get((definition, uuid, "a")),
                    spans.get((definition, uuid, "b")),
                )
                noise[definition] += overlap(a_span, b_span)
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
                within_noise=noise[definition] if items else 0,
            )
        )
    if _gpus_differ(r.gpu for r in rows if r.workloads) is not None:
        return rows, None  # definitions measured on different GPU models: no overall mean
    return rows, geomean(every)

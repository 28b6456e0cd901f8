"""fast_p, as KernelBench and FlashInfer-Bench's leaderboard report it: for a threshold p, the
share of workloads where a solution is correct *and* at least p times faster than the
baseline. fast_0 is the pass rate; fast_1 the share where it beats the baseline.

Here per solution *family* (the part of a solution's name before '@': `flashtune@rmsnorm_h4096`
belongs to `flashtune`), over every (definition, workload) the family was evaluated on. A
workload where the family was SKIPPED (could not run on this machine) is not counted; one where
the speedup cannot be taken like for like (timed differently from the baseline, its baseline
trace measured on another GPU model, or no baseline trace) counts as correct but not faster,
and is counted in `unjudged`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from flashtune.data.models import EvaluationStatus, Trace
from flashtune.report.tables import gpu_model, latest, timing_method, unlike

__all__ = ["THRESHOLDS", "FastP", "family", "fast_p"]

# p from 0 to 4 in steps of 0.05: fine enough for a staircase that reads like a curve.
THRESHOLDS: tuple[float, ...] = tuple(round(i * 0.05, 2) for i in range(81))


def family(solution: str) -> str:
    """`flashtune@rmsnorm_h4096` -> `flashtune`; a name without '@' is its own family."""
    return solution.split("@", 1)[0]


@dataclass
class FastP:
    family: str
    workloads: int = 0  # (definition, workload) pairs evaluated (not skipped)
    correct: int = 0
    unjudged: int = 0  # correct, but no like-for-like speedup over the baseline
    skipped: int = 0
    speedups: list[float] = field(default_factory=list)  # correct and judged, one per workload

    def share(self, p: float) -> float:
        """fast_p: correct and >= p times the baseline's speed, over `workloads`."""
        if not self.workloads:
            return 0.0
        if p <= 0:
            return self.correct / self.workloads
        return sum(s >= p for s in self.speedups) / self.workloads

    def curve(self, thresholds: Sequence[float] = THRESHOLDS) -> list[tuple[float, float]]:
        return [(p, self.share(p)) for p in thresholds]


def fast_p(traces: Iterable[Trace]) -> list[FastP]:
    """fast_p per solution family, sorted by name. Where a family has several solutions for
    one workload, the best of them counts (the family's best effort)."""
    traces = latest(traces)
    methods = {(t.definition, t.workload.uuid, t.solution): timing_method(t) for t in traces}
    gpus = {(t.definition, t.workload.uuid, t.solution): gpu_model(t) for t in traces}
    # (family, definition, workload) -> (status, speedup or None)
    best: dict[tuple[str, str, str], tuple[EvaluationStatus, float | None]] = {}
    for t in traces:
        ev = t.evaluation
        if ev is None or t.solution is None:
            continue
        speedup = None
        perf = ev.performance
        if ev.status is EvaluationStatus.PASSED and perf is not None:
            if perf.speedup_vs_baseline is not None:
                key = (t.definition, t.workload.uuid, perf.baseline_solution)
                same_gpu = gpus.get(key) == gpu_model(t)
                if same_gpu and unlike(timing_method(t), methods.get(key)) is None:
                    speedup = perf.speedup_vs_baseline
        slot = (family(t.solution), t.definition, t.workload.uuid)
        if slot not in best or _better((ev.status, speedup), best[slot]):
            best[slot] = (ev.status, speedup)
    out: dict[str, FastP] = defaultdict(lambda: FastP(""))
    for (fam, _, _), (status, speedup) in best.items():
        acc = out[fam]
        acc.family = fam
        if status is EvaluationStatus.SKIPPED:
            acc.skipped += 1
            continue
        acc.workloads += 1
        if status is EvaluationStatus.PASSED:
            acc.correct += 1
            if speedup is None:
                acc.unjudged += 1
            else:
                acc.speedups.append(speedup)
    return [out[name] for name in sorted(out)]


def _rank(entry: tuple[EvaluationStatus, float | None]) -> tuple[int, float]:
    status, speedup = entry
    if status is EvaluationStatus.PASSED:
        return (3, speedup if speedup is not None else 0.0)
    return (1, 0.0) if status is not EvaluationStatus.SKIPPED else (0, 0.0)


def _better(
    new: tuple[EvaluationStatus, float | None], old: tuple[EvaluationStatus, float | None]
) -> bool:
    return _rank(new) > _rank(old)

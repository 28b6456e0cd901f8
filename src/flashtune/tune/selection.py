"""Which tactic the tuner keeps: every tactic is timed once, then the few fastest (and the
default tactic) are timed again in turns and the pick is the fastest by those medians alone.
The least of many single measurements is biased low (one lucky measurement wins), and a pick
made by noise would stay in the cache for every later run. Also the tuner's records of its
choices: the tactics it excluded (TacticFailure) and its counters (TuneStats)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flashtune.tune.runner import DEFAULT_TACTIC, Profile, Tactic

__all__ = ["Decision", "GuardResult", "TacticFailure", "TuneStats", "confirm_pick", "guard_pick"]

Result = tuple[int, Tactic, float]  # (runner index, tactic, median ms)


def confirm_pick(
    results: Sequence[Result],
    time_once: Callable[[int, Tactic], float | None],
    top: int,
    rounds: int,
) -> tuple[Result | None, dict[tuple[int, Tactic], float]]:
    """(the pick, the re-measured median of each finalist that kept running).

    results: every tactic's first measurement. time_once(index, tactic): one more median, or
    None when the tactic failed (it is dropped). The finalists are the `top` fastest and the
    default tactic (runner 0's); with fewer than two, or no rounds, the first measurements
    decide. Otherwise the finalists are timed `rounds` times in turns (a drift falls on all
    of them) and the first measurements are left out of the choice."""
    ranked = sorted(results, key=lambda r: r[2])
    finalists = ranked[: max(top, 1)]
    default = next((r for r in results if r[:2] == (0, DEFAULT_TACTIC)), None)
    if default is not None and default not in finalists:
        finalists.append(default)
    if len(finalists) < 2 or rounds <= 0:
        return (ranked[0] if ranked else None), {}
    again: dict[tuple[int, Tactic], list[float]] = {(i, t): [] for i, t, _ in finalists}
    for _ in range(rounds):
        for index, tactic, _ in finalists:
            if (index, tactic) not in again:
                continue
            median = time_once(index, tactic)
            if median is None:
                del again[(index, tactic)]
            else:
                again[(index, tactic)].append(median)
    medians = {key: statistics.median(values) for key, values in again.items()}
    if not medians:
        return None, {}
    (index, tactic), median = min(medians.items(), key=lambda item: item[1])
    return (index, tactic, median), medians


Candidate = tuple[int, Tactic]  # (runner index, tactic)


@dataclass(frozen=True)
class GuardResult:
    """What the never-slower-than-default guard decided.

    kept: the candidate to use. reference: the default it was compared with (the fastest
    default, or runner 0's where the others do not beat it beyond the noise). medians: each
    contender's median over the guard rounds (ms). noise_ms: the half-range of the pick's
    per-round time ratios to the reference, in ms of the reference: how much the comparison
    itself moved between rounds. threshold_ms: the margin the pick had to beat (the larger
    of the noise and the relative margin). reason: one line for the decision record."""

    kept: Candidate
    reference: Candidate
    medians: dict[Candidate, float]
    noise_ms: float
    threshold_ms: float
    reason: str


def _paired(challenger: list[float], reference: list[float]) -> tuple[float, float, bool]:
    """(median relative gain, noise, won every round) of `challenger` over `reference`,
    from their per-round times. Paired by round and taken as ratios: the rounds run in
    turns, so a load spike or a clock change on a shared machine scales both times of a
    round alike, and the ratio cancels it where a difference of medians would not."""
    ratios = [c / r for c, r in zip(challenger, reference, strict=False) if r > 0]
    if not ratios:
        return 0.0, math.inf, False
    gain = 1.0 - statistics.median(ratios)
    noise = (max(ratios) - min(ratios)) / 2
    return gain, noise, max(ratios) < 1.0


def guard_pick(
    pick: Candidate,
    defaults: Sequence[Candidate],
    time_once: Callable[[int, Tactic], float | None],
    rounds: int,
    margin: float,
) -> GuardResult | None:
    """Keep `pick` only if it beats the defaults beyond the noise (issue 38).

    defaults: runner 0's tactic -1 first, then other defaults that always compete (library
    runners' -1). Every contender is timed `rounds` times in turns, by `time_once` on fresh
    inputs. A challenger beats a reference when it is faster in every round and its median
    per-round speed-up exceeds both the half-range of those speed-ups (the noise) and
    `margin`. The reference is runner 0's default unless another default beats it. None
    when no contender ran."""
    contenders: list[Candidate] = list(dict.fromkeys([pick, *defaults]))
    samples: dict[Candidate, list[float]] = {c: [] for c in contenders}
    for _ in range(max(rounds, 1)):
        for c in contenders:
            if c not in samples:
                continue
            t = time_once(*c)
            if t is None:
                del samples[c]  # failed now: out of the contest
            else:
                samples[c].append(t)
    if not samples:
        return None
    medians = {c: statistics.median(v) for c, v in samples.items()}

    def beats(a: Candidate, b: Candidate) -> tuple[bool, float, float]:
        gain, noise, every_round = _paired(samples[a], samples[b])
        return every_round and gain > max(noise, margin), gain, noise

    alive_defaults = [d for d in defaults if d in samples]
    if not alive_defaults:  # every default failed now: the pick is all there is
        return GuardResult(pick, pick, medians, 0.0, 0.0, "no default ran in the guard")
    reference = alive_defaults[0]
    for d in alive_defaults[1:]:
        if beats(d, reference)[0]:
            reference = d
    ref_ms = medians[reference]
    if pick == reference:
        return GuardResult(
            pick, reference, medians, 0.0, margin * ref_ms, "the pick is the default"
        )
    if pick not in samples:
        return GuardResult(
            reference, reference, medians, 0.0, margin * ref_ms, "the pick failed in the guard"
        )
    won, gain, noise = beats(pick, reference)
    noise_ms, need_ms = noise * ref_ms, max(noise, margin) * ref_ms
    detail = f"(noise {noise:.1%}, margin {margin:.1%}, {len(samples[pick])} rounds)"
    if won:
        reason = f"beats the default by {gain:.1%} > {max(noise, margin):.1%} {detail}"
        return GuardResult(pick, reference, medians, noise_ms, need_ms, reason)
    reason = (
        f"default kept: the pick's gain {gain:.1%} is not beyond {max(noise, margin):.1%} in "
        f"every round {detail}"
    )
    return GuardResult(reference, reference, medians, noise_ms, need_ms, reason)


@dataclass(frozen=True)
class Decision:
    """Why a bucket runs what it runs, kept beside the cache (`<cache>.decisions.json`).

    kind: "tuned" (guard passed), "default-kept" (the pick did not beat the default beyond
    the noise), "revalidated" (a cached pick re-timed after the environment changed),
    "budget" (the time budget ended the search; the best so far was guarded)."""

    op_name: str
    profile: Profile
    runner: str
    tactic: Tactic
    kind: str
    reason: str
    default_ms: float | None = None
    pick_ms: float | None = None
    noise_ms: float | None = None
    candidates_timed: int = 0
    candidates_pruned: int = 0


@dataclass(frozen=True)
class TacticFailure:
    """A candidate excluded while profiling, and why."""

    op_name: str
    runner: str
    tactic: Tactic
    profile: Profile
    reason: str


@dataclass
class TuneStats:
    """Counters for the summary logged when an `autotune` context exits."""

    shapes_tuned: int = 0
    tactics_timed: int = 0
    tactics_failed: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    tactics_pruned: int = 0  # dropped by the cost model, never compiled or timed
    stopped_early: int = 0  # buckets whose search stopped (patience or budget)
    defaults_kept: int = 0  # buckets where the guard kept the default over the pick

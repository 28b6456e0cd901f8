"""Which tactic the tuner keeps: every tactic is timed once, then the few fastest (and the
default tactic) are timed again in turns and the pick is the fastest by those medians alone.
The least of many single measurements is biased low (one lucky measurement wins), and a pick
made by noise would stay in the cache for every later run. Also the tuner's records of its
choices: the tactics it excluded (TacticFailure) and its counters (TuneStats)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flashtune.tune.runner import DEFAULT_TACTIC, Profile, Tactic

__all__ = ["TacticFailure", "TuneStats", "confirm_pick"]

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

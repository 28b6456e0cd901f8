"""Ranks tune together (issue 38): two CPU processes in a gloo group, a stand-in runner
whose fastest tactic differs by rank, and ranks that see different shapes. Each bucket is
timed on one rank only, both ranks end with the same picks, nothing deadlocks, and a warm
restart profiles nothing (serving takes no collective at all)."""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tune_helpers as H  # noqa: E402

from flashtune.tune.ranks import assign_buckets  # noqa: E402

# Rank 0 sees M=3, 8, 100 (buckets 4, 8, 128); rank 1 sees M=8 and 20 (buckets 8, 32).
ROWS = [[3, 8, 100], [8, 20]]
CANDIDATES = 4  # tactics -1, 0, 1, 2; the helpers' CONFIG times each once


def bucket(m: int) -> int:
    return 1 << (m - 1).bit_length()


def run_ranks(tmp_path: Path, phase: str, rows: Any = ROWS) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    init = tmp_path / f"init-{phase}"
    procs = [
        ctx.Process(target=H.rank_worker, args=(r, 2, str(init), str(tmp_path), phase, rows))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
    assert not hung, f"{phase}: a rank hung (deadlock)"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return [json.loads((tmp_path / f"{phase}-rank{r}.json").read_text()) for r in range(2)]


def test_assignment_is_deterministic_and_only_to_ranks_that_saw_the_bucket() -> None:
    offers = [[("op", "a"), ("op", "b"), ("op", "c")], [("op", "b"), ("op", "d")], []]
    got = assign_buckets(offers)
    assert got == assign_buckets([list(reversed(o)) for o in offers])
    assert got[("op", "a")] == 0 and got[("op", "c")] == 0 and got[("op", "d")] == 1
    assert got[("op", "b")] in (0, 1)
    assert assign_buckets([[], []]) == {}


@pytest.mark.slow
def test_two_ranks_split_the_buckets_agree_on_the_picks_and_restart_warm(
    tmp_path: Path,
) -> None:
    tuned = run_ranks(tmp_path, "tune")
    # Inside the block a new bucket runs the default; the tuning happens at the block's exit.
    assert tuned[0]["inside"] == [-1, -1, -1] and tuned[1]["inside"] == [-1, -1]
    # Every bucket was timed on exactly one rank, each candidate once.
    timed = Counter(bucket(m) for r in tuned for _, m in r["timed"])
    assert timed == {b: CANDIDATES for b in (4, 8, 32, 128)}
    for b in (4, 8, 32, 128):
        owners = {i for i, r in enumerate(tuned) if any(bucket(m) == b for _, m in r["timed"])}
        assert len(owners) == 1, (b, owners)
    # Same picks on both ranks, for every shape either saw, and each is what the rank that
    # timed it found fastest (rank 0: tactic 1, rank 1: tactic 2).
    assert tuned[0]["picks"] == tuned[1]["picks"]
    for m, pick in tuned[0]["picks"].items():
        owner = next(
            i
            for i, r in enumerate(tuned)
            if any(bucket(v) == bucket(int(m)) for _, v in r["timed"])
        )
        assert pick == (1 if owner == 0 else 2)
    assert [r["gathers"] for r in tuned] == [2, 2]  # the offers, then the picks

    # Warm restart, tuning on: nothing profiled, one gather of two empty lists, same picks.
    warm = run_ranks(tmp_path, "warm")
    assert [r["timed"] for r in warm] == [[], []]
    assert [r["gathers"] for r in warm] == [1, 1]
    assert warm[0]["picks"] == warm[1]["picks"] == tuned[0]["picks"]
    assert warm[0]["inside"] == [tuned[0]["picks"][str(m)] for m in ROWS[0]]
    # Serving: no collective at all.
    served = run_ranks(tmp_path, "serve")
    assert [r["gathers"] for r in served] == [0, 0] and [r["timed"] for r in served] == [[], []]
    assert served[0]["picks"] == tuned[0]["picks"]


# Not slow-marked: the one two-process run in the default suite (about 10 s).
def test_a_rank_that_sees_no_new_shape_still_joins_an_explicit_sync(tmp_path: Path) -> None:
    got = run_ranks(tmp_path, "midsync", rows=[[5, 6], []])
    # Rank 0: the default before sync_ranks(), rank 0's pick (tactic 1) right after it.
    assert got[0]["inside"] == [-1, -1, 1, 1]
    assert got[0]["picks"] == got[1]["picks"] == {"5": 1, "6": 1}
    # Rank 1 saw nothing yet joined: two gathers at sync_ranks(), one (all empty) at exit.
    assert got[1]["timed"] == [] and [r["gathers"] for r in got] == [3, 3]

"""Ranks tune together: with torch.distributed initialised, the buckets to tune are split
across the ranks, each bucket is timed once (on one rank), and the picks are exchanged, so
every rank runs the same tactic.

Why at a sync point and not in choose_one: ranks see different shapes (a rank's last batch
is shorter, MoE routes differently), so a collective taken on a cache miss would pair one
rank's miss with another rank's unrelated collective, or with nothing: the hang of vLLM
#57423. Instead, inside `autotune(True)` under torch.distributed a miss is only *recorded*
(the call runs the default tactic, not memoized), and the ranks tune at an explicit point
every rank reaches: `sync_ranks()`, or the exit of the `autotune()` block. There each rank
offers its list of new buckets (an empty list is fine), one `all_gather_object` makes the
union known to all, every bucket is assigned to one of the ranks that saw it (it needs the
op's runners and inputs), and a second `all_gather_object` shares the picks, which every rank
puts in its in-memory cache.

Warm starts: choose_one never takes a collective; `autotune(False, ...)` takes none; and a
sync point where every rank's list is empty takes exactly the one (small) gather and
profiles nothing. Every rank must reach the same sync points (exit the same `autotune()`
blocks), which is the one rule of using it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flashtune.tune.cache_file import CacheKey, Entry
from flashtune.tune.runner import Profile, TunableRunner, TuningConfig
from flashtune.tune.selection import Decision

__all__ = ["PendingBucket", "RankGroup", "distributed_world", "assign_buckets"]

logger = logging.getLogger("flashtune.tune")

BucketId = tuple[str, str]  # (op_name, repr(profile)): comparable and equal across ranks


@dataclass
class PendingBucket:
    """A bucket seen on this rank and not covered by any source: tuned at the sync point.
    Keeps the call's inputs (for their dtypes, devices and valid index values) until then."""

    op_name: str
    runners: Sequence[TunableRunner]
    config: TuningConfig
    inputs: Sequence[Any]
    profile: Profile

    @property
    def bucket_id(self) -> BucketId:
        return (self.op_name, repr(self.profile))


def distributed_world() -> tuple[int, int] | None:
    """(rank, world size) when torch.distributed is initialised with more than one rank."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    return (dist.get_rank(), world) if world > 1 else None


def assign_buckets(offers: Sequence[Sequence[BucketId]]) -> dict[BucketId, int]:
    """Which rank tunes each bucket: `offers[r]` is rank r's list. Deterministic (every rank
    computes the same answer from the gathered lists): buckets in sorted order, each dealt
    round-robin among the ranks that saw it, starting where the last deal left off, so the
    work spreads evenly when all ranks see all shapes."""
    seen_by: dict[BucketId, list[int]] = {}
    for rank, offer in enumerate(offers):
        for bucket in offer:
            seen_by.setdefault(tuple(bucket), []).append(rank)  # type: ignore[arg-type]
    out: dict[BucketId, int] = {}
    load = [0] * len(offers)
    for bucket in sorted(seen_by):
        owners = seen_by[bucket]
        rank = min(owners, key=lambda r: (load[r], r))  # the least loaded owner
        load[rank] += 1
        out[bucket] = rank
    return out


class RankGroup:
    """The buckets this rank recorded since the last sync point, and the sync itself."""

    def __init__(self, group: Any = None) -> None:
        self.group = group  # a torch.distributed process group; None: the default group
        self.pending: dict[BucketId, PendingBucket] = {}
        self.syncs = 0  # sync points taken (each is one or two all_gather_object calls)

    def record(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        config: TuningConfig,
        inputs: Sequence[Any],
        profile: Profile,
    ) -> None:
        bucket = PendingBucket(op_name, runners, config, inputs, profile)
        self.pending.setdefault(bucket.bucket_id, bucket)

    def sync(self, tune: Any) -> tuple[dict[CacheKey, Entry], list[Decision], int]:
        """Tune the pending buckets across the ranks. `tune(bucket)` profiles one bucket on
        this rank and returns ((op, runner, profile) -> entry, the Decision) or None.

        Returns (every rank's picks, every rank's decisions, how many buckets this rank
        tuned). Takes one all_gather_object, and a second only when some rank had a bucket."""
        import torch.distributed as dist

        self.syncs += 1
        offer = sorted(self.pending)
        offers: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(offers, offer, group=self.group)
        if not any(offers):  # warm: every rank knew all its shapes
            self.pending.clear()
            return {}, [], 0
        rank = dist.get_rank(self.group)
        mine = [b for b, r in assign_buckets(offers).items() if r == rank]
        picks: dict[CacheKey, Entry] = {}
        decisions: list[Decision] = []
        for bucket_id in mine:
            tuned = tune(self.pending[bucket_id])
            if tuned is not None:
                entries, decision = tuned
                picks.update(entries)
                if decision is not None:
                    decisions.append(decision)
        self.pending.clear()
        shared: list[Any] = [None] * len(offers)
        dist.all_gather_object(shared, (picks, decisions), group=self.group)
        all_picks: dict[CacheKey, Entry] = {}
        all_decisions: list[Decision] = []
        for their_picks, their_decisions in shared:
            all_picks.update(their_picks)
            all_decisions.extend(their_decisions)
        logger.info(
            "autotune: rank %d tuned %d of %d new buckets; %d picks shared",
            rank,
            len(mine),
            len(assign_buckets(offers)),
            len(all_picks),
        )
        return all_picks, all_decisions, len(mine)

"""The AutoTuner: picks (runner, tactic) per shape bucket, profiles on first sight when
tuning, and keeps the winners in memory and in JSON config files. A facade over three parts:

- tune/lookup.py: choose_one, its memo and the search through the sources below;
- tune/profiling.py: timing a bucket's candidates and picking the winner;
- tune/store.py: the configs read from files, and saving tuned results into one.

Lookup priority for a shape's bucket (first match wins):
1. the in-memory profiling cache (live tuning in this process);
2. user-loaded file configs (`load_configs`, `autotune(cache=...)`), also while tuning, so a
   shape tuned in a file is never profiled again;
3. configs bundled under flashtune/tune/configs/ whose metadata matches this machine (on
   unless FLASHTUNE_AUTOTUNE_LOAD_BUNDLED=0; never while tuning);
4. the fallback: the first runner's default tactic -1.

The answer for a runtime shape is memoized, so a repeated call costs a few dict lookups.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from flashtune.tune.cache_file import CacheKey, Entry, FileRead
from flashtune.tune.lookup import Lookup
from flashtune.tune.notices import AutotuneWarning, Notices
from flashtune.tune.profiling import Profiler
from flashtune.tune.ranks import PendingBucket, RankGroup, distributed_world
from flashtune.tune.runner import Profile, Tactic, TunableRunner, TuningConfig
from flashtune.tune.selection import Decision, TacticFailure, TuneStats
from flashtune.tune.store import ConfigStore

__all__ = [
    "AutoTuner",
    "AutotuneWarning",
    "Decision",
    "TacticFailure",
    "TuneStats",
    "autotune",
    "sync_ranks",
]

logger = logging.getLogger("flashtune.tune")


class AutoTuner:
    """The process-wide tuner; get it with `AutoTuner.get()`.

    One re-entrant lock guards search, choose_one's slow path, save, load, clear and the
    tune-mode switch; profiling therefore runs one shape at a time within a process, which is
    also what a fair measurement needs. The memoized fast path reads a dict without the lock
    (a dict read is atomic in CPython; writes happen under the lock).
    """

    _instance: ClassVar[AutoTuner | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.notices = Notices()
        self.store = ConfigStore(self.notices)
        self.profiler = Profiler(self.notices)
        self.lookup = Lookup(self.lock, self.store, self.profiler, self.notices)
        # Set inside autotune(True) under torch.distributed: buckets wait for sync_ranks().
        self.rank_group: RankGroup | None = None

    @classmethod
    def get(cls) -> AutoTuner:
        inst = cls._instance
        if inst is None:
            with cls._instance_lock:
                if cls._instance is None:
                    cls._instance = cls()
                inst = cls._instance
        return inst

    def choose_one(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        tuning_config: TuningConfig,
        inputs: Sequence[Any],
    ) -> tuple[TunableRunner, Tactic]:
        """The (runner, tactic) to run `inputs` with: see the module docstring for the order
        of sources. In tune mode, a bucket no source covers is profiled first."""
        return self.lookup.choose_one(op_name, runners, tuning_config, inputs)

    profile_of = staticmethod(Lookup.profile_of)

    # ------------------------------------------------- the parts' state, by its old names
    @property
    def tune_mode(self) -> bool:
        return self.lookup.tune_mode

    @tune_mode.setter
    def tune_mode(self, value: bool) -> None:
        self.lookup.tune_mode = value

    @property
    def profiling_cache(self) -> dict[CacheKey, Entry]:
        """Results profiled in this process: (op, runner, profile) -> (runner, tactic)."""
        return self.lookup.profiling_cache

    @property
    def file_configs(self) -> dict[CacheKey, Entry]:
        """Entries of the user-loaded config files."""
        return self.store.file_configs

    @property
    def failures(self) -> list[TacticFailure]:
        """The candidates profiling excluded, and why."""
        return self.profiler.failures

    @property
    def stats(self) -> TuneStats:
        return self.profiler.stats

    @property
    def timings(self) -> dict[tuple[str, Profile], dict[tuple[str, Tactic], float]]:
        """(op_name, profile) -> {(runner_name, tactic): median ms}, as profiled."""
        return self.profiler.timings

    @property
    def show_progress(self) -> bool:
        return self.profiler.show_progress

    @show_progress.setter
    def show_progress(self, value: bool) -> None:
        self.profiler.show_progress = value

    @property
    def file_lock_timeout_s(self) -> float:
        return self.store.file_lock_timeout_s

    @file_lock_timeout_s.setter
    def file_lock_timeout_s(self, value: float) -> None:
        self.store.file_lock_timeout_s = value

    # ----------------------------------------------------------------- state
    def set_tune_mode(self, tune_mode: bool) -> None:
        with self.lock:
            self.lookup.tune_mode = bool(tune_mode)
            # Memoized answers depend on the mode (fallbacks are only final when not tuning).
            self.lookup.forget()

    def clear(self) -> None:
        """Forget everything: profiling results, loaded configs, failures, statistics."""
        with self.lock:
            self.lookup.clear()
            self.store.clear()
            self.profiler.clear()
            self.notices.clear()

    @property
    def decisions(self) -> dict[tuple[str, Profile], Decision]:
        """(op_name, profile) -> why the bucket runs what it runs (tuned, default kept, ...)."""
        return self.profiler.decisions

    def sync_ranks(self) -> int:
        """Tune the buckets every rank recorded since the last sync point, split across the
        ranks, and share the picks (tune/ranks.py). Every rank must call it (the exit of a
        distributed `autotune(True)` block does). Returns how many buckets this rank tuned;
        0 and no collective outside such a block."""
        with self.lock:
            group = self.rank_group
            if group is None:
                return 0

            def tune(bucket: PendingBucket) -> tuple[dict[CacheKey, Entry], Decision | None] | None:
                won = self.lookup.tune_bucket(
                    bucket.op_name, bucket.runners, bucket.config, bucket.inputs, bucket.profile
                )
                if won is None:
                    return None
                name = bucket.runners[won[0]].name
                key = (bucket.op_name, name, bucket.profile)
                return {key: (name, won[1])}, self.decisions.get((bucket.op_name, bucket.profile))

            picks, decisions, tuned = group.sync(tune)
            self.lookup.profiling_cache.update(picks)
            for d in decisions:
                self.decisions[(d.op_name, d.profile)] = d
            self.lookup.forget()
            return tuned

    def load_configs(
        self, path: str | os.PathLike[str], *, missing_ok: bool = False, revalidate: bool = False
    ) -> FileRead:
        """Add a config file's entries to the user-loaded configs (priority 2).

        A missing file raises FileNotFoundError unless `missing_ok`; a corrupt file or one made
        in another environment warns and loads nothing. revalidate: a file of this device made
        under other library/driver versions has its picks re-validated when tuning."""
        with self.lock:
            found = self.store.load(path, missing_ok=missing_ok, revalidate=revalidate)
            if found.status == "ok":
                self.lookup.forget()
            return found

    def save_configs(
        self, path: str | os.PathLike[str], base: Mapping[CacheKey, Entry] | None = None
    ) -> bool:
        """Merge this process's results into `path`: on-disk entries, overlaid by `base` (the
        configs loaded on entry), overlaid by the in-memory profiling cache; all under a file
        lock so concurrent writers lose no update, written atomically. False when not saved
        (the file is from another environment, the lock timed out, or the path cannot be
        written: a directory, a read-only folder, a path under a regular file). Never raises
        for the file: the results stay in memory either way."""
        with self.lock:
            return self.store.save(
                path, self.lookup.profiling_cache, base, decisions=self.profiler.decisions
            )


# The cache file only saves time: nothing about it may fail the user's block (or replace the
# exception the block raised). load_configs/save_configs already turn file problems into
# warnings; these catch anything left, so `autotune()` itself never raises for its file.
def _load_quietly(
    tuner: AutoTuner, cache: str | os.PathLike[str], revalidate: bool
) -> dict[CacheKey, Entry]:
    try:
        return tuner.load_configs(cache, missing_ok=True, revalidate=revalidate).entries
    except Exception as exc:  # noqa: BLE001 - see above
        tuner.notices.warn_path_once(
            Path(cache), f"autotune: cannot load {cache}: {exc!r}; not using it", stacklevel=4
        )
        return {}


def _save_quietly(
    tuner: AutoTuner, cache: str | os.PathLike[str], loaded: Mapping[CacheKey, Entry]
) -> bool:
    try:
        return tuner.save_configs(cache, base=loaded)
    except Exception as exc:  # noqa: BLE001 - see above
        tuner.notices.warn_path_once(
            Path(cache),
            f"autotune: cannot save to {cache}: {exc!r}; tuned results are kept in memory",
            stacklevel=4,
        )
        return False


@contextlib.contextmanager
def autotune(
    tune_mode: bool = True,
    cache: str | os.PathLike[str] | None = None,
    *,
    budget_s: float | None = None,
    session_budget_s: float | None = None,
    distributed: bool | None = None,
) -> Iterator[AutoTuner]:
    """Tune (True) or only use known configs (False) inside the block.

    | tune_mode | cache | on entry                  | on exit                         |
    |-----------|-------|---------------------------|---------------------------------|
    | True      | path  | load the file if it exists | save incrementally (merge)     |
    | True      | None  | -                         | - (results stay in memory)      |
    | False     | path  | load the file if it exists | never saves                    |
    | False     | None  | -                         | - (no profiling inside)         |

    budget_s: seconds per tuned bucket (one op at one shape bucket): the search stops there
        and keeps the best found so far (the defaults are always timed first).
    session_budget_s: seconds for the whole block: once spent, new buckets run the default
        tactic, uncached (a later session tunes them).
    distributed: tune across torch.distributed ranks (tune/ranks.py): misses are recorded
        and tuned at `sync_ranks()` / this block's exit, split across the ranks, the picks
        shared so that every rank runs the same tactic. None: when torch.distributed is
        initialised with more than one rank. Every rank must enter and exit the block.

    Configs loaded on entry stay loaded after exit (they are this GPU's answers); the tune
    mode is restored on exit. Results tuned in memory are kept for the process's lifetime.
    A cache path that cannot be read or written (a directory, no permission, a read-only
    folder, a path under a regular file) costs one AutotuneWarning, never an exception.
    A file of this GPU made under other library/driver versions is re-validated when tuning
    (each pick timed against the defaults as its shape is seen; the file rewritten on exit).
    """
    for name, value in (("budget_s", budget_s), ("session_budget_s", session_budget_s)):
        if value is not None and not value > 0:
            raise ValueError(f"autotune({name}={value!r}): expected a positive number of seconds")
    tuner = AutoTuner.get()
    if distributed is None:
        distributed = tune_mode and distributed_world() is not None
    with tuner.lock:
        loaded: dict[CacheKey, Entry] = {}
        if cache is not None:
            loaded = _load_quietly(tuner, cache, revalidate=tune_mode)
        previous = tuner.tune_mode
        previous_budget = (tuner.profiler.bucket_budget_s, tuner.profiler.session_deadline)
        previous_group = (tuner.rank_group, tuner.lookup.deferred)
        before = replace(tuner.stats)
        tuner.set_tune_mode(tune_mode)
        if tune_mode:
            if budget_s is not None:
                tuner.profiler.bucket_budget_s = budget_s
            if session_budget_s is not None:
                tuner.profiler.session_deadline = time.perf_counter() + session_budget_s
            if distributed:
                tuner.rank_group = RankGroup()
                tuner.lookup.deferred = tuner.rank_group.record
    try:
        yield tuner
    finally:
        with tuner.lock:
            try:
                if tune_mode and distributed:
                    # Every rank exits the block: the one place all of them meet. A rank
                    # leaving by an exception still joins (else the others would wait for
                    # it), and its own exception is the one that propagates.
                    in_flight = sys.exc_info()[1]
                    try:
                        tuner.sync_ranks()
                    except Exception as exc:
                        if in_flight is None:
                            raise
                        logger.warning("autotune: sync_ranks failed after %r: %r", in_flight, exc)
            finally:
                tuner.rank_group, tuner.lookup.deferred = previous_group
                tuner.profiler.bucket_budget_s, tuner.profiler.session_deadline = previous_budget
                tuner.set_tune_mode(previous)
            saved = False
            if tune_mode and cache is not None:
                saved = _save_quietly(tuner, cache, loaded)
            if tune_mode:
                now = tuner.stats
                logger.info(
                    "autotune: %d shapes tuned (%d tactics timed, %d pruned, %d excluded, %d "
                    "cache hits, %d defaults kept) in %.1f s%s",
                    now.shapes_tuned - before.shapes_tuned,
                    now.tactics_timed - before.tactics_timed,
                    now.tactics_pruned - before.tactics_pruned,
                    now.tactics_failed - before.tactics_failed,
                    now.cache_hits - before.cache_hits,
                    now.defaults_kept - before.defaults_kept,
                    now.seconds - before.seconds,
                    f"; saved to {cache}" if saved else "",
                )


def sync_ranks() -> int:
    """Tune what the ranks recorded so far, together (see `AutoTuner.sync_ranks`)."""
    return AutoTuner.get().sync_ranks()

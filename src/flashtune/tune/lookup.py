"""choose_one: the (runner, tactic) for a call, from the first source that covers its shape
bucket (see tune/tuner.py for the order), profiling the bucket when tuning and none does.

The answer for a runtime shape is memoized: a repeated call builds its key and reads one
dict, without the lock (a dict read is atomic in CPython; writes happen under the lock)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch

from flashtune import env
from flashtune.tune.cache_file import CacheKey, Entry, matches_stored, stored_form
from flashtune.tune.notices import Notices
from flashtune.tune.profiling import Profiler
from flashtune.tune.runner import (
    DEFAULT_TACTIC,
    Profile,
    Tactic,
    TunableRunner,
    TuningConfig,
    layout_of,
    make_profile,
)
from flashtune.tune.store import ConfigStore

__all__ = ["Lookup"]

# A runtime shape -> answer memo; bounded so a serving loop with ever-new shapes cannot grow
# it without limit (a miss only costs a bucket mapping and a few dict lookups).
_MEMO_MAX = 1 << 16


def _is_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (profiling would break it)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class Lookup:
    """The memo, the in-memory profiling cache (priority 1) and the search through the
    sources; the store holds the file sources, the profiler fills the in-memory cache."""

    def __init__(
        self, lock: threading.RLock, store: ConfigStore, profiler: Profiler, notices: Notices
    ) -> None:
        self.lock = lock
        self.store = store
        self.profiler = profiler
        self.notices = notices
        self.tune_mode = False
        self.profiling_cache: dict[CacheKey, Entry] = {}
        self._memo: dict[Any, tuple[int, Tactic]] = {}
        # Set while ranks tune together (tune/ranks.py): called with a bucket to tune at the
        # next sync point instead of now.
        self.deferred: Callable[..., None] | None = None

    def choose_one(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        tuning_config: TuningConfig,
        inputs: Sequence[Any],
    ) -> tuple[TunableRunner, Tactic]:
        """The (runner, tactic) to run `inputs` with. In tune mode, a bucket no source
        covers is profiled first."""
        try:  # optional tensors (None) are common, other non-tensors rare
            shapes = tuple([None if x is None else x.shape for x in inputs])
        except AttributeError:  # a non-tensor argument (a Python scalar, ...)
            shapes = tuple([getattr(x, "shape", None) for x in inputs])
        if tuning_config.key_dtypes:
            shapes += tuple([getattr(x, "dtype", None) for x in inputs])
        if tuning_config.key_layouts:
            shapes += tuple([layout_of(x) for x in inputs])
        # The runner classes are part of the key: the answer is an index into `runners`.
        key = (op_name, shapes, *[type(r) for r in runners])
        hit = self._memo.get(key)
        if hit is not None:
            return runners[hit[0]], hit[1]
        return self._choose_slow(key, op_name, runners, tuning_config, inputs)

    def _choose_slow(
        self,
        memo_key: Any,
        op_name: str,
        runners: Sequence[TunableRunner],
        config: TuningConfig,
        inputs: Sequence[Any],
    ) -> tuple[TunableRunner, Tactic]:
        if not runners:
            raise ValueError(f"choose_one({op_name!r}): runners is empty; give at least one")
        with self.lock:
            hit = self._memo.get(memo_key)
            if hit is not None:
                return runners[hit[0]], hit[1]
            profile = self.profile_of(inputs, config)
            found = self._search(op_name, runners, profile, inputs)
            if found is not None:
                index, tactic, source = found
                if self.tune_mode:
                    self.profiler.stats.cache_hits += 1
                    self.notices.log_once(
                        ("hit", op_name, runners[index].name),
                        "autotune: %s/%s found in the %s configs; not profiling shapes they cover",
                        op_name,
                        runners[index].name,
                        source,
                    )
                return self._remember(memo_key, runners, index, tactic)
            if not self.tune_mode:
                return self._remember(memo_key, runners, 0, DEFAULT_TACTIC)
            if _is_capturing():
                # Not memoized: the shape is profiled once capture is over.
                self.notices.warn_once(
                    ("capture", op_name),
                    f"autotune: {op_name} at profile {profile} is not tuned and a CUDA graph is "
                    "being captured, so it cannot be profiled now; using the default tactic "
                    "(tune it before capturing)",
                )
                return runners[0], DEFAULT_TACTIC
            if self.profiler.session_exhausted():
                self.notices.warn_once(
                    ("budget", op_name),
                    f"autotune: the session's time budget is spent; {op_name} at {profile} "
                    "and other new buckets run the default tactic, uncached (tune them in a "
                    "later session)",
                )
                return self._remember(memo_key, runners, 0, DEFAULT_TACTIC)
            if self.deferred is not None:
                # Ranks tune together at the sync point (tune/ranks.py); until then the
                # default, not memoized, so the synced pick is used right after.
                self.deferred(op_name, runners, config, inputs, profile)
                return runners[0], DEFAULT_TACTIC
            won = self.tune_bucket(op_name, runners, config, inputs, profile)
            if won is None:  # every candidate failed: the default, not cached
                return self._remember(memo_key, runners, 0, DEFAULT_TACTIC)
            return self._remember(memo_key, runners, *won)

    def tune_bucket(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        config: TuningConfig,
        inputs: Sequence[Any],
        profile: Profile,
    ) -> tuple[int, Tactic] | None:
        """Profile one bucket (a stale cached pick is only re-validated against the
        defaults; otherwise a search seeded by the neighbouring buckets' winners) and keep
        the winner in the in-memory cache. Called under the lock."""
        stale = self._stale_pick(op_name, runners, inputs, profile)
        won = self.profiler.profile(
            op_name,
            runners,
            config,
            inputs,
            profile,
            priors=self.priors(op_name, runners, config, profile),
            only=None if stale is None else [stale],
        )
        if won is None:
            return None
        index, tactic = won
        name = runners[index].name
        self.profiling_cache[(op_name, name, profile)] = (name, tactic)
        return index, tactic

    def _stale_pick(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        inputs: Sequence[Any],
        profile: Profile,
    ) -> tuple[int, Tactic] | None:
        """A pick cached under other library/driver versions, if the runner still offers it."""
        for index, runner in enumerate(runners):
            entry = self.store.stale_configs.get((op_name, runner.name, profile))
            if entry is None:
                continue
            offered = self._offered_tactic(runner, entry[1], inputs, profile)
            if offered is not None:
                return index, offered
        return None

    def priors(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        config: TuningConfig,
        profile: Profile,
        most: int = 4,
    ) -> list[tuple[int, Tactic]]:
        """Winners at the nearest neighbouring buckets of the same op and fixed dimensions
        (in memory and in loaded files), and at this very bucket on another GPU (a file of
        another device, loaded while tuning): good tactics move slowly with M and between
        GPUs of a family, so they are timed right after the defaults, which lets early
        stopping cut the long tail. A prior is only a candidate: it is timed like any."""
        dynamic = {(d.input_idx, d.dim) for d in config.dynamic_dims}
        index_of = {r.name: i for i, r in enumerate(runners)}
        scored: list[tuple[float, int, Tactic]] = []
        tables = (
            (self.profiling_cache, False),
            (self.store.file_configs, False),
            (self.store.foreign_configs, True),
        )
        for table, same_bucket_ok in tables:
            for (op, runner_name, other), (_, tactic) in table.items():
                if op != op_name or runner_name not in index_of:
                    continue
                if other == profile and not same_bucket_ok:
                    continue
                distance = _bucket_distance(profile, other, dynamic)
                if distance is None:
                    continue
                # (A file holds dataclass tactics in their stored form: order_candidates
                # matches priors to the runner's own candidates by that form.)
                scored.append((distance, index_of[runner_name], tactic))
        out: list[tuple[int, Tactic]] = []
        for _, index, tactic in sorted(scored, key=lambda x: x[0]):
            if (index, tactic) not in out:
                out.append((index, tactic))
            if len(out) >= most:
                break
        return out

    def _remember(
        self, memo_key: Any, runners: Sequence[TunableRunner], index: int, tactic: Tactic
    ) -> tuple[TunableRunner, Tactic]:
        if len(self._memo) >= _MEMO_MAX:
            self._memo.clear()
        self._memo[memo_key] = (index, tactic)
        return runners[index], tactic

    def forget(self) -> None:
        """Drop the memoized answers (a source or the mode changed)."""
        self._memo.clear()

    def clear(self) -> None:
        self.profiling_cache.clear()
        self._memo.clear()

    @staticmethod
    def profile_of(inputs: Sequence[Any], config: TuningConfig) -> Profile:
        """The optimization profile (bucketed shapes) `inputs` are tuned and cached under."""
        profile = make_profile(inputs, config)
        if config.key_dtypes:
            dtypes = tuple(
                str(x.dtype).removeprefix("torch.") if isinstance(x, torch.Tensor) else ""
                for x in inputs
            )
            # The dtype names ride as one more entry: part of the cache key, never read as a
            # shape (shape readers go by input position, and there is one entry more than
            # inputs).
            profile = (*profile, cast(tuple[int, ...], dtypes))
        if config.key_layouts:
            # One more key entry, after the dtypes' (never read as a shape, like them).
            layouts = tuple(layout_of(x) for x in inputs)
            profile = (*profile, cast(tuple[int, ...], layouts))
        return profile

    def _sources(self) -> list[tuple[str, Mapping[CacheKey, Entry]]]:
        sources: list[tuple[str, Mapping[CacheKey, Entry]]] = [
            ("in-memory", self.profiling_cache),
            ("file", self.store.file_configs),
        ]
        if not self.tune_mode and env.AUTOTUNE_LOAD_BUNDLED.get():
            sources.append(("bundled", self.store.bundled_configs()))
        return sources

    def _search(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        profile: Profile,
        inputs: Sequence[Any],
    ) -> tuple[int, Tactic, str] | None:
        for source, table in self._sources():
            for index, runner in enumerate(runners):
                entry = table.get((op_name, runner.name, profile))
                if entry is None:
                    continue
                tactic = entry[1]
                offered = (
                    tactic
                    if source == "in-memory"
                    else self._offered_tactic(runner, tactic, inputs, profile)
                )
                if offered is None:
                    self.notices.warn_once(
                        ("stale", source, op_name, runner.name, tactic),
                        f"autotune: {source} config for {op_name}/{runner.name} at {profile} "
                        f"names tactic {tactic!r}, which the runner no longer offers; ignoring it "
                        "(re-tune to refresh the file)",
                    )
                    continue
                return index, offered, source
        return None

    @staticmethod
    def _offered_tactic(
        runner: TunableRunner, tactic: Tactic, inputs: Sequence[Any], profile: Profile
    ) -> Tactic | None:
        """The runner's own tactic that a file's entry names, or None when the runner no
        longer offers it. Files outlive code: a tactic a newer runner dropped must not reach
        its kernel; and a file holds dataclass tactics in their stored form (cache_file), so
        the match is on that form. The tactic was offered for the bucket's shape (where it
        was tuned), which a runner may prune differently from the runtime shape: accept
        either."""
        if tactic == DEFAULT_TACTIC:
            return tactic
        at_profile = [
            x.new_empty(shape)
            if isinstance(x, torch.Tensor) and tuple(x.shape) != tuple(shape)
            else x
            for x, shape in zip(inputs, profile, strict=False)  # key_dtypes adds one
        ]
        wanted = stored_form(tactic)
        for candidate_inputs in (at_profile, inputs):
            try:
                offered = runner.get_valid_tactics(candidate_inputs, profile)
            except Exception:
                continue
            for candidate in offered:
                if candidate == tactic or matches_stored(candidate, wanted):
                    return candidate
        return None


# A step along a fixed dimension (N, K) weighs as much as one along a dynamic one (M):
# the tiles that win recur across layer shapes. On the 81 picks of an H200 GEMM sweep
# (leave one out), 4 priors from any shape instead of 2 from the same N and K left 5
# winners untimed instead of 12 (patience 12, band 5%); weighing fixed steps 2x or 4x, 6.
_FIXED_STEP = 1.0


def _bucket_distance(profile: Profile, other: Any, dynamic: set[tuple[int, int]]) -> float | None:
    """How far `other` is from `profile` in log2 steps of its dimensions (a fixed one's step
    weighs _FIXED_STEP); None when they differ in anything else (a dtype, a layout, the
    number of dimensions: not a neighbour)."""
    if not isinstance(other, tuple) or len(other) != len(profile):
        return None
    distance = 0.0
    for i, (a, b) in enumerate(zip(profile, other, strict=True)):
        if a == b:
            continue
        if not (isinstance(a, tuple) and isinstance(b, tuple)) or len(a) != len(b):
            return None
        for d, (x, y) in enumerate(zip(a, b, strict=True)):
            if x == y:
                continue
            if not (isinstance(x, int) and isinstance(y, int)) or x <= 0 or y <= 0:
                return None
            fixed = (i, d) not in dynamic and (i, d - len(a)) not in dynamic
            distance += abs(math.log2(x) - math.log2(y)) * (_FIXED_STEP if fixed else 1.0)
    return distance

"""The AutoTuner: picks (runner, tactic) per shape bucket, profiles on first sight when
tuning, and keeps the winners in memory and in JSON config files.

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
import functools
import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from filelock import FileLock, Timeout

from flashtune import env, timing
from flashtune.tune.cache_file import (
    CacheKey,
    Entry,
    FileRead,
    backup_file,
    corrupt_entries,
    current_metadata,
    read_cache_file,
    stored_form,
    write_cache_file,
)
from flashtune.tune.checks import device_of, result_difference, tensors_of
from flashtune.tune.runner import (
    DEFAULT_TACTIC,
    Profile,
    Tactic,
    TunableRunner,
    TuningConfig,
    make_profile,
    make_tuning_inputs,
)
from flashtune.tune.selection import TacticFailure, TuneStats, confirm_pick

__all__ = ["AutoTuner", "AutotuneWarning", "TacticFailure", "TuneStats", "autotune"]

logger = logging.getLogger("flashtune.tune")

BUNDLED_DIR = Path(__file__).resolve().parent / "configs"
# A runtime shape -> answer memo; bounded so a serving loop with ever-new shapes cannot grow
# it without limit (a miss only costs a bucket mapping and a few dict lookups).
_MEMO_MAX = 1 << 16
# Show a progress bar when one shape has at least this many tactics to time.
_PROGRESS_MIN_TACTICS = 8


class AutotuneWarning(UserWarning):
    """A config file that could not be used, or tuning that could not happen."""


def _measure(fn: Any, args: Sequence[Any], **kwargs: Any) -> timing.Timing:
    """Time one candidate (a seam for tests, which replace it with a fake clock)."""
    return timing.measure(fn, args, **kwargs)


def _is_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (profiling would break it)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


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
        self.tune_mode = False
        self.profiling_cache: dict[CacheKey, Entry] = {}
        self.file_configs: dict[CacheKey, Entry] = {}
        self.failures: list[TacticFailure] = []
        self.stats = TuneStats()
        # (op_name, profile) -> {(runner_name, tactic): median ms}: what profiling measured,
        # for reports (the winner's margin over the default, over cuBLAS, ...).
        self.timings: dict[tuple[str, Profile], dict[tuple[str, Tactic], float]] = {}
        self.show_progress = True
        self.file_lock_timeout_s = 120.0
        self._bundled: dict[CacheKey, Entry] | None = None
        self._memo: dict[Any, tuple[int, Tactic]] = {}
        self._once: set[Any] = set()

    @classmethod
    def get(cls) -> AutoTuner:
        inst = cls._instance
        if inst is None:
            with cls._instance_lock:
                if cls._instance is None:
                    cls._instance = cls()
                inst = cls._instance
        return inst

    # ----------------------------------------------------------------- dispatch
    def choose_one(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        tuning_config: TuningConfig,
        inputs: Sequence[Any],
    ) -> tuple[TunableRunner, Tactic]:
        """The (runner, tactic) to run `inputs` with: see the module docstring for the order
        of sources. In tune mode, a bucket no source covers is profiled first."""
        try:  # optional tensors (None) are common, other non-tensors rare
            shapes = tuple([None if x is None else x.shape for x in inputs])
        except AttributeError:  # a non-tensor argument (a Python scalar, ...)
            shapes = tuple([getattr(x, "shape", None) for x in inputs])
        if tuning_config.key_dtypes:
            shapes += tuple([getattr(x, "dtype", None) for x in inputs])
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
                    self.stats.cache_hits += 1
                    self._log_once(
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
                self._warn_once(
                    ("capture", op_name),
                    f"autotune: {op_name} at profile {profile} is not tuned and a CUDA graph is "
                    "being captured, so it cannot be profiled now; using the default tactic "
                    "(tune it before capturing)",
                )
                return runners[0], DEFAULT_TACTIC
            index, tactic = self._profile(op_name, runners, config, inputs, profile)
            return self._remember(memo_key, runners, index, tactic)

    def _remember(
        self, memo_key: Any, runners: Sequence[TunableRunner], index: int, tactic: Tactic
    ) -> tuple[TunableRunner, Tactic]:
        if len(self._memo) >= _MEMO_MAX:
            self._memo.clear()
        self._memo[memo_key] = (index, tactic)
        return runners[index], tactic

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
        return profile

    def _sources(self) -> list[tuple[str, Mapping[CacheKey, Entry]]]:
        sources: list[tuple[str, Mapping[CacheKey, Entry]]] = [
            ("in-memory", self.profiling_cache),
            ("file", self.file_configs),
        ]
        if not self.tune_mode and env.AUTOTUNE_LOAD_BUNDLED.get():
            sources.append(("bundled", self._bundled_configs()))
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
                    self._warn_once(
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
                if candidate == tactic or stored_form(candidate) == wanted:
                    return candidate
        return None

    # ----------------------------------------------------------------- profiling
    def _profile(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        config: TuningConfig,
        inputs: Sequence[Any],
        profile: Profile,
    ) -> tuple[int, Tactic]:
        start = time.perf_counter()
        tuning_inputs = make_tuning_inputs(inputs, profile, config)
        candidates: list[tuple[int, Tactic]] = []
        for index, runner in enumerate(runners):
            tactics: list[Tactic] = [DEFAULT_TACTIC]
            try:
                for tactic in runner.get_valid_tactics(tuning_inputs, profile):
                    if tactic not in tactics:
                        tactics.append(tactic)
            except Exception as exc:
                self._fail(op_name, runner, "*", profile, f"get_valid_tactics raised {exc!r}")
            candidates += [(index, t) for t in tactics]

        # Timing a tactic that writes in place (fused add + RMSNorm updates its residual)
        # changes tuning_inputs: every correctness check starts from this untouched copy.
        pristine = timing.clone_inputs(tuning_inputs)
        candidates = self._compile(op_name, runners, candidates, tuning_inputs, profile, config)
        baseline = self._baseline(op_name, runners, candidates, pristine, profile)
        if baseline is None:
            candidates = [c for c in candidates if c != (0, DEFAULT_TACTIC)]
        input_sets = self._input_sets(tuning_inputs, config)

        results: list[tuple[int, Tactic, float]] = []
        timings = self.timings.setdefault((op_name, profile), {})
        with self._progress(op_name, profile, len(candidates)) as advance:
            for index, tactic in candidates:
                runner = runners[index]
                try:
                    if baseline is not None and (index, tactic) != (0, DEFAULT_TACTIC):
                        wrong = result_difference(runner, tactic, pristine, baseline, config)
                        if wrong:
                            self._fail(op_name, runner, tactic, profile, wrong)
                            continue
                    median = _time_tactic(runner, tactic, tuning_inputs, input_sets, config)
                except Exception as exc:
                    self._fail(op_name, runner, tactic, profile, f"raised {exc!r}")
                    _recover_device(exc)
                    continue
                finally:
                    advance()
                self.stats.tactics_timed += 1
                timings[(runner.name, tactic)] = median
                logger.debug(
                    "autotune: %s %s %s tactic %r: %.4f ms",
                    op_name,
                    profile,
                    runner.name,
                    tactic,
                    median,
                )
                results.append((index, tactic, median))

        best = self._confirm(op_name, runners, config, tuning_inputs, input_sets, profile, results)
        elapsed = time.perf_counter() - start
        self.stats.seconds += elapsed
        if best is None:
            # Nothing ran, not even the default: not cached, so a later call can retry.
            warnings.warn(
                f"autotune: every candidate of {op_name} at {profile} failed "
                f"(see AutoTuner.get().failures); using {runners[0].name} tactic -1",
                AutotuneWarning,
                stacklevel=4,
            )
            return 0, DEFAULT_TACTIC
        index, tactic, median = best
        name = runners[index].name
        self.profiling_cache[(op_name, name, profile)] = (name, tactic)
        self.stats.shapes_tuned += 1
        logger.info(
            "autotune: %s %s -> %s tactic %r (%.4f ms; %d candidates in %.2f s)",
            op_name,
            profile,
            name,
            tactic,
            median,
            len(candidates),
            elapsed,
        )
        return index, tactic

    def _confirm(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        config: TuningConfig,
        inputs: Sequence[Any],
        input_sets: Any,
        profile: Profile,
        results: Sequence[tuple[int, Tactic, float]],
    ) -> tuple[int, Tactic, float] | None:
        """The pick among `results` (selection.confirm_pick); a finalist raising now is
        excluded like any failing tactic."""

        def time_once(index: int, tactic: Tactic) -> float | None:
            try:
                return _time_tactic(runners[index], tactic, inputs, input_sets, config)
            except Exception as exc:
                self._fail(op_name, runners[index], tactic, profile, f"raised {exc!r}")
                _recover_device(exc)
                return None

        pick, medians = confirm_pick(results, time_once, config.confirm_top, config.confirm_rounds)
        timings = self.timings.setdefault((op_name, profile), {})
        timings.update({(runners[i].name, t): m for (i, t), m in medians.items()})
        return pick

    def _compile(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        candidates: list[tuple[int, Tactic]],
        inputs: Sequence[Any],
        profile: Profile,
        config: TuningConfig,
    ) -> list[tuple[int, Tactic]]:
        """Run the runners' `warmup` hooks for all candidates in a thread pool (compilers
        release the GIL), dropping candidates whose compilation fails."""
        hooked = [c for c in candidates if type(runners[c[0]]).warmup is not TunableRunner.warmup]
        if not hooked:
            return candidates
        device = device_of(inputs)

        def warm(index: int, tactic: Tactic) -> None:
            ctx = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
            with ctx:
                runners[index].warmup(inputs, tactic)

        failed: set[tuple[int, Tactic]] = set()
        workers = max(1, min(config.compile_workers, len(hooked)))
        with ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="flashtune-compile"
        ) as pool:
            futures = {pool.submit(warm, i, t): (i, t) for i, t in hooked}
            for future in as_completed(futures):
                exc = future.exception()
                if exc is not None:
                    index, tactic = futures[future]
                    failed.add((index, tactic))
                    self._fail(op_name, runners[index], tactic, profile, f"warmup raised {exc!r}")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return [c for c in candidates if c not in failed]

    def _baseline(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        candidates: list[tuple[int, Tactic]],
        inputs: Sequence[Any],
        profile: Profile,
    ) -> list[torch.Tensor] | None:
        """The default tactic's output, which every other tactic must reproduce."""
        if (0, DEFAULT_TACTIC) not in candidates:
            return None
        args = timing.clone_inputs(inputs)
        try:
            out = runners[0].forward(args, DEFAULT_TACTIC)
            return tensors_of(out, args)
        except Exception as exc:
            self._fail(op_name, runners[0], DEFAULT_TACTIC, profile, f"raised {exc!r}")
            _recover_device(exc)
            self._warn_once(
                ("no-baseline", op_name, profile),
                f"autotune: the default tactic of {runners[0].name} failed for {op_name} at "
                f"{profile}; other tactics are timed without a correctness check",
            )
            return None

    @staticmethod
    def _input_sets(inputs: Sequence[Any], config: TuningConfig) -> list[list[Any]]:
        """Input copies every tactic rotates through (made once per shape, not per tactic)."""
        device = device_of(inputs)
        copies = 1
        if config.cold_l2 and device.type == "cuda":
            copies = timing.copies_for_cold_l2(inputs, device)
        return [list(inputs)] + [timing.clone_inputs(inputs) for _ in range(copies - 1)]

    @contextlib.contextmanager
    def _progress(self, op_name: str, profile: Profile, total: int) -> Iterator[Any]:
        if not self.show_progress or total < _PROGRESS_MIN_TACTICS:
            yield lambda: None
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        progress = Progress(
            TextColumn("[bold]autotune[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        task = progress.add_task(f"{op_name} {profile}", total=total)
        with progress:
            yield lambda: progress.advance(task)

    def _fail(
        self, op_name: str, runner: TunableRunner, tactic: Tactic, profile: Profile, reason: str
    ) -> None:
        self.failures.append(TacticFailure(op_name, runner.name, tactic, profile, reason))
        self.stats.tactics_failed += 1
        logger.warning(
            "autotune: excluding %s %s tactic %r at %s: %s",
            op_name,
            runner.name,
            tactic,
            profile,
            reason,
        )

    def _warn_once(self, key: Any, message: str) -> None:
        if key in self._once:
            return
        self._once.add(key)
        warnings.warn(message, AutotuneWarning, stacklevel=5)

    def _warn_path_once(self, path: Path, message: str, stacklevel: int) -> None:
        # One warning per unusable cache path: loading on entry and saving on exit of the
        # same `autotune()` block fail for the same reason, which is worth saying once.
        key = ("cache-path", str(path.absolute()))
        if key in self._once:
            logger.debug("%s", message)
            return
        self._once.add(key)
        warnings.warn(message, AutotuneWarning, stacklevel=stacklevel + 1)

    def _log_once(self, key: Any, message: str, *args: Any) -> None:
        if key in self._once:
            return
        self._once.add(key)
        logger.info(message, *args)

    # ----------------------------------------------------------------- state
    def set_tune_mode(self, tune_mode: bool) -> None:
        with self.lock:
            self.tune_mode = bool(tune_mode)
            # Memoized answers depend on the mode (fallbacks are only final when not tuning).
            self._memo.clear()

    def clear(self) -> None:
        """Forget everything: profiling results, loaded configs, failures, statistics."""
        with self.lock:
            self.profiling_cache.clear()
            self.file_configs.clear()
            self.failures.clear()
            self.timings.clear()
            self.stats = TuneStats()
            self._bundled = None
            self._memo.clear()
            self._once.clear()

    def _bundled_configs(self) -> dict[CacheKey, Entry]:
        if self._bundled is None:
            bundled: dict[CacheKey, Entry] = {}
            for path in sorted(BUNDLED_DIR.glob("*.json")):
                found = read_cache_file(path)
                if found.status == "ok":
                    bundled.update(found.entries)
                    if found.dropped:
                        self._warn_once(
                            ("bundled-entries", str(path)),
                            f"autotune: bundled config {path} has {corrupt_entries(found)}; "
                            "the others are used",
                        )
                elif found.status == "corrupt":
                    self._warn_once(
                        ("bundled", str(path)),
                        f"autotune: bundled config {path} is corrupt ({found.reason}); skipped",
                    )
                else:  # configs of other GPUs and versions are expected not to match
                    logger.debug("autotune: bundled config %s skipped: %s", path, found.reason)
            self._bundled = bundled
        return self._bundled

    def load_configs(self, path: str | os.PathLike[str], *, missing_ok: bool = False) -> FileRead:
        """Add a config file's entries to the user-loaded configs (priority 2).

        A missing file raises FileNotFoundError unless `missing_ok`; a corrupt file or one made
        in another environment warns and loads nothing."""
        with self.lock:
            found = read_cache_file(path)
            if found.status == "absent":
                if missing_ok:
                    return found
                raise FileNotFoundError(f"autotune config file {found.path} does not exist")
            if found.status == "corrupt" and found.io_error:
                self._warn_path_once(
                    found.path,
                    f"autotune: cannot use config file {found.path}: {found.reason}; tuned "
                    "results are kept in memory for this process and not saved there",
                    stacklevel=3,
                )
            elif found.status == "corrupt":
                warnings.warn(
                    f"autotune config file {found.path} is corrupt: {found.reason}; treating it as "
                    "absent (a backup is kept before it is ever overwritten)",
                    AutotuneWarning,
                    stacklevel=3,
                )
            elif found.status == "mismatch":
                warnings.warn(
                    f"autotune config file {found.path} was made in another environment: "
                    f"{found.reason}; nothing loaded and the file will not be overwritten. Use "
                    "another cache path for this environment (e.g. one per GPU type), or set the "
                    'field to "*" in the file to accept any value',
                    AutotuneWarning,
                    stacklevel=3,
                )
            else:
                if found.dropped:
                    warnings.warn(
                        f"autotune config file {found.path}: ignoring {corrupt_entries(found)}; "
                        f"its {len(found.entries)} other entries are loaded",
                        AutotuneWarning,
                        stacklevel=3,
                    )
                self.file_configs.update(found.entries)
                self._memo.clear()
                logger.info("autotune: loaded %d configs from %s", len(found.entries), found.path)
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
        path = Path(path)
        with self.lock:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with FileLock(str(path) + ".lock", timeout=self.file_lock_timeout_s):
                    saved = self._merge_into(path, base)
            except Timeout:
                warnings.warn(
                    f"autotune: could not lock {path}.lock within {self.file_lock_timeout_s:.0f} s; "
                    "results not saved",
                    AutotuneWarning,
                    stacklevel=3,
                )
                return False
            except OSError as exc:
                self._warn_path_once(
                    path,
                    f"autotune: cannot save to {path}: {exc}; tuned results are kept in memory "
                    "for this process",
                    stacklevel=3,
                )
                return False
            if saved is not None:
                logger.info("autotune: saved %d configs to %s", saved, path)
            return saved is not None

    def _merge_into(self, path: Path, base: Mapping[CacheKey, Entry] | None) -> int | None:
        """save_configs under the file lock: how many configs were written (None: none)."""
        on_disk = read_cache_file(path)
        if on_disk.status == "corrupt" and on_disk.io_error:
            # Unknown contents (unreadable, or not a file): never overwrite them.
            self._warn_path_once(
                path,
                f"autotune: not saving to {path}: {on_disk.reason}; tuned results are kept in "
                "memory for this process",
                stacklevel=4,
            )
            return None
        if on_disk.status == "mismatch":
            warnings.warn(
                f"autotune: not saving to {path}: {on_disk.reason}; the file belongs to another "
                "environment, use another cache path",
                AutotuneWarning,
                stacklevel=4,
            )
            return None
        if on_disk.status == "corrupt":
            backup = backup_file(path)
            warnings.warn(
                f"autotune: {path} is corrupt ({on_disk.reason}); kept a copy at {backup} and "
                "writing a fresh file",
                AutotuneWarning,
                stacklevel=4,
            )
        elif on_disk.dropped:
            # Rewriting drops the bad entries for good: keep the file as it was first.
            backup = backup_file(path)
            warnings.warn(
                f"autotune: {path} has {corrupt_entries(on_disk)}; kept a copy at {backup} and "
                "writing the file without them",
                AutotuneWarning,
                stacklevel=4,
            )
        merged = dict(on_disk.entries)
        merged.update(base or {})
        merged.update(self.profiling_cache)
        metadata = on_disk.metadata if on_disk.metadata else current_metadata()
        write_cache_file(path, merged, metadata, last_updated_by=current_metadata())
        return len(merged)


def _call(runner: TunableRunner, tactic: Tactic, *args: Any) -> Any:
    return runner.forward(args, tactic)


def _time_tactic(
    runner: TunableRunner, tactic: Tactic, inputs: Sequence[Any], input_sets: Any, c: TuningConfig
) -> float:
    """One tactic's median ms, by the config's timing effort."""
    measured = _measure(
        functools.partial(_call, runner, tactic),
        inputs,
        warmup=c.warmup,
        repetitions=c.repetitions,
        cold_l2=c.cold_l2,
        use_cuda_graph=c.use_cuda_graph and runner.supports_cuda_graph,
        input_sets=input_sets,
        max_seconds=c.max_seconds_per_tactic,
    )
    return _nan_safe(measured.median_ms)


def _recover_device(exc: BaseException) -> None:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()


# The cache file only saves time: nothing about it may fail the user's block (or replace the
# exception the block raised). load_configs/save_configs already turn file problems into
# warnings; these catch anything left, so `autotune()` itself never raises for its file.
def _load_quietly(tuner: AutoTuner, cache: str | os.PathLike[str]) -> dict[CacheKey, Entry]:
    try:
        return tuner.load_configs(cache, missing_ok=True).entries
    except Exception as exc:  # noqa: BLE001 - see above
        tuner._warn_path_once(
            Path(cache), f"autotune: cannot load {cache}: {exc!r}; not using it", stacklevel=4
        )
        return {}


def _save_quietly(
    tuner: AutoTuner, cache: str | os.PathLike[str], loaded: Mapping[CacheKey, Entry]
) -> bool:
    try:
        return tuner.save_configs(cache, base=loaded)
    except Exception as exc:  # noqa: BLE001 - see above
        tuner._warn_path_once(
            Path(cache),
            f"autotune: cannot save to {cache}: {exc!r}; tuned results are kept in memory",
            stacklevel=4,
        )
        return False


@contextlib.contextmanager
def autotune(
    tune_mode: bool = True, cache: str | os.PathLike[str] | None = None
) -> Iterator[AutoTuner]:
    """Tune (True) or only use known configs (False) inside the block.

    | tune_mode | cache | on entry                  | on exit                         |
    |-----------|-------|---------------------------|---------------------------------|
    | True      | path  | load the file if it exists | save incrementally (merge)     |
    | True      | None  | -                         | - (results stay in memory)      |
    | False     | path  | load the file if it exists | never saves                    |
    | False     | None  | -                         | - (no profiling inside)         |

    Configs loaded on entry stay loaded after exit (they are this GPU's answers); the tune
    mode is restored on exit. Results tuned in memory are kept for the process's lifetime.
    A cache path that cannot be read or written (a directory, no permission, a read-only
    folder, a path under a regular file) costs one AutotuneWarning, never an exception.
    """
    tuner = AutoTuner.get()
    with tuner.lock:
        loaded: dict[CacheKey, Entry] = {}
        if cache is not None:
            loaded = _load_quietly(tuner, cache)
        previous = tuner.tune_mode
        before = replace(tuner.stats)
        tuner.set_tune_mode(tune_mode)
    try:
        yield tuner
    finally:
        with tuner.lock:
            tuner.set_tune_mode(previous)
            saved = False
            if tune_mode and cache is not None:
                saved = _save_quietly(tuner, cache, loaded)
            if tune_mode:
                now = tuner.stats
                logger.info(
                    "autotune: %d shapes tuned (%d tactics timed, %d excluded, %d cache hits) in "
                    "%.1f s%s",
                    now.shapes_tuned - before.shapes_tuned,
                    now.tactics_timed - before.tactics_timed,
                    now.tactics_failed - before.tactics_failed,
                    now.cache_hits - before.cache_hits,
                    now.seconds - before.seconds,
                    f"; saved to {cache}" if saved else "",
                )


def _nan_safe(x: float) -> float:
    return x if math.isfinite(x) else float("inf")

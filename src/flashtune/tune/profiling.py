"""Profiling one shape bucket: every runner's candidates are compiled (their `warmup` hooks,
in a thread pool), checked against the first runner's default tactic, timed with
flashtune.timing, and the winner confirmed (tune/selection.py). Also the records of it: the
tactics excluded (`failures`), the counters (`stats`) and every median measured (`timings`).

The profiler takes no lock of its own: lookup calls it under the tuner's lock, so profiling
runs one shape at a time within a process, which is also what a fair measurement needs."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import multiprocessing
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import replace
from typing import Any

import torch

from flashtune import timing
from flashtune.tune.cache_file import matches_stored, stored_form
from flashtune.tune.checks import device_of, result_difference, tensors_of
from flashtune.tune.notices import AutotuneWarning, Notices
from flashtune.tune.runner import (
    DEFAULT_TACTIC,
    Profile,
    Tactic,
    TunableRunner,
    TuningConfig,
    make_tuning_inputs,
)
from flashtune.tune.selection import (
    Decision,
    GuardResult,
    TacticFailure,
    TuneStats,
    confirm_pick,
    guard_pick,
)

__all__ = ["Profiler", "default_candidates", "order_candidates"]

logger = logging.getLogger("flashtune.tune")

# Show a progress bar when one shape has at least this many tactics to time.
_PROGRESS_MIN_TACTICS = 8


def _measure(fn: Any, args: Sequence[Any], **kwargs: Any) -> timing.Timing:
    """Time one candidate (a seam for tests, which replace it with a fake clock)."""
    return timing.measure(fn, args, **kwargs)


class Profiler:
    """Times the candidates of a shape bucket and picks the winner (`profile`)."""

    def __init__(self, notices: Notices) -> None:
        self.notices = notices
        self.failures: list[TacticFailure] = []
        self.stats = TuneStats()
        # (op_name, profile) -> {(runner_name, tactic): median ms}: what profiling measured,
        # for reports (the winner's margin over the default, over cuBLAS, ...).
        self.timings: dict[tuple[str, Profile], dict[tuple[str, Tactic], float]] = {}
        # (op_name, profile) -> why the bucket runs what it runs (saved beside the cache).
        self.decisions: dict[tuple[str, Profile], Decision] = {}
        self.show_progress = True
        # Time budgets (autotune(budget_s=..., session_budget_s=...)): seconds per bucket,
        # and a perf_counter deadline for the whole session; None: unbounded. A search that
        # runs out keeps the best found so far (the defaults are always timed first).
        self.bucket_budget_s: float | None = None
        self.session_deadline: float | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._pool_size = 0

    def clear(self) -> None:
        self.failures.clear()
        self.timings.clear()
        self.decisions.clear()
        self.stats = TuneStats()

    def session_exhausted(self) -> bool:
        """Whether the session's time budget is spent (new buckets then run the default,
        uncached, so that a later session can still tune them)."""
        return self.session_deadline is not None and time.perf_counter() >= self.session_deadline

    def profile(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        config: TuningConfig,
        inputs: Sequence[Any],
        profile: Profile,
        priors: Sequence[tuple[int, Tactic]] = (),
        only: Sequence[tuple[int, Tactic]] | None = None,
    ) -> tuple[int, Tactic] | None:
        """The winner (runner index, tactic) for `profile`; None when every candidate failed,
        not even the default ran (warned; the caller uses the default without caching it).

        priors: candidates that won at neighbouring buckets (timed right after the defaults).
        only: time just these candidates and the defaults (re-validating a cached pick)."""
        start = time.perf_counter()
        deadline = self.session_deadline
        if self.bucket_budget_s is not None:
            deadline = min(deadline or math.inf, start + self.bucket_budget_s)
        tuning_inputs = make_tuning_inputs(inputs, profile, config)
        defaults = default_candidates(runners)
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
        if only is not None:
            keep = set(only) | set(defaults)
            candidates = [c for c in candidates if c in keep]
        candidates, pruned, relative = order_candidates(
            runners, candidates, tuning_inputs, profile, config, defaults, priors
        )
        estimated = set(relative)
        cuttable = {c for c, r in relative.items() if r > 1.0 + config.patience_band}
        self.stats.tactics_pruned += pruned

        # Timing a tactic that writes in place (fused add + RMSNorm updates its residual)
        # changes tuning_inputs: every correctness check starts from this untouched copy.
        pristine = timing.clone_inputs(tuning_inputs)
        input_sets = self._input_sets(tuning_inputs, config)
        baseline: list[torch.Tensor] | None = None
        results: list[tuple[int, Tactic, float]] = []
        timings = self.timings.setdefault((op_name, profile), {})
        best = math.inf
        stale = 0  # ranked tactics timed in a row that did not beat the best beyond the margin
        stopped = ""
        # Compiled a batch at a time (as many as compile in parallel), in timing order, so
        # that what patience or the budget cuts is never compiled either: compiling is most
        # of a Triton tactic's tuning time.
        batch_size = max(1, config.compile_workers)
        with self._progress(op_name, profile, len(candidates)) as advance:
            for first in range(0, len(candidates), batch_size):
                batch = candidates[first : first + batch_size]
                if results and deadline is not None and time.perf_counter() >= deadline:
                    stopped = "budget"
                    break
                batch = self._compile(op_name, runners, batch, tuning_inputs, profile, config)
                if first == 0:  # the defaults lead the order: runner 0's -1 is in this batch
                    baseline = self._baseline(op_name, runners, batch, pristine, profile)
                    if baseline is None:
                        batch = [c for c in batch if c != (0, DEFAULT_TACTIC)]
                for index, tactic in batch:
                    is_default = (index, tactic) in defaults
                    if not is_default and results:
                        if deadline is not None and time.perf_counter() >= deadline:
                            stopped = "budget"
                            break
                        # Patience only cuts what the cost model ranked clearly worse than
                        # its best: a tactic nobody estimated, or one the model prices
                        # within patience_band of the best (a tie), is not predicted worse.
                        if (
                            config.patience is not None
                            and stale >= config.patience
                            and (index, tactic) in cuttable
                        ):
                            stopped = "patience"
                            advance()
                            continue
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
                    if median < best * (1.0 - config.guard_margin):
                        stale = 0
                    elif (index, tactic) in estimated:
                        stale += 1
                    best = min(best, median)
                if stopped == "budget":
                    break
                rest = candidates[first + batch_size :]
                if (
                    rest
                    and (
                        stopped == "patience"
                        or (config.patience is not None and stale >= config.patience)
                    )
                    and all(c in cuttable for c in rest)
                ):
                    stopped = "patience"  # nothing left that patience does not cut
                    break
        if stopped:
            self.stats.stopped_early += 1
            logger.info(
                "autotune: %s %s: search cut by %s: %d of %d candidates timed",
                op_name,
                profile,
                stopped,
                len(results),
                len(candidates),
            )

        confirmed = self._confirm(
            op_name, runners, config, tuning_inputs, input_sets, profile, results
        )
        if confirmed is None:
            self.stats.seconds += time.perf_counter() - start
            # Nothing ran, not even the default: not cached, so a later call can retry.
            warnings.warn(
                f"autotune: every candidate of {op_name} at {profile} failed "
                f"(see AutoTuner.get().failures); using {runners[0].name} tactic -1",
                AutotuneWarning,
                stacklevel=4,
            )
            return None
        pick = confirmed[:2]
        guard = self._guard(op_name, runners, config, inputs, profile, pick, defaults)
        kind = "revalidated" if only is not None else ("budget" if stopped == "budget" else "")
        if guard is not None:
            index, tactic = guard.kept
            median = guard.medians.get(guard.kept, confirmed[2])
            if guard.kept != pick:
                self.stats.defaults_kept += 1
            kind = kind or ("tuned" if guard.kept == pick else "default-kept")
            decision = Decision(
                op_name,
                profile,
                runners[index].name,
                tactic,
                kind,
                guard.reason,
                default_ms=guard.medians.get(guard.reference),
                pick_ms=guard.medians.get(pick),
                noise_ms=guard.noise_ms,
                candidates_timed=len(results),
                candidates_pruned=pruned,
            )
        else:  # no guard rounds, or the pick is runner 0's default
            index, tactic, median = confirmed
            decision = Decision(
                op_name,
                profile,
                runners[index].name,
                tactic,
                kind or "tuned",
                "the pick is the default" if pick == defaults[0] else "not guarded",
                pick_ms=median,
                candidates_timed=len(results),
                candidates_pruned=pruned,
            )
        self.decisions[(op_name, profile)] = decision
        elapsed = time.perf_counter() - start
        self.stats.seconds += elapsed
        self.stats.shapes_tuned += 1
        logger.info(
            "autotune: %s %s -> %s tactic %r (%.4f ms; %d candidates in %.2f s; %s)",
            op_name,
            profile,
            runners[index].name,
            tactic,
            median,
            len(candidates),
            elapsed,
            decision.reason,
        )
        return index, tactic

    def _guard(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        config: TuningConfig,
        inputs: Sequence[Any],
        profile: Profile,
        pick: tuple[int, Tactic],
        defaults: Sequence[tuple[int, Tactic]],
    ) -> GuardResult | None:
        """The never-slower-than-default check (selection.guard_pick), on fresh random inputs
        in the serving mode: a CUDA graph where every contender can be captured (else, for
        all of them alike, launches), always cold L2. None: no guard was needed or run."""
        if config.guard_rounds <= 0 or pick == defaults[0]:
            return None
        fresh = make_tuning_inputs(inputs, profile, config)
        serving = replace(config, cold_l2=True)
        fresh_sets = self._input_sets(fresh, serving)
        contenders = [pick, *defaults]
        graph = config.serving == "cuda_graph" and all(
            runners[i].supports_cuda_graph for i, _ in contenders
        )

        def run(use_graph: bool) -> GuardResult | None:
            policy = replace(serving, use_cuda_graph=use_graph)

            def time_once(index: int, tactic: Tactic) -> float | None:
                try:
                    return _time_tactic(runners[index], tactic, fresh, fresh_sets, policy)
                except timing.CaptureError:
                    if use_graph:
                        raise  # like for like: every contender is timed eagerly instead
                    return None
                except Exception as exc:
                    self._fail(op_name, runners[index], tactic, profile, f"guard: {exc!r}")
                    _recover_device(exc)
                    return None

            return guard_pick(pick, defaults, time_once, config.guard_rounds, config.guard_margin)

        try:
            return run(graph)
        except timing.CaptureError:
            return run(False)

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
        if config.compile_processes > 0:
            self._compile_in_processes(runners, candidates, inputs, profile, config)
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

    def _compile_in_processes(
        self,
        runners: Sequence[TunableRunner],
        candidates: list[tuple[int, Tactic]],
        inputs: Sequence[Any],
        profile: Profile,
        config: TuningConfig,
    ) -> int:
        """Run the candidates' `compile_job`s in spawned worker processes; how many ran.

        Spawned, never forked: the tuner's process holds a CUDA context (the tuning inputs
        live on the GPU), and a forked child inherits it in a state CUDA does not support
        (its first CUDA call fails or hangs). A spawned worker starts clean and the jobs
        must not touch CUDA at all. A job that fails costs nothing but the time: the
        `warmup` hook or the first timed call compiles in this process and reports any
        real error as the tactic's failure."""
        jobs = []
        for index, tactic in candidates:
            try:
                job = runners[index].compile_job(inputs, profile, tactic)
            except Exception as exc:
                logger.debug("autotune: compile_job(%r) raised %r", tactic, exc)
                continue
            if job is not None:
                jobs.append(job)
        if not jobs:
            return 0
        pool = self._process_pool(config.compile_processes)
        done = 0
        for future in as_completed([pool.submit(job) for job in jobs]):
            error = future.exception()
            if error is None:
                done += 1
            else:
                logger.debug("autotune: a compile job failed in its worker: %r", error)
        return done

    def _process_pool(self, workers: int) -> ProcessPoolExecutor:
        """The worker processes, started once (spawning costs seconds: each imports torch)
        and kept for the process's lifetime."""
        if self._pool is None or self._pool_size != workers:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("spawn")
            )
            self._pool_size = workers
        return self._pool

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
            self.notices.warn_once(
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


def _nan_safe(x: float) -> float:
    return x if math.isfinite(x) else float("inf")


def default_candidates(runners: Sequence[TunableRunner]) -> list[tuple[int, Tactic]]:
    """The candidates that always compete: runner 0's tactic -1 (the fallback), then the
    tactic -1 of every other runner marked `library` (cuBLAS and the like)."""
    out = [(0, DEFAULT_TACTIC)]
    out += [(i, DEFAULT_TACTIC) for i, r in enumerate(runners) if i and r.library]
    return out


def order_candidates(
    runners: Sequence[TunableRunner],
    candidates: Sequence[tuple[int, Tactic]],
    inputs: Sequence[Any],
    profile: Profile,
    config: TuningConfig,
    defaults: Sequence[tuple[int, Tactic]],
    priors: Sequence[tuple[int, Tactic]],
) -> tuple[list[tuple[int, Tactic]], int, dict[tuple[int, Tactic], float]]:
    """(the candidates in timing order, how many were pruned, {each candidate the cost
    model ranked: its estimate relative to its runner's best estimate}).

    Order: the defaults, then the priors (winners at neighbouring buckets), then the rest
    by the runner's `estimate_cost` relative to its best estimate (no estimate: as listed).
    Pruned: a tactic estimated more than `config.prune_slack` above its runner's best
    estimate, never a default or a prior. Early stopping (patience) then cuts the tail,
    which is why the most promising candidates go first."""
    keep_first = [c for c in defaults if c in candidates]
    # Priors from files hold dataclass tactics in their stored form: match by that form.
    by_form = {(i, stored_form(t)): (i, t) for i, t in candidates}
    for index, tactic in priors:
        form = stored_form(tactic)
        own = by_form.get((index, form))
        if own is None:  # written before the class gained fields (cache_file.matches_stored)
            own = next(
                (c for c in candidates if c[0] == index and matches_stored(c[1], form)), None
            )
        if own is not None and own not in keep_first:
            keep_first.append(own)
    estimates: dict[tuple[int, Tactic], float] = {}
    for c in candidates:
        if c[1] == DEFAULT_TACTIC:
            continue
        try:
            e = runners[c[0]].estimate_cost(inputs, profile, c[1])
        except Exception as exc:  # a cost model bug must not cost the tactic
            logger.debug("autotune: estimate_cost(%r) raised %r", c, exc)
            e = None
        if e is not None and math.isfinite(e) and e > 0:
            estimates[c] = float(e)
    best_of: dict[int, float] = {}
    for (index, _), e in estimates.items():
        best_of[index] = min(best_of.get(index, math.inf), e)
    rest: list[tuple[float, int, tuple[int, Tactic]]] = []
    pruned = 0
    for position, c in enumerate(candidates):
        if c in keep_first:
            continue
        relative = estimates[c] / best_of[c[0]] if c in estimates else 1.0
        if config.prune_slack is not None and relative > 1.0 + config.prune_slack:
            pruned += 1
            continue
        rest.append((relative, position, c))
    rest.sort()
    ordered = keep_first + [c for _, _, c in rest]
    ranked = {c: estimates[c] / best_of[c[0]] for c in ordered if c in estimates}
    return ordered, pruned, {c: r for c, r in ranked.items() if c not in keep_first}

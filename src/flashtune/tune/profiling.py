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
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import torch

from flashtune import timing
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
from flashtune.tune.selection import TacticFailure, TuneStats, confirm_pick

__all__ = ["Profiler"]

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
        self.show_progress = True

    def clear(self) -> None:
        self.failures.clear()
        self.timings.clear()
        self.stats = TuneStats()

    def profile(
        self,
        op_name: str,
        runners: Sequence[TunableRunner],
        config: TuningConfig,
        inputs: Sequence[Any],
        profile: Profile,
    ) -> tuple[int, Tactic] | None:
        """The winner (runner index, tactic) for `profile`; None when every candidate failed,
        not even the default ran (warned; the caller uses the default without caching it)."""
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
            return None
        index, tactic, median = best
        self.stats.shapes_tuned += 1
        logger.info(
            "autotune: %s %s -> %s tactic %r (%.4f ms; %d candidates in %.2f s)",
            op_name,
            profile,
            runners[index].name,
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

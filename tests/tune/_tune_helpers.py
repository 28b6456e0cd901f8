"""Runners with controlled timing (a fake clock) and worker functions for the autotuner
tests; a module of its own so that spawned processes can import it."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from flashtune.timing import Timing
from flashtune.tune import DynamicDim, TunableRunner, TuningConfig

# The fake clock: runners advance it by their tactic's cost; the fake timer reads it.
_clock = threading.local()
# (runner, tactic, shape) -> number of times a tactic was timed
TIMED: Counter = Counter()
_timed_lock = threading.Lock()


def fake_measure(fn: Any, args: Sequence[Any], **kwargs: Any) -> Timing:
    """Stands in for flashtune.timing.measure: one call, timed on the fake clock."""
    _clock.now = 0.0
    fn(*args)
    t = _clock.now
    runner, tactic = fn.args  # functools.partial(_call, runner, tactic)
    with _timed_lock:
        TIMED[(runner.name, tactic, tuple(args[0].shape))] += 1
    return Timing(t, t, t, 0.0, t, 1)


class FakeRunner(TunableRunner):
    """y = 2x. COSTS[tactic] is the fake time of a tactic; BROKEN tactics raise, WRONG ones
    return a wrong result."""

    COSTS: dict[Any, float] = {-1: 5.0, 0: 3.0, 1: 1.0, 2: 2.0}
    BROKEN: frozenset = frozenset()
    WRONG: frozenset = frozenset()

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Any]:
        return [t for t in self.COSTS if t != -1]

    def forward(self, inputs: Sequence[Any], tactic: Any = -1) -> torch.Tensor:
        if tactic in self.BROKEN:
            raise RuntimeError(f"tactic {tactic} is broken")
        _clock.now = getattr(_clock, "now", 0.0) + self.COSTS[tactic]
        y = inputs[0] * 2
        return y + 1 if tactic in self.WRONG else y


class OtherRunner(FakeRunner):
    COSTS = {-1: 4.0, 7: 0.5}


class CompoundRunner(FakeRunner):
    COSTS = {-1: 5.0, (64, (2, 3)): 1.0, (128, (4, 1)): 2.0}


# The fake clock never varies: no confirmation or guard rounds, so every tactic is timed
# exactly once (test_confirmation.py and test_search.py cover them).
CONFIG = TuningConfig(
    dynamic_dims=(DynamicDim(0, 0),), cold_l2=False, confirm_rounds=0, guard_rounds=0
)


def use_fake_clock() -> None:
    from flashtune.tune import profiling

    profiling._measure = fake_measure


def tune_shapes(path: str, rows: Sequence[int], barrier: Any = None, event: Any = None) -> None:
    """Worker: tune `rows` (M values) of op "fake" into `path`, optionally waiting on a
    barrier before the context exits (so that several processes save at once) or setting an
    event once tuned."""
    use_fake_clock()
    from flashtune.tune import autotune, choose_one

    with autotune(True, cache=path):
        for m in rows:
            choose_one("fake", [FakeRunner()], CONFIG, [torch.randn(m, 4)])
        if event is not None:
            event.set()
        if barrier is not None:
            barrier.wait(timeout=120)


def install_fresh_tuner(monkeypatch: Any, tmp_path: Any) -> Any:
    """A new AutoTuner singleton for one test, the fake clock, and no bundled configs."""
    from flashtune.tune import AutoTuner, profiling, store

    tuner = AutoTuner()
    tuner.show_progress = False
    monkeypatch.setattr(AutoTuner, "_instance", tuner)
    monkeypatch.setattr(profiling, "_measure", fake_measure)
    monkeypatch.setattr(store, "BUNDLED_DIR", tmp_path / "no-bundled")
    monkeypatch.setenv("FLASHTUNE_AUTOTUNE_LOAD_BUNDLED", "0")
    TIMED.clear()
    return tuner


class RankRunner(FakeRunner):
    """Costs differ by rank (as noise would on real GPUs): rank 0 finds tactic 1 fastest,
    rank 1 tactic 2; only sharing the picks makes the ranks agree."""

    RANK = 0

    def forward(self, inputs: Sequence[Any], tactic: Any = -1) -> torch.Tensor:
        costs = {-1: 5.0, 0: 3.0, 1: 1.0 + self.RANK * 2, 2: 2.0 - self.RANK}
        _clock.now = getattr(_clock, "now", 0.0) + costs[tactic]
        return inputs[0] * 2


def rank_worker(rank: int, world: int, init_file: str, out: str, phase: str, rows: Any) -> None:
    """Worker of tests/tune/test_ranks.py: joins a gloo group, tunes (or serves) `rows[rank]`
    (M values) inside autotune(cache=<out>/cfg.json), and writes what it saw to
    <out>/<phase>-rank<rank>.json: its picks for every row of every rank after the block,
    what it timed, how many all_gather_object calls it took, and its picks inside the block."""
    import json
    import os

    import torch.distributed as dist

    use_fake_clock()
    from flashtune.tune import autotune, choose_one, sync_ranks

    RankRunner.RANK = rank
    gathers = [0]
    real_gather = dist.all_gather_object

    def counting_gather(*args: Any, **kwargs: Any) -> Any:
        gathers[0] += 1
        return real_gather(*args, **kwargs)

    dist.all_gather_object = counting_gather  # type: ignore[assignment]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        cache = os.path.join(out, "cfg.json")
        inside = []
        with autotune(phase != "serve", cache=cache):
            for m in rows[rank]:
                inside.append(choose_one("ranked", [RankRunner()], CONFIG, [torch.randn(m, 4)])[1])
            if phase == "midsync":  # an explicit sync point inside the block
                sync_ranks()
                for m in rows[rank]:
                    x = torch.randn(m, 4)
                    inside.append(choose_one("ranked", [RankRunner()], CONFIG, [x])[1])
        every = sorted({m for r in rows for m in r})
        picks = {
            str(m): choose_one("ranked", [RankRunner()], CONFIG, [torch.randn(m, 4)])[1]
            for m in every
        }
        timed = [[t, shape[0]] for (_, t, shape), n in TIMED.items() for _ in range(n)]
        result = {"picks": picks, "timed": timed, "gathers": gathers[0], "inside": inside}
        with open(os.path.join(out, f"{phase}-rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def write_marker(folder: str, tactic: Any) -> int:
    """A stand-in compile job: proves it ran, and in which process."""
    import os

    with open(os.path.join(folder, f"{tactic}.{os.getpid()}"), "w") as f:
        f.write("compiled")
    return os.getpid()


class ProcessCompiledRunner(FakeRunner):
    FOLDER = ""

    def compile_job(self, inputs: Sequence[Any], profile: Any, tactic: Any) -> Any:
        import functools

        return None if tactic == -1 else functools.partial(write_marker, self.FOLDER, tactic)


def gemm_rank_worker(rank: int, world: int, init_file: str, out: str, phase: str) -> None:
    """GPU worker of tests/tune/test_guard_cuda.py: NCCL ranks tune the real GEMM together
    (rank r sees its own M values), then report their picks and how much they profiled."""
    import json
    import os

    import torch.distributed as dist

    from flashtune.ops.gemm import mm
    from flashtune.ops.gemm.launch import GEMM_RUNNERS, GEMM_TUNING
    from flashtune.tune import AutoTuner, autotune, choose_one

    torch.cuda.set_device(rank)  # all_gather_object over NCCL uses the current device
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        rows = [[1, 16, 300], [16, 64]][rank]
        every = [1, 16, 64, 300]
        B = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        with autotune(True, cache=os.path.join(out, "gemm.json")):
            for m in rows:
                mm(torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16), B)
        picks = {}
        for m in every:
            A = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            runner, tactic = choose_one("gemm", GEMM_RUNNERS, GEMM_TUNING, [A, B, None])
            picks[str(m)] = [runner.name, list(tactic) if isinstance(tactic, tuple) else tactic]
        stats = AutoTuner.get().stats
        result = {"picks": picks, "tuned": stats.shapes_tuned, "timed": stats.tactics_timed}
        with open(os.path.join(out, f"{phase}-rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()

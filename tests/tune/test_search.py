"""Issue 38 on the CPU, with a fake clock: the tuned pick is never slower than the default
(the guard), the search prunes and stops early and keeps to its budget, a cached pick made
under other versions is re-validated, and the cache's metadata says where it was made."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tune_helpers as H  # noqa: E402

from flashtune.timing import Timing  # noqa: E402
from flashtune.tune import (  # noqa: E402
    AutoTuner,
    AutotuneWarning,
    DynamicDim,
    TuningConfig,
    autotune,
    choose_one,
    load_configs,
    profiling,
)
from flashtune.tune.cache_file import (  # noqa: E402
    current_metadata,
    read_cache_file,
    write_cache_file,
)
from flashtune.tune.selection import guard_pick  # noqa: E402
from flashtune.tune.store import decisions_path  # noqa: E402

DEFAULT = -1
# Guard on, nothing else that re-times: every extra timing below is the guard's.
GUARDED = TuningConfig(
    dynamic_dims=(DynamicDim(0, 0),), cold_l2=False, confirm_rounds=0, guard_rounds=3
)


def unguarded(**options: Any) -> TuningConfig:
    """Each tactic timed once (no cold L2, no confirmation, no guard), with the test's own
    `options`."""
    return TuningConfig(
        dynamic_dims=(DynamicDim(0, 0),),
        cold_l2=False,
        confirm_rounds=0,
        guard_rounds=0,
        **options,
    )


@pytest.fixture
def tuner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AutoTuner:
    return H.install_fresh_tuner(monkeypatch, tmp_path)


def x(m: int) -> torch.Tensor:
    return torch.randn(m, 4)


class Calls:
    """Records every fake measurement: (tactic, its first input, measure's kwargs)."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, torch.Tensor, dict[str, Any]]] = []

    def __call__(self, fn: Any, args: Sequence[Any], **kwargs: Any) -> Timing:
        self.log.append((fn.args[1], args[0], kwargs))
        return H.fake_measure(fn, args, **kwargs)

    def tactics(self) -> list[Any]:
        return [t for t, _, _ in self.log]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tuner: AutoTuner) -> Calls:
    recorder = Calls()
    monkeypatch.setattr(profiling, "_measure", recorder)
    return recorder


# ----------------------------------------------------------------------- the guard
def test_guard_keeps_the_default_unless_the_pick_beats_it_beyond_noise_and_margin() -> None:
    def clock(times: dict[Any, list[float]]):
        def time_once(index: int, tactic: Any) -> float:
            return times[tactic].pop(0)

        return time_once

    # 0.5% faster, steady: within the 1% margin -> the default stays.
    r = guard_pick((0, 1), [(0, DEFAULT)], clock({1: [9.95] * 3, DEFAULT: [10.0] * 3}), 3, 0.01)
    assert r is not None and r.kept == (0, DEFAULT) and "default kept" in r.reason
    # 20% faster in two rounds, 10% slower in the third -> the default stays.
    noisy = {1: [8.0, 11.0, 8.0], DEFAULT: [10.0, 10.0, 10.0]}
    r = guard_pick((0, 1), [(0, DEFAULT)], clock(noisy), 3, 0.01)
    assert r is not None and r.kept == (0, DEFAULT) and r.noise_ms == pytest.approx(1.5)
    # A load spike in round 2 slows both alike: the ratios see through it -> the pick.
    spiky = {1: [5.0, 15.0, 5.0], DEFAULT: [10.0, 30.0, 10.0]}
    r = guard_pick((0, 1), [(0, DEFAULT)], clock(spiky), 3, 0.01)
    assert r is not None and r.kept == (0, 1) and r.noise_ms == 0.0
    # Faster in every round but by less than the spread of the speed-ups -> the default.
    jitter = {1: [9.9, 7.0, 9.9], DEFAULT: [10.0, 10.0, 10.0]}
    r = guard_pick((0, 1), [(0, DEFAULT)], clock(jitter), 3, 0.01)
    assert r is not None and r.kept == (0, DEFAULT)
    # 20% faster, steady -> the pick.
    r = guard_pick((0, 1), [(0, DEFAULT)], clock({1: [8.0] * 3, DEFAULT: [10.0] * 3}), 3, 0.01)
    assert r is not None and r.kept == (0, 1) and r.medians[(0, 1)] == 8.0
    # A library default (runner 1's -1) faster than runner 0's is the reference: a pick
    # that only beats runner 0's default is not kept.
    lib = {(0, 1): [8.0] * 3, (0, DEFAULT): [10.0] * 3, (1, DEFAULT): [7.9] * 3}
    r = guard_pick((0, 1), [(0, DEFAULT), (1, DEFAULT)], lambda i, t: lib[(i, t)].pop(0), 3, 0.01)
    assert r is not None and r.kept == (1, DEFAULT) and r.reference == (1, DEFAULT)


class SlightlyFaster(H.FakeRunner):
    """Tactic 1 is 0.5% faster than the default: a pick by noise on a real GPU."""

    COSTS = {DEFAULT: 10.0, 1: 9.95, 2: 12.0}


class MuchFaster(H.FakeRunner):
    COSTS = {DEFAULT: 10.0, 1: 5.0, 2: 12.0}


def test_a_pick_within_the_margin_leaves_the_default_and_the_cache_says_why(
    tuner: AutoTuner, calls: Calls, tmp_path: Path
) -> None:
    path = tmp_path / "cfg.json"
    with autotune(True, cache=path):
        assert choose_one("op", [SlightlyFaster()], GUARDED, [x(8)])[1] == DEFAULT
        assert choose_one("op", [MuchFaster()], GUARDED, [x(64)])[1] == 1
    assert tuner.stats.defaults_kept == 1
    kept = tuner.decisions[("op", ((8, 4),))]
    assert kept.kind == "default-kept" and kept.pick_ms == 9.95 and kept.default_ms == 10.0
    assert tuner.decisions[("op", ((64, 4),))].kind == "tuned"
    # The cache stays in FlashInfer's format (only _metadata / _last_updated_by besides the
    # tuple keys); the why is in the file beside it.
    doc = json.loads(path.read_text())
    assert {k for k in doc if k.startswith("_")} == {"_metadata", "_last_updated_by"}
    assert doc[str(("op", "SlightlyFaster", ((8, 4),)))] == ["SlightlyFaster", DEFAULT]
    why = json.loads(decisions_path(path).read_text())
    record = why[repr(("op", ((8, 4),)))]
    assert record["kind"] == "default-kept" and "not beyond" in record["reason"]


def test_the_guard_times_fresh_inputs_in_the_serving_mode(calls: Calls) -> None:
    with autotune():
        choose_one("op", [MuchFaster()], GUARDED, [x(8)])
    # Search: -1, 1, 2 once each; guard: pick and default, three rounds in turns.
    assert calls.tactics() == [DEFAULT, 1, 2] + [1, DEFAULT] * 3
    search, guard = calls.log[:3], calls.log[3:]
    assert all(not kw["cold_l2"] and not kw["use_cuda_graph"] for _, _, kw in search)
    # Serving mode: a CUDA graph (the runners support one) and cold L2, whatever the
    # config's search settings; on the CPU measure() times host calls either way.
    assert all(kw["cold_l2"] and kw["use_cuda_graph"] for _, _, kw in guard)
    assert not torch.equal(search[0][1], guard[0][1])  # other random values


# ---------------------------------------------------------------------- the search
class Tiles(H.FakeRunner):
    """Tactics 0..9 cost 10 - t (9 is the best); the cost model knows tactics 0..4 pad
    half their work away."""

    COSTS = {DEFAULT: 20.0, **{t: 10.0 - t for t in range(10)}}

    def estimate_cost(self, inputs: Sequence[Any], profile: Any, tactic: Any) -> float | None:
        return 2.0 if tactic < 5 else 1.0


def test_the_cost_model_prunes_before_anything_is_compiled_or_timed(
    tuner: AutoTuner, calls: Calls
) -> None:
    cfg = unguarded(prune_slack=0.5)
    with autotune():
        assert choose_one("op", [Tiles()], cfg, [x(8)])[1] == 9
    assert sorted(calls.tactics(), key=str) == sorted([DEFAULT, 5, 6, 7, 8, 9], key=str)
    assert tuner.stats.tactics_pruned == 5
    assert tuner.decisions[("op", ((8, 4),))].candidates_pruned == 5


class Flat(H.FakeRunner):
    """30 tactics: 0 is the best, the rest are all alike; the cost model ranks them as
    listed, 10% apart (tactic t estimated 1 + t / 10)."""

    COSTS = {DEFAULT: 9.0, 0: 1.0, **{t: 5.0 for t in range(1, 30)}}

    def estimate_cost(self, inputs: Sequence[Any], profile: Any, tactic: Any) -> float | None:
        return 1.0 + tactic / 10


class Unranked(H.FakeRunner):
    COSTS = Flat.COSTS


class Tied(H.FakeRunner):
    """The cost model cannot tell the tactics apart (all estimated within 3% of each other,
    as the GEMM model prices every M=1 tactic), and the fastest is listed 20th."""

    COSTS = {DEFAULT: 9.0, **{t: 5.0 for t in range(30)}, 20: 1.0}

    def estimate_cost(self, inputs: Sequence[Any], profile: Any, tactic: Any) -> float | None:
        return 1.0 + tactic / 1000


def test_patience_does_not_cut_the_tactics_the_cost_model_ties(
    tuner: AutoTuner, calls: Calls
) -> None:
    with autotune():
        assert choose_one("op", [Tied()], unguarded(patience=4), [x(8)])[1] == 20
        assert len(calls.tactics()) == 31  # every tie timed
        calls.log.clear()
        # A band narrower than the ties' spread: patience cuts after 4 that do not improve
        # (another op: "op"'s winner would be a prior).
        cfg = unguarded(patience=4, patience_band=0.001)
        assert choose_one("other", [Tied()], cfg, [x(8)])[1] != 20
        assert len(calls.tactics()) < 31


def test_patience_stops_the_search_and_priors_go_first(tuner: AutoTuner, calls: Calls) -> None:
    cfg = unguarded(patience=4)
    with autotune():
        assert choose_one("op", [Flat()], cfg, [x(8)])[1] == 0
        # -1, 0 (the best), then 4 that do not beat it: stopped.
        assert calls.tactics() == [DEFAULT, 0, 1, 2, 3, 4]
        calls.log.clear()
        # A neighbouring bucket: the winner at 8 is timed right after the default.
        assert choose_one("op", [Flat()], cfg, [x(16)])[1] == 0
        assert calls.tactics()[:2] == [DEFAULT, 0]
        calls.log.clear()
        # Another fixed dimension (a layer of another width) is a neighbour too.
        assert choose_one("op", [Flat()], cfg, [torch.randn(8, 6)])[1] == 0
        assert calls.tactics()[:2] == [DEFAULT, 0]
        calls.log.clear()
        # Without a cost model nothing ranks the tail: every tactic is timed.
        choose_one("op", [Unranked()], cfg, [x(8)])
        assert len(calls.tactics()) == 31
    assert tuner.stats.stopped_early == 3


class Slow(H.FakeRunner):
    """Each call advances a fake wall clock (the one the budgets read) by 10 ms."""

    COSTS = {DEFAULT: 9.0, **{t: 5.0 - t / 100 for t in range(50)}}
    WALL = [0.0]

    def forward(self, inputs: Sequence[Any], tactic: Any = -1) -> torch.Tensor:
        self.WALL[0] += 0.01
        return super().forward(inputs, tactic)


def test_a_bucket_budget_returns_the_best_so_far_and_the_session_budget_stops_tuning(
    tuner: AutoTuner, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from flashtune.tune import tuner as tuner_module

    # The budgets read perf_counter in these two modules: a clock only Slow moves, so the
    # test does not depend on how loaded the machine is.
    clock = SimpleNamespace(perf_counter=lambda: Slow.WALL[0])
    monkeypatch.setattr(profiling, "time", clock)
    monkeypatch.setattr(tuner_module, "time", clock)
    cfg = unguarded(patience=None)
    with autotune(budget_s=0.15):
        runner, tactic = choose_one("op", [Slow()], cfg, [x(8)])
    # 20 ms for the default (the baseline, its timing), 20 ms per tactic (its check, its
    # timing); a tactic starts if the budget is not spent: seven start before 150 ms.
    timed = calls.tactics()
    assert timed == [DEFAULT, 0, 1, 2, 3, 4, 5, 6]
    assert tactic == 6  # the best of those timed
    assert tuner.decisions[("op", ((8, 4),))].kind == "budget"
    calls.log.clear()
    with autotune(session_budget_s=0.05):
        choose_one("op", [Slow()], cfg, [x(64)])  # spends the session's budget
        assert len(calls.log) < 5
        with pytest.warns(AutotuneWarning, match="time budget is spent"):
            assert choose_one("op", [Slow()], cfg, [x(256)])[1] == DEFAULT
    assert ("op", "Slow", ((256, 4),)) not in tuner.profiling_cache  # a later session tunes it
    with pytest.raises(ValueError, match="budget_s"):
        with autotune(budget_s=0):
            pass


# ------------------------------------------------------------- environment changes
def test_metadata_names_the_device_and_accepts_files_written_before_that(
    tmp_path: Path, tuner: AutoTuner
) -> None:
    meta = current_metadata()
    assert {"device_capability", "driver_version", "gpu_name", "torch_version"} <= set(meta)
    old = {k: v for k, v in meta.items() if k not in ("device_capability", "driver_version")}
    path = tmp_path / "old.json"
    write_cache_file(path, {("op", "FakeRunner", ((8, 4),)): ("FakeRunner", 1)}, old)
    assert load_configs(path) == 1
    write_cache_file(path, {}, dict(meta, device_capability="10.0"))
    assert read_cache_file(path).status == "mismatch"


def test_a_pick_cached_under_other_versions_is_revalidated_not_searched(
    tmp_path: Path, tuner: AutoTuner, calls: Calls
) -> None:
    path = tmp_path / "cfg.json"
    key = ("op", "MuchFaster", ((8, 4),))
    stale = {key: ("MuchFaster", 2), ("op", "MuchFaster", ((16, 4),)): ("MuchFaster", 1)}
    write_cache_file(path, stale, dict(current_metadata(), torch_version="2.0.0"))
    # Serving never uses an unvalidated pick.
    with pytest.warns(AutotuneWarning, match="another environment"):
        with autotune(False, cache=path):
            assert choose_one("op", [MuchFaster()], GUARDED, [x(8)])[1] == DEFAULT
    assert calls.log == []
    with pytest.warns(AutotuneWarning, match="re-validated"):
        with autotune(True, cache=path):
            # Tactic 2 (12 ms) no longer beats the default (10 ms): only they are timed.
            assert choose_one("op", [MuchFaster()], GUARDED, [x(8)])[1] == DEFAULT
    assert set(calls.tactics()) == {DEFAULT, 2}
    assert tuner.decisions[("op", ((8, 4),))].kind == "revalidated"
    found = read_cache_file(path)
    assert found.status == "ok" and found.entries == {key: ("MuchFaster", DEFAULT)}
    assert list(tmp_path.glob("cfg.json.*.bak"))  # the old file is kept


def test_another_gpus_file_is_still_never_revalidated(tmp_path: Path, tuner: AutoTuner) -> None:
    path = tmp_path / "cfg.json"
    write_cache_file(path, {}, dict(current_metadata(), gpu_name="NVIDIA B200"))
    before = path.read_bytes()
    with pytest.warns(AutotuneWarning, match="gpu_name"):
        with autotune(True, cache=path):
            choose_one("op", [MuchFaster()], GUARDED, [x(8)])
    assert path.read_bytes() == before and not tuner.store.stale_configs


def test_tile_cost_sees_padding_loads_and_idle_sms() -> None:
    from flashtune.tune.search import padding_waste, tile_cost, wave_efficiency

    assert padding_waste((17, 64), (128, 64)) == pytest.approx(1 - 17 / 128)
    assert padding_waste((128, 128), (64, 64)) == 0.0
    assert wave_efficiency(132, 132) == 1.0 and wave_efficiency(133, 132) == pytest.approx(
        133 / 264
    )
    # Decode (M=1) is priced by its loads: a 16-row tensor-core tile costs what a 1-row one
    # does, though it computes 16x the rows.
    assert tile_cost(1, 4096, 4096, 16, 64, 128) == tile_cost(1, 4096, 4096, 1, 64, 512)
    # A large GEMM on 16x16 tiles re-reads A and B 256 times: far worse than 128x128.
    assert tile_cost(4096, 4096, 4096, 16, 16, 64) > 5 * tile_cost(4096, 4096, 4096, 128, 128, 64)
    # Split-K fills the SMs of a tiny grid: 32 tiles on 132 SMs, split 4 -> 128 CTAs.
    assert tile_cost(16, 4096, 4096, 16, 128, 64, 4) < tile_cost(16, 4096, 4096, 16, 128, 64) / 3
    # Splits that fill the SMs alike differ by their fp32 partials: the smaller is cheaper
    # (64 tiles: split 2 -> 128 CTAs, split 4 -> 256, both about whole waves).
    assert tile_cost(8, 4096, 4096, 16, 64, 128, 2) < tile_cost(8, 4096, 4096, 16, 64, 128, 4)
    with pytest.raises(ValueError, match="must be > 0"):
        padding_waste((0,), (16,))


def test_tile_cost_with_the_l2_stream_k_and_bandwidth_waves_off() -> None:
    from flashtune.tune.search import tile_cost, wave_efficiency

    l2 = 50 * 2**20
    # 64 x 14336 bf16 activations (1.8 MB) re-read by 64 CTA columns: from L2, at a quarter.
    hbm = tile_cost(64, 4096, 14336, 64, 64, 128, 2)
    with_l2 = tile_cost(64, 4096, 14336, 64, 64, 128, 2, l2_bytes=l2)
    a_rereads = 2 * 64 * 14336 * 63  # bytes; the grid: 64 tiles x split 2 on 132 SMs
    assert hbm - with_l2 == pytest.approx(0.75 * a_rereads / wave_efficiency(128, 132))
    # An operand larger than half the L2 (4096 x 4096 bf16, 32 MB) is re-read from HBM.
    big = tile_cost(4096, 4096, 4096, 128, 128, 64)
    assert tile_cost(4096, 4096, 4096, 128, 128, 64, l2_bytes=l2) == big
    # Stream-K keeps every SM busy: a 48-tile grid (M=1, N=3072, 64-wide tiles) on 132 SMs
    # costs far less than the same tiles run as a bare grid.
    bare = tile_cost(1, 3072, 4096, 16, 64, 128)
    assert tile_cost(1, 3072, 4096, 16, 64, 128, stream_k=1) < bare / 2
    # Without waves on the bytes, a memory-bound grid smaller than the SMs is not penalised:
    # 96 CTAs at M=16 N=6144 cost their bytes, like 384 CTAs of split 8 (plus partials).
    few = tile_cost(16, 6144, 4096, 16, 64, 256, l2_bytes=l2, bandwidth_waves=False)
    split = tile_cost(16, 6144, 4096, 16, 128, 128, 8, l2_bytes=l2, bandwidth_waves=False)
    assert few < split
    assert tile_cost(16, 6144, 4096, 16, 64, 256) > split  # with waves on the bytes: worse


def test_the_gemm_runners_estimate_their_tactics() -> None:
    from flashtune.ops.gemm.launch import GEMM_RUNNERS, GEMM_TUNING
    from flashtune.tune.runner import make_profile

    A, B = torch.randn(16, 4096, dtype=torch.float16), torch.randn(6144, 4096, dtype=torch.float16)
    profile = make_profile([A, B, None], GEMM_TUNING)
    ranked = 0
    for runner in GEMM_RUNNERS:
        for tactic in runner.get_valid_tactics([A, B, None], profile):
            estimate = runner.estimate_cost([A, B, None], profile, tactic)
            assert estimate is not None and math.isfinite(estimate) and estimate > 0
            ranked += 1
    assert ranked > 10  # the Triton runners offer tactics at M=16, and each is priced


def test_layouts_are_part_of_the_key_and_tuned_as_called(tuner: AutoTuner, calls: Calls) -> None:
    cfg = unguarded(key_layouts=True, key_dtypes=True)
    row_major = torch.randn(8, 4)
    col_major = torch.randn(4, 8).t()
    with autotune():
        choose_one("op", [MuchFaster()], cfg, [row_major])
        choose_one("op", [MuchFaster()], cfg, [col_major])
    assert {k[2] for k in tuner.profiling_cache} == {
        ((8, 4), ("float32",), ("c",)),
        ((8, 4), ("float32",), ("t",)),
    }
    # The second bucket was timed on transposed inputs, like the call's.
    layouts = {args.is_contiguous() for _, args, _ in calls.log}
    assert layouts == {True, False}


@pytest.mark.slow
def test_compile_jobs_run_in_spawned_processes(tuner: AutoTuner, tmp_path: Path) -> None:
    import os

    H.ProcessCompiledRunner.FOLDER = str(tmp_path)
    cfg = unguarded(compile_processes=2)
    with autotune():
        assert choose_one("op", [H.ProcessCompiledRunner()], cfg, [x(8)])[1] == 1
    markers = [p.name.split(".") for p in tmp_path.iterdir() if p.name[0].isdigit()]
    assert sorted(t for t, _ in markers) == ["0", "1", "2"]
    assert all(int(pid) != os.getpid() for _, pid in markers)


def test_a_stale_file_is_not_rewritten_when_nothing_was_revalidated(
    tmp_path: Path, tuner: AutoTuner
) -> None:
    path = tmp_path / "cfg.json"
    write_cache_file(
        path,
        {("op", "MuchFaster", ((8, 4),)): ("MuchFaster", 1)},
        dict(current_metadata(), triton_version="0.0"),
    )
    before = path.read_bytes()
    with pytest.warns(AutotuneWarning, match="re-validated"):
        with autotune(True, cache=path):
            pass  # no shape seen
    assert path.read_bytes() == before and not list(tmp_path.glob("*.bak"))


class LateBest(Flat):
    """The cost model ranks tactic 29 last, but it is the fastest."""

    COSTS = {DEFAULT: 9.0, **{t: 5.0 for t in range(29)}, 29: 1.0}


def test_another_gpus_picks_are_priors_when_tuning(
    tmp_path: Path, tuner: AutoTuner, calls: Calls
) -> None:
    cfg = unguarded(patience=4)
    with autotune():  # no prior: patience cuts the ranked list long before tactic 29
        assert choose_one("op", [LateBest()], cfg, [x(8)])[1] != 29
    tuner.clear()
    calls.log.clear()
    path = tmp_path / "b200.json"
    entry = {("op", "LateBest", ((8, 4),)): ("LateBest", 29)}
    write_cache_file(path, entry, dict(current_metadata(), gpu_name="NVIDIA B200"))
    with pytest.warns(AutotuneWarning, match="gpu_name"):
        with autotune(True, cache=path):
            assert choose_one("op", [LateBest()], cfg, [x(8)])[1] == 29
    assert calls.tactics()[:2] == [DEFAULT, 29]  # timed right after the default
    with pytest.warns(AutotuneWarning, match="gpu_name"):
        with autotune(False, cache=path):  # serving never uses another GPU's pick
            assert choose_one("op", [LateBest()], cfg, [x(16)])[1] == DEFAULT


class FlatWarm(Flat):
    WARMED: list = []

    def warmup(self, inputs: Sequence[Any], tactic: Any) -> None:
        self.WARMED.append(tactic)


def test_what_patience_cuts_is_never_compiled(tuner: AutoTuner, calls: Calls) -> None:
    cfg = unguarded(patience=4, compile_workers=3)
    FlatWarm.WARMED.clear()
    with autotune():
        assert choose_one("op", [FlatWarm()], cfg, [x(8)])[1] == 0
    assert calls.tactics() == [DEFAULT, 0, 1, 2, 3, 4]
    # Compiled in batches of three, in timing order: two batches, nothing of the tail.
    assert sorted(FlatWarm.WARMED, key=str) == sorted([DEFAULT, 0, 1, 2, 3, 4], key=str)

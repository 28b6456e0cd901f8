"""AutoTuner behaviour on CPU with runners whose timing is a fake clock (or real CPU work)."""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import threading
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _tune_helpers, also for spawn

import _tune_helpers as H  # noqa: E402

from flashtune.tune import (  # noqa: E402
    AutoTuner,
    AutotuneWarning,
    DynamicDim,
    TunableRunner,
    TuningConfig,
    autotune,
    bucket_values,
    choose_one,
    load_configs,
    lookup,
    pow2_bucketer,
    pow2_buckets,
    profiling,
    store,
)
from flashtune.tune.cache_file import current_metadata, read_cache_file  # noqa: E402
from flashtune.tune.runner import make_profile  # noqa: E402

CFG = H.CONFIG


@pytest.fixture(autouse=True)
def fresh_tuner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AutoTuner:
    """A new singleton per test, the fake clock, and no bundled configs unless asked."""
    return H.install_fresh_tuner(monkeypatch, tmp_path)


def x(m: int, k: int = 4) -> torch.Tensor:
    return torch.randn(m, k)


def profiled(m_bucket: int, runner: str = "FakeRunner", k: int = 4) -> int:
    """How many tactics of `runner` were timed at bucket shape (m_bucket, k)."""
    return sum(n for (r, _, shape), n in H.TIMED.items() if r == runner and shape == (m_bucket, k))


def write_config(path: Path, entries: dict, metadata: dict | None = None) -> None:
    doc = {"_metadata": dict(current_metadata()) if metadata is None else metadata}
    doc.update({str(k): list(v) for k, v in entries.items()})
    path.write_text(json.dumps(doc))


# --------------------------------------------------------------------------- buckets
@pytest.mark.parametrize(
    "value,bucket",
    [
        (0, 1),
        (1, 1),
        (2, 2),
        (3, 4),
        (4, 4),
        (5, 8),
        (8, 8),
        (9, 16),
        (4097, 8192),
        (8191, 8192),
        (8192, 8192),
        (8193, 8192),
        (10**6, 8192),
    ],
)
def test_pow2_bucket_boundaries(value: int, bucket: int) -> None:
    assert pow2_buckets(value) == bucket


def test_bucketer_cap_and_enumeration() -> None:
    b = pow2_bucketer(16)
    assert [b(v) for v in (15, 16, 17, 1000)] == [16, 16, 16, 16]
    assert bucket_values(b) == [1, 2, 4, 8, 16]
    assert bucket_values(pow2_buckets) == [2**i for i in range(14)]
    assert DynamicDim(0, 0, b).buckets() == [1, 2, 4, 8, 16]


def test_profile_dynamic_dims_and_constraints() -> None:
    cfg = TuningConfig(
        dynamic_dims=(DynamicDim(0, -2),),  # negative dims count from the end
        constraints=((1, 0, lambda shapes: shapes[0][0]),),  # input 1 has M rows too
    )
    a, s, w = torch.randn(5, 3), torch.randn(5), torch.randn(7, 3)
    assert make_profile([a, s, w, None, 2.0], cfg) == ((8, 3), (8,), (7, 3), (), ())


def test_shapes_in_one_bucket_are_profiled_once() -> None:
    with autotune():
        for m in (5, 6, 7, 8):  # all bucket 8
            choose_one("fake", [H.FakeRunner()], CFG, [x(m)])
        assert profiled(8) == 4  # -1, 0, 1, 2 once each
        choose_one("fake", [H.FakeRunner()], CFG, [x(9)])  # bucket 16: new profile
        assert profiled(16) == 4
        assert choose_one("fake", [H.FakeRunner()], CFG, [x(4)])[1] == 1
    assert profiled(4) == 4


# --------------------------------------------------------------------------- choose / priority
def test_tuning_picks_fastest_across_runners() -> None:
    runners = [H.FakeRunner(), H.OtherRunner()]
    assert choose_one("fake", runners, CFG, [x(3)]) == (runners[0], -1)  # not tuning: fallback
    assert profiled(4) == 0
    with autotune():
        runner, tactic = choose_one("fake", runners, CFG, [x(3)])
    assert (runner, tactic) == (runners[1], 7)
    assert AutoTuner.get().profiling_cache == {
        ("fake", "OtherRunner", ((4, 4),)): ("OtherRunner", 7)
    }
    # Outside the context the in-memory result is still used.
    assert choose_one("fake", runners, CFG, [x(4)]) == (runners[1], 7)


def test_lookup_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_tuner: AutoTuner
) -> None:
    runners = [H.FakeRunner()]
    key = ("fake", "FakeRunner", ((4, 4),))
    bundled_dir = tmp_path / "bundled"
    bundled_dir.mkdir()
    write_config(bundled_dir / "gpu.json", {key: ("FakeRunner", 2)})
    monkeypatch.setattr(store, "BUNDLED_DIR", bundled_dir)
    user = tmp_path / "user.json"
    write_config(user, {key: ("FakeRunner", 0)})

    # 4. fallback, with bundled configs switched off.
    assert choose_one("fake", runners, CFG, [x(4)])[1] == -1
    # 3. bundled, with the setting on and not tuning.
    monkeypatch.setenv("FLASHTUNE_AUTOTUNE_LOAD_BUNDLED", "1")
    fresh_tuner.clear()
    assert choose_one("fake", runners, CFG, [x(4)])[1] == 2
    # ...but never while tuning: the shape is profiled instead.
    with autotune():
        assert choose_one("fake", runners, CFG, [x(4)])[1] == 1
    assert profiled(4) == 4
    fresh_tuner.clear()
    # 2. a user-loaded file beats bundled configs, and is used while tuning (no profiling).
    assert load_configs(user) == 1
    assert choose_one("fake", runners, CFG, [x(4)])[1] == 0
    H.TIMED.clear()
    with autotune():
        assert choose_one("fake", runners, CFG, [x(3)])[1] == 0
    assert profiled(4) == 0
    # 1. the in-memory profiling cache beats everything.
    fresh_tuner.profiling_cache[key] = ("FakeRunner", 1)
    fresh_tuner.set_tune_mode(False)  # (any state change drops memoized answers)
    assert choose_one("fake", runners, CFG, [x(4)])[1] == 1


def test_file_entry_for_absent_runner_or_stale_tactic_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write_config(
        path,
        {
            ("fake", "GoneRunner", ((4, 4),)): ("GoneRunner", 3),
            ("fake", "FakeRunner", ((8, 4),)): ("FakeRunner", 99),  # no longer offered
        },
    )
    load_configs(path)
    assert choose_one("fake", [H.FakeRunner()], CFG, [x(4)])[1] == -1
    with pytest.warns(AutotuneWarning, match="no longer offers"):
        assert choose_one("fake", [H.FakeRunner()], CFG, [x(8)])[1] == -1


def test_failing_and_wrong_tactics_are_excluded_and_reported(
    monkeypatch: pytest.MonkeyPatch, fresh_tuner: AutoTuner
) -> None:
    monkeypatch.setattr(H.FakeRunner, "BROKEN", frozenset({1}))
    monkeypatch.setattr(H.FakeRunner, "WRONG", frozenset({2}))
    with autotune():
        runner, tactic = choose_one("fake", [H.FakeRunner()], CFG, [x(4)])
    assert tactic == 0  # 1 and 2 are faster, but raise / compute the wrong thing
    reasons = {f.tactic: f.reason for f in fresh_tuner.failures}
    assert set(reasons) == {1, 2}
    assert "broken" in reasons[1]
    assert "wrong result" in reasons[2]
    assert fresh_tuner.stats.tactics_failed == 2


def test_in_place_tactics_are_checked_on_untouched_inputs(fresh_tuner: AutoTuner) -> None:
    """A runner that updates an input in place (fused add + RMSNorm's residual): timing one
    tactic changes the tuning inputs, so each tactic's check must start from a copy taken
    before any timing, or every tactic after the first would look wrong."""

    class Accumulate(H.FakeRunner):
        def forward(self, inputs, tactic=-1):  # type: ignore[override]
            H.FakeRunner.forward(self, inputs, tactic)  # the fake clock
            inputs[1].add_(inputs[0])  # residual += x, as the fused op does
            return inputs[1] * 2

    with autotune():
        tactic = choose_one("acc", [Accumulate()], CFG, [x(4), torch.randn(4, 4)])[1]
    assert fresh_tuner.failures == []
    assert tactic == 1  # the fastest, no longer excluded as "wrong"


def test_no_profiling_during_cuda_graph_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lookup, "_is_capturing", lambda: True)
    with autotune():
        with pytest.warns(AutotuneWarning, match="captured") as record:
            assert choose_one("fake", [H.FakeRunner()], CFG, [x(4)])[1] == -1
            assert choose_one("fake", [H.FakeRunner()], CFG, [x(4)])[1] == -1
        assert len([w for w in record if "captured" in str(w.message)]) == 1  # warned once
        assert profiled(4) == 0
        monkeypatch.setattr(lookup, "_is_capturing", lambda: False)
        assert choose_one("fake", [H.FakeRunner()], CFG, [x(4)])[1] == 1  # tuned after capture


def test_parallel_warmup_hook(fresh_tuner: AutoTuner) -> None:
    threads: set[str] = set()
    # Two warm-ups must be inside `warmup` at once to pass the barrier: run one after the
    # other, they would break it (the timeout guards against a hang, it is no speed limit).
    together = threading.Barrier(2, timeout=60)

    class Compiled(H.FakeRunner):
        def warmup(self, inputs, tactic):  # type: ignore[override]
            threads.add(threading.current_thread().name)
            together.wait()
            if tactic == 1:
                raise RuntimeError("ptxas: out of registers")

    with autotune():
        assert choose_one("fake", [Compiled()], CFG, [x(4)])[1] == 2
    assert not together.broken
    assert threads and all(t.startswith("flashtune-compile") for t in threads)
    assert [f.tactic for f in fresh_tuner.failures] == [1]
    assert "out of registers" in fresh_tuner.failures[0].reason


def test_real_cpu_work_with_the_real_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiling, "_measure", profiling.timing.measure)

    class Work(TunableRunner):
        # tactic t does the matmul t times (the default 64 times): 1 is the fastest, by a
        # margin (32x) that a noisy shared CI machine does not reverse.
        def get_valid_tactics(self, inputs, profile):
            return [1, 32]

        def forward(self, inputs, tactic=-1):
            a = inputs[0]
            for _ in range(64 if tactic == -1 else tactic):
                y = a @ a.T
            return y

    cfg = TuningConfig(dynamic_dims=(DynamicDim(0, 0),), warmup=1, repetitions=5)
    # One intra-op thread: on a loaded shared machine, matmul threads waiting for each other
    # at every barrier made single samples of the 1-matmul tactic slower than 64 matmuls.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with autotune() as tuner:
            assert choose_one("work", [Work()], cfg, [torch.randn(64, 64)])[1] == 1, (
                tuner.timings,
                tuner.decisions,
            )
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------- behaviour table
def test_autotune_call_forms_are_equivalent(fresh_tuner: AutoTuner) -> None:
    for ctx in (autotune(), autotune(True), autotune(tune_mode=True)):
        with ctx:
            assert fresh_tuner.tune_mode
        assert not fresh_tuner.tune_mode


def test_true_with_path_loads_tunes_and_saves_incrementally(tmp_path: Path) -> None:
    path = tmp_path / "cfg.json"
    old = ("fake", "FakeRunner", ((4, 4),))
    write_config(path, {old: ("FakeRunner", 0)})
    with autotune(True, cache=path):
        assert choose_one("fake", [H.FakeRunner()], CFG, [x(4)])[1] == 0  # from the file
        assert choose_one("fake", [H.FakeRunner()], CFG, [x(16)])[1] == 1  # tuned
    assert profiled(4) == 0 and profiled(16) == 4
    saved = read_cache_file(path)
    assert saved.status == "ok"
    assert saved.entries == {
        old: ("FakeRunner", 0),
        ("fake", "FakeRunner", ((16, 4),)): ("FakeRunner", 1),
    }


def test_true_with_new_path_creates_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "new.json"
    with autotune(True, cache=str(path)):
        choose_one("fake", [H.FakeRunner()], CFG, [x(2)])
    doc = json.loads(path.read_text())
    assert doc["_metadata"] == current_metadata()
    assert doc[str(("fake", "FakeRunner", ((2, 4),)))] == ["FakeRunner", 1]


def test_true_without_path_tunes_in_memory_only(tmp_path: Path, fresh_tuner: AutoTuner) -> None:
    with autotune(True):
        assert choose_one("fake", [H.FakeRunner()], CFG, [x(2)])[1] == 1
    assert list(tmp_path.iterdir()) == []
    assert fresh_tuner.profiling_cache  # kept for the process
    assert choose_one("fake", [H.FakeRunner()], CFG, [x(2)])[1] == 1


def test_false_with_path_loads_and_never_saves(tmp_path: Path) -> None:
    path = tmp_path / "cfg.json"
    write_config(path, {("fake", "FakeRunner", ((4, 4),)): ("FakeRunner", 2)})
    before = path.read_bytes()
    with autotune(False, cache=path):
        assert choose_one("fake", [H.FakeRunner()], CFG, [x(3)])[1] == 2
        assert choose_one("fake", [H.FakeRunner()], CFG, [x(64)])[1] == -1  # not profiled
    assert profiled(64) == 0
    assert path.read_bytes() == before
    with autotune(False, cache=tmp_path / "absent.json"):  # a missing file is fine
        pass
    assert not (tmp_path / "absent.json").exists()


def test_false_without_path_changes_nothing(tmp_path: Path, fresh_tuner: AutoTuner) -> None:
    with autotune(False):
        assert not fresh_tuner.tune_mode
        assert choose_one("fake", [H.FakeRunner()], CFG, [x(2)])[1] == -1
    assert not fresh_tuner.tune_mode and not fresh_tuner.profiling_cache
    assert list(tmp_path.iterdir()) == []
    with autotune(True):  # nested inside tuning it means "no profiling here"
        with autotune(False):
            assert choose_one("fake", [H.FakeRunner()], CFG, [x(8)])[1] == -1
        assert fresh_tuner.tune_mode
    assert profiled(8) == 0


# --------------------------------------------------------------------------- files
def test_metadata_mismatch_skips_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "other_gpu.json"
    meta = dict(current_metadata(), gpu_name="NVIDIA B200")
    write_config(path, {("fake", "FakeRunner", ((4, 4),)): ("FakeRunner", 2)}, meta)
    before = path.read_bytes()
    with pytest.warns(AutotuneWarning, match=r"gpu_name.*another cache path"):
        assert load_configs(path) == 0
    with pytest.warns(AutotuneWarning, match="gpu_name"):
        with autotune(True, cache=path):
            assert choose_one("fake", [H.FakeRunner()], CFG, [x(4)])[1] == 1  # profiled
    assert path.read_bytes() == before  # never overwritten


@pytest.mark.parametrize("field", ["torch_version", "flashtune_version", "cuda_version"])
def test_metadata_wildcard_and_missing_field(tmp_path: Path, field: str) -> None:
    path = tmp_path / "c.json"
    entries = {("fake", "FakeRunner", ((4, 4),)): ("FakeRunner", 2)}
    write_config(path, entries, dict(current_metadata(), **{field: "*"}))
    assert load_configs(path) == 1
    meta = dict(current_metadata())
    del meta[field]
    write_config(path, entries, meta)
    with pytest.warns(AutotuneWarning, match=field):
        assert load_configs(path) == 0
    write_config(path, entries, dict(current_metadata(), **{field: "0.0-other"}))
    with pytest.warns(AutotuneWarning, match=field):
        assert load_configs(path) == 0


def test_compound_tactics_round_trip(tmp_path: Path, fresh_tuner: AutoTuner) -> None:
    path = tmp_path / "c.json"
    with autotune(True, cache=path):
        assert choose_one("fake", [H.CompoundRunner()], CFG, [x(4)])[1] == (64, (2, 3))
    doc = json.loads(path.read_text())
    assert doc[str(("fake", "CompoundRunner", ((4, 4),)))] == ["CompoundRunner", [64, [2, 3]]]
    fresh_tuner.clear()
    assert load_configs(path) == 1
    tactic = choose_one("fake", [H.CompoundRunner()], CFG, [x(4)])[1]
    assert tactic == (64, (2, 3)) and isinstance(tactic[1], tuple)
    hash(tactic)


@pytest.mark.parametrize("content", ['{"_metadata": {"gpu', "[1, 2]", '{"not a tuple": [1]}', ""])
def test_corrupt_file_is_absent_and_backed_up(tmp_path: Path, content: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(content)
    with pytest.warns(AutotuneWarning, match="corrupt"):
        assert load_configs(path) == 0
    with pytest.warns(AutotuneWarning, match="corrupt"):
        with autotune(True, cache=path):
            assert choose_one("fake", [H.FakeRunner()], CFG, [x(4)])[1] == 1
    assert read_cache_file(path).status == "ok"
    backups = list(tmp_path.glob("c.json.*.bak"))
    assert len(backups) == 1 and backups[0].read_text() == content


def test_load_configs_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="absent.json"):
        load_configs(tmp_path / "absent.json")


# --------------------------------------------------------------------------- concurrency
def test_threads_share_one_tuner(fresh_tuner: AutoTuner) -> None:
    runners = [H.FakeRunner(), H.OtherRunner()]
    results: list[tuple] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(seed: int) -> None:
        try:
            barrier.wait()
            for i in range(40):
                m = 1 + (seed * 7 + i) % 64
                runner, tactic = choose_one("fake", runners, CFG, [x(m)])
                results.append((pow2_buckets(m), runner.name, tactic))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with autotune():
        threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert {(r, t) for _, r, t in results} == {("OtherRunner", 7)}
    for bucket in {b for b, _, _ in results}:  # every bucket profiled exactly once
        assert profiled(bucket) == 4 and profiled(bucket, "OtherRunner") == 2
    assert fresh_tuner.stats.shapes_tuned == len({b for b, _, _ in results})


def test_incremental_merge_with_another_process_writing_in_between(tmp_path: Path) -> None:
    path = tmp_path / "shared.json"
    first = ("fake", "FakeRunner", ((1, 4),))
    write_config(path, {first: ("FakeRunner", 0)})
    ctx = mp.get_context("spawn")
    with autotune(True, cache=path):
        choose_one("fake", [H.FakeRunner()], CFG, [x(16)])
        # Another process tunes bucket 64 and saves while this context is open.
        other = ctx.Process(target=H.tune_shapes, args=(str(path), [64]))
        other.start()
        other.join(120)
        assert other.exitcode == 0
        assert ("fake", "FakeRunner", ((64, 4),)) in read_cache_file(path).entries
    merged = read_cache_file(path).entries
    assert set(merged) == {
        first,
        ("fake", "FakeRunner", ((16, 4),)),
        ("fake", "FakeRunner", ((64, 4),)),
    }


@pytest.mark.slow  # processes for seconds (the main suite stays under 10 minutes)
def test_four_processes_save_to_one_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "shared.json"
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(4)
    rows = [[2 ** (3 * i + j) for j in range(3)] for i in range(4)]  # 12 distinct buckets
    procs = [ctx.Process(target=H.tune_shapes, args=(str(path), r, barrier)) for r in rows]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    found = read_cache_file(path)
    assert found.status == "ok"
    assert set(found.entries) == {("fake", "FakeRunner", ((m, 4),)) for r in rows for m in r}


# --------------------------------------------------------------------------- dispatch cost
def test_cached_dispatch_is_a_dict_lookup(
    monkeypatch: pytest.MonkeyPatch, fresh_tuner: AutoTuner
) -> None:
    runners = (H.FakeRunner(), H.OtherRunner())
    inputs = [x(300), torch.randn(4), None]
    with autotune():
        first = choose_one("fake", runners, CFG, inputs)

        # A hit never reaches the slow path (bucketing, file lookups, profiling): its cost is
        # measured in benchmarks/bench_tune.py, not asserted here.
        def no_slow_path(*args: object, **kwargs: object) -> None:
            raise AssertionError("a cached dispatch took the slow path")

        monkeypatch.setattr(fresh_tuner.lookup, "_choose_slow", no_slow_path)
        for _ in range(100):
            assert choose_one("fake", runners, CFG, inputs) == first

"""`flashtune run --ray` and `flashtune tune --ray` on a local Ray cluster of 2 CPU slots.

One cluster for the module (starting Ray takes seconds); `--ray local` joins it, as it joins
any session already open in the process.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason='needs the ray extra: pip install "flashtune[ray]"')

from _bench_helpers import make_dataset, statuses  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from flashtune.bench.evaluate import BenchConfig  # noqa: E402
from flashtune.bench.ray import RayPool  # noqa: E402
from flashtune.bench.runner import RunOptions, run_benchmark  # noqa: E402
from flashtune.cli import app, bundled_dataset  # noqa: E402
from flashtune.data import Trace  # noqa: E402
from flashtune.tune.cache_file import read_cache_file, write_cache_file  # noqa: E402

GOOD = "def run(x, w):\n    return x * w\n"


def blocking(marker: Path, gate: Path) -> str:
    """A correct solution that, on its first call in a process, says it started (`marker`)
    and waits for `gate` (at most 30 s): the test kills its worker actor meanwhile."""
    return (
        "import os, time\n"
        "_first = [True]\n\n"
        "def run(x, w):\n"
        "    if _first[0]:\n"
        "        _first[0] = False\n"
        f"        open({str(marker)!r}, 'w').close()\n"
        "        for _ in range(300):\n"
        f"            if os.path.exists({str(gate)!r}):\n"
        "                break\n"
        "            time.sleep(0.1)\n"
        "    return x * w\n"
    )


@pytest.fixture(scope="module", autouse=True)
def cluster():
    # The solutions here signal the test through files outside their scratch folder (to be
    # killed mid-run), which the OS sandbox forbids: off for this module (tests/bench/
    # test_isolation.py covers it). Set before Ray starts, so its processes inherit it.
    saved = os.environ.get("FLASHTUNE_SANDBOX")
    os.environ["FLASHTUNE_SANDBOX"] = "0"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    if saved is None:
        os.environ.pop("FLASHTUNE_SANDBOX", None)
    else:
        os.environ["FLASHTUNE_SANDBOX"] = saved


def _opts(root: Path, out: Path, **kw) -> RunOptions:
    return RunOptions(
        datasets=[root],
        out=out,
        timeout=60,
        config=BenchConfig(warmup=1, iterations=3, trials=1),
        max_workloads=1000,
        **kw,
    )


def _trace_lines(out: Path) -> list[Trace]:
    return [
        Trace.model_validate_json(line)
        for path in sorted((out / "traces").rglob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def _kill_when_started(
    pool: RayPool, marker: Path, kills: int, then=None, also=lambda: True
) -> threading.Thread:
    """Kill the pool's (one) worker actor each time `marker` appears (and `also()` holds),
    `kills` times; then call `then`."""

    def watch() -> None:
        for _ in range(kills):
            while not (marker.exists() and also()):
                threading.Event().wait(0.05)
            ray.kill(pool.slots[0].actor)
            marker.unlink()
        if then is not None:
            then()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _by_triple(traces) -> dict[tuple[str, str, str], str]:
    return {(t.definition, t.solution, t.workload.uuid): t.evaluation.status.value for t in traces}


@pytest.mark.slow  # seconds of actor starts
def test_ray_local_gives_the_statuses_of_a_plain_run_on_bundled_definitions(tmp_path):
    selection = "*rmsnorm_h4096"  # rmsnorm and fused_add_rmsnorm: 3 solutions each
    plain = run_benchmark(
        RunOptions(
            datasets=[bundled_dataset()],
            out=tmp_path / "plain",
            definitions=selection,
            devices=["cpu"],
            config=BenchConfig(warmup=1, iterations=3, trials=1),
        ),
        progress=False,
    )
    out = tmp_path / "cluster"
    result = CliRunner().invoke(
        app,
        ["run", "--ray", "local", "--definitions", selection, "-o", str(out), "-q"]
        + ["--warmup", "1", "--iterations", "3", "--trials", "1"],
    )
    assert result.exit_code == 0, result.output
    traces = _trace_lines(out)
    assert len({t.definition for t in traces}) == 2
    # Skipped triples (CUDA-only solutions) are counted, not written: compare both ways.
    assert _by_triple(traces) == _by_triple(_trace_lines(tmp_path / "plain"))
    assert len(traces) == len(_trace_lines(tmp_path / "plain"))
    counts = {
        s: sum(t.evaluation.status.value == s for t in plain.traces) for s in ("PASSED", "SKIPPED")
    }
    assert (
        f"{len(plain.traces)} triples in" in result.output
        and f"({counts['PASSED']} passed, {counts['SKIPPED']} skipped)" in result.output
    )
    # Where each ran: the node (host, Ray node id) and the GPU (none on a CPU slot).
    env = traces[0].evaluation.environment
    assert env["node_id"] == ray.get_runtime_context().get_node_id()
    assert env["host"] and env["hardware"] == "cpu" and env["gpu_index"] is None
    assert "cluster: " in result.output and "triple(s)" in result.output


@pytest.mark.slow  # seconds of actor starts: a killed actor and its replacement, ~15 s
def test_a_killed_worker_actor_loses_no_finished_trace_and_requeues_its_triples(tmp_path):
    root, out = tmp_path / "ds", tmp_path / "out"
    marker, gate = tmp_path / "started", tmp_path / "gate"
    make_dataset(root, {"a": GOOD, "b": blocking(marker, gate)}, sizes=[1, 2])
    pool = RayPool("local", slots=1)  # one actor: the one killed holds the work in flight
    recorded: list[Trace] = []
    # Killed once "a" is recorded and "b" runs: a finished trace and one in flight.
    watcher = _kill_when_started(pool, marker, kills=1, then=gate.touch, also=lambda: recorded)
    result = run_benchmark(_opts(root, out), progress=False, on_trace=recorded.append, pool=pool)
    watcher.join(5)
    # "a" finished on the killed actor; its trace is kept, once, and "b" ran again.
    assert recorded[0].solution == "a"
    on_disk = _trace_lines(out)
    assert sorted(_by_triple(on_disk)) == sorted(_by_triple(result.traces))
    assert len(on_disk) == len(result.traces) == 4
    assert statuses(on_disk) == {("toy_scale_h8", "a"): "PASSED", ("toy_scale_h8", "b"): "PASSED"}
    notes = "\n".join(result.pool_notes)
    assert "killed by `ray.kill`" in notes and "re-queued" in notes
    assert "replacement worker started" in notes


@pytest.mark.slow  # seconds of actor starts
def test_triples_lost_twice_are_runtime_errors_with_the_reason(tmp_path):
    root, out = tmp_path / "ds", tmp_path / "out"
    marker, gate = tmp_path / "started", tmp_path / "gate"
    make_dataset(root, {"a": GOOD, "b": blocking(marker, gate)}, sizes=[1])
    pool = RayPool("local", slots=1)
    watcher = _kill_when_started(pool, marker, kills=2)
    run_benchmark(_opts(root, out), progress=False, pool=pool)
    watcher.join(5)
    gate.touch()  # lets the killed actors' orphaned sandboxes finish
    by_solution = {t.solution: t.evaluation for t in _trace_lines(out)}
    assert by_solution["a"].status.value == "PASSED"
    assert by_solution["b"].status.value == "RUNTIME_ERROR"
    assert "worker lost twice" in by_solution["b"].reason
    assert "ray.kill" in by_solution["b"].reason


@pytest.mark.slow  # seconds of actor starts
def test_resume_across_two_cluster_runs(tmp_path):
    root, out = tmp_path / "ds", tmp_path / "out"
    make_dataset(root, {"a": GOOD, "b": GOOD}, sizes=[1, 2])
    cli = ["run", "--ray", "local", "-d", str(root), "-o", str(out), "-q"]
    first = CliRunner().invoke(app, cli + ["--solutions", "a"])
    assert first.exit_code == 0, first.output
    assert len(_trace_lines(out)) == 2
    second = CliRunner().invoke(app, cli + ["--resume"])
    assert second.exit_code == 0, second.output
    assert "2 already traced" in second.output
    traces = _trace_lines(out)
    # Nothing measured twice: the second run only added b's two triples.
    assert sorted(_by_triple(traces)) == sorted(
        ("toy_scale_h8", s, f"toy_scale_h8-n{n}") for s in "ab" for n in (1, 2)
    )
    assert len(traces) == 4


def test_run_refuses_devices_with_ray(tmp_path):
    result = CliRunner().invoke(app, ["run", "--ray", "local", "--devices", "cpu"])
    assert result.exit_code == 2
    assert "--devices and --ray" in result.output


# --------------------------------------------------------------------------- tune --ray


def plant_configs(jobs: list, device: str, cache: Path) -> dict:
    """A job function standing in for tuning: one config entry per job, in the slot's file."""
    from flashtune.tune.cache_file import read_cache_file, write_cache_file

    found = read_cache_file(cache, expected={})
    entries = dict(found.entries)
    for name, tokens in jobs:
        entries[(name, "PlantedRunner", ((tokens, 8),))] = ("PlantedRunner", tokens)
    write_cache_file(cache, entries, found.metadata or {})
    return {"tuned": len(jobs), "seconds": 0.0, "failures": 0}


def test_tune_on_the_cluster_merges_every_slots_cache_into_the_existing_one(tmp_path):
    from flashtune.cli.tune import tune_on_cluster

    # The slots import this function by value: tests/ is not on their path.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cache = tmp_path / "cfg.json"
    write_cache_file(cache, {("old", "PlantedRunner", ((1, 8),)): ("PlantedRunner", 7)}, {})
    jobs = [("gemm", m) for m in (1, 2, 4, 8)]
    summary = tune_on_cluster("local", jobs, cache, job_function=plant_configs)
    assert summary == {"tuned": 4, "seconds": 0.0, "failures": 0, "lost": 0}
    entries = read_cache_file(cache, expected={}).entries
    assert entries[("old", "PlantedRunner", ((1, 8),))] == ("PlantedRunner", 7)
    assert {k[0] for k in entries} == {"old", "gemm"} and len(entries) == 5


def test_tune_with_ray_needs_a_cache_file():
    result = CliRunner().invoke(app, ["tune", "--ops", "rmsnorm", "--ray", "local"])
    assert result.exit_code == 2
    assert "--cache" in result.output

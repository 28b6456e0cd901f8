"""Hostile solutions, as a contributor or an agent gaming the benchmark would write them.

Each cheat is planted in one run beside honest solutions that run after it (solutions of a
workload run in name order, baselines first): no cheat may PASS, and the honest ones keep
their status and, within noise, their time.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest
from _bench_helpers import make_dataset, processes_running, statuses, toy_definition

from flashtune.bench.evaluate import BenchConfig
from flashtune.bench.runner import RunOptions, run_benchmark

HONEST = "def run(x, w):\n    return x * w\n"
ZEROS = "import torch\n\ndef run(x, w):\n    return torch.zeros_like(x)\n"

CHEATS = {
    # Remembers its result per input tensor (identity or address): no work on later calls.
    "a_identity_cache": (
        "_cache = {}\n\ndef run(x, w):\n    key = (id(x), x.data_ptr(), id(w))\n"
        "    if key not in _cache:\n        _cache[key] = x * w\n    return _cache[key]\n"
    ),
    # Looks up the caller's frames for the expected outputs (a dict holding 'y' of the right
    # shape, like an in-process harness keeps), else returns zeros.
    "b_frame_walker": (
        "import sys, torch\n\n"
        "def run(x, w):\n"
        "    f = sys._getframe(1)\n"
        "    while f is not None:\n"
        "        for v in list(f.f_locals.values()):\n"
        "            for cand in ([v] + list(vars(v).values()) if hasattr(v, '__dict__') else [v]):\n"
        "                if isinstance(cand, dict) and isinstance(cand.get('y'), torch.Tensor)"
        " and cand['y'].shape == x.shape and cand['y'] is not x:\n"
        "                    return cand['y'].clone()\n"
        "        f = f.f_back\n"
        "    return torch.zeros_like(x)\n"
    ),
    # Scans the garbage collector for a tensor shaped like the output that is not an input.
    "c_gc_scan": (
        "import gc, torch\n\n"
        "def run(x, w):\n"
        "    for o in gc.get_objects():\n"
        "        if isinstance(o, torch.Tensor) and o.shape == x.shape and o is not x"
        " and o.dtype == x.dtype and torch.isfinite(o).all():\n"
        "            return o.clone()\n"
        "    return torch.zeros_like(x)\n"
    ),
    # Honest on the first call, then zeroes its inputs on every later call.
    "d_input_scribbler": (
        "_calls = [0]\n\ndef run(x, w):\n    _calls[0] += 1\n"
        "    if _calls[0] > 1:\n        x.zero_()\n    return x * w\n"
    ),
    # Replaces the checker at import, then returns zeros.
    "e_checker_patch": (
        "import torch\n"
        "import flashtune.bench.correctness as c\n"
        "from flashtune.data.models import EvaluationStatus\n"
        "c.compare_outputs = lambda *a, **k: c.Verdict(EvaluationStatus.PASSED)\n"
        "def run(x, w):\n    return torch.zeros_like(x)\n"
    ),
    # Replaces the clock at import (does honest work): every later reading would be ~0.
    "f_clock_patch": (
        "import time\n_t = [0.0]\n"
        "def _fake():\n    _t[0] += 1e-9\n    return _t[0]\n"
        "time.perf_counter = _fake\ntime.perf_counter_ns = lambda: int(_fake() * 1e9)\n"
        "time.monotonic = _fake\n"
        "def run(x, w):\n    return x * w\n"
    ),
    # Replaces the timer's own clock after import, from inside the call.
    "g_timer_patch": (
        "def run(x, w):\n"
        "    import flashtune.timing as t\n"
        "    t._clock = lambda: 0.0\n"
        "    return x * w\n"
    ),
    # Replaces a Tensor method the harness uses to poison outputs.
    "h_tensor_patch": (
        "import torch\n"
        "torch.Tensor.fill_ = lambda self, v: self\n"
        "def run(x, w):\n    return x * w\n"
    ),
    # Honest but wrong: must fail whatever a cheat before it did to the checker.
    "x_zeros": ZEROS,
    # Honest and correct: must pass, with its own time, whatever came before.
    "z_honest": HONEST,
}

CFG = BenchConfig(warmup=1, iterations=5, trials=1, input_sets=2)


def _run(tmp_path, solutions, sizes=(64,), timeout=60.0):
    root = tmp_path / "ds"
    make_dataset(root, solutions, sizes=list(sizes))
    # The first call (import, setup, compilation) has its own limit: the same one here.
    config = replace(CFG, first_call_timeout=timeout)
    opts = RunOptions(
        datasets=[root], out=tmp_path / "out", devices=["cpu"], config=config, timeout=timeout
    )
    return run_benchmark(opts, progress=False)


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("hostile"), CHEATS)


@pytest.fixture(scope="module")
def honest_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("honest"), {"z_honest": HONEST})


@pytest.mark.parametrize("name", [n for n in CHEATS if n not in ("z_honest",)])
def test_no_cheat_passes(hostile_run, name):
    got = statuses(hostile_run.traces)[("toy_scale_h8", name)]
    trace = next(t for t in hostile_run.traces if t.solution == name)
    assert got != "PASSED", f"{name} passed: {trace.evaluation.log[-500:]}"


def test_each_cheat_is_named(hostile_run):
    reasons = {t.solution: t.evaluation.reason or "" for t in hostile_run.traces}
    assert "timed call" in reasons["a_identity_cache"] and "identity" in reasons["a_identity_cache"]
    assert "wrote into its input" in reasons["d_input_scribbler"]
    assert (
        "tampering" in reasons["f_clock_patch"] and "time.perf_counter" in reasons["f_clock_patch"]
    )
    assert "tampering" in reasons["g_timer_patch"] and "_clock" in reasons["g_timer_patch"]
    assert "tampering" in reasons["h_tensor_patch"] and "fill_" in reasons["h_tensor_patch"]


def test_honest_solution_after_cheats_keeps_status_and_time(hostile_run, honest_run):
    after = next(t for t in hostile_run.traces if t.solution == "z_honest")
    alone = next(t for t in honest_run.traces if t.solution == "z_honest")
    assert after.evaluation.status.value == "PASSED", after.evaluation.reason
    assert alone.evaluation.status.value == "PASSED", alone.evaluation.reason
    # A replaced clock read ~1e-6 ms for everything after it; both figures come from the same
    # machine minutes apart, so only an order of magnitude is asserted (CI is noisy).
    ratio = after.evaluation.performance.latency_ms / alone.evaluation.performance.latency_ms
    assert 0.1 < ratio < 10, ratio
    # The reference, timed by the worker after the cheats, is not affected either.
    assert after.evaluation.performance.reference_latency_ms > 1e-4


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc (Linux)")
def test_children_in_new_sessions_are_killed(tmp_path):
    marker = f"987.{os.getpid()}"  # unique to this test run
    spawner = (
        "import subprocess\n"
        "def run(x, w):\n"
        "    for _ in range(4):\n"
        f"        subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        f"        subprocess.Popen(['sh', '-c', 'sleep {marker} & sleep {marker}'])\n"
        "    return x * w\n"
    )
    result = _run(tmp_path, {"spawner": spawner, "z_honest": HONEST})
    assert statuses(result.traces)[("toy_scale_h8", "z_honest")] == "PASSED"
    deadline = time.monotonic() + 5
    while processes_running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_running(marker) == []


# ~3 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
@pytest.mark.slow
def test_fork_then_exit_fails_at_once(tmp_path):
    forker = (
        "import os, time\n"
        "def run(x, w):\n"
        "    if os.fork() != 0:\n"
        "        os._exit(0)\n"
        "    time.sleep(30)\n"
        "    return x * w\n"
    )
    result = _run(tmp_path, {"forker": forker, "z_honest": HONEST}, timeout=120.0)
    got = statuses(result.traces)
    # RUNTIME_ERROR, not TIMEOUT: the exit is seen when it happens, while the forked copy
    # sleeps on holding the pipe.
    assert got[("toy_scale_h8", "forker")] == "RUNTIME_ERROR"
    assert got[("toy_scale_h8", "z_honest")] == "PASSED"
    reason = next(t for t in result.traces if t.solution == "forker").evaluation.reason
    assert "exited with code 0" in reason, reason


@pytest.mark.slow  # processes for seconds (the main suite stays under 10 minutes)
def test_forked_copy_cannot_speak_for_the_solution(tmp_path):
    # The forked copy returns honest-looking results while the original hangs: only the
    # process the harness started may answer.
    forker = (
        "import os, time\n"
        "def run(x, w):\n"
        "    if os.fork() == 0:\n"
        "        return x * w\n"
        "    time.sleep(600)\n"
    )
    result = _run(tmp_path, {"forker": forker}, timeout=5.0)
    assert statuses(result.traces)[("toy_scale_h8", "forker")] == "TIMEOUT"


def test_definition_unaffected_by_toy_name():
    # The cheats above look for an output named 'y' of the toy definition.
    assert list(toy_definition().outputs) == ["y"]


# --------------------------------------------------------------------------- on the GPU

SIDE_STREAM = {
    # All the work on a stream of its own, never joined to the caller's: a graph captured
    # on the caller's stream records nothing.
    "s_side_stream": (
        "import torch\n_s = []\n"
        "def run(x, w):\n"
        "    if not _s:\n        _s.append(torch.cuda.Stream())\n"
        "    out = torch.empty_like(x)\n"
        "    with torch.cuda.stream(_s[0]):\n        torch.mul(x, w, out=out)\n"
        "    return out\n"
    ),
    # Same, plus one tiny kernel on the caller's stream so the graph is not empty.
    "t_side_stream_decoy": (
        "import torch\n_s = []\n"
        "def run(x, w):\n"
        "    if not _s:\n        _s.append(torch.cuda.Stream())\n"
        "    out = torch.empty_like(x)\n"
        "    out[:1].zero_()\n"
        "    with torch.cuda.stream(_s[0]):\n        torch.mul(x, w, out=out)\n"
        "    return out\n"
    ),
}


@pytest.mark.cuda
def test_no_cheat_passes_on_the_gpu(tmp_path):
    root = tmp_path / "ds"
    make_dataset(root, {**CHEATS, **SIDE_STREAM}, sizes=[4096])
    opts = RunOptions(
        datasets=[root],
        out=tmp_path / "out",
        devices=["cuda:0"],
        timeout=120.0,
        config=BenchConfig(warmup=2, iterations=5, trials=1, trial_ms=10.0),
    )
    result = run_benchmark(opts, progress=False)
    got = statuses(result.traces)
    traces = {t.solution: t.evaluation for t in result.traces}
    for name in [*CHEATS, *SIDE_STREAM]:
        if name == "z_honest":
            continue
        assert got[("toy_scale_h8", name)] != "PASSED", (name, traces[name].log[-800:])
    assert "captured no GPU work" in traces["s_side_stream"].reason
    honest = traces["z_honest"]
    assert honest.status.value == "PASSED", honest.log
    assert honest.performance.timing_method == "cuda_graph"

"""Timing fraud: solutions that try to look fast without being fast.

Each planted solution is honest but slow (a 2 ms pause before its work) unless it believes it
can cheat, then it answers at once. An attack succeeds when its trace PASSED with a latency
under the honest 2 ms: every timed call is checked (bench/checked_timing.py), so a cheat in a
timed call fails, and one that never gets to cheat is timed honestly. Honest solutions run
after them keep their status and time.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from _bench_helpers import make_dataset, python_solution, statuses

from flashtune.bench.checked_timing import derive_seed, timing_from_samples
from flashtune.bench.evaluate import BenchConfig
from flashtune.bench.runner import RunOptions, run_benchmark

PAUSE_MS = 2.0
_SLOW = "import time\n\ndef _honest(x, w):\n    time.sleep(0.002)\n    return x * w\n\n"

ATTACKS = {
    # Answers from a cache keyed by a handful of sampled input values (not id, not address).
    "a_value_cache": _SLOW
    + (
        "_cache = {}\n\n"
        "def run(x, w):\n"
        "    key = (tuple(x.reshape(-1)[:4].tolist()), tuple(w[:2].tolist()), x.shape)\n"
        "    if key in _cache:\n"
        "        return _cache[key].clone()\n"
        "    _cache[key] = y = _honest(x, w)\n"
        "    return y\n"
    ),
    # Returns garbage when a timing loop is on its stack, the right answer otherwise (the
    # check that followed the timing loop used to be a separate call).
    "b_stack_inspector": _SLOW
    + (
        "import sys, torch\n\n"
        "def run(x, w):\n"
        "    f = sys._getframe(1)\n"
        "    while f is not None:\n"
        "        name = f.f_code.co_name\n"
        "        if 'sample' in name or 'measure' in name or name.startswith('_time'):\n"
        "            return torch.empty_like(x)\n"
        "        f = f.f_back\n"
        "    return _honest(x, w)\n"
    ),
    # A lookup table built ahead of time for the seeds a harness would use (small integers,
    # and the seeds derived from them), keyed by sampled values.
    "c_offline_table": _SLOW
    + (
        "import sys\n"
        "from flashtune.data.synth import synthesize_inputs\n\n"
        "_table = {}\n\n"
        "def _key(x):\n"
        "    return (tuple(x.reshape(-1)[:4].tolist()), tuple(x.shape))\n\n"
        "def _candidates(definition, workload):\n"
        "    seeds = list(range(16))\n"
        "    try:  # the seeds a harness that derives them from a run seed of 0..7 would use\n"
        "        from flashtune.bench.checked_timing import derive_seed\n"
        "        for base in range(8):\n"
        "            wl = derive_seed(base, 'workload', definition.name, workload.uuid)\n"
        "            seeds += [derive_seed(wl, i) for i in range(4)]\n"
        "    except ImportError:\n"
        "        pass\n"
        "    return seeds\n\n"
        "def _build():\n"
        "    f = sys._getframe(2)\n"
        "    while f is not None and 'definition' not in f.f_locals:\n"
        "        f = f.f_back\n"
        "    if f is None:\n"
        "        return\n"
        "    d, wl = f.f_locals['definition'], f.f_locals.get('workload')\n"
        "    for seed in _candidates(d, wl):\n"
        "        inputs = synthesize_inputs(d, wl, device='cpu', seed=seed)\n"
        "        _table[_key(inputs['x'])] = True\n\n"
        "def run(x, w):\n"
        "    if not _table:\n"
        "        _build()\n"
        "    if _key(x) in _table:\n"
        "        return x * w  # inputs it knew in advance: no pause\n"
        "    return _honest(x, w)\n"
    ),
    # The solution the issue found first: destination-passing, it works only when its output
    # holds NaN (the harness poisoned outputs only before the calls it checked).
    "d_nan_gated": (
        "import time, torch\n\n"
        "def run(x, w, y):\n"
        "    if torch.isnan(y).any():\n"
        "        time.sleep(0.002)\n"
        "        y.copy_(x * w)\n"
    ),
    "z_honest": _SLOW + "def run(x, w):\n    return _honest(x, w)\n",
}

# Exactly 5 samples (the CPU otherwise samples on while the spread is wide): the same seed
# then gives the same calls, and the same log.
CFG = BenchConfig(
    warmup=2, iterations=5, trials=1, input_sets=2, max_samples=5, spread_seconds=60.0
)


def _run(tmp_path, solutions, seed=None):
    root = tmp_path / "ds"
    extra = []
    if "d_nan_gated" in solutions:
        solutions = dict(solutions)
        body = solutions.pop("d_nan_gated")
        extra.append(python_solution("d_nan_gated", body, destination_passing_style=True))
    make_dataset(root, solutions, sizes=[64], extra=extra)
    opts = RunOptions(
        datasets=[root],
        out=tmp_path / "out",
        devices=["cpu"],
        config=replace(CFG, seed=seed, first_call_timeout=60.0),
        timeout=60.0,
    )
    return run_benchmark(opts, progress=False)


@pytest.fixture(scope="module")
def fraud_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("fraud"), ATTACKS)


@pytest.mark.parametrize("name", [n for n in ATTACKS if n != "z_honest"])
def test_no_timing_fraud_succeeds(fraud_run, name):
    trace = next(t for t in fraud_run.traces if t.solution == name)
    ev = trace.evaluation
    if ev.status.value == "PASSED":
        # Passing is allowed only at the honest speed: it never got to cheat in a timed call.
        assert ev.performance.latency_ms >= 0.9 * PAUSE_MS, (name, ev.log[-600:])
    else:
        assert ev.status.value in ("INCORRECT_NUMERICAL", "INCORRECT_SHAPE"), ev.reason


def test_cheats_in_timed_calls_are_caught_by_the_timed_checks(fraud_run):
    reasons = {t.solution: t.evaluation.reason or "" for t in fraud_run.traces}
    assert statuses(fraud_run.traces)[("toy_scale_h8", "b_stack_inspector")] != "PASSED"
    assert "timed call" in reasons["b_stack_inspector"], reasons["b_stack_inspector"]


def test_honest_solution_keeps_status_and_time(fraud_run):
    honest = next(t for t in fraud_run.traces if t.solution == "z_honest").evaluation
    assert honest.status.value == "PASSED", honest.reason
    assert honest.performance.latency_ms >= 0.9 * PAUSE_MS
    # every timed sample called the solution once per input set, and each call was checked
    assert honest.performance.timing_calls_per_sample == CFG.input_sets


# ~4 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
@pytest.mark.slow
def test_the_run_seed_is_drawn_per_run_and_recorded(fraud_run, tmp_path):
    seeds = {t.evaluation.environment.get("input_seed") for t in fraud_run.traces}
    assert len(seeds) == 1 and isinstance(next(iter(seeds)), int)
    again = _run(tmp_path, {"z_honest": ATTACKS["z_honest"]})
    other = again.traces[0].evaluation.environment["input_seed"]
    assert other != next(iter(seeds))  # 62 bits from the OS: equal once in 4e18


@pytest.mark.slow  # processes for seconds (the main suite stays under 10 minutes)
def test_a_named_seed_reproduces_the_inputs(tmp_path):
    # The same seed gives the same inputs, so the same reference figures and checks.
    body = "def run(x, w):\n    print('sum', float(x.sum()))\n    return x * w\n"
    logs = []
    for i in range(2):
        result = _run(tmp_path / str(i), {"echo": body}, seed=1234)
        ev = result.traces[0].evaluation
        assert ev.environment["input_seed"] == 1234 and ev.status.value == "PASSED"
        logs.append([line for line in ev.log.splitlines() if line.startswith("sum")])
    assert logs[0] and logs[0] == logs[1]


def test_derived_seeds_differ_and_repeat():
    assert derive_seed(1, "a", 0) == derive_seed(1, "a", 0)
    seeds = {derive_seed(1, "a", i) for i in range(1000)} | {derive_seed(2, "a", 0)}
    assert len(seeds) == 1001 and all(0 <= s < 2**62 for s in seeds)


def test_timing_from_samples_groups_trials():
    t = timing_from_samples(
        [1.0, 2.0, 3.0, 10.0, 11.0, 12.0], trials=2, method="cpu", calls_per_sample=4
    )
    assert t.trial_medians_ms == (2.0, 11.0) and t.median_ms == 6.5 and t.repetitions == 6
    assert t.calls_per_sample == 4 and t.min_ms == 1.0 and t.max_ms == 12.0
    with pytest.raises(ValueError):
        timing_from_samples([], trials=1, method="cpu", calls_per_sample=1)


_SAMPLER = (
    "import torch\n\n"
    "def _draw(probs, top_k):\n"
    "    kth = torch.topk(probs, int(top_k.max()), dim=-1).values.gather(\n"
    "        -1, top_k.long().reshape(-1, 1) - 1)\n"
    "    weights = probs.masked_fill(probs < kth, 0.0)\n"
    "    return torch.multinomial(weights, 1).reshape(-1)\n\n"
)
# Honest on the inputs of its first call (the first-call check and the distribution check's
# draws use them), token 0 for anything else: the timed calls.
SAMPLING_CHEAT = _SAMPLER + (
    "_seen = []\n\n"
    "def run(probs, top_k):\n"
    "    key = float(probs[:, :64].sum())\n"
    "    if not _seen:\n"
    "        _seen.append(key)\n"
    "    if key == _seen[0]:\n"
    "        return _draw(probs, top_k)\n"
    "    return torch.zeros(probs.shape[0], dtype=torch.int64)\n"
)


@pytest.mark.slow  # ~25 s on two CPU cores (a 128k-token sampler's reference draws)
def test_a_sampler_honest_only_on_the_checked_inputs_fails_in_a_timed_call(tmp_path):
    from flashtune.cli.common import bundled_dataset
    from flashtune.data import Dataset, Workload

    name = "top_k_sampling_from_probs_v128256"
    definition = Dataset([bundled_dataset()]).definition(name)
    root = tmp_path / "ds"
    ds = Dataset(root)
    ds.add_definition(definition)
    ds.add_workloads(definition, [Workload(uuid="b4", axes={"batch_size": 4})])
    ds.add_solution(python_solution("cheat", SAMPLING_CHEAT, name))
    ds.add_solution(python_solution("honest", _SAMPLER + "run = _draw\n", name))
    opts = RunOptions(
        datasets=[root],
        out=tmp_path / "out",
        devices=["cpu"],
        config=replace(CFG, sampling_draws=50, first_call_timeout=120.0),
        timeout=120.0,
    )
    traces = {t.solution: t.evaluation for t in run_benchmark(opts, progress=False).traces}
    assert traces["honest"].status.value == "PASSED", traces["honest"].reason
    cheat = traces["cheat"]
    assert cheat.status.value == "INCORRECT_NUMERICAL", cheat.reason
    assert "timed call" in cheat.reason and "outside the allowed set" in cheat.reason

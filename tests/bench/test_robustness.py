"""Planted misbehaving solutions: each gets the right status, the others are unaffected, and
the run ends with its summary."""

from __future__ import annotations

import json

import pytest
from _bench_helpers import make_dataset, python_solution, statuses, toy_definition
from typer.testing import CliRunner

from flashtune.cli import app
from flashtune.data import Solution

GOOD = "def run(x, w):\n    return x * w\n"
PLANTED = {
    "good": GOOD,
    "segfault": "import ctypes\n\ndef run(x, w):\n    return ctypes.string_at(0)\n",
    "abort": "import os\n\ndef run(x, w):\n    os.abort()\n",
    "hang": "import time\n\ndef run(x, w):\n    time.sleep(600)\n",
    # A first call as slow as a cold JIT compile: longer than --timeout, within its own limit.
    "slow_first_call": (
        "import time\n_calls = []\n\ndef run(x, w):\n    if not _calls:\n"
        "        time.sleep(6)\n    _calls.append(1)\n    return x * w\n"
    ),
    "hang_after_first_call": (
        "import time\n_calls = []\n\ndef run(x, w):\n    _calls.append(1)\n"
        "    if len(_calls) > 1:\n        time.sleep(600)\n    return x * w\n"
    ),
    "wrong_shape": "def run(x, w):\n    return (x * w)[:, :4]\n",
    "wrong_dtype": "import torch\n\ndef run(x, w):\n    return (x * w).to(torch.float64)\n",
    "nan": "def run(x, w):\n    y = x * w\n    y[0, 0] = float('nan')\n    return y\n",
    "wrong_values": "def run(x, w):\n    return x * w + 1\n",
    "writes_input": "def run(x, w):\n    x.mul_(w)\n    return x.clone()\n",
    "memoizes": (
        "_cache = {}\n\ndef run(x, w):\n    key = tuple(x.shape)\n"
        "    if key not in _cache:\n        _cache[key] = x * w\n    return _cache[key].clone()\n"
    ),
    "raises_at_import": "raise RuntimeError('broken module')\n\ndef run(x, w):\n    return x\n",
    "raises": "def run(x, w):\n    raise ValueError('bad input')\n",
    "syntax_error": "def run(x, w)\n    return x\n",
}
EXPECTED = {
    "good": "PASSED",
    "dps": "PASSED",
    "segfault": "RUNTIME_ERROR",
    "abort": "RUNTIME_ERROR",
    "hang": "TIMEOUT",
    "slow_first_call": "PASSED",
    "hang_after_first_call": "TIMEOUT",
    "wrong_shape": "INCORRECT_SHAPE",
    "wrong_dtype": "INCORRECT_DTYPE",
    "nan": "INCORRECT_NUMERICAL",
    "wrong_values": "INCORRECT_NUMERICAL",
    "writes_input": "INCORRECT_NUMERICAL",
    "memoizes": "INCORRECT_NUMERICAL",
    "raises_at_import": "COMPILE_ERROR",
    "raises": "RUNTIME_ERROR",
    "syntax_error": "COMPILE_ERROR",
    "needs_gpu": "SKIPPED",
    "needs_package": "SKIPPED",
}


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    extra = [
        python_solution(
            "dps", "def run(x, w, y):\n    y.copy_(x * w)\n", destination_passing_style=True
        ),
        Solution.model_validate(
            {
                "name": "needs_gpu",
                "definition": "toy_scale_h8",
                "author": "tests",
                "spec": {
                    "language": "triton",
                    "entry_point": "main.py::run",
                    "destination_passing_style": False,
                },
                "sources": [{"path": "main.py", "content": GOOD}],
            }
        ),
        python_solution("needs_package", GOOD, dependencies=["no_such_package_xyz"]),
    ]
    ds = make_dataset(root, PLANTED, sizes=[2, 5], extra=extra)
    # A second definition whose reference fails: its solutions fail, nothing else does.
    bad = toy_definition(
        "toy_bad_reference_h8", "def run(x, w):\n    raise RuntimeError('reference is broken')\n"
    )
    make_dataset(root, {}, sizes=[2], definition=bad)
    ds.add_solution(python_solution("good", GOOD, bad.name))
    out = root / "out"
    result = CliRunner().invoke(
        app,
        [
            "run",
            "-d",
            str(root),
            "-o",
            str(out),
            "--timeout",
            "4",
            "--first-call-timeout",
            "10",
            "--devices",
            "cpu",
            "-q",
        ],  # fmt: skip
    )
    # The output dataset holds no definitions: read the trace files directly. SKIPPED
    # triples go to skipped/ (FlashInfer-Bench's traces/ has no SKIPPED status).
    from flashtune.data import Trace

    def read(folder: str) -> list[Trace]:
        return [
            Trace.model_validate_json(line)
            for path in sorted((out / folder).rglob("*.jsonl"))
            for line in path.read_text().splitlines()
        ]

    in_traces = read("traces")
    assert all(t.evaluation.status.value != "SKIPPED" for t in in_traces)
    return result, in_traces + read("skipped")


@pytest.mark.slow
def test_each_planted_solution_gets_its_status(planted_run):
    result, traces = planted_run
    assert result.exit_code == 0, result.output
    got = statuses(traces)
    for name, status in EXPECTED.items():
        assert got[("toy_scale_h8", name)] == status, (name, got[("toy_scale_h8", name)])
    assert got[("toy_bad_reference_h8", "good")] == "RUNTIME_ERROR"
    # every triple has exactly one trace: 2 workloads x all solutions + 1 bad-reference one
    assert len(traces) == 2 * len(EXPECTED) + 1


@pytest.mark.slow
def test_reasons_name_the_problem(planted_run):
    _, traces = planted_run
    reasons = {
        t.solution: t.evaluation.reason or "" for t in traces if t.definition == "toy_scale_h8"
    }
    assert "SIG" in reasons["segfault"] or "died" in reasons["segfault"]
    assert "first call" in reasons["hang"] and "within 10 s" in reasons["hang"]
    assert "4 s timeout after its first call" in reasons["hang_after_first_call"]
    assert "wrote into its input" in reasons["writes_input"]
    # Cached by shape: every timed call has new values, so the cached outputs are stale.
    assert "timed call" in reasons["memoizes"] and "cached" in reasons["memoizes"]
    assert "NaN" in reasons["nan"]
    # A "triton" solution runs in the CPU's Triton interpreter (issue 33); this one's code
    # launches no Triton kernel, so it is SKIPPED saying so (not "correct, not timed").
    assert "ran no Triton kernel on the CPU" in reasons["needs_gpu"]
    assert "no_such_package_xyz" in reasons["needs_package"]
    bad = [t for t in traces if t.definition == "toy_bad_reference_h8"]
    assert "reference failed" in bad[0].evaluation.reason


@pytest.mark.slow
def test_passed_traces_carry_figures_and_summary_is_printed(planted_run):
    result, traces = planted_run
    good = [t for t in traces if t.solution == "good" and t.definition == "toy_scale_h8"]
    for t in good:
        ev = t.evaluation
        assert ev.performance.latency_ms > 0
        assert ev.performance.reference_latency_ms > 0
        assert ev.correctness.matched_ratio == 1.0
        assert ev.environment["hardware"] == "cpu"
        assert json.loads(t.to_json())["evaluation"]["solution_hash"]
    assert "flashtune run on cpu" in result.output
    assert "triples in" in result.output

"""Inputs a reference writes into (destination buffers such as GDN MTP's
intermediate_states_buffer): a solution must leave in them what the reference leaves there,
and every other input unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest
from _bench_helpers import make_dataset, statuses

from flashtune.bench.evaluate import BenchConfig
from flashtune.bench.runner import RunOptions, run_benchmark
from flashtune.data import Definition

REFERENCE = """import torch

def run(x, w, buf):
    buf.copy_(x * 2.0)
    return x * w
"""

SOLUTIONS = {
    "fills_buffer": "def run(x, w, buf):\n    buf.copy_(x * 2.0)\n    return x * w\n",
    "skips_buffer": "def run(x, w, buf):\n    return x * w\n",
    "wrong_buffer": "def run(x, w, buf):\n    buf.copy_(x * 3.0)\n    return x * w\n",
    "partial_buffer": "def run(x, w, buf):\n    buf[:-1].copy_(x[:-1] * 2.0)\n    return x * w\n",
    "also_writes_x": (
        "def run(x, w, buf):\n    buf.copy_(x * 2.0)\n    y = x * w\n    x.add_(1.0)\n"
        "    return y\n"
    ),
}


def _definition() -> Definition:
    return Definition.model_validate(
        {
            "name": "toy_buffer_h8",
            "op_type": "toy",
            "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 8}},
            "inputs": {
                "x": {"shape": ["n", "h"], "dtype": "float32"},
                "w": {"shape": ["h"], "dtype": "float32"},
                "buf": {"shape": ["n", "h"], "dtype": "float32", "optional": True},
            },
            "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
            "reference": REFERENCE,
        }
    )


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("destination")
    make_dataset(tmp / "ds", SOLUTIONS, sizes=[5], definition=_definition())
    config = replace(
        BenchConfig(warmup=1, iterations=3, trials=1, input_sets=2), first_call_timeout=60.0
    )
    opts = RunOptions(
        datasets=[tmp / "ds"], out=tmp / "out", devices=["cpu"], config=config, timeout=60.0
    )
    return run_benchmark(opts, progress=False).traces


def test_the_buffer_the_reference_fills_is_judged_as_an_output(traces):
    got = statuses(traces)
    reasons = {t.solution: t.evaluation.reason or "" for t in traces}
    assert got[("toy_buffer_h8", "fills_buffer")] == "PASSED", reasons["fills_buffer"]
    for name in ("skips_buffer", "wrong_buffer", "partial_buffer"):
        assert got[("toy_buffer_h8", name)] == "INCORRECT_NUMERICAL", (name, reasons[name])
        assert "the reference writes into buf" in reasons[name], reasons[name]


def test_other_inputs_must_stay_unchanged(traces):
    got = statuses(traces)
    reason = next(t.evaluation.reason for t in traces if t.solution == "also_writes_x")
    assert got[("toy_buffer_h8", "also_writes_x")] == "INCORRECT_NUMERICAL"
    assert "wrote into its input(s) x" in reason

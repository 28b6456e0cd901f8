"""Weights drawn once per workload (bench/fixed_inputs.py): on a GPU only when per-sample
values do not fit; forced here on the CPU to check the worker and the sandbox agree."""

from __future__ import annotations

import pytest
import torch
from _bench_helpers import python_solution, toy_definition

from flashtune import platform
from flashtune.bench import workload_inputs
from flashtune.bench.evaluate import BenchConfig, evaluate_workload
from flashtune.bench.fixed_inputs import (
    checksum,
    constant_weights,
    reference_temporaries,
    weights_to_fix,
)
from flashtune.data import Workload
from flashtune.data.synth import synthesize_inputs

CFG = BenchConfig(warmup=1, iterations=3, trials=1)

HONEST = "def run(x, w):\n    return x * w\n"
# Keeps the first output: stale once the activations change, fixed weights or not. It copies
# the kept value, so the call does GPU work (one doing none is refused before any check).
CACHES_OUTPUT = (
    "_seen = {}\n\ndef run(x, w):\n"
    "    key = (x.data_ptr(), w.data_ptr())\n"
    "    if key not in _seen:\n        _seen[key] = x * w\n"
    "    return _seen[key].clone()\n"
)
# Caches work derived from the weights by address: what fixed weights let through.
CACHES_WEIGHTS = (
    "_prepared = {}\n\ndef run(x, w):\n"
    "    if w.data_ptr() not in _prepared:\n        _prepared[w.data_ptr()] = w.clone()\n"
    "    return x * _prepared[w.data_ptr()]\n"
)


@pytest.fixture
def fixed_weights(monkeypatch):
    monkeypatch.setattr(
        workload_inputs, "weights_to_fix", lambda definition, inputs, device: ("w",)
    )


def _traces(solutions: dict[str, str], device: str = "cpu"):
    definition = toy_definition()
    events = evaluate_workload(
        definition,
        Workload(uuid="w", axes={"n": 5}),
        [python_solution(name, body) for name, body in solutions.items()],
        CFG,
        torch.device(device),
        platform.snapshot(device),
    )
    return {t.solution: t.evaluation for kind, t in events if kind == "trace"}


def test_fixed_weights_worker_and_sandbox_draw_the_same_values(fixed_weights):
    got = _traces({"honest": HONEST, "caches_output": CACHES_OUTPUT})
    assert got["honest"].status.value == "PASSED", got["honest"].reason
    assert "keep their first values in every sample" in got["honest"].log
    stale = got["caches_output"]
    assert stale.status.value == "INCORRECT_NUMERICAL", (stale.reason, stale.log)


@pytest.mark.cuda
def test_fixed_weights_on_the_gpu(fixed_weights):
    """On a GPU the sandbox draws its own sets from the seeds (no shared memory): it must
    skip the fixed weights exactly as the worker does, and send its inputs back borrowed."""
    got = _traces({"honest": HONEST, "caches_output": CACHES_OUTPUT}, "cuda")
    assert got["honest"].status.value == "PASSED", got["honest"].reason
    assert "keep their first values in every sample" in got["honest"].log
    stale = got["caches_output"]
    assert stale.status.value == "INCORRECT_NUMERICAL", (stale.reason, stale.log)


def test_without_fixed_weights_a_weight_cache_is_stale():
    got = _traces({"caches_weights": CACHES_WEIGHTS})
    assert got["caches_weights"].status.value == "INCORRECT_NUMERICAL"


def test_fixed_weights_let_a_weight_cache_through(fixed_weights):
    """The documented cost (bench/fixed_inputs.py): work derived from fixed weights may be
    cached across samples."""
    got = _traces({"caches_weights": CACHES_WEIGHTS})
    assert got["caches_weights"].status.value == "PASSED"


def test_only_const_shaped_float_inputs_are_weights():
    definition = toy_definition()
    inputs = synthesize_inputs(definition, Workload(uuid="w", axes={"n": 3}), seed=1)
    assert constant_weights(definition, inputs) == ("w",)
    assert weights_to_fix(definition, inputs, torch.device("cpu")) == ()
    # The budget counts a float32 copy of every weight for the reference's temporaries
    # (dequantizing MoE references), and nothing for the activations.
    assert reference_temporaries(definition, inputs) == 4 * inputs["w"].numel()


def test_given_inputs_are_kept_and_the_rest_drawn_alike():
    definition = toy_definition()
    workload = Workload(uuid="w", axes={"n": 3})
    w = torch.full((8,), 2.0)
    a = synthesize_inputs(definition, workload, seed=7, fixed={"w": w})
    b = synthesize_inputs(definition, workload, seed=7, fixed={"w": w.clone()})
    assert a["w"] is w and torch.equal(a["x"], b["x"])


def test_checksum_sees_a_moved_byte(monkeypatch):
    import flashtune.bench.fixed_inputs as fixed_inputs

    monkeypatch.setattr(fixed_inputs, "_CHUNK", 24)  # 40 bytes: two chunks
    t = torch.randn(10)
    swapped = t.clone()
    swapped[[0, 9]] = swapped[[9, 0]]
    assert checksum(t) == checksum(t.clone())
    assert checksum(swapped) != checksum(t)

"""The bundled dataset: loads cleanly, covers the shipped ops, and its baselines agree with
the references (torch on CPU; flashtune and FlashInfer on a GPU)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from flashtune.bench.build import build_solution
from flashtune.bench.correctness import compare_outputs
from flashtune.cli import bundled_dataset
from flashtune.data import (
    Dataset,
    outputs_as_dict,
    run_reference,
    small_workload,
    synthesize_inputs,
)

DS = Dataset(bundled_dataset())
NAMES = sorted(DS.definitions)


def test_loads_without_errors_and_covers_the_ops():
    assert DS.load_all() == []
    op_types = {d.op_type for d in DS.definitions.values()}
    assert op_types == {"rmsnorm", "activation", "gemm", "rope", "gqa_paged", "gqa_ragged"}
    for name in NAMES:
        sols = {s.name for s in DS.solutions_for(name)}
        assert {"flashtune", "torch"} <= sols, name
        assert len(DS.workloads_for(name)) >= 5, name
    tags = {t for d in DS.definitions.values() for t in d.tags}
    assert {"model:llama-3.1-8b", "model:llama-3.1-70b-tp8", "model:qwen3-8b"} <= tags


def test_workload_axes_span_realistic_ranges():
    decode = DS.workloads_for("gqa_paged_decode_h32_kv8_d128_ps16")
    batches = {w.workload.axes["batch_size"] for w in decode}
    assert min(batches) == 1 and max(batches) == 256
    tokens = {w.workload.axes["num_kv_indices"] * 16 for w in decode}
    assert min(tokens) <= 128 and max(tokens) >= 32768


def _check(name: str, solution: str, device: str) -> None:
    definition = DS.definition(name)
    if definition.op_type.startswith("gqa_"):
        # The bundled page tables (blobs) never hold an empty request; a small synthesized
        # one may, and FlashInfer's decode does not define that case.
        workload = DS.workloads_for(name)[0].workload
    else:
        workload = small_workload(definition)
    inputs = synthesize_inputs(definition, workload, device=device, seed=1, blob_root=DS)
    expected = run_reference(definition, inputs)
    (sol,) = DS.solutions_for(name, solution)
    fn = build_solution(sol)
    with torch.no_grad():
        got = outputs_as_dict(definition, fn(*[inputs[k] for k in definition.inputs]))
    verdict = compare_outputs(definition, expected, got)
    assert verdict.status.value == "PASSED", f"{name}/{solution}: {verdict.reason}"


@pytest.mark.parametrize("name", NAMES)
def test_torch_baseline_matches_reference(name):
    _check(name, "torch", "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("name", NAMES)
def test_flashtune_solution_matches_reference_on_gpu(name):
    _check(name, "flashtune", "cuda")


@pytest.mark.cuda
@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer")
@pytest.mark.parametrize("name", [n for n in NAMES if not n.startswith("gemm")])
def test_flashinfer_solution_matches_reference_on_gpu(name):
    _check(name, "flashinfer", "cuda")


def test_definitions_match_op_schemas_where_they_exist():
    from flashtune.schema.dump import model_definitions

    generated = model_definitions(["llama-3.1-8b", "llama-3.1-70b-tp8", "qwen3-8b"])
    common = sorted(set(generated) & set(DS.definitions))
    if not common:
        pytest.skip("no op schema generates a bundled definition name yet")
    for name in common:
        ours, theirs = DS.definition(name), generated[name]
        assert ours.op_type == theirs.op_type
        assert ours.const_axes == theirs.const_axes, name
        assert {k: (v.shape, v.dtype) for k, v in ours.inputs.items()} == {
            k: (v.shape, v.dtype) for k, v in theirs.inputs.items()
        }, name

"""The bundled dataset: loads cleanly, covers the shipped ops, and its baselines agree with
the references (torch on CPU; flashtune and FlashInfer on a GPU)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from unittest import mock

import pytest
import torch

from flashtune.bench import entry_points
from flashtune.bench.build import build_solution, solution_hash
from flashtune.bench.correctness import compare_outputs, distribution_check, is_stochastic
from flashtune.cli import bundled_dataset
from flashtune.data import (
    Dataset,
    Solution,
    outputs_as_dict,
    run_reference,
    small_workload,
    synthesize_inputs,
)

DS = Dataset(bundled_dataset())
NAMES = sorted(DS.definitions)
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_bundled_dataset.py"
FLASHINFER = [
    (name, s.name) for name in NAMES for s in DS.solutions_for(name) if s.author == "flashinfer"
]


def test_loads_without_errors_and_covers_the_ops():
    assert DS.load_all() == []
    op_types = {d.op_type for d in DS.definitions.values()}
    assert op_types == {
        "rmsnorm",
        "activation",
        "gemm",
        "rope",
        "gqa_paged",
        "gqa_ragged",
        "sampling",
    }
    for name in NAMES:
        sols = {s.name for s in DS.solutions_for(name)}
        assert {f"flashtune@{name}", f"torch@{name}"} <= sols, name
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
    args = [inputs[k] for k in definition.inputs]
    with torch.no_grad():
        # As the harness runs it: the setup phase (if any) once, then the runner.
        runner = fn.setup(*args) if callable(getattr(fn, "setup", None)) else fn
        got = outputs_as_dict(definition, runner(*args))
    if is_stochastic(definition):  # random draws: checked by distribution, as the harness does
        verdict = distribution_check(
            definition,
            lambda: outputs_as_dict(definition, runner(*args)),
            lambda: run_reference(definition, inputs),
            draws=10,
            inputs=inputs,
        )
    else:
        verdict = compare_outputs(definition, expected, got)
    assert verdict.status.value == "PASSED", f"{name}/{solution}: {verdict.reason}"


def test_every_solution_builds_and_says_how_it_is_run():
    for sol in DS.all_solutions():
        fn = build_solution(sol)  # imports the entry point (FlashInfer itself is imported lazily)
        description = sol.description or ""
        assert "autotuned" not in description, sol.name  # no call here runs the tuner
        planned = sol.definition.startswith("gqa_") and sol.author == "flashinfer"
        assert callable(getattr(fn, "setup", None)) == planned, (sol.definition, sol.name)
        if planned:
            assert "plan() runs once per input set in the setup phase" in description
        else:
            assert "No setup phase" in description or "no setup phase" in description, sol.name
    for name in NAMES:
        if not name.startswith("gqa_paged_decode"):
            continue
        d = DS.definition(name)
        hq, hk = d.const_axes["num_qo_heads"], d.const_axes["num_kv_heads"]
        tc = entry_points.flashinfer_decode_uses_tensor_cores(hq, hk, torch.bfloat16)
        sols = {s.name: _entry_function(s) for s in DS.solutions_for(name)}
        other = "cuda_cores" if tc else "tensor_cores"
        assert sols[f"flashinfer@{name}"] == "flashinfer_gqa_paged_decode", name
        assert sols[f"flashinfer_{other}@{name}"] == f"flashinfer_gqa_paged_decode_{other}", name


def _entry_function(solution: Solution) -> str:
    """The flashtune.bench.entry_points function a bundled solution's source binds to `run`."""
    (source,) = solution.sources
    (node,) = [n for n in ast.parse(source.content).body if isinstance(n, ast.ImportFrom)]
    assert node.module == "flashtune.bench.entry_points"
    (alias,) = node.names
    assert alias.asname == "run"
    return alias.name


def test_solutions_are_flashinfer_bench_solutions():
    """FlashInfer-Bench's form: code in `sources`, a `file.py::function` entry point, one of
    its languages, target hardware, names unique in the dataset, the calling convention
    explicit; the code's hash covers flashtune's kernels (a changed kernel is re-measured)."""
    sols = DS.all_solutions()
    assert len({s.name for s in sols}) == len(sols)
    for sol in sols:
        spec = sol.spec
        assert spec.entry_point == "main.py::run" and [s.path for s in sol.sources] == ["main.py"]
        assert spec.language in {"python", "triton"} and spec.target_hardware, sol.name
        assert "destination_passing_style" in spec.model_fields_set
        assert spec.destination_passing_style is False
        assert sol.name == f"{sol.name.partition('@')[0]}@{sol.definition}"
        assert callable(getattr(entry_points, _entry_function(sol)))
    fake = {"flashtune": "edited kernels"}
    with mock.patch("flashtune.bench.build._module_code_hash", fake.get):
        edited = solution_hash(sols[0])
    assert edited != solution_hash(sols[0])


def _script():
    spec = importlib.util.spec_from_file_location("build_bundled_dataset", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_committed_solutions_are_what_the_script_generates():
    script = _script()
    for name in NAMES:
        generated = {
            s.name: s.model_dump(mode="json") for s in script.solutions_for(DS.definition(name))
        }
        committed = {s.name: s.model_dump(mode="json") for s in DS.solutions_for(name)}
        assert committed == generated, f"{name}: run scripts/build_bundled_dataset.py"


@pytest.mark.parametrize("name", NAMES)
def test_torch_baseline_matches_reference(name):
    _check(name, f"torch@{name}", "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("name", NAMES)
def test_flashtune_solution_matches_reference_on_gpu(name):
    _check(name, f"flashtune@{name}", "cuda")


@pytest.mark.cuda
@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer")
@pytest.mark.parametrize(("name", "solution"), FLASHINFER)
def test_flashinfer_solution_matches_reference_on_gpu(name, solution):
    _check(name, solution, "cuda")


def test_definitions_are_the_op_schemas():
    """Every bundled Definition is its op schema's, field for field: the script writes none
    by hand (regenerate with scripts/build_bundled_dataset.py when a schema changes)."""
    generated = {d.name: d for d in _script().definitions()}
    assert sorted(generated) == NAMES
    for name in NAMES:
        committed = DS.definition(name).model_dump(mode="json")
        assert committed == generated[name].model_dump(mode="json"), name

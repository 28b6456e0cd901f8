"""The FlashInfer-Trace corpus loads unchanged, round-trips, and its references run on CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from _trace_corpus import corpus_root
from flashtune.data import (
    ConstraintError,
    Dataset,
    Definition,
    Trace,
    resolve_axes,
    run_reference,
    small_workload,
    synthesize_inputs,
    torch_dtype,
)

_ROOT = corpus_root()
_DEFINITION_FILES = sorted((_ROOT / "definitions").rglob("*.json")) if _ROOT.is_dir() else []
_WORKLOAD_FILES = sorted((_ROOT / "workloads").rglob("*.jsonl")) if _ROOT.is_dir() else []


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


# Inputs of this many elements from constant axes alone (a large GEMM's weight: 470M at
# N=57344, K=8192) take seconds each to synthesize on a CPU, whatever the workload's size.
_LARGE_CONSTANT_INPUTS = 48 * 2**20


def _constant_elements(stem: str) -> int:
    """Elements of the definition's inputs counted over its constant axes only."""
    path = next((p for p in _DEFINITION_FILES if p.stem == stem), None)
    if path is None:
        return 0
    definition = Definition.model_validate_json(path.read_text())
    const = definition.const_axes
    return sum(
        math.prod(const.get(a, 1) for a in spec.shape or ()) for spec in definition.inputs.values()
    )


def _by_size(paths: list[Path]) -> list[Any]:
    """One param per file; those whose definition has large constant inputs run in the slow
    step (the smaller definitions of the same op run in the main suite)."""
    return [
        pytest.param(
            p,
            id=p.stem,
            marks=[pytest.mark.slow] if _constant_elements(p.stem) > _LARGE_CONSTANT_INPUTS else [],
        )
        for p in paths
    ]


def test_corpus_present_or_skipped(trace_corpus: Path) -> None:
    assert _DEFINITION_FILES and _WORKLOAD_FILES, f"corpus at {trace_corpus} has no files"


def test_dataset_loads_without_errors(trace_corpus: Path) -> None:
    ds = Dataset(trace_corpus)
    errors = ds.load_all()
    assert errors == []
    assert len(ds.definitions) == len(_DEFINITION_FILES)
    total_lines = sum(
        1 for f in _WORKLOAD_FILES for line in f.read_text().splitlines() if line.strip()
    )
    assert sum(len(ds.workloads_for(n)) for n in ds.definitions) == total_lines


@pytest.mark.parametrize("path", _DEFINITION_FILES, ids=_ids(_DEFINITION_FILES))
def test_definition_round_trips(path: Path) -> None:
    raw = json.loads(path.read_text())
    first = Definition.model_validate(raw)
    dumped = first.to_json(indent=2)
    assert json.loads(dumped) == raw  # semantically equal JSON
    assert Definition.model_validate_json(dumped) == first


@pytest.mark.parametrize("path", _WORKLOAD_FILES, ids=_ids(_WORKLOAD_FILES))
def test_workload_lines_round_trip(path: Path) -> None:
    for line in path.read_text().splitlines():
        raw = json.loads(line)
        first = Trace.model_validate(raw)
        assert json.loads(first.to_json()) == raw
        assert Trace.model_validate_json(first.to_json()) == first


@pytest.mark.parametrize(
    "path", _by_size(_DEFINITION_FILES) or [pytest.param(None, id="no-corpus")]
)
def test_reference_runs_on_small_workload(path: Path, trace_corpus: Path) -> None:
    """Every definition's reference runs on small synthesized inputs: small_workload's axes
    satisfy its constraints, and synthesis builds index inputs that satisfy the rest."""
    definition = Definition.model_validate_json(path.read_text())
    workload = small_workload(definition)
    inputs = synthesize_inputs(definition, workload, seed=0)
    outputs = run_reference(definition, inputs)
    axes = resolve_axes(definition, workload)
    for name, spec in definition.outputs.items():
        out = outputs[name]
        assert tuple(out.shape) == tuple(axes[a] for a in spec.shape or ()), name
        assert out.dtype == torch_dtype(spec.dtype), name
        if out.dtype.is_floating_point:
            assert not torch.isnan(out).any(), f"{name} has NaN"


@pytest.mark.parametrize("path", _by_size(_WORKLOAD_FILES))
def test_real_workloads_synthesize_valid_inputs(path: Path, trace_corpus: Path) -> None:
    """Blobs are absent from the corpus copy: index inputs must be synthesized, valid."""
    ds = Dataset(trace_corpus)
    records = ds.workloads_for(path.stem)
    definition = ds.definition(path.stem)
    # Some captured workloads record an empty page pool (num_pages=0) yet index pages:
    # no valid input exists for them, which test_unsatisfiable_workload_fails_clearly covers.
    records = [r for r in records if r.workload.axes.get("num_pages", 1) > 0]
    # The smallest few workloads: large-batch GEMM/attention inputs would take minutes on CPU.
    records = sorted(records, key=lambda r: sum(r.workload.axes.values()))[:3]
    for record in records:
        inputs = synthesize_inputs(definition, record.workload, seed=1, blob_root=ds)
        for name, value in inputs.items():
            if (
                isinstance(value, torch.Tensor)
                and value.dtype.is_floating_point
                and value.numel() > 8
            ):
                assert value.abs().sum() > 0, f"{name} is all zeros"


def test_unsatisfiable_workload_fails_clearly(trace_corpus: Path) -> None:
    ds = Dataset(trace_corpus)
    bad = [
        (name, r)
        for name in ds.definitions
        for r in ds.workloads_for(name)
        if r.workload.axes.get("num_pages", 1) == 0 and r.workload.axes.get("num_kv_indices", 0) > 0
    ]
    if not bad:
        pytest.skip("this corpus copy has no workload with an empty page pool")
    name, record = bad[0]
    with pytest.raises(ConstraintError, match="page indices but num_pages=0"):
        synthesize_inputs(ds.definition(name), record.workload, blob_root=ds)


def test_corpus_files_write_back_byte_identical(trace_corpus: Path, tmp_path: Path) -> None:
    """Loaded and written back unchanged, every definition and workload file keeps its bytes
    (key order, hand formatting, final newline)."""
    source, copy = Dataset(trace_corpus), Dataset(tmp_path)
    for definition in source.definitions.values():
        copy.add_definition(definition)
        if source.workloads_for(definition.name):
            copy.add_workloads(definition, source.workloads_for(definition.name))
    files = [*_DEFINITION_FILES, *_WORKLOAD_FILES]
    changed = [
        p for p in files if p.read_bytes() != (tmp_path / p.relative_to(trace_corpus)).read_bytes()
    ]
    assert files and changed == []

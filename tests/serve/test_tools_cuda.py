"""The agent tools on a GPU (`pytest -m cuda tests/serve/test_tools_cuda.py` on the GPU machine;
skipped elsewhere): compute-sanitizer's memcheck fails a planted out-of-bounds Triton kernel
and passes an honest one, `flashtune run --sanitize` records the planted one as RUNTIME_ERROR,
and Nsight Compute's summary names the honest kernel's bandwidth.

The planted kernel is an honest RMSNorm plus one masked load far before its input (2 MiB),
whose value it multiplies by zero: its outputs are right, so only the sanitizer can fail it.
The distance keeps the read outside every allocation whatever the allocator's layout (the
sanitizer runs with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so each tensor is its own allocation).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _serve_helpers import DEFINITION, small_dataset, solution
from typer.testing import CliRunner

from flashtune.bench.nsight import find_ncu, ncu_summary
from flashtune.bench.sanitizer import find_compute_sanitizer, sanitize
from flashtune.cli import app as cli_app
from flashtune.data import Dataset

pytestmark = pytest.mark.cuda

TRITON_RMSNORM = """
import torch
import triton
import triton.language as tl


@triton.jit
def {name}(x_ptr, w_ptr, y_ptr, N: tl.constexpr, BLOCK: tl.constexpr, PLANT: tl.constexpr):
    # x, y: [rows, N] bf16; w: [N] bf16; one program per row
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask, other=0.0).to(tl.float32)
    if PLANT:
        # 1M elements (2 MiB) before the input: out of bounds, and worth nothing
        far = tl.load(x_ptr - 1048576 + offs, mask=offs < 1, other=0.0).to(tl.float32)
        x = x + far * 0.0
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + 1e-5)
    tl.store(y_ptr + row * N + offs, (x * inv * w).to(tl.bfloat16), mask=mask)


def run(hidden_states, weight):
    rows, n = hidden_states.shape
    out = torch.empty_like(hidden_states)
    {name}[(rows,)](hidden_states, weight, out, N=n, BLOCK=triton.next_power_of_2(n), PLANT={plant})
    return out
"""

HONEST_SOURCE = TRITON_RMSNORM.format(name="_rmsnorm_honest", plant=False)
PLANTED_SOURCE = TRITON_RMSNORM.format(name="_rmsnorm_oob", plant=True)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return small_dataset(tmp_path / "dataset")


def _target(dataset: Path, name: str, source: str):
    ds = Dataset(dataset)
    definition = ds.definition(DEFINITION)
    workload = ds.workloads_for(DEFINITION)[0].workload
    return definition, workload, solution(name, source)


@pytest.mark.skipif(find_compute_sanitizer() is None, reason="needs compute-sanitizer")
def test_memcheck_fails_the_planted_kernel_and_passes_the_honest_one(dataset: Path) -> None:
    definition, workload, planted = _target(dataset, "agent-oob", PLANTED_SOURCE)
    result = sanitize(definition, workload, planted, "cuda:0", [str(dataset)], ["memcheck"])
    assert result.verdict == "fail", result.to_json()
    findings = result.reports[0].findings
    assert any(
        f.kind == "out_of_bounds" and "_rmsnorm_oob" in (f.kernel or "") for f in findings
    ), result.to_json()

    _, _, honest = _target(dataset, "agent-honest", HONEST_SOURCE)
    clean = sanitize(definition, workload, honest, "cuda:0", [str(dataset)])
    assert clean.verdict == "pass", clean.to_json()
    assert [r.tool for r in clean.reports] == ["memcheck", "racecheck", "initcheck"]


@pytest.mark.skipif(find_compute_sanitizer() is None, reason="needs compute-sanitizer")
def test_run_sanitize_marks_the_planted_kernel_failed(dataset: Path, tmp_path: Path) -> None:
    source = Dataset(tmp_path / "solutions")
    source.add_definition(Dataset(dataset).definition(DEFINITION))
    source.add_solution(solution("agent-oob", PLANTED_SOURCE))
    source.add_solution(solution("agent-honest", HONEST_SOURCE))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli_app,
        [
            "run",
            "-d",
            str(dataset),
            "--solutions-from",
            str(tmp_path / "solutions"),
            "--no-bundled-solutions",
            "--devices",
            "0",
            "--sanitize",
            "--quiet",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    traces = {t.solution: t.evaluation for t in Dataset(out).traces_for(DEFINITION)}
    assert traces["agent-oob"].status.value == "RUNTIME_ERROR"
    assert "compute-sanitizer fail" in (traces["agent-oob"].reason or "")
    assert traces["agent-honest"].status.value == "PASSED"


@pytest.mark.skipif(find_ncu() is None, reason="needs Nsight Compute (ncu)")
def test_ncu_summary_names_the_kernels_bandwidth(dataset: Path) -> None:
    definition, workload, honest = _target(dataset, "agent-honest", HONEST_SOURCE)
    result = ncu_summary(definition, workload, honest, "cuda:0", [str(dataset)])
    assert result.status == "ok", result.to_json()
    [kernel] = [k for k in result.kernels if "_rmsnorm_honest" in k.kernel]
    assert kernel.bandwidth is not None and kernel.bandwidth > 0
    assert kernel.peak_bandwidth is not None and kernel.bandwidth < kernel.peak_bandwidth * 1.05
    assert "TB/s" in kernel.line() and kernel.kernel in result.detail


def test_tools_are_found_on_the_gpu_machine() -> None:
    """The GPU machine is where these tools must exist: say so rather than skip silently."""
    missing = [
        tool
        for tool, found in (("compute-sanitizer", find_compute_sanitizer()), ("ncu", find_ncu()))
        if found is None
    ]
    assert not missing, f"not found: {missing} (PATH: {shutil.which('nvcc')=})"

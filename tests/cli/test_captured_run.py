"""`flashtune run` on a dataset written by capture: the bundled solutions (and those of
--solutions-from) attach to the captured definitions of the same contract, a definition of
another contract gets none and the run says why, and the sources contribute no workloads.
Every run here stops at `--devices 99`, after the checks and notes and before any worker
starts (the whole loop on the CPU: tests/apply/test_captured_loop.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from typer.testing import CliRunner

import flashtune
from _examples import GOOD_DEFINITION
from flashtune.cli import app, bundled_dataset
from flashtune.data import Dataset, Definition, Solution, Workload
from flashtune.ops.gemm import gemm

runner = CliRunner()
WIDE = {"COLUMNS": "300"}
NAME = "gemm_n8192_k1024"  # a bundled definition (float16)


def _capture(root: Path, dtype: torch.dtype) -> Path:
    with flashtune.capture(dataset=root) as cap:
        gemm(torch.randn(2, 1024, dtype=dtype), torch.randn(8192, 1024, dtype=dtype))
    assert cap.stats["written"] == 1
    return root


def _run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["run", *args, "--devices", "99", "-q"], env=WIDE)
    return result.exit_code, result.stderr


def test_the_bundled_solutions_attach_to_a_captured_definition(tmp_path: Path) -> None:
    root = _capture(tmp_path / "captured", torch.float16)
    code, said = _run("-d", str(root))
    assert code == 2, said  # stopped at --devices 99: everything before it passed
    assert f"note: solutions from {bundled_dataset()} run on 1 definition" in said
    assert "no solutions" not in said and "do not attach" not in said


def test_a_captured_definition_of_another_contract_gets_none(tmp_path: Path) -> None:
    root = _capture(tmp_path / "captured", torch.float32)  # the bundled one is float16
    code, said = _run("-d", str(root))
    assert code == 1
    assert "no solutions for the 1 selected definitions" in said
    assert f"torch@{NAME}" in said and "do not attach" in said
    assert "inputs.A: float32[M, K] vs float16[M, K]" in said


def test_the_bundled_dataset_as_a_root_runs_its_workloads_and_says_so(tmp_path: Path) -> None:
    root = _capture(tmp_path / "captured", torch.float16)
    code, said = _run("-d", str(root), "-d", str(bundled_dataset()))
    assert code == 2
    assert "runs its own workloads too" in said


def test_solutions_from_another_dataset(tmp_path: Path) -> None:
    definition = Definition.model_validate(GOOD_DEFINITION)
    captured = Dataset(tmp_path / "captured")
    captured.add_definition(definition)
    captured.add_workloads(definition, [Workload(uuid="w0", axes={"n": 1}, inputs={})])
    source = Dataset(tmp_path / "kernels")
    source.add_definition(definition)
    source.add_solution(
        Solution.model_validate(
            {
                "name": "mine",
                "definition": definition.name,
                "author": "me",
                "spec": {
                    "language": "python",
                    "target_hardware": ["cpu"],
                    "entry_point": "main.py::run",
                },
                "sources": [{"path": "main.py", "content": "def run(x):\n    return x * 2\n"}],
            }
        )
    )
    code, said = _run("-d", str(tmp_path / "captured"))
    assert code == 1 and "no solutions" in said and "--solutions-from" in said
    code, said = _run(
        "-d", str(tmp_path / "captured"), "--solutions-from", str(tmp_path / "kernels")
    )
    assert code == 2, said
    assert f"note: solutions from {(tmp_path / 'kernels').resolve()} run on 1 definition" in said
    code, said = _run("-d", str(tmp_path / "captured"), "--solutions-from", str(tmp_path / "nope"))
    assert code == 2 and "no such folder" in said

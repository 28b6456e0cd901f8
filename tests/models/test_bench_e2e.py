"""benchmarks/bench_e2e.py: its pure parts (grid, output check, summary) and, slow, the
whole code path on CPU with the tiny config (Triton interpreter, no rows written)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_e2e.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_e2e", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load()


def test_decode_grid_skips_points_over_the_token_budget() -> None:
    grid = bench.decode_grid([1, 16, 256], [1024, 32768], max_tokens=2**20)
    assert grid == [(1, 1024), (1, 32768), (16, 1024), (16, 32768), (256, 1024)]
    assert bench.pages_for(grid, 16) == 16 * 32768 // 16
    full = bench.decode_grid(bench.BATCHES, bench.KV_LENS)
    assert (256, 32768) not in full and (64, 32768) in full


def test_compare_reports_error_greedy_agreement_and_verdict() -> None:
    reference = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]])
    same = bench.compare(reference.clone(), reference)
    assert same["rel_err"] == 0.0 and same["greedy_match"] == 1.0 and same["outputs_match"]
    swapped = reference.clone()
    swapped[1] = torch.tensor([0.0, 3.0, 1.0])  # row 1's argmax moves
    verdict = bench.compare(swapped, reference)
    assert verdict["greedy_match"] == 0.5
    assert verdict["max_abs_err"] == 3.0
    assert not verdict["outputs_match"]


def test_speedups_are_geomeans_over_shapes_both_timed() -> None:
    def row(shape: int, solution: str, ms: float | None) -> dict:
        return {
            "op": "e2e_decode",
            "shape": {"batch": shape},
            "solution": solution,
            "latency_ms": ms,
        }

    rows = [
        row(1, "flashtune", 1.0),
        row(1, "torch", 2.0),
        row(2, "flashtune", 1.0),
        row(2, "torch", 8.0),
        row(2, "flashinfer", 1.0),
        row(3, "flashtune", None),
        row(3, "torch", 5.0),  # ours failed: not counted
    ]
    out = bench.speedups(rows, "e2e_decode")
    assert out["torch"]["shapes"] == 2
    assert math.isclose(out["torch"]["geomean_speedup"], 4.0)
    assert out["flashinfer"] == {"geomean_speedup": 1.0, "shapes": 1}
    assert bench.speedups(rows, "e2e_prefill") == {}


def test_arguments_put_the_reference_first_and_reject_unknown_backends() -> None:
    args = bench.parse_args(["--backends", "flashtune,torch", "--batches", "1,16"])
    assert args.backends == ["torch", "flashtune"] and args.batches == [1, 16]
    with pytest.raises(SystemExit):
        bench.parse_args(["--backends", "tvm"])


@pytest.mark.slow
def test_the_code_path_runs_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--config",
        "tiny",
        "--device",
        "cpu",
        "--dtype",
        "float16",
        "--backends",
        "torch,flashtune",
        "--batches",
        "2",
        "--kv-lens",
        "12",
        "--repetitions",
        "1",
        "--no-tune",
    ]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    assert "e2e_decode    2 x     12 flashtune" in printed
    assert "e2e_prefill: flashtune vs torch" in printed
    assert "greedy=1.00" in printed

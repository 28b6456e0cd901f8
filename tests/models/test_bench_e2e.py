"""The end-to-end benchmark (flashtune.models.bench): its pure parts (grid, output check,
summary, options, rows) and its command lines (benchmarks/bench_e2e.py, `flashtune e2e`);
slow, the whole code path on CPU with the tiny config (Triton interpreter, no rows written)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flashtune.cli import app
from flashtune.models import bench
from flashtune.models.bench import E2EOptions, JsonlRows

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_e2e.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_e2e", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


script = _load()


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
    args = script.parse_args(["--backends", "flashtune,torch", "--batches", "1,16"])
    assert args.backends == ["torch", "flashtune"] and args.batches == [1, 16]
    options = script.options_of(args)
    assert options.backends == ("torch", "flashtune") and options.batches == (1, 16)
    assert options.decode_points() == [(1, 1024), (1, 4096), (1, 16384), (1, 32768)] + [
        (16, n) for n in bench.KV_LENS
    ]
    with pytest.raises(SystemExit):
        script.parse_args(["--backends", "tvm"])


def test_options_check_their_values_and_order_the_backends() -> None:
    assert E2EOptions(backends=("flashtune", "torch")).backends == ("torch", "flashtune")
    for bad in ({"backends": ("tvm",)}, {"config": "gpt-2"}, {"dtype": "float32"}):
        with pytest.raises(ValueError):
            E2EOptions(**bad)  # type: ignore[arg-type]
    tiny = E2EOptions(config="tiny", batches=(2,), kv_lens=(1024,))
    assert tiny.decode_points() == [(2, 64)] and tiny.prefill_points() == [(2, 16)]
    assert E2EOptions(quick=True, skip_decode=True).decode_points() == []
    assert E2EOptions(quick=True).prefill_points() == list(bench.QUICK_PREFILL)


def test_jsonl_rows_carry_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "results" / "e2e.jsonl"
    copy = tmp_path / "out" / "e2e.jsonl"  # $OUT on a lent GPU machine
    rows = JsonlRows(path, "cpu", [copy])
    rows.write("e2e_decode", {"batch": 1}, "flashtune", 1.5, rel_err=0.0)
    rows.write("e2e_decode", {"batch": 1}, "torch", None, error="boom")
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["solution"] for r in written] == ["flashtune", "torch"]
    assert written[0]["latency_ms"] == 1.5 and written[0]["rel_err"] == 0.0
    assert written[1]["error"] == "boom"
    for key in ("gpu", "versions", "commit", "code", "run_started", "date"):
        assert key in written[0], key
    assert copy.read_text() == path.read_text()  # each row in both, as it is written
    # --out already under $OUT: the copy is the file itself, and each row is written once.
    same = JsonlRows(copy, "cpu", [tmp_path / "out" / ".." / "out" / "e2e.jsonl"])
    same.write("e2e_decode", {"batch": 2}, "flashtune", 2.5)
    assert len(copy.read_text().splitlines()) == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a GPU-less machine")
def test_the_cli_says_the_grid_needs_cuda_and_how_to_run_on_cpu() -> None:
    result = CliRunner().invoke(app, ["e2e", "--layers", "4", "--quick"])
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    assert "needs CUDA" in message and "--config tiny --device cpu" in message
    assert script.main(["--layers", "4", "--quick"]) == 1


def test_the_cli_rejects_bad_flags_clearly() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["e2e", "--device", "cpu", "--backends", "tvm"])
    assert result.exit_code == 2 and "unknown backends ['tvm']" in result.output
    result = runner.invoke(app, ["e2e", "--device", "cpu", "--batches", "1,x"])
    assert result.exit_code == 2 and "--batches" in result.output
    result = runner.invoke(app, ["e2e", "--device", "cpu", "--config", "tiny", "--loop"])
    assert result.exit_code == 2 and "--dataset" in result.output


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
    assert script.main(argv) == 0
    printed = capsys.readouterr().out
    assert "e2e_decode    2 x     12 flashtune" in printed
    assert "e2e_prefill: flashtune vs torch" in printed
    assert "greedy=1.00" in printed


@pytest.mark.slow
def test_the_cli_runs_the_code_path_on_cpu() -> None:
    argv = ["e2e", "--config", "tiny", "--device", "cpu", "--dtype", "float16"]
    argv += ["--backends", "flashtune,torch", "--batches", "2", "--kv-lens", "12"]
    argv += ["--repetitions", "1", "--no-tune", "--skip-prefill"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert "e2e_decode    2 x     12 flashtune" in result.output
    assert "e2e_decode: flashtune vs torch" in result.output

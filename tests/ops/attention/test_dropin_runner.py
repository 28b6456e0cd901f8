"""The drop-in runner's CPU machinery for FlashInfer's attention tests
(scripts/flashinfer_dropin): CUDA graphs emulated on the CPU (cpu_graphs.py), and the
per-test timeout and Triton cache of run.py."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

from flashtune.ops.attention.decode import CUDAGraphBatchDecodeWithPagedKVCacheWrapper
from flashtune.ops.attention.reference import batch_decode_ref

DROPIN = Path(__file__).resolve().parents[3] / "scripts" / "flashinfer_dropin"
B, H, D, PAGE, PAGES = 3, 2, 64, 4, 5


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"dropin_{name}", DROPIN / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cpu_graphs():
    if torch.cuda.is_available():
        pytest.skip("the emulation stands in for CUDA graphs where there is no GPU")
    module = _load("cpu_graphs")
    uninstall = module.install()
    yield module
    uninstall()


def _plan(wrapper, pages_per_request: int) -> tuple[torch.Tensor, ...]:
    indptr = torch.arange(B + 1, dtype=torch.int32) * pages_per_request
    indices = torch.arange(B * pages_per_request, dtype=torch.int32)
    last = torch.full((B,), PAGE, dtype=torch.int32)
    wrapper.plan(indptr, indices, last, H, H, D, PAGE, q_data_type=torch.float16)
    return indptr, indices, last


def test_a_replay_reruns_the_captured_work_on_the_new_plan(cpu_graphs):
    """FlashInfer's pattern: plan a warm-up batch, capture run, plan the real batch, replay.
    The output the capture returned holds the real batch's attention after the replay, and
    only then (the capture itself computed the warm-up batch)."""
    kv = torch.randn(B * PAGES, 2, PAGE, H, D, dtype=torch.float16)
    q = torch.randn(B, H, D, dtype=torch.float16)
    wrapper = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        torch.empty(1 << 20, dtype=torch.int8),
        torch.empty(B + 1, dtype=torch.int32),
        torch.empty(B * PAGES, dtype=torch.int32),
        torch.empty(B, dtype=torch.int32),
    )
    _plan(wrapper, 1)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = wrapper.run(q, kv)
    assert g.steps  # the kernel launches were recorded
    indptr, indices, last = _plan(wrapper, PAGES)
    ref, _ = batch_decode_ref(q, kv[:, 0], kv[:, 1], indptr, indices, last, D**-0.5)
    assert not torch.allclose(out.float(), ref.float(), atol=1e-2)  # still the warm-up batch
    g.replay()
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)


def test_the_stand_ins_are_put_back(cpu_graphs):
    assert torch.cuda.CUDAGraph is cpu_graphs.CUDAGraph
    real = _load("cpu_graphs")  # a second copy: install and put back
    graph_class = torch.cuda.CUDAGraph
    real.install()()
    assert torch.cuda.CUDAGraph is graph_class


def test_file_limit_scales_with_the_sample():
    run = _load("run")
    assert run.file_limit(900, None, 50) == 900
    assert run.file_limit(900, 5, 10) == 900
    assert run.file_limit(900, 60, 20) == 20 * 60 + run.STARTUP_SECONDS


@pytest.mark.slow  # the runner in a subprocess, waiting out its timeouts: ~10 s
def test_per_test_timeout_and_triton_cache(tmp_path):
    """A test past --per-test-timeout fails alone and the file goes on past --timeout (its
    limit scales with the sample), and the test processes see --triton-cache as
    TRITON_CACHE_DIR."""
    (tmp_path / "test_slow.py").write_text(
        "import os, time\n"
        "def test_cache_dir():\n"
        f"    assert os.environ['TRITON_CACHE_DIR'] == {str(tmp_path / 'cache')!r}\n"
        "def test_slow():\n"
        "    time.sleep(30)\n"
        "def test_after():\n"
        "    time.sleep(3)\n"
    )
    out = tmp_path / "summary.json"
    command = [sys.executable, str(DROPIN / "run.py"), "--tests-dir", str(tmp_path)]
    command += ["--files", "test_slow", "--per-test-timeout", "4", "--out", str(out)]
    command += ["--timeout", "2"]  # less than the tests take: the sample's budget wins
    command += ["--triton-cache", str(tmp_path / "cache")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["files"]
    assert row["finished"]
    assert row["counts"] == {"passed": 2, "failed": 1, "skipped": 0, "error": 0}
    assert list(row["failures"]) == ["test_slow.py::test_slow"]
    assert "Timeout" in row["failures"]["test_slow.py::test_slow"]


def _slow_files(tmp_path):
    for name in ("test_first", "test_second"):
        (tmp_path / f"{name}.py").write_text(
            "import time\ndef test_quick():\n    pass\ndef test_slow():\n    time.sleep(60)\n"
        )
    out = tmp_path / "summary.json"
    command = [sys.executable, str(DROPIN / "run.py"), "--tests-dir", str(tmp_path)]
    return out, command + ["--files", "test_first,test_second", "--out", str(out)]


@pytest.mark.slow  # two runner subprocesses, waiting out a deadline and a timeout: ~18 s
def test_deadline_reports_what_ran_and_what_did_not(tmp_path):
    out, command = _slow_files(tmp_path)
    proc = subprocess.run(
        command + ["--deadline", "8"], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(out.read_text())
    (row,) = summary["files"]
    assert row["file"] == "test_first" and not row["finished"]
    # The test running at the deadline is not reached, not an error: nothing failed.
    assert row["counts"]["passed"] == 1 and row["counts"]["error"] == 0
    assert row["not_reached"] == 1 and row["not_reached_ids"] == ["test_first.py::test_slow"]
    assert summary["not_run"] == ["test_second"] and not summary["interrupted"]
    # --resume runs what the deadline cut: test_first's unreached test, and test_second
    # whole (its test_slow fails by the per-test timeout instead of sleeping a minute).
    resumed = tmp_path / "resumed.json"
    command = [sys.executable, str(DROPIN / "run.py"), "--tests-dir", str(tmp_path), "--full"]
    command += ["--resume", str(out), "--out", str(resumed), "--per-test-timeout", "3"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = json.loads(resumed.read_text())["files"]
    assert (first["file"], first["selected"], first["collected"]) == ("test_first", 1, 2)
    assert list(first["failures"]) == ["test_first.py::test_slow"]
    assert (second["file"], second["selected"]) == ("test_second", 2)
    assert second["counts"]["passed"] == 1


@pytest.mark.slow  # the runner in a subprocess, signalled after 5 s
def test_sigterm_writes_the_summary_of_what_ran(tmp_path):
    out, command = _slow_files(tmp_path)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(5)  # the first file's process is running (or still starting)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, output
    summary = json.loads(out.read_text())
    assert summary["interrupted"] and summary["not_run"] == ["test_second"]
    assert summary["files"][0]["file"] == "test_first"


@pytest.mark.slow  # processes for seconds (the main suite stays under 10 minutes)
def test_workers_split_a_files_sample_and_merge_the_counts(tmp_path):
    """--workers 3: every sampled test runs once, in one of three processes, and the file's
    counts add up as one process would report them."""
    ran = tmp_path / "ran"
    ran.mkdir()
    body = ["import os, pathlib, pytest", f"RAN = pathlib.Path({str(ran)!r})"]
    for i in range(7):
        body += [f"def test_{i}():", f"    (RAN / ('{i}-' + str(os.getpid()))).touch()"]
    body += ["def test_fails():", "    assert False", "def test_skips():", "    pytest.skip('own')"]
    (tmp_path / "test_many.py").write_text("\n".join(body) + "\n")
    out = tmp_path / "summary.json"
    command = [sys.executable, str(DROPIN / "run.py"), "--tests-dir", str(tmp_path)]
    command += ["--files", "test_many", "--full", "--workers", "3", "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["files"]
    assert row["finished"] and row["selected"] == 9 and row["collected"] == 9
    assert row["counts"] == {"passed": 7, "failed": 1, "skipped": 1, "error": 0}
    assert list(row["failures"]) == ["test_many.py::test_fails"]
    names = [p.name.split("-") for p in ran.iterdir()]
    assert sorted(int(i) for i, _ in names) == list(range(7))  # each test exactly once
    assert len({pid for _, pid in names}) == 3  # in three processes


# ~4 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
@pytest.mark.slow
def test_retry_failed_reruns_only_the_failures(tmp_path):
    """--resume S --retry-failed: the tests that failed in S (device out of memory with many
    processes side by side) run again, alone; the ones that passed do not."""
    (tmp_path / "test_flaky.py").write_text("def test_a():\n    pass\ndef test_b():\n    pass\n")
    earlier = tmp_path / "earlier.json"
    failures = {"test_flaky.py::test_b": "torch.OutOfMemoryError", "<process>": "x"}
    earlier.write_text(json.dumps({"files": [{"file": "test_flaky", "failures": failures}]}))
    out = tmp_path / "retried.json"
    command = [sys.executable, str(DROPIN / "run.py"), "--tests-dir", str(tmp_path), "--full"]
    command += ["--resume", str(earlier), "--retry-failed", "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["files"]
    assert (row["file"], row["selected"], row["collected"]) == ("test_flaky", 1, 2)
    assert row["counts"]["passed"] == 1 and not row["failures"]

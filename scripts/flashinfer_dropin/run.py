"""Run FlashInfer 0.2.14's own test files with flashtune standing in for `flashinfer`.

    python scripts/flashinfer_dropin/run.py                 # 30 sampled tests a file
    python scripts/flashinfer_dropin/run.py --per-file 60 --files test_norm,test_rope
    python scripts/flashinfer_dropin/run.py --full          # every test of every file
    python scripts/flashinfer_dropin/run.py --collect-only  # no GPU needed: what would run
    python scripts/flashinfer_dropin/run.py --cpu --files test_norm -k "111 and -19]"
    python scripts/flashinfer_dropin/run.py --triton-cache ~/.cache/ft-dropin --per-test-timeout 120
    python scripts/flashinfer_dropin/run.py --full --resume summary.json   # what a deadline cut
    python scripts/flashinfer_dropin/run.py --full --resume summary.json --retry-failed
    python scripts/flashinfer_dropin/run.py --full --files test_deepseek_mla --workers 8 --gpus 2

The tests come from the FlashInfer sdist (.peer/, filled by scripts/fetch_gpu_deps.sh); they
run unchanged, each file in its own pytest process (a CUDA fault in one file cannot poison
the next), with standin/ first on sys.path: a `flashinfer` package re-exporting flashtune,
and the two helper modules the sdist lacks (jit_utils.py: no-op JIT warm-ups;
rope_reference.py: written from the RoPE definition).

Large parameter grids are sampled deterministically: the tests of a file are ordered by the
SHA-256 of their id (the part after the file name) and the first N kept, so a run is
repeatable and a larger N keeps every test a smaller one ran.

--cpu is a smoke test for machines without a GPU, and the one mode that edits the tests: each
file's device strings become "cpu" (CPU_REWRITES) and Triton runs in its interpreter. Pick
small shapes with -k (the interpreter is slow); a CUDA run remains the acceptance test.
The tests' CUDA graphs (capture, re-plan, replay) are emulated there (cpu_graphs.py): a
replay runs the captured Triton launches and torch ops again with their captured arguments.

Time limits: --timeout bounds a file's process (default 900 s); --per-test-timeout (pytest-
timeout) bounds each test, so one slow compile fails one test instead of the whole file, and
then a file's limit scales with its sample: at least (tests x per-test timeout) + 120 s.
--triton-cache DIR is the test processes' TRITON_CACHE_DIR: kernels compiled by one file
or run are reused by the next (the same kernel variants recur across files). --deadline S
bounds the whole run: the file running then stops with what it ran and later files are
listed as not run; SIGTERM (an outer `timeout`) and Ctrl-C do the same at once. Either way
the summary is written.

--workers N runs a file's sample in N processes side by side (process k takes every N-th
test from the k-th; the counts are merged): tests that spend their time compiling or on the
host, as most of these do, finish about N times sooner on one GPU. --gpus G spreads them over
G GPUs of the machine (process k sees GPU k mod G alone, through CUDA_VISIBLE_DEVICES), for
tests whose references need tens of GiB each (test_deepseek_mla's).

Prints pass/fail/skip counts per file and writes a JSON summary (per file: counts, the
failures with their first error line) to $OUT/flashinfer_dropin.json, or --out.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STANDIN = HERE / "standin"
SDIST = ROOT / ".peer" / "flashinfer_python-0.2.14.post1.tar.gz"

# The files of issue 14, by their names in the sdist.
FILES = (
    "test_logits_cap",
    "test_non_contiguous_decode",
    "test_non_contiguous_prefill",
    "test_sliding_window",
    "test_rope",
    "test_tensor_cores_decode",
    "test_batch_decode_kernels",
    "test_batch_prefill_kernels",
    "test_page",
    "test_norm",
    "test_activation",
    "test_single_prefill",
    "test_shared_prefix_kernels",
    "test_decode_prefill_lse",
    "test_sampling",
    "test_block_sparse",
    # issue 34: MLA (flashinfer.mla's wrapper, the QK 192 / VO 128 prefills, the MLA append)
    "test_deepseek_mla",
    "test_mla_page",
    # issue 35: fp8 GEMM (flashinfer.gemm: bmm_fp8 and the block-scaled GEMMs; the second
    # file imports einops, which scripts/fetch_gpu_deps.sh fetches)
    "test_bmm_fp8",
    "test_groupwise_scaled_gemm_fp8",
)

# Test files of the sdist that need hardware backends flashtune does not have: out of scope
# (issue 14), never run here.
OUT_OF_SCOPE = {
    "test_cudnn_decode": "cuDNN's decode attention (cudnn_batch_decode_with_kv_cache)",
    "test_cudnn_prefill": "cuDNN's prefill attention",
    "test_cudnn_prefill_deepseek": "cuDNN's prefill attention at DeepSeek's head sizes",
    "test_trtllm_gen_attention": "TRT-LLM-gen attention kernels (trtllm_batch_*_with_kv_cache)",
    "test_trtllm_gen_mla": "TRT-LLM-gen MLA decode kernels",
    "test_trtllm_gen_fused_moe": "TRT-LLM-gen fused MoE kernels",
    "test_trtllm_cutlass_fused_moe": "TRT-LLM's CUTLASS fused MoE",
    "test_trtllm_allreduce": "TRT-LLM all-reduce (multi-GPU communication)",
    "test_trtllm_allreduce_fusion": "TRT-LLM fused all-reduce (multi-GPU communication)",
    "test_trtllm_alltoall": "TRT-LLM all-to-all (multi-GPU communication)",
    "test_trtllm_mnnvl_allreduce": "TRT-LLM multi-node NVLink all-reduce",
    "test_trtllm_moe_allreduce_fusion": "TRT-LLM MoE all-reduce fusion",
    "test_trtllm_moe_allreduce_fusion_finalize": "TRT-LLM MoE all-reduce fusion",
    "test_blackwell_fmha": "Blackwell (SM100) CUTLASS attention",
    "test_attention_sink_blackwell": "Blackwell (SM100) attention with sinks",
    "test_cute_dsl_blockscaled_gemm": "Blackwell CuTe-DSL block-scaled GEMM",
    "test_groupwise_scaled_gemm_mxfp4": "Blackwell MXFP4 group GEMM",
    "test_mm_fp4": "FP4 GEMM (Blackwell, cuDNN / CUTLASS / TRT-LLM backends)",
    "test_fp4_quantize": "FP4 quantization (Blackwell)",
    "test_fp4_tensor_torch_cute": "FP4 tensors through CuTe (Blackwell)",
}

# FlashInfer APIs these files call that flashtune does not implement (no hardware reason):
# their tests fail until it does, and are counted as failures, not skipped.
MISSING_APIS: dict[str, str] = {}


# --cpu: FlashInfer's tests name their device in these ways; on CPU they become "cpu", and the
# PDL guard (`major, _ = get_compute_capability(x.device)`, CUDA only) sees a Hopper, so the
# enable_pdl=True cases run (PDL itself is off on CPU tensors).
CPU_REWRITES = (
    (r'device="cuda(:0)?"', 'device="cpu"'),
    (r'"cuda(:0)?"', '"cpu"'),
    (r"\.to\(0\)", '.to("cpu")'),
    (r"\bdevice=0\b", 'device="cpu"'),  # test_block_sparse's tensors
    (r"major, _ = get_compute_capability\(\w+\.device\)", "major = 9"),
)


def rewrite_for_cpu(source: str) -> str:
    for pattern, replacement in CPU_REWRITES:
        source = re.sub(pattern, replacement, source)
    return source


def sample_key(nodeid: str) -> str:
    """The sampling order of a test: SHA-256 of its id without the file part."""
    return hashlib.sha256(nodeid.split("::", 1)[-1].encode()).hexdigest()


def sample(nodeids: list[str], per_file: int | None) -> list[str]:
    """The tests of one file to run: the first `per_file` by sample_key, in file order
    (None: all)."""
    if per_file is None or len(nodeids) <= per_file:
        return list(nodeids)
    keep = set(sorted(nodeids, key=sample_key)[:per_file])
    return [n for n in nodeids if n in keep]


# --------------------------------------------------------------------------- child: one file


def selected_ids(result: Path) -> Path:
    """Where a child writes the ids of the tests it selected, beside its result file."""
    return result.with_suffix(".ids.json")


class SamplingPlugin:
    """pytest plugin: keep a file's sample, record each test's outcome, and rewrite the result
    file after each one (a file that times out or crashes the process keeps what it ran)."""

    def __init__(
        self,
        test_file: Path,
        per_file: int | None,
        result: Path,
        shard: tuple[int, int] = (0, 1),
        only: set[str] | None = None,
    ) -> None:
        self.test_file = test_file
        self.per_file = per_file
        self.shard = shard
        self.result = result
        self.only = only  # --resume: run only these test ids (before sampling)
        self.collected = 0
        self.selected: list[str] = []
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.start = time.perf_counter()

    def write(self, finished: bool, pytest_exit: int | None = None) -> None:
        counts: dict[str, int] = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
        for entry in self.outcomes.values():
            counts[entry["outcome"]] += 1
        payload = {
            "file": self.test_file.stem,
            "collected": self.collected,
            "selected": len(self.selected),
            "counts": counts,
            "finished": finished,
            "failures": {
                nodeid: entry["message"]
                for nodeid, entry in self.outcomes.items()
                if entry["outcome"] in ("failed", "error")
            },
            "seconds": round(time.perf_counter() - self.start, 1),
            "pytest_exit": pytest_exit,
        }
        partial = self.result.with_suffix(".partial")
        partial.write_text(json.dumps(payload, indent=1))
        os.replace(partial, self.result)

    @pytest.hookimpl(trylast=True)  # after -k has deselected: sample what it kept
    def pytest_collection_modifyitems(self, session: Any, config: Any, items: list[Any]) -> None:
        self.collected = len(items)
        index, count = self.shard  # this process's part of the sample, in collection order
        candidates = [item.nodeid for item in items]
        if self.only is not None:
            candidates = [nodeid for nodeid in candidates if nodeid in self.only]
        keep = set(sample(candidates, self.per_file)[index::count])
        kept = [item for item in items if item.nodeid in keep]
        dropped = [item for item in items if item.nodeid not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        self.selected = [item.nodeid for item in kept]
        # The ids once, beside the result: a run stopped by its deadline lists the ones it
        # did not reach from them (pytest runs the kept items in this order).
        selected_ids(self.result).write_text(json.dumps(self.selected))
        self.write(finished=False)

    def pytest_runtest_logreport(self, report: Any) -> None:
        # A test's outcome: its call, or a setup that failed or skipped it.
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            outcome = report.outcome
            if report.when == "setup" and outcome == "failed":
                outcome = "error"
            message = ""
            if outcome in ("failed", "error"):
                message = _first_error_line(str(report.longrepr))
            elif outcome == "skipped" and isinstance(report.longrepr, tuple):
                message = str(report.longrepr[2])
            self.outcomes[report.nodeid] = {"outcome": outcome, "message": message[:300]}
            self.write(finished=False)

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:  # the file did not import (a missing name, a missing module)
            self.outcomes[report.nodeid or "<collection>"] = {
                "outcome": "error",
                "message": _first_error_line(str(report.longrepr))[:300],
            }


def _first_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("E "):
            return ln[2:].strip()
    return lines[-1] if lines else ""


def run_child(
    test_file: Path,
    per_file: int | None,
    collect_only: bool,
    select: str | None,
    result: Path,
    per_test_timeout: float | None = None,
    cpu: bool = False,
    shard: tuple[int, int] = (0, 1),
    only: set[str] | None = None,
) -> int:
    sys.path.insert(0, str(STANDIN))
    if cpu:
        import cpu_graphs  # this folder is sys.path[0]: the script's own

        cpu_graphs.install()
    plugin = SamplingPlugin(test_file, per_file, result, shard, only)
    args = [
        str(test_file),
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--rootdir",
        str(test_file.parent),
        "-W",
        "ignore::DeprecationWarning",
    ]
    if collect_only:
        args.append("--collect-only")
    if select:
        args += ["-k", select]
    if per_test_timeout:
        args.append(f"--timeout={per_test_timeout:g}")  # pytest-timeout loads itself
    code = pytest.main(args, plugins=[plugin])
    plugin.write(finished=True, pytest_exit=int(code))
    return 0


# --------------------------------------------------------------------------- parent


def extract_tests(sdist: Path, dest: Path) -> Path:
    """The sdist's tests/ folder (Python files only), extracted under dest."""
    with tarfile.open(sdist) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.isfile() and "/tests/" in m.name and m.name.endswith(".py")
        ]
        if not members:
            raise SystemExit(f"{sdist} has no tests/ folder")
        for m in members:
            m.name = "tests/" + m.name.split("/tests/", 1)[1]
        tar.extractall(dest, members=members, filter="data")
    return dest / "tests"


# Seconds a file's process gets beyond its tests' budgets: start-up, imports, collection.
STARTUP_SECONDS = 120.0
POLL_SECONDS = 2.0
STOP: list[str] = []  # non-empty once the run was interrupted: no further file starts


def file_limit(timeout: float, per_test_timeout: float | None, selected: int) -> float:
    """Seconds a file's process may run: --timeout; with --per-test-timeout, at least every
    selected test's whole budget plus STARTUP_SECONDS, so that compile time fails single
    tests (pytest-timeout) and never kills the file as a whole."""
    if not per_test_timeout:
        return timeout
    return max(timeout, selected * per_test_timeout + STARTUP_SECONDS)


def _run_with_limit(
    commands: list[list[str]],
    envs: list[dict[str, str]],
    cwd: Path,
    timeout: float,
    per_test_timeout: float | None,
    results: list[Path],
    deadline: float | None = None,
) -> list[tuple[str, float | None]]:
    """Run a file's child processes (one per shard, side by side, each with its env), each
    under file_limit (known once the child has written its sample size to its result file),
    and never past `deadline` (a time.perf_counter() value). Ctrl-C or SIGTERM kills the
    children and returns, so the caller reports what they ran. Returns each child's output,
    and the limit it was killed at (None when it ended by itself)."""
    logs = [tempfile.TemporaryFile(mode="w+") for _ in commands]  # no pipe to fill up
    procs = [
        subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True)
        for command, env, log in zip(commands, envs, logs, strict=True)
    ]
    start = time.perf_counter()
    killed: list[float | None] = [None] * len(procs)

    def output(k: int) -> str:
        logs[k].seek(0)
        return logs[k].read()

    try:
        while any(proc.poll() is None for proc in procs):
            time.sleep(POLL_SECONDS)
            for k, proc in enumerate(procs):
                if proc.poll() is not None:
                    continue
                limit = timeout
                if per_test_timeout and results[k].exists():  # written whole (os.replace)
                    selected = int(json.loads(results[k].read_text())["selected"])
                    limit = file_limit(timeout, per_test_timeout, selected)
                if deadline is not None:  # the whole run's --deadline comes first
                    limit = min(limit, deadline - start)
                if time.perf_counter() - start > limit:
                    proc.kill()
                    proc.wait()
                    killed[k] = limit
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (an outer timeout): keep what ran
        for k, proc in enumerate(procs):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                killed[k] = time.perf_counter() - start
        STOP.append("interrupted")
    return [(output(k), killed[k]) for k in range(len(procs))]


def _merge_shards(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """One file's result from its shards' results."""
    merged = dict(payloads[0])
    merged["selected"] = sum(p["selected"] for p in payloads)
    merged["counts"] = {
        key: sum(p["counts"][key] for p in payloads) for key in payloads[0]["counts"]
    }
    merged["finished"] = all(p["finished"] for p in payloads)
    merged["failures"] = {
        (f"{k} (shard {n})" if k == "<process>" else k): v
        for n, p in enumerate(payloads)
        for k, v in p["failures"].items()
    }
    not_reached = sum(p.get("not_reached", 0) for p in payloads)
    if not_reached:
        merged["not_reached"] = not_reached
        merged["not_reached_ids"] = [i for p in payloads for i in p.get("not_reached_ids", [])]
    merged["output_tail"] = payloads[0].get("output_tail", "")
    exits = [p.get("pytest_exit") for p in payloads]
    merged["pytest_exit"] = None if None in exits else max(e for e in exits if e is not None)
    return merged


def run_file(
    test_file: Path,
    per_file: int | None,
    collect_only: bool,
    timeout: float,
    select: str | None = None,
    cpu: bool = False,
    per_test_timeout: float | None = None,
    triton_cache: Path | None = None,
    deadline: float | None = None,
    workers: int = 1,
    only: list[str] | None = None,
    gpus: int = 1,
) -> dict[str, Any]:
    """One file's sample in `workers` child processes side by side (shard k runs every
    workers-th test of the sample, from the k-th, on GPU k mod `gpus`), merged into one
    result. `only`: run just these test ids (--resume)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        # standin first, then flashtune's sources (a checkout that is not pip-installed).
        paths = [str(STANDIN), str(ROOT / "src")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        if triton_cache is not None:
            env["TRITON_CACHE_DIR"] = str(triton_cache.expanduser().resolve())
        if cpu:
            env["TRITON_INTERPRET"] = "1"
            rewritten = Path(tmp) / test_file.parent.name / test_file.name
            rewritten.parent.mkdir()
            rewritten.write_text(rewrite_for_cpu(test_file.read_text()))
            test_file = rewritten
        options = ["--full"] if per_file is None else ["--per-file", str(per_file)]
        options += ["--collect-only"] if collect_only else []
        options += ["-k", select] if select else []
        options += ["--per-test-timeout", str(per_test_timeout)] if per_test_timeout else []
        options += ["--cpu"] if cpu else []
        if only is not None:
            ids_file = Path(tmp) / "only.json"
            ids_file.write_text(json.dumps(only))
            options += ["--ids", str(ids_file)]
        results = [Path(tmp) / f"result{k}.json" for k in range(workers)]
        commands = [
            [sys.executable, __file__, "--child", str(test_file), "--result", str(result)]
            + options
            + (["--shard", f"{k}/{workers}"] if workers > 1 else [])
            for k, result in enumerate(results)
        ]
        envs = [env] * workers
        if gpus > 1:  # shard k sees GPU k mod gpus alone (the tests use cuda:0)
            envs = [dict(env, CUDA_VISIBLE_DEVICES=str(k % gpus)) for k in range(workers)]
        start = time.perf_counter()
        runs = _run_with_limit(
            commands, envs, test_file.parent, timeout, per_test_timeout, results, deadline
        )
        payloads = [
            _shard_payload(test_file, result, output, killed_at, deadline)
            for result, (output, killed_at) in zip(results, runs, strict=True)
        ]
        payload = _merge_shards(payloads) if workers > 1 else payloads[0]
        payload["seconds"] = round(time.perf_counter() - start, 1)
        return payload


def _shard_payload(
    test_file: Path, result: Path, output: str, killed_at: float | None, deadline: float | None
) -> dict[str, Any]:
    """A child's result file, completed by how the child ended."""
    tail = output[-2000:]
    if killed_at is not None:
        tail = f"timed out after {killed_at:.0f} s: {output[-1500:]}"
    payload: dict[str, Any] = (
        json.loads(result.read_text())
        if result.exists()
        else {
            "file": test_file.stem,
            "collected": 0,
            "selected": 0,
            "counts": {"passed": 0, "failed": 0, "skipped": 0, "error": 0},
            "finished": False,
            "failures": {},
        }
    )
    if not payload["finished"]:
        ran = sum(payload["counts"].values())
        last = tail.strip().splitlines()[-1] if tail.strip() else ""
        payload["failures"]["<process>"] = f"stopped after {ran} tests: {last}"[:300]
        # Stopped by --deadline or Ctrl-C/SIGTERM: the tests not reached are not
        # failures, only not run. A crash or the file's own limit: the rest is an error.
        stopped = STOP or (deadline is not None and time.perf_counter() >= deadline - 1)
        if stopped and ran:
            payload["not_reached"] = payload["selected"] - ran
            ids = selected_ids(result)
            if ids.exists():  # the tests after the first `ran`, in the order pytest runs them
                payload["not_reached_ids"] = json.loads(ids.read_text())[ran:]
        else:
            payload["counts"]["error"] += max(payload["selected"] - ran, 1)
    payload["output_tail"] = tail[-1500:]
    return payload


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sdist", type=Path, default=SDIST, help="FlashInfer's source archive")
    ap.add_argument("--tests-dir", type=Path, help="an extracted tests/ folder instead")
    ap.add_argument("--files", help="comma-separated file names (default: issue 14's)")
    ap.add_argument("--per-file", type=int, default=30, help="tests sampled a file (30)")
    ap.add_argument("--full", action="store_true", help="every test of every file")
    ap.add_argument("--collect-only", action="store_true", help="collect and sample only")
    ap.add_argument("-k", dest="select", help="pytest -k expression, applied before sampling")
    ap.add_argument("--cpu", action="store_true", help="smoke test on CPU (see above)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a file (900)")
    ap.add_argument(
        "--per-test-timeout", type=float, help="seconds a test (pytest-timeout; default: none)"
    )
    ap.add_argument("--triton-cache", type=Path, help="TRITON_CACHE_DIR of the test processes")
    ap.add_argument(
        "--deadline",
        type=float,
        help="seconds for the whole run: the file running then stops with what it ran, later "
        "files are listed as not run, and the summary is written (for a machine lent by time)",
    )
    ap.add_argument("--out", type=Path, help="the JSON summary (default $OUT/...)")
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="test processes a file, side by side (its sample split between them; 1)",
    )
    ap.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="GPUs to spread the --workers over (process k sees GPU k mod GPUS alone; 1)",
    )
    ap.add_argument(
        "--resume",
        type=Path,
        help="a summary of an earlier run stopped by its deadline: run only the tests it did "
        "not reach (not_reached_ids) and the files it did not start (not_run)",
    )
    ap.add_argument(
        "--retry-failed",
        action="store_true",
        help="with --resume: also rerun the tests that failed there (e.g. out of device "
        "memory with many --workers)",
    )
    ap.add_argument("--ids", type=Path, help=argparse.SUPPRESS)  # a child's --resume ids
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.workers < 1:
        ap.error("--workers must be at least 1")
    if opts.gpus < 1:
        ap.error("--gpus must be at least 1")
    per_file = None if opts.full else opts.per_file
    if opts.child is not None:
        index, count = (int(x) for x in opts.shard.split("/"))
        return run_child(
            opts.child,
            per_file,
            opts.collect_only,
            opts.select,
            opts.result,
            opts.per_test_timeout,
            opts.cpu,
            (index, count),
            set(json.loads(opts.ids.read_text())) if opts.ids else None,
        )

    if opts.per_test_timeout and importlib.util.find_spec("pytest_timeout") is None:
        raise SystemExit("--per-test-timeout needs pytest-timeout (pip install pytest-timeout)")
    names = [n.strip().removesuffix(".py") for n in opts.files.split(",")] if opts.files else FILES
    resume: dict[str, list[str]] = {}  # file -> the ids to run (a file absent: all of it)
    if opts.resume is not None:
        earlier = json.loads(opts.resume.read_text())
        for row in earlier["files"]:
            ids = list(row.get("not_reached_ids", []))
            if opts.retry_failed:
                ids += [i for i in row.get("failures", {}) if "::" in i]  # not "<process>"
            if ids:
                resume[row["file"]] = ids
        names = [*resume, *earlier.get("not_run", [])]
    deadline = time.perf_counter() + opts.deadline if opts.deadline else None
    signal.signal(signal.SIGTERM, _interrupt)  # an outer `timeout`: report, then stop
    not_run: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        # Absolute: each file's pytest runs in the file's folder (--rootdir).
        tests = opts.tests_dir.resolve() if opts.tests_dir else extract_tests(opts.sdist, Path(tmp))
        results = []
        for name in names:
            path = tests / f"{name}.py"
            if STOP or (deadline is not None and time.perf_counter() >= deadline):
                not_run.append(name)
                continue
            if not path.exists():
                print(f"{name}: not in {tests}", flush=True)
                continue
            try:
                row = run_file(
                    path,
                    per_file,
                    opts.collect_only,
                    opts.timeout,
                    opts.select,
                    opts.cpu,
                    opts.per_test_timeout,
                    opts.triton_cache,
                    deadline,
                    opts.workers,
                    resume.get(name),
                    opts.gpus,
                )
            except KeyboardInterrupt:  # between two files' processes
                STOP.append("interrupted")
                not_run.append(name)
                continue
            results.append(row)
            c = row["counts"]
            ran = c["passed"] + c["failed"] + c["error"]
            print(
                f"{name:30s} {c['passed']:4d}/{ran:<4d} passed  "
                f"(failed {c['failed']}, errors {c['error']}, skipped {c['skipped']}; "
                f"{row['selected']} of {row['collected']} collected"
                + (f", {row['not_reached']} not reached" if row.get("not_reached") else "")
                + f")  {row['seconds']:.0f}s",
                flush=True,
            )
            for nodeid, message in list(row["failures"].items())[:3]:
                print(f"    {nodeid.split('::', 1)[-1][:90]}: {message[:150]}", flush=True)
    passed = sum(r["counts"]["passed"] for r in results)
    ran = sum(r["counts"]["passed"] + r["counts"]["failed"] + r["counts"]["error"] for r in results)
    if not_run:
        why = "interrupted" if STOP else "past --deadline"
        print(f"not run ({why}): {', '.join(not_run)}")
    print(f"\ntotal: {passed} of {ran} passed" + (f" ({100 * passed / ran:.0f}%)" if ran else ""))
    summary = {
        "flashinfer_tests": str(opts.tests_dir or opts.sdist),
        "per_file": per_file,
        "collect_only": opts.collect_only,
        "cpu": opts.cpu,
        "select": opts.select,
        "per_test_timeout": opts.per_test_timeout,
        "triton_cache": str(opts.triton_cache) if opts.triton_cache else None,
        "passed": passed,
        "ran": ran,
        "files": results,
        "not_run": not_run,
        "interrupted": bool(STOP),
        "out_of_scope": OUT_OF_SCOPE,
        "missing_apis": MISSING_APIS,
    }
    out = opts.out or Path(os.environ.get("OUT", ".")) / "flashinfer_dropin.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    print(f"summary: {out}")
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())

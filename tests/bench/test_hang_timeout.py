"""The first call's hang rule (bench/sandbox.py's HangWatch): a first call that neither
compiles (runs a child process) nor uses CPU for `hang_timeout` seconds is killed then, long
before `first_call_timeout`; one that compiles or computes for longer is not."""

from __future__ import annotations

import time

import pytest
from _bench_helpers import make_dataset, statuses

from flashtune.bench.evaluate import BenchConfig
from flashtune.bench.runner import RunOptions, run_benchmark
from flashtune.bench.sandbox import HangWatch

HANG_S = 2.0
FIRST_CALL_S = 120.0

ONCE = (  # {first} runs in the first call only
    "_done = []\n\ndef run(x, w):\n    if not _done:\n{first}        _done.append(1)\n"
    "    return x * w\n"
)
SOLUTIONS = {
    "sleeps": "import time\n\ndef run(x, w):\n    time.sleep(10**6)\n",
    # A compiler at work (nvcc, ptxas, gcc): a child process, here one that takes twice the
    # hang bound and uses no CPU either.
    "compiles": "import subprocess\n"
    + ONCE.format(first=f"        subprocess.run(['sleep', '{2 * HANG_S}'], check=True)\n"),
    # An honest slow first call on the CPU (or Triton compiling in-process): busy.
    "computes": "import time\n"
    + ONCE.format(
        first=f"        end = time.monotonic() + {2 * HANG_S}\n"
        "        while time.monotonic() < end:\n            pass\n"
    ),
}


@pytest.mark.slow
def test_a_first_call_that_hangs_ends_at_the_hang_bound(tmp_path):
    root = tmp_path / "ds"
    make_dataset(root, SOLUTIONS, sizes=[1])
    config = BenchConfig(first_call_timeout=FIRST_CALL_S, hang_timeout=HANG_S)
    opts = RunOptions(datasets=[root], out=tmp_path / "out", devices=["cpu"], config=config)
    started = time.monotonic()
    result = run_benchmark(opts, progress=False)
    assert time.monotonic() - started < FIRST_CALL_S  # the hang did not wait for the long limit
    got = statuses(result.traces)
    assert got[("toy_scale_h8", "sleeps")] == "TIMEOUT"
    assert got[("toy_scale_h8", "compiles")] == "PASSED"
    assert got[("toy_scale_h8", "computes")] == "PASSED"
    reason = next(t.evaluation.reason for t in result.traces if t.solution == "sleeps")
    assert f"for {HANG_S:g} s it was not compiling" in reason and "--hang-timeout" in reason


class _Processes:
    """Stands in for a Sandbox: what HangWatch reads of its processes."""

    def __init__(self) -> None:
        self.cpu, self.children = 0.0, 0

    def activity(self) -> tuple[float, int]:
        return self.cpu, self.children


def test_compilers_and_cpu_use_are_progress_and_nothing_else_is():
    now = [0.0]
    processes = _Processes()
    watch = HangWatch(processes, 10.0, clock=lambda: now[0])

    def after(seconds: float, cpu: float = 0.0, children: int = 0) -> bool:
        now[0] += seconds
        processes.cpu += cpu
        processes.children = children
        return watch.hanging()

    assert not after(9)  # idle, under the bound
    assert not after(5, children=1)  # a compiler runs
    assert not after(9)  # idle again: 9 s since
    assert not after(5, cpu=2.0)  # 40% of a CPU
    assert not after(9, cpu=0.1)  # 1% of a CPU is idle: 9 s since
    assert after(1)  # 10 s without progress: hanging
    off = HangWatch(processes, 0)
    assert off.wait(30.0) == 30.0 and not off.hanging()

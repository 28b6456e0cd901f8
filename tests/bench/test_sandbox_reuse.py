"""One sandbox process per solution, reused across the workloads of a definition: reused only
after a clean job, and still guarded on every later job."""

from __future__ import annotations

import json

import torch
from _bench_helpers import python_solution, toy_definition

from flashtune import platform
from flashtune.bench.evaluate import BenchConfig, evaluate_workload
from flashtune.bench.sandbox import SandboxPool
from flashtune.data import Workload

CFG = BenchConfig(warmup=1, iterations=3, trials=1)
ENV = platform.snapshot("cpu")
HONEST = "def run(x, w):\n    return x * w\n"


def _run(solutions, sizes, pool):
    """Traces by (solution, n), evaluating workloads n in `sizes` one after another."""
    d = toy_definition()
    got = {}
    for n in sizes:
        events = evaluate_workload(
            d,
            Workload(uuid=f"w{n}", axes={"n": n}),
            solutions,
            CFG,
            torch.device("cpu"),
            ENV,
            pool=pool,
        )
        for kind, t in events:
            if kind == "trace":
                got[(t.solution, n)] = t
    return got


def _status(t) -> str:
    return t.evaluation.status.value


def test_a_solution_keeps_its_process_across_workloads():
    # The solution writes its pid into its result's log at every workload's first call.
    body = (
        "import os, sys\nseen = set()\n\ndef run(x, w):\n"
        "    if x.shape[0] not in seen:\n"
        "        seen.add(x.shape[0])\n"
        "        sys.stdout.write(f'pid={os.getpid()} n={x.shape[0]}\\n')\n"
        "    return x * w\n"
    )
    with SandboxPool() as pool:
        got = _run([python_solution("mine", body)], [1, 3, 5], pool)
    assert all(_status(t) == "PASSED" for t in got.values()), got
    pids = {n: _pid(got[("mine", n)].evaluation.log, n) for n in (1, 3, 5)}
    assert len(set(pids.values())) == 1, pids
    assert "sandbox: reused (job 2" in got[("mine", 3)].evaluation.log
    assert "sandbox: reused (job 3" in got[("mine", 5)].evaluation.log


def _pid(log: str, n: int) -> int:
    for line in log.splitlines():
        if line.startswith("pid=") and line.endswith(f"n={n}"):
            return int(line.split()[0].removeprefix("pid="))
    raise AssertionError(f"no pid line for n={n} in {log!r}")


def test_a_failed_job_ends_the_process_and_the_next_workload_starts_fresh():
    body = (
        "import os, sys\n\ndef run(x, w):\n"
        "    if x.shape[0] == 3:\n        raise RuntimeError('boom at n=3')\n"
        "    return x * w\n"
    )
    with SandboxPool() as pool:
        got = _run([python_solution("flaky", body)], [1, 3, 5], pool)
    assert _status(got[("flaky", 1)]) == "PASSED"
    assert _status(got[("flaky", 3)]) == "RUNTIME_ERROR"
    assert "boom at n=3" in got[("flaky", 3)].evaluation.reason
    assert _status(got[("flaky", 5)]) == "PASSED"
    assert "sandbox: reused" not in got[("flaky", 5)].evaluation.log


def test_tampering_on_a_later_workload_is_caught_and_stays_in_its_process():
    # Honest on the first workload; on the second it replaces the clock at its first call.
    body = (
        "import time\n\ndef run(x, w):\n"
        "    if x.shape[0] == 3:\n        time.perf_counter = lambda: 0.0\n"
        "    return x * w\n"
    )
    with SandboxPool() as pool:
        got = _run([python_solution("sly", body), python_solution("honest", HONEST)], [1, 3], pool)
    assert _status(got[("sly", 1)]) == "PASSED"
    assert _status(got[("sly", 3)]) == "RUNTIME_ERROR"
    assert "tampering" in got[("sly", 3)].evaluation.reason
    honest = got[("honest", 3)].evaluation
    assert _status(got[("honest", 3)]) == "PASSED"
    assert honest.performance.latency_ms > 1e-4  # a real clock, not the patched one


def test_one_process_serves_the_same_code_under_other_definitions():
    # rmsnorm_h4096 and rmsnorm_h8192 name one entry point: one process (one import, one
    # CUDA context, one JIT load) serves both, as the old in-process harness did.
    other = toy_definition("toy_scale_other_h8")
    with SandboxPool() as pool:
        got = _run([python_solution("mine", HONEST)], [2], pool)
        events = evaluate_workload(
            other,
            Workload(uuid="o", axes={"n": 2}),
            [python_solution("mine_too", HONEST, other.name)],
            CFG,
            torch.device("cpu"),
            ENV,
            pool=pool,
        )
        second = [t for kind, t in events if kind == "trace"][0]
    assert _status(got[("mine", 2)]) == "PASSED" and _status(second) == "PASSED"
    assert "sandbox: reused (job 2" in second.evaluation.log


def _spec(solution: str, config: dict | None = None) -> dict:
    code = {"name": solution, "spec": {"entry_point": f"{solution}.py::run"}, "sources": []}
    return {"solution": json.dumps(code), "device": "cpu", "config": config or {}, "roots": ()}


def test_the_pool_keys_by_code_and_bounds_its_size():
    with SandboxPool(size=2) as pool:
        boxes = [pool.get(_spec(f"s{i}")) for i in range(3)]
        boxes[0].process.join(10)
        assert boxes[0].process.exitcode is not None  # the least recently used went at size 2
        assert pool.get(_spec("s2")) is boxes[2]  # the same code gets the same process
        assert pool.get(_spec("s2", {"seed": 1})) is not boxes[2]  # another config: another
        boxes[1].process.join(10)
        assert boxes[1].process.exitcode is not None
        pool.discard(boxes[2])
        boxes[2].process.join(10)
        assert boxes[2].process.exitcode is not None


def test_close_idle_ends_every_sandbox_but_the_one_kept():
    """Before a workload whose inputs need most of the device, the idle processes go (each
    holds a CUDA context and what its last job left); the workload's own stays."""
    with SandboxPool() as pool:
        boxes = [pool.get(_spec(f"s{i}")) for i in range(3)]
        assert pool.close_idle(keep=_spec("s1")) == 2
        for gone in (boxes[0], boxes[2]):
            gone.process.join(10)
            assert gone.process.exitcode is not None
        assert boxes[1].process.is_alive()
        assert pool.get(_spec("s1")) is boxes[1]
        assert pool.close_idle() == 1

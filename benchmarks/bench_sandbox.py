"""The OS sandbox's cost: an honest kernel timed inside it against the same kernel outside.

    python benchmarks/bench_sandbox.py [--definitions A,B] [--rounds 3]

For a few bundled definitions (one workload each, flashtune's own solution), `flashtune run`
times the same triple with the operating system's sandbox (bench/isolation.py: Landlock,
namespaces, seccomp) and without it (FLASHTUNE_SANDBOX=0: the same worker, sandbox process
and checked-timing protocol, no isolation layers), in turns, `--rounds` times each. A row per
definition gives the median latency of each, their ratio (the bar: within 2%), the run's
wall time per triple each way, and the sandbox's phase times (CUDA init, import, first call).
`timing.measure_robust` in this process gives a third figure for context.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import RowWriter  # noqa: E402

from flashtune.bench.build import build_solution  # noqa: E402
from flashtune.bench.config import BenchConfig  # noqa: E402
from flashtune.bench.runner import RunOptions, run_benchmark  # noqa: E402
from flashtune.cli.common import bundled_dataset  # noqa: E402
from flashtune.data.dataset import Dataset  # noqa: E402
from flashtune.data.synth import synthesize_inputs  # noqa: E402
from flashtune.timing import TimingPolicy, measure_robust  # noqa: E402

DEFAULT = "gemm_n4096_k4096,rmsnorm_h4096,gqa_paged_decode_h32_kv8_d128_ps16,silu_and_mul_i28672"


def in_process(definition, workload, solution, device, seed: int) -> float:
    """`timing.measure_robust` of the solution in this process (a CUDA graph of many calls
    over cold-L2 copies): the library's own timer, for context."""
    fn = build_solution(solution)
    inputs = synthesize_inputs(definition, workload, device=device, seed=seed)
    args = [inputs[n] for n in definition.inputs]
    setup = getattr(fn, "setup", None)
    runner = setup(*args) if callable(setup) else fn
    with torch.no_grad():
        return measure_robust(runner, args, TimingPolicy(warmup=10, repetitions=10)).median_ms


def inside(
    root: Path, definition: str, solution: str, device: str, seed: int, sandbox: bool
) -> dict:
    os.environ["FLASHTUNE_SANDBOX"] = "1" if sandbox else "0"
    with tempfile.TemporaryDirectory() as tmp:
        opts = RunOptions(
            datasets=[root],
            out=Path(tmp) / "out",
            definitions=definition,
            solutions=solution,
            devices=[device],
            max_workloads=1,
            config=BenchConfig(seed=seed),
        )
        t0 = time.perf_counter()
        result = run_benchmark(opts, progress=False)
        wall = time.perf_counter() - t0
    trace = next(t for t in result.traces if t.solution == solution)
    ev = trace.evaluation
    if ev.status.value != "PASSED":
        raise RuntimeError(f"{definition}/{solution}: {ev.status.value}: {ev.reason}")
    phases = dict(
        (m.group(1), float(m.group(2)))
        for m in re.finditer(r"([a-z +]+) by ([0-9.]+) s", ev.log.split("sandbox:", 1)[-1])
    )
    return {
        "latency_ms": ev.performance.latency_ms,
        "wall_s": wall,
        "phases_s": phases,
        "sandbox": ev.environment.get("sandbox"),
        "workload": trace.workload.uuid,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--definitions", default=DEFAULT)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--solutions", default="flashtune@*")
    args = parser.parse_args()
    device = torch.device(args.device)
    root = bundled_dataset()
    ds = Dataset([root])
    rows = RowWriter("sandbox")
    for name in args.definitions.split(","):
        definition = ds.definition(name)
        solution = next(
            s for s in ds.solutions_for(name) if fnmatch.fnmatchcase(s.name, args.solutions)
        )
        seed = 12345
        runs: dict[bool, list[dict]] = {True: [], False: []}
        for _ in range(args.rounds):
            for sandbox in (True, False):
                runs[sandbox].append(inside(root, name, solution.name, args.device, seed, sandbox))
        os.environ.pop("FLASHTUNE_SANDBOX", None)
        uuid = runs[True][0]["workload"]
        workload = next(r.workload for r in ds.workloads_for(name) if r.workload.uuid == uuid)
        robust = in_process(definition, workload, solution, device, seed)
        lat = {k: statistics.median(g["latency_ms"] for g in v) for k, v in runs.items()}
        wall = {k: statistics.median(g["wall_s"] for g in v) for k, v in runs.items()}
        ratio = lat[True] / lat[False]
        print(
            f"{name}: sandboxed {lat[True] * 1e3:.2f} us, not sandboxed {lat[False] * 1e3:.2f} us "
            f"(ratio {ratio:.4f}); measure_robust in process {robust * 1e3:.2f} us; run wall "
            f"{wall[True]:.2f} s vs {wall[False]:.2f} s; phases sandboxed "
            f"{runs[True][-1]['phases_s']}, not {runs[False][-1]['phases_s']}; "
            f"isolation {runs[True][-1]['sandbox']}"
        )
        rows.write(
            "sandbox_overhead",
            {"definition": name, "workload": uuid},
            solution.name,
            lat[True],
            unsandboxed_ms=lat[False],
            sandboxed_over_unsandboxed=ratio,
            latencies_ms={str(k): [g["latency_ms"] for g in v] for k, v in runs.items()},
            measure_robust_ms=robust,
            run_wall_s={str(k): [g["wall_s"] for g in v] for k, v in runs.items()},
            phases_s={str(k): v[-1]["phases_s"] for k, v in runs.items()},
            sandbox=runs[True][-1]["sandbox"],
        )


if __name__ == "__main__":
    main()

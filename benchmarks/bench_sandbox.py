"""The sandbox's cost: an honest kernel timed inside it against the same kernel outside.

    python benchmarks/bench_sandbox.py [--definitions GLOB] [--solutions GLOB] [--rounds 2]

For a few bundled definitions (one workload each, flashtune's own solution), in one process:
- outside: the solution built and called in this process, timed by the same protocol as the
  sandbox (bench/checked_timing.py: one call per input set per sample, fresh values, cold
  L2, a CUDA graph per sample), and by `timing.measure_robust` for context;
- inside: `flashtune run` on the same triple (worker + sandbox process + isolation layers),
  its trace's latency and the sandbox's own phase times from the trace log.
Outside and inside alternate for `--rounds` rounds; a row per definition gives the median of
each and their ratio (the issue's bar: within 2%), plus the run's wall time per triple.
"""

from __future__ import annotations

import argparse
import fnmatch
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
from flashtune.bench.checked_timing import (  # noqa: E402
    CheckedSampler,
    derive_seed,
    sets_per_sample,
)
from flashtune.bench.config import BenchConfig  # noqa: E402
from flashtune.bench.runner import RunOptions, run_benchmark  # noqa: E402
from flashtune.bench.sandbox_child import float_input_names  # noqa: E402
from flashtune.cli.common import bundled_dataset  # noqa: E402
from flashtune.data.dataset import Dataset  # noqa: E402
from flashtune.data.synth import synthesize_inputs  # noqa: E402
from flashtune.timing import measure_robust  # noqa: E402

DEFAULT = "gemm_n4096_k4096,rmsnorm_h4096,gqa_paged_decode_h32_kv8_d128_ps16,silu_and_mul_i28672"


def outside(definition, workload, solution, device, cfg: BenchConfig, seed: int) -> dict:
    """The checked-timing protocol in this process: no worker, no sandbox, no checks."""
    fn = build_solution(solution)
    names = list(definition.inputs)
    setup = getattr(fn, "setup", None)

    def inputs(s: int) -> dict:
        return synthesize_inputs(definition, workload, device=device, seed=s)

    sets = [[inputs(derive_seed(seed, 0))[n] for n in names]]
    runners = [setup(*sets[0]) if callable(setup) else fn]
    with torch.no_grad():
        for _ in range(10):
            runners[0](*sets[0])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            runners[0](*sets[0])
        torch.cuda.synchronize()
        per_call = (time.perf_counter() - t0) * 1e3 / 10
        set_bytes = sum(a.numel() * a.element_size() for a in sets[0] if torch.is_tensor(a))
        n = sets_per_sample(per_call, set_bytes, device, cfg.target_sample_ms, 2)
        while len(sets) < n:
            sets.append([inputs(derive_seed(seed, len(sets)))[n_] for n_ in names])
            runners.append(setup(*sets[-1]) if callable(setup) else fn)
        for r, a in zip(runners, sets, strict=True):
            r(*a)
        calls = [(lambda r=r, a=a: r(*a)) for r, a in zip(runners, sets, strict=True)]
        sampler = CheckedSampler(calls, device, "auto")
        floats = float_input_names(dict(zip(names, sets[0], strict=True)))
        samples = []
        for k in range(30):
            for i, args in enumerate(sets):
                fresh = inputs(derive_seed(seed, "sample", k, i))
                for name in floats:
                    args[names.index(name)].copy_(fresh[name])
            sampler.flush(k)
            samples.append(sampler.sample())
        robust = measure_robust(
            runners[0], sets[0], input_sets=None, warmup=10, repetitions=10, trials=3
        )
    return {
        "checked_ms": statistics.median(samples),
        "robust_ms": robust.median_ms,
        "sets": n,
        "method": sampler.method,
    }


def inside(root: Path, definition: str, solution: str, device: str, seed: int) -> dict:
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
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    device = torch.device(args.device)
    root = bundled_dataset()
    ds = Dataset([root])
    rows = RowWriter("sandbox")
    for name in args.definitions.split(","):
        definition = ds.definition(name)
        solution = next(
            s for s in ds.solutions_for(name) if fnmatch.fnmatchcase(s.name, "flashtune@*")
        )
        seed = 12345
        got_in, got_out = [], []
        for _ in range(args.rounds):
            got_in.append(inside(root, name, solution.name, args.device, seed))
            workload = next(
                r.workload
                for r in ds.workloads_for(name)
                if r.workload.uuid == got_in[-1]["workload"]
            )
            got_out.append(outside(definition, workload, solution, device, BenchConfig(), seed))
        lat_in = statistics.median(g["latency_ms"] for g in got_in)
        lat_out = statistics.median(g["checked_ms"] for g in got_out)
        robust = statistics.median(g["robust_ms"] for g in got_out)
        print(
            f"{name}: inside {lat_in * 1e3:.2f} us, outside {lat_out * 1e3:.2f} us "
            f"(inside/outside {lat_in / lat_out:.4f}); measure_robust {robust * 1e3:.2f} us; "
            f"{got_out[0]['sets']} sets/sample, {got_out[0]['method']}; run wall "
            f"{statistics.median(g['wall_s'] for g in got_in):.2f} s; sandbox "
            f"{got_in[-1]['sandbox']}; phases {got_in[-1]['phases_s']}"
        )
        rows.write(
            "sandbox_overhead",
            {"definition": name, "workload": got_in[0]["workload"]},
            solution.name,
            lat_in,
            outside_ms=lat_out,
            inside_over_outside=lat_in / lat_out,
            measure_robust_ms=robust,
            sets_per_sample=got_out[0]["sets"],
            method=got_out[0]["method"],
            run_wall_s=[g["wall_s"] for g in got_in],
            sandbox_phases_s=got_in[-1]["phases_s"],
            sandbox=got_in[-1]["sandbox"],
        )


if __name__ == "__main__":
    main()

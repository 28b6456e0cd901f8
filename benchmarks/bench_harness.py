"""Harness overhead: 100 triples of a trivial op on the CPU (the target is < 60 s).

    python benchmarks/bench_harness.py

Measures what the runner itself costs (worker start, building, input synthesis, checks,
trace appends): 25 workloads x 4 trivial solutions, 1 warm-up and 3 timed calls each.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RowWriter  # noqa: E402

from flashtune.bench.evaluate import BenchConfig  # noqa: E402
from flashtune.bench.runner import RunOptions, run_benchmark  # noqa: E402
from flashtune.data import Dataset, Definition, Solution, Workload  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ds"
        ds = Dataset(root)
        d = Definition.model_validate(
            {
                "name": "scale_h64",
                "op_type": "toy",
                "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 64}},
                "inputs": {"x": {"shape": ["n", "h"], "dtype": "float32"}},
                "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
                "reference": "def run(x):\n    return x * 2\n",
            }
        )
        ds.add_definition(d)
        ds.add_workloads(d, [Workload(uuid=f"n{n}", axes={"n": n}) for n in range(1, 26)])
        for i in range(4):
            ds.add_solution(
                Solution.model_validate(
                    {
                        "name": f"s{i}",
                        "definition": d.name,
                        "author": "bench",
                        "spec": {"language": "python", "entry_point": "m.py::run"},
                        "sources": [
                            {"path": "m.py", "content": f"def run(x):\n    return x * 2  # {i}\n"}
                        ],
                    }
                )
            )
        opts = RunOptions(
            datasets=[root],
            out=Path(tmp) / "out",
            devices=["cpu"],
            max_workloads=100,
            config=BenchConfig(warmup=1, iterations=3, trials=1),
        )
        start = time.perf_counter()
        result = run_benchmark(opts, progress=False)
        seconds = time.perf_counter() - start
    n = len(result.traces)
    print(f"{n} triples in {seconds:.2f} s ({seconds / n * 1e3:.1f} ms per triple, target < 60 s)")
    RowWriter("harness").write(
        "harness_overhead",
        {"triples": n},
        "flashtune-run-cpu",
        seconds * 1e3,
        per_triple_ms=seconds / n * 1e3,
    )


if __name__ == "__main__":
    main()

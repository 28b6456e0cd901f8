"""Two source trees, the same bundled definitions: did a change move the figures?

    python benchmarks/bench_ab.py run SRC OUT GLOB[,GLOB...] [--solutions 'flashtune@*'] [--all]
    python benchmarks/bench_ab.py compare A/rows.json B/rows.json

`run` times the solutions of the named bundled definitions with the flashtune package found
under SRC (a checkout's `src`, or an old commit's from `git archive COMMIT src | tar -x -C
DIR`), in a child process so both trees run the same way, and writes OUT/rows.json (one row
per trace: definition, solution, workload, status, latency). Run it A, B, A again in one GPU
call: the A/A ratios say how large the noise is. `compare` prints, per definition, the
geomean and range of B/A latency over the shared (definition, solution, workload) triples
and any status that changed. The quick cap (smallest and largest workload) unless --all.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

_CHILD = """
import json, sys
from pathlib import Path
from flashtune.bench.evaluate import BenchConfig
from flashtune.bench.runner import RunOptions, run_benchmark
from flashtune.bench.worker import default_devices
from flashtune.cli import bundled_dataset

out, globs, solutions, every = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
rows = []
for pattern in globs.split(","):
    opts = RunOptions(datasets=[bundled_dataset()], out=out, definitions=pattern,
                      solutions=solutions, devices=default_devices(), timeout=300,
                      config=BenchConfig(), all_workloads=every)
    for t in run_benchmark(opts, progress=False).traces:
        perf = t.evaluation.performance
        rows.append({"definition": t.definition, "solution": t.solution,
                     "workload": t.workload.uuid, "axes": t.workload.axes,
                     "status": t.evaluation.status.value,
                     "latency_ms": perf.latency_ms if perf else None,
                     "reason": (t.evaluation.reason or "")[:160]})
(out / "rows.json").write_text(json.dumps(rows))
print(f"{len(rows)} traces", flush=True)
"""


def run(src: Path, out: Path, globs: str, solutions: str, every: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": f"{src.resolve()}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    # From out/: the child must import the tree under SRC, not a checkout in the cwd.
    cmd = [
        sys.executable,
        "-c",
        _CHILD,
        str(out.resolve()),
        globs,
        solutions,
        "1" if every else "0",
    ]
    return subprocess.run(cmd, env=env, cwd=out).returncode


def compare(a_path: Path, b_path: Path) -> None:
    def load(path: Path) -> dict[tuple[str, str, str], dict]:
        return {
            (r["definition"], r["solution"], r["workload"]): r for r in json.loads(path.read_text())
        }

    a, b = load(a_path), load(b_path)
    ratios: dict[str, list[float]] = defaultdict(list)
    for key in sorted(set(a) & set(b)):
        if a[key]["status"] != b[key]["status"]:
            print("status changed", key, a[key]["status"], "->", b[key]["status"], b[key]["reason"])
        if a[key]["latency_ms"] and b[key]["latency_ms"]:
            ratios[key[0]].append(b[key]["latency_ms"] / a[key]["latency_ms"])
    for definition, rs in sorted(ratios.items()):
        geomean = math.exp(sum(map(math.log, rs)) / len(rs))
        print(
            f"{definition:50s} n={len(rs):2d} B/A geomean {geomean:.3f} min {min(rs):.3f} max {max(rs):.3f}"
        )
    print(f"only in A: {len(set(a) - set(b))}, only in B: {len(set(b) - set(a))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("src", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("globs")
    r.add_argument("--solutions", default="flashtune@*")
    r.add_argument("--all", action="store_true", help="every workload, not the quick cap")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.src, args.out, args.globs, args.solutions, args.all)
    compare(args.a, args.b)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Wall time of the bundled GPU run on one GPU against `--ray local` on every GPU of the host.

    python benchmarks/bench_ray.py run one /tmp/one     # flashtune run --devices 0
    python benchmarks/bench_ray.py run ray /tmp/ray     # flashtune run --ray local
    python benchmarks/bench_ray.py tune /tmp/tune.json  # flashtune tune --ray local
    python benchmarks/bench_ray.py compare /tmp/one /tmp/ray

Each `run` times the whole command (`flashtune run` as a user types it: process start, the
workers' or the cluster's start, every triple, the closing table) and writes one row to
benchmarks/results/ray.jsonl with the wall time, the GPUs used and the status counts. Run the
two in separate calls of a fresh machine, so both compile cold (Triton's and FlashInfer's
caches would otherwise favour the second). `compare` reads both result folders' traces:
the statuses must be identical triple for triple, and it prints the ratio of the wall times
and where each trace of the cluster run ran (host, GPU index).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter  # noqa: E402

BUNDLED_RUN = [sys.executable, "-m", "flashtune.cli", "run", "--quiet"]


def _statuses(out: Path) -> dict[tuple[str, str, str], str]:
    from flashtune.data import Dataset

    found = {}
    for trace in Dataset(out).all_traces():
        if trace.evaluation is not None:
            key = (trace.definition, trace.solution or "", trace.workload.uuid)
            found[key] = trace.evaluation.status.value
    return found


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _timed(cmd: list[str]) -> float:
    """Run `cmd` as a user would, echo the end of its output; -> its wall time (s)."""
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    sys.stdout.write(done.stdout[-6000:])
    sys.stderr.write(done.stderr[-3000:])
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}")
    return wall


def run(mode: str, out: Path, extra: list[str]) -> None:
    cmd = [*BUNDLED_RUN, "-o", str(out), *extra]
    cmd += ["--devices", "0"] if mode == "one" else ["--ray", "local"]
    wall = _timed(cmd)
    statuses = _statuses(out)
    gpus = 1 if mode == "one" else _gpus()
    row = RowWriter("ray").write(
        "bundled_run",
        {"gpus": gpus, "workloads": "all" if "--all" in extra else "quick"},
        "flashtune run " + ("--devices 0" if mode == "one" else "--ray local"),
        wall * 1e3,
        wall_s=round(wall, 1),
        triples=len(statuses),
        statuses=dict(Counter(statuses.values())),
        args=extra,
    )
    print(json.dumps({k: row[k] for k in ("shape", "wall_s", "triples", "statuses")}))


def tune(cache: Path, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "flashtune.cli", "tune", "--cache", str(cache), "--ray", "local"]
    cmd += extra
    wall = _timed(cmd)
    data = json.loads(cache.read_text())
    entries = sum(len(v) for v in data.values() if isinstance(v, dict))
    row = RowWriter("ray").write(
        "tune_ray",
        {"gpus": _gpus(), "args": extra},
        "flashtune tune --ray local",
        wall * 1e3,
        wall_s=round(wall, 1),
        cache_sections=sorted(data)[:20],
        entries=entries,
    )
    print(json.dumps({k: row[k] for k in ("wall_s", "entries")}))


def compare(one: Path, ray: Path) -> None:
    a, b = _statuses(one), _statuses(ray)
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    for key in differ[:20]:
        print(f"differs: {key}: one GPU {a.get(key)}, cluster {b.get(key)}")
    print(f"{len(a)} triples on one GPU, {len(b)} on the cluster, {len(differ)} differ")
    from flashtune.data import Dataset

    where = Counter(
        (t.evaluation.environment.get("host"), t.evaluation.environment.get("gpu_index"))
        for t in Dataset(ray).all_traces()
        if t.evaluation is not None
    )
    print("cluster traces by (host, gpu_index):", dict(where))
    rows = [json.loads(line) for line in (Path(__file__).parent / "results/ray.jsonl").open()]
    walls = {r["shape"]["gpus"]: r["wall_s"] for r in rows if r["op"] == "bundled_run"}
    if 1 in walls and len(walls) > 1:
        many = max(walls)
        print(
            f"wall: 1 GPU {walls[1]} s, {many} GPUs {walls[many]} s: {walls[many] / walls[1]:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("mode", choices=("one", "ray"))
    r.add_argument("out", type=Path)
    t = sub.add_parser("tune")
    t.add_argument("cache", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("one", type=Path)
    c.add_argument("ray", type=Path)
    options, extra = parser.parse_known_args()
    if options.what == "run":
        run(options.mode, options.out, extra)
    elif options.what == "tune":
        tune(options.cache, extra)
    else:
        compare(options.one, options.ray)


if __name__ == "__main__":
    main()

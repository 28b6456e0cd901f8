"""The bundled dataset on a GPU: `flashtune run`, result rows, comparison table, repeatability.

    python benchmarks/bench_bundled.py warm               # compile FlashInfer/Triton kernels in parallel
    python benchmarks/bench_bundled.py run OUT [--definitions GLOB] [--resume]
    python benchmarks/bench_bundled.py rows OUT [NAME]    # -> benchmarks/results/NAME.jsonl (bundled_run)
    python benchmarks/bench_bundled.py repeat OUT_A OUT_B # same solution, two runs: within 3%?
    python benchmarks/bench_bundled.py headline COMMIT... # one headline from committed rows

`headline` re-derives the figure from benchmarks/results/bundled_run.jsonl when the dataset was
run in parts: per definition, the rows of the last-named commit that ran it (one run per
definition, so every ratio inside a definition compares one run's traces), then one
geomean over all of them; the headline row lists the run behind each definition.

`run` drives flashtune.bench.runner directly (no CLI dependencies needed on the GPU box).
Rows: op (definition), shape (workload axes), solution, latency_ms, spread, speedups, plus
gpu / versions / commit / date from benchmarks.common.RowWriter.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _traces(out: Path):
    from flashtune.data import Trace

    traces = []
    for path in sorted((out / "traces").rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                traces.append(Trace.model_validate_json(line))
            except ValueError:
                print(f"skipping a corrupt line in {path}")
    return traces


def warm() -> None:
    """Compile each definition's FlashInfer and flashtune kernels once, 8 processes at a time,
    so that JIT compilation does not count against the per-solution timeout of the run."""
    from flashtune.cli import bundled_dataset
    from flashtune.data import Dataset

    names = sorted(Dataset(bundled_dataset()).definitions)
    code = (
        "import sys, torch; from flashtune.cli import bundled_dataset;"
        "from flashtune.data import Dataset, synthesize_inputs;"
        "from flashtune.bench.build import build_solution;"
        "ds = Dataset(bundled_dataset()); d = ds.definition(sys.argv[1]);"
        # A bundled workload, not a synthesized small one: a small page table may hold an
        # empty request, which FlashInfer's prefill plan rejects (its kernels then compiled
        # inside the timed run: 150 s of a 400 s attention run on an H100).
        "w = ds.workloads_for(d.name)[0].workload;"
        "x = synthesize_inputs(d, w, device='cuda', blob_root=ds);"
        "[print(sys.argv[1], s.name, type(build_solution(s)(*x.values())).__name__)"
        " for s in ds.solutions_for(d.name) if s.author != 'torch']"
    )
    procs: list[subprocess.Popen] = []
    start = time.time()
    for name in names:
        while len([p for p in procs if p.poll() is None]) >= 8:
            time.sleep(0.5)
        procs.append(subprocess.Popen([sys.executable, "-c", code, name]))
    for p in procs:
        p.wait()
    print(f"warm-up: {len(names)} definitions in {time.time() - start:.0f} s")


def run(out: Path, definitions: str | None, resume: bool, timeout: float) -> None:
    from flashtune.bench.evaluate import BenchConfig
    from flashtune.bench.runner import RunOptions, run_benchmark
    from flashtune.bench.worker import default_devices
    from flashtune.cli import bundled_dataset

    def show(trace) -> None:
        ev = trace.evaluation
        lat = f"{ev.performance.latency_ms * 1e3:9.1f} us" if ev.performance else ""
        print(
            f"{trace.definition:46s} {trace.solution:11s} {str(trace.workload.axes)[:60]:60s} "
            f"{ev.status.value:20s} {lat} {(ev.reason or '')[:80]}",
            flush=True,
        )

    opts = RunOptions(
        datasets=[bundled_dataset()],
        out=out,
        definitions=definitions,
        devices=default_devices(),
        timeout=timeout,
        config=BenchConfig(),
        resume=resume,
        all_workloads=True,  # the headline covers every workload, not the quick run's
    )
    result = run_benchmark(opts, progress=False, on_trace=show)
    print(f"{len(result.traces)} triples in {result.seconds:.0f} s ({result.resumed} resumed)")


def rows(out: Path, name: str = "bundled_run") -> None:
    from common import RowWriter

    traces = _traces(out)
    # Each row names the run that measured it (its GPU, versions and code come from the
    # trace's environment, not from the machine that turns traces into rows).
    writers: dict[str, RowWriter] = {}

    def writer_for(env: dict[str, Any]) -> RowWriter:
        key = json.dumps([env.get("code"), env.get("run_started"), env.get("hardware")])
        if key not in writers:
            writers[key] = RowWriter(name, environment=_row_environment(env))
        return writers[key]

    lat: dict[tuple[str, str], dict[str, tuple[float, str | None]]] = defaultdict(dict)
    for t in traces:
        ev = t.evaluation
        if ev is None:
            continue
        writer = writer_for(ev.environment)
        kind = (t.solution or "").partition("@")[0]  # bundled names are <kind>@<definition>
        perf = ev.performance
        extra: dict[str, Any] = {"status": ev.status.value}
        if perf is not None:
            extra.update(
                spread_ms=perf.latency_spread_ms,
                reference_ms=perf.reference_latency_ms,
                speedup_vs_reference=perf.speedup_factor,
                speedup_vs_torch=perf.speedup_vs_baseline,
                timing_method=getattr(perf, "timing_method", None),
                timing_trials_ms=getattr(perf, "timing_trials_ms", None),
            )
            method = getattr(perf, "timing_method", None)
            lat[(t.definition, t.workload.uuid)][kind] = (perf.latency_ms, method)
        else:
            extra["reason"] = (ev.reason or "")[:200]
        writer.write(
            t.definition,
            t.workload.axes,
            kind,
            perf.latency_ms if perf else None,
            **extra,
        )
    headline = print_table(lat)
    runs = sorted({(w.common["commit"], w.common["run_started"]) for w in writers.values()})
    newest = max(writers.values(), key=lambda w: w.common["run_started"] or "")
    newest.write(
        "bundled_headline",
        {"workloads": len(lat)},
        "flashtune",
        None,
        runs=[{"commit": c, "run_started": r} for c, r in runs],
        # What the figure covers: a partial run's headline is not the dataset's.
        definitions=sorted({definition for definition, _ in lat}),
        **headline,
    )


def _row_environment(env: dict[str, Any]) -> dict[str, Any]:
    """A Trace's environment in the shape RowWriter reads (benchmarks.common.versions)."""
    return {
        **env,
        "hardware": env.get("hardware"),
        "code": env.get("code") or {"commit": None, "files": "unknown"},
        "run_started": env.get("run_started"),
        "flashinfer": env.get("flashinfer"),
    }


def _geo(xs: list[float]) -> float | None:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def print_table(lat: dict[tuple[str, str], dict[str, tuple[float, str | None]]]) -> dict:
    """flashtune vs FlashInfer vs torch per definition: geomean speedups over workloads.

    A ratio is taken only between two results timed by one method (both in a CUDA graph,
    say); other pairs are counted as excluded, never mixed into a geomean. Returns the
    headline figures."""
    per_def: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    excluded: dict[str, int] = defaultdict(int)
    methods: dict[str, int] = defaultdict(int)
    for (definition, _), sols in lat.items():
        ft = sols.get("flashtune")
        for other in ("flashinfer", "torch"):
            if ft and other in sols:
                if ft[1] is None or ft[1] != sols[other][1]:
                    excluded[other] += 1
                    continue
                per_def[definition][other].append(sols[other][0] / ft[0])
        for sol, (ms, method) in sols.items():
            per_def[definition]["lat:" + sol].append(ms)
            methods[str(method)] += 1
    fmt = lambda v: f"{v:6.2f}x" if v else "     - "  # noqa: E731
    print(
        f"\n{'definition':46s} {'n':>2s} {'ft us':>9s} {'fi us':>9s} {'torch us':>9s} "
        f"{'ft/fi':>7s} {'ft/torch':>8s}   (speedup of flashtune = other latency / flashtune)"
    )
    all_fi, all_torch = [], []
    for definition in sorted(per_def):
        d = per_def[definition]
        g = {k: _geo(v) for k, v in d.items()}
        us = lambda k, g=g: f"{g[k] * 1e3:9.1f}" if g.get(k) else f"{'-':>9s}"  # noqa: E731
        n = len(d.get("lat:flashtune", []))
        print(
            f"{definition:46s} {n:2d} {us('lat:flashtune')} {us('lat:flashinfer')} "
            f"{us('lat:torch')} {fmt(g.get('flashinfer'))} {fmt(g.get('torch'))}"
        )
        all_fi += d.get("flashinfer", [])
        all_torch += d.get("torch", [])
    print(
        f"{'geomean over all workloads':46s} {'':2s} {'':9s} {'':9s} {'':9s} "
        f"{fmt(_geo(all_fi))} {fmt(_geo(all_torch))}"
    )
    print(
        f"pairs timed alike: {len(all_fi)} vs FlashInfer, {len(all_torch)} vs torch; excluded "
        f"(timing differs): {dict(excluded)}; timing methods: {dict(methods)}"
    )
    return {
        "speedup_vs_flashinfer_geomean": _geo(all_fi),
        "speedup_vs_torch_geomean": _geo(all_torch),
        "pairs_vs_flashinfer": len(all_fi),
        "pairs_vs_torch": len(all_torch),
        "excluded_timing_differs": dict(excluded),
        "timing_methods": dict(methods),
    }


def headline(commits: list[str]) -> None:
    from common import RESULTS, RowWriter

    def named(commit: str | None) -> str | None:
        """The argument naming this row's commit (a hash or an abbreviation of it)."""
        for c in commits:
            if commit and (commit.startswith(c) or c.startswith(commit)):
                return c
        return None

    by_def: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for line in (RESULTS / "bundled_run.jsonl").read_text().splitlines():
        row = json.loads(line)
        name = named(row.get("commit"))
        if name is not None and row["op"] != "bundled_headline":
            by_def[row["op"]][name].append(row)
    lat: dict[tuple[str, str], dict[str, tuple[float, str | None]]] = defaultdict(dict)
    chosen: dict[str, dict[str, Any]] = {}
    for definition, runs in sorted(by_def.items()):
        commit = max(runs, key=commits.index)  # the last-named commit that ran it
        # A commit's rows may come from several resumed calls: one run in parts; a later
        # row of the same workload and solution replaces an earlier one.
        runs_of_commit = sorted({r["run_started"] or "" for r in runs[commit]})
        full = sorted({r["commit"] for r in runs[commit]}, key=len)[-1]  # as the rows name it
        chosen[definition] = {"commit": full, "run_started": runs_of_commit}
        for r in runs[commit]:
            if r.get("latency_ms") is not None:
                key = (definition, json.dumps(r["shape"], sort_keys=True))
                lat[key][r["solution"]] = (r["latency_ms"], r.get("timing_method"))
    figures = print_table(lat)
    for definition, run in chosen.items():
        print(f"  {definition:46s} {run['commit']}")
    RowWriter("bundled_run").write(
        "bundled_headline",
        {"workloads": len(lat)},
        "flashtune",
        None,
        runs_by_definition=chosen,
        definitions=sorted(chosen),
        **figures,
    )


def repeat(a: Path, b: Path, floor_ms: float = 0.02) -> None:
    """Same (definition, solution, workload) in two runs: relative difference of medians
    (issue 5: within 3% for kernels of 20 us or more), overall and per timing method."""
    first = {(t.definition, t.solution, t.workload.uuid): t for t in _traces(a)}
    diffs = []
    for t in _traces(b):
        key = (t.definition, t.solution, t.workload.uuid)
        other = first.get(key)
        if not (other and t.evaluation.performance and other.evaluation.performance):
            continue
        pa, pb = other.evaluation.performance, t.evaluation.performance
        x, y = pa.latency_ms, pb.latency_ms
        methods = f"{getattr(pa, 'timing_method', '?')}/{getattr(pb, 'timing_method', '?')}"
        if min(x, y) >= floor_ms:
            diffs.append((abs(x - y) / min(x, y), key, x, y, methods))
    diffs.sort(reverse=True)
    within = sum(d[0] <= 0.03 for d in diffs)
    print(
        f"repeatability (kernels >= {floor_ms * 1e3:.0f} us): {within}/{len(diffs)} within 3%; "
        f"median diff {sorted(d[0] for d in diffs)[len(diffs) // 2]:.2%}"
        if diffs
        else "no pairs"
    )
    by_method: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for d in diffs:
        by_method[d[4]][0] += d[0] <= 0.03
        by_method[d[4]][1] += 1
    for m, (ok, n) in sorted(by_method.items()):
        print(f"  {m:26s} {ok}/{n} within 3%")
    for d, key, x, y, m in diffs[:8]:
        print(f"  {d:6.2%} {key[0]} {key[1]} {x * 1e3:.1f} us vs {y * 1e3:.1f} us ({m})")
    out = {
        "pairs": len(diffs),
        "within_3pct": within,
        "by_method": {m: {"within_3pct": ok, "pairs": n} for m, (ok, n) in by_method.items()},
        "worst": [(d, list(k), x, y, m) for d, k, x, y, m in diffs[:8]],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "warm":
        warm()
    elif cmd == "run":
        args = sys.argv[2:]
        defs = args[args.index("--definitions") + 1] if "--definitions" in args else None
        run(Path(args[0]), defs, "--resume" in args, 180.0)
    elif cmd == "rows":
        rows(Path(sys.argv[2]), *sys.argv[3:4])
    elif cmd == "headline":
        headline(sys.argv[2:])
    elif cmd == "repeat":
        repeat(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        raise SystemExit(__doc__)

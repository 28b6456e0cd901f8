"""Write docs/coverage.md: per FlashInfer-Trace family, what flashtune covers, computed.

    python scripts/coverage_table.py                       # writes docs/coverage.md
    python scripts/coverage_table.py --traces RUN_OUT ...  # with GPU results of `flashtune run`
    python scripts/coverage_table.py --check               # exit 1 if the file is not current

Per family (a Definition's op_type), over the FlashInfer-Trace definitions the project can
see (the corpus at FLASHTUNE_TRACE_CORPUS) and all 156 of flashinfer-bench at ecafa9c
(tests/dataset/data/, held-out families included), their union by name:
- definitions: visible, at ecafa9c, union;
- ops: definitions whose name starts with an op schema's prefix (flashtune has an op of that
  kind, perhaps not at these constants); kernels: definitions an op schema of flashtune names
  at their constants;
- solutions: definitions `flashtune run --with flashtune,flashinfer,torch` supplies
  flashtune's solution for (flashtune.ops.bundle.supply: the contract matches);
- PASS on GPU, ratio vs FlashInfer: from the committed result rows (benchmarks/results/
  corpus_run.jsonl, bundled_run.jsonl: the newest GPU run of each definition) and the traces
  of `--traces` folders (flashtune run outputs), which override them: definitions whose
  flashtune solution PASSED on a GPU on every workload measured, and the geometric mean of
  FlashInfer's latency over flashtune's on the workloads both PASSED (same hardware). A
  family nothing measured says "not measured".
Nothing in the table is typed by hand.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from flashtune import env
from flashtune.data import Dataset, Definition, EvaluationStatus, Trace
from flashtune.ops import load_all
from flashtune.ops.bundle.supply import schema_names, schemas_by_prefix, supply_all

REPO = Path(__file__).resolve().parents[1]
ECAFA9C = REPO / "tests" / "dataset" / "data" / "flashinfer_trace_ecafa9c_definitions.json.gz"
OUT = REPO / "docs" / "coverage.md"
NOT_MEASURED = "not measured"


def ecafa9c_definitions() -> list[Definition]:
    files = json.loads(gzip.decompress(ECAFA9C.read_bytes()))
    return [Definition.model_validate_json(text) for text in files.values()]


def visible_definitions(corpus: Path) -> list[Definition] | None:
    if not (corpus / "definitions").is_dir():
        return None
    return [
        Definition.model_validate_json(p.read_text())
        for p in sorted(corpus.rglob("*.json"))
        if "definitions" in p.relative_to(corpus).parts
    ]


def _gpu(trace: Trace) -> bool:
    hardware = str((trace.evaluation.environment if trace.evaluation else {}).get("hardware", ""))
    return bool(hardware) and hardware.lower() != "cpu"


def measured(roots: list[Path]) -> tuple[dict[str, bool], dict[str, list[float]]]:
    """{definition: flashtune PASSED on a GPU on every workload traced}, {definition:
    FlashInfer latency / flashtune latency per workload both PASSED on the same hardware}."""
    passed: dict[str, bool] = {}
    ratios: dict[str, list[float]] = defaultdict(list)
    for root in roots:
        traces = [t for t in Dataset(root).all_traces() if t.evaluation and _gpu(t)]
        best: dict[tuple[str, str, str, str], float] = {}
        for t in traces:
            kind = (t.solution or "").split("@")[0]
            ok = t.evaluation.status is EvaluationStatus.PASSED
            if kind == "flashtune":
                passed[t.definition] = passed.get(t.definition, True) and ok
            if ok and t.evaluation.performance and t.evaluation.performance.latency_ms:
                hardware = str(t.evaluation.environment.get("hardware"))
                key = (t.definition, t.workload.uuid, hardware, kind)
                latency = t.evaluation.performance.latency_ms
                best[key] = min(latency, best.get(key, math.inf))
        for (name, uuid, hardware, kind), latency in best.items():
            if kind == "flashtune" and (name, uuid, hardware, "flashinfer") in best:
                ratios[name].append(best[name, uuid, hardware, "flashinfer"] / latency)
    return passed, ratios


RESULT_ROWS = tuple(
    REPO / "benchmarks" / "results" / name for name in ("corpus_run.jsonl", "bundled_run.jsonl")
)


def measured_rows(paths: tuple[Path, ...]) -> tuple[dict[str, bool], dict[str, list[float]]]:
    """As `measured`, from committed result rows (`benchmarks/bench_bundled.py rows`: one
    per definition, shape and solution, with its status and GPU): per definition the newest
    GPU run that measured flashtune's solution, PASSED when every flashtune row of that run
    did; FlashInfer's latency over flashtune's per shape both PASSED in that run."""
    runs: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            row = json.loads(line)
            gpu = str(row.get("gpu") or "")
            if row.get("status") and gpu and gpu.lower() != "cpu":
                runs[row["op"]][str(row.get("run_started") or row.get("date"))].append(row)
    passed: dict[str, bool] = {}
    ratios: dict[str, list[float]] = defaultdict(list)
    for name, by_run in runs.items():
        for run in sorted(by_run, reverse=True):
            rows = by_run[run]
            ours = [r for r in rows if r.get("solution") == "flashtune"]
            if not ours:
                continue
            passed[name] = all(r["status"] == "PASSED" for r in ours)
            latency = {
                (r.get("solution"), json.dumps(r.get("shape"), sort_keys=True)): r["latency_ms"]
                for r in rows
                if r["status"] == "PASSED" and r.get("latency_ms")
            }
            for (solution, shape), ms in latency.items():
                if solution == "flashtune" and ("flashinfer", shape) in latency:
                    ratios[name].append(latency["flashinfer", shape] / ms)
            break
    return passed, ratios


def table(corpus: Path, trace_roots: list[Path]) -> str:
    load_all()
    schemas = schemas_by_prefix()
    visible = visible_definitions(corpus)
    held = ecafa9c_definitions()
    union = {d.name: d for d in held}
    union.update({d.name: d for d in visible or []})
    supplied = {
        s.definition.name
        for s in supply_all(union.values())
        if any(sol.name.startswith("flashtune@") for sol in s.solutions)
    }
    # Traces given on the command line override the committed rows' figures.
    passed, ratios = measured_rows(RESULT_ROWS)
    traced_passed, traced_ratios = measured(trace_roots)
    passed.update(traced_passed)
    ratios.update(traced_ratios)
    families = sorted({d.op_type for d in union.values()})
    header = (
        "| family | definitions (visible / ecafa9c / union) | ops | kernels | flashtune solutions "
        "| PASS on GPU | flashtune vs FlashInfer |\n|---|---|---|---|---|---|---|\n"
    )
    rows = []
    totals = [0, 0, 0, 0, 0, 0]
    gpu_passed = gpu_measured = 0
    for family in families:
        names = [n for n, d in union.items() if d.op_type == family]
        n_visible = "unknown" if visible is None else str(sum(d.op_type == family for d in visible))
        n_held = sum(d.op_type == family for d in held)
        ops = sum(any(n.startswith(f"{p}_") for p in schemas) for n in names)
        kernels = sum(schema_names(union[n], schemas) for n in names)
        solutions = sum(n in supplied for n in names)
        traced = [n for n in names if n in passed]
        gpu_measured += len(traced)
        gpu_passed += sum(passed[n] for n in traced)
        gpu = (
            f"{sum(passed[n] for n in traced)} of {len(traced)} measured"
            if traced
            else NOT_MEASURED
        )
        family_ratios = [r for n in names for r in ratios.get(n, [])]
        ratio = (
            f"{math.exp(sum(map(math.log, family_ratios)) / len(family_ratios)):.2f}x "
            f"({len(family_ratios)} workloads)"
            if family_ratios
            else NOT_MEASURED
        )
        rows.append(
            f"| {family} | {n_visible} / {n_held} / {len(names)} | {ops} | {kernels} | {solutions} "
            f"| {gpu} | {ratio} |"
        )
        for i, v in enumerate(
            (0 if visible is None else int(n_visible), n_held, len(names), ops, kernels, solutions)
        ):
            totals[i] += v
    visible_total = "unknown" if visible is None else str(totals[0])
    rows.append(
        f"| **all** | {visible_total} / {totals[1]} / {totals[2]} | {totals[3]} | {totals[4]} "
        f"| {totals[5]} | {gpu_passed} of {gpu_measured} measured | |"
    )
    sources = "the newest GPU run of each definition in the committed rows of " + ", ".join(
        f"`benchmarks/results/{p.name}`" for p in RESULT_ROWS
    )
    if trace_roots:
        sources += f", then the traces of {', '.join(str(r) for r in trace_roots)}"
    return (
        "# FlashInfer-Trace coverage\n\n"
        "Generated by `python scripts/coverage_table.py` (do not edit by hand; "
        "`--check` tells whether it is current). Per FlashInfer-Trace family (a definition's "
        "op_type), over the definitions of the visible corpus (`FLASHTUNE_TRACE_CORPUS`) and "
        "all 156 of flashinfer-ai/flashinfer-bench at ecafa9c "
        "(`tests/dataset/data/`, held-out families included), their union by name:\n\n"
        "- **ops**: definitions whose name starts with an op schema's prefix (flashtune has an "
        "op of that kind, perhaps not at these constants); **kernels**: definitions an op "
        "schema of flashtune names at their constants (MoE's schemas are made per routing key: "
        "an op answers `schema_for_definition` for the definitions it serves);\n"
        "- **flashtune solutions**: definitions `flashtune run --with flashtune,flashinfer,torch`"
        " (or `flashtune solutions add`) gives flashtune's solution: the schema's contract "
        "matches, layout variants adapted (`flashtune.ops.bundle.supply`);\n"
        "- **PASS on GPU**: definitions whose flashtune solution PASSED on a GPU on every "
        "workload traced; **flashtune vs FlashInfer**: geometric mean of FlashInfer's latency "
        f"over flashtune's on the workloads both PASSED ({sources}).\n\n"
        + header
        + "\n".join(rows)
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=None, help="default FLASHTUNE_TRACE_CORPUS")
    parser.add_argument("--traces", type=Path, action="append", default=[], help="run output")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="exit 1 if --out is not current")
    args = parser.parse_args(argv)
    corpus = args.corpus or env.TRACE_CORPUS.get()
    corpus = corpus if corpus.is_absolute() else (REPO / corpus).resolve()
    text = table(corpus, args.traces)
    if args.check:
        current = args.out.read_text() if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is not current: python scripts/coverage_table.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

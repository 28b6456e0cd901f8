"""After a benchmark run: --out as a whole dataset, not a folder of traces alone.

FlashInfer-Bench reads a dataset (definitions, solutions, workloads, traces) from one root:
its `report summary` scores authors against the solution of its baseline author, and its
`validate` checks every trace against the definition, the solution and the workload it
names. So the run copies into --out what its traces refer to, where --out lacks it: each
traced definition, solution (under its author: the torch eager baseline under "baseline"),
and the workloads that ran, with the blobs they read. Nothing there is replaced: an earlier
run's files and the user's own are kept as they are.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from flashtune.data import Dataset, Trace

__all__ = ["export_ran"]


def export_ran(source: Dataset, out: Path, traces: Sequence[Trace]) -> list[str]:
    """Copy into the dataset root `out` the definitions, solutions, workloads and blobs that
    `traces` name, from `source` (the run's roots and solution sources); returns a problem
    per thing that could not be copied (the traces are written either way)."""
    sink = Dataset(out)
    problems: list[str] = []
    names = sorted({t.definition for t in traces})
    for name in names:
        if name not in source.definitions:
            continue
        definition = source.definition(name)
        if name not in sink.definitions:
            sink.add_definition(definition)
        mine = [t for t in traces if t.definition == name]
        have = {s.name for s in sink.solutions_for(name)}
        for solution in source.solutions_for(name):
            if solution.name in {t.solution for t in mine} and solution.name not in have:
                sink.add_solution(solution)
        known = {w.workload.uuid for w in sink.workloads_for(name)}
        ran = {t.workload.uuid for t in mine}
        records = [
            w
            for w in source.workloads_for(name)
            if w.workload.uuid in ran and w.workload.uuid not in known
        ]
        for record in records:
            problems += _copy_blobs(source, out, record)
        if records:  # as Workloads: written with every input listed (Dataset.add_workloads)
            sink.add_workloads(definition, [r.workload for r in records])
    return problems


def _copy_blobs(source: Dataset, out: Path, record: Trace) -> list[str]:
    problems = []
    for spec in record.workload.inputs.values():
        relative = getattr(spec, "path", None)
        if relative is None:
            continue
        target = (out / relative).resolve()
        if not target.is_relative_to(out.resolve()):
            problems.append(f"blob path {relative!r} escapes {out}: not copied")
            continue
        if target.exists():
            continue
        found = source.blob_path(relative)
        if not found.is_file():
            continue  # a missing blob: its inputs were synthesized, as the run said
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(found, target)
    return problems

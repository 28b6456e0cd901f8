"""Regenerate the bundled dataset (src/flashtune/dataset/): definitions, workloads, solutions.

    python scripts/build_bundled_dataset.py

What is bundled is declared by each op family in its own package (`ops/<family>/bundle.py`,
see flashtune.ops.bundle): per op, its workloads and its solutions. This script walks them.
Definitions are the op schemas' own (flashtune.schema): the ops' example calls at the per-GPU
shapes of Llama-3.1-8B, Llama-3.1-70B (tensor parallel 8) and Qwen3-8B
(flashtune.model_shapes); each reference is the source of the op's reference function.
Nothing about an op's contract is written here. Solutions are named `<kind>@<definition>`;
each runs an entry point of flashtune.bench.entry_points through a small source file binding
`run` to it, so FlashInfer-Bench loads them too. Each description says how it is run.

    python scripts/build_bundled_dataset.py --root /tmp/ds   # elsewhere, e.g. to compare
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from flashtune.data import Dataset, Definition, Workload
from flashtune.model_shapes import ModelConfig
from flashtune.ops import load_all
from flashtune.ops.bundle import WorkloadContext, bundled_op_for, bundled_ops, solutions_for
from flashtune.schema.dump import Example, model_definitions, model_examples

ROOT = Path(__file__).resolve().parents[1] / "src" / "flashtune" / "dataset"


# --------------------------------------------------------------------------- definitions


def _bundled(example: Example, model: ModelConfig) -> bool:
    op, args, kwargs = example
    call = op.bind(*args, **kwargs)
    bundled = {op.prefix: op for op in bundled_ops()}.get(call.schema.name_prefix)
    if bundled is None or model.name not in bundled.models:
        return False
    return all(call.axes.get(axis, value) == value for axis, value in bundled.consts.items())


def _bundled_examples(model: ModelConfig) -> list[Example]:
    return [example for example in model_examples(model) if _bundled(example, model)]


def definitions() -> list[Definition]:
    """The bundled ops' Definitions, from their schemas, tagged with the models they serve."""
    load_all()  # the op modules register their schemas and example calls
    examples: list[Callable[[ModelConfig], list[Example]]] = [_bundled_examples]
    models = sorted({model for op in bundled_ops() for model in op.models})
    generated = model_definitions(models, examples)
    prefixes = {op.prefix for op in bundled_ops()}
    missing = {p for p in prefixes if not any(n.startswith(f"{p}_") for n in generated)}
    if missing:
        raise SystemExit(f"no example call of {sorted(missing)} in the op modules")
    return list(generated.values())


def workloads_for(definition: Definition, root: Path) -> list[Workload]:
    op = bundled_op_for(definition.name)
    if op is None:
        raise ValueError(f"no workloads for {definition.name}")
    return op.workloads(definition, WorkloadContext(root, torch.Generator().manual_seed(0)))


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help=f"dataset folder (default {ROOT})")
    root = parser.parse_args(argv).root
    for sub in ("definitions", "solutions", "workloads", "blob"):
        shutil.rmtree(root / sub, ignore_errors=True)
    ds = Dataset(root)
    for definition in definitions():
        ds.add_definition(definition)
        ds.add_workloads(definition, workloads_for(definition, root))
        for sol in solutions_for(definition):
            ds.add_solution(sol)
    errors = Dataset(root).load_all()
    for e in errors:
        print(e)
    counts = Dataset(root).counts()
    print(f"{root}: {counts}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""What the bundled dataset takes from each op family, declared in the family's own package.

A family that ships in the bundled dataset (src/flashtune/dataset/) has a `bundle.py` module
in its package with `BUNDLED: tuple[BundledOp, ...]`: per op (a schema name prefix), the
workloads it is benchmarked at and its solutions (flashtune's entry, the torch eager
baseline, FlashInfer's where it has one), each an entry function in that module. Everything
else is derived by walking the families, with no list to keep by hand:
- `scripts/build_bundled_dataset.py` writes the definitions (the schemas' own), the workloads
  and the solutions of every bundled op;
- `flashtune.bench.entry_points` serves every entry function under its name (the bundled
  solutions' sources import them from there);
- the sandbox preloads every family package; `tests/dataset/test_bundled.py` checks them all.

Solution sources name `flashtune.bench.entry_points` (ENTRY_MODULE), not the family module,
so a solution keeps its code (and its hash) when an entry moves between modules.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashtune.data import Definition, Solution, Workload

__all__ = [
    "ENTRY_FILE",
    "ENTRY_MODULE",
    "GQA_MODELS",
    "NO_SETUP",
    "OWN_PATH_ENTRIES",
    "PLANNED",
    "TORCH_EAGER",
    "BundledOp",
    "Entry",
    "WorkloadContext",
    "bundled_op_for",
    "bundled_ops",
    "entry_functions",
    "entry_solution",
    "entry_source",
    "flashinfer_direct",
    "runs_the_op",
    "solution_name",
    "solutions_for",
    "tuned_api",
    "with_description",
]

# The models the bundle's dense-GQA ops are defined at: Llama-3.1-8B, Llama-3.1-70B at tensor
# parallel 8, Qwen3-8B (per-GPU shapes).
GQA_MODELS = ("llama-3.1-8b", "llama-3.1-70b-tp8", "qwen3-8b")
ENTRY_FILE = "main.py"
ENTRY_MODULE = "flashtune.bench.entry_points"

# ------------------------------------------------------------------ how a solution is run
# Said plainly in each description: the harness times the entry itself unless it has a
# setup phase (`entry.setup`, run once per input set outside the timed region).
DISPATCH = (
    "the autotuner's dispatch picks the tactic per shape bucket from a loaded cache file or "
    "bundled configs matching this GPU, else the default tactic (it profiles only under "
    "`flashtune run --autotune`)"
)
NO_SETUP = "No setup phase: each timed call is the whole call."
PLANNED = (
    "plan() runs once per input set in the setup phase, outside the timed region; the timed "
    "call is run() only (FlashInfer's float workspace: one 128 MB buffer per device, shared; "
    "input sets with identical index tensors share one plan). Runs where the flashinfer "
    "package is installed."
)


TORCH_EAGER = f"PyTorch eager baseline. {NO_SETUP}"


def flashinfer_direct(call: str) -> str:
    """The description of a FlashInfer entry calling one of its functions (no plan)."""
    return (
        f"FlashInfer's {call}, called directly. {NO_SETUP} Runs where the flashinfer package "
        "is installed."
    )


def tuned_api(call: str, note: str = "") -> str:
    """The description of flashtune's entry calling a tuned public op."""
    return (
        f"flashtune's Triton kernel through its public API ({call}){note}; {DISPATCH}. {NO_SETUP}"
    )


# ------------------------------------------------------------------ declarations

# Entries that run flashtune's own op for their definition (its default path, as a user's
# call would): apply recognises a solution that only imports one of them
# (apply.solutions.runs_the_op_itself) and lets the op run itself instead.
OWN_PATH_ENTRIES: set[str] = set()


def runs_the_op(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark an entry as running flashtune's own op for its definition."""
    OWN_PATH_ENTRIES.add(fn.__name__)
    return fn


@dataclass(frozen=True)
class Entry:
    """One bundled solution of an op: its kind (the name's part before '@': flashtune, torch,
    flashinfer, flashinfer_<backend>), the entry function, how it is run (the description)."""

    kind: str
    function: Callable[..., Any]
    description: str

    @property
    def author(self) -> str:
        # The torch eager baseline is written under FlashInfer-Bench's baseline author (its
        # summary and rankings score every other author against the one solution of
        # "baseline"); its name stays `torch@<definition>`, which --baseline selects.
        if self.kind == "torch":
            return "baseline"
        return "flashinfer" if self.kind.startswith("flashinfer") else self.kind

    @property
    def language(self) -> str:
        return "triton" if self.kind == "flashtune" else "python"

    @property
    def hardware(self) -> list[str]:
        return ["cpu", "cuda"] if self.kind == "torch" else ["cuda"]

    @property
    def dependencies(self) -> tuple[str, ...]:
        # Python calling FlashInfer's own (CUDA) kernels: FlashInfer-Bench's "cuda" means CUDA
        # sources it compiles, so these are python solutions depending on the package.
        return ("flashinfer",) if self.author == "flashinfer" else ()


@dataclass(frozen=True)
class WorkloadContext:
    """Where workloads are written (the dataset root, for blobs) and the seeded generator
    their random page tables and patterns are drawn from."""

    root: Path
    generator: Any  # torch.Generator


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one object per op
class BundledOp:
    """One op of the bundled dataset.

    prefix: the op schema's name prefix (its definitions are named `<prefix>_<consts>`).
    workloads: (definition, context) -> the workloads it is benchmarked at.
    entries: every solution entry the op has.
    pick: (definition, entries) -> the entries of that definition (default: all of them),
      for ops whose solutions depend on the definition (decode's backend rule).
    consts: const axes the bundle fixes where the op's examples cover several values.
    models: the models (flashtune.model_shapes) whose example calls give its definitions.
    """

    prefix: str
    workloads: Callable[[Definition, WorkloadContext], list[Workload]]
    entries: tuple[Entry, ...]
    pick: Callable[[Definition, tuple[Entry, ...]], list[Entry]] | None = None
    consts: Mapping[str, int] = field(default_factory=dict)
    models: tuple[str, ...] = GQA_MODELS

    def entries_for(self, definition: Definition) -> list[Entry]:
        return list(self.entries) if self.pick is None else self.pick(definition, self.entries)


@functools.cache
def bundled_ops() -> tuple[BundledOp, ...]:
    """Every family's bundled ops (each family package's, or job package's, `bundle.py`)."""
    from flashtune.ops import bundle_modules

    ops = [op for module in bundle_modules() for op in module.BUNDLED]
    prefixes = [op.prefix for op in ops]
    if len(set(prefixes)) != len(prefixes):
        raise RuntimeError(f"an op is declared by two bundle modules: {sorted(prefixes)}")
    return tuple(ops)


def bundled_op_for(definition_name: str) -> BundledOp | None:
    """The bundled op a definition belongs to (the longest matching prefix), or None."""
    matches = [op for op in bundled_ops() if definition_name.startswith(f"{op.prefix}_")]
    return max(matches, key=lambda op: len(op.prefix), default=None)


def entry_functions() -> dict[str, Callable[..., Any]]:
    """Every bundled entry function by name (what `flashtune.bench.entry_points` serves)."""
    return {e.function.__name__: e.function for op in bundled_ops() for e in op.entries}


# ------------------------------------------------------------------ solutions


def solution_name(kind: str, definition: Definition) -> str:
    """`<kind>@<definition>`: FlashInfer-Bench wants solution names unique in a dataset, and
    the kind stays first, so `flashtune@*` / `torch*` / `flashinfer@*` select by kind."""
    return f"{kind}@{definition.name}"


def entry_source(function: str) -> str:
    """The source of a solution running the entry `function` as it is (the bundled form)."""
    return (
        f"# Runs {ENTRY_MODULE}.{function} (the flashtune package must be installed).\n"
        "# Value-returning: run(*inputs) returns the outputs.\n"
        f"from {ENTRY_MODULE} import {function} as run\n"
        "\n"
        '__all__ = ["run"]\n'
    )


def entry_solution(definition: Definition, entry: Entry, source: str | None = None) -> Solution:
    """`entry`'s Solution of `definition`, its code `source` (default: the small file binding
    `run` to the entry, `entry_source`)."""
    # FlashInfer-Bench's form: sources carrying the code, a "file.py::function" entry point,
    # one of its languages, target hardware, names unique across definitions. The code is a
    # small file binding `run` to the entry (the object itself, so its setup phase comes with
    # it); flashtune builds it like any source solution.
    if source is None:
        source = entry_source(entry.function.__name__)
    spec: dict[str, object] = {
        "language": entry.language,
        "target_hardware": entry.hardware,
        "entry_point": f"{ENTRY_FILE}::run",
    }
    if entry.dependencies:
        spec["dependencies"] = list(entry.dependencies)
    spec["destination_passing_style"] = False
    return Solution.model_validate(
        {
            "name": solution_name(entry.kind, definition),
            "definition": definition.name,
            "author": entry.author,
            "description": entry.description,
            "spec": spec,
            "sources": [{"path": ENTRY_FILE, "content": source}],
        }
    )


def solutions_for(definition: Definition) -> list[Solution]:
    """The bundled solutions of a definition of a bundled op (flashtune, torch, FlashInfer's)."""
    op = bundled_op_for(definition.name)
    if op is None:
        raise ValueError(
            f"{definition.name}: no op family bundles solutions for this op (its bundle.py)"
        )
    return [entry_solution(definition, entry) for entry in op.entries_for(definition)]


def with_description(entry: Entry, description: str) -> Entry:
    """The entry with another description (an op's `pick` saying what a definition gets)."""
    return dataclasses.replace(entry, description=description)

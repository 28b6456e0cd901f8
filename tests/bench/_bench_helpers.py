"""Build small datasets with planted solutions for the runner tests."""

from __future__ import annotations

import os
from pathlib import Path

from flashtune.data import Dataset, Definition, Solution, Workload

TOY_REFERENCE = "import torch\n\ndef run(x, w):\n    return x * w\n"


def toy_definition(name: str = "toy_scale_h8", reference: str = TOY_REFERENCE) -> Definition:
    return Definition.model_validate(
        {
            "name": name,
            "op_type": "toy",
            "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 8}},
            "inputs": {
                "x": {"shape": ["n", "h"], "dtype": "float32"},
                "w": {"shape": ["h"], "dtype": "float32"},
            },
            "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
            "reference": reference,
        }
    )


def python_solution(
    name: str, body: str, definition: str = "toy_scale_h8", **spec: object
) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": definition,
            "author": "tests",
            "spec": {
                "language": "python",
                "entry_point": "main.py::run",
                "destination_passing_style": False,
                **spec,
            },
            "sources": [{"path": "main.py", "content": body}],
        }
    )


def make_dataset(
    root: Path,
    solutions: dict[str, str],
    sizes: list[int] = (1, 3),  # type: ignore[assignment]
    definition: Definition | None = None,
    extra: list[Solution] = (),  # type: ignore[assignment]
) -> Dataset:
    """A dataset with one toy definition, workloads n in `sizes`, and python solutions."""
    ds = Dataset(root)
    definition = definition or toy_definition()
    ds.add_definition(definition)
    ds.add_workloads(
        definition, [Workload(uuid=f"{definition.name}-n{n}", axes={"n": n}) for n in sizes]
    )
    for name, body in solutions.items():
        ds.add_solution(python_solution(name, body, definition.name))
    for sol in extra:
        ds.add_solution(sol)
    return ds


def statuses(traces) -> dict[tuple[str, str], str]:
    """(definition, solution) -> the single status of its traces (asserts they agree)."""
    out: dict[tuple[str, str], set[str]] = {}
    for t in traces:
        out.setdefault((t.definition, t.solution), set()).add(t.evaluation.status.value)
    for key, values in out.items():
        assert len(values) == 1, f"{key}: mixed statuses {values}"
    return {k: next(iter(v)) for k, v in out.items()}


def processes_running(marker: str) -> list[int]:
    """The processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found

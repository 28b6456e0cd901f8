"""Datasets with planted solutions and hand-written traces, for the apply tests."""

from __future__ import annotations

from pathlib import Path

import torch

from flashtune.data import Dataset, Definition, Solution, Trace, Workload

NORM_SRC = """import torch
CALLS = []

def run(hidden_states, weight):
    CALLS.append(tuple(hidden_states.shape))
    x = hidden_states.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (y * weight.float()).to(hidden_states.dtype)
"""

GEMM_SRC = """CALLS = []

def run(A, B):
    CALLS.append(tuple(A.shape))
    return A @ B.T
"""


def plant(ds: Dataset, definition: str, name: str, source: str, **spec: object) -> Solution:
    """Add a single-file python solution `main.py::run` (spec fields may be overridden)."""
    sol = Solution.model_validate(
        {
            "name": name,
            "definition": definition,
            "author": "test",
            "spec": {
                "language": "python",
                "entry_point": "main.py::run",
                "destination_passing_style": False,
                **spec,
            },
            "sources": [{"path": "main.py", "content": source}],
        }
    )
    ds.add_solution(sol, overwrite=True)
    return sol


def trace(
    definition: str,
    solution: str,
    axes: dict[str, int],
    latency: float | None,
    status: str = "PASSED",
    abs_err: float | None = 0.0,
    uuid: str | None = None,
    timestamp: str = "2026-01-01T00:00:00",
) -> Trace:
    evaluation: dict = {"status": status, "timestamp": timestamp, "environment": {}}
    # FlashInfer-Bench's rule: only PASSED is timed; PASSED / INCORRECT_NUMERICAL have errors.
    if latency is not None and status == "PASSED":
        evaluation["performance"] = {"latency_ms": latency}
    if abs_err is not None and status in ("PASSED", "INCORRECT_NUMERICAL"):
        evaluation["correctness"] = {"max_absolute_error": abs_err, "max_relative_error": abs_err}
    uid = uuid or "w-" + "-".join(f"{k}{v}" for k, v in sorted(axes.items()))
    return Trace.model_validate(
        {
            "definition": definition,
            "solution": solution,
            "workload": {"uuid": uid, "axes": axes, "inputs": {}},
            "evaluation": evaluation,
        }
    )


def add_traces(
    ds: Dataset, traces: list[Trace], author: str = "test", stub_missing: bool = False
) -> None:
    """Append traces as the benchmark would have written them here: stamped with the
    solution's content hash and this environment, unless the trace sets its own, and signed
    with this user's key (as `flashtune run` signs what it writes; apply trusts nothing
    else). With `stub_missing`, a solution the dataset lacks is planted first (a table-only
    test)."""
    from flashtune.apply.table import current_environment
    from flashtune.bench.build import solution_hash
    from flashtune.data.signing import sign_trace

    for t in traces:
        sols = [s for s in ds.solutions.get(t.definition, []) if s.name == t.solution]
        if not sols and stub_missing and t.solution is not None:
            sols = [plant(ds, t.definition, t.solution, "def run(*args):\n    return None\n")]
        ev = t.evaluation
        if ev is not None:
            if ev.solution_hash is None and sols:
                ev.solution_hash = solution_hash(sols[0])
            if not ev.environment:
                env = current_environment()
                ev.environment = {**env, "hardware": env["hardware"][0]}
        ds.append_trace(sign_trace(t), author=author)


def add_definition(ds: Dataset, definition: Definition) -> None:
    if definition.name not in ds.definitions:
        ds.add_definition(definition)


def workload(axes: dict[str, int]) -> Workload:
    return Workload(uuid="x", axes=axes, inputs={})


def root_of(tmp_path: Path) -> Dataset:
    return Dataset(tmp_path)


def calls_of(solution: Solution) -> list:
    from flashtune.apply import load_solution

    return load_solution(solution).__globals__["CALLS"]


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)

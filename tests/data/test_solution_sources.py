"""Solutions attached from another dataset (`Dataset(solution_sources=...)`): only to a
definition of the same contract, never its workloads; and the contract itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from _examples import GOOD_DEFINITION
from flashtune.data import Dataset, Definition, Solution, Workload


def _solution(name: str, definition: str = "scale_h8", factor: int = 2) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": definition,
            "author": "them",
            "spec": {
                "language": "python",
                "target_hardware": ["cpu"],
                "entry_point": "main.py::run",
            },
            "sources": [{"path": "main.py", "content": f"def run(x):\n    return x * {factor}\n"}],
        }
    )


def _dataset(root: Path, workload: str | None = None, **changes: object) -> Dataset:
    ds = Dataset(root)
    definition = Definition.model_validate(GOOD_DEFINITION | changes)
    ds.add_definition(definition)
    if workload is not None:
        ds.add_workloads(definition, [Workload(uuid=workload, axes={"n": 1}, inputs={})])
    return ds


def test_contract_leaves_out_descriptions_and_usage_tags() -> None:
    plain = Definition.model_validate(GOOD_DEFINITION)
    described = Definition.model_validate(
        GOOD_DEFINITION
        | {"description": "doubles x", "tags": ["model:llama-3.1-8b", "fi_api:scale"]}
    )
    assert plain != described and plain.contract_differences(described) == []


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"inputs": {"x": {"shape": ["n", "h"], "dtype": "float16"}}},
            "inputs.x: float32[n, h] vs float16[n, h]",
        ),
        ({"reference": "import torch\n\ndef run(x):\n    return x * 3\n"}, "reference"),
        ({"tags": ["tol:atol=0.5"]}, "tags: [] vs ['tol:atol=0.5']"),
        ({"axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 16}}}, "axes"),
    ],
)
def test_contract_differences_name_what_differs(changes: dict[str, object], says: str) -> None:
    plain = Definition.model_validate(GOOD_DEFINITION)
    other = Definition.model_validate(GOOD_DEFINITION | changes)
    differences = plain.contract_differences(other)
    assert differences and any(says in d for d in differences), differences


def test_input_order_is_part_of_the_contract() -> None:
    # A solution is called run(*inputs) in definition order: swapped inputs are another call.
    two = GOOD_DEFINITION | {
        "inputs": {
            "x": {"shape": ["n", "h"], "dtype": "float32"},
            "w": {"shape": ["h"], "dtype": "float32"},
        },
        "reference": "import torch\n\ndef run(x, w):\n    return x * w\n",
    }
    swapped = two | {"inputs": dict(reversed(list(two["inputs"].items())))}
    differences = Definition.model_validate(two).contract_differences(
        Definition.model_validate(swapped)
    )
    assert differences == ["inputs: order ['x', 'w'] vs ['w', 'x']"]


def test_solutions_attach_to_the_same_contract_without_workloads(tmp_path: Path) -> None:
    _dataset(tmp_path / "captured", workload="captured-w")
    source = _dataset(tmp_path / "source", workload="source-w", description="theirs")
    source.add_solution(_solution("theirs@scale"))
    ds = Dataset(tmp_path / "captured", solution_sources=[tmp_path / "source"])
    assert [s.name for s in ds.solutions_for("scale_h8")] == ["theirs@scale"]
    assert ds.attached_from("scale_h8", "theirs@scale") == (tmp_path / "source").resolve()
    assert ds.unattached == []
    # Only the roots' workloads and definitions: a source contributes solutions alone.
    assert [w.workload.uuid for w in ds.workloads_for("scale_h8")] == ["captured-w"]
    assert ds.definition("scale_h8").description is None
    # Without the source nothing attaches (the captured dataset has no solutions).
    assert Dataset(tmp_path / "captured").solutions_for("scale_h8") == []


def test_a_roots_own_solution_of_the_same_name_wins(tmp_path: Path) -> None:
    mine = _dataset(tmp_path / "captured")
    mine.add_solution(_solution("shared", factor=2))
    source = _dataset(tmp_path / "source")
    source.add_solution(_solution("shared", factor=3))
    source.add_solution(_solution("extra"))
    ds = Dataset(tmp_path / "captured", solution_sources=[tmp_path / "source"])
    (shared,) = [s for s in ds.solutions_for("scale_h8") if s.name == "shared"]
    assert "x * 2" in shared.sources[0].content
    assert ds.attached_from("scale_h8", "shared") is None
    assert ds.attached_from("scale_h8", "extra") == (tmp_path / "source").resolve()


def test_another_contract_gets_no_solutions_and_says_why(tmp_path: Path) -> None:
    _dataset(tmp_path / "captured", inputs={"x": {"shape": ["n", "h"], "dtype": "float16"}})
    source = _dataset(tmp_path / "source")
    source.add_solution(_solution("theirs@scale"))
    ds = Dataset(tmp_path / "captured", solution_sources=[tmp_path / "source"])
    assert ds.solutions_for("scale_h8") == []
    (unattached,) = ds.unattached
    assert unattached.definition == "scale_h8" and unattached.solutions == ("theirs@scale",)
    message = unattached.message()
    assert "theirs@scale" in message and "do not attach" in message
    assert "inputs.x: float16[n, h] vs float32[n, h]" in message


def test_a_source_that_is_also_a_root_is_read_once(tmp_path: Path) -> None:
    source = _dataset(tmp_path / "source")
    source.add_solution(_solution("theirs@scale"))
    ds = Dataset(tmp_path / "source", solution_sources=[tmp_path / "source"])
    assert ds.solution_sources == []
    assert [s.name for s in ds.solutions_for("scale_h8")] == ["theirs@scale"]
    assert ds.attached_from("scale_h8", "theirs@scale") is None

"""Dataset store: lazy loading, filters, combined roots, atomic writes and whole-line appends."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from _examples import GOOD_DEFINITION
from flashtune.data import (
    Correctness,
    Dataset,
    Definition,
    Evaluation,
    EvaluationStatus,
    Performance,
    Solution,
    Trace,
    Workload,
)
from flashtune.data.io import atomic_write_text


def _definition(name: str = "scale_h8", op_type: str = "scale") -> Definition:
    return Definition.model_validate(GOOD_DEFINITION | {"name": name, "op_type": op_type})


def _trace(definition: str, n: int, solution: str = "sol") -> Trace:
    return Trace(
        definition=definition,
        solution=solution,
        workload=Workload(uuid=f"w{n}", axes={"n": n}, inputs={}),
        evaluation=Evaluation(
            status=EvaluationStatus.PASSED,
            timestamp="2026-11-21T00:00:00Z",
            correctness=Correctness(max_absolute_error=0.0, max_relative_error=0.0),
            performance=Performance(latency_ms=0.5 + n),
        ),
    )


def test_add_and_reload(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    d = _definition()
    path = ds.add_definition(d)
    assert path == tmp_path / "definitions" / "scale" / "scale_h8.json"
    with pytest.raises(FileExistsError):
        ds.add_definition(d)
    sol = Solution.model_validate(
        {
            "name": "double",
            "definition": "scale_h8",
            "author": "me",
            "spec": {"language": "python", "entry_point": "main.py::run"},
            "sources": [{"path": "main.py", "content": "def run(x):\n    return x * 2\n"}],
        }
    )
    ds.add_solution(sol)
    ds.add_workloads(d, [Workload(uuid="a", axes={"n": 3}, inputs={})])
    ds.append_trace(_trace("scale_h8", 3), author="me")

    fresh = Dataset(tmp_path)
    assert fresh.definition("scale_h8") == d
    assert [s.name for s in fresh.solutions_for("scale_h8")] == ["double"]
    assert [w.workload.uuid for w in fresh.workloads_for("scale_h8")] == ["a"]
    assert fresh.traces_for("scale_h8")[0].evaluation.performance.latency_ms == 3.5
    assert fresh.load_all() == []


def test_correctness_extensions_survive_a_round_trip(tmp_path: Path) -> None:
    # rel_norm_error and the element-wise atol/rtol (flashtune extensions) are what apply
    # re-judges a PASSED trace by: a trace written and read back must keep them.
    t = _trace("scale_h8", 3)
    t.evaluation.correctness = Correctness(
        max_absolute_error=1.0,
        max_relative_error=3.25,
        matched_ratio=0.9995,
        rel_norm_error=3e-3,
        atol=1.6e-2,
        rtol=float("inf"),  # a tolerance a tag turned off is written as FlashInfer-Bench would
    )
    raw = json.loads(t.to_json())
    assert raw["evaluation"]["correctness"]["atol"] == 1.6e-2
    assert raw["evaluation"]["correctness"]["rtol"] == "Infinity"
    assert Trace.model_validate(raw) == t
    ds = Dataset(tmp_path)
    ds.add_definition(_definition())
    ds.append_trace(t, author="me")
    [back] = Dataset(tmp_path).traces_for("scale_h8")
    assert back.evaluation.correctness == t.evaluation.correctness
    # A record without them (older benches, other tools) reads as unknown and writes back
    # without them.
    old = Correctness.model_validate({"max_absolute_error": 0.5, "max_relative_error": 0.5})
    assert (old.atol, old.rtol) == (None, None)
    assert "atol" not in old.to_dict() and "rtol" not in old.to_dict()


def test_filters(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    for name, op in [("a_h1", "x"), ("a_h2", "x"), ("b_h1", "y")]:
        ds.add_definition(_definition(name, op))
    fresh = Dataset(tmp_path)
    assert [d.name for d in fresh.find_definitions(op_type="x")] == ["a_h1", "a_h2"]
    assert [d.name for d in fresh.find_definitions(name="*_h1")] == ["a_h1", "b_h1"]
    with pytest.raises(KeyError, match="no definition named 'zzz'"):
        fresh.definition("zzz")


def test_combined_roots_read_all_write_first(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    Dataset(a).add_definition(_definition("one"))
    Dataset(b).add_definition(_definition("two"))
    both = Dataset([a, b])
    assert set(both.definitions) == {"one", "two"}
    both.add_definition(_definition("three"))
    assert (a / "definitions" / "scale" / "three.json").exists()
    assert not (b / "definitions" / "scale" / "three.json").exists()


def test_lazy_loading_reads_nothing_until_asked(tmp_path: Path) -> None:
    Dataset(tmp_path).add_definition(_definition())
    (tmp_path / "definitions" / "scale" / "broken.json").write_text("{")
    ds = Dataset(tmp_path)
    assert ds.errors == []  # nothing read yet
    ds.definitions  # noqa: B018
    assert len(ds.errors) == 1


def test_atomic_write_leaves_old_file_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    atomic_write_text(path, "old")

    class Boom(str):
        def __str__(self) -> str:  # pragma: no cover - not reached
            return "x"

    with pytest.raises(TypeError):
        atomic_write_text(path, 123)  # type: ignore[arg-type]
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temporary left behind


def _append_many(root: str, worker: int) -> None:
    ds = Dataset(root)
    for i in range(50):
        ds.append_trace(_trace("scale_h8", worker * 1000 + i, solution=f"s{worker}"), author="me")


def test_concurrent_appends_keep_whole_lines(tmp_path: Path) -> None:
    Dataset(tmp_path).add_definition(_definition())
    # Fresh processes (no state copied from this one), forked from one server that has
    # imported the dataset code once instead of four times.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["flashtune.data"])
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = (tmp_path / "traces" / "me" / "scale" / "scale_h8.jsonl").read_text().splitlines()
    assert len(lines) == 200
    assert all(json.loads(line)["definition"] == "scale_h8" for line in lines)


def test_append_after_truncated_line_starts_fresh(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    ds.add_definition(_definition())
    path = ds.append_trace(_trace("scale_h8", 1), author="me")
    with open(path, "a") as f:
        f.write('{"definition": "scale_h8", "wor')  # a writer killed mid-line
    ds.append_trace(_trace("scale_h8", 2), author="me")
    fresh = Dataset(tmp_path)
    assert [t.workload.uuid for t in fresh.traces_for("scale_h8")] == ["w1", "w2"]
    assert len(fresh.errors) == 1 and ":2:" in str(fresh.errors[0])


def test_blob_path_may_not_escape(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="escapes the dataset root"):
        Dataset(tmp_path).blob_path("../outside.safetensors")

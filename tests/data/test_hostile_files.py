"""A hostile dataset fails one file (or one JSONL line) at a time: a file too deeply nested,
not UTF-8, too large or not a file at all is one error in `flashtune validate` and a skipped
definition in `flashtune run`, and the rest of the dataset runs. Writes into a dataset (and
`run --out`) refuse a symbolic link that leads outside it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _bench_helpers import make_dataset, toy_definition  # noqa: E402

from flashtune.bench.runner import RunOptions, run_benchmark  # noqa: E402
from flashtune.cli import app  # noqa: E402
from flashtune.data import Dataset, Trace, Workload  # noqa: E402
from flashtune.data.io import UnsafePathError, append_line, atomic_write_text  # noqa: E402

WIDE = {"COLUMNS": "300"}
GOOD = "def run(x, w):\n    return x * w\n"
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # in os.environ: the workers `run` spawns read it too
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(tmp_path / "cache"))


def _hostile_definitions(root: Path) -> dict[str, str]:
    """Three hostile definition files beside the good one; name -> the cause expected."""
    folder = root / "definitions" / "toy"
    (folder / "deep.json").write_text(DEEP)
    good = json.loads((folder / "toy_scale_h8.json").read_text())
    latin1 = json.dumps({**good, "name": "latin1", "description": "caf\u00e9"}, ensure_ascii=False)
    (folder / "latin1.json").write_bytes(latin1.encode("latin-1"))
    huge = json.dumps({**good, "name": "huge", "description": "x" * (2 << 20)})
    (folder / "huge.json").write_text(huge)
    os.mkfifo(folder / "pipe.json")  # a reader that opened it would wait forever
    return {
        "deep.json": "nested more than 100 levels",
        "latin1.json": "not UTF-8",
        "huge.json": "over the 1 MiB cap",
        "pipe.json": "not a regular file",
    }


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    monkeypatch.setenv("FLASHTUNE_MAX_JSON_MB", "1")
    root = tmp_path / "ds"
    make_dataset(root, {"good": GOOD}, sizes=[1])
    return root, _hostile_definitions(root)


def test_each_hostile_definition_is_one_error(hostile: tuple[Path, dict[str, str]]) -> None:
    root, causes = hostile
    ds = Dataset(root)
    errors = ds.load_all()
    assert sorted(e.path.name for e in errors) == sorted(causes)
    for error in errors:
        assert causes[error.path.name] in error.message, error
    assert list(ds.definitions) == ["toy_scale_h8"]

    result = CliRunner().invoke(app, ["validate", str(root)], env=WIDE)
    assert result.exit_code == 1
    assert "4 error(s)" in result.output and "Traceback" not in result.output
    for name, cause in causes.items():
        [line] = [ln for ln in result.output.splitlines() if name in ln]
        assert str(root / "definitions" / "toy" / name) in line and cause in line


# ~4 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
@pytest.mark.slow
def test_run_skips_the_hostile_definitions_and_runs_the_rest(
    hostile: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, causes = hostile
    out = tmp_path / "out"
    args = ["run", "-d", str(root), "-o", str(out), "--devices", "cpu", "-q"]
    result = CliRunner().invoke(app, args, env=WIDE)
    assert result.exit_code == 0, result.output
    for name, cause in causes.items():
        assert any(
            name in ln and cause in ln and "(skipped)" in ln for ln in result.output.splitlines()
        )
    [trace] = Dataset(out).traces_for("toy_scale_h8")
    assert trace.solution == "good" and trace.evaluation.status.value == "PASSED"


def test_each_bad_jsonl_line_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHTUNE_MAX_JSON_MB", "1")
    ds = make_dataset(tmp_path / "ds", {"good": GOOD}, sizes=[1, 2])
    [path] = (ds.root / "workloads").rglob("*.jsonl")
    record = json.loads(path.read_text().splitlines()[0])
    with path.open("ab") as f:
        f.write(DEEP.encode() + b"\n")
        latin1 = json.dumps({**record, "note": "caf\u00e9"}, ensure_ascii=False)
        f.write(latin1.encode("latin-1") + b"\n")
        f.write(b'{"pad": "' + b"x" * (3 << 20) + b'"}\n')  # over the cap, no newline inside
        f.write(b'{"definition": \n')
        good = {**record, "workload": {**record["workload"], "uuid": "after"}}
        f.write(json.dumps(good).encode() + b"\n")
    fresh = Dataset(ds.root)
    errors = fresh.load_all()
    assert [(e.line, e.message.split(" (")[0]) for e in errors] == [
        (3, "JSON nested more than 100 levels deep"),
        (4, "not UTF-8 text"),
        (5, "3.0 MiB is over the 1 MiB cap on a dataset JSON file or line"),
        (6, "malformed JSON: Expecting value"),
    ]
    uuids = [w.workload.uuid for w in fresh.workloads_for("toy_scale_h8")]
    assert uuids == ["toy_scale_h8-n1", "toy_scale_h8-n2", "after"]


def test_deep_but_legal_nesting_in_a_trace_loads(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", {"good": GOOD}, sizes=[1])
    nested: object = 1
    for _ in range(60):
        nested = {"n": nested}
    trace = Trace.model_validate(
        {
            "definition": "toy_scale_h8",
            "workload": {"uuid": "w", "axes": {"n": 1}},
            "solution": "good",
            "evaluation": {
                "status": "RUNTIME_ERROR",
                "timestamp": "2026-01-01T00:00:00Z",
                "environment": {"hardware": "cpu", "nested": nested},
            },
        }
    )
    ds.append_trace(trace, author="tests")
    fresh = Dataset(ds.root)
    assert fresh.traces_for("toy_scale_h8") == [trace] and not fresh.load_all()


# --------------------------------------------------------------------------- symlinks


def test_run_refuses_a_traces_file_linked_outside_out(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root, {"good": GOOD}, sizes=[1])
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text("precious\n")
    link = root / "traces" / "tests" / "toy" / "toy_scale_h8.jsonl"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    args = ["run", "-d", str(root), "--out", str(root), "--devices", "cpu", "-q"]
    result = CliRunner().invoke(app, args, env=WIDE)
    assert result.exit_code == 2, result.output
    assert "symbolic link" in result.output and str(link) in result.output
    assert outside.read_text() == "precious\n"
    with pytest.raises(UnsafePathError, match="symbolic link"):
        run_benchmark(RunOptions(datasets=[root], out=root, devices=["cpu"]), progress=False)
    assert outside.read_text() == "precious\n"


def test_dataset_writes_refuse_links_leading_outside(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", {"good": GOOD}, sizes=[1])
    outside = tmp_path / "outside"
    outside.mkdir()
    (ds.root / "traces").symlink_to(outside, target_is_directory=True)
    trace = ds.workloads_for("toy_scale_h8")[0]
    with pytest.raises(UnsafePathError, match=r"traces is a symbolic link to .*outside"):
        ds.append_trace(trace.model_copy(update={"solution": "good"}), author="tests")
    definitions = tmp_path / "defs-elsewhere"
    definitions.mkdir()
    (ds.root / "definitions" / "other").symlink_to(definitions, target_is_directory=True)
    other = toy_definition("toy_scale_h16").model_copy(update={"op_type": "other"})
    with pytest.raises(UnsafePathError):
        ds.add_definition(other)
    (ds.root / "workloads" / "other").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        ds.add_workloads(other, [Workload(uuid="w", axes={"n": 1})])
    assert list(outside.iterdir()) == [] and list(definitions.iterdir()) == []
    assert ds.links_leading_outside(("traces", "definitions")) != []


def test_links_inside_the_root_are_followed_and_a_final_link_is_never(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    (root / "real").mkdir(parents=True)
    (root / "alias").symlink_to(root / "real", target_is_directory=True)
    append_line(root / "alias" / "a.jsonl", "{}", root=root)
    atomic_write_text(root / "alias" / "b.json", "{}", root=root)
    assert sorted(p.name for p in (root / "real").iterdir()) == ["a.jsonl", "b.json"]
    target = tmp_path / "target.jsonl"
    target.write_text("")
    (root / "real" / "c.jsonl").symlink_to(target)
    with pytest.raises(UnsafePathError):  # even without a root: O_NOFOLLOW
        append_line(root / "real" / "c.jsonl", "{}")
    assert target.read_text() == ""

"""Provenance by code: solution hashes cover the module an importable entry point imports,
traces carry the code and the run's start, and --resume re-runs what changed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from _bench_helpers import make_dataset

from flashtune import platform
from flashtune.bench.build import solution_hash
from flashtune.bench.evaluate import BenchConfig
from flashtune.bench.runner import RunOptions, code_key, run_benchmark
from flashtune.data import Solution

KERNEL = "def run(x, w):\n    return x * w\n"


def _importable(name: str, entry_point: str) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": "toy_scale_h8",
            "author": "tests",
            "spec": {"language": "python", "entry_point": entry_point},
        }
    )


@pytest.fixture
def package(tmp_path, monkeypatch, request) -> tuple[str, Path]:
    """A package of its own name on sys.path (and PYTHONPATH, for spawned processes):
    <pkg>/__init__.py importing nothing, <pkg>/kern.py with the entry function."""
    name = f"ft_prov_{request.node.name.replace('[', '_').replace(']', '')}"[:60]
    root = tmp_path / "site"
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kern.py").write_text(KERNEL)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    return name, pkg


def test_hash_changes_when_the_module_file_changes(package):
    name, pkg = package
    sol = _importable("imp", f"{name}.kern:run")
    before = solution_hash(sol)
    assert solution_hash(sol) == before  # stable (and served from the cache)
    (pkg / "kern.py").write_text(KERNEL.replace("x * w", "w * x"))
    assert solution_hash(sol) != before
    # A file beside it is not part of that module.
    after = solution_hash(sol)
    (pkg / "other.py").write_text("X = 1\n")
    assert solution_hash(sol) == after


def test_package_entry_point_hashes_the_package_files(package):
    name, pkg = package
    (pkg / "__init__.py").write_text("from .kern import run\n")
    sol = _importable("imp", f"{name}:run")
    before = solution_hash(sol)
    (pkg / "kern.py").write_text(KERNEL + "\n# v2\n")  # imported by __init__: counts
    assert solution_hash(sol) != before


def test_hashing_imports_nothing(package, tmp_path):
    name, pkg = package
    marker = tmp_path / "imported"
    # Importing the package (or its module) would run untrusted code in the harness.
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (pkg / "kern.py").write_text(f"open({str(marker)!r}, 'w').close()\n" + KERNEL)
    solution_hash(_importable("imp", f"{name}.kern:run"))
    solution_hash(_importable("imp", f"{name}:run"))
    assert not marker.exists()
    assert name not in sys.modules and f"{name}.kern" not in sys.modules


def test_missing_module_still_hashes():
    sol = _importable("imp", "no_such_package_ft.mod:run")
    assert solution_hash(sol) == solution_hash(sol)


def test_flashtune_entry_points_hash_flashtune_sources(monkeypatch):
    sol = _importable("ft", "flashtune.bench.entry_points:torch_rmsnorm")
    before = solution_hash(sol)
    monkeypatch.setattr(platform, "source_hash", lambda: "a kernel changed")
    assert solution_hash(sol) != before


def test_python_source_solutions_keep_their_hash():
    """Solutions that carry their sources hash as before (their traces stay resumable)."""
    import hashlib

    from _bench_helpers import python_solution

    sol = python_solution("a", KERNEL)
    payload = {
        "spec": sol.spec.model_dump(mode="json"),
        "sources": sorted((s.path, s.content) for s in sol.sources),
    }
    expected = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]
    assert solution_hash(sol) == expected


def test_code_key():
    files = {"files": "f" * 64}
    assert code_key({}) == (None, None)
    assert code_key({"code": {"tree": "t", "dirty": False, **files}}) == ("t", False)
    assert code_key({"code": {"tree": "t", "dirty": True, **files}}) == ("t", True)
    assert code_key({"code": {"tree": None, "source": "files", **files}}) == (None, "f" * 64)


def _opts(root: Path, out: Path, **kw) -> RunOptions:
    return RunOptions(
        datasets=[root],
        out=out,
        devices=["cpu"],
        timeout=60,
        config=BenchConfig(warmup=1, iterations=3, trials=1),
        max_workloads=1000,
        **kw,
    )


def _rewrite_code(out: Path, solution: str) -> None:
    """Make `solution`'s traces look measured by another checkout's code."""
    for path in (out / "traces").rglob("*.jsonl"):
        lines = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["solution"] == solution:
                record["evaluation"]["environment"]["code"] = {
                    "tree": "0" * 40,
                    "commit": "1" * 40,
                    "dirty": False,
                    "source": "git",
                    "files": "2" * 64,
                }
            lines.append(json.dumps(record))
        path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_resume_reruns_after_the_module_or_the_code_tree_changes(package, tmp_path):
    name, pkg = package
    root = tmp_path / "ds"
    extra = [_importable("imp", f"{name}.kern:run")]
    make_dataset(root, {"src": KERNEL, "other": KERNEL}, sizes=[1], extra=extra)
    out = tmp_path / "out"
    first = run_benchmark(_opts(root, out), progress=False)
    assert sorted(t.evaluation.status.value for t in first.traces) == ["PASSED"] * 3
    for t in first.traces:  # provenance, computed, and the run's own start
        env = t.evaluation.environment
        assert env["run_started"] == first.environment["run_started"]
        assert env["code"]["source"] in ("git", "env", "files") and env["code"]["files"]
    again = run_benchmark(_opts(root, out, resume=True), progress=False)
    assert again.resumed == 3 and again.traces == []  # the worker's hash is the parent's

    (pkg / "kern.py").write_text(KERNEL.replace("x * w", "w * x"))  # the kernel changed
    _rewrite_code(out, "src")  # measured by other code
    changed = run_benchmark(_opts(root, out, resume=True), progress=False)
    assert changed.resumed == 1  # "other": same content, same code
    assert sorted(t.solution for t in changed.traces) == ["imp", "src"]
    assert all(t.evaluation.status.value == "PASSED" for t in changed.traces)

"""Code provenance (platform.code_provenance), the snapshot that carries it, and the benchmark
rows (benchmarks/common.py) that must carry it too."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flashtune import platform

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A git checkout with one committed package, pkg/."""
    monkeypatch.delenv("FLASHTUNE_BENCH_COMMIT", raising=False)
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "one")
    return root


@needs_git
def test_git_tree_commit_and_dirty_flag(repo):
    code = platform.code_provenance(repo / "pkg")
    assert code["source"] == "git" and code["dirty"] is False
    assert code["tree"] == _git(repo, "rev-parse", "HEAD^{tree}")
    assert code["commit"] == _git(repo, "rev-parse", "HEAD")
    assert code["files"] == platform.files_hash(repo / "pkg")
    (repo / "pkg" / "new.py").write_text("B = 2\n")  # untracked: not dirty, but other files
    untracked = platform.code_provenance(repo / "pkg")
    assert untracked["dirty"] is False and untracked["files"] != code["files"]
    (repo / "pkg" / "a.py").write_text("A = 2\n")
    dirty = platform.code_provenance(repo / "pkg")
    assert dirty["dirty"] is True and dirty["tree"] == code["tree"]


@needs_git
def test_untracked_folder_and_no_repo_fall_back_to_files(repo, tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHTUNE_BENCH_COMMIT", raising=False)
    # A wheel inside a virtualenv inside some project's checkout is not that project's code.
    (repo / "venv" / "site").mkdir(parents=True)
    (repo / "venv" / "site" / "m.py").write_text("M = 1\n")
    code = platform.code_provenance(repo / "venv" / "site")
    assert code["source"] == "files" and code["tree"] is None and code["dirty"] is None
    assert code["files"] == platform.files_hash(repo / "venv" / "site")
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "m.py").write_text("M = 1\n")
    assert platform.code_provenance(lone)["source"] == "files"


@needs_git
def test_named_commit_is_flagged_env(repo, monkeypatch):
    commit = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setenv("FLASHTUNE_BENCH_COMMIT", commit[:10])
    code = platform.code_provenance(repo / "pkg")
    assert code["source"] == "env" and code["commit"] == commit and code["dirty"] is None
    assert code["tree"] == _git(repo, "rev-parse", "HEAD^{tree}")
    monkeypatch.setenv("FLASHTUNE_BENCH_COMMIT", "abc1234")  # a stale .git does not know it
    code = platform.code_provenance(repo / "pkg")
    assert code == {
        "tree": None,
        "commit": "abc1234",
        "dirty": None,
        "source": "env",
        "files": platform.files_hash(repo / "pkg"),
    }


def test_files_hash_sees_content_names_and_new_files(tmp_path):
    (tmp_path / "a.py").write_text("A = 1\n")
    first = platform.files_hash(tmp_path)
    assert platform.files_hash(tmp_path) == first
    (tmp_path / "a.py").write_text("A = 22\n")
    second = platform.files_hash(tmp_path)
    assert second != first
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("")
    assert platform.files_hash(tmp_path) != second
    (tmp_path / "notes.txt").write_text("not code")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "c.py").write_text("")
    third = platform.files_hash(tmp_path)
    (tmp_path / "notes.txt").write_text("still not code")
    assert platform.files_hash(tmp_path) == third
    assert platform.files_hash(tmp_path / "a.py") != third  # one file: that file alone


def test_snapshot_carries_code_and_run_start(monkeypatch):
    monkeypatch.delenv("FLASHTUNE_BENCH_COMMIT", raising=False)
    snap = platform.snapshot("cpu", run_started="2026-01-01T00:00:00+00:00")
    assert snap["run_started"] == "2026-01-01T00:00:00+00:00"
    assert set(snap["code"]) == {"tree", "commit", "dirty", "source", "files"}
    assert snap["code"]["files"] == platform.source_hash()
    if shutil.which("git") and snap["code"]["source"] == "git":  # this checkout
        assert len(snap["code"]["tree"]) == 40 and isinstance(snap["code"]["dirty"], bool)
    assert "run_started" not in platform.snapshot("cpu")


def test_benchmark_rows_carry_computed_provenance(tmp_path, monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setenv("FLASHTUNE_BENCH_COMMIT", "abc1234")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "common.py"
    spec = importlib.util.spec_from_file_location("_ft_bench_common", path)
    common = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "_ft_bench_common", common)
    spec.loader.exec_module(common)  # type: ignore[union-attr]
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    row = common.RowWriter("probe").write("op", {"M": 1}, "sol", 1.0)
    assert row["commit"] == "abc1234" and row["code"]["source"] == "env"
    assert row["code"]["files"] == platform.source_hash()
    assert row["run_started"] == common.RUN_STARTED
    written = json.loads((tmp_path / "probe.jsonl").read_text())
    assert written["code"] == row["code"]

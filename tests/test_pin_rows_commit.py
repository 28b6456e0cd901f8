"""scripts/pin_rows_commit.py: a result row's commit is the one whose src/flashtune reproduces
the row's files hash, found in a small git repository made here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flashtune.platform import files_hash

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    path = ROOT / "scripts" / "pin_rows_commit.py"
    spec = importlib.util.spec_from_file_location("pin_rows_commit", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


script = _load_script()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _commit(repo: Path, text: str) -> tuple[str, str]:
    """Commit src/flashtune/kernel.py with `text`: (short commit, files hash of its sources)."""
    source = repo / "src" / "flashtune"
    source.mkdir(parents=True, exist_ok=True)
    (source / "kernel.py").write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", text)
    return _git(repo, "rev-parse", "--short=7", "HEAD"), files_hash(source)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty git repository, the current folder (the script runs git there)."""
    path = tmp_path / "repo"
    path.mkdir()
    _git(path, "init", "-q")
    monkeypatch.chdir(path)
    return path


def test_rows_are_pinned_to_the_commit_their_sources_hash_to(repo: Path, tmp_path: Path) -> None:
    first, first_hash = _commit(repo, "x = 1\n")
    second, second_hash = _commit(repo, "x = 2\n")
    assert first_hash != second_hash
    rows = [
        # The GPU machine named the older commit, but ran the newer sources.
        {
            "op": "bundled_headline",
            "commit": first,
            "code": {"files": second_hash, "commit": first, "source": "env"},
            "runs": [{"commit": first}, {"commit": "0000000"}],
        },
        # Named right: kept as it is.
        {"op": "a", "commit": first, "code": {"files": first_hash, "commit": first}},
        # No commit has these sources: left and counted.
        {"op": "b", "commit": "abc", "code": {"files": "unknown", "commit": "abc"}},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert script.main([str(path), "--depth", "5"]) == 1  # one row matched no commit
    pinned, kept, unmatched = [json.loads(line) for line in path.read_text().splitlines()]
    assert pinned["commit"].startswith(second) and pinned["code"]["source"] == "files-matched"
    assert pinned["code"]["commit"] == pinned["commit"]
    # The headline's runs named the wrong commit too: re-pinned; another run's is left.
    assert [r["commit"] for r in pinned["runs"]] == [pinned["commit"], "0000000"]
    assert kept == rows[1]
    assert unmatched == rows[2]


def test_a_commit_beyond_the_depth_is_not_searched(repo: Path, tmp_path: Path) -> None:
    _, old_hash = _commit(repo, "x = 1\n")
    _commit(repo, "x = 2\n")
    path = tmp_path / "rows.jsonl"
    row = {"op": "a", "commit": "f" * 7, "code": {"files": old_hash, "commit": "f" * 7}}
    path.write_text(json.dumps(row) + "\n")
    assert script.main([str(path), "--depth", "1"]) == 1  # the newest commit only
    assert json.loads(path.read_text()) == row

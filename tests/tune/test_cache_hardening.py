"""The autotune cache file under hostile conditions: paths that cannot be read or written,
bad entries, writers killed mid-save, and the umask."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _tune_helpers as H  # noqa: E402

from flashtune.tune import AutoTuner, AutotuneWarning, autotune, choose_one, load_configs  # noqa: E402
from flashtune.tune.cache_file import current_metadata, read_cache_file, write_cache_file  # noqa: E402

CFG = H.CONFIG
KEY = ("fake", "FakeRunner", ((4, 4),))


@pytest.fixture(autouse=True)
def fresh_tuner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AutoTuner:
    return H.install_fresh_tuner(monkeypatch, tmp_path)


def timed() -> int:
    return sum(H.TIMED.values())


def deny_create_under(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Make `folder` read-only: chmod, and for root (whom chmod does not stop) refuse to
    create files in it the way the kernel would refuse others."""
    folder.chmod(0o555)
    if os.geteuid() != 0:
        return
    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and Path(os.fsdecode(path)).parent == folder:
            raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)


def deny_read(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    path.chmod(0)
    if os.geteuid() != 0:
        return
    real = Path.read_text

    def read_text(self, *args, **kwargs):
        if self == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)


@pytest.mark.parametrize("kind", ["directory", "unreadable", "read-only folder", "under a file"])
def test_unusable_cache_path_warns_once_and_keeps_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    path = tmp_path / "c.json"
    before = None
    if kind == "directory":
        path.mkdir()
    elif kind == "unreadable":
        write_cache_file(path, {("fake", "FakeRunner", ((64, 4),)): ("FakeRunner", 2)}, {})
        before = path.read_bytes()
        deny_read(monkeypatch, path)
    elif kind == "read-only folder":
        path = tmp_path / "ro" / "c.json"
        path.parent.mkdir()
        deny_create_under(monkeypatch, path.parent)
    else:
        (tmp_path / "file").write_text("")
        path = tmp_path / "file" / "c.json"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with autotune(True, cache=path):
                assert choose_one("fake", [H.FakeRunner()], CFG, [torch.randn(4, 4)])[1] == 1
        mine = [w for w in caught if issubclass(w.category, AutotuneWarning)]
        assert len(mine) == 1, [str(w.message) for w in mine]
        assert str(path) in str(mine[0].message)
        # the tuned result stays in memory: no profiling the second time
        n = timed()
        assert choose_one("fake", [H.FakeRunner()], CFG, [torch.randn(3, 4)])[1] == 1
        assert timed() == n
    finally:
        for p in (path, path.parent):
            if p.exists():
                p.chmod(0o755)
    if before is not None:  # a file that could not be read is never overwritten
        monkeypatch.undo()
        assert path.read_bytes() == before


def test_one_bad_entry_drops_only_that_entry(tmp_path: Path, fresh_tuner: AutoTuner) -> None:
    path = tmp_path / "c.json"
    good = {
        str(("fake", "FakeRunner", ((8, 4),))): ["FakeRunner", 2],
        str(("fake", "FakeRunner", ((16, 4),))): ["FakeRunner", 0],
    }
    bad = {
        str(("fake", "FakeRunner", ((32, 4),))): "not [runner, tactic]",
        "('fake', 'FakeRunner'": ["FakeRunner", 1],  # does not parse
        str(("fake", "FakeRunner", ((64, 4),))): ["OtherRunner", 1],  # another runner
        str(("fake", "FakeRunner", ((128, 4),))): ["FakeRunner", {"a": 1}],  # unhashable
    }
    path.write_text(json.dumps({"_metadata": current_metadata(), **good, **bad}))
    with pytest.warns(AutotuneWarning, match="4 corrupt entries") as record:
        assert load_configs(path) == 2
    assert len([w for w in record if issubclass(w.category, AutotuneWarning)]) == 1
    assert set(fresh_tuner.file_configs) == {
        ("fake", "FakeRunner", ((8, 4),)),
        ("fake", "FakeRunner", ((16, 4),)),
    }
    n = timed()
    assert choose_one("fake", [H.FakeRunner()], CFG, [torch.randn(8, 4)])[1] == 2  # loaded
    assert timed() == n
    original = path.read_text()
    with pytest.warns(AutotuneWarning) as record:  # loading says it again, saving too:
        with autotune(True, cache=path):
            choose_one("fake", [H.FakeRunner()], CFG, [torch.randn(4, 4)])
    assert any("kept a copy" in str(w.message) for w in record)
    found = read_cache_file(path)
    assert found.status == "ok" and not found.dropped
    assert set(found.entries) == {
        ("fake", "FakeRunner", ((8, 4),)),
        ("fake", "FakeRunner", ((16, 4),)),
        KEY,
    }
    [backup] = tmp_path.glob("c.json.*.bak")  # the dropped entries are not lost
    assert backup.read_text() == original


def _killed_during_save(path: Path) -> int:
    """Fork a writer that is killed between writing its temporary file and renaming it."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        try:
            os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore[assignment]
            write_cache_file(path, {KEY: ("FakeRunner", 1)}, current_metadata())
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return pid


def test_temp_files_of_killed_writers_are_removed_on_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    pids = [_killed_during_save(path) for _ in range(50)]
    # Each writer removes the orphans of those killed before it: one is left, not 50.
    [orphan] = tmp_path.glob(".c.json.*.tmp")
    # Orphans of writers killed at once (none saw the others' files): all 50 of them.
    fields = orphan.name.split("-")  # .c.json.tmp-<pid>-<host>-<random>.tmp
    for pid in pids[:-1]:
        (tmp_path / "-".join([fields[0], str(pid), *fields[2:]])).write_text("{")
    assert len(list(tmp_path.glob(".c.json.*.tmp"))) == 50
    # a writer that is alive now keeps its file, whatever its age
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live_file = tmp_path / "-".join([fields[0], str(sleeper.pid), *fields[2:]])
        live_file.write_text("{")
        # a temporary file without a pid (an older flashtune) is removed once it is old
        old_style, fresh_style = tmp_path / ".c.json.abc123.tmp", tmp_path / ".c.json.def456.tmp"
        old_style.write_text("{")
        fresh_style.write_text("{")
        an_hour_ago = time.time() - 3600
        os.utime(old_style, (an_hour_ago, an_hour_ago))
        with autotune(True, cache=path):
            choose_one("fake", [H.FakeRunner()], CFG, [torch.randn(4, 4)])
        assert sorted(p.name for p in tmp_path.glob(".c.json.*.tmp")) == sorted(
            [live_file.name, fresh_style.name]
        )
        assert read_cache_file(path).entries == {KEY: ("FakeRunner", 1)}
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077], ids=oct)
def test_cache_file_mode_follows_the_umask(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "c.json"
    old = os.umask(umask)
    try:
        with autotune(True, cache=path):
            choose_one("fake", [H.FakeRunner()], CFG, [torch.randn(4, 4)])
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask

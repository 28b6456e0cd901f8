"""Capture onto a full disk, and the modes of the files it creates."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from _capture_toys import toy_gather, toy_norm

from flashtune.capture import CaptureConfig, capture

KEEP_ALL = CaptureConfig("dump_none", "keep_all")


def _target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def fill_disk_after(monkeypatch: pytest.MonkeyPatch, lines: int, how: str) -> None:
    """Let `lines` workload lines through, then act as a full disk: part of each later line
    reaches the file, and the write either raises ENOSPC or returns short."""
    real_write = os.write
    seen = [0]

    def write(fd: int, data) -> int:
        if not _target(fd).endswith(".jsonl"):
            return real_write(fd, data)
        seen[0] += 1
        if seen[0] <= lines:
            return real_write(fd, data)
        n = real_write(fd, bytes(data)[:1])
        if how == "raise":
            raise OSError(errno.ENOSPC, "No space left on device")
        return n

    monkeypatch.setattr(os, "write", write)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
@pytest.mark.parametrize("how", ["raise", "short"])
def test_full_disk_leaves_no_partial_line_and_stats_match_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    fill_disk_after(monkeypatch, 3, how)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(dataset=tmp_path, default=KEEP_ALL) as cap:
            for batch in range(1, 9):  # the program goes on: no exception reaches it
                toy_norm(torch.randn(batch, 16), torch.randn(16))
    monkeypatch.undo()
    text = (tmp_path / "workloads" / "toy_norm" / "toy_norm_h16.jsonl").read_text()
    assert text.endswith("\n")
    rows = [json.loads(line) for line in text.splitlines()]  # every line is whole
    assert [r["workload"]["axes"]["batch_size"] for r in rows] == [1, 2, 3]
    assert cap.stats["written"] == len(rows) == 3
    assert cap.stats["errors"] == 5
    full = [w for w in caught if "could not write" in str(w.message)]
    assert len(full) == 1 and issubclass(full[0].category, RuntimeWarning)
    # once there is room again, records append cleanly after the whole lines
    with capture(dataset=tmp_path, default=KEEP_ALL) as cap:
        toy_norm(torch.randn(9, 16), torch.randn(16))
    text = (tmp_path / "workloads" / "toy_norm" / "toy_norm_h16.jsonl").read_text()
    assert [json.loads(line)["workload"]["axes"]["batch_size"] for line in text.splitlines()] == [
        1,
        2,
        3,
        9,
    ]


def test_blob_of_a_line_that_could_not_be_written_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc")
    fill_disk_after(monkeypatch, 0, "raise")
    with pytest.warns(RuntimeWarning, match="No space left"):
        with capture(dataset=tmp_path, default=CaptureConfig("dump_int", "keep_all")) as cap:
            toy_gather(torch.randn(5, 4), torch.tensor([1, 2]), 1.0)
    assert cap.stats["written"] == 0 and cap.stats["errors"] == 1
    assert list((tmp_path / "blob").rglob("*.safetensors")) == []


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077], ids=oct)
def test_captured_files_follow_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        with capture(dataset=tmp_path, default=CaptureConfig("dump_int", "keep_all")) as cap:
            toy_gather(torch.randn(5, 4), torch.tensor([1, 2]), 1.0)
    finally:
        os.umask(old)
    assert cap.stats["written"] == 1
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} == {".json", ".jsonl", ".safetensors"}
    for p in files:
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask, p


def test_temp_blobs_of_a_killed_capture_are_removed(tmp_path: Path) -> None:
    from flashtune.data.io import _host_tag

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = tmp_path / "blob" / "workloads" / "toy_gather" / "toy_gather_d4"
    folder.mkdir(parents=True)
    orphan = folder / f".toy_gather_d4_old.safetensors.tmp-{dead.pid}-{_host_tag()}-abcd1234.tmp"
    orphan.write_bytes(b"\0" * 64)
    with capture(dataset=tmp_path, default=CaptureConfig("dump_int", "keep_all")) as cap:
        toy_gather(torch.randn(5, 4), torch.tensor([1, 2]), 1.0)
    assert cap.stats["written"] == 1
    assert not orphan.exists()
    assert [p.suffix for p in folder.iterdir()] == [".safetensors"]

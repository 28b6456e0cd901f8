"""ApplyTable: winners per bucket, tolerances, nearest bucket, default, persistence."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from _apply_helpers import add_definition, trace
from _apply_helpers import add_traces as _add_traces

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from _capture_toys import toy_norm  # noqa: E402

from flashtune.apply.table import ApplyConfig, ApplyTable, bucket  # noqa: E402
from flashtune.data import Dataset  # noqa: E402

NAME = "toy_norm_h16"


def add_traces(ds: Dataset, traces: list) -> None:
    # These tests are about ranking: each traced solution exists (its traces verify).
    _add_traces(ds, traces, stub_missing=True)


@pytest.fixture
def ds(tmp_path: Path) -> Dataset:
    ds = Dataset(tmp_path)
    add_definition(
        ds, toy_norm.definition(torch.randn(2, 16, dtype=torch.float16), torch.randn(16))
    )
    return ds


def test_bucket() -> None:
    assert [bucket(v) for v in (0, 1, 2, 3, 4, 5, 1000)] == [0, 1, 2, 4, 4, 8, 1024]


def test_fastest_passing_solution_wins_each_bucket(ds: Dataset) -> None:
    add_traces(
        ds,
        [
            trace(NAME, "a", {"batch_size": 1}, 1.0),
            trace(NAME, "b", {"batch_size": 1}, 2.0),
            trace(NAME, "a", {"batch_size": 64}, 5.0),
            trace(NAME, "b", {"batch_size": 64}, 3.0),
            trace(NAME, "c", {"batch_size": 64}, 0.1, status="INCORRECT_NUMERICAL", abs_err=9.0),
        ],
    )
    table = ApplyTable.build(ds)
    dt = table.definitions[NAME]
    assert dt.buckets[(1,)].solution == "a"
    assert dt.buckets[(64,)].solution == "b"
    assert dt.buckets[(64,)].runners_up == ["a"]
    assert table.lookup(NAME, {"batch_size": 1}) == "a"
    assert table.lookup(NAME, {"batch_size": 60}) == "b"  # same bucket (64)
    assert table.lookup("other_def", {"batch_size": 1}) is None


def test_tolerance_is_dtype_aware_and_configurable(ds: Dataset) -> None:
    # float16 output: default max error 1e-2; "fast" passed the bench but with 0.5 error.
    add_traces(
        ds,
        [
            trace(NAME, "fast", {"batch_size": 4}, 1.0, abs_err=0.5),
            trace(NAME, "exact", {"batch_size": 4}, 2.0, abs_err=1e-3),
        ],
    )
    assert ApplyTable.build(ds).lookup(NAME, {"batch_size": 4}) == "exact"
    loose = ApplyConfig(max_atol=1.0, max_rtol=1.0)
    assert ApplyTable.build(ds, loose).lookup(NAME, {"batch_size": 4}) == "fast"


def test_solution_failing_any_workload_of_a_bucket_does_not_win_it(ds: Dataset) -> None:
    add_traces(
        ds,
        [
            trace(NAME, "flaky", {"batch_size": 5}, 1.0),
            trace(NAME, "flaky", {"batch_size": 7}, None, status="RUNTIME_ERROR"),
            trace(NAME, "solid", {"batch_size": 5}, 2.0),
            trace(NAME, "solid", {"batch_size": 7}, 2.0),
        ],
    )
    table = ApplyTable.build(ds)
    assert table.lookup(NAME, {"batch_size": 6}) == "solid"
    assert table.definitions[NAME].default == "solid"


def test_latest_rerun_replaces_older_result(ds: Dataset) -> None:
    add_traces(
        ds,
        [
            trace(NAME, "a", {"batch_size": 2}, 1.0, timestamp="2026-01-01T00:00:00"),
            trace(NAME, "a", {"batch_size": 2}, 9.0, timestamp="2026-02-01T00:00:00"),
            trace(NAME, "b", {"batch_size": 2}, 5.0),
        ],
    )
    assert ApplyTable.build(ds).lookup(NAME, {"batch_size": 2}) == "b"


def test_nearest_bucket_distance_and_default(ds: Dataset) -> None:
    add_traces(
        ds,
        [
            trace(NAME, "small", {"batch_size": 2}, 1.0),
            trace(NAME, "big", {"batch_size": 2}, 2.0),
            trace(NAME, "big", {"batch_size": 256}, 1.0),
            trace(NAME, "big", {"batch_size": 512}, 1.0),
            trace(NAME, "small", {"batch_size": 256}, 2.0),
            trace(NAME, "small", {"batch_size": 512}, 2.0),
        ],
    )
    table = ApplyTable.build(ds)
    assert table.definitions[NAME].default == "big"  # wins 2 of 3 buckets
    assert table.lookup(NAME, {"batch_size": 3}) == "small"  # nearest: bucket 2 (log2 dist 1)
    assert table.lookup(NAME, {"batch_size": 5000}) == "big"  # nearest: bucket 512
    near = ApplyTable.build(ds, ApplyConfig(max_distance=1.0))
    assert near.lookup(NAME, {"batch_size": 16}) == "big"  # too far from all: default
    strict = ApplyTable.build(ds, ApplyConfig(max_distance=1.0, use_default=False))
    assert strict.lookup(NAME, {"batch_size": 16}) is None  # fall back to the op
    assert strict.lookup(NAME, {"batch_size": 3}) == "small"


def test_persisted_and_rebuilt_only_when_traces_change(ds: Dataset, monkeypatch) -> None:
    add_traces(ds, [trace(NAME, "a", {"batch_size": 2}, 1.0)])
    table = ApplyTable.load(ds)
    path = ApplyTable.path_for(ds)
    saved = json.loads(path.read_text())
    assert saved["hash"] == table.content_hash
    assert saved["definitions"][NAME]["buckets"][0]["solution"] == "a"

    builds = []
    real_build = ApplyTable.build.__func__

    def counting_build(cls, *a, **k):
        builds.append(1)
        return real_build(cls, *a, **k)

    monkeypatch.setattr(ApplyTable, "build", classmethod(counting_build))
    assert ApplyTable.load(ds).lookup(NAME, {"batch_size": 2}) == "a"
    assert builds == []  # unchanged: read from the file
    for f in (ds.root / "traces").rglob("*.jsonl"):  # touched, same content: no rebuild
        os.utime(f, ns=(1, 1))
    assert ApplyTable.load(ds).lookup(NAME, {"batch_size": 2}) == "a"
    assert builds == []
    add_traces(ds, [trace(NAME, "b", {"batch_size": 2}, 0.5)])
    assert ApplyTable.load(ds).lookup(NAME, {"batch_size": 2}) == "b"
    assert builds == [1]
    assert ApplyTable.load(ds, ApplyConfig(max_atol=1.0)).content_hash != table.content_hash


def test_apply_show_cli(ds: Dataset) -> None:
    from typer.testing import CliRunner

    from flashtune.cli import app

    add_traces(
        ds, [trace(NAME, "a", {"batch_size": 2}, 1.0), trace(NAME, "b", {"batch_size": 2}, 2.0)]
    )
    result = CliRunner().invoke(app, ["apply", "show", "--dataset", str(ds.root)])
    assert result.exit_code == 0, result.output
    assert NAME in result.output and "default: a" in result.output and "<=2" in result.output

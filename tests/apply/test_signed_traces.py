"""apply trusts only traces signed with this user's key: a PASSED trace appended or edited by
anything but `flashtune run` (or imported with `flashtune traces trust`) is never used, and
says why in `flashtune apply show`; "the latest trace" is chosen by parsed time, so a crafted
timestamp cannot shadow a later real failure."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch
from _apply_helpers import NORM_SRC, add_definition, add_traces, plant, trace
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from _capture_toys import toy_norm  # noqa: E402

from flashtune.apply import ApplyTable  # noqa: E402
from flashtune.apply.table import current_environment  # noqa: E402
from flashtune.bench.build import solution_hash  # noqa: E402
from flashtune.cli import app  # noqa: E402
from flashtune.data import Dataset, Trace  # noqa: E402
from flashtune.data.signing import (  # noqa: E402
    TRACES,
    key_dir,
    key_id,
    sign_trace,
    trace_signature_problem,
    user_key,
)
from flashtune.report.tables import latest  # noqa: E402

NAME = "toy_norm_h16"
WIDE = {"COLUMNS": "300"}
AXES = {"batch_size": 4}


@pytest.fixture
def ds(tmp_path: Path) -> Dataset:
    ds = Dataset(tmp_path / "ds")
    add_definition(ds, toy_norm.definition(torch.randn(2, 16), torch.randn(16)))
    plant(ds, NAME, "fast", NORM_SRC)
    plant(ds, NAME, "other", NORM_SRC.replace("CALLS = []", "CALLS = []  # other"))
    return ds


def measured(ds: Dataset, solution: str, **kwargs: object) -> Trace:
    """A trace of `solution` as the benchmark records it here, not yet signed."""
    t = trace(NAME, solution, AXES, **kwargs)  # type: ignore[arg-type]
    [sol] = [s for s in ds.solutions[NAME] if s.name == solution]
    env = current_environment()
    t.evaluation.solution_hash = solution_hash(sol)
    t.evaluation.environment = {**env, "hardware": env["hardware"][0]}
    return t


def winner(ds: Dataset) -> str | None:
    return ApplyTable.build(ds).lookup(NAME, AXES)


def reasons(ds: Dataset) -> list[str]:
    return [r.reason for r in ApplyTable.build(ds).rejected]


def trace_file(ds: Dataset) -> Path:
    [path] = (ds.root / "traces").rglob("*.jsonl")
    return path


def trust(*args: str) -> object:
    return CliRunner().invoke(app, ["traces", "trust", *args], env=WIDE)


# --------------------------------------------------------------------------- forged traces


def test_forged_passed_trace_is_not_trusted_until_the_user_trusts_it(ds: Dataset) -> None:
    # Everything checks out (content hash, environment, time, tolerances) except the MAC:
    # what a solution could append for itself.
    ds.append_trace(measured(ds, "fast", latency=1e-6), author="test")
    assert winner(ds) is None
    assert any("not signed" in r and "flashtune traces trust" in r for r in reasons(ds))
    shown = CliRunner().invoke(app, ["apply", "show", "--dataset", str(ds.root)], env=WIDE)
    assert shown.exit_code == 0, shown.output
    assert "not signed" in shown.output and "fast" in shown.output

    listed = trust(str(ds.root), "--dry-run")
    assert listed.exit_code == 0, listed.output
    assert "1 traces (1 passed) of 1 solutions: fast" in listed.output
    assert "nothing signed" in listed.output and winner(ds) is None

    refused = trust(str(ds.root))  # no --yes and no answer: nothing signed
    assert refused.exit_code != 0 and winner(ds) is None

    result = trust(str(ds.root), "--yes")
    assert result.exit_code == 0, result.output
    assert "signed 1 traces" in result.output
    assert f"key id {key_id(user_key(TRACES))}" in result.output
    assert winner(ds) == "fast"
    again = trust(str(ds.root), "--yes")  # idempotent: the line is already signed
    assert again.exit_code == 0 and "nothing to trust" in again.output


def test_trust_keeps_what_it_cannot_read_and_what_is_signed(ds: Dataset) -> None:
    add_traces(ds, [trace(NAME, "other", AXES, 1.0)])  # signed by the "run"
    ds.append_trace(measured(ds, "fast", latency=0.1), author="test")
    path = trace_file(ds)
    signed_line = path.read_bytes().split(b"\n")[0]
    with path.open("ab") as f:
        f.write(b'{"broken": \n\xff\xfe not utf-8\n')
    result = trust(str(path), "--yes")
    assert result.exit_code == 0, result.output
    assert "1 already signed" in result.output and "signed 1 traces" in result.output
    assert "not UTF-8" in result.output and "left as it is" in result.output
    lines = path.read_bytes().split(b"\n")
    assert lines[0] == signed_line  # byte for byte
    assert lines[2:4] == [b'{"broken": ', b"\xff\xfe not utf-8"]
    assert winner(ds) == "fast"


def test_trust_refuses_a_symlinked_trace_file(ds: Dataset, tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_text(measured(ds, "fast", latency=0.1).to_json() + "\n")
    before = outside.read_bytes()
    link = ds.root / "traces" / "test" / "toy_norm" / f"{NAME}.jsonl"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    direct = trust(str(link), "--yes")
    assert direct.exit_code == 2 and "symbolic link" in direct.output
    walked = trust(str(ds.root), "--yes")
    assert "not followed" in walked.output
    assert outside.read_bytes() == before


def test_trace_edited_after_signing_is_rejected(ds: Dataset) -> None:
    add_traces(
        ds,
        [
            trace(NAME, "fast", AXES, 1.0),
            trace(NAME, "other", AXES, None, status="RUNTIME_ERROR"),
        ],
    )
    assert winner(ds) == "fast"
    path = trace_file(ds)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[0]["evaluation"]["performance"]["latency_ms"] = 1e-9  # a faster "fast"
    lines[1]["evaluation"].update(  # a failure turned into a win, signature kept
        status="PASSED",
        performance={"latency_ms": 1e-9},
        correctness={"max_absolute_error": 0.0, "max_relative_error": 0.0},
    )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = ApplyTable.build(ds)
    assert table.lookup(NAME, AXES) is None
    assert sorted(r.solution for r in table.rejected) == ["fast", "other"]
    assert all("does not verify" in r.reason for r in table.rejected)


def test_trace_signed_with_another_key_is_rejected(ds: Dataset) -> None:
    foreign = os.urandom(32).hex().encode()
    ds.append_trace(sign_trace(measured(ds, "fast", latency=0.1), foreign), author="test")
    assert winner(ds) is None
    assert any(f"another key (key id {key_id(foreign)!r}" in r for r in reasons(ds))


def test_signature_survives_the_file_and_names_the_key_not_the_key(ds: Dataset) -> None:
    t = measured(ds, "fast", latency=0.1)
    t.evaluation.correctness.max_relative_error = float("nan")  # written as "NaN"
    ds.append_trace(sign_trace(t), author="test")
    key = user_key(TRACES)
    [read] = Dataset(ds.root).traces_for(NAME)
    assert trace_signature_problem(read, key) is None
    line = trace_file(ds).read_text()
    assert '"NaN"' in line and key.decode() not in line
    assert read.signature["key_id"] == key_id(key) and read.signature["alg"] == "hmac-sha256"
    assert (key_dir() / "traces.key").stat().st_mode & 0o777 == 0o600
    assert trace_signature_problem(read, None) is not None  # no key: nothing verifies


# --------------------------------------------------------------------------- timestamps


def _later_string_earlier_time(now: datetime) -> tuple[str, str]:
    """(earlier, later): the earlier time written in UTC+14 sorts after the later one."""
    later = (now - timedelta(days=2)).replace(microsecond=0)
    earlier = later - timedelta(hours=1)
    early = earlier.astimezone(timezone(timedelta(hours=14))).isoformat()
    late = later.isoformat().replace("+00:00", "Z")
    assert early > late  # as strings
    return early, late


@pytest.mark.parametrize("crafted", ["zone", "garbage", "far future"])
def test_crafted_timestamp_does_not_shadow_a_later_failure(ds: Dataset, crafted: str) -> None:
    now = datetime.now(timezone.utc)
    early, late = _later_string_earlier_time(now)
    stamp = {"zone": early, "garbage": "zzzz-not-a-time", "far future": "9999-01-01T00:00:00Z"}
    add_traces(
        ds,
        [
            trace(NAME, "fast", AXES, 0.01, timestamp=late, status="RUNTIME_ERROR"),
            trace(NAME, "fast", AXES, 0.01, timestamp=stamp[crafted]),
            trace(NAME, "other", AXES, 1.0, timestamp=late),
        ],
    )
    assert winner(ds) == "other"  # the failure is fast's latest result
    if crafted != "zone":  # a timestamp that proves nothing is also refused, saying why
        assert any("ISO 8601" in r or "in the future" in r for r in reasons(ds))
    [kept] = [t for t in latest(Dataset(ds.root).traces_for(NAME)) if t.solution == "fast"]
    assert kept.evaluation.status.value == "RUNTIME_ERROR"


def test_later_time_wins_whatever_order_the_lines_are_in(ds: Dataset) -> None:
    now = datetime.now(timezone.utc)
    early, late = _later_string_earlier_time(now)
    add_traces(
        ds,
        [
            trace(NAME, "fast", AXES, 0.01, timestamp=late),  # the later measurement
            trace(NAME, "fast", AXES, None, timestamp=early, status="RUNTIME_ERROR"),
            trace(NAME, "other", AXES, 1.0, timestamp=late),
        ],
    )
    assert winner(ds) == "fast"
    [kept] = [t for t in latest(Dataset(ds.root).traces_for(NAME)) if t.solution == "fast"]
    assert kept.evaluation.status.value == "PASSED"


# --------------------------------------------------------------------------- --resume


@pytest.mark.slow  # processes for seconds (the main suite stays under 10 minutes)
def test_resume_does_not_skip_a_triple_for_a_forged_trace(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from _bench_helpers import make_dataset, python_solution

    from flashtune.bench.runner import RunOptions, run_benchmark

    good = "def run(x, w):\n    return x * w\n"
    ds = make_dataset(tmp_path / "ds", {"good": good}, sizes=[1])
    out = tmp_path / "out"

    def run() -> object:
        opts = RunOptions(datasets=[ds.root], out=out, devices=["cpu"], resume=True)
        return run_benchmark(opts, progress=False)

    first = run()
    [measured_here] = first.traces
    assert trace_signature_problem(measured_here, user_key(TRACES)) is None
    # A new solution, and a PASSED trace for it that only lacks the runner's signature.
    fast = python_solution("fast", good.replace("x * w", "w * x"))
    ds.add_solution(fast)
    forged = measured_here.model_copy(deep=True)
    forged.solution, forged.signature = "fast", None
    forged.evaluation.solution_hash = solution_hash(fast)
    Dataset(out).append_trace(forged, author="tests")
    second = run()
    assert second.resumed == 1  # good's own trace
    assert [t.solution for t in second.traces] == ["fast"]  # measured, not believed


def test_saved_table_is_not_reused_under_another_trace_key(
    ds: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_traces(ds, [trace(NAME, "fast", AXES, 0.1)])
    assert ApplyTable.load(ds).lookup(NAME, AXES) == "fast"  # saved, signed
    # Same table key (the saved table still verifies), a new trace key: the traces it was
    # built from are no longer this user's, so it is rebuilt, and they are refused.
    other = tmp_path / "other-cache"
    (other / "keys").mkdir(parents=True, mode=0o700)
    table_key = key_dir() / "table.key"
    (other / "keys" / "table.key").write_bytes(table_key.read_bytes())
    (other / "keys" / "table.key").chmod(0o600)
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(other))
    table = ApplyTable.load(ds, persist=False)
    assert table.lookup(NAME, AXES) is None
    assert any("another key" in r.reason for r in table.rejected)

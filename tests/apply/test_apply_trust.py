"""Apply trusts a trace only as evidence about the solution as it is now, here: its content
hash, environment, tolerances and time must check out; a solution that raises at call time
is dropped and the user's call falls back to the original function."""

from __future__ import annotations

import json
import os
import sys
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _apply_helpers import NORM_SRC, add_definition, add_traces, calls_of, plant, trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from _capture_toys import toy_norm, toy_norm_ref  # noqa: E402

from flashtune.apply import ApplyRuntime, ApplyTable, apply, enable_apply  # noqa: E402
from flashtune.apply import table as apply_table  # noqa: E402
from flashtune.apply.runtime import dispatch  # noqa: E402
from flashtune.apply.solutions import clear_broken_solutions  # noqa: E402
from flashtune.apply.table import current_environment  # noqa: E402
from flashtune.data import Dataset  # noqa: E402
from flashtune.data.models import Correctness  # noqa: E402
from flashtune.ops.norm import rmsnorm  # noqa: E402
from flashtune.ops.norm.reference import rmsnorm_ref  # noqa: E402

NAME = "toy_norm_h16"
ZEROS_SRC = """import torch
CALLS = []

def run(hidden_states, weight):
    CALLS.append(tuple(hidden_states.shape))
    return torch.zeros_like(hidden_states)
"""
RAISING_SRC = """CALLS = []

def run(hidden_states, weight):
    CALLS.append(tuple(hidden_states.shape))
    raise ValueError("kernel exploded")
"""


@pytest.fixture(autouse=True)
def _forget_broken_solutions():
    yield
    clear_broken_solutions()


@pytest.fixture
def ds(tmp_path: Path) -> Dataset:
    ds = Dataset(tmp_path / "ds")
    add_definition(ds, toy_norm.definition(torch.randn(2, 16), torch.randn(16)))
    return ds


def here() -> dict:
    """This process's environment as a trace records it."""
    env = current_environment()
    return {**env, "hardware": env["hardware"][0]}


def dispatched(ds: Dataset, solution) -> bool:
    """Whether toy_norm under enable_apply ran `solution` (the result must be right anyway)."""
    x, w = torch.randn(4, 16), torch.rand(16) + 0.5
    n = len(calls_of(solution))
    with enable_apply(dataset=ds):
        y = toy_norm(x, w)
    return len(calls_of(solution)) > n and not torch.allclose(y, toy_norm_ref(x, w))


def reasons(ds: Dataset) -> list[str]:
    return [r.reason for r in ApplyTable.build(ds).rejected]


# --------------------------------------------------------------------------- the hash rule


def test_forged_trace_for_a_zeros_solution_is_not_used(ds: Dataset) -> None:
    zeros = plant(ds, NAME, "zeros", ZEROS_SRC)
    forged = trace(NAME, "zeros", {"batch_size": 4}, 1e-9)
    forged.evaluation.solution_hash = "0" * 32
    add_traces(ds, [forged])
    assert not dispatched(ds, zeros)
    table = ApplyTable.build(ds)
    assert NAME not in table.definitions
    [rejection] = table.rejected
    assert rejection.solution == "zeros" and "solution_hash" in rejection.reason
    assert rejection.trace is not None and rejection.trace.evaluation.performance.latency_ms == 1e-9


def test_trace_without_a_solution_hash_is_not_used(ds: Dataset) -> None:
    zeros = plant(ds, NAME, "zeros", ZEROS_SRC)
    ds.append_trace(trace(NAME, "zeros", {"batch_size": 4}, 1e-9), author="test")  # no hash
    assert not dispatched(ds, zeros)
    assert any("no solution_hash" in r for r in reasons(ds))


def test_solution_edited_after_it_was_benchmarked_is_not_used(ds: Dataset) -> None:
    plant(ds, NAME, "fast", NORM_SRC)
    add_traces(ds, [trace(NAME, "fast", {"batch_size": 4}, 0.1)])  # hash of the honest code
    assert ApplyTable.load(ds).lookup(NAME, {"batch_size": 4}) == "fast"  # saved
    edited = plant(ds, NAME, "fast", ZEROS_SRC)  # same name, other code
    assert not dispatched(ds, edited)
    assert any("solution_hash" in r for r in reasons(ds))


def test_runtime_checks_the_hash_of_a_table_built_before_the_edit(ds: Dataset) -> None:
    plant(ds, NAME, "fast", NORM_SRC)
    add_traces(ds, [trace(NAME, "fast", {"batch_size": 4}, 0.1)])
    table = ApplyTable.build(ds)  # built (or read back) while the code was honest
    edited = plant(ds, NAME, "fast", ZEROS_SRC)
    rt = ApplyRuntime(ds, table=table)
    assert rt.runner(NAME, {"batch_size": 4}) is None
    assert calls_of(edited) == []


def test_saved_table_not_written_by_this_user_is_rebuilt(ds: Dataset) -> None:
    # A dataset could ship its own apply_table.json (stat signature and all) naming a
    # solution no trace supports: it must not skip the checks.
    zeros = plant(ds, NAME, "zeros", ZEROS_SRC)
    plant(ds, NAME, "fast", NORM_SRC)
    add_traces(ds, [trace(NAME, "fast", {"batch_size": 4}, 0.1)])
    ApplyTable.load(ds)
    path = ApplyTable.path_for(ds)
    doc = json.loads(path.read_text())
    doc["definitions"][NAME]["buckets"][0]["solution"] = "zeros"
    doc["definitions"][NAME]["default"] = "zeros"
    doc["definitions"][NAME]["hashes"]["zeros"] = apply_table.solution_hash(zeros)
    path.write_text(json.dumps(doc))
    assert ApplyTable.load(ds).lookup(NAME, {"batch_size": 4}) == "fast"
    doc.pop("signature")
    path.write_text(json.dumps(doc))
    assert ApplyTable.load(ds).lookup(NAME, {"batch_size": 4}) == "fast"
    assert not dispatched(ds, zeros)


# --------------------------------------------------------------------------- environment


@pytest.mark.parametrize(
    ("environment", "ok"),
    [
        ({"hardware": "NVIDIA B200"}, False),
        ({"torch": "1.0.0"}, False),
        ({"triton": "0.1"}, False),
        ({"cuda": "9.0"}, False),
        ({"hardware": "*", "torch": "*", "triton": "*", "cuda": "*"}, True),
        ({}, True),
    ],
)
def test_environment_must_match(ds: Dataset, environment: dict, ok: bool) -> None:
    fast = plant(ds, NAME, "fast", NORM_SRC)
    t = trace(NAME, "fast", {"batch_size": 4}, 0.1)
    t.evaluation.environment = {**here(), **environment}
    add_traces(ds, [t])
    assert (ApplyTable.build(ds).lookup(NAME, {"batch_size": 4}) == "fast") is ok
    n = len(calls_of(fast))
    x, w = torch.randn(4, 16), torch.randn(16)
    with enable_apply(dataset=ds):
        torch.testing.assert_close(toy_norm(x, w), toy_norm_ref(x, w))
    assert (len(calls_of(fast)) > n) is ok


def test_flashinfer_bench_environment_layout_and_missing_fields(ds: Dataset) -> None:
    plant(ds, NAME, "fast", NORM_SRC)
    env = here()
    libs = {"torch": env["torch"], "triton": env["triton"], "cuda": env["cuda"]}
    t = trace(NAME, "fast", {"batch_size": 4}, 0.1)
    t.evaluation.environment = {"hardware": env["hardware"], "libs": libs}
    add_traces(ds, [t])
    assert ApplyTable.build(ds).lookup(NAME, {"batch_size": 4}) == "fast"
    u = trace(NAME, "fast", {"batch_size": 64}, 0.1)
    u.evaluation.environment = {"hardware": env["hardware"]}  # versions unknown
    add_traces(ds, [u])
    assert ApplyTable.build(ds).definitions[NAME].buckets.keys() == {(4,)}
    assert any("no 'torch'" in r for r in reasons(ds))


# --------------------------------------------------------------------------- time


@pytest.mark.parametrize(
    ("offset", "aware", "ok"),
    [
        (timedelta(days=365), True, False),
        (timedelta(minutes=5), True, False),
        (timedelta(seconds=20), True, True),  # clock skew
        (timedelta(days=-1), True, True),
        (timedelta(days=2), False, False),  # no zone: even UTC+14 does not reach it
    ],
)
def test_timestamp_in_the_future_is_not_used(
    ds: Dataset, offset: timedelta, aware: bool, ok: bool
) -> None:
    plant(ds, NAME, "fast", NORM_SRC)
    when = datetime.now(timezone.utc) + offset
    stamp = when.isoformat() if aware else when.replace(tzinfo=None).isoformat()
    add_traces(ds, [trace(NAME, "fast", {"batch_size": 4}, 0.1, timestamp=stamp)])
    assert (ApplyTable.build(ds).lookup(NAME, {"batch_size": 4}) == "fast") is ok
    assert ok or any("in the future" in r for r in reasons(ds))


def test_future_rerun_cannot_shadow_the_latest_failure(ds: Dataset) -> None:
    plant(ds, NAME, "fast", NORM_SRC)
    plant(ds, NAME, "other", NORM_SRC.replace("CALLS = []", "CALLS = [] # other"))
    far = (datetime.now(timezone.utc) + timedelta(days=3650)).isoformat()
    add_traces(
        ds,
        [
            trace(NAME, "fast", {"batch_size": 4}, None, status="RUNTIME_ERROR"),
            trace(NAME, "fast", {"batch_size": 4}, 0.01, timestamp=far),
            trace(NAME, "other", {"batch_size": 4}, 1.0),
        ],
    )
    assert ApplyTable.build(ds).lookup(NAME, {"batch_size": 4}) == "other"


# --------------------------------------------------------------------------- tolerances


@pytest.mark.parametrize(
    ("correctness", "why"),
    [
        ({"max_absolute_error": 0.0, "matched_ratio": 0.5}, "matched_ratio"),
        ({"max_absolute_error": float("nan")}, "max_absolute_error"),
        ({"max_absolute_error": 3.0, "max_relative_error": 2.0}, "exceeds"),
    ],
)
def test_passed_trace_outside_the_definition_tolerances_counts_as_failed(
    ds: Dataset, correctness: dict, why: str
) -> None:
    plant(ds, NAME, "bad", ZEROS_SRC)
    plant(ds, NAME, "good", NORM_SRC)
    t = trace(NAME, "bad", {"batch_size": 4}, 1e-6)
    t.evaluation.correctness = Correctness(**correctness)
    add_traces(ds, [t, trace(NAME, "good", {"batch_size": 4}, 1.0)])
    table = ApplyTable.build(ds)
    assert table.lookup(NAME, {"batch_size": 4}) == "good"
    assert any(r.solution == "bad" and why in r.reason for r in table.rejected)


@pytest.mark.parametrize(
    ("bounds", "figures", "ok"),
    [
        ({}, {"rel_norm_error": 0.5}, True),  # tolerances without these bounds
        ({"max_rel_norm": 1e-2}, {"rel_norm_error": 1e-3}, True),
        ({"max_rel_norm": 1e-2}, {"rel_norm_error": 0.5}, False),
        ({"max_abs": 1e-2}, {"max_absolute_error": 0.5, "max_relative_error": 0.0}, False),
    ],
)
def test_norm_and_max_error_bounds_are_checked_where_the_tolerance_has_them(
    ds: Dataset, monkeypatch, bounds: dict, figures: dict, ok: bool
) -> None:
    plant(ds, NAME, "fast", NORM_SRC)
    t = trace(NAME, "fast", {"batch_size": 4}, 0.1)
    for name, value in figures.items():  # rel_norm_error: an extra field of newer benches
        setattr(t.evaluation.correctness, name, value)
    add_traces(ds, [t])

    def tolerance(definition, dtype, atol=None, rtol=None):
        return SimpleNamespace(atol=1.0, rtol=1.0, matched_ratio=1.0, **bounds)

    monkeypatch.setattr(apply_table, "tolerance_for", tolerance)
    table = ApplyTable.build(ds)
    assert (table.lookup(NAME, {"batch_size": 4}) == "fast") is ok
    assert ok or any(r.solution == "fast" for r in table.rejected)


def test_apply_show_lists_the_rejected_traces(ds: Dataset) -> None:
    from typer.testing import CliRunner

    from flashtune.cli import app

    plant(ds, NAME, "zeros", ZEROS_SRC)
    forged = trace(NAME, "zeros", {"batch_size": 4}, 1e-9)
    forged.evaluation.solution_hash = "f" * 32
    add_traces(ds, [forged])
    result = CliRunner().invoke(
        app, ["apply", "show", "--dataset", str(ds.root)], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 0, result.output
    assert "zeros" in result.output and "solution_hash" in result.output


# --------------------------------------------------------------------------- failing solutions


def test_solution_raising_at_call_time_falls_back_warns_once_and_is_dropped(
    tmp_path: Path,
) -> None:
    ds = Dataset(tmp_path / "ds")
    x, w = torch.randn(4, 16), torch.rand(16) + 0.5
    add_definition(ds, rmsnorm.definition(x, w))
    raising = plant(ds, "rmsnorm_h16", "raising", RAISING_SRC)
    add_traces(ds, [trace("rmsnorm_h16", "raising", {"batch_size": 4}, 0.1)])
    calls_of(raising).clear()  # the loaded module (and its CALLS) is shared by content
    with enable_apply(dataset=ds) as handle:
        with pytest.warns(RuntimeWarning, match="'raising'.*kernel exploded"):
            torch.testing.assert_close(rmsnorm(x, w), rmsnorm_ref(x, w))
        assert calls_of(raising) == [(4, 16)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no second warning
            for _ in range(3):
                torch.testing.assert_close(rmsnorm(x, w), rmsnorm_ref(x, w))
            y = rmsnorm(x.view(2, 2, 16), w)  # another signature: not dispatched either
            torch.testing.assert_close(y, rmsnorm_ref(x, w).view(2, 2, 16))
        assert calls_of(raising) == [(4, 16)]  # never called again
        assert handle.hook.hits == 0
    # a new runtime of the same dataset (enable_apply again) does not use it either
    with enable_apply(dataset=ds):
        rmsnorm(x, w)
    assert calls_of(raising) == [(4, 16)]


def test_raising_solution_through_apply_and_the_adapters(ds: Dataset) -> None:
    raising = plant(ds, NAME, "raising", RAISING_SRC)
    add_traces(ds, [trace(NAME, "raising", {"batch_size": 4}, 0.1)])
    calls_of(raising).clear()
    x, w = torch.randn(4, 16), torch.randn(16)

    @apply(NAME, dataset=ds.root)
    def my_norm(hidden_states, weight):
        return toy_norm_ref(hidden_states, weight)

    with pytest.warns(RuntimeWarning, match="kernel exploded"):
        torch.testing.assert_close(my_norm(x, w), toy_norm_ref(x, w))
    torch.testing.assert_close(my_norm(x, w), toy_norm_ref(x, w))
    assert len(calls_of(raising)) == 1
    # without a fallback the failure is the caller's to see
    with pytest.raises(LookupError):
        apply(NAME, {"hidden_states": x, "weight": w}, dataset=ds.root)
    # adapters (flashinfer.rmsnorm and friends) get None: "run the original"
    clear_broken_solutions()
    rt = ApplyRuntime(ds)
    with pytest.warns(RuntimeWarning, match="kernel exploded"):
        assert dispatch(NAME, {"hidden_states": x, "weight": w}, runtime=rt) is None
    assert dispatch(NAME, {"hidden_states": x, "weight": w}, runtime=rt) is None
    assert len(calls_of(raising)) == 2


# --------------------------------------------------------------------------- file modes


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=oct)
def test_files_apply_writes_follow_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask: int
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(cache))
    ds = Dataset(tmp_path / "ds")
    add_definition(ds, toy_norm.definition(torch.randn(2, 16), torch.randn(16)))
    src = NORM_SRC.replace("CALLS = []", f"CALLS = []  # umask {umask:o}")  # fresh sources
    plant(ds, NAME, "fast", src)
    add_traces(ds, [trace(NAME, "fast", {"batch_size": 4}, 0.1)])
    old = os.umask(umask)
    try:
        with enable_apply(dataset=ds) as handle:
            toy_norm(torch.randn(4, 16), torch.randn(16))
    finally:
        os.umask(old)
    assert handle.hook.hits == 1
    written = [ApplyTable.path_for(ds), *(cache / "apply" / "solutions").rglob("*.py")]
    assert len(written) == 2
    for p in written:
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask, p
    # the keys that sign saved tables and traces are secrets: private whatever the umask
    for key in ("table", "traces"):
        assert (cache / "keys" / f"{key}.key").stat().st_mode & 0o777 == 0o600
    assert (cache / "keys").stat().st_mode & 0o777 == 0o700

"""A newcomer's first run: the README's install commands, progress without a terminal, output
for programs (--json/--csv), the quick default and --fail-on."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flashtune.bench.progress import RunProgress, format_seconds
from flashtune.bench.runner import (
    CPU_WORKLOAD_CAP,
    GPU_WORKLOAD_CAP,
    RunOptions,
    workload_cap,
)
from flashtune.cli import app
from flashtune.cli.output import plain
from flashtune.cli.run_checks import FAIL_ON, failing_triples
from flashtune.data.models import (
    Correctness,
    Evaluation,
    EvaluationStatus,
    Performance,
    Trace,
    Workload,
)

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _check_install():
    spec = importlib.util.spec_from_file_location(
        "check_install", ROOT / "scripts/check_install.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_install"] = module
    spec.loader.exec_module(module)
    return module


# -- install ---------------------------------------------------------------------------


def test_ci_runs_the_readme_test_command_and_the_install_proof():
    check = _check_install()
    commands = check.readme_commands((ROOT / "README.md").read_text())
    assert set(commands) == {1, 2}
    ci = (ROOT / ".ci/run").read_text().splitlines()
    assert commands[2] in ci, "`.ci/run` must run README command 2 exactly"
    assert "python scripts/check_install.py" in ci


def test_install_commands_are_taken_apart_as_pip_would_run_them():
    check = _check_install()
    commands = check.readme_commands((ROOT / "README.md").read_text())
    steps = check.pip_installs(commands[2])
    # Two installs: the project with its extras under the constraints, FlashInfer-Bench's data
    # layer without its GPU dependencies.
    assert steps[0][-2:] == ["-e", ".[test,ray]"] and "-c" in steps[0]
    assert "--no-deps" in steps[1] and "flashinfer-bench" in steps[1]
    assert check.pip_installs("ruff check . && pytest -q") == []


def test_plain_pypi_env_drops_every_pip_setting(monkeypatch):
    check = _check_install()
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///somewhere")
    env = check.plain_pypi_env()
    assert "PIP_FIND_LINKS" not in env and "PIP_EXTRA_INDEX_URL" not in env
    assert env["PIP_CONFIG_FILE"] == __import__("os").devnull


def test_constraints_pin_a_torch_triton_pair_pypi_can_satisfy():
    """PyPI's torch 2.12/2.13 require Triton 3.7.x: a Triton 3.6 pin must admit torch 2.11."""
    lines = [
        line.split("#")[0].strip() for line in (ROOT / "constraints.txt").read_text().splitlines()
    ]
    pins = {line.split("=")[0].split("<")[0].split(">")[0]: line for line in lines if line}
    assert pins["triton"] == "triton==3.6.0"
    from packaging.specifiers import SpecifierSet

    torch_range = SpecifierSet(pins["torch"][len("torch") :])
    assert "2.11.0" in torch_range  # the PyPI release that requires triton==3.6.0
    assert "2.13.0+cpu" in torch_range  # CI's local CPU build is kept


# -- progress without a terminal ---------------------------------------------------------


class _Piped:
    is_terminal = False


def _trace(definition: str, status: EvaluationStatus, solution: str = "s") -> Trace:
    return Trace(
        definition=definition,
        workload=Workload(uuid=f"w-{solution}", axes={"M": 1}),
        solution=solution,
        evaluation=Evaluation(
            status=status,
            environment={"hardware": "cpu"},
            timestamp="2026-11-27T00:00:00+00:00",
            reason=None if status is EvaluationStatus.PASSED else "why",
            correctness=Correctness(max_absolute_error=0.0, max_relative_error=0.0)
            if status in (EvaluationStatus.PASSED, EvaluationStatus.INCORRECT_NUMERICAL)
            else None,
            performance=Performance(latency_ms=1.0, reference_latency_ms=1.0, speedup_factor=1.0)
            if status is EvaluationStatus.PASSED
            else None,
        ),
    )


def test_piped_progress_prints_a_line_per_finished_definition_with_counts_and_eta():
    stream = io.StringIO()
    display = RunProgress(0, _Piped(), enabled=True, stream=stream, heartbeat_s=3600)
    display.say("starting the workers")
    display.expect(3, {"a": 2, "b": 1})
    with display:
        display.working_on("cpu", "a")
        display.finished(_trace("a", EvaluationStatus.PASSED, "x"))
        assert "[1/2]" not in stream.getvalue()  # "a" has one triple to go
        display.finished(_trace("a", EvaluationStatus.TIMEOUT, "y"))
        display.finished(_trace("b", EvaluationStatus.SKIPPED))
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("starting the workers")
    assert "3 triples of 2 definitions to evaluate" in lines[1]
    assert "[1/2] a: 1 passed, 1 timeout; 2/3 triples, eta" in lines[2]
    assert "1 not passed" in lines[2]
    assert "[2/2] b: 1 skipped; 3/3 triples" in lines[3]


def test_piped_progress_beats_while_nothing_finishes():
    stream = io.StringIO()
    display = RunProgress(0, _Piped(), enabled=True, stream=stream, heartbeat_s=0.05)
    display.expect(1, {"slow_definition": 1})
    with display:
        display.working_on("cpu", "slow_definition")
        deadline = __import__("time").monotonic() + 30
        while "running slow_definition" not in stream.getvalue():
            assert __import__("time").monotonic() < deadline, stream.getvalue()
            __import__("time").sleep(0.05)
    assert "0/1 triples" in stream.getvalue()


def test_quiet_and_terminal_progress_print_no_lines():
    stream = io.StringIO()
    with RunProgress(1, _Piped(), enabled=False, stream=stream) as display:
        display.finished(_trace("a", EvaluationStatus.PASSED))
    assert stream.getvalue() == ""


def test_format_seconds():
    assert [format_seconds(s) for s in (4.2, 185, 3720)] == ["4 s", "3m05s", "1h02m"]


# -- output for programs -----------------------------------------------------------------


def test_list_json_and_csv_carry_the_same_rows():
    as_json = runner.invoke(app, ["list", "definitions", "--name", "gemm_*", "--json"])
    assert as_json.exit_code == 0, as_json.output
    rows = json.loads(as_json.stdout)
    assert rows and all(r["op_type"] == "gemm" and "M" in r["var_axes"] for r in rows)
    as_csv = runner.invoke(app, ["list", "definitions", "--name", "gemm_*", "--csv"])
    records = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [r["name"] for r in records] == [r["name"] for r in rows]
    assert json.loads(records[0]["const_axes"]) == rows[0]["const_axes"]
    both = runner.invoke(app, ["list", "definitions", "--json", "--csv"])
    assert both.exit_code == 2


def test_piped_tables_cut_no_name():
    """Piped, a table is as wide as its longest cell: names can be pasted into --definitions."""
    out = runner.invoke(app, ["list", "definitions", "--name", "block_sparse*"])
    assert out.exit_code == 0
    assert "…" not in out.stdout
    assert "block_sparse_attention_h32_kv8_d128_r64_c64" in out.stdout


def test_plain_turns_report_rows_into_json_data():
    from collections import Counter

    from flashtune.report.tables import SolutionSummary

    row = SolutionSummary("d", "s", total=2, statuses=Counter({EvaluationStatus.PASSED: 2}))
    data = plain(row)
    assert data["statuses"] == {"PASSED": 2}
    assert json.loads(json.dumps(data))["solution"] == "s"
    assert plain(float("nan")) is None


# -- the quick default, --all, --fail-on ---------------------------------------------------


def test_quick_default_caps_workloads_and_all_lifts_the_cap(tmp_path):
    opts = RunOptions(datasets=[], out=tmp_path)
    assert workload_cap(opts, cpu_only=True) == (CPU_WORKLOAD_CAP, False)
    assert workload_cap(opts, cpu_only=False) == (GPU_WORKLOAD_CAP, True)
    assert workload_cap(RunOptions([], tmp_path, all_workloads=True), False) == (None, False)
    assert workload_cap(RunOptions([], tmp_path, max_workloads=5), False) == (5, False)


def test_gpu_quick_run_spreads_over_the_sizes():
    from flashtune.bench import runner as runner_module

    spread = runner_module._spread
    items = list(range(10))
    assert spread(items, 3) == [0, 4, 9] or spread(items, 3) == [0, 5, 9]
    assert spread(items[:2], 3) == [0, 1]
    assert spread(items, 1) == [0]


@pytest.mark.parametrize(
    ("fail_on", "fails"),
    [("none", False), ("incorrect", True), ("failed", True), ("any", True)],
)
def test_fail_on_counts_the_statuses_it_names(fail_on, fails):
    traces = [
        _trace("d", EvaluationStatus.PASSED, "good"),
        _trace("d", EvaluationStatus.INCORRECT_NUMERICAL, "wrong"),
    ]
    message = failing_triples(traces, fail_on)
    assert bool(message) is fails
    if fails:
        assert "1 of 2 triples: 1 incorrect_numerical (d wrong)" in message


def test_fail_on_levels_nest():
    assert set(FAIL_ON["incorrect"]) < set(FAIL_ON["failed"]) < set(FAIL_ON["any"])
    skipped_only = [_trace("d", EvaluationStatus.SKIPPED)]
    assert failing_triples(skipped_only, "failed") == ""
    assert failing_triples(skipped_only, "any")
    timeout = [_trace("d", EvaluationStatus.TIMEOUT)]
    assert failing_triples(timeout, "incorrect") == "" and failing_triples(timeout, "failed")


def test_fail_on_rejects_an_unknown_level():
    out = runner.invoke(app, ["run", "--fail-on", "sometimes"])
    assert out.exit_code == 2
    assert "--fail-on sometimes" in out.output


@pytest.mark.slow
def test_a_piped_run_shows_progress_before_it_ends_and_fail_on_fails_it(tmp_path):
    """`flashtune run | tee log`: lines arrive on stderr while the run works, the table on
    stdout is whole, and --fail-on any fails the run (FlashInfer is SKIPPED on a CPU)."""
    import subprocess

    cmd = [sys.executable, "-m", "flashtune.cli", "run", "--definitions", "rmsnorm_h4096"]
    cmd += ["--max-workloads", "1", "--fail-on", "any", "-o", str(tmp_path / "out")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert proc.poll() is None, "the first progress line came only at the end"
    assert first.startswith("flashtune run [") and "starting the workers" in first
    stdout, rest = proc.communicate(timeout=600)
    lines = [first, *rest.splitlines()]
    assert any("triples of 1 definition to evaluate" in line for line in lines), rest
    assert any("[1/1] rmsnorm_h4096:" in line for line in lines), rest
    assert proc.returncode == 1, rest
    assert "--fail-on any" in rest and "skipped" in rest
    assert "flashinfer@rmsnorm_h4096" in stdout  # the closing table, on stdout
    assert "Traceback" not in rest


def test_fail_on_any_does_not_count_a_solution_checked_correct_but_not_timed():
    """A Triton kernel checked in the CPU's interpreter is SKIPPED with a correctness: it
    failed nothing."""
    untimed = _trace("d", EvaluationStatus.SKIPPED, "flashtune@d")
    assert untimed.evaluation is not None
    untimed.evaluation.correctness = Correctness(max_absolute_error=0.0, max_relative_error=0.0)
    assert failing_triples([untimed], "any") == ""
    assert failing_triples([untimed, _trace("d", EvaluationStatus.SKIPPED, "fi@d")], "any")

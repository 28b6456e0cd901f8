"""The agent tools' plumbing on the CPU, with stand-ins for compute-sanitizer and ncu: small
scripts that take the real command line, run (or not) the target the way the tool would, and
print what the tool prints in the documented format (as in test_tool_parsers.py). What is
checked: the command the functions build, the probe running under it, and the verdict they
draw from each kind of answer. The real tools run in test_tools_cuda.py."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from _serve_helpers import HONEST, solution, tool_target

from flashtune.bench import nsight, sanitizer

# Runs the target (everything from the Python interpreter on), passing its output through,
# and writes a summary to its --log-file as the tool would; FAKE_TOOL_MODE picks the answer.
FAKE_TOOL = """#!{python}
import os, subprocess, sys
args = sys.argv[1:]
target = args[args.index("-m") - 1 :]
mode = os.environ.get("FAKE_TOOL_MODE", "clean")
log = os.environ.get("FAKE_TOOL_LOG")
if log:
    with open(log, "a") as f:
        f.write(" ".join(args[: args.index("-m") - 1]) + "\\n")
    with open(log + ".namespaces", "a") as f:
        f.write(os.readlink("/proc/self/ns/net") + "\\n")
out = open(args[args.index("--log-file") + 1], "w")
def say(line):
    out.write(line + "\\n")
    out.flush()
say("========= COMPUTE-SANITIZER")
if mode == "broken":
    say("========= Error: Failed to connect to the target application on port 49152")
    sys.exit(1)
done = subprocess.run(target, capture_output=True, text=True)
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
if mode == "oob":
    say("========= Invalid __global__ read of size 4 bytes")
    say("=========     at 0x1b0 in /tmp/main.py:9:_planted_kernel")
    say("=========     by thread (0,0,0) in block (0,0,0)")
    say("=========     Address 0x7f00 is out of bounds")
    say("=========")
    say("========= ERROR SUMMARY: 1 error")
    sys.exit(86)
say("========= ERROR SUMMARY: 0 errors")
sys.exit(done.returncode)
"""


@pytest.fixture
def fake_tool(tmp_path: Path) -> Path:
    path = tmp_path / "fake-compute-sanitizer"
    path.write_text(FAKE_TOOL.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The CPU stands in for the GPU here: the functions refuse a CPU device otherwise.
    monkeypatch.setattr(sanitizer, "unavailable_reason", lambda device, executable: None)
    return tool_target(tmp_path / "dataset")


@pytest.mark.slow  # processes for seconds (the main suite stays under 10 minutes)
def test_sanitize_runs_the_probe_under_the_tool_and_passes_a_clean_run(
    target, fake_tool: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    definition, workload, dataset = target
    log = tmp_path / "commands"
    monkeypatch.setenv("FAKE_TOOL_LOG", str(log))
    result = sanitizer.sanitize(
        definition,
        workload,
        solution("agent-clean", HONEST),
        "cpu",
        [str(dataset)],
        ["memcheck", "initcheck"],
        executable=str(fake_tool),
    )
    assert result.verdict == "pass", result.to_json()
    assert result.sandbox  # the probe said how it was isolated
    commands = log.read_text().splitlines()
    assert commands[0].endswith(
        "--tool memcheck --target-processes all --error-exitcode 86 --print-limit 100 "
        "--leak-check no"
    )
    assert "--tool initcheck" in commands[1] and "--leak-check" not in commands[1]


def test_sanitize_verdicts_for_a_finding_and_a_broken_tool(
    target, fake_tool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    definition, workload, dataset = target
    monkeypatch.setenv("FAKE_TOOL_MODE", "oob")
    found = sanitizer.sanitize(
        definition,
        workload,
        solution("agent-oob", HONEST),
        "cpu",
        [str(dataset)],
        ["memcheck"],
        executable=str(fake_tool),
    )
    assert found.verdict == "fail"
    assert found.reason() == (
        "compute-sanitizer fail: memcheck: Invalid __global__ read of size 4 bytes in "
        "_planted_kernel"
    )
    monkeypatch.setenv("FAKE_TOOL_MODE", "broken")
    broken = sanitizer.sanitize(
        definition,
        workload,
        solution("agent-x", HONEST),
        "cpu",
        [str(dataset)],
        ["memcheck"],
        executable=str(fake_tool),
    )
    assert broken.verdict == "error"
    assert "Failed to connect" in broken.detail and "exit 1" in broken.detail


def test_ncu_summary_runs_the_probe_under_the_tool(
    target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    definition, workload, dataset = target
    fake = tmp_path / "fake-ncu"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import subprocess, sys\n"
        "args = sys.argv[1:]\n"
        "assert args[args.index('--page') + 1] == 'details' and '--csv' in args\n"
        "done = subprocess.run(args[args.index('-m') - 1 :], capture_output=True, text=True)\n"
        "sys.stdout.write(done.stdout)\n"
        "log = open(args[args.index('--log-file') + 1], 'w')\n"
        'log.write(\'"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\\n\')\n'
        'log.write(\'"0","_k","gpu__time_duration.sum","usecond","4"\\n\')\n'
        'log.write(\'"0","_k","dram__bytes.sum","Mbyte","8"\\n\')\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(nsight, "unavailable_reason", lambda device, executable: None)
    result = nsight.ncu_summary(
        definition,
        workload,
        solution("agent-ncu", HONEST),
        "cpu",
        [str(dataset)],
        executable=str(fake),
    )
    assert result.status == "ok", result.to_json()
    assert result.sandbox and result.detail == "_k: 4.0 us, 2.000 TB/s"
    assert [k.kernel for k in result.kernels] == ["_k"]
    assert result.kernels[0].bandwidth == pytest.approx(8e6 / 4e-6)

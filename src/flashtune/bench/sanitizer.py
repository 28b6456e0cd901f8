"""compute-sanitizer on a candidate: memcheck, racecheck, initcheck, and a verdict a gate uses.

`sanitize(...)` runs one sandboxed call of the solution (`python -m flashtune.bench.probe`)
under ``compute-sanitizer --tool <tool> --target-processes all``, once per tool, and parses
what the tool prints (`parse_sanitizer_output`, pure Python: tested on the CPU with sample
outputs written from the format NVIDIA's Compute Sanitizer documentation shows). The verdict:

- "fail": a tool reported an error (an out-of-bounds or misaligned access, a race, a read
  of uninitialized device memory, a CUDA API error);
- "pass": every tool ran to its summary with 0 errors and the calls returned;
- "unavailable": no compute-sanitizer, or no GPU to run it on. Never a pass: a gate that
  needs the check must treat it as not passed (`flashtune run --sanitize` refuses to start);
- "error": a tool ran but gave no summary, or the solution failed without a finding (its
  error is in `detail`).

`flashtune run --sanitize` runs memcheck this way on every (solution, workload) before it is
timed, and records a solution that fails as RUNTIME_ERROR with the findings as its reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from flashtune.bench import tool_sandbox
from flashtune.bench.probe import (
    find_cuda_tool,
    parse_probe_line,
    probe_command,
    tool_unavailable_reason,
    write_job,
)
from flashtune.data.models import Definition, Solution, Workload

__all__ = [
    "SANITIZER_TOOLS",
    "SanitizerFinding",
    "SanitizerReport",
    "SanitizeResult",
    "Verdict",
    "find_compute_sanitizer",
    "parse_sanitizer_output",
    "judge_tool_run",
    "combine_verdicts",
    "sanitize",
    "unavailable_reason",
]

SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck")
Verdict = Literal["pass", "fail", "unavailable", "error"]
_PREFIX = "========="
# A tool's exit code when it found errors (--error-exitcode): not the target's own codes.
_ERROR_EXIT = 86

# The lines that open a finding (the tools' documented wording; "Invalid __global__ read of
# size 4 bytes", "Uninitialized __global__ memory read of size 4 bytes", "Error: Race
# reported between Write access at ... and Read access at ...", "Program hit
# cudaErrorIllegalAddress (error 700) due to ... on CUDA API call to cudaMemcpy.").
_OPENERS = (
    ("out_of_bounds", re.compile(r"^Invalid (?P<space>__\w+__|\w+) (?P<op>read|write|atomic)")),
    ("misaligned", re.compile(r"^(?P<space>__\w+__|\w+) (?:\w+ )?misaligned")),
    ("uninitialized", re.compile(r"^Uninitialized (?P<space>__\w+__|\w+) memory read")),
    ("race", re.compile(r"^(?:Error|Warning): Race reported between (?P<first>\w+) access")),
    ("hazard", re.compile(r"^(?:ERROR|WARNING): Potential (?P<kind>\w+) hazard")),
    ("api_error", re.compile(r"^Program hit (?P<code>\w+)")),
    ("leak", re.compile(r"^Leaked \d+ bytes")),
    ("launch_error", re.compile(r"^(?:Unspecified|Out-of-range|Misaligned|Invalid) .*")),
)
_SIZE = re.compile(r"of size (?P<size>\d+) bytes?")
_AT = re.compile(r"^at (?P<where>.+?)(?: in (?P<file>\S.*))?$")
_ERROR_SUMMARY = re.compile(r"^ERROR SUMMARY: (?P<n>\d+) errors?")
_RACE_SUMMARY = re.compile(
    r"^RACECHECK SUMMARY: (?P<hazards>\d+) hazards? displayed \((?P<errors>\d+) errors?, "
    r"(?P<warnings>\d+) warnings?\)"
)


@dataclass
class SanitizerFinding:
    kind: str  # out_of_bounds, misaligned, uninitialized, race, hazard, api_error, leak, ...
    message: str  # the tool's first line of it
    kernel: str | None = None  # the function the first `at` line names
    size: int | None = None  # bytes accessed, where the tool says


@dataclass
class SanitizerReport:
    """What one compute-sanitizer tool printed, parsed."""

    tool: str
    findings: list[SanitizerFinding] = field(default_factory=list)
    errors: int | None = None  # the summary's count; None: no summary line (the tool broke)
    warnings: int = 0

    @property
    def verdict(self) -> Verdict:
        if self.errors is None:
            return "fail" if self.findings else "error"
        return "fail" if self.errors > 0 or self.findings_are_errors() else "pass"

    def findings_are_errors(self) -> bool:
        # racecheck's warnings are findings too, but its summary counts them apart: a gate
        # fails on errors only. The other tools count every finding as an error.
        if self.tool == "racecheck":
            return False
        return bool(self.findings)


_FILE_LINE_NAME = re.compile(r"^(?P<path>.*?):(?P<line>\d+):(?P<name>.+)$")
_RACE_IN = re.compile(r" in (?P<k>[^\[]+?)(?: \[\d+ hazards?\])?$")
# The lines that go on describing the finding above them.
_DETAILS = ("by thread", "Address", "and ", "Saved", "Host Frame", "in ", "Device Frame")


def _kernel_of(where: str, file: str | None) -> str | None:
    """The function an `at` line names: 'kernel(float *)+0x70' (older releases, the name
    first) or '0x70 in /x.cu:7:kernel(int *)' (newer: the name after the file and line)."""
    where = where.strip()
    if where.startswith("0x"):
        named = _FILE_LINE_NAME.match(file or "")
        if named:
            return named["name"].strip()
        # No line information (a Triton kernel without -lineinfo): "at 0x1b0 in _kernel".
        return file.strip() if file and "/" not in file and ":" not in file else None
    return re.sub(r"\+0x[0-9a-fA-F]+$", "", where) or None


def parse_sanitizer_output(
    text: str, tool: str = "memcheck", log_file: bool = False
) -> SanitizerReport:
    """Parse compute-sanitizer's text output (every line of the tool starts with
    "========="; the target's own lines are ignored). `log_file`: `text` is the tool's
    --log-file, where every line is the tool's (with or without the prefix)."""
    report = SanitizerReport(tool=tool)
    current: SanitizerFinding | None = None
    for raw in text.splitlines():
        if not raw.startswith(_PREFIX) and not log_file:
            continue
        line = (raw[len(_PREFIX) :] if raw.startswith(_PREFIX) else raw).strip()
        if not line or line == "COMPUTE-SANITIZER":
            current = None
            continue
        summary = _ERROR_SUMMARY.match(line)
        race = _RACE_SUMMARY.match(line)
        if summary or race:
            if summary:
                report.errors = int(summary["n"])
            elif race:
                report.errors = int(race["errors"])
                report.warnings = int(race["warnings"])
            current = None
            continue
        if current is not None:
            at = _AT.match(line)
            if at and current.kernel is None:
                current.kernel = _kernel_of(at["where"], at["file"])
            elif "is misaligned" in line:  # "Address 0x... is misaligned"
                current.kind = "misaligned"
            if at or line.startswith(_DETAILS):
                continue
            current = None  # something else: maybe the next finding
        for kind, pattern in _OPENERS:
            if pattern.match(line):
                size = _SIZE.search(line)
                race_at = _RACE_IN.search(line) if kind == "race" else None
                current = SanitizerFinding(
                    kind=kind,
                    message=line,
                    kernel=race_at["k"].strip() if race_at else None,
                    size=int(size["size"]) if size else None,
                )
                report.findings.append(current)
                break
    return report


def judge_tool_run(
    tool: str, log: str | None, stdout: str, stderr: str, returncode: int
) -> tuple[SanitizerReport, Verdict, str, dict[str, Any] | None]:
    """One tool's run -> (its report, verdict, detail or "", the probe's line).

    The findings and the summary come from `log` only: the tool's --log-file, which the
    front-end writes into a folder the sandboxed probe cannot write (None: no file). The
    probe's stdout and stderr are the solution's too, so a "========= ERROR SUMMARY: 0
    errors" printed there counts for nothing; only the probe's status line is read there."""
    report = parse_sanitizer_output(log or "", tool, log_file=True)
    probe = parse_probe_line(stdout)
    verdict = report.verdict
    detail = ""
    if verdict == "error":
        # No summary: the tool itself failed (it could not start or reach its target).
        # Its last words say which: its log first, else what it printed.
        said = [line for line in (log or "").splitlines() if line.strip()][-4:]
        if not said:
            said = [ln for ln in stderr.splitlines() if ln.startswith(("=====", "=="))][-4:]
        text = " | ".join(said) or (stderr.strip() or stdout.strip())[-300:]
        if log is None:
            text = f"no log file; {text}"
        detail = f"{tool}: no summary (exit {returncode}): {text}"
    elif verdict == "pass" and (probe is None or not probe.get("ok")):
        # The tool saw nothing, but the calls did not complete: not a pass.
        verdict = "error"
        error = probe.get("error") if probe else (stdout + stderr)[-500:]
        detail = f"{tool}: the solution failed: {error}"
    return report, verdict, detail, probe


def combine_verdicts(verdicts: Sequence[Verdict]) -> Verdict:
    """The gate's one word: fail over error over unavailable over pass."""
    for word in ("fail", "error", "unavailable"):
        if word in verdicts:
            return word
    return "pass" if verdicts else "unavailable"


def find_compute_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else in CUDA_HOME/CUDA_PATH's bin, else /usr/local/cuda's."""
    return find_cuda_tool("compute-sanitizer")


def unavailable_reason(device: str, executable: str | None) -> str | None:
    """Why the sanitizer cannot run here (None: it can)."""
    return tool_unavailable_reason(
        device,
        executable,
        "compute-sanitizer checks GPU kernels",
        "compute-sanitizer is not installed (not on PATH, nor in CUDA_HOME/bin)",
    )


@dataclass
class SanitizeResult:
    """The gate's answer for one (solution, workload)."""

    verdict: Verdict
    solution: str
    definition: str
    workload: str | None
    reports: list[SanitizerReport] = field(default_factory=list)
    detail: str = ""  # why unavailable / error, or the findings in a line
    sandbox: str | None = None  # the probe's sandbox, as isolation.describe says it

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for report, raw in zip(self.reports, out["reports"], strict=True):
            raw["verdict"] = report.verdict
        return out

    def reason(self) -> str:
        """One line for a trace's log: the first findings."""
        found = [
            f"{r.tool}: {f.message}" + (f" in {f.kernel}" if f.kernel else "")
            for r in self.reports
            for f in r.findings
        ]
        head = "; ".join(found[:3]) + (f" (and {len(found) - 3} more)" if len(found) > 3 else "")
        return f"compute-sanitizer {self.verdict}: {head or self.detail}"


def sanitize(
    definition: Definition,
    workload: Workload,
    solution: Solution,
    device: str,
    roots: Sequence[str | Path] = (),
    tools: Sequence[str] = SANITIZER_TOOLS,
    timeout: float = 600.0,
    executable: str | None = None,
) -> SanitizeResult:
    """Run each of `tools` on one sandboxed call of `solution` at `workload` on `device`."""
    for tool in tools:
        if tool not in SANITIZER_TOOLS:
            raise ValueError(f"unknown compute-sanitizer tool {tool!r}: expected {SANITIZER_TOOLS}")
    executable = executable or find_compute_sanitizer()
    result = SanitizeResult("unavailable", solution.name, definition.name, workload.uuid)
    why = unavailable_reason(device, executable)
    if why is not None:
        result.detail = why
        return result
    assert executable is not None  # unavailable_reason said so
    verdicts: list[Verdict] = []
    details: list[str] = []
    # torch's caching allocator hands out pieces of large segments: an access past a
    # tensor's end but inside its segment is invisible to memcheck, which knows only the
    # driver's allocations. Without caching, every tensor is an allocation of its own.
    environment = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    launches: list[str] = []
    with tempfile.TemporaryDirectory(prefix="flashtune-sanitize-") as folder:
        job = write_job(
            Path(folder), definition, workload, solution, device, [str(r) for r in roots]
        )
        # The tool's log and the launcher's status: beside the probe's scratch, not in it
        # (Landlock: the probe writes only its scratch).
        logs = Path(folder) / "tool"
        logs.mkdir(mode=0o700)
        for tool in tools:
            log, status = logs / f"{tool}.log", logs / f"{tool}-launch.json"
            command = [
                executable,
                "--log-file",
                str(log),
                "--tool",
                tool,
                "--target-processes",
                "all",
                "--error-exitcode",
                str(_ERROR_EXIT),
                "--print-limit",
                "100",
                *(["--leak-check", "no"] if tool == "memcheck" else []),
                *probe_command(job),
            ]
            try:
                done = subprocess.run(
                    tool_sandbox.command(command, job.parent / "scratch", status),
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    check=False,
                    env=environment,
                )
            except subprocess.TimeoutExpired:
                verdicts.append("error")
                details.append(f"{tool}: no answer within {timeout:g} s")
                launches.append(tool_sandbox.describe_status(tool_sandbox.read_status(status)))
                continue
            text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else None
            report, verdict, detail, probe = judge_tool_run(
                tool, text, done.stdout, done.stderr, done.returncode
            )
            result.reports.append(report)
            if probe is not None:
                result.sandbox = probe.get("sandbox") or result.sandbox
            launches.append(tool_sandbox.describe_status(tool_sandbox.read_status(status)))
            if detail:
                details.append(detail)
            verdicts.append(verdict)
    if launches:
        result.sandbox = "; ".join([result.sandbox or "sandbox: unknown", *sorted(set(launches))])
    result.verdict = combine_verdicts(verdicts)
    result.detail = "; ".join(details)
    if not result.detail and result.verdict == "fail":
        result.detail = result.reason()
    return result

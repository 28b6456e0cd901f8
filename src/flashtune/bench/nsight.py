"""An Nsight Compute (`ncu`) summary of a candidate's kernels: time, achieved DRAM bandwidth
and FLOP/s, each against the device's peak.

`ncu_summary(...)` profiles one sandboxed call of the solution (`python -m
flashtune.bench.probe`) with ``ncu --csv --page details --print-units base --metrics ...``
and `parse_ncu_csv` (pure Python; tested on the CPU with sample outputs written from the
CSV layout of NVIDIA's Nsight Compute CLI documentation) turns its rows into one
`KernelSummary` per profiled kernel launch. The metrics are those of ncu's own roofline
section (SpeedOfLight_RooflineChart):

- time: gpu__time_duration.sum;
- bandwidth: dram__bytes.sum / time, against dram__bytes.sum.peak_sustained x
  dram__cycles_elapsed.avg.per_second;
- FLOP/s: FADD + FMUL + 2 FFMA executed by threads (fp32, fp16 and fp64 counters) / time,
  against 2 x sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained x
  sm__cycles_elapsed.avg.per_second (fp32 FMA peak). Tensor-core (MMA) work is not in these
  counters: a GEMM on tensor cores shows few FLOP/s here; its bandwidth and time stand.

A profile replays each kernel several times (ncu's own measurement); ncu's times are not
`flashtune run`'s latencies, and this summary is a diagnosis, never a verdict.
"""

from __future__ import annotations

import csv
import io
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
    "NCU_METRICS",
    "KernelSummary",
    "NcuResult",
    "find_ncu",
    "ncu_summary",
    "parse_ncu_csv",
    "summarize_kernels",
    "unavailable_reason",
]

_FLOP_COUNTERS = {
    f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum": (2.0 if op == "fma" else 1.0)
    for p in ("f", "h", "d")
    for op in ("add", "mul", "fma")
}
NCU_METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes.sum",
    "dram__bytes.sum.peak_sustained",
    "dram__cycles_elapsed.avg.per_second",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained",
    "sm__cycles_elapsed.avg.per_second",
    *_FLOP_COUNTERS,
)

# Unit prefixes ncu prints ("Kbyte", "usecond", "Gbyte/second", "cycle/nsecond").
_PREFIXES = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BASES = ("byte", "second", "cycle", "inst", "hz", "warp", "thread", "sector", "request")


def _scale_of(part: str) -> float:
    part = part.strip()
    for base in _BASES:
        if part.lower().endswith(base) and len(part) > len(base):
            prefix = part[: -len(base)]
            return _PREFIXES.get(prefix, 1.0)
    return 1.0


def _to_base(value: str, unit: str) -> float | None:
    """'1,234.5' in 'Kbyte' -> 1234500.0; '(!) n/a' or '' -> None."""
    text = value.strip().replace(",", "")
    try:
        number = float(text)
    except ValueError:
        return None
    if not unit or unit == "%":
        return number
    top, _, bottom = unit.partition("/")
    return number * _scale_of(top) / (_scale_of(bottom) if bottom else 1.0)


@dataclass
class KernelSummary:
    """One profiled kernel launch."""

    kernel: str
    launch_id: str
    time_s: float | None = None
    dram_bytes: float | None = None
    bandwidth: float | None = None  # bytes per second achieved
    peak_bandwidth: float | None = None
    flops: float | None = None
    flops_per_s: float | None = None
    peak_flops_per_s: float | None = None  # fp32 FMA peak
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def bandwidth_fraction(self) -> float | None:
        if self.bandwidth is None or not self.peak_bandwidth:
            return None
        return self.bandwidth / self.peak_bandwidth

    @property
    def flops_fraction(self) -> float | None:
        if self.flops_per_s is None or not self.peak_flops_per_s:
            return None
        return self.flops_per_s / self.peak_flops_per_s

    def line(self) -> str:
        """'kernel: 12.3 us, 2.10 TB/s (62% of 3.35 TB/s), 0.41 TFLOP/s (1% of 60 TFLOP/s)'."""
        parts = [f"{self.kernel}:"]
        if self.time_s is not None:
            parts.append(f"{self.time_s * 1e6:.1f} us,")
        if self.bandwidth is not None:
            peak = (
                f" ({self.bandwidth_fraction:.0%} of {self.peak_bandwidth / 1e12:.2f} TB/s)"
                if self.bandwidth_fraction is not None and self.peak_bandwidth
                else ""
            )
            parts.append(f"{self.bandwidth / 1e12:.3f} TB/s{peak},")
        if self.flops_per_s is not None:
            peak = (
                f" ({self.flops_fraction:.0%} of {self.peak_flops_per_s / 1e12:.1f} TFLOP/s fp32)"
                if self.flops_fraction is not None and self.peak_flops_per_s
                else ""
            )
            parts.append(f"{self.flops_per_s / 1e12:.3f} TFLOP/s{peak}")
        return " ".join(parts).rstrip(",")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["bandwidth_fraction"] = self.bandwidth_fraction
        out["flops_fraction"] = self.flops_fraction
        out["summary"] = self.line()
        return out


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV part of ncu's output: from the first row that starts with "ID" (ncu prints
    its ==PROF== lines and the target's own output before it)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith('"ID"'):
            table = [line, *(row for row in lines[i + 1 :] if row.startswith('"'))]
            return [row for row in csv.reader(io.StringIO("\n".join(table))) if row]
    return []


def parse_ncu_csv(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """ncu's CSV (`--csv` with `--page details`: one row per metric, "Metric Name", "Metric
    Unit", "Metric Value" columns; or `--page raw`: one row per launch, a column per metric
    and a row of units under the header) -> {(launch ID, kernel name): {metric: value in
    base units}}."""
    rows = _csv_rows(text)
    if not rows:
        return {}
    header = rows[0]
    index = {name: i for i, name in enumerate(header)}
    if "Kernel Name" not in index:
        return {}
    out: dict[tuple[str, str], dict[str, float]] = {}
    if "Metric Name" in index:  # details: long format
        for row in rows[1:]:
            if len(row) < len(header):
                continue
            key = (row[index["ID"]], row[index["Kernel Name"]])
            unit = row[index["Metric Unit"]] if "Metric Unit" in index else ""
            value = _to_base(row[index["Metric Value"]], unit)
            if value is not None:
                out.setdefault(key, {})[row[index["Metric Name"]]] = value
        return out
    units: list[str] = [""] * len(header)
    body = rows[1:]
    if body and not body[0][index["ID"]].strip().isdigit():  # raw: the units row
        units = body[0] + [""] * (len(header) - len(body[0]))
        body = body[1:]
    first_metric = max(i for n, i in index.items() if "__" not in n) + 1
    for row in body:
        if len(row) < len(header):
            continue
        metrics = {}
        for i in range(first_metric, len(header)):
            value = _to_base(row[i], units[i])
            if value is not None:
                metrics[header[i]] = value
        out[(row[index["ID"]], row[index["Kernel Name"]])] = metrics
    return out


def summarize_kernels(parsed: dict[tuple[str, str], dict[str, float]]) -> list[KernelSummary]:
    """One KernelSummary per launch, from `parse_ncu_csv`'s metrics."""
    summaries = []
    for (launch, kernel), m in sorted(parsed.items(), key=lambda kv: _launch_order(kv[0][0])):
        s = KernelSummary(kernel=kernel, launch_id=launch, metrics=dict(m))
        s.time_s = m.get("gpu__time_duration.sum")
        s.dram_bytes = m.get("dram__bytes.sum")
        if s.time_s and s.dram_bytes is not None:
            s.bandwidth = s.dram_bytes / s.time_s
        elif "dram__bytes.sum.per_second" in m:
            s.bandwidth = m["dram__bytes.sum.per_second"]
        if "dram__bytes.sum.peak_sustained" in m and "dram__cycles_elapsed.avg.per_second" in m:
            s.peak_bandwidth = (
                m["dram__bytes.sum.peak_sustained"] * m["dram__cycles_elapsed.avg.per_second"]
            )
        counted = [m[name] * weight for name, weight in _FLOP_COUNTERS.items() if name in m]
        if counted:
            s.flops = sum(counted)
            if s.time_s:
                s.flops_per_s = s.flops / s.time_s
        ffma_peak = m.get("sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained")
        clock = m.get("sm__cycles_elapsed.avg.per_second")
        if ffma_peak is not None and clock is not None:
            s.peak_flops_per_s = 2.0 * ffma_peak * clock
        summaries.append(s)
    return summaries


def _launch_order(launch: str) -> tuple[int, str]:
    return (int(launch), "") if launch.isdigit() else (1 << 62, launch)


def find_ncu() -> str | None:
    """ncu on PATH, else in CUDA_HOME/CUDA_PATH's bin, else /usr/local/cuda's."""
    return find_cuda_tool("ncu")


def unavailable_reason(device: str, executable: str | None) -> str | None:
    """Why Nsight Compute cannot profile here (None: it can)."""
    return tool_unavailable_reason(
        device,
        executable,
        "Nsight Compute profiles GPU kernels",
        "ncu (Nsight Compute) is not installed (not on PATH, nor CUDA_HOME/bin)",
    )


@dataclass
class NcuResult:
    status: str  # "ok", "unavailable", "error"
    solution: str
    definition: str
    workload: str | None
    kernels: list[KernelSummary] = field(default_factory=list)
    detail: str = ""
    sandbox: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "solution": self.solution,
            "definition": self.definition,
            "workload": self.workload,
            "kernels": [k.to_json() for k in self.kernels],
            "detail": self.detail,
            "sandbox": self.sandbox,
        }


def ncu_summary(
    definition: Definition,
    workload: Workload,
    solution: Solution,
    device: str,
    roots: Sequence[str | Path] = (),
    kernel_regex: str | None = None,
    timeout: float = 900.0,
    executable: str | None = None,
) -> NcuResult:
    """Profile one sandboxed call of `solution` at `workload`; `kernel_regex`: only kernels
    whose name matches (ncu's --kernel-name regex:)."""
    executable = executable or find_ncu()
    result = NcuResult("unavailable", solution.name, definition.name, workload.uuid)
    why = unavailable_reason(device, executable)
    if why is not None:
        result.detail = why
        return result
    assert executable is not None  # unavailable_reason said so
    with tempfile.TemporaryDirectory(prefix="flashtune-ncu-") as folder:
        job = write_job(
            Path(folder), definition, workload, solution, device, [str(r) for r in roots]
        )
        # ncu's report (its log file) and the launcher's status: beside the probe's scratch,
        # not in it (Landlock: the probe writes only its scratch, so it cannot forge them).
        logs = Path(folder) / "tool"
        logs.mkdir(mode=0o700)
        log, status = logs / "ncu.log", logs / "ncu-launch.json"
        command = [
            executable,
            "--log-file",
            str(log),
            "--target-processes",
            "all",
            "--csv",
            "--page",
            "details",
            "--print-units",
            "base",
            "--metrics",
            ",".join(NCU_METRICS),
            *(["--kernel-name", f"regex:{kernel_regex}"] if kernel_regex else []),
            *probe_command(job),
        ]
        try:
            done = subprocess.run(
                tool_sandbox.command(command, job.parent / "scratch", status),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            result.status, result.detail = "error", f"ncu: no answer within {timeout:g} s"
            result.sandbox = tool_sandbox.describe_status(tool_sandbox.read_status(status))
            return result
        report = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        launch = tool_sandbox.describe_status(tool_sandbox.read_status(status))
    # The kernels come from ncu's log only: the probe's stdout is the solution's too.
    output = done.stdout + "\n" + done.stderr
    probe = parse_probe_line(done.stdout)
    result.sandbox = "; ".join(
        [(probe.get("sandbox") if probe else None) or "sandbox: unknown", launch]
    )
    result.kernels = summarize_kernels(parse_ncu_csv(report))
    errors = [
        line for line in (report + "\n" + output).splitlines() if line.startswith("==ERROR==")
    ]
    if probe is None or not probe.get("ok"):
        result.status = "error"
        result.detail = "the solution failed: " + (
            str(probe.get("error")) if probe else (errors[0] if errors else output[-500:])
        )
    elif not result.kernels:
        result.status = "error"
        result.detail = errors[0] if errors else "ncu profiled no kernel of the solution"
    else:
        result.status = "ok"
        result.detail = "; ".join(k.line() for k in result.kernels[:8])
    return result

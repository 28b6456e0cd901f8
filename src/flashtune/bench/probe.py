"""One sandboxed call of a solution, for the agent tools to watch from outside.

`python -m flashtune.bench.probe JOB.json` is the process that compute-sanitizer and Nsight
Compute start (bench/sanitizer.py, bench/nsight.py): it reads the job (definition, workload,
solution, device, dataset roots), enters the same OS sandbox a benchmarked solution gets
(`isolation.enter_sandbox`: Landlock, namespaces, seccomp, a private scratch folder) before
any of the solution's code runs, builds the solution, draws inputs from a seed the
operating system gives, calls it `calls` times, synchronizes the device and prints one line
``FLASHTUNE-PROBE {json}``. The tool, not this process, judges; nothing here is timed and
no output is checked (`flashtune run` does that).

Exit codes: 0 the calls returned, 3 the solution failed (its error in the line), 2 the job
could not be read.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

__all__ = [
    "PROBE_MARK",
    "find_cuda_tool",
    "main",
    "parse_probe_line",
    "probe_command",
    "tool_unavailable_reason",
    "write_job",
]

PROBE_MARK = "FLASHTUNE-PROBE "


def write_job(
    folder: Path,
    definition: Any,
    workload: Any,
    solution: Any,
    device: str,
    roots: list[str],
    calls: int = 1,
) -> Path:
    """The job file for `main` in `folder` (the caller's private folder)."""
    job = {
        "definition": definition.model_dump(mode="json", exclude_none=True),
        "workload": workload.model_dump(mode="json", exclude_none=True),
        "solution": solution.model_dump(mode="json", exclude_none=True),
        "device": device,
        "roots": roots,
        "calls": calls,
    }
    # The sandbox's scratch (its only writable folder), inside the caller's folder: removed
    # with it, whatever the probe leaves there.
    scratch = folder / "scratch"
    scratch.mkdir(mode=0o700, exist_ok=True)
    job["scratch"] = str(scratch)
    path = folder / "probe-job.json"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def probe_command(job: Path) -> list[str]:
    """The command line that runs `main` on `job` (for a tool to start as its target)."""
    return [sys.executable, "-m", "flashtune.bench.probe", str(job)]


def find_cuda_tool(name: str) -> str | None:
    """The executable `name` on PATH, else in CUDA_HOME/CUDA_PATH's bin, else
    /usr/local/cuda's."""
    found = shutil.which(name)
    if found:
        return found
    from flashtune.platform import cuda_homes

    for base in cuda_homes():
        candidate = base / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def tool_unavailable_reason(
    device: str, executable: str | None, works_on: str, not_installed: str
) -> str | None:
    """Why a CUDA tool cannot run a probe here (None: it can): `device` is not a GPU
    (`works_on`: what the tool does, e.g. "compute-sanitizer checks GPU kernels"), no GPU is
    visible, or no `executable` (`not_installed` says so)."""
    if not device.startswith("cuda"):
        return f"{works_on}; the device is {device!r}"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    if executable is None:
        return not_installed
    return None


def parse_probe_line(output: str) -> dict[str, Any] | None:
    """The probe's result line in a tool's combined output, or None when it never printed."""
    for line in reversed(output.splitlines()):
        at = line.find(PROBE_MARK)
        if at >= 0:
            try:
                value = json.loads(line[at + len(PROBE_MARK) :])
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _say(result: dict[str, Any]) -> None:
    sys.stdout.write(PROBE_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m flashtune.bench.probe JOB.json\n")
        return 2
    try:
        job = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        _say({"ok": False, "stage": "job", "error": str(exc)})
        return 2
    # Into the sandbox first: before torch starts threads, before the solution is read.
    from flashtune.bench import isolation, tool_sandbox

    scratch = job.get("scratch") or tempfile.mkdtemp(prefix="flashtune-probe-")
    # Under a tool started by bench/tool_sandbox.py: already in the sandbox's namespaces,
    # with the tool's channel on their loopback; taken as true only once verified.
    in_tool, why_not = tool_sandbox.verify(os.environ.pop(tool_sandbox.MARK, None))
    reads = [str(r) for r in job.get("roots", [])]
    # The tool's injection library loads at cuInit, inside the sandbox: its folder is read.
    reads += [os.path.dirname(p) for p in os.environ.get("CUDA_INJECTION64_PATH", "").split(":")]
    report = isolation.enter_sandbox(scratch, [r for r in reads if r], in_tool_namespaces=in_tool)
    if not in_tool and why_not != "no mark":
        report["tool_mark_refused"] = why_not
    sandbox = isolation.describe(report)
    stage = "build"
    try:
        import torch

        from flashtune.bench.build import build_solution
        from flashtune.data.models import Definition, Solution, Workload
        from flashtune.data.synth import resolve_axes, synthesize_inputs, torch_dtype

        definition = Definition.model_validate(job["definition"])
        workload = Workload.model_validate(job["workload"])
        solution = Solution.model_validate(job["solution"])
        device = torch.device(job.get("device", "cuda:0"))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        fn = build_solution(solution)
        stage = "inputs"
        roots = [Path(r) for r in job.get("roots", [])]
        blob_root = None
        if roots:
            from flashtune.data.dataset import Dataset

            blob_root = Dataset(roots)
        inputs = synthesize_inputs(
            definition, workload, device=device, seed=secrets.randbits(62), blob_root=blob_root
        )
        call_args: list[Any] = list(inputs.values())
        if solution.spec.destination_passing_style:
            axes = resolve_axes(definition, workload)
            for spec in definition.outputs.values():
                shape = tuple(axes[a] for a in spec.shape or ())
                call_args.append(torch.empty(shape, dtype=torch_dtype(spec.dtype), device=device))
        setup = getattr(fn, "setup", None)
        call = setup(*call_args) if callable(setup) else fn
        stage = "call"
        for _ in range(max(1, int(job.get("calls", 1)))):
            call(*call_args)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except BaseException as exc:  # noqa: BLE001 - the solution's failure is the answer
        _say(
            {
                "ok": False,
                "stage": stage,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=8)[-4000:],
                "sandbox": sandbox,
                "sandbox_report": report,
            }
        )
        sys.stdout.flush()
        os._exit(3)  # no atexit work of the solution's after this
    _say({"ok": True, "stage": "done", "sandbox": sandbox, "sandbox_report": report})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

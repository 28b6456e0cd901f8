"""Helpers shared by the GPU benchmarks: result rows and the measured copy bandwidth."""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

from flashtune import platform
from flashtune.timing import measure

RESULTS = Path(__file__).resolve().parent / "results"


def git_commit() -> str:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=RESULTS.parent,
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        return "unknown"


def versions() -> dict[str, Any]:
    snap = platform.snapshot()
    try:
        import flashinfer

        snap["flashinfer"] = flashinfer.__version__
    except Exception:
        snap["flashinfer"] = None
    return snap


class RowWriter:
    """Appends one JSON line per measurement to benchmarks/results/<name>.jsonl and,
    when $OUT is set (the GPU machine), to $OUT/<name>.jsonl as well."""

    def __init__(self, name: str) -> None:
        self.paths = [RESULTS / f"{name}.jsonl"]
        if os.environ.get("OUT"):
            self.paths.append(Path(os.environ["OUT"]) / f"{name}.jsonl")
        env = versions()
        self.common = {
            "gpu": env["hardware"],
            "versions": {
                k: env.get(k)
                for k in ("torch", "triton", "cuda", "driver", "flashtune", "flashinfer")
            },
            "commit": git_commit(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        for p in self.paths:
            p.parent.mkdir(parents=True, exist_ok=True)

    def write(
        self, op: str, shape: dict[str, Any], solution: str, latency_ms: float, **extra: Any
    ) -> dict:
        row = {
            "op": op,
            "shape": shape,
            "solution": solution,
            "latency_ms": latency_ms,
            **extra,
            **self.common,
        }
        line = json.dumps(row) + "\n"
        for p in self.paths:
            with open(p, "a") as f:
                f.write(line)
        return row


def copy_bandwidth_gbs(nbytes: int = 2 * 2**30) -> float:
    """Read bandwidth of a large reduction (GB/s): a read-heavy kernel, the realistic
    ceiling for memory-bound kernels (torch's copy_ underestimates it)."""
    x = torch.randn(nbytes // 4, device="cuda", dtype=torch.float32)
    t = measure(lambda a: a.sum(), [x], warmup=5, repetitions=30, cold_l2=False)
    return nbytes / (t.median_ms * 1e-3) / 1e9

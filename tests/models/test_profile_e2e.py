"""benchmarks/profile_e2e.py on CPU (tiny config, interpreter): the code path of the GPU
profile of a decode step, per backend."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_e2e.py"


@pytest.mark.slow
def test_profiles_a_step_per_backend():
    env = dict(os.environ, TRITON_INTERPRET="1")
    command = [sys.executable, str(SCRIPT), "--config", "tiny", "--device", "cpu"]
    command += ["--dtype", "float16", "--kv-len", "32", "--backends", "torch,flashtune"]
    command += ["--steps", "1", "--top", "3", "--no-tune"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    totals = dict(re.findall(r"^## (\w+): .*eager step kernels ([\d.]+) ms", proc.stdout, re.M))
    assert set(totals) == {"torch", "flashtune"}
    assert all(float(ms) > 0 for ms in totals.values())
    # each section lists its top ops: time, launches a step, name
    assert len(re.findall(r"^\s+[\d.]+ ms\s+x\s*\d+\s+\S", proc.stdout, re.M)) >= 4

"""FLASHTUNE_CAPTURE=1 alone, in a program that imports only an op, records its workloads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROGRAM = """
import torch
from flashtune.ops.norm import rmsnorm
for rows in (3, 5, 3):
    rmsnorm(torch.randn(rows, 64), torch.randn(64))
"""


def test_env_switch_alone_captures(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        FLASHTUNE_CAPTURE="1",
        FLASHTUNE_DATASET=str(tmp_path),
        FLASHTUNE_CAPTURE_FILTER_POLICY="shape_only",
    )
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "definitions" / "rmsnorm" / "rmsnorm_h64.json").exists()
    lines = (tmp_path / "workloads" / "rmsnorm" / "rmsnorm_h64.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["workload"]["axes"]["batch_size"] for line in lines) == [3, 5]

"""scripts/sass_decode.py: the decode kernel compiled for sm_90 without a GPU (slow: a real
compile), and two properties of its machine code that GPU runs found the hard way."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sass_decode.py"
pytestmark = pytest.mark.slow


def _counts(*args: str) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("Triton's bundled ptxas is missing")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {name: int(n) for n, name in re.findall(r"^\s+(\d+)\s+(\S+)$", proc.stdout, re.M)}


def _local_memory(counts: dict[str, int]) -> int:
    return sum(n for name, n in counts.items() if name.startswith(("LDL", "STL")))


def test_fused_rope_decode_keeps_its_registers():
    """libdevice's sinf/cosf made fused-RoPE decode spill (117 LDL, 141 STL at 9e87e73) and run
    5-15x slower than plain decode on an H100; the reduced angle and the SFU's sin/cos do not."""
    plain, rope = _counts(), _counts("--rope")
    assert rope.get("MUFU.SIN", 0) > 0 and rope.get("MUFU.COS", 0) > 0
    assert _local_memory(rope) <= _local_memory(plain) + 8


def test_fp8_decode_avoids_the_slow_bf16_conversion():
    counts = _counts("--kv-dtype", "float8_e4m3fn")
    assert counts.get("F2FP.F16.E4M3.UNPACK_B", 0) > 0  # the fp8 tiles are converted...
    assert counts.get("F2F.BF16.F16", 0) == 0  # ...without one F2F per element

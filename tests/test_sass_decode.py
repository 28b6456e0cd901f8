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


def _run(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("Triton's bundled ptxas is missing")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _counts(*args: str) -> dict[str, int]:
    out = _run(*args)
    return {name: int(n) for n, name in re.findall(r"^\s+(\d+)\s+(\S+)$", out, re.M)}


def _local_memory(counts: dict[str, int]) -> int:
    return sum(n for name, n in counts.items() if name.startswith(("LDL", "STL")))


def test_fused_rope_decode_keeps_sin_cos_and_spills_out_of_its_loop():
    """libdevice's sinf/cosf made fused-RoPE decode spill (117 LDL, 141 STL at 9e87e73) and run
    5-15x slower than plain decode on an H100. Since then the KV loop rotates K by a table of
    cos/sin made once per work item (relative positions): the loop has no sin/cos and no
    local memory, and 2 packed FMAs a K pair."""
    rope = _counts("--rope", "--loop")
    assert rope.get("MUFU.SIN", 0) == 0 and rope.get("MUFU.COS", 0) == 0
    assert _local_memory(rope) == 0
    assert rope.get("HFMA2.BF16_V2", 0) > 0  # the rotation, two bf16 lanes an instruction


def test_registers_table_matches_the_compiler():
    """decode/registers.py (what the plan reads to size its grid) still describes the kernel:
    a sample of its entries recompiled."""
    from flashtune.ops.attention.decode.registers import REGISTERS_SM90

    for variant, extra in (("plain", []), ("rope", ["--rope"])):
        key = (variant, 128, 64, 4, 2)
        out = _run(*extra, "--block-n", "64", "--warps", "4", "--stages", "2")
        assert f"REG:{REGISTERS_SM90[key]} " in out.splitlines()[0] + " ", key


def test_fp8_decode_avoids_the_slow_bf16_conversion():
    counts = _counts("--kv-dtype", "float8_e4m3fn")
    assert counts.get("F2FP.F16.E4M3.UNPACK_B", 0) > 0  # the fp8 tiles are converted...
    assert counts.get("F2F.BF16.F16", 0) == 0  # ...without one F2F per element


def test_mla_prefill_tile_split_over_two_programs_does_not_spill():
    """A 64-row MLA prefill tile keeps a [64, 512] fp32 accumulator: at 32/8/3 Triton spills
    (26 spill stores a thread at e2220d9); with the output columns split over two programs
    (MLATactic.dv_split=2) each keeps [64, 256] and nothing spills."""
    assert _local_memory(_counts("--mla", "32,8,3,0,1")) > 0
    assert _local_memory(_counts("--mla", "32,8,3,0,2")) == 0

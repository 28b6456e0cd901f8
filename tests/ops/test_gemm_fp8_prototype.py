"""The Gluon fp8 GEMM prototype (benchmarks/prototypes/gluon_fp8_gemm.py) keeps compiling for
sm_90a: an ahead-of-time compile, no GPU needed. Whether it is right and fast is for its own
GPU mode to say; this only keeps it from rotting before that run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "prototypes" / "gluon_fp8_gemm.py"


@pytest.mark.slow
def test_gluon_fp8_gemm_prototype_compiles_for_sm90():
    pytest.importorskip("triton.experimental.gluon", reason="Triton without Gluon")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--aot"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "sm_90a PTX" in line]
    assert len(lines) == 3 and all("wgmma in PTX: True" in line for line in lines), proc.stdout

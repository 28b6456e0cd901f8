"""`mla.config.smem_bytes` against what Triton allocates: the MLA kernel compiled for sm_90
without a GPU (slow: real compiles). The tactic space and the default tactic are filtered by
this model; a model below the compiler's figure lets a tactic in that fails at launch with
OutOfResources (the 64-row tiles did on an H200, at 288 KB for a 227 KB limit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashtune.ops.mla.config import MLATactic, smem_bytes

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

# (rows a program, block_n, warps, stages, dv_split, fused_merge): each row count, the split
# output columns, the fused merge, and tiles on both sides of the 227 KB limit.
BF16_CASES = [
    (16, 64, 8, 3, 1, False),
    (16, 128, 8, 2, 1, True),
    (32, 64, 8, 3, 1, False),
    (32, 64, 8, 2, 2, False),
    (64, 64, 8, 2, 1, False),
    (64, 32, 8, 3, 1, True),
    (64, 32, 8, 3, 2, False),
    (64, 32, 8, 2, 2, False),
    (64, 64, 8, 2, 2, False),
]
FP8_CASES = [(16, 128, 16, 2, 1, False), (32, 64, 8, 3, 1, False), (64, 64, 8, 3, 1, False)]


def _compiled_smem(cases: list[tuple], kv_dtype: str) -> list[int]:
    code = f"""
import json, sys, torch
sys.path.insert(0, {str(SCRIPTS)!r})
from sass_decode import dynamic_shared, mla_sass
from flashtune.ops.mla import MLATactic
out = []
for bm, bn, nw, ns, dv, fm in {cases!r}:
    sass = mla_sass(MLATactic(bn, nw, ns, dv_split=dv, fused_merge=fm), bm, torch.{kv_dtype})
    out.append(dynamic_shared(sass))
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("Triton's bundled ptxas is missing")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _model(case: tuple, kv_itemsize: int) -> int:
    bm, bn, nw, ns, dv, fm = case
    return smem_bytes(MLATactic(bn, nw, ns, dv_split=dv, fused_merge=fm), bm, 512, 64, kv_itemsize)


def test_bf16_model_is_the_compilers_figure():
    compiled = _compiled_smem(BF16_CASES, "bfloat16")
    assert [_model(c, 2) for c in BF16_CASES] == compiled


def test_fp8_model_bounds_the_compilers_figure():
    compiled = _compiled_smem(FP8_CASES, "float8_e4m3fn")
    for case, actual in zip(FP8_CASES, compiled, strict=True):
        model = _model(case, 1)
        # An upper bound, and not so loose that it drops the tiles that fit.
        assert actual <= model <= 1.4 * actual, (case, actual, model)


def test_the_space_keeps_only_tiles_that_fit():
    """Every tactic the tuner may time at 64 rows fits an H100's 227 KB by the model (which
    the tests above tie to the compiler); the split 32/8/3 tile, 1 KB over, is left out."""
    space = MLATactic.space(64)
    assert all(smem_bytes(t, 64, 512, 64, 2) <= 227 * 1024 for t in space)
    assert MLATactic(32, 8, 3, dv_split=2) not in space
    assert MLATactic(32, 8, 2, dv_split=2) in space

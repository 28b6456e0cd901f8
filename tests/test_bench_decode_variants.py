"""benchmarks/bench_decode.py --only variants: each shape's inputs and flashtune's planned
calls (RoPE decode and its plain twin, fp8-KV decode with k_scale / v_scale) checked against
the decode reference on a tiny shape (interpreter on CPU, the GPU under cuda)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from flashtune.ops.attention.page import split_kv_cache
from flashtune.ops.attention.reference import batch_decode_ref

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
HQ, HK, D = 4, 1, 64
BATCH, KV_LEN, PAGE_SIZE = 2, 40, 16  # the last page of each request partly filled


@pytest.fixture
def bench_decode(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("bench_decode", None)
    import bench_decode

    return bench_decode


@pytest.mark.slow  # the interpreter runs 2 decode calls (each compiled on first use)
@pytest.mark.parametrize(
    "kind, kv_dtype",
    [("rope", None), ("fp8", torch.float8_e4m3fn), ("fp8", torch.float8_e5m2)],
)
def test_variant_case_matches_the_decode_reference(bench_decode, device, kind, kv_dtype):
    case = bench_decode.variant_case(
        kind,
        BATCH,
        KV_LEN,
        kv_dtype=kv_dtype,
        page_size=PAGE_SIZE,
        heads=(HQ, HK, D),
        q_dtype=torch.float16,  # the interpreter's bf16 dot is wrong on this Triton
        device=device,
        tune=False,  # autotuning a dozen tactics in the interpreter: minutes
    )
    q, cache = case["q"], case["cache"]
    expected = {"rope": ["flashtune", "flashtune_plain"], "fp8": ["flashtune"]}[kind]
    assert sorted(case["solutions"]) == expected  # no FlashInfer without `fi`
    assert cache.dtype == (kv_dtype or torch.float16)
    # Fresh random inputs of scale ~1, never zeros.
    assert 0.5 < q.float().std().item() < 2 and 0.5 < cache.float().std().item() < 2
    assert case["nbytes"] == 2 * BATCH * KV_LEN * HK * D * cache.element_size()

    k, v = split_kv_cache(cache, "NHD")
    fp8 = kind == "fp8"
    k_scale, v_scale = bench_decode.K_SCALE, bench_decode.V_SCALE
    outs = {}
    for name in expected:
        out = case["solutions"][name][None](q, cache)
        rope = (1.0, 1e4) if name == "flashtune" and kind == "rope" else None
        ref, _ = batch_decode_ref(
            q, k, v, *case["table"], sm_scale=k_scale / math.sqrt(D) if fp8 else None, rope=rope
        )
        if fp8:
            ref = ref.double() * v_scale
        assert out.shape == q.shape and out.dtype == q.dtype
        torch.testing.assert_close(out.double().cpu(), ref.double().cpu(), atol=3e-3, rtol=3e-3)
        outs[name] = out
    tuned = bench_decode.variant_case(
        kind, 1, PAGE_SIZE, kv_dtype=kv_dtype, page_size=PAGE_SIZE, heads=(HQ, HK, D),
        q_dtype=torch.float16, device=device,
    )  # fmt: skip
    assert ("flashtune_tuned" in tuned["solutions"]) == fp8  # planned, not run here
    if kind == "rope":  # the rotation changes the result: the two calls differ
        assert (outs["flashtune"] - outs["flashtune_plain"]).abs().max().item() > 0.05

"""fp8 GEMM benchmark (issue 35): flashtune's Triton fp8 kernel against cuBLASLt
(torch._scaled_mm) with per-tensor scales, and the block-scaled kernel (DeepSeek's 1x128 /
128x128 format) on its own.

Shapes: M in {1, 16, 128, 1024, 4096} (--quick: 1, 128, 4096) at the (N, K) of DeepSeek-V3
TP8's linear layers and two of Llama-3.1-8B's. C = A @ B.T, A [M, K], B [N, K] e4m3, bf16 out.
Each candidate is timed with flashtune.timing.measure (cold L2 by rotating input copies, a
CUDA graph of many calls) and its output checked against cuBLAS's (per-tensor) or the
reference (block scales) before it may win. Selection is not measurement (common.Selection):
the picks are timed again in a fresh process on fresh inputs, beside cuBLAS and the default
tactic timed the same way, and those are the published figures.

Rows go to benchmarks/results/gemm_fp8.jsonl (and $OUT): per shape cuBLAS, Triton's default
tactic (and the same tactic with TMA loads, "triton_tma_default") and its best over the
Triton runners (the tiled kernel with pointer or TMA loads and, with per-tensor scales at
M <= 64, the decode kernel: the row's `runner`), re-measured; a geomean of cuBLAS /
Triton-best is printed per scale kind.
Usage: python benchmarks/bench_gemm_fp8.py [--quick] [--budget-s 500]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter, Selection  # noqa: E402

from flashtune.ops.gemm.fp8 import launch as L  # noqa: E402
from flashtune.ops.gemm.fp8.reference import block_scaled_mm_ref  # noqa: E402
from flashtune.timing import measure  # noqa: E402

NK = [(1536, 7168), (576, 7168), (3072, 1536), (4608, 7168), (7168, 2304), (7168, 2048)]
NK += [(6144, 4096), (4096, 14336)]
M_ALL, M_QUICK = (1, 16, 128, 1024, 4096), (1, 128, 4096)
FP8 = torch.float8_e4m3fn


def _time(fn, a: L.Fp8Inputs) -> float:
    """fn(A, B, A_scale, B_scale, out)'s median latency (ms); measure rotates copies of the
    operands for a cold L2."""
    args = [a.A, a.B, a.A_scale, a.B_scale, a.out]
    return measure(fn, args, cold_l2=True, use_cuda_graph=True, repetitions=30).median_ms


def _operands(M: int, N: int, K: int, block: bool, seed: int) -> L.Fp8Inputs:
    g = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.randn(1, M, K, device="cuda", generator=g).to(FP8)
    B = (torch.randn(1, N, K, device="cuda", generator=g) / 4).to(FP8)
    if block:
        sa = torch.rand(1, M, math.ceil(K / 128), device="cuda", generator=g) + 0.5
        sb = torch.rand(1, math.ceil(N / 128), math.ceil(K / 128), device="cuda", generator=g)
        sb = sb + 0.5
    else:
        sa = torch.rand(1, device="cuda", generator=g) + 0.5
        sb = torch.rand(1, device="cuda", generator=g) + 0.5
    out = torch.empty(1, M, N, device="cuda", dtype=torch.bfloat16)
    mode = "block" if block else "tensor"
    return L.Fp8Inputs(A, B, sa, sb, torch.bfloat16, mode=mode, out=out)


def _cublas(A, B, sa, sb, out):
    # cuBLASLt's fp8 GEMM as its users call it: mat2 [K, N] column-major, a new output.
    return torch._scaled_mm(
        A[0], B[0].T, scale_a=sa.reshape(()), scale_b=sb.reshape(()), out_dtype=torch.bfloat16
    )


_RUNNERS = {
    "tiled": L.TritonFp8Runner(),
    "tma": L.TritonFp8TmaRunner(),
    "small_m": L.TritonFp8SmallMRunner(),
}


def _candidates(a: L.Fp8Inputs) -> list[tuple[str, Any]]:
    """(runner, tactic) pairs: the tiled kernel's default first (with TMA loads too, where
    they apply), then every Triton tactic of the runners (the TMA kernel's on Hopper, the
    decode kernel's where it applies: per-tensor scales, M <= 64)."""
    tma_default = [("tma", -1)] if L.tma_applies(a) else []
    return [("tiled", -1), *tma_default] + [
        (name, t) for name, runner in _RUNNERS.items() for t in runner.get_valid_tactics(a, None)
    ]


def _triton(mode: str, pick: tuple[str, Any]):
    runner, tactic = _RUNNERS[pick[0]], pick[1]

    def run(A, B, sa, sb, out):
        return runner.forward(L.Fp8Inputs(A, B, sa, sb, torch.bfloat16, mode=mode, out=out), tactic)

    return run


def _call(fn, a: L.Fp8Inputs) -> torch.Tensor:
    return fn(a.A, a.B, a.A_scale, a.B_scale, a.out)


def _expected(a: L.Fp8Inputs) -> torch.Tensor:
    if a.mode == "block":
        return block_scaled_mm_ref(a.A[0], a.B[0], a.A_scale[0], a.B_scale[0])
    return _call(_cublas, a)


def _ok(got: torch.Tensor, expected: torch.Tensor) -> bool:
    err = (got.float() - expected.float()).norm() / expected.float().norm().clamp(min=1e-12)
    return bool(err < 2e-2)


def _key(M: int, N: int, K: int, block: bool) -> str:
    return f"{'block' if block else 'tensor'}-{M}-{N}-{K}"


def select_shape(M: int, N: int, K: int, block: bool, selection: Selection) -> None:
    """The selecting process: time every valid tactic (checked first), keep the fastest."""
    a = _operands(M, N, K, block, seed=0)
    expected = _expected(a)
    timed = []
    for tactic in _candidates(a):
        fn = _triton(a.mode, tactic)
        try:
            if not _ok(_call(fn, a)[0], expected):
                print(f"  M={M} N={N} K={K} tactic {tactic}: wrong result, skipped")
                continue
            timed.append((_time(fn, a), tactic))
        except Exception as exc:  # a tactic this GPU cannot compile: skipped, said
            print(f"  M={M} N={N} K={K} tactic {tactic}: {exc!r}")
    best_ms, best = min(timed, key=lambda x: x[0])
    selection.record(_key(M, N, K, block), best, best_ms)
    print(f"M={M:5d} N={N:5d} K={K:5d} {a.mode:6s} picked {best} ({len(timed)} tactics)")


def measure_shape(
    M: int, N: int, K: int, block: bool, selection: Selection, rows: RowWriter
) -> tuple[float, float]:
    """The measuring process: the pick, the default tactic and cuBLAS on inputs the pick was
    not chosen on. Returns (cuBLAS or nan, the pick) in ms."""
    a = _operands(M, N, K, block, seed=1)
    tactic, selection_ms = selection.lookup(_key(M, N, K, block), _candidates(a))
    best_ms = _time(_triton(a.mode, tactic), a)
    default_ms = _time(_triton(a.mode, ("tiled", -1)), a)
    peer_ms = float("nan") if block else _time(_cublas, a)
    shape = {"M": M, "N": N, "K": K, "scales": "block_1x128_128x128" if block else "tensor"}
    flops = 2 * M * N * K
    if not block:
        rows.write("gemm_fp8", shape, "cublas_scaled_mm", peer_ms, tflops=flops / peer_ms / 1e9)
    rows.write("gemm_fp8", shape, "triton_default", default_ms, tactic=-1)
    if L.tma_applies(a):  # the same default tactic with TMA loads: what TMA alone changes
        tma_ms = _time(_triton(a.mode, ("tma", -1)), a)
        rows.write("gemm_fp8", shape, "triton_tma_default", tma_ms, tactic=-1)
    rows.write(
        "gemm_fp8",
        shape,
        "triton_best_remeasured",
        best_ms,
        runner=tactic[0],
        tactic=list(tactic[1]) if tactic[1] != -1 else -1,
        tflops=flops / best_ms / 1e9,
        selection_ms=selection_ms,
    )
    ratio = "" if block else f"{peer_ms / best_ms:.2f}x cuBLAS"
    print(f"M={M:5d} N={N:5d} K={K:5d} {a.mode:6s} best {best_ms * 1e3:8.1f} us {ratio}")
    return peer_ms, best_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=500.0)
    ap.add_argument("--picks", help="(internal) the selecting process's picks: measure them")
    opts = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gemm_fp8 needs a GPU")
    selection = Selection(opts.picks, sweep=True)
    rows = None if selection.selecting else RowWriter("gemm_fp8")
    start = time.perf_counter()
    ratios: list[float] = []
    for block in (False, True):
        for N, K in NK:
            for M in M_QUICK if opts.quick else M_ALL:
                if selection.selecting:
                    if time.perf_counter() - start > opts.budget_s:
                        break  # the measuring process skips the shapes without a pick
                    select_shape(M, N, K, block, selection)
                elif _key(M, N, K, block) in selection.picks:
                    assert rows is not None
                    peer, best = measure_shape(M, N, K, block, selection, rows)
                    if not math.isnan(peer):
                        ratios.append(peer / best)
    if selection.selecting:
        selection.measure_in_fresh_process(__file__)
    elif ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"per-tensor fp8: Triton best vs cuBLAS geomean {geo:.3f}x over {len(ratios)}")


if __name__ == "__main__":
    main()

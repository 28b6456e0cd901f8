"""GEMM benchmark (issue 3): flashtune's runners and tactics against cuBLAS.

Shapes: the (N, K) of the FlashInfer-Trace gemm definitions with M in
{1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096}, plus [M, 4096] x [4096, 11008] for
M in {1, 17, 32, 256, 512} and [1, 8192] x [8192, 1024]. C = A @ B.T, B [N, K], bf16.

For each shape: cuBLAS (torch) and every pruned tactic of the Triton runners, timed with
flashtune.timing.measure (cold L2 by rotating input copies, CUDA graphs of many calls so
that microsecond kernels are not timed as host launch overhead). Each candidate's output is
checked against cuBLAS before it may win. Writes rows to benchmarks/results/gemm.jsonl
(cuBLAS, best flashtune, best Triton per shape), every candidate's timing to
$OUT/gemm_candidates.jsonl, the best tactic per shape to $OUT/gemm_best_tactics.json, and
prints geomean tables. Usage: python benchmarks/bench_gemm.py [--budget-s 300] [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GEMM_CORPUS_M as CORPUS_M  # noqa: E402
from common import GEMM_CORPUS_NK as CORPUS_NK  # noqa: E402
from common import GEMM_EXTRA_MNK as EXTRA  # noqa: E402
from common import RowWriter, copy_bandwidth_gbs  # noqa: E402

from flashtune.ops import gemm as G  # noqa: E402
from flashtune.timing import copies_for_cold_l2, measure  # noqa: E402

PEAK_TFLOPS = 790.0  # H100 SXM dense bf16
DTYPE = torch.bfloat16


def shapes(quick: bool) -> list[tuple[int, int, int]]:
    out = [(m, n, k) for n, k in CORPUS_NK for m in CORPUS_M] + EXTRA
    if quick:
        out = [s for s in out if s[1] in (4096, 128, 57344, 11008, 1024)]
    # Decode shapes first: they carry the target that needs a real kernel win.
    return sorted(dict.fromkeys(out), key=lambda s: (s[0] > G.SMALL_M, s[0], s[1], s[2]))


def candidates(M: int, N: int, K: int, dev: torch.device) -> list[tuple[G.TunableRunner, object]]:
    A = torch.empty((M, K), device="meta", dtype=DTYPE)
    B = torch.empty((N, K), device="meta", dtype=DTYPE)
    out: list[tuple[G.TunableRunner, object]] = []
    for runner in (G.TritonSmallMRunner(), G.TritonTiledRunner()):
        # Tactics come from the runner's own pruned list; the device limits come from dev.
        tactics = runner.get_valid_tactics([_on(A, dev), _on(B, dev)], None)
        out += [(runner, t) for t in tactics]
    return out


class _Shaped:
    """Stands in for a tensor where runners only read shape, device and element size."""

    def __init__(self, t: torch.Tensor, dev: torch.device) -> None:
        self.shape, self.device, self.dtype = t.shape, dev, t.dtype

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


def _on(t: torch.Tensor, dev: torch.device) -> _Shaped:
    return _Shaped(t, dev)


def precompile(dev: torch.device, all_shapes: list[tuple[int, int, int]]) -> float:
    """Compile every (runner, config) once on tiny inputs with the real shapes' specialization
    (N, K multiples of 16, K divisible by every BLOCK_K, unit inner strides), in threads:
    Triton compiles outside the GIL for the most part (ptxas is a subprocess)."""
    seen: dict[tuple, tuple[G.TunableRunner, object]] = {}
    for M, N, K in all_shapes:
        for runner, t in candidates(M, N, K, dev):
            # split_k is a runtime argument: configs that differ only in it share a binary.
            key = (runner.name, tuple(x for i, x in enumerate(t) if not _is_split(runner, i)))
            seen.setdefault(key, (runner, t))
    A = torch.randn(16, 1024, device=dev, dtype=DTYPE)
    B = torch.randn(64, 1024, device=dev, dtype=DTYPE)

    def job(item: tuple[G.TunableRunner, object]) -> None:
        runner, t = item
        runner.forward([A, B, None], t)

    start = time.perf_counter()
    G._kernels.split_k_counters(dev, 1)  # allocate once, outside the threads
    with cf.ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        list(pool.map(job, seen.values()))
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _is_split(runner: G.TunableRunner, index: int) -> bool:
    return index == (4 if isinstance(runner, G.TritonTiledRunner) else 3)


def time_fn(fn, sets, est_ms: float) -> float:
    calls = max(1, min(20, int(0.5 / max(est_ms, 1e-3))))
    reps = 10 if est_ms < 1.0 else 5
    t = measure(
        fn,
        sets[0],
        input_sets=sets,
        warmup=2,
        repetitions=reps,
        use_cuda_graph=True,
        calls_per_graph=calls,
        max_seconds=2.0,
    )
    return t.median_ms


def bench_shape(M, N, K, dev, cand_file):
    A = torch.randn(M, K, device=dev, dtype=DTYPE)
    B = torch.randn(N, K, device=dev, dtype=DTYPE) * 0.05
    copies = copies_for_cold_l2([A, B], dev)
    sets = [[A, B]] + [[A.clone(), B.clone()] for _ in range(copies - 1)]
    cublas = G.CublasRunner()
    ref = cublas.forward([A, B, None]).float()
    tol = 2e-2 * ref.abs().max().item() + 1e-2

    # A first cuBLAS estimate sizes the CUDA graphs.
    est = measure(
        lambda a, b: cublas.forward([a, b, None]), [A, B], warmup=2, repetitions=3, cold_l2=False
    ).median_ms
    results = [("CublasRunner", -1, time_fn(lambda a, b: cublas.forward([a, b, None]), sets, est))]
    for runner, tactic in candidates(M, N, K, dev):
        try:
            C = runner.forward([A, B, None], tactic)
            err = (C.float() - ref).abs().max().item()
            if not err <= tol:
                print(f"  WRONG {runner.name} {tactic} M={M} N={N} K={K}: err {err:.3g}")
                continue
            ms = time_fn(lambda a, b, r=runner, t=tactic: r.forward([a, b, None], t), sets, est)
        except Exception as exc:  # a config the device rejects (resources): skip it
            print(f"  FAIL {runner.name} {tactic}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        results.append((runner.name, tactic, ms))
    for name, tactic, ms in results:
        cand_file.write(
            json.dumps({"shape": [M, N, K], "runner": name, "tactic": tactic, "latency_ms": ms})
            + "\n"
        )
    del sets, A, B, ref
    return results


def custom_op_overhead(dev: torch.device) -> dict[str, float]:
    """Host time per call (us) of mm eager vs through the torch custom op, tiny shape."""
    A = torch.randn(1, 256, device=dev, dtype=DTYPE)
    B = torch.randn(256, 256, device=dev, dtype=DTYPE)
    small = G.TritonSmallMRunner()
    fns = {
        "eager_mm": lambda: G.mm(A, B),
        "custom_op": lambda: torch.ops.flashtune.mm(A, B, None, "nk"),
        "torch_F_linear": lambda: torch.nn.functional.linear(A, B),
        "triton_small_m_forward": lambda: small.forward([A, B, None], -1),
    }
    out = {}
    for name, fn in fns.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        n = 2000
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        out[name] = (time.perf_counter() - start) / n * 1e6
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    start = time.perf_counter()
    out_dir = Path(os.environ.get("OUT", "/tmp"))
    all_shapes = shapes(args.quick)
    print(f"{len(all_shapes)} shapes on {torch.cuda.get_device_name()}", flush=True)
    print(f"precompile: {precompile(dev, all_shapes):.1f}s", flush=True)
    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    writer = RowWriter("gemm")
    overhead = custom_op_overhead(dev)
    print("host us/call: " + ", ".join(f"{k} {v:.1f}" for k, v in overhead.items()))
    writer.write(
        "gemm",
        {"M": 1, "N": 256, "K": 256},
        "custom_op_overhead_us",
        overhead["custom_op"] - overhead["eager_mm"],
        host_us_per_call=overhead,
    )

    best_tactics, table = {}, []
    cand_file = open(out_dir / "gemm_candidates.jsonl", "w")
    for M, N, K in all_shapes:
        if time.perf_counter() - start > args.budget_s:
            print(f"budget reached: stopping before M={M} N={N} K={K}")
            break
        res = bench_shape(M, N, K, dev, cand_file)
        cub = res[0][2]
        best = min(res, key=lambda r: r[2])
        triton = [r for r in res if r[0] != "CublasRunner"]
        best_tr = min(triton, key=lambda r: r[2]) if triton else None
        flops = 2.0 * M * N * K
        nbytes = 2.0 * (M * K + N * K + M * N)
        shape = {"M": M, "N": N, "K": K}
        rows = [("cublas", res[0]), ("flashtune_best", best)]
        if best_tr is not None:
            rows.append(("flashtune_triton_best", best_tr))
        for label, (name, tactic, ms) in rows:
            gbs = nbytes / (ms * 1e-3) / 1e9
            extra = {"gbs": gbs, "gbs_vs_copy": gbs / bw} if M <= G.SMALL_M else {}
            writer.write(
                "gemm",
                shape,
                f"{label}:{name}:{tactic}",
                ms,
                dtype="bfloat16",
                runner=name,
                tactic=tactic,
                tflops=flops / (ms * 1e-3) / 1e12,
                tflops_vs_peak=flops / (ms * 1e-3) / 1e12 / PEAK_TFLOPS,
                vs_cublas=cub / ms,
                **extra,
            )
        best_tactics[f"{M},{N},{K}"] = {
            "runner": best[0],
            "tactic": best[1],
            "latency_ms": best[2],
            "triton_runner": best_tr[0] if best_tr else None,
            "triton_tactic": best_tr[1] if best_tr else None,
            "triton_latency_ms": best_tr[2] if best_tr else None,
            "cublas_ms": cub,
        }
        table.append((M, N, K, cub, best, best_tr, nbytes))
        tr_ratio = cub / best_tr[2] if best_tr else float("nan")
        gb = f" {nbytes / (best[2] * 1e-3) / 1e9:6.0f} GB/s" if M <= G.SMALL_M else ""
        print(
            f"M={M:5d} N={N:6d} K={K:6d} cublas {cub * 1e3:9.1f}us  best {best[0]:18s} "
            f"{best[2] * 1e3:9.1f}us x{cub / best[2]:.3f}  triton x{tr_ratio:.3f}{gb}",
            flush=True,
        )
    cand_file.close()
    (out_dir / "gemm_best_tactics.json").write_text(json.dumps(best_tactics, indent=1))

    def summary(name, sel):
        rows = [r for r in table if sel(r)]
        if not rows:
            return
        best = [r[3] / r[4][2] for r in rows]
        trit = [r[3] / r[5][2] for r in rows if r[5] is not None]
        print(
            f"{name:22s} n={len(rows):3d}  best/cublas geomean {geomean(best):.3f} "
            f"min {min(best):.3f}   triton-only geomean {geomean(trit):.3f} "
            f"min {min(trit):.3f} max {max(trit):.3f}"
        )

    print("\n== speedup over cuBLAS (latency ratio) ==")
    summary("all shapes", lambda r: True)
    summary("M <= 16", lambda r: r[0] <= 16)
    for m in sorted({r[0] for r in table}):
        summary(f"M = {m}", lambda r, m=m: r[0] == m)
    small = [r for r in table if r[0] <= G.SMALL_M]
    if small:
        fr = [r[6] / (r[4][2] * 1e-3) / 1e9 / bw for r in small]
        print(
            f"M <= 16: best GB/s vs copy bandwidth ({bw:.0f} GB/s): geomean {geomean(fr):.2f} "
            f"min {min(fr):.2f} max {max(fr):.2f}"
        )
    print(f"total {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()

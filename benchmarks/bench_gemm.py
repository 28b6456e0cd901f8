"""GEMM benchmark (issue 3): flashtune's runners and tactics against cuBLAS.

Shapes: the (N, K) of the FlashInfer-Trace gemm definitions with M in
{1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096}, plus [M, 4096] x [4096, 11008] for
M in {1, 17, 32, 256, 512} and [1, 8192] x [8192, 1024]. C = A @ B.T, B [N, K], bf16.

For each shape: cuBLAS (torch) and every pruned tactic of the Triton runners, timed with
flashtune.timing.measure (cold L2 by rotating input copies, CUDA graphs of many calls so
that microsecond kernels are not timed as host launch overhead). Each candidate's output is
checked against cuBLAS before it may win.

Selection is not measurement: the fastest of N noisy timings is biased low, and "best
including cuBLAS" is >= 1.0x cuBLAS by construction. So each shape's picks (cuBLAS, the best
candidate including cuBLAS, the best Triton tactic) are then re-timed on fresh inputs (new
random tensors from another seed, new cold-L2 copies) in a fresh process started by the
selecting one (`--picks FILE`, common.Selection); the published figures are the re-measured
ones, and the summary shows both, Triton-only beside best-including-cuBLAS.

Writes rows to benchmarks/results/gemm.jsonl (cuBLAS, best flashtune, best Triton per shape;
"measurement": "selection" or "remeasured", the latter's labels ending in _remeasured),
every candidate's timing to $OUT/gemm_candidates.jsonl, the picks per shape to
$OUT/gemm_best_tactics.json, and prints geomean tables.
Usage: python benchmarks/bench_gemm.py [--budget-s 300] [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GEMM_CORPUS_M as CORPUS_M  # noqa: E402
from common import GEMM_CORPUS_NK as CORPUS_NK  # noqa: E402
from common import GEMM_EXTRA_MNK as EXTRA  # noqa: E402
from common import RowWriter, Selection, copy_bandwidth_gbs  # noqa: E402

from flashtune.ops import gemm as G  # noqa: E402
from flashtune.ops.gemm import launch as L  # noqa: E402
from flashtune.ops.gemm.config import SMALL_M  # noqa: E402
from flashtune.timing import copies_for_cold_l2, measure  # noqa: E402
from flashtune.tune import TunableRunner  # noqa: E402

PEAK_TFLOPS = 790.0  # H100 SXM dense bf16
DTYPE = torch.bfloat16
CUBLAS = "CublasRunner"
REMEASURE_SEED = 20261121  # fresh inputs: not the selection pass's default-seeded draw

Pick = tuple[str, object, float]  # (runner name, tactic, latency ms)


def shapes(quick: bool) -> list[tuple[int, int, int]]:
    out = [(m, n, k) for n, k in CORPUS_NK for m in CORPUS_M] + EXTRA
    if quick:
        out = [s for s in out if s[1] in (4096, 128, 57344, 11008, 1024)]
    # Decode shapes first: they carry the target that needs a real kernel win.
    return sorted(dict.fromkeys(out), key=lambda s: (s[0] > SMALL_M, s[0], s[1], s[2]))


def candidates(M: int, N: int, K: int, dev: torch.device) -> list[tuple[TunableRunner, object]]:
    A = torch.empty((M, K), device="meta", dtype=DTYPE)
    B = torch.empty((N, K), device="meta", dtype=DTYPE)
    out: list[tuple[TunableRunner, object]] = []
    for runner in (L.TritonSmallMRunner(), L.TritonTiledRunner()):
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
    seen: dict[tuple, tuple[TunableRunner, object]] = {}
    for M, N, K in all_shapes:
        for runner, t in candidates(M, N, K, dev):
            # split_k is a runtime argument: configs that differ only in it share a binary.
            key = (runner.name, tuple(x for i, x in enumerate(t) if not _is_split(runner, i)))
            seen.setdefault(key, (runner, t))
    A = torch.randn(16, 1024, device=dev, dtype=DTYPE)
    B = torch.randn(64, 1024, device=dev, dtype=DTYPE)

    def job(item: tuple[TunableRunner, object]) -> None:
        runner, t = item
        runner.forward([A, B, None], t)

    start = time.perf_counter()
    L.split_k_counters(dev, 1)  # allocate once, outside the threads
    with cf.ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        list(pool.map(job, seen.values()))
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _is_split(runner: TunableRunner, index: int) -> bool:
    return index == (4 if isinstance(runner, L.TritonTiledRunner) else 3)


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


def _inputs(M: int, N: int, K: int, dev: torch.device, generator: torch.Generator | None = None):
    A = torch.randn(M, K, device=dev, dtype=DTYPE, generator=generator)
    B = torch.randn(N, K, device=dev, dtype=DTYPE, generator=generator) * 0.05
    copies = copies_for_cold_l2([A, B], dev)
    sets = [[A, B]] + [[A.clone(), B.clone()] for _ in range(copies - 1)]
    ref = L.CublasRunner().forward([A, B, None]).float()
    tol = 2e-2 * ref.abs().max().item() + 1e-2
    return A, B, sets, ref, tol


def bench_shape(M, N, K, dev, cand_file):
    A, B, sets, ref, tol = _inputs(M, N, K, dev)
    cublas = L.CublasRunner()

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


def select(results: list[Pick]) -> dict[str, Pick]:
    """One shape's picks from its selection pass: cuBLAS, the best candidate including
    cuBLAS, and the best Triton tactic (absent when none ran correctly)."""
    cublas = next(r for r in results if r[0] == CUBLAS)
    picks = {"cublas": cublas, "best": min(results, key=lambda r: r[2])}
    triton = [r for r in results if r[0] != CUBLAS]
    if triton:
        picks["triton"] = min(triton, key=lambda r: r[2])
    return picks


def _runner_fn(name: str, tactic: object) -> Callable[..., torch.Tensor]:
    runners = (L.CublasRunner(), L.TritonSmallMRunner(), L.TritonTiledRunner())
    runner = next(r for r in runners if r.name == name)
    if name == CUBLAS:
        return lambda a, b: runner.forward([a, b, None])
    return lambda a, b: runner.forward([a, b, None], tactic)


def remeasure(
    M: int,
    N: int,
    K: int,
    dev: torch.device,
    picks: dict[str, Pick],
    est_ms: float,
    seed: int = REMEASURE_SEED,
    timer: Callable[..., float] | None = None,
) -> dict[str, float | None]:
    """Re-time each pick on fresh inputs (new random tensors from `seed`, new cold-L2
    copies): label -> latency ms, the same for picks that are the same (runner, tactic), so
    a cuBLAS winner's re-measured ratio is exactly 1. None: the pick's output is wrong on
    the fresh inputs (it is then reported, never published)."""
    timer = timer or time_fn
    gen = torch.Generator(device=dev).manual_seed(seed)
    A, B, sets, ref, tol = _inputs(M, N, K, dev, gen)
    timed: dict[tuple[str, str], float | None] = {}
    out: dict[str, float | None] = {}
    # cuBLAS first, then the others in a fixed order: each ratio is taken within one pass.
    for label in sorted(picks, key=lambda k: k != "cublas"):
        name, tactic, _ = picks[label]
        key = (name, repr(tactic))
        if key not in timed:
            fn = _runner_fn(name, tactic)
            err = (fn(A, B).float() - ref).abs().max().item()
            if err <= tol:
                timed[key] = timer(fn, sets, est_ms)
            else:
                print(f"  WRONG on fresh inputs {name} {tactic} M={M} N={N} K={K}: err {err:.3g}")
                timed[key] = None
        out[label] = timed[key]
    del sets, A, B, ref
    return out


@dataclass
class ShapeResult:
    """One shape: its picks from the selection pass and their re-measured latencies."""

    M: int
    N: int
    K: int
    picks: dict[str, Pick]
    remeasured: dict[str, float | None] = field(default_factory=dict)

    def ratio(self, label: str, measurement: str) -> float | None:
        """cuBLAS latency / the pick's latency, both from `measurement`'s pass."""
        if label not in self.picks:
            return None
        if measurement == "selection":
            return self.picks["cublas"][2] / self.picks[label][2]
        cub, ms = self.remeasured.get("cublas"), self.remeasured.get(label)
        return cub / ms if cub and ms else None


def summary_lines(table: list[ShapeResult]) -> list[str]:
    """Speedup over cuBLAS per group of shapes: Triton-only beside best-including-cuBLAS,
    each as selected and as re-measured on fresh inputs (the published figure)."""

    def stats(values: list[float | None], with_max: bool) -> str:
        vals = [v for v in values if v is not None]
        if not vals:
            return "n/a".ljust(28 if with_max else 21)
        text = f"{geomean(vals):.3f} min {min(vals):.3f}"
        return text + (f" max {max(vals):.3f}" if with_max else "")

    groups: list[tuple[str, Callable[[ShapeResult], bool]]] = [
        ("all shapes", lambda r: True),
        ("M <= 16", lambda r: r.M <= 16),
    ]
    groups += [(f"M = {m}", lambda r, m=m: r.M == m) for m in sorted({r.M for r in table})]
    lines = [
        "speedup over cuBLAS (cuBLAS latency / latency), geomean / min [/ max]; selection = "
        "the best-of-N pass that picked the winners (biased up; best-incl-cuBLAS >= 1 by "
        "construction), re-measured = the picks re-timed on fresh inputs (published)",
        f"{'shapes':14s} {'n':>4s}  {'best incl. cuBLAS: selection':28s} {'re-measured':21s}  "
        f"{'Triton only: selection':28s} re-measured",
    ]
    for name, sel in groups:
        rows = [r for r in table if sel(r)]
        if not rows:
            continue
        wrong = len(
            {
                (r.M, r.N, r.K, r.picks[k][0], repr(r.picks[k][1]))
                for r in rows
                for k in r.picks
                if r.remeasured and r.remeasured.get(k) is None
            }
        )
        best_sel = stats([r.ratio("best", "selection") for r in rows], False)
        best_re = stats([r.ratio("best", "remeasured") for r in rows], False)
        tri_sel = stats([r.ratio("triton", "selection") for r in rows], True)
        tri_re = stats([r.ratio("triton", "remeasured") for r in rows], True)
        lines.append(
            f"{name:14s} {len(rows):4d}  {best_sel:28s} {best_re:21s}  {tri_sel:28s} {tri_re}"
            + (f"  ({wrong} pick(s) wrong on fresh inputs: excluded)" if wrong else "")
        )
    return lines


def custom_op_overhead(dev: torch.device) -> dict[str, float]:
    """Host time per call (us) of mm eager vs through the torch custom op, tiny shape."""
    A = torch.randn(1, 256, device=dev, dtype=DTYPE)
    B = torch.randn(256, 256, device=dev, dtype=DTYPE)
    small = L.TritonSmallMRunner()
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
    ap.add_argument("--picks", help=argparse.SUPPRESS)  # set by Selection's second process
    args = ap.parse_args()
    sel = Selection(args.picks, sweep=True)
    dev = torch.device("cuda")
    start = time.perf_counter()
    out_dir = Path(os.environ.get("OUT", "/tmp"))
    all_shapes = shapes(args.quick)
    print(f"{len(all_shapes)} shapes on {torch.cuda.get_device_name()}", flush=True)
    if sel.selecting:
        select_all(all_shapes, dev, args.budget_s, start, out_dir, sel)
        sel.measure_in_fresh_process(__file__)
        return
    table = measure_all(dev, sel, out_dir)
    print(f"total (measurement process) {time.perf_counter() - start:.0f}s")
    print("\n== speedup over cuBLAS ==")
    for line in summary_lines(table):
        print(line)


def select_all(
    all_shapes: list[tuple[int, int, int]],
    dev: torch.device,
    budget_s: float,
    start: float,
    out_dir: Path,
    sel: Selection,
) -> None:
    """The selection process: every candidate of every shape timed (to
    $OUT/gemm_candidates.jsonl), each shape's picks recorded in `sel`; no result row."""
    print(f"precompile: {precompile(dev, all_shapes):.1f}s", flush=True)
    with open(out_dir / "gemm_candidates.jsonl", "w") as cand_file:
        for M, N, K in all_shapes:
            if time.perf_counter() - start > budget_s:
                print(f"budget reached: stopping before M={M} N={N} K={K}")
                break
            picks = select(bench_shape(M, N, K, dev, cand_file))
            sel.record(f"{M},{N},{K}", json.dumps(picks), picks["cublas"][2])
            best = picks["best"]
            print(
                f"M={M:5d} N={N:6d} K={K:6d} cublas {picks['cublas'][2] * 1e3:9.1f}us  "
                f"best {best[0]:18s} {best[2] * 1e3:9.1f}us (selection)",
                flush=True,
            )


def _picks_of(key: str, sel: Selection, dev: torch.device) -> ShapeResult:
    """One shape's picks as the selection process recorded them, with live tactic objects."""
    M, N, K = (int(v) for v in key.split(","))
    recorded = json.loads(sel.picks[key]["tactic"])
    live = {json.dumps(t): t for _, t in candidates(M, N, K, dev)}
    picks: dict[str, Pick] = {}
    for label, (name, tactic, ms) in recorded.items():
        if name != CUBLAS and json.dumps(tactic) not in live:
            raise KeyError(f"{key}: tactic {tactic} of {name} is not valid in this process")
        picks[label] = (name, live.get(json.dumps(tactic), tactic), ms)
    return ShapeResult(M, N, K, picks)


def measure_all(dev: torch.device, sel: Selection, out_dir: Path) -> list[ShapeResult]:
    """The measuring process: each shape's picks re-timed on fresh inputs; rows written."""
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
    best_tactics: dict[str, dict] = {}
    table: list[ShapeResult] = []
    for key in sel.picks:
        result = _picks_of(key, sel, dev)
        M, N, K = result.M, result.N, result.K
        result.remeasured = remeasure(M, N, K, dev, result.picks, result.picks["cublas"][2])
        table.append(result)
        write_rows(writer, result, bw)
        best_tactics[key] = {
            label: {
                "runner": name,
                "tactic": tactic,
                "selection_ms": ms,
                "remeasured_ms": result.remeasured.get(label),
            }
            for label, (name, tactic, ms) in result.picks.items()
        }
        best = result.picks["best"]
        gb = ""
        if M <= SMALL_M and result.remeasured.get("best"):
            nbytes = 2.0 * (M * K + N * K + M * N)
            gb = f" {nbytes / (result.remeasured['best'] * 1e-3) / 1e9:6.0f} GB/s"
        print(
            f"M={M:5d} N={N:6d} K={K:6d} cublas {result.picks['cublas'][2] * 1e3:9.1f}us  "
            f"best {best[0]:18s} {best[2] * 1e3:9.1f}us x{_x(result.ratio('best', 'selection'))} "
            f"re-measured x{_x(result.ratio('best', 'remeasured'))}  "
            f"triton x{_x(result.ratio('triton', 'selection'))} "
            f"re-measured x{_x(result.ratio('triton', 'remeasured'))}{gb}",
            flush=True,
        )
    (out_dir / "gemm_best_tactics.json").write_text(json.dumps(best_tactics, indent=1))
    small = [
        (2.0 * (r.M * r.K + r.N * r.K + r.M * r.N), r.remeasured.get("best"))
        for r in table
        if r.M <= SMALL_M
    ]
    fr = [nbytes / (ms * 1e-3) / 1e9 / bw for nbytes, ms in small if ms]
    if fr:
        print(
            f"M <= 16: best (re-measured) GB/s vs copy bandwidth ({bw:.0f} GB/s): geomean "
            f"{geomean(fr):.2f} min {min(fr):.2f} max {max(fr):.2f}"
        )
    return table


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


_LABELS = {"cublas": "cublas", "best": "flashtune_best", "triton": "flashtune_triton_best"}


def write_rows(writer: RowWriter, r: ShapeResult, bw: float) -> None:
    """Rows of one shape: each pick as selected and, labelled *_remeasured, as re-measured
    on fresh inputs (a pick wrong there gets no re-measured row)."""
    flops = 2.0 * r.M * r.N * r.K
    nbytes = 2.0 * (r.M * r.K + r.N * r.K + r.M * r.N)
    for measurement in ("selection", "remeasured"):
        for key, (name, tactic, selected_ms) in r.picks.items():
            ms = selected_ms if measurement == "selection" else r.remeasured.get(key)
            vs = r.ratio(key, measurement)
            if ms is None or vs is None:
                continue
            gbs = nbytes / (ms * 1e-3) / 1e9
            extra = {"gbs": gbs, "gbs_vs_copy": gbs / bw} if r.M <= SMALL_M else {}
            suffix = "_remeasured" if measurement == "remeasured" else ""
            writer.write(
                "gemm",
                {"M": r.M, "N": r.N, "K": r.K},
                f"{_LABELS[key]}{suffix}:{name}:{tactic}",
                ms,
                dtype="bfloat16",
                runner=name,
                tactic=tactic,
                measurement=measurement,
                tflops=flops / (ms * 1e-3) / 1e12,
                tflops_vs_peak=flops / (ms * 1e-3) / 1e12 / PEAK_TFLOPS,
                vs_cublas=vs,
                **extra,
            )


if __name__ == "__main__":
    main()

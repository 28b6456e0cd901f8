"""Sampling benchmark (issue 16): flashtune's sorting-free sampling vs FlashInfer and torch's
sort-based sampling.

Ops: top-p (0.9), top-k (50), min-p (0.1), joint top-k/top-p (50, 0.9) and top-k-first
top-k/top-p (FlashInfer's default order, the corpus Definitions'), per-row parameters as
device tensors (as serving engines pass them). Shapes: batch {1, 16, 64, 256} x vocab
{128256, 151936, 262208}, fp32 probabilities drawn as softmax(s * randn) for s in
DISTRIBUTIONS (3: flat, the bundled dataset's synthesis; 8: peaked, LLM-like).

Each solution is first checked (every draw of 20 calls inside the filter's support, from
the sort-based renormalization), then timed with flashtune.timing.measure: cold L2 by
rotating input copies, a CUDA graph of 20 calls when the solution can be captured (torch's
top-k reads k.max() on the host: events). The floor is one read of the probabilities
(batch * vocab * 4 bytes); rows carry the achieved fraction of the measured read bandwidth.
With --sweep, every SamplingRunner tactic is timed and the best re-timed on fresh inputs.

Writes rows to benchmarks/results/sampling.jsonl (and $OUT); prints geomean speedups of
flashtune over FlashInfer and over torch per op and overall.
Usage: python benchmarks/bench_sampling.py [--quick] [--sweep]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter, copy_bandwidth_gbs  # noqa: E402

from flashtune.ops import sampling as S  # noqa: E402
from flashtune.ops import sampling_kernels as K  # noqa: E402
from flashtune.ops.sampling_config import default_tactic  # noqa: E402
from flashtune.timing import CaptureError, measure  # noqa: E402

BATCH = [1, 16, 64, 256]
VOCAB = [128256, 151936, 262208]
DISTRIBUTIONS = [3.0, 8.0]
TOP_K, TOP_P, MIN_P = 50, 0.9, 0.1
OPS = ["top_p", "top_k", "min_p", "joint", "top_k_first"]
MODES = {
    "top_p": K.MODE_TOP_P,
    "top_k": K.MODE_TOP_K,
    "min_p": K.MODE_MIN_P,
    "joint": K.MODE_JOINT,
    "top_k_first": K.MODE_TOP_K_FIRST,
}


def load_flashinfer() -> Any:
    try:
        import flashinfer.sampling

        return flashinfer
    except Exception as exc:  # broad on purpose: the peer is optional
        print(f"flashinfer unavailable: {type(exc).__name__}: {str(exc)[:200]}")
        return None


def make_args(batch: int, vocab: int, scale: float) -> list[torch.Tensor]:
    probs = torch.softmax(torch.randn(batch, vocab, device="cuda") * scale, dim=-1)
    k = torch.full((batch,), TOP_K, dtype=torch.int32, device="cuda")
    p = torch.full((batch,), TOP_P, device="cuda")
    m = torch.full((batch,), MIN_P, device="cuda")
    return [probs, k, p, m]


def solutions(op: str, fi: Any) -> dict[str, Callable[..., torch.Tensor]]:
    """op -> {solution: fn(probs, top_k, top_p, min_p)}."""
    flashtune = {
        "top_p": lambda pr, k, p, m: S.top_p_sampling_from_probs(pr, p),
        "top_k": lambda pr, k, p, m: S.top_k_sampling_from_probs(pr, k),
        "min_p": lambda pr, k, p, m: S.min_p_sampling_from_probs(pr, m),
        "joint": lambda pr, k, p, m: S.top_k_top_p_sampling_from_probs(
            pr, k, p, filter_apply_order="joint"
        ),
        "top_k_first": lambda pr, k, p, m: S.top_k_top_p_sampling_from_probs(pr, k, p),
    }
    torch_sorted = {
        "top_p": lambda pr, k, p, m: S.top_p_sampling_from_probs_ref(pr, p),
        "top_k": lambda pr, k, p, m: S.top_k_sampling_from_probs_ref(pr, k),
        "min_p": lambda pr, k, p, m: S.min_p_sampling_from_probs_ref(pr, m),
        "joint": lambda pr, k, p, m: S.top_k_top_p_joint_sampling_from_probs_ref(pr, k, p),
        "top_k_first": lambda pr, k, p, m: S.top_k_top_p_sampling_from_probs_ref(pr, k, p),
    }
    out = {"flashtune": flashtune[op], "torch": torch_sorted[op]}
    if fi is not None:
        fs = fi.sampling
        out["flashinfer"] = {
            "top_p": lambda pr, k, p, m: fs.top_p_sampling_from_probs(pr, p),
            "top_k": lambda pr, k, p, m: fs.top_k_sampling_from_probs(pr, k),
            "min_p": lambda pr, k, p, m: fs.min_p_sampling_from_probs(pr, m),
            "joint": lambda pr, k, p, m: fs.top_k_top_p_sampling_from_probs(
                pr, k, p, filter_apply_order="joint"
            ),
            "top_k_first": lambda pr, k, p, m: fs.top_k_top_p_sampling_from_probs(pr, k, p),
        }[op]
    return out


def support(op: str, args: list[torch.Tensor]) -> torch.Tensor:
    """[batch, vocab] bool: the tokens the filter keeps (sort-based references)."""
    probs, k, p, m = args
    if op == "top_p":
        return S.top_p_renorm_probs_ref(probs, p) > 0
    if op == "top_k":
        return S.top_k_renorm_probs_ref(probs, k) > 0
    if op == "min_p":
        return probs >= m[:, None] * probs.amax(dim=-1, keepdim=True)
    if op == "joint":
        return (S.top_k_renorm_probs_ref(probs, k) > 0) & (S.top_p_renorm_probs_ref(probs, p) > 0)
    renormed = S.top_k_renorm_probs_ref(probs, k)
    return S.top_p_renorm_probs_ref(renormed, p) > 0


def check(fn: Callable[..., torch.Tensor], args: list[torch.Tensor], allowed: torch.Tensor) -> None:
    for _ in range(20):
        samples = fn(*args).long()
        if not bool(allowed.gather(1, samples[:, None]).all()):
            raise AssertionError("drew a token outside the filter's support")


def time_ms(fn: Callable[..., Any], args: list[Any]) -> tuple[float, str]:
    try:
        t = measure(fn, args, warmup=3, repetitions=30, cold_l2=True, use_cuda_graph=True)
        return t.median_ms, "cuda_graph"
    except CaptureError:
        t = measure(fn, args, warmup=3, repetitions=30, cold_l2=True, use_cuda_graph=False)
        return t.median_ms, "cuda_events"


def sweep(
    op: str, args: list[torch.Tensor], allowed: torch.Tensor, scale: float
) -> tuple[Any, float, dict[str, float]]:
    """Every tactic of the runner: (the best, its latency re-timed on fresh inputs, all)."""
    probs = args[0]
    batch, vocab = probs.shape
    runner = S.SamplingRunner()
    uses_k = op in ("top_k", "joint", "top_k_first")

    def with_tactic(tactic: Any) -> Callable[..., torch.Tensor]:
        def run(pr: torch.Tensor, k: torch.Tensor, p: torch.Tensor, m: torch.Tensor):
            out = torch.empty(batch, dtype=torch.int32, device=pr.device)
            seed = torch.randint(0, 2**62, (1,), device=pr.device)
            param = None if op == "top_k" else (m if op == "min_p" else p)
            inputs = [pr, out, None, seed, k if uses_k else None, param]
            return runner.forward([*inputs, S.SamplingArgs(MODES[op])], tactic)

        return run

    tactics = runner.get_valid_tactics([probs, torch.empty(batch)], None)
    timings: dict[str, float] = {}
    for tactic in tactics:
        check(with_tactic(tactic), args, allowed)
        timings[str(tactic)] = time_ms(with_tactic(tactic), args)[0]
    best = min(tactics, key=lambda t: timings[str(t)])
    # The pick is re-timed on inputs it was not chosen on (a minimum over noisy samples is
    # biased low): the published "tuned" figure is that re-measure.
    return best, time_ms(with_tactic(best), make_args(batch, vocab, scale))[0], timings


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="batch {1, 64}, vocab 128256, one dist")
    ap.add_argument("--sweep", action="store_true", help="also time every flashtune tactic")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {OPS}")
    opts = ap.parse_args()
    batches = [1, 64] if opts.quick else BATCH
    vocabs = [128256] if opts.quick else VOCAB
    dists = DISTRIBUTIONS[:1] if opts.quick else DISTRIBUTIONS
    ops = opts.ops.split(",")
    fi = load_flashinfer()
    bandwidth = copy_bandwidth_gbs()
    print(f"read bandwidth {bandwidth:.0f} GB/s")
    writer = RowWriter("sampling")
    ratios: dict[str, dict[str, list[float]]] = {op: {"flashinfer": [], "torch": []} for op in ops}
    for op in ops:
        for scale in dists:
            for vocab in vocabs:
                for batch in batches:
                    torch.manual_seed(0)
                    args = make_args(batch, vocab, scale)
                    allowed = support(op, args)
                    nbytes = batch * vocab * 4
                    shape = {"batch_size": batch, "vocab_size": vocab, "logit_scale": scale}
                    got: dict[str, float] = {}
                    for name, fn in solutions(op, fi).items():
                        try:
                            check(fn, args, allowed)
                            ms, method = time_ms(fn, args)
                        except Exception as exc:  # a failing peer is recorded, not fatal
                            print(f"{op} {shape} {name}: {type(exc).__name__}: {str(exc)[:200]}")
                            writer.write(op, shape, name, None, error=str(exc)[:300])
                            continue
                        got[name] = ms
                        fraction = nbytes / (ms * 1e-3) / 1e9 / bandwidth
                        extra = {"bytes": nbytes, "timing": method, "hbm_read_fraction": fraction}
                        if name == "flashtune":
                            extra["tactic"] = str(default_tactic(vocab, batch))
                        writer.write(op, shape, name, ms, **extra)
                    if opts.sweep:
                        tactic, ms, timings = sweep(op, args, allowed, scale)
                        writer.write(
                            op,
                            shape,
                            "flashtune_tuned",
                            ms,
                            tactic=str(tactic),
                            sweep_ms=timings,
                            bytes=nbytes,
                        )
                    line = "  ".join(f"{n} {ms * 1e3:8.1f} us" for n, ms in got.items())
                    print(f"{op:12s} s={scale:g} V={vocab:6d} B={batch:4d}  {line}", flush=True)
                    for peer in ("flashinfer", "torch"):
                        if peer in got and "flashtune" in got:
                            ratios[op][peer].append(got[peer] / got["flashtune"])
    print("\ngeomean speedup of flashtune (default tactic):")
    overall: dict[str, list[float]] = {"flashinfer": [], "torch": []}
    for op in ops:
        for peer in ("flashinfer", "torch"):
            overall[peer] += ratios[op][peer]
        print(
            f"  {op:12s} vs flashinfer {geomean(ratios[op]['flashinfer']):.2f}x"
            f"  vs torch {geomean(ratios[op]['torch']):.2f}x"
        )
    for peer, xs in overall.items():
        g = geomean(xs)
        print(f"  overall vs {peer}: {g:.2f}x over {len(xs)} shapes")
        writer.write("summary", {"ops": ops}, f"flashtune_vs_{peer}", None, geomean=g, n=len(xs))


if __name__ == "__main__":
    main()

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
With --tactics, a dozen tactics around the default (one program a row; split rows at several
programs a row, warps and split rounds) are timed, one printed line and row each
("flashtune_tactic"): the table to tune the split defaults from in one GPU call (narrow it
with --ops/--batch/--vocab; each tactic compiles three kernels per op).

Writes rows to benchmarks/results/sampling.jsonl (and $OUT); prints geomean speedups of
flashtune over FlashInfer and over torch per op and overall.
Usage: python benchmarks/bench_sampling.py [--quick] [--sweep] [--tactics] [--ops top_k,...]
       [--batch 1,16] [--vocab 128256] [--scales 3,8]
       python benchmarks/bench_sampling.py --summary COMMIT --ops top_p,top_k,min_p,joint --scales 8
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter, copy_bandwidth_gbs  # noqa: E402

from flashtune import env  # noqa: E402
from flashtune.ops import sampling as S  # noqa: E402
from flashtune.ops.sampling import kernels as K  # noqa: E402
from flashtune.ops.sampling import launch as L  # noqa: E402
from flashtune.ops.sampling import reference as R  # noqa: E402
from flashtune.ops.sampling.config import (  # noqa: E402
    SPLIT_ROUNDS,
    SamplingTactic,
    default_tactic,
)
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
        "top_p": lambda pr, k, p, m: R.top_p_sampling_from_probs_ref(pr, p),
        "top_k": lambda pr, k, p, m: R.top_k_sampling_from_probs_ref(pr, k),
        "min_p": lambda pr, k, p, m: R.min_p_sampling_from_probs_ref(pr, m),
        "joint": lambda pr, k, p, m: R.top_k_top_p_joint_sampling_from_probs_ref(pr, k, p),
        "top_k_first": lambda pr, k, p, m: R.top_k_top_p_sampling_from_probs_ref(pr, k, p),
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
        return R.top_p_renorm_probs_ref(probs, p) > 0
    if op == "top_k":
        return R.top_k_renorm_probs_ref(probs, k) > 0
    if op == "min_p":
        return probs >= m[:, None] * probs.amax(dim=-1, keepdim=True)
    if op == "joint":
        return (R.top_k_renorm_probs_ref(probs, k) > 0) & (R.top_p_renorm_probs_ref(probs, p) > 0)
    renormed = R.top_k_renorm_probs_ref(probs, k)
    return R.top_p_renorm_probs_ref(renormed, p) > 0


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


def with_tactic(op: str, batch: int, tactic: Any) -> Callable[..., torch.Tensor]:
    """fn(probs, top_k, top_p, min_p) running SamplingRunner with `tactic` (a fresh seed a
    call, drawn on the device, as the public functions do)."""
    runner = L.SamplingRunner()
    uses_k = op in ("top_k", "joint", "top_k_first")

    def run(pr: torch.Tensor, k: torch.Tensor, p: torch.Tensor, m: torch.Tensor):
        out = torch.empty(batch, dtype=torch.int32, device=pr.device)
        seed = torch.randint(0, 2**62, (1,), device=pr.device)
        param = None if op == "top_k" else (m if op == "min_p" else p)
        inputs = [pr, out, None, seed, k if uses_k else None, param]
        return runner.forward([*inputs, L.SamplingArgs(MODES[op])], tactic)

    return run


def sweep(
    op: str, args: list[torch.Tensor], allowed: torch.Tensor, scale: float
) -> tuple[Any, float, dict[str, float]]:
    """Every tactic of the runner: (the best, its latency re-timed on fresh inputs, all)."""
    probs = args[0]
    batch, vocab = probs.shape
    tactics = L.SamplingRunner().get_valid_tactics([probs, torch.empty(batch)], None)
    timings: dict[str, float] = {}
    for tactic in tactics:
        check(with_tactic(op, batch, tactic), args, allowed)
        timings[str(tactic)] = time_ms(with_tactic(op, batch, tactic), args)[0]
    best = min(tactics, key=lambda t: timings[str(t)])
    # The pick is re-timed on inputs it was not chosen on (a minimum over noisy samples is
    # biased low): the published "tuned" figure is that re-measure.
    return best, time_ms(with_tactic(op, batch, best), make_args(batch, vocab, scale))[0], timings


def tactic_candidates(vocab: int, batch: int) -> list[SamplingTactic]:
    """A few tactics around the default, to tune from (--tactics): the default and one
    program a row (1024-wide chunks) with and without the scan's prefetch, one program a row
    at 2048; split rows at a quarter to twice the default's programs a row, 4 and 8 warps;
    the default split with 1 to 5 split rounds."""
    default = default_tactic(vocab, batch, split=True)
    chunks = -(-vocab // 1024)
    most = 1 << (chunks - 1).bit_length()  # one chunk a program
    base = default.split if default.split > 1 else max(2, min(most, 256 // max(batch, 1)))
    out = [default, replace(default, prefetch=False), SamplingTactic(1024, 1, 8)]
    out += [SamplingTactic(1024, 1, 8, prefetch=False), SamplingTactic(2048, 1, 8)]
    for split in (base // 4, base // 2, base, base * 2):
        if 2 <= split <= most:
            out += [SamplingTactic(1024, 1, w, split, SPLIT_ROUNDS) for w in (4, 8)]
    for rounds in (1, 2, 5):
        out.append(SamplingTactic(1024, 1, 4, base, rounds))
    if base >= 4:
        out.append(SamplingTactic(2048, 1, 4, base // 2, SPLIT_ROUNDS))
    return list(dict.fromkeys(out))


def time_tactics(
    op: str, args: list[torch.Tensor], allowed: torch.Tensor
) -> dict[SamplingTactic, tuple[float, str]]:
    """tactic -> (latency, timing method) for each of `tactic_candidates`; a failing tactic
    is printed and left out."""
    batch, vocab = args[0].shape
    out = {}
    for tactic in tactic_candidates(vocab, batch):
        fn = with_tactic(op, batch, tactic)
        try:
            check(fn, args, allowed)
            out[tactic] = time_ms(fn, args)
        except Exception as exc:  # one bad tactic must not end the table
            print(f"  {tactic}: {type(exc).__name__}: {str(exc)[:200]}")
    return out


def tactic_label(tactic: SamplingTactic) -> str:
    split = f" split={tactic.split:<3d} rounds={tactic.rounds}" if tactic.split > 1 else ""
    prefetch = "" if tactic.prefetch else " no-prefetch"
    return f"block={tactic.block:<4d} rows={tactic.rows} warps={tactic.num_warps}{split}{prefetch}"


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def print_geomeans(
    ops: list[str], ratios: dict[str, dict[str, list[float]]], excluded: dict[str, int]
) -> dict[str, list[float]]:
    """Print flashtune's geomean speedup per op and overall against each peer (ratios: op ->
    peer -> peer latency / flashtune's, pairs timed alike; excluded: peer -> pairs timed
    differently); returns peer -> every op's ratios."""
    for op in ops:
        shown = {
            peer: f"{geomean(xs):.2f}x" if xs else "n/a (timing differs)"
            for peer, xs in ratios[op].items()
        }
        print(f"  {op:12s} vs flashinfer {shown['flashinfer']}  vs torch {shown['torch']}")
    overall = {peer: [x for op in ops for x in ratios[op][peer]] for peer in excluded}
    for peer, xs in overall.items():
        worst = f", slowest shape {min(xs):.2f}x" if xs else ""
        print(
            f"  overall vs {peer}: {geomean(xs):.2f}x over {len(xs)} shapes timed alike"
            f" ({excluded[peer]} excluded: timing differs){worst}"
        )
    return overall


def summarize_rows(commit: str, ops: list[str], scales: list[float]) -> None:
    """The geomean table of one commit's committed rows (benchmarks/results/sampling.jsonl),
    the grid measured in parts (one vocabulary group per GPU call): per shape the last row of
    each solution, ratios only between rows timed alike, as the live run computes them."""
    import json

    from common import RESULTS

    latest: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for line in (RESULTS / "sampling.jsonl").read_text().splitlines():
        row = json.loads(line)
        shape = row.get("shape") or {}
        if not (row.get("commit") or "").startswith(commit) or row["op"] not in ops:
            continue
        if row.get("latency_ms") is None or shape.get("logit_scale") not in scales:
            continue
        key = (row["op"], json.dumps(shape, sort_keys=True))
        latest.setdefault(key, {})[row["solution"]] = row
    ratios: dict[str, dict[str, list[float]]] = {op: {"flashinfer": [], "torch": []} for op in ops}
    excluded = {"flashinfer": 0, "torch": 0}
    fractions = []
    for (op, _), by_solution in sorted(latest.items()):
        ours = by_solution.get("flashtune")
        if ours is None:
            continue
        fractions.append(ours["hbm_read_fraction"])
        for peer in ("flashinfer", "torch"):
            theirs = by_solution.get(peer)
            if theirs is None:
                continue
            if theirs.get("timing") != ours.get("timing"):
                excluded[peer] += 1
                continue
            ratios[op][peer].append(theirs["latency_ms"] / ours["latency_ms"])
    shapes = sum(1 for (op, _), r in latest.items() if "flashtune" in r)
    print(f"commit {commit}: {shapes} shapes with a flashtune row")
    print_geomeans(ops, ratios, excluded)
    if fractions:
        print(f"  flashtune reads {min(fractions):.1%} to {max(fractions):.1%} of the bandwidth")
    # Per vocabulary vs FlashInfer, then the latency table (us, flashtune / FlashInfer / torch).
    by_vocab: dict[int, list[float]] = {}
    cells: dict[tuple[str, int], dict[int, str]] = {}
    for (op, shape_json), by_solution in latest.items():
        shape = json.loads(shape_json)
        vocab, batch = shape["vocab_size"], shape["batch_size"]
        us = [
            by_solution.get(n, {}).get("latency_ms") for n in ("flashtune", "flashinfer", "torch")
        ]
        cells.setdefault((op, vocab), {})[batch] = " / ".join(
            "-" if x is None else f"{x * 1e3:.0f}" for x in us
        )
        ours, fi = by_solution.get("flashtune"), by_solution.get("flashinfer")
        if ours and fi and ours.get("timing") == fi.get("timing"):
            by_vocab.setdefault(vocab, []).append(fi["latency_ms"] / ours["latency_ms"])
    print(
        "  per vocabulary vs flashinfer: "
        + ", ".join(f"{geomean(xs):.2f}x at {v}" for v, xs in sorted(by_vocab.items()))
    )
    batches = sorted({b for row in cells.values() for b in row})
    print("\n| op | vocab | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in batches) + " |")
    for op in ops:
        for vocab in sorted(v for o, v in cells if o == op):
            row = cells[(op, vocab)]
            print(f"| {op} | {vocab} | " + " | ".join(row.get(b, "-") for b in batches) + " |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="batch {1, 64}, vocab 128256, one dist")
    ap.add_argument("--sweep", action="store_true", help="also time every flashtune tactic")
    ap.add_argument(
        "--tactics",
        action="store_true",
        help="also time a few tactics around the default (split rows, rounds), one line each",
    )
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {OPS}")
    ap.add_argument("--batch", help="comma-separated batch sizes (default: all, or --quick's)")
    ap.add_argument("--vocab", help="comma-separated vocabulary sizes (default: all, or --quick's)")
    ap.add_argument("--scales", help=f"comma-separated logit scales (default: {DISTRIBUTIONS})")
    ap.add_argument(
        "--summary",
        metavar="COMMIT",
        help="no GPU work: the geomeans of COMMIT's committed rows (--ops and --scales apply)",
    )
    opts = ap.parse_args()
    if opts.summary:
        scales = [float(x) for x in opts.scales.split(",")] if opts.scales else DISTRIBUTIONS
        summarize_rows(opts.summary, opts.ops.split(","), scales)
        return
    batches = [1, 64] if opts.quick else BATCH
    vocabs = [128256] if opts.quick else VOCAB
    if opts.batch:
        batches = [int(b) for b in opts.batch.split(",")]
    if opts.vocab:
        vocabs = [int(v) for v in opts.vocab.split(",")]
    dists = DISTRIBUTIONS[:1] if opts.quick else DISTRIBUTIONS
    if opts.scales:
        dists = [float(x) for x in opts.scales.split(",")]
    ops = opts.ops.split(",")
    fi = load_flashinfer()
    bandwidth = copy_bandwidth_gbs()
    print(f"read bandwidth {bandwidth:.0f} GB/s")
    writer = RowWriter("sampling")
    ratios: dict[str, dict[str, list[float]]] = {op: {"flashinfer": [], "torch": []} for op in ops}
    excluded = {"flashinfer": 0, "torch": 0}  # pairs timed by different methods
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
                    how: dict[str, str] = {}  # solution -> timing method
                    for name, fn in solutions(op, fi).items():
                        try:
                            check(fn, args, allowed)
                            ms, method = time_ms(fn, args)
                        except Exception as exc:  # a failing peer is recorded, not fatal
                            print(f"{op} {shape} {name}: {type(exc).__name__}: {str(exc)[:200]}")
                            writer.write(op, shape, name, None, error=str(exc)[:300])
                            continue
                        got[name], how[name] = ms, method
                        fraction = nbytes / (ms * 1e-3) / 1e9 / bandwidth
                        extra = {"bytes": nbytes, "timing": method, "hbm_read_fraction": fraction}
                        if name == "flashtune":
                            extra["tactic"] = str(
                                default_tactic(vocab, batch, split=env.SAMPLING_SPLIT_DEFAULT.get())
                            )
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
                    if opts.tactics:
                        for tactic, (ms, method) in time_tactics(op, args, allowed).items():
                            fraction = nbytes / (ms * 1e-3) / 1e9 / bandwidth
                            writer.write(
                                op,
                                shape,
                                "flashtune_tactic",
                                ms,
                                tactic=str(tactic),
                                bytes=nbytes,
                                timing=method,
                                hbm_read_fraction=fraction,
                            )
                            print(f"    {tactic_label(tactic):48s} {ms * 1e3:8.1f} us", flush=True)
                    for peer in ("flashinfer", "torch"):
                        if peer in got and "flashtune" in got:
                            # Like for like only: torch's top-k syncs with the host (events).
                            if how[peer] != how["flashtune"]:
                                excluded[peer] += 1
                                continue
                            ratios[op][peer].append(got[peer] / got["flashtune"])
    print("\ngeomean speedup of flashtune (default tactic):")
    for peer, xs in print_geomeans(ops, ratios, excluded).items():
        writer.write(
            "summary",
            {"ops": ops},
            f"flashtune_vs_{peer}",
            None,
            geomean=geomean(xs),
            n=len(xs),
            excluded_timing_differs=excluded[peer],
        )


if __name__ == "__main__":
    main()

"""Replay the tuner's GEMM search on the picks of a recorded sweep, without a GPU: for each
shape, would the search as configured today still time the tactic that won there?

    python benchmarks/replay_search.py [--rows benchmarks/results/tune.jsonl] [--run RUN_STARTED]
        [--patience-band 0.08] [--patience 12] [--prune-slack 0.5]

The picks are the op=gemm rows of one `bench_tune.py` sweep (the newest by default; each row
names the commit that measured it). Each shape is replayed leave-one-out: the other shapes'
picks fill the tuner's in-memory cache, so its priors (tune/lookup.py) are what a session
that tuned them first would see; the candidates are ordered and pruned by the library's own
`order_candidates` and the runners' `estimate_cost` (CPU tensors of the same shapes, the
device limits of the stand-in H100). Patience is replayed pessimistically: no tactic before
the winner improves on the best, so every ranked one counts towards it. A winner is *missed*
when prune_slack drops it or patience cuts the list before it. Prints the misses, the
candidates a shape would time, and the winners' estimates relative to their runner's best.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from flashtune.ops.gemm.launch import GEMM_RUNNERS, GEMM_TUNING
from flashtune.tune import AutoTuner
from flashtune.tune.profiling import default_candidates, order_candidates
from flashtune.tune.runner import make_profile


def sweep_picks(rows: Path, run: str | None) -> tuple[str, dict[tuple[int, int, int], tuple]]:
    """(the run, {(M bucket, N, K): (runner name, tactic)}) of one sweep's op=gemm rows."""
    by_run: dict[str, dict[tuple[int, int, int], tuple]] = {}
    for line in rows.read_text().splitlines():
        r = json.loads(line)
        if r.get("op") != "gemm" or ":" not in str(r.get("solution")):
            continue
        name, tactic = r["solution"].split(":", 1)
        s = r["shape"]
        key = (s.get("M_bucket", s["M"]), s["N"], s["K"])
        by_run.setdefault(r.get("run_started") or r.get("date", "")[:13], {})[key] = (
            name,
            ast.literal_eval(tactic),
        )
    if not by_run:
        raise SystemExit(f"{rows}: no op=gemm rows")
    chosen = run or max(by_run)
    if chosen not in by_run:
        raise SystemExit(f"{rows}: no sweep {chosen!r}; there are {sorted(by_run)}")
    return chosen, by_run[chosen]


def replay(picks: dict[tuple[int, int, int], tuple], cfg: Any) -> dict[str, Any]:
    tuner = AutoTuner.get()
    lookup = tuner.lookup
    index = {r.name: i for i, r in enumerate(GEMM_RUNNERS)}
    inputs = {}
    for m, n, k in picks:
        A = torch.empty(m, k, dtype=torch.float16)
        B = torch.empty(n, k, dtype=torch.float16)
        inputs[(m, n, k)] = ([A, B, None], make_profile([A, B, None], cfg))
    misses, timed, relative = [], [], []
    for shape, (winner, tactic) in picks.items():
        lookup.profiling_cache.clear()
        for other, (name, t) in picks.items():
            if other != shape:
                lookup.profiling_cache[("gemm", name, inputs[other][1])] = (name, t)
        args, profile = inputs[shape]
        candidates = [
            (i, t)
            for i, r in enumerate(GEMM_RUNNERS)
            for t in [-1, *r.get_valid_tactics(args, profile)]
        ]
        priors = lookup.priors("gemm", GEMM_RUNNERS, cfg, profile)
        ordered, _, rel = order_candidates(
            GEMM_RUNNERS, candidates, args, profile, cfg, default_candidates(GEMM_RUNNERS), priors
        )
        stale, times, found = 0, 0, False
        for c in ordered:
            cuttable = rel.get(c, 0.0) > 1.0 + cfg.patience_band
            if cfg.patience is not None and stale >= cfg.patience and cuttable:
                continue
            times += 1
            if c == (index[winner], tactic):
                found = True
            elif c in rel:
                stale += 1
        timed.append(times)
        if (index[winner], tactic) in rel:
            relative.append(rel[(index[winner], tactic)])
        if not found and winner != GEMM_RUNNERS[0].name:
            misses.append((shape, winner, tactic))
    lookup.profiling_cache.clear()
    return {
        "shapes": len(picks),
        "triton_winners": sum(w != GEMM_RUNNERS[0].name for w, _ in picks.values()),
        "missed": misses,
        "mean_timed": statistics.mean(timed),
        "max_winner_relative_estimate": max(relative, default=None),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=Path, default=Path(__file__).parent / "results" / "tune.jsonl")
    p.add_argument("--run", help="run_started of the sweep (default: the newest)")
    p.add_argument("--patience", type=int, default=GEMM_TUNING.patience)
    p.add_argument("--patience-band", type=float, default=GEMM_TUNING.patience_band)
    p.add_argument("--prune-slack", type=float, default=GEMM_TUNING.prune_slack)
    args = p.parse_args()
    run, picks = sweep_picks(args.rows, args.run)
    cfg = dataclasses.replace(
        GEMM_TUNING,
        patience=args.patience,
        patience_band=args.patience_band,
        prune_slack=args.prune_slack,
    )
    out = replay(picks, cfg)
    print(f"sweep {run}: {out['shapes']} shapes, {out['triton_winners']} Triton winners")
    for shape, name, tactic in out["missed"]:
        print(f"  missed {shape}: {name}:{tactic}")
    print(
        f"missed {len(out['missed'])}; candidates timed a shape: {out['mean_timed']:.1f} "
        f"(mean); winners' estimate / their runner's best: max {out['max_winner_relative_estimate']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

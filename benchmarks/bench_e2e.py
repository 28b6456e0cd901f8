"""End to end (issue 19): a Llama decoder's decode step and prefill on four backends (GPU).

    python benchmarks/bench_e2e.py --layers 4             # Llama-3.1-8B shapes, 4 layers
    python benchmarks/bench_e2e.py --layers 4 --quick     # a smaller grid
    python benchmarks/bench_e2e.py --loop --dataset DIR   # capture -> run -> apply -> again
    python benchmarks/bench_e2e.py --config tiny --device cpu --backends torch,flashtune
                                                          # the code path on CPU (interpreter)

`flashtune e2e` with the same flags; this script is its benchmarks/ form, writing rows
through benchmarks/common.RowWriter (results/e2e.jsonl, and $OUT on the GPU machine). What
is measured and how: flashtune.models.bench (the grid), flashtune.cli.e2e (the loop).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter  # noqa: E402

from flashtune.cli.e2e import run_loop_command  # noqa: E402
from flashtune.models import CONFIGS  # noqa: E402
from flashtune.models.bench import (  # noqa: E402
    DEFAULT_COMPILE_MODE,
    DTYPES,
    E2E_BACKENDS,
    MAX_KV_TOKENS,
    E2EOptions,
    NoRows,
    RowSink,
    device_problem,
    run_e2e,
)


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(part) for part in text.split(",") if part]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]) if __doc__ else None,
    )
    parser.add_argument("--config", default="llama-3.1-8b", choices=sorted(CONFIGS))
    parser.add_argument("--layers", type=int, default=0, help="keep this many layers (0: all)")
    parser.add_argument("--quick", action="store_true", help="the small grid")
    parser.add_argument(
        "--backends",
        type=_csv(str),
        default=list(E2E_BACKENDS),
        help=f"comma-separated, of {','.join(E2E_BACKENDS)}",
    )
    parser.add_argument("--batches", type=_csv(int), help="decode batch sizes (override)")
    parser.add_argument("--kv-lens", type=_csv(int), help="decode KV lengths (override)")
    parser.add_argument("--max-kv-tokens", type=int, default=MAX_KV_TOKENS)
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument(
        "--compile-mode",
        default=DEFAULT_COMPILE_MODE,
        help="torch.compile mode of the torch_compile backend",
    )
    parser.add_argument(
        "--no-tune",
        dest="tune",
        action="store_false",
        help="flashtune: default tactics, no autotuning",
    )
    parser.add_argument("--tune-cache", help="flashtune autotuner cache file (load and save)")
    parser.add_argument(
        "--tune-budget",
        dest="tune_budget_s",
        type=float,
        help="seconds of tuning per shape bucket (autotune(budget_s=...)); default: no limit",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        help="cuda; cpu checks the code path (tiny config, Triton interpreter) and writes no rows",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--repetitions", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--loop",
        action="store_true",
        help="issue 19's loop instead of the grid: capture into --dataset, benchmark the "
        "captured workloads, enable_apply, run again",
    )
    parser.add_argument("--dataset", help="the loop's dataset directory (created)")
    parser.add_argument("--decode-steps", type=int, default=8, help="the loop's decode steps")
    args = parser.parse_args(argv)
    unknown = set(args.backends) - set(E2E_BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; choose from {', '.join(E2E_BACKENDS)}")
    if "torch" in args.backends:  # the reference every other backend is checked against
        args.backends = ["torch"] + [b for b in args.backends if b != "torch"]
    return args


def options_of(args: argparse.Namespace) -> E2EOptions:
    """The benchmark's options from the parsed flags (lists as tuples)."""
    values = {f.name: getattr(args, f.name) for f in fields(E2EOptions)}
    for name in ("backends", "batches", "kv_lens"):
        values[name] = tuple(values[name]) if values[name] is not None else None
    return E2EOptions(**values)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    problem = device_problem(args.device, args.loop)
    if problem is not None:
        print(f"bench_e2e: {problem}")
        return 1
    options = options_of(args)
    rows: RowSink = RowWriter("e2e") if args.device.startswith("cuda") else NoRows()
    if args.loop:
        if not args.dataset:
            print("--loop needs --dataset DIR")
            return 1
        report = run_loop_command(options, Path(args.dataset), args.decode_steps, rows, print)
        return 0 if report.same_tokens else 1
    run_e2e(options, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Apply dispatch overhead on CPU: what a call pays for being routed to its winning solution.

Per-call cost (microseconds, median over repetitions of 2,000-call loops) of
- a schema'd op answered by apply (the hook's cached plan) vs calling the solution directly;
- a schema'd op apply does not cover (miss -> the op's own path) vs the op without apply;
- `flashtune.apply(name, kwargs)` and the `@apply` decorator vs the solution directly.
Target (issue 7): dispatch <= 10 us median per call.

    python benchmarks/bench_apply.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "capture"))

from _capture_toys import toy_norm  # noqa: E402
from common import RowWriter  # noqa: E402

from flashtune.apply import apply, enable_apply, load_solution  # noqa: E402
from flashtune.apply.table import current_environment  # noqa: E402
from flashtune.bench.build import solution_hash  # noqa: E402
from flashtune.data import Dataset, Solution, Trace  # noqa: E402
from flashtune.data.signing import sign_trace  # noqa: E402
from flashtune.timing import measure  # noqa: E402

LOOP = 2000
# The solution does (almost) nothing, so the numbers are dispatch cost, not compute.
SOURCE = "def run(hidden_states, weight):\n    return hidden_states\n"


def per_call_us(fn, *args) -> float:
    def loop(*a):
        for _ in range(LOOP):
            fn(*a)

    t = measure(loop, list(args), warmup=3, repetitions=15, cold_l2=False)
    return t.median_ms * 1e3 / LOOP


def main() -> None:
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-apply-"))
    ds = Dataset(root)
    x, w = torch.randn(4, 64), torch.randn(64)
    ds.add_definition(toy_norm.definition(x, w))
    name = "toy_norm_h64"
    sol = Solution.model_validate(
        {
            "name": "identity",
            "definition": name,
            "author": "bench",
            "spec": {"language": "python", "entry_point": "main.py::run"},
            "sources": [{"path": "main.py", "content": SOURCE}],
        }
    )
    ds.add_solution(sol)
    # Apply trusts a trace only when it names this solution's content hash, this
    # environment and a correctness record within tolerance (issue 12), and is signed with
    # this user's key (issue 31): stamp and sign it as `flashtune run` would have.
    env = current_environment()
    ds.append_trace(
        sign_trace(
            Trace.model_validate(
                {
                    "definition": name,
                    "solution": "identity",
                    "workload": {"uuid": "w", "axes": {"batch_size": 4}, "inputs": {}},
                    "evaluation": {
                        "status": "PASSED",
                        "timestamp": "2026-01-01T00:00:00+00:00",
                        "environment": {**env, "hardware": env["hardware"][0]},
                        "solution_hash": solution_hash(sol),
                        "correctness": {
                            "max_absolute_error": 0.0,
                            "max_relative_error": 0.0,
                            "matched_ratio": 1.0,
                        },
                        "performance": {"latency_ms": 0.001},
                    },
                }
            )
        ),
        author="bench",
    )
    direct = load_solution(sol)
    base_sol = per_call_us(direct, x, w)
    base_op = per_call_us(toy_norm, x, w)
    x_miss, w_miss = torch.randn(4, 32), torch.randn(32)
    base_miss = per_call_us(toy_norm, x_miss, w_miss)
    with enable_apply(dataset=root) as handle:
        hit = per_call_us(toy_norm, x, w)
        miss = per_call_us(toy_norm, x_miss, w_miss)
        assert handle.hook.hits > 0 and handle.hook.misses > 0
    fn_form = per_call_us(
        lambda a, b: apply(name, {"hidden_states": a, "weight": b}, dataset=root), x, w
    )

    @apply(name, dataset=root)
    def decorated(hidden_states, weight):
        raise AssertionError("the solution should answer")

    deco = per_call_us(decorated, x, w)
    rows = [
        ("op call -> solution (hook, cached plan)", hit, hit - base_sol),
        ("op call, not in table (hook miss -> op)", miss, miss - base_miss),
        ("apply(name, kwargs)", fn_form, fn_form - base_sol),
        ("@apply decorator", deco, deco - base_sol),
    ]
    writer = RowWriter("apply")
    print(
        f"baseline: solution called directly {base_sol:.2f} us, op without apply {base_op:.2f} us"
    )
    print(f"{'path':45s} {'per call us':>12s} {'overhead us':>12s}")
    for label, total, overhead in rows:
        print(f"{label:45s} {total:12.2f} {overhead:12.2f}")
        writer.write(
            "apply_dispatch",
            {"batch_size": 4, "hidden_size": 64},
            label,
            total / 1e3,
            overhead_us=round(overhead, 3),
            target_us=10.0,
            device="cpu",
        )


if __name__ == "__main__":
    main()

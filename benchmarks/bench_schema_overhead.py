"""What the @api wrapper costs per call with every hook off (dump, capture, apply): CPU.

    python benchmarks/bench_schema_overhead.py

Moved out of the unit tests (a wall-clock threshold there failed under load: 2.48 us against
1 us on a shared 2-core machine). Interleaved, best of 15 rounds of 5000 calls: other
processes only add time, so the minimum is the figure.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import RowWriter  # noqa: E402

from flashtune.ops.norm import rmsnorm  # noqa: E402
from flashtune.schema.api import refresh_hooks  # noqa: E402


def per_call_us(fn, args, n: int = 5000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    refresh_hooks()
    x, w = torch.randn(2, 64), torch.randn(64)
    wrapped, plain = [], []
    for _ in range(15):
        wrapped.append(per_call_us(rmsnorm, (x, w)))
        plain.append(per_call_us(rmsnorm.fn, (x, w)))
    overhead = min(wrapped) - min(plain)
    print(
        f"rmsnorm (CPU path): {min(plain):.2f} us plain, {min(wrapped):.2f} us wrapped, "
        f"overhead {overhead:.2f} us per call (target < 1 us)"
    )
    RowWriter("schema_overhead").write(
        "api_wrapper_hooks_off",
        {"rounds": 15, "calls": 5000},
        "rmsnorm",
        min(wrapped) / 1e3,
        plain_us=min(plain),
        overhead_us=overhead,
    )


if __name__ == "__main__":
    main()

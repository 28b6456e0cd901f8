"""A test-only CPU timing policy for tests that run the benchmark harness for what it records
(statuses, traces, files, the loop's structure), not for how precisely it times.

BenchConfig's CPU defaults sample each solution until its median's 95% interval is within
5%, for up to `spread_seconds` (1 s) a triple and `reference_spread_seconds` (0.5 s) a
reference; on a busy two-core machine the 5% is rarely reached, so every PASSED triple costs
the whole budget. Tests get a smaller budget (tests/conftest.py, for every test): still at least
`iterations` checked samples, the same checks on every sample and call, the same ±5% target
and interval stated; the library's defaults are unchanged, and any field a test sets itself
is kept (tests of the spread rule itself set theirs or call the evaluator directly).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

# Only where the config still has the library's default.
CHEAP_CPU_TIMING: dict[str, float] = {"spread_seconds": 0.2, "reference_spread_seconds": 0.1}


@contextmanager
def cheap_cpu_timing() -> Iterator[None]:
    """Every in-process benchmark run (run_benchmark, `flashtune run` through CliRunner, the
    e2e loop) gets CHEAP_CPU_TIMING while the context is open."""
    from flashtune.bench import runner
    from flashtune.bench.config import BenchConfig

    default = BenchConfig()
    run = runner._run

    def cheaper(opts: Any, *args: Any, **kwargs: Any) -> Any:
        cfg = opts.config
        cheap = {
            k: v for k, v in CHEAP_CPU_TIMING.items() if getattr(cfg, k) == getattr(default, k)
        }
        return run(replace(opts, config=replace(cfg, **cheap)), *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "_run", cheaper)
        yield

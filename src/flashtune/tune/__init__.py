"""Autotuner: runners, tactics, shape buckets, profiling and a persistent config cache.

`choose_one` is what ops call to pick (runner, tactic) for their inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flashtune.tune.runner import (
    DEFAULT_TACTIC,
    DynamicDim,
    Tactic,
    TunableRunner,
    TuningConfig,
    pow2_buckets,
)

__all__ = [
    "DEFAULT_TACTIC",
    "DynamicDim",
    "Tactic",
    "TunableRunner",
    "TuningConfig",
    "pow2_buckets",
    "choose_one",
]


def choose_one(
    op_name: str,
    runners: Sequence[TunableRunner],
    tuning_config: TuningConfig,
    inputs: Sequence[Any],
) -> tuple[TunableRunner, Tactic]:
    """Pick the (runner, tactic) for `inputs`. Placeholder until the AutoTuner lands:
    the first runner with its default tactic."""
    return runners[0], DEFAULT_TACTIC

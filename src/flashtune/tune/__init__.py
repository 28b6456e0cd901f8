"""Autotuner: runners, tactics, shape buckets, profiling and a persistent config cache.

Ops call `choose_one(op_name, runners, tuning_config, inputs)` to get the (runner, tactic)
to launch; users control tuning with `autotune` and `load_configs`::

    import flashtune

    with flashtune.autotune(cache="h100.json"):   # tune shapes no source covers, save on exit
        model(batch)
    with flashtune.autotune(False, cache="h100.json"):  # later runs: load, never profile
        model(batch)

Lookup priority: in-memory profiling results, then user-loaded files, then configs bundled
in flashtune/tune/configs/ (where GPU and versions match; not while tuning), then the
first runner's default tactic -1. See docs/autotune.md for the file format, several
processes (one cache file per rank, then `flashtune tune merge`) and the CLI.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from flashtune.tune.cache_file import FileRead
from flashtune.tune.runner import (
    DEFAULT_TACTIC,
    DynamicDim,
    Profile,
    Tactic,
    TunableRunner,
    TuningConfig,
    bucket_values,
    pow2_bucketer,
    pow2_buckets,
)
from flashtune.tune.tuner import (
    AutoTuner,
    AutotuneWarning,
    Decision,
    TacticFailure,
    autotune,
    sync_ranks,
)

__all__ = [
    "DEFAULT_TACTIC",
    "AutoTuner",
    "AutotuneWarning",
    "Decision",
    "DynamicDim",
    "FileRead",
    "Profile",
    "Tactic",
    "TacticFailure",
    "TunableRunner",
    "TuningConfig",
    "autotune",
    "bucket_values",
    "choose_one",
    "load_configs",
    "pow2_bucketer",
    "pow2_buckets",
    "sync_ranks",
]


def choose_one(
    op_name: str,
    runners: Sequence[TunableRunner],
    tuning_config: TuningConfig,
    inputs: Sequence[Any],
) -> tuple[TunableRunner, Tactic]:
    """Pick the (runner, tactic) for `inputs`: a memoized dict lookup once the shape has
    been seen; profiles the shape's bucket first when inside `autotune()` and no source
    covers it; otherwise the first runner's default tactic -1."""
    # Straight to the lookup, not through AutoTuner.choose_one: one call frame less per op call.
    return AutoTuner.get().lookup.choose_one(op_name, runners, tuning_config, inputs)


def load_configs(path: str | os.PathLike[str]) -> int:
    """Load a tuned config file into the tuner (consulted before bundled configs and the
    fallback, and also while tuning). Returns how many entries were loaded: 0 (with an
    AutotuneWarning) for a corrupt file or one made on another GPU / software versions.
    Raises FileNotFoundError when `path` does not exist."""
    return len(AutoTuner.get().load_configs(path).entries)

"""Apply: at call time, dispatch each op to the solution its Traces prove fastest and correct.

flashtune.enable_apply(dataset="my-dataset")     # every schema'd op (or FLASHTUNE_APPLY=1)
y = flashtune.apply("gemm_n4096_k4096", {"A": a, "B": b}, fallback=my_gemm)

@flashtune.apply("rmsnorm_h4096")
def my_rmsnorm(hidden_states, weight): ...       # the fallback when no solution fits
"""

from __future__ import annotations

import sys
import types
from typing import Any

from flashtune.apply.adapters import builtin_adapters, enable_adapters, families
from flashtune.apply.patching import ArgBinder, ContextStore, PatchManager
from flashtune.apply.runtime import (
    ApplyHandle,
    ApplyRuntime,
    apply,
    disable_apply,
    enable_apply,
    load_solution,
)
from flashtune.apply.table import ApplyConfig, ApplyTable

__all__ = [
    "ApplyConfig",
    "ApplyHandle",
    "ApplyRuntime",
    "ApplyTable",
    "ArgBinder",
    "ContextStore",
    "PatchManager",
    "apply",
    "builtin_adapters",
    "disable_apply",
    "enable_adapters",
    "enable_apply",
    "load_solution",
]

# The ops' result conventions under apply (a wrapper's run returns `out` unless asked for
# lse; in-place norms and RoPE) are registered by the adapter family modules: load them with
# the package, or enable_apply (and FLASHTUNE_APPLY) would hand back a solution's raw outputs.
families()


class _CallableModule(types.ModuleType):
    """Importing this package sets the attribute `flashtune.apply` to the package itself,
    hiding the lazily exported function of the same name: calling the package calls it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return apply(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

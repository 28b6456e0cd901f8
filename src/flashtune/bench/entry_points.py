"""Entry points of the bundled dataset's solutions (`flashtune.bench.entry_points:<name>`).

Every op family declares its entries (adapters from a Definition's inputs, by name and in
definition order, to flashtune's op, to FlashInfer and to a torch eager baseline) in its own
package (`ops/<family>/bundle.py`, see flashtune.ops.bundle); this module serves them all
under their names, so a bundled solution's source, `from flashtune.bench.entry_points import
flashtune_rmsnorm as run`, keeps its code when an entry moves between modules.

An entry may carry `entry.setup` (a setup phase the harness runs once per input set outside
the timed region: FlashInfer's planned wrappers). Imports are lazy: this module imports on a
machine without FlashInfer or a GPU, and a FlashInfer solution is SKIPPED there by its
declared dependency before it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flashtune.ops.bundle import OWN_PATH_ENTRIES, entry_functions
from flashtune.ops.norm.bundle import RMS_EPS

__all__ = ["OWN_PATH_ENTRIES", "RMS_EPS", "adapted", "entry"]


def entry(name: str) -> Callable[..., Any]:
    """The bundled entry function `name` (AttributeError if no family declares it)."""
    functions = entry_functions()
    if name not in functions:
        raise AttributeError(f"module {__name__!r} has no entry point {name!r}")
    return functions[name]


def adapted(fn: Callable[..., Any], call: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` called through `call(fn, *inputs)`, which maps a dataset definition's inputs onto
    the entry's (a layout adapter, constants as keywords: flashtune.ops.bundle.supply). The
    entry's setup phase comes with it: setup gets the mapped inputs, its runner is called
    through `call` too."""

    def run(*args: Any, **kwargs: Any) -> Any:
        return call(fn, *args, **kwargs)

    setup = getattr(fn, "setup", None)
    if callable(setup):

        def adapted_setup(*args: Any, **kwargs: Any) -> Callable[..., Any]:
            runner = call(setup, *args, **kwargs)
            return lambda *a, **k: call(runner, *a, **k)

        run.setup = adapted_setup  # type: ignore[attr-defined]
    run.__name__ = run.__qualname__ = getattr(fn, "__name__", "run")
    return run


def __getattr__(name: str) -> Any:
    return entry(name)


def __dir__() -> list[str]:
    return sorted([*globals(), *entry_functions()])

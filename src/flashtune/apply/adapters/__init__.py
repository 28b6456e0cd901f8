"""Adapters: route call sites that are not flashtune's schema'd ops (FlashInfer's functions
and plan()/run() wrappers, torch.nn.functional.linear) to the apply table, by patching them.

Each call is described as the call of the flashtune op whose schema covers it, and routed
through that op (`flashtune.apply.runtime.route`): the Definition's name, inputs, var axes
and dtypes all come from the op's schema; nothing here spells a Definition name.

- mirror.py: FlashInfer's functions that flashtune's ops mirror (same name and signature,
  found from the schemas' `fi_api:` tags): generic, nothing per op;
- one module per op family for the rest: its ops' result conventions (in place, `lse`
  buffers) and the peers whose signature differs from the op's (norm.py, rope.py, gemm.py,
  attention.py).

Whatever matches no definition in the table (or uses a feature the op's schema does not
cover) runs the original call unchanged. Schema'd flashtune ops need no adapter: the apply
hook sees them.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
from collections.abc import Iterable
from types import ModuleType

from flashtune.apply.adapters import mirror
from flashtune.apply.patching import (
    AdapterSpec,
    ArgBinder,
    ContextStore,
    PatchManager,
    resolve_target,
)
from flashtune.apply.results import RESULT_ADAPTERS, register_result_adapter
from flashtune.apply.runtime import dispatch, route
from flashtune.schema.api import ApiOp

__all__ = [
    "RESULT_ADAPTERS",
    "AdapterSpec",
    "ArgBinder",
    "ContextStore",
    "PatchManager",
    "builtin_adapters",
    "dispatch",
    "enable_adapters",
    "register_result_adapter",
    "resolve_target",
    "route",
]

log = logging.getLogger("flashtune.apply")


def families() -> list[ModuleType]:
    """The op families' adapter modules: every module of this package but `mirror`, found
    by the package itself (adding a family adds a module here, nothing else), in name order
    so that the patching order does not depend on the file system."""
    names = sorted(
        info.name
        for info in pkgutil.iter_modules(__path__)
        if info.name != mirror.__name__.rpartition(".")[2]
    )
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


def builtin_adapters() -> list[AdapterSpec]:
    """The built-in adapters whose targets exist in this process."""
    specs = mirror.adapters()
    for family in families():
        specs += family.adapters()
    return specs


def enable_adapters(
    specs: Iterable[AdapterSpec] | None = None, manager: PatchManager | None = None
) -> PatchManager:
    """Patch the given (default: built-in) adapters; `.unpatch_all()` restores everything.
    Targets that are schema'd flashtune ops are skipped: the apply hook already sees them."""
    manager = manager or PatchManager()
    for spec in specs if specs is not None else builtin_adapters():
        try:
            owner, attr = resolve_target(spec.target)
            if isinstance(inspect.getattr_static(owner, attr), ApiOp):
                continue
            manager.patch(spec.target, spec.make)
        except Exception as exc:  # noqa: BLE001 - one missing target must not stop the rest
            log.warning("apply adapters: cannot patch %s: %s", spec.target, exc)
    return manager

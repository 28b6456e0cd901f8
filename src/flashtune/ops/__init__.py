"""flashtune's kernels and their public functions, one module per op family.

`load_all()` imports every op module, so that every schema'd op and every op module's model
examples (`@register_examples`, beside the ops they call) are registered: the CLI, the
bundled-dataset script and apply's FlashInfer mirror call it before they list them.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flashtune.schema import ApiOp

__all__ = ["bundle_modules", "family_packages", "load_all"]

log = logging.getLogger(__name__)


def load_all() -> dict[str, ApiOp]:
    """Import every module of this package; return every schema'd op by qualname."""
    from flashtune.schema import registered_ops

    # The package finds its own modules: adding an op family adds a module, nothing else.
    for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
        try:
            importlib.import_module(info.name)
        except ImportError as exc:  # an optional op family whose dependency is missing
            log.warning("could not import %s: %s", info.name, exc)
    return registered_ops()


def family_packages() -> list[str]:
    """The op family packages (module names), found on disk; nothing is imported."""
    return sorted(
        f"{__name__}.{m.name}"
        for m in pkgutil.iter_modules(__path__)
        if m.ispkg and m.name != "bundle"
    )


def bundle_modules() -> list[ModuleType]:
    """Every family's (or attention job's) `bundle` module: what the bundled dataset takes
    from it (flashtune.ops.bundle)."""
    return [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}.")
        if info.name.rpartition(".")[2] == "bundle" and info.name != f"{__name__}.bundle"
    ]

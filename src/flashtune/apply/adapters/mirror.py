"""FlashInfer's functions that flashtune's ops mirror, routed through the op they mirror.

flashtune's public ops follow FlashInfer's names and signatures, and each op's schema names
its FlashInfer API in a `fi_api:` tag (`fi_api:flashinfer.norm.rmsnorm`). So every
module-level op has a peer in that FlashInfer module under its own name (and the package's
alias, `flashinfer.rmsnorm`). A peer's call is bound with the peer's own signature and
routed as the same call of the flashtune op; a peer's extra arguments (`enable_pdl`) must
be left at their defaults, else the original runs. Nothing here is written per op.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

from flashtune.apply.patching import AdapterSpec, ArgBinder, available
from flashtune.apply.runtime import route
from flashtune.schema import NOT_HANDLED, ApiOp

__all__ = ["adapters", "mirror", "peer_targets"]

_FI_API = "fi_api:"


def peer_targets(op: ApiOp) -> list[str]:
    """Dotted paths of the FlashInfer functions `op` mirrors (they may not exist here)."""
    if op.fn.__qualname__ != op.fn.__name__:
        return []  # a method (a wrapper's run): its peer is a class, adapted per family
    targets: list[str] = []
    for schema in op.schemas:
        for tag in schema.tags:
            if not tag.startswith(_FI_API):
                continue
            module = tag.removeprefix(_FI_API).rpartition(".")[0]
            name = op.fn.__name__
            for path in (f"{module}.{name}", f"{module.split('.')[0]}.{name}"):
                if path not in targets:
                    targets.append(path)
    return targets


def mirror(op: ApiOp) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The patch factory for a peer of `op` (see the module docstring)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        binder = ArgBinder(original)
        own = op.signature.parameters
        peer_defaults = {
            name: p.default
            for name, p in inspect.signature(original).parameters.items()
            if name not in own
        }

        @functools.wraps(original)
        def patched(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = binder.bind(args, kwargs)
            except TypeError:
                return original(*args, **kwargs)
            for name, default in peer_defaults.items():
                if bound.get(name, default) is not default:
                    return original(*args, **kwargs)  # a peer-only option is in use
            result = route(op, {k: v for k, v in bound.items() if k in own})
            return original(*args, **kwargs) if result is NOT_HANDLED else result

        return patched

    return make


def adapters(ops: Iterable[ApiOp] | None = None) -> list[AdapterSpec]:
    """A mirror adapter for every existing peer of `ops` (default: all of flashtune's)."""
    if ops is None:
        from flashtune.ops import load_all

        ops = load_all().values()
    specs: dict[str, AdapterSpec] = {}
    for op in ops:
        for target in peer_targets(op):
            specs.setdefault(target, AdapterSpec(target, mirror(op)))
    return available(specs.values())

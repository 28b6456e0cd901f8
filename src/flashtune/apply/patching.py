"""The generic patcher: replace functions and methods by dotted path and restore them exactly.

- PatchManager patches functions and methods by dotted path and restores them exactly
  (staticmethod/classmethod descriptors and inherited attributes included).
- ArgBinder normalizes a call's args/kwargs to {parameter: value} (defaults applied), with
  an optional renaming.
- ContextStore keeps per-object state between calls (a wrapper's plan() for its run()).
- AdapterSpec names one patch: the target and the factory of its replacement.

Nothing here knows an op: the adapters (flashtune.apply.adapters) say what to patch.
"""

from __future__ import annotations

import importlib
import inspect
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AdapterSpec",
    "ArgBinder",
    "ContextStore",
    "PatchManager",
    "available",
    "resolve_target",
]


@dataclass(frozen=True)
class AdapterSpec:
    """One patch: dotted target and the factory building the replacement from the original."""

    target: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]


def resolve_target(target: str) -> tuple[Any, str]:
    """(owner, attribute) for a dotted path "pkg.mod.func" or "pkg.mod.Class.method"."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for part in parts[i:-1]:
                owner = getattr(owner, part)
        except AttributeError:
            raise AttributeError(f"{target}: {'.'.join(parts[:-1])} does not exist") from None
        if not hasattr(owner, parts[-1]):
            raise AttributeError(f"{target}: {parts[-1]!r} not found in {owner!r}")
        return owner, parts[-1]
    raise ImportError(f"{target}: no importable module in the path")


@dataclass
class _Patch:
    owner: Any
    attr: str
    original: Any  # the raw attribute (descriptor) as found in owner.__dict__
    own: bool  # whether owner defined it itself (else it was inherited: delete to restore)


class PatchManager:
    """Patch callables by dotted path; `unpatch`/`unpatch_all` restore them exactly."""

    def __init__(self) -> None:
        self._patches: dict[str, _Patch] = {}

    def patch(self, target: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Replace `target` with `make(original)` (original: the plain function or the
        bound-less method). Patching an already patched target replaces the patch."""
        if target in self._patches:
            self.unpatch(target)
        owner, attr = resolve_target(target)
        raw = inspect.getattr_static(owner, attr)
        own = attr in getattr(owner, "__dict__", {})
        if isinstance(raw, staticmethod):
            new: Any = staticmethod(make(raw.__func__))
        elif isinstance(raw, classmethod):
            new = classmethod(make(raw.__func__))
        else:
            new = make(raw)
        setattr(owner, attr, new)
        self._patches[target] = _Patch(owner, attr, raw, own)

    def original(self, target: str) -> Any:
        return self._patches[target].original

    def is_patched(self, target: str) -> bool:
        return target in self._patches

    @property
    def targets(self) -> list[str]:
        return list(self._patches)

    def unpatch(self, target: str) -> None:
        p = self._patches.pop(target)
        if p.own:
            setattr(p.owner, p.attr, p.original)
        else:
            delattr(p.owner, p.attr)

    def unpatch_all(self) -> None:
        for target in reversed(list(self._patches)):
            self.unpatch(target)

    def __enter__(self) -> PatchManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unpatch_all()


class ArgBinder:
    """Normalize (args, kwargs) of calls to one function into {name: value}, defaults
    applied, names optionally renamed (`rename={"input": "hidden_states"}`)."""

    def __init__(
        self, fn: Callable[..., Any] | inspect.Signature, rename: Mapping[str, str] | None = None
    ) -> None:
        self.signature = fn if isinstance(fn, inspect.Signature) else inspect.signature(fn)
        params = list(self.signature.parameters.values())
        self._positional = [
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        self._simple = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)
        self._defaults = {
            p.name: p.default for p in params if p.default is not inspect.Parameter.empty
        }
        self.rename = dict(rename or {})

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        if self._simple and len(args) <= len(self._positional):
            out = dict(self._defaults)
            out.update(zip(self._positional, args, strict=False))
            for k in kwargs:
                if k not in self.signature.parameters:
                    raise TypeError(f"unexpected keyword argument {k!r}")
            out.update(kwargs)
            missing = [n for n in self.signature.parameters if n not in out]
            if missing:
                raise TypeError(f"missing arguments {missing}")
        else:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            out = dict(bound.arguments)
        if self.rename:
            out = {self.rename.get(k, k): v for k, v in out.items()}
        return out


class ContextStore:
    """State kept per object between calls (a wrapper's plan() arguments for its run()).
    Weakly keyed: the state goes with the object."""

    def __init__(self) -> None:
        self._weak: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        self._by_id: dict[int, dict[str, Any]] = {}

    def set(self, obj: Any, /, **state: Any) -> None:
        try:
            self._weak[obj] = dict(state)
        except TypeError:  # not weak-referenceable
            self._by_id[id(obj)] = dict(state)

    def get(self, obj: Any) -> dict[str, Any]:
        try:
            return self._weak.get(obj) or {}
        except TypeError:
            return self._by_id.get(id(obj), {})

    def clear(self, obj: Any) -> None:
        try:
            self._weak.pop(obj, None)
        except TypeError:
            self._by_id.pop(id(obj), None)


def available(specs: Iterable[AdapterSpec]) -> list[AdapterSpec]:
    """The specs whose target exists in this process (an absent or broken peer is skipped)."""
    found = []
    for spec in specs:
        try:
            resolve_target(spec.target)
        except Exception:  # noqa: BLE001 - absent or broken peer: no adapter
            continue
        found.append(spec)
    return found

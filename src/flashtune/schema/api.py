"""`@api(schema=...)`: attach a schema to a public op, and the per-call hooks (definition
dump, workload capture, apply dispatch) that ride on it.

With no hook active a call pays one attribute read and one branch (well under 1 us): hooks
are installed explicitly (`add_hook`) or by the FLASHTUNE_* switches, which are read once,
on the first call of any op (`refresh_hooks()` re-reads them).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from flashtune import env, switches
from flashtune.data.io import atomic_write_text
from flashtune.data.models import Definition
from flashtune.schema.core import BoundCall, OpSchema

__all__ = [
    "family_op",
    "api",
    "ApiOp",
    "BoundApiOp",
    "CallHook",
    "NOT_HANDLED",
    "REGISTRY",
    "add_hook",
    "remove_hook",
    "refresh_hooks",
    "registered_ops",
]

log = logging.getLogger("flashtune.schema")
F = TypeVar("F", bound=Callable[..., Any])

NOT_HANDLED: Any = object()
"""Returned by a hook that lets the call proceed to the op's own implementation."""


class CallHook(Protocol):
    def __call__(self, op: ApiOp, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Observe a call; return NOT_HANDLED, or a result that replaces the op's own."""


REGISTRY: dict[str, ApiOp] = {}


class _Hooks:
    """The active hooks; `active` is the one flag every call reads."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.explicit: list[CallHook] = []
        self.from_env: list[CallHook] = []
        self.env_read = False
        self.active = True  # until the environment is read on the first call
        self.all: tuple[CallHook, ...] = ()

    def rebuild(self) -> None:
        self.all = tuple(self.from_env + self.explicit)
        self.active = bool(self.all) or not self.env_read


_HOOKS = _Hooks()


def add_hook(hook: CallHook) -> None:
    """Run `hook` on every call of every schema'd op (capture and apply use this)."""
    with _HOOKS.lock:
        _HOOKS.explicit.append(hook)
        _HOOKS.rebuild()


def remove_hook(hook: CallHook) -> None:
    with _HOOKS.lock:
        if hook in _HOOKS.explicit:
            _HOOKS.explicit.remove(hook)
        _HOOKS.rebuild()


_ENV_HOOK_FACTORIES: list[Callable[[], CallHook | None]] = []


def register_env_hook(factory: Callable[[], CallHook | None]) -> None:
    """A hook that a FLASHTUNE_* switch turns on: `factory` reads the environment and returns
    the hook, or None when its switch is off. Called on the first op call and on refresh."""
    with _HOOKS.lock:
        _ENV_HOOK_FACTORIES.append(factory)
        _HOOKS.env_read = False
        _HOOKS.rebuild()


def refresh_hooks() -> None:
    """Re-read the FLASHTUNE_* switches (the first op call does this once)."""
    # A switch whose hooks live above schema (capture, apply) has its package loaded here,
    # by the loader the package root registered (see flashtune.switches); importing it
    # registers its env hook (the lock is re-entrant).
    switches.load_switched_on()
    with _HOOKS.lock:
        _HOOKS.from_env = [h for h in (f() for f in _ENV_HOOK_FACTORIES) if h is not None]
        _HOOKS.env_read = True
        _HOOKS.rebuild()


class ApiOp:
    """A public op with its schema(s): call it like the function it wraps."""

    def __init__(
        self,
        fn: Callable[..., Any],
        schema: OpSchema | Callable[..., OpSchema],
        schemas: Sequence[OpSchema] | None,
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.signature = inspect.signature(fn)
        if isinstance(schema, OpSchema):
            self._select: Callable[..., OpSchema] | None = None
            self.schemas: tuple[OpSchema, ...] = (schema,)
        else:
            if not schemas:
                raise ValueError(
                    f"{fn.__qualname__}: a schema callable needs schemas=[...] listing what it returns"
                )
            self._select = schema
            self.schemas = tuple(schemas)
        self.qualname = f"{fn.__module__}.{fn.__qualname__}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Hooks are host-side bookkeeping (locks, file writes): torch.compile traces past them.
        if _HOOKS.active and not torch.compiler.is_compiling():
            result = _run_hooks(self, args, kwargs)
            if result is not NOT_HANDLED:
                return result
        return self.fn(*args, **kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # Used as a method decorator: `instance.method` is a bound op that can be called and
        # still answers `.definition(...)` / `.bind(...)` for that instance.
        if obj is None:
            return self
        return BoundApiOp(self, obj)

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def schema_for(self, *args: Any, **kwargs: Any) -> OpSchema:
        if self._select is None:
            return self.schemas[0]
        return self._select(*args, **kwargs)

    def bind(self, *args: Any, **kwargs: Any) -> BoundCall:
        return self.schema_for(*args, **kwargs).bind(self.arguments(args, kwargs))

    def definition(self, *args: Any, **kwargs: Any) -> Definition:
        """The Definition this call would run, without running a kernel (CPU/meta tensors ok)."""
        return self.bind(*args, **kwargs).definition()

    def __repr__(self) -> str:
        return f"<flashtune op {self.qualname} ({', '.join(s.name_prefix for s in self.schemas)})>"


class BoundApiOp:
    """A schema'd method bound to its instance: call it, or ask for the Definition of a call
    without running it."""

    def __init__(self, op: ApiOp, instance: Any) -> None:
        self.op = op
        self.__self__ = instance
        self.__func__ = op
        self.__doc__ = op.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.op(self.__self__, *args, **kwargs)

    def bind(self, *args: Any, **kwargs: Any) -> BoundCall:
        return self.op.bind(self.__self__, *args, **kwargs)

    def definition(self, *args: Any, **kwargs: Any) -> Definition:
        """The Definition of this call on this instance; no kernel runs."""
        return self.op.definition(self.__self__, *args, **kwargs)

    @property
    def schemas(self) -> tuple[OpSchema, ...]:
        return self.op.schemas

    def __repr__(self) -> str:
        return f"<bound {self.op!r}>"


def api(
    schema: OpSchema | Callable[..., OpSchema],
    schemas: Sequence[OpSchema] | None = None,
) -> Callable[[F], ApiOp]:
    """Attach `schema` (or a callable choosing one from the arguments, listed in `schemas`)."""

    def wrap(fn: F) -> ApiOp:
        op = ApiOp(fn, schema, schemas)
        REGISTRY[op.qualname] = op
        return op

    return wrap


def family_op(schema_module: str, name: str) -> ApiOp:
    """The public op `name` of the op-family package whose `schema` module is
    `schema_module` (pass `__name__`), from the registry. A family's schema module declares its
    `@register_examples` function before the package's `__init__` defines the ops (importing
    them there would be a cycle); examples are asked for only after the package is imported,
    so the op is looked up at call time."""
    return REGISTRY[f"{schema_module.rpartition('.')[0]}.{name}"]


def registered_ops() -> dict[str, ApiOp]:
    """Every schema'd op imported so far, by qualname (`flashtune.ops.load_all()` imports
    all of flashtune's)."""
    return dict(REGISTRY)


def _run_hooks(op: ApiOp, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not _HOOKS.env_read:
        refresh_hooks()
    for hook in _HOOKS.all:
        result = hook(op, args, kwargs)
        if result is not NOT_HANDLED:
            return result
    return NOT_HANDLED


# --------------------------------------------------------------------------- definition dump


class DefinitionDumper:
    """Writes each distinct Definition once per process, atomically, before the op runs."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, op: ApiOp, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            call = op.bind(*args, **kwargs)
            name = call.name
            if name in self.seen:
                return NOT_HANDLED
            definition = call.definition()
        except (ValueError, TypeError) as exc:  # bad input: let the op raise its own error
            log.debug("definition dump skipped for %s: %s", op.qualname, exc)
            return NOT_HANDLED
        with self.lock:
            if name not in self.seen:
                path = self.folder / definition.op_type / f"{name}.json"
                atomic_write_text(path, definition.to_json(indent=2) + "\n")
                self.seen.add(name)
        return NOT_HANDLED


def _dump_hook_from_env() -> CallHook | None:
    if not env.DUMP_DEFINITIONS.get():
        return None
    return DefinitionDumper(env.DUMP_DIR.get())


register_env_hook(_dump_hook_from_env)

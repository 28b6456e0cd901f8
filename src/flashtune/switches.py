"""Packages that a FLASHTUNE_* switch turns on, loaded when the per-call hooks read the switches.

The per-call hooks live in `flashtune.schema`, below the packages that provide them (capture,
apply); a program run with FLASHTUNE_CAPTURE=1 may never import `flashtune.capture` itself.
So the package root, which sits above everything and is imported first, registers one loader
per switch here, and `flashtune.schema` calls `load_switched_on()` when it reads the switches
(on the first op call, and on `refresh_hooks()`). Nothing here imports a package by name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["register", "load_switched_on"]

_LOADERS: list[tuple[Callable[[], bool], Callable[[], object]]] = []
_LOCK = threading.Lock()


def register(is_on: Callable[[], bool], load: Callable[[], object]) -> None:
    """Call `load()` whenever the switches are read and `is_on()` says the switch is on."""
    with _LOCK:
        _LOADERS.append((is_on, load))


def load_switched_on() -> None:
    """Load the package of every switch that is on (a package loads once: Python caches it)."""
    with _LOCK:
        loaders = list(_LOADERS)
    for is_on, load in loaders:
        if is_on():
            load()

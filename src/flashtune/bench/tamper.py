"""The tamper check of a sandbox: what the harness relies on, snapshotted before a solution
is imported and compared after each step. A replaced, removed or (where names cannot grow
legitimately) added function is tampering."""

from __future__ import annotations

import sys
import time
from types import ModuleType
from typing import Any

import torch

import flashtune.timing as timing

__all__ = ["harness_spaces", "snapshot", "tampered"]


def harness_spaces(*modules: ModuleType) -> list[tuple[str, Any]]:
    """Namespaces whose functions the harness relies on, by name: the clock, torch, the
    timer, and the harness's own `modules` (the child's, the messages')."""
    spaces: list[tuple[str, Any]] = [
        ("time", time),
        ("torch", torch),
        ("torch.cuda", torch.cuda),
        ("torch.Tensor", torch.Tensor),
        ("flashtune.timing", timing),
        *((m.__name__, m) for m in (sys.modules[__name__], *modules)),
    ]
    if hasattr(torch.cuda, "Event"):
        spaces += [
            ("torch.cuda.Event", torch.cuda.Event),
            ("torch.cuda.CUDAGraph", torch.cuda.CUDAGraph),
            ("torch.cuda.Stream", torch.cuda.Stream),
        ]
    return spaces


def _is_guarded(value: Any) -> bool:
    """Functions, classes and modules: what a patch replaces (flags and counters change
    legitimately)."""
    return callable(value) or isinstance(value, type(time))


def snapshot(spaces: list[tuple[str, Any]]) -> dict[str, dict[str, Any]]:
    """The guarded names of `spaces` and what they are bound to now."""
    return {
        label: {k: v for k, v in list(vars(space).items()) if _is_guarded(v)}
        for label, space in spaces
    }


# Namespaces where a new name is not tampering: torch and torch.cuda grow lazily loaded
# names legitimately. Anywhere else a new name may shadow an inherited C method (e.g.
# `torch.Tensor.fill_ = ...`) or a harness function.
_OPEN = ("torch", "torch.cuda", "torch.cuda.Event", "torch.cuda.CUDAGraph", "torch.cuda.Stream")


def tampered(before: dict[str, dict[str, Any]], spaces: list[tuple[str, Any]]) -> list[str]:
    """Names of guarded functions that were replaced, removed or added since `before`."""
    changed = []
    for label, space in spaces:
        now = vars(space)
        old = before.get(label, {})
        for k, v in old.items():
            if now.get(k) is not v:
                changed.append(f"{label}.{k}")
        if label not in _OPEN:
            for k, v in list(now.items()):
                if k not in old and _is_guarded(v):
                    changed.append(f"{label}.{k}")
    return changed

"""Compile a definition's reference once and run it on inputs."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

from flashtune.data.models import Definition

__all__ = ["compile_reference", "run_reference", "outputs_as_dict"]

_CACHE: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()


def compile_reference(definition: Definition) -> Callable[..., Any]:
    """The reference's `run`, compiled once per distinct source text."""
    key = hashlib.sha256(definition.reference.encode()).hexdigest()
    with _LOCK:
        fn = _CACHE.get(key)
        if fn is None:
            namespace: dict[str, Any] = {"__name__": f"flashtune_reference_{definition.name}"}
            code = compile(definition.reference, f"<reference of {definition.name}>", "exec")
            exec(code, namespace)  # noqa: S102 - running the definition's reference is the point
            fn = namespace.get("run")
            if not callable(fn):
                raise ValueError(f"reference of {definition.name} does not define a callable `run`")
            _CACHE[key] = fn
        return fn


def outputs_as_dict(definition: Definition, result: Any) -> dict[str, Any]:
    """Name a run's result by the definition's outputs (a tensor, a tuple or a dict)."""
    names = list(definition.outputs)
    if isinstance(result, Mapping):
        missing = set(names) - set(result)
        if missing:
            raise ValueError(f"{definition.name}: result lacks outputs {sorted(missing)}")
        return {n: result[n] for n in names}
    if isinstance(result, torch.Tensor) or not isinstance(result, (tuple, list)):
        result = (result,)
    if len(result) != len(names):
        raise ValueError(
            f"{definition.name}: expected {len(names)} outputs {names}, got {len(result)}"
        )
    return dict(zip(names, result, strict=True))


def run_reference(definition: Definition, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Run the reference on inputs keyed by input name; outputs keyed by output name."""
    fn = compile_reference(definition)
    with torch.no_grad():
        return outputs_as_dict(definition, fn(**inputs))

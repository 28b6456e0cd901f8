"""Definitions of every schema'd op at the shapes of known models (`flashtune definitions dump`).

Each op module contributes example calls of its ops through `@register_examples`: a function
from a ModelConfig (flashtune.model_shapes) to a list of (op, args, kwargs) built on the meta
device (`meta_tensor`), so nothing is allocated and no kernel runs. The examples register
when their op module is imported: `flashtune.ops.load_all()` imports them all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from flashtune.data.io import atomic_write_text
from flashtune.data.models import Definition
from flashtune.model_shapes import MODELS, ModelConfig, get_model

__all__ = [
    "EXAMPLES",
    "Example",
    "register_examples",
    "meta_tensor",
    "model_examples",
    "model_definitions",
    "dump_definitions",
]

Example = tuple[Any, tuple[Any, ...], dict[str, Any]]
EXAMPLES: list[Callable[[ModelConfig], list[Example]]] = []


ExamplesOf = Callable[[ModelConfig], list[Example]]


def register_examples(fn: ExamplesOf | None = None, *, attention: str | None = None) -> Any:
    """Decorator: `fn(model)` returns example calls (op, args, kwargs) at that model's shapes.

    `@register_examples(attention="gqa")` (or "mla") asks only models of that attention
    family (ModelConfig.attention): an attention op's examples read head counts and head dims
    that mean something else in a model of the other family."""

    def register(fn: ExamplesOf) -> ExamplesOf:
        if attention is None:
            EXAMPLES.append(fn)
        else:

            @functools.wraps(fn)
            def of_family(model: ModelConfig) -> list[Example]:
                return fn(model) if model.attention == attention else []

            EXAMPLES.append(of_family)
        return fn

    return register if fn is None else register(fn)


def meta_tensor(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """An example input: shape and dtype only, on the meta device (no memory, no kernel)."""
    return torch.empty(shape, dtype=dtype, device="meta")


def model_examples(model: ModelConfig) -> list[Example]:
    """Every registered example call at `model`'s shapes (the ops must be imported first)."""
    return [example for examples_of in EXAMPLES for example in examples_of(model)]


def model_definitions(
    models: Sequence[str] | None = None,
    examples: Sequence[Callable[[ModelConfig], list[Example]]] | None = None,
) -> dict[str, Definition]:
    """Definitions of the example calls at the given models' shapes (default: every known
    model), by name. `examples` defaults to those registered so far: schema sits below the
    ops, so the caller (the CLI, the bundled-dataset script) imports them first
    (`flashtune.ops.load_all()`)."""
    configs = [get_model(m) for m in models] if models else list(MODELS.values())
    out: dict[str, Definition] = {}
    for cfg in configs:
        for examples_of in EXAMPLES if examples is None else examples:
            for op, args, kwargs in examples_of(cfg):
                definition = op.definition(*args, **kwargs)
                definition.tags = sorted({*definition.tags, f"model:{cfg.name}"})
                if definition.name in out:
                    out[definition.name].tags = sorted(
                        {*out[definition.name].tags, *definition.tags}
                    )
                else:
                    out[definition.name] = definition
    return out


def dump_definitions(
    folder: Path,
    models: Sequence[str] | None = None,
    examples: Sequence[Callable[[ModelConfig], list[Example]]] | None = None,
) -> list[Path]:
    """Write `model_definitions(models, examples)` as definitions/<op_type>/<name>.json."""
    written = []
    for name, definition in sorted(model_definitions(models, examples).items()):
        path = folder / "definitions" / definition.op_type / f"{name}.json"
        atomic_write_text(path, definition.to_json(indent=2) + "\n")
        written.append(path)
    return written

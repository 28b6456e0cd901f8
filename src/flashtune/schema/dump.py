"""Definitions of every schema'd op at the shapes of known models (`flashtune definitions dump`).

Each op family contributes example calls for a model through `EXAMPLES`: a function from a
ModelConfig to a list of (op, args, kwargs) built on the meta device, so nothing is
allocated and no kernel runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flashtune.data.io import atomic_write_text
from flashtune.data.models import Definition
from flashtune.models import MODELS, ModelConfig, get_model

__all__ = ["EXAMPLES", "register_examples", "model_definitions", "dump_definitions"]

Example = tuple[Any, tuple[Any, ...], dict[str, Any]]
EXAMPLES: list[Callable[[ModelConfig], list[Example]]] = []


def register_examples(
    fn: Callable[[ModelConfig], list[Example]],
) -> Callable[[ModelConfig], list[Example]]:
    """Decorator: `fn(model)` returns example calls (op, args, kwargs) at that model's shapes."""
    EXAMPLES.append(fn)
    return fn


def model_definitions(models: Sequence[str] | None = None) -> dict[str, Definition]:
    """Definitions of all ops for the given models (default: every known model), by name."""
    from flashtune.schema.api import registered_ops

    registered_ops()  # import op modules so their examples register
    configs = [get_model(m) for m in models] if models else list(MODELS.values())
    out: dict[str, Definition] = {}
    for cfg in configs:
        for examples in EXAMPLES:
            for op, args, kwargs in examples(cfg):
                definition = op.definition(*args, **kwargs)
                definition.tags = sorted({*definition.tags, f"model:{cfg.name}"})
                if definition.name in out:
                    out[definition.name].tags = sorted(
                        {*out[definition.name].tags, *definition.tags}
                    )
                else:
                    out[definition.name] = definition
    return out


def dump_definitions(folder: Path, models: Sequence[str] | None = None) -> list[Path]:
    written = []
    for name, definition in sorted(model_definitions(models).items()):
        path = folder / "definitions" / definition.op_type / f"{name}.json"
        atomic_write_text(path, definition.to_json(indent=2) + "\n")
        written.append(path)
    return written

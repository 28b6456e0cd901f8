"""The RoPE family under apply: the `_inplace` op rotates query and key in place.

Its Definition's outputs are q_out and k_out; the op writes them into `query` and `key` and
returns nothing. FlashInfer's functions of these names are mirrored generically (mirror.py).
"""

from __future__ import annotations

from typing import Any

from flashtune.apply.patching import AdapterSpec
from flashtune.apply.results import register_result_adapter
from flashtune.ops.rope import apply_rope_with_cos_sin_cache_inplace

__all__ = ["adapters", "in_place_result"]


def in_place_result(arguments: dict[str, Any], outputs: dict[str, Any]) -> None:
    """Write a solution's rotated q and k into the caller's query and key."""
    for param, output in (("query", "q_out"), ("key", "k_out")):
        arguments[param].copy_(outputs[output].reshape(arguments[param].shape))


register_result_adapter(apply_rope_with_cos_sin_cache_inplace, in_place_result)


def adapters() -> list[AdapterSpec]:
    return []  # every peer has the op's signature: mirror.py covers them

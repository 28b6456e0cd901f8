"""The RMSNorm family under apply: the fused-add ops work in place.

Their Definitions' only output is the normalized value (`output`); the op's contract
(FlashInfer's) is residual <- input + residual, input <- rmsnorm(residual), nothing
returned. FlashInfer's functions of these names are mirrored generically (mirror.py).
"""

from __future__ import annotations

from typing import Any

from flashtune.apply.patching import AdapterSpec
from flashtune.apply.results import register_result_adapter
from flashtune.ops.norm import fused_add_rmsnorm, gemma_fused_add_rmsnorm

__all__ = ["adapters", "fused_add_result"]


def fused_add_result(arguments: dict[str, Any], outputs: dict[str, Any]) -> None:
    """Write a fused-add solution's output back the way the op does, in place."""
    arguments["residual"].add_(arguments["input"])
    arguments["input"].copy_(outputs["output"].reshape(arguments["input"].shape))


for _op in (fused_add_rmsnorm, gemma_fused_add_rmsnorm):
    register_result_adapter(_op, fused_add_result)


def adapters() -> list[AdapterSpec]:
    return []  # every peer has the op's signature: mirror.py covers them

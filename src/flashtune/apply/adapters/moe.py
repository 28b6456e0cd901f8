"""The fused MoE family's result convention under apply: FlashInfer's MoE calls return the
Definition's single output and fill the caller's `output=` buffer when given (FlashInfer
names it `output`, not `out`, so the runtime's own out= handling does not see it)."""

from __future__ import annotations

from typing import Any

import torch

from flashtune.apply.patching import AdapterSpec
from flashtune.apply.results import register_result_adapter
from flashtune.ops.moe import MOE_OPS

__all__ = ["adapters", "moe_result"]


def moe_result(arguments: dict[str, Any], outputs: dict[str, Any]) -> torch.Tensor:
    """The [T, H] output, written into the caller's `output` buffer when there is one."""
    out = outputs["output"]
    buffer = arguments.get("output")
    if isinstance(buffer, torch.Tensor):
        buffer.copy_(out.reshape(buffer.shape))
        return buffer
    return out


for _op in MOE_OPS:
    register_result_adapter(_op, moe_result)


def adapters() -> list[AdapterSpec]:
    """No peer to adapt by hand: FlashInfer's fused_moe functions share the ops' names and
    signatures, so apply's mirror patches them."""
    return []

"""`flashinfer.fused_moe` under flashtune's name: fused mixture-of-experts layers
(flashtune.ops.moe)."""

from __future__ import annotations

from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.moe import (  # noqa: F401  (re-exported: __all__ is the table's)
    RoutingMethodType,
    trtllm_bf16_moe,
    trtllm_fp8_block_scale_moe,
    trtllm_fp8_per_tensor_scale_moe,
)

__all__ = list(TOP_LEVEL["fused_moe"])

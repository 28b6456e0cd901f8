"""`flashinfer.gemm` under flashtune's name: the fp8 GEMMs (flashtune.ops.gemm.fp8).
`prepare_low_latency_gemm_weights` is FlashInfer's top-level name (its module is
flashinfer.trtllm_low_latency_gemm); flashtune.gemm holds it beside mm_fp8."""

from __future__ import annotations

from flashtune.flashinfer_names import SUBMODULE_ONLY, TOP_LEVEL
from flashtune.ops.gemm.fp8 import (  # noqa: F401  (re-exported: __all__ is the table's)
    batch_deepgemm_fp8_nt_groupwise,
    bmm_fp8,
    gemm_fp8_nt_blockscaled,
    gemm_fp8_nt_groupwise,
    group_deepgemm_fp8_nt_groupwise,
    group_gemm_fp8_nt_groupwise,
    mm_fp8,
    prepare_low_latency_gemm_weights,
)

__all__ = [*TOP_LEVEL["gemm"], *SUBMODULE_ONLY["gemm"]]

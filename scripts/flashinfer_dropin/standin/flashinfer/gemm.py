"""`flashinfer.gemm` served by `flashtune.gemm` (bmm_fp8 and the block-scaled fp8 GEMMs)."""

from flashtune.gemm import *  # noqa: F403

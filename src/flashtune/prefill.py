"""`flashinfer.prefill` under flashtune's name: `import flashtune as flashinfer` then
`flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper` works as it does with FlashInfer."""

from __future__ import annotations

from typing import Any

import torch

from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.attention import (  # noqa: F401  (re-exported: __all__ is the table's)
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)

__all__ = list(TOP_LEVEL["prefill"])


def single_prefill_with_kv_cache_return_lse(
    *args: Any, **kwargs: Any
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`single_prefill_with_kv_cache(..., return_lse=True)`: (output, lse), as FlashInfer's
    functools.partial of the same name."""
    return single_prefill_with_kv_cache(*args, **{**kwargs, "return_lse": True})

"""`flashinfer.decode` under flashtune's name: `import flashtune as flashinfer` then
`flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper` works as it does with FlashInfer.

Names the attention package is still growing (the CUDA-graph wrapper) are exported once
`flashtune.ops.attention` has them, looked up at access time.
"""

from __future__ import annotations

from typing import Any

from flashtune.ops import attention

# `X as X`: re-exported (the module's __all__ is computed, see __getattr__).
from flashtune.ops.attention import (
    BatchDecodeWithPagedKVCacheWrapper as BatchDecodeWithPagedKVCacheWrapper,
)
from flashtune.ops.attention import single_decode_with_kv_cache as single_decode_with_kv_cache

_PRESENT = ["BatchDecodeWithPagedKVCacheWrapper", "single_decode_with_kv_cache"]
OPTIONAL = ("CUDAGraphBatchDecodeWithPagedKVCacheWrapper",)


def __getattr__(name: str) -> Any:
    if name == "__all__":  # `from flashtune.decode import *` takes only what exists
        return [*_PRESENT, *(n for n in OPTIONAL if hasattr(attention, n))]
    if name in OPTIONAL and hasattr(attention, name):
        return getattr(attention, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

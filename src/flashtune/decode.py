"""`flashinfer.decode` under flashtune's name: `import flashtune as flashinfer` then
`flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper` works as it does with FlashInfer.
"""

from __future__ import annotations

from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.attention import (  # noqa: F401  (re-exported: __all__ is the table's)
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    single_decode_with_kv_cache,
)

__all__ = list(TOP_LEVEL["decode"])

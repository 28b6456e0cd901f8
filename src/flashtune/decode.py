"""`flashinfer.decode` under flashtune's name: `import flashtune as flashinfer` then
`flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper` works as it does with FlashInfer.

Names the attention package is still growing (the CUDA-graph wrapper) are exported once
`flashtune.ops.attention` has them, looked up at access time.
"""

from __future__ import annotations

from flashtune.flashinfer_names import growing_attributes
from flashtune.ops import attention
from flashtune.ops.attention import (  # noqa: F401  (re-exported: see __getattr__'s __all__)
    BatchDecodeWithPagedKVCacheWrapper,
    single_decode_with_kv_cache,
)

__getattr__ = growing_attributes(__name__, "decode", attention)

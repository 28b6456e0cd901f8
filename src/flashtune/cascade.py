"""`flashinfer.cascade` under flashtune's name: merging attention states and the cascade
wrappers.
"""

from __future__ import annotations

from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.attention import (  # noqa: F401  (re-exported: __all__ is the table's)
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
    BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
    merge_state,
    merge_state_in_place,
    merge_states,
)

__all__ = list(TOP_LEVEL["cascade"])

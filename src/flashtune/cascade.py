"""`flashinfer.cascade` under flashtune's name: merging attention states and the cascade
wrappers.

The shared-prefix wrappers are exported once `flashtune.ops.attention` has them, looked up
at access time.
"""

from __future__ import annotations

from typing import Any

from flashtune.ops import attention

# `X as X`: re-exported (the module's __all__ is computed, see __getattr__).
from flashtune.ops.attention import (
    MultiLevelCascadeAttentionWrapper as MultiLevelCascadeAttentionWrapper,
)
from flashtune.ops.attention import merge_state as merge_state
from flashtune.ops.attention import merge_state_in_place as merge_state_in_place
from flashtune.ops.attention import merge_states as merge_states

_PRESENT = [
    "MultiLevelCascadeAttentionWrapper",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
]
OPTIONAL = (
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
)


def __getattr__(name: str) -> Any:
    if name == "__all__":  # `from flashtune.cascade import *` takes only what exists
        return [*_PRESENT, *(n for n in OPTIONAL if hasattr(attention, n))]
    if name in OPTIONAL and hasattr(attention, name):
        return getattr(attention, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

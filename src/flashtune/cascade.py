"""`flashinfer.cascade` under flashtune's name: merging attention states and the cascade
wrappers.

The shared-prefix wrappers are exported once `flashtune.ops.attention` has them, looked up
at access time.
"""

from __future__ import annotations

from flashtune.flashinfer_names import growing_attributes
from flashtune.ops import attention
from flashtune.ops.attention import (  # noqa: F401  (re-exported: see __getattr__'s __all__)
    MultiLevelCascadeAttentionWrapper,
    merge_state,
    merge_state_in_place,
    merge_states,
)

__getattr__ = growing_attributes(__name__, "cascade", attention)

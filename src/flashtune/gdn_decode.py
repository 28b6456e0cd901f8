"""`flashinfer.gdn_decode` under flashtune's name: Gated Delta Net decode and MTP
(flashtune.ops.gdn; flashtune.gdn holds the family's every call)."""

from __future__ import annotations

from flashtune.flashinfer_names import SUBMODULE_ONLY, TOP_LEVEL
from flashtune.ops.gdn import (  # noqa: F401  (re-exported: __all__ is the table's)
    gated_delta_rule_decode,
    gated_delta_rule_decode_pretranspose,
    gated_delta_rule_mtp,
)

__all__ = [*TOP_LEVEL["gdn_decode"], *SUBMODULE_ONLY["gdn_decode"]]

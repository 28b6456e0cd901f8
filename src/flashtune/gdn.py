"""Gated Delta Net linear attention (flashtune.ops.gdn), every call in one module (the one
FlashInfer-Trace's gdn Definitions name, `flashinfer.gdn.*`): FlashInfer's
`flashinfer.gdn_prefill` and `flashinfer.gdn_decode` calls (also under those names,
flashtune.gdn_prefill and flashtune.gdn_decode), plus the definition-shaped ops of the
Definitions (gdn_prefill, gdn_decode, gdn_mtp: raw gate inputs, no q/k normalization, the new
state returned)."""

from __future__ import annotations

from flashtune.flashinfer_names import SUBMODULE_ONLY, TOP_LEVEL
from flashtune.ops.gdn import (  # noqa: F401  (re-exported: __all__ is the table's and these)
    chunk_gated_delta_rule,
    gated_delta_rule_decode,
    gated_delta_rule_decode_pretranspose,
    gated_delta_rule_mtp,
    gdn_decode,
    gdn_mtp,
    gdn_prefill,
)

__all__ = [*TOP_LEVEL["gdn"], *SUBMODULE_ONLY["gdn"], "gdn_prefill", "gdn_decode", "gdn_mtp"]

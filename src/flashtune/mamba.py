"""`flashinfer.mamba` under flashtune's name: Mamba-2's selective state update (decode;
flashtune.ops.mamba)."""

from __future__ import annotations

from flashtune.flashinfer_names import SUBMODULE_ONLY, TOP_LEVEL
from flashtune.ops.mamba import selective_state_update  # noqa: F401  (re-exported)

__all__ = [*TOP_LEVEL["mamba"], *SUBMODULE_ONLY["mamba"]]

"""MLA's result conventions under apply: the MLA ops return their Definition's (output, lse)
only when asked (`return_lse`) and fill the caller's `out=` / `lse=` buffers, as the GQA
attention ops do (`attention.run_result`)."""

from __future__ import annotations

from flashtune.apply.adapters.attention import run_result
from flashtune.apply.patching import AdapterSpec
from flashtune.apply.results import register_result_adapter
from flashtune.ops.mla import MLA_OPS

__all__ = ["adapters"]

for _op in MLA_OPS:  # the wrapper's run, the plan-free decode and prefill, the ragged prefill
    register_result_adapter(_op, run_result)


def adapters() -> list[AdapterSpec]:
    """No peer call sites to patch here yet (FlashInfer's MLA wrapper runs its own kernels)."""
    return []

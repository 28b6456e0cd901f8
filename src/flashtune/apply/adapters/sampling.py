"""The sampling family under apply: the ops return int32 samples (FlashInfer's convention)
where their Definitions' `samples` are int64 (the FlashInfer-Trace corpus's), so a winning
solution's samples are cast back to what the op returns.

FlashInfer's functions of these names have the ops' signatures and are mirrored generically
(mirror.py); a peer's newer arguments (`seed`, `offset`) must stay at their defaults, and a
call with `indices`, a `generator` or `check_nan=True` has no Definition (see
ops.sampling.schema.SamplingOp): those run the original.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.apply.patching import AdapterSpec
from flashtune.apply.results import register_result_adapter
from flashtune.ops.sampling import (
    min_p_sampling_from_probs,
    sampling_from_logits,
    sampling_from_probs,
    top_k_sampling_from_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_sampling_from_probs,
)

__all__ = ["adapters", "int32_samples"]


def int32_samples(arguments: dict[str, Any], outputs: dict[str, Any]) -> torch.Tensor:
    """A solution's samples as the op returns them: int32."""
    return outputs["samples"].to(torch.int32)


for _op in (
    sampling_from_probs,
    sampling_from_logits,
    top_p_sampling_from_probs,
    top_k_sampling_from_probs,
    min_p_sampling_from_probs,
    top_k_top_p_sampling_from_probs,
    top_k_top_p_sampling_from_logits,
):
    register_result_adapter(_op, int32_samples)


def adapters() -> list[AdapterSpec]:
    return []  # every peer has the op's signature: mirror.py covers them

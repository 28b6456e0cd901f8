"""The attention variant of a call: what it computes beyond softmax(q k^T * sm_scale) v.

Fixed when a call is planned (or, for a plan-free call, once its arguments are checked) and
passed down whole to the launch and the references' callers, instead of one argument each.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AttentionVariant"]


@dataclass(frozen=True)
class AttentionVariant:
    """sm_scale: the logits' scale; None, 1/sqrt(head_dim), is for the references (a plan
    resolves it before it launches). causal: masks aligned bottom-right (FlashInfer's).
    window_left: keys at most this far left of the query, -1 for none. logits_soft_cap: c
    maps a logit x to c * tanh(x / c), None or 0 for none. rope: ROPE_LLAMA's (rope_scale,
    rope_theta), applied to q and k as they are loaded, or None. alibi: FlashInfer's ALiBi
    bias (prefill only)."""

    sm_scale: float | None = None
    causal: bool = False
    window_left: int = -1
    logits_soft_cap: float | None = None
    rope: tuple[float, float] | None = None
    alibi: bool = False

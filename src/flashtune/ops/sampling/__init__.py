"""Sampling: FlashInfer's sorting-free sampling family (flashinfer.sampling, 0.2.14 API).

softmax (with temperature), sampling_from_probs / _logits, top_p / top_k / min_p sampling,
top_k_top_p sampling from probs or logits ("top_k_first" or "joint"), top_p / top_k
renormalization, top_k logits masking and chain speculative sampling. Per-row parameters
are tensors of shape (batch,) or Python scalars; `indices` maps each output row to a row of
probs/logits; `generator` seeds the draws; `deterministic` is accepted for compatibility
(every kernel here is deterministic); `check_nan` raises on NaN input (a host
synchronization, only when asked).

This module holds the public functions only; the package: reference.py (the sort-based
references), schema.py (the schemas, the schema's view of a call, the model examples),
kernels.py, split_kernels.py and steps.py (Triton: the kernels, their split-row variant,
their building blocks), launch.py (runners, launches, validation, the CPU path), config.py
(tactics). The kernels need no sort and no temporary the size of the input: one
pass over a row per rejection round. A call draws its random seed on the device from the
generator (no host synchronization), so calls are CUDA-graph capturable and a replayed graph
draws anew. Without Triton (CPU without the interpreter) the sort-based references run.
"""

from __future__ import annotations

import torch

from flashtune import platform
from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.ops.call import FLOATS
from flashtune.ops.sampling import kernels
from flashtune.ops.sampling.launch import (
    _check_generator,
    _check_nan,
    _check_rows,
    _order,
    _renorm,
    _sample,
    _sample_logits,
    _seed,
    _softmax,
    launch_chain_speculative,
)
from flashtune.ops.sampling.reference import chain_speculative_sampling_ref
from flashtune.ops.sampling.schema import (
    MIN_P_SAMPLING,
    SAMPLING_FROM_LOGITS,
    SAMPLING_FROM_PROBS,
    SOFTMAX,
    TOP_K_MASK_LOGITS,
    TOP_K_RENORM,
    TOP_K_SAMPLING,
    TOP_K_TOP_P_JOINT_SAMPLING,
    TOP_K_TOP_P_JOINT_SAMPLING_FROM_LOGITS,
    TOP_K_TOP_P_SAMPLING,
    TOP_K_TOP_P_SAMPLING_FROM_LOGITS,
    TOP_P_RENORM,
    TOP_P_SAMPLING,
    _by_order,
    sampling_api,
)

# FlashInfer's names (flashtune.flashinfer_names), and nothing else.
__all__ = list(TOP_LEVEL["sampling"])


# ----------------------------------------------------------------------------------------------
# Public API (FlashInfer 0.2.14's names and signatures)
# ----------------------------------------------------------------------------------------------


@sampling_api(schema=SOFTMAX)
def softmax(
    logits: torch.Tensor,
    temperature: torch.Tensor | float | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """softmax(logits / temperature) per row, in fp32. temperature: None (1.0), a float, or
    a (batch,) tensor. enable_pdl is accepted for compatibility."""
    return _softmax(logits, temperature)


@sampling_api(schema=SAMPLING_FROM_PROBS)
def sampling_from_probs(
    probs: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """One draw per output row from probs [rows, vocab] (row indices[i] for output i when
    given). Returns int32 samples of shape (batch,)."""
    return _sample(probs, kernels.MODE_PLAIN, indices, generator, check_nan)


@sampling_api(schema=SAMPLING_FROM_LOGITS)
def sampling_from_logits(
    logits: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """One draw per output row from softmax(logits), in one pass (no probabilities written)."""
    return _sample_logits(logits, indices, generator, check_nan)


@sampling_api(schema=TOP_P_SAMPLING)
def top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """Top-p (nucleus) sampling: one draw per row from the most likely tokens whose mass
    reaches top_p (a float or a (batch,) tensor)."""
    return _sample(probs, kernels.MODE_TOP_P, indices, generator, check_nan, top_p=top_p)


@sampling_api(schema=TOP_K_SAMPLING)
def top_k_sampling_from_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | int,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """Top-k sampling: one draw per row from its k most likely tokens (ties kept)."""
    return _sample(probs, kernels.MODE_TOP_K, indices, generator, check_nan, top_k=top_k)


@sampling_api(schema=MIN_P_SAMPLING)
def min_p_sampling_from_probs(
    probs: torch.Tensor,
    min_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """Min-p sampling: one draw per row from the tokens >= min_p * its largest probability."""
    return _sample(probs, kernels.MODE_MIN_P, indices, generator, check_nan, top_p=min_p)


@sampling_api(
    schema=_by_order(TOP_K_TOP_P_JOINT_SAMPLING, TOP_K_TOP_P_SAMPLING),
    schemas=[TOP_K_TOP_P_SAMPLING, TOP_K_TOP_P_JOINT_SAMPLING],
)
def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """Top-k and top-p sampling. "top_k_first": top-p on the renormalized top-k tokens;
    "joint": the tokens both filters keep on the original row."""
    mode = _order(filter_apply_order)
    return _sample(probs, mode, indices, generator, check_nan, top_k=top_k, top_p=top_p)


@sampling_api(
    schema=_by_order(TOP_K_TOP_P_JOINT_SAMPLING_FROM_LOGITS, TOP_K_TOP_P_SAMPLING_FROM_LOGITS),
    schemas=[TOP_K_TOP_P_SAMPLING_FROM_LOGITS, TOP_K_TOP_P_JOINT_SAMPLING_FROM_LOGITS],
)
def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """Top-k and top-p sampling from logits: softmax (torch's, so a call draws exactly what
    the same call on torch.softmax(logits) draws), then top_k_top_p_sampling_from_probs."""
    mode = _order(filter_apply_order)
    _check_rows("logits", logits)
    if check_nan:
        _check_nan("logits", logits)
    probs = torch.softmax(logits.float(), dim=-1)
    return _sample(probs, mode, indices, generator, False, top_k=top_k, top_p=top_p)


@sampling_api(schema=TOP_P_RENORM)
def top_p_renorm_probs(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """probs with the tokens top-p sampling would not draw zeroed, renormalized (fp32)."""
    return _renorm(probs, "probs", kernels.RENORM_TOP_P, top_p=top_p)


@sampling_api(schema=TOP_K_RENORM)
def top_k_renorm_probs(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """probs with all but the k largest (ties kept) zeroed, renormalized (fp32)."""
    return _renorm(probs, "probs", kernels.RENORM_TOP_K, top_k=top_k)


@sampling_api(schema=TOP_K_MASK_LOGITS)
def top_k_mask_logits(logits: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """logits with all but the k largest (ties kept) set to -inf, in logits' dtype."""
    return _renorm(logits, "logits", kernels.MASK_TOP_K, top_k=top_k)


top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Speculative sampling of a chain of draft tokens (see chain_speculative_sampling_ref).

    draft_probs [batch, n, vocab], draft_token_ids [batch, n], target_probs
    [batch, n + 1, vocab]. Returns (output_token_ids [batch, n + 1] int32, rejected positions
    -1; accepted [batch]; emitted [batch]); the two counts are added into the given tensors.
    Not schema'd: no Definition describes it yet (its counts accumulate in place)."""
    for name, x in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.dtype not in FLOATS:
            raise ValueError(
                f"{name} must be a 3-D float tensor [batch, tokens, vocab], got {x!r:.80}"
            )
    batch, n, vocab = draft_probs.shape
    if n < 1 or tuple(target_probs.shape) != (batch, n + 1, vocab):
        raise ValueError(
            f"target_probs must have shape {(batch, n + 1, vocab)} for draft_probs of shape "
            f"{tuple(draft_probs.shape)} (n >= 1), got {tuple(target_probs.shape)}"
        )
    if not isinstance(draft_token_ids, torch.Tensor) or tuple(draft_token_ids.shape) != (batch, n):
        raise ValueError(
            f"draft_token_ids must have shape {(batch, n)}, got {getattr(draft_token_ids, 'shape', draft_token_ids)!r}"
        )
    dev = draft_probs.device
    counts = []
    for name, given in (
        ("maybe_output_accepted_token_num", maybe_output_accepted_token_num),
        ("maybe_output_emitted_draft_token_num", maybe_output_emitted_draft_token_num),
    ):
        if given is None:
            given = torch.zeros(batch, dtype=torch.int32, device=dev)
        elif given.shape != (batch,) or given.dtype != torch.int32:
            raise ValueError(
                f"{name} must be an int32 tensor of shape ({batch},), got {given.dtype} {tuple(given.shape)}"
            )
        counts.append(given)
    _check_generator(generator, dev)
    seed = _seed(generator, dev)
    if not platform.kernels_available(dev):
        out, acc, emi = chain_speculative_sampling_ref(
            draft_probs, draft_token_ids, target_probs, generator
        )
        counts[0] += acc
        counts[1] += emi
        return out, counts[0], counts[1]
    out = torch.empty(batch, n + 1, dtype=torch.int32, device=dev)
    launch_chain_speculative(
        draft_probs, draft_token_ids, target_probs, out, counts[0], counts[1], seed
    )
    return out, counts[0], counts[1]

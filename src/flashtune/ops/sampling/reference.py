"""The sampling family's contracts: references in plain PyTorch (sort-based, one per op: the
test oracle, the benchmark's torch baseline, the CPU path where no kernel runs, and the
schemas' references in schema.py).

Each reference is self-contained (a Definition's reference is the function's own source).
Filters keep ties: top-k keeps every value >= the k-th largest; top-p keeps a token when the
mass of the tokens before it (in descending order) is at most top_p of the row's, so the
token that crosses top_p is kept and top_p <= 0 keeps the most likely token; min-p keeps the
values >= min_p * max. top_k <= 0 or >= vocab, top_p >= 1 and min_p <= 0 filter nothing.
Draws invert the CDF of the kept mass with one uniform per row (`generator` optional).
"""

from __future__ import annotations

import torch

__all__ = [
    "softmax_ref",
    "sampling_from_probs_ref",
    "sampling_from_logits_ref",
    "top_p_sampling_from_probs_ref",
    "top_k_sampling_from_probs_ref",
    "min_p_sampling_from_probs_ref",
    "top_k_top_p_sampling_from_probs_ref",
    "top_k_top_p_joint_sampling_from_probs_ref",
    "top_k_top_p_sampling_from_logits_ref",
    "top_k_top_p_joint_sampling_from_logits_ref",
    "top_p_renorm_probs_ref",
    "top_k_renorm_probs_ref",
    "top_k_mask_logits_ref",
    "chain_speculative_sampling_ref",
]


def softmax_ref(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """softmax(logits / temperature) per row, in fp32; temperature: [batch]."""
    scaled = logits.float() / temperature.float().reshape(-1, 1)
    return torch.softmax(scaled, dim=-1)


def sampling_from_probs_ref(
    probs: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One draw per row of probs (any non-negative weights): the inverse CDF at a uniform."""
    weights = probs.float()
    cdf = torch.cumsum(weights, dim=-1)
    u = torch.rand(weights.shape[0], 1, device=weights.device, generator=generator)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    positions = torch.arange(weights.shape[-1], device=weights.device)
    last_kept = torch.where(weights > 0, positions, 0).amax(dim=-1)
    return torch.minimum(token, last_kept)


def sampling_from_logits_ref(
    logits: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One draw per row from softmax(logits)."""
    weights = torch.softmax(logits.float(), dim=-1)
    cdf = torch.cumsum(weights, dim=-1)
    u = torch.rand(weights.shape[0], 1, device=weights.device, generator=generator)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    positions = torch.arange(weights.shape[-1], device=weights.device)
    last_kept = torch.where(weights > 0, positions, 0).amax(dim=-1)
    return torch.minimum(token, last_kept)


def top_p_sampling_from_probs_ref(
    probs: torch.Tensor, top_p: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One draw per row from the most likely tokens whose mass reaches top_p (sorted)."""
    probs = probs.float()
    p = top_p.float().reshape(-1, 1).clamp_min(0.0)
    ordered, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(ordered, dim=-1) - ordered
    drop = (mass_before > p * probs.sum(dim=-1, keepdim=True)) & (p < 1.0)
    weights = torch.zeros_like(probs).scatter(-1, order, ordered.masked_fill(drop, 0.0))
    cdf = torch.cumsum(weights, dim=-1)
    u = torch.rand(weights.shape[0], 1, device=weights.device, generator=generator)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    positions = torch.arange(weights.shape[-1], device=weights.device)
    last_kept = torch.where(weights > 0, positions, 0).amax(dim=-1)
    return torch.minimum(token, last_kept)


def top_k_sampling_from_probs_ref(
    probs: torch.Tensor, top_k: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One draw per row from the values >= its k-th largest (a partial sort: torch.topk)."""
    probs = probs.float()
    vocab = probs.shape[-1]
    k = top_k.long().reshape(-1, 1)
    k_in_range = k.clamp(1, vocab)
    largest = torch.topk(probs, int(k_in_range.max()), dim=-1).values
    kth = largest.gather(-1, k_in_range - 1)
    drop = (probs < kth) & (k > 0) & (k < vocab)
    weights = probs.masked_fill(drop, 0.0)
    cdf = torch.cumsum(weights, dim=-1)
    u = torch.rand(weights.shape[0], 1, device=weights.device, generator=generator)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    positions = torch.arange(vocab, device=weights.device)
    last_kept = torch.where(weights > 0, positions, 0).amax(dim=-1)
    return torch.minimum(token, last_kept)


def min_p_sampling_from_probs_ref(
    probs: torch.Tensor, min_p: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One draw per row from the values >= min_p * (the row's largest)."""
    probs = probs.float()
    threshold = min_p.float().reshape(-1, 1) * probs.amax(dim=-1, keepdim=True)
    weights = probs.masked_fill(probs < threshold, 0.0)
    cdf = torch.cumsum(weights, dim=-1)
    u = torch.rand(weights.shape[0], 1, device=weights.device, generator=generator)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    positions = torch.arange(weights.shape[-1], device=weights.device)
    last_kept = torch.where(weights > 0, positions, 0).amax(dim=-1)
    return torch.minimum(token, last_kept)


def top_k_top_p_sampling_from_probs_ref(
    probs: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Top-k first: keep the values >= the k-th largest, renormalize, then top-p on that."""
    probs = probs.float()
    vocab = probs.shape[-1]
    k = top_k.long().reshape(-1, 1)
    ordered, order = torch.sort(probs, dim=-1, descending=True)
    kth = ordered.gather(-1, k.clamp(1, vocab) - 1)
    drop_k = (ordered < kth) & (k > 0) & (k < vocab)
    ordered = ordered.masked_fill(drop_k, 0.0)
    ordered = ordered / ordered.sum(dim=-1, keepdim=True)
    p = top_p.float().reshape(-1, 1).clamp_min(0.0)
    mass_before = torch.cumsum(ordered, dim=-1) - ordered
    drop_p = (mass_before > p) & (p < 1.0)
    weights = torch.zeros_like(probs).scatter(-1, order, ordered.masked_fill(drop_p, 0.0))
    cdf = torch.cumsum(weights, dim=-1)
    u = torch.rand(weights.shape[0], 1, device=weights.device, generator=generator)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    positions = torch.arange(vocab, device=weights.device)
    last_kept = torch.where(weights > 0, positions, 0).amax(dim=-1)
    return torch.minimum(token, last_kept)


def top_k_top_p_joint_sampling_from_probs_ref(
    probs: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Joint: keep the tokens that both filters keep, each judged on the original row."""
    probs = probs.float()
    vocab = probs.shape[-1]
    k = top_k.long().reshape(-1, 1)
    ordered, order = torch.sort(probs, dim=-1, descending=True)
    kth = ordered.gather(-1, k.clamp(1, vocab) - 1)
    drop_k = (ordered < kth) & (k > 0) & (k < vocab)
    p = top_p.float().reshape(-1, 1).clamp_min(0.0)
    mass_before = torch.cumsum(ordered, dim=-1) - ordered
    drop_p = (mass_before > p * probs.sum(dim=-1, keepdim=True)) & (p < 1.0)
    kept = ordered.masked_fill(drop_k | drop_p, 0.0)
    weights = torch.zeros_like(probs).scatter(-1, order, kept)
    cdf = torch.cumsum(weights, dim=-1)
    u = torch.rand(weights.shape[0], 1, device=weights.device, generator=generator)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    positions = torch.arange(vocab, device=weights.device)
    last_kept = torch.where(weights > 0, positions, 0).amax(dim=-1)
    return torch.minimum(token, last_kept)


def top_k_top_p_sampling_from_logits_ref(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Top-k first from logits: mask all but the k largest logits, softmax, then top-p."""
    logits = logits.float()
    vocab = logits.shape[-1]
    k = top_k.long().reshape(-1, 1)
    kth = torch.sort(logits, dim=-1, descending=True).values.gather(-1, k.clamp(1, vocab) - 1)
    drop_k = (logits < kth) & (k > 0) & (k < vocab)
    probs = torch.softmax(logits.masked_fill(drop_k, float("-inf")), dim=-1)
    p = top_p.float().reshape(-1, 1).clamp_min(0.0)
    ordered, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(ordered, dim=-1) - ordered
    drop_p = (mass_before > p) & (p < 1.0)
    weights = torch.zeros_like(probs).scatter(-1, order, ordered.masked_fill(drop_p, 0.0))
    cdf = torch.cumsum(weights, dim=-1)
    u = torch.rand(weights.shape[0], 1, device=weights.device, generator=generator)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    positions = torch.arange(vocab, device=weights.device)
    last_kept = torch.where(weights > 0, positions, 0).amax(dim=-1)
    return torch.minimum(token, last_kept)


def top_k_top_p_joint_sampling_from_logits_ref(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Joint from logits: softmax, then the tokens both filters keep on that row."""
    probs = torch.softmax(logits.float(), dim=-1)
    vocab = probs.shape[-1]
    k = top_k.long().reshape(-1, 1)
    ordered, order = torch.sort(probs, dim=-1, descending=True)
    kth = ordered.gather(-1, k.clamp(1, vocab) - 1)
    drop_k = (ordered < kth) & (k > 0) & (k < vocab)
    p = top_p.float().reshape(-1, 1).clamp_min(0.0)
    mass_before = torch.cumsum(ordered, dim=-1) - ordered
    drop_p = (mass_before > p * probs.sum(dim=-1, keepdim=True)) & (p < 1.0)
    weights = torch.zeros_like(probs).scatter(-1, order, ordered.masked_fill(drop_k | drop_p, 0.0))
    cdf = torch.cumsum(weights, dim=-1)
    u = torch.rand(weights.shape[0], 1, device=weights.device, generator=generator)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    positions = torch.arange(vocab, device=weights.device)
    last_kept = torch.where(weights > 0, positions, 0).amax(dim=-1)
    return torch.minimum(token, last_kept)


def top_p_renorm_probs_ref(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """probs with the top-p filter applied (sorted), renormalized, in fp32."""
    probs = probs.float()
    p = top_p.float().reshape(-1, 1).clamp_min(0.0)
    ordered, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(ordered, dim=-1) - ordered
    drop = (mass_before > p * probs.sum(dim=-1, keepdim=True)) & (p < 1.0)
    kept = torch.zeros_like(probs).scatter(-1, order, ordered.masked_fill(drop, 0.0))
    return kept / kept.sum(dim=-1, keepdim=True)


def top_k_renorm_probs_ref(probs: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """probs with the values below the k-th largest zeroed (sorted), renormalized, fp32."""
    probs = probs.float()
    vocab = probs.shape[-1]
    k = top_k.long().reshape(-1, 1)
    kth = torch.sort(probs, dim=-1, descending=True).values.gather(-1, k.clamp(1, vocab) - 1)
    kept = probs.masked_fill((probs < kth) & (k > 0) & (k < vocab), 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def top_k_mask_logits_ref(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """logits with the values below the k-th largest set to -inf (sorted)."""
    vocab = logits.shape[-1]
    k = top_k.long().reshape(-1, 1)
    kth = torch.sort(logits, dim=-1, descending=True).values.gather(-1, k.clamp(1, vocab) - 1)
    return logits.masked_fill((logits < kth) & (k > 0) & (k < vocab), float("-inf"))


def chain_speculative_sampling_ref(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Speculative sampling of a chain of draft tokens: draft token i is accepted when
    u_i * q_i < p_i; the first rejection draws from max(p - q, 0) at its position, full
    acceptance draws a bonus token from the last target row; later positions are -1.
    Returns (tokens [batch, n + 1] int32, accepted [batch] int32 (each token judged alone),
    emitted [batch] int32 (draft tokens before the first rejection))."""
    batch, n, vocab = draft_probs.shape
    device = draft_probs.device
    out = torch.full((batch, n + 1), -1, dtype=torch.int32, device=device)
    accepted = torch.zeros(batch, dtype=torch.int32, device=device)
    emitted = torch.zeros(batch, dtype=torch.int32, device=device)
    u = torch.rand(batch, n + 1, device=device, generator=generator)
    for b in range(batch):
        stop = n
        for i in range(n):
            d = int(draft_token_ids[b, i])
            ok = bool(u[b, i] * draft_probs[b, i, d] < target_probs[b, i, d])
            accepted[b] += int(ok)
            if stop == n and ok:
                out[b, i] = d
                emitted[b] += 1
            elif stop == n:
                stop = i
        weights = target_probs[b, stop].float()
        if stop < n:
            weights = (weights - draft_probs[b, stop].float()).clamp_min(0.0)
        cdf = torch.cumsum(weights, dim=0)
        out[b, stop] = int(
            torch.searchsorted(cdf, u[b, n] * cdf[-1], right=True).clamp_max(vocab - 1)
        )
    return out, accepted, emitted

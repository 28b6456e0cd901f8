"""Draw checks shared by the sampling tests (tests/ops/test_sampling*.py): one probability
row, its filtered distribution, and the check of many draws against it.

Distribution checks: `DRAWS` draws of one row, total variation distance from the filtered,
renormalized distribution below 3x the TVD expected from sampling noise alone
(0.5 * sum sqrt(2 p (1 - p) / (pi n)) per row), and never a token outside the support.
"""

from __future__ import annotations

import math

import torch

DRAWS = 2000


def row(vocab: int, scale: float = 1.0, zeros: float = 0.0, device: str = "cpu") -> torch.Tensor:
    """One probability row [1, vocab]: softmax of scaled normals, a fraction set to zero."""
    logits = torch.randn(1, vocab, device=device) * scale
    if zeros:
        logits[0, torch.randperm(vocab, device=device)[: int(vocab * zeros)]] = -math.inf
    return torch.softmax(logits, dim=-1)


def kept(
    probs: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, joint: bool = True
) -> torch.Tensor:
    """The filtered, renormalized distribution of one row (float64, the filters' rules)."""
    row = probs[0].double()
    vocab = row.numel()
    keep = row > 0
    if 0 < top_k < vocab:
        keep &= row >= torch.sort(row, descending=True).values[top_k - 1]
    if top_p < 1.0:
        base = row if joint else torch.where(keep, row, 0.0) / torch.where(keep, row, 0.0).sum()
        ordered, order = torch.sort(base, descending=True)
        before = torch.zeros_like(row)
        before[order] = torch.cumsum(ordered, 0) - ordered
        keep &= before <= top_p * base.sum()
    if min_p > 0:
        keep &= row >= min_p * row.max()
    kept = torch.where(keep, row, 0.0)
    return kept / kept.sum()


def check_draws(samples: torch.Tensor, expected: torch.Tensor) -> None:
    """Every draw in the support, and the TVD within 3x sampling noise (see the module docstring)."""
    draws = samples.long().cpu()
    assert draws.dtype == torch.int64 and draws.numel() > 0
    outside = (expected[draws] == 0).nonzero().flatten()
    assert outside.numel() == 0, f"drew tokens outside the support: {draws[outside][:10].tolist()}"
    n = draws.numel()
    freq = torch.bincount(draws, minlength=expected.numel()).double() / n
    tvd = 0.5 * float((freq - expected).abs().sum())
    noise = 0.5 * float(torch.sqrt(2 * expected * (1 - expected) / (math.pi * n)).sum())
    assert tvd <= 3 * noise + 1e-3, f"TVD {tvd:.4f} > 3 x noise {noise:.4f} over {n} draws"

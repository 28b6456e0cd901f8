"""Draw checks shared by the sampling tests (tests/ops/test_sampling*.py): one probability
row, its filtered distribution, and the check of many draws against it.

Distribution checks: `DRAWS` draws of one row, never a token outside the support, and a
chi-square goodness-of-fit test against the filtered, renormalized distribution (tokens
expected fewer than `MIN_EXPECTED` times pooled into one bin) that fails only below a p-value
of `ALPHA`: a sampler biased by a few percent on a likely token fails it, while a correct
one fails about once in 10^5 runs. (A bound of 3x the expected total variation distance
failed a correct sampler about once in 150 runs where the support is two or three tokens.)
"""

from __future__ import annotations

import math

import torch

DRAWS = 2000
ALPHA = 1e-5
MIN_EXPECTED = 5.0


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


def chi_square_p_value(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """P-value of Pearson's chi-square test of `counts` (draws per token) against the
    probabilities `expected` (float64, summing to 1), over the tokens expected at least
    MIN_EXPECTED times and one bin pooling the rest (the chi-square approximation needs it)."""
    n = float(counts.sum())
    want = expected * n
    big = want >= MIN_EXPECTED
    obs = torch.cat([counts[big].double(), counts[~big].double().sum().reshape(1)])
    exp = torch.cat([want[big], want[~big].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    dof = obs.numel() - 1
    if dof < 1:
        return 1.0  # one bin: every draw landed in it (the support check covers the rest)
    stat = float(((obs - exp) ** 2 / exp).sum())
    # the chi-square survival function with dof degrees of freedom
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def check_draws(samples: torch.Tensor, expected: torch.Tensor) -> None:
    """Every draw in the support, and the draws' counts consistent with `expected` (see the
    module docstring)."""
    draws = samples.long().cpu()
    assert draws.dtype == torch.int64 and draws.numel() > 0
    outside = (expected[draws] == 0).nonzero().flatten()
    assert outside.numel() == 0, f"drew tokens outside the support: {draws[outside][:10].tolist()}"
    counts = torch.bincount(draws, minlength=expected.numel())
    p_value = chi_square_p_value(counts, expected)
    assert p_value >= ALPHA, (
        f"draws do not follow the filtered distribution: chi-square p-value {p_value:.2e} "
        f"< {ALPHA:g} over {draws.numel()} draws"
    )

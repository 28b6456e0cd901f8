"""Probability and logit rows for the sampling op types, with filter parameters placed at
the rows' edges.

Softmax rows of N(0, 3^2) logits over 128k tokens and top_k drawn from 1..128 let wrong
samplers pass: a top-k sampler that keeps k - 1 tokens, a top-p sampler that uses p - 0.1,
even an argmax, rarely draw differently enough for a few dozen draws to tell. Each row here
has a shape (chosen per row from the seed) and a *boundary rank* j, the rank of the last
token the filters keep, and the definition's filter inputs are set from the realized row so
that the token of rank j carries real mass and sits right at the edge:

- shapes: `flat` (6 rows in 10): a head of m tokens of nearly equal mass (near-ties: each
  rank's logit 1e-4..1e-3 below the one before), m = j + 1..4 so that rank j + 1 is a near
  tie of rank j; `geometric` (1 in 4): a head whose masses fall by a ratio r in [0.35, 0.8]
  per rank (peaked); `diffuse` (3 in 20): no head, softmax of N(0, 3^2) logits. A head holds
  85-97% of the row (93-98% when top_k and top_p both filter, and then m = j), the rest a
  softmax of N(0, s^2) logits, s in [0.5, 2], over the whole vocabulary. The head's tokens
  sit at distinct random positions;
- j: in flat rows 2..6 (7 rows in 8) or log-uniform in 7..100; in the others 2..4 (at
  most vocab - 1);
- top_k = j; top_p places the cumulative mass of the ranks before j, plus 25-75% of
  min(w_j, 0.1), at top_p * sum (rank j crosses top_p, rank j + 1 is out, and p - 0.1 drops
  rank j); with top_k as well, top_p lies where rank j is kept by the sequential rule
  (top-k, renormalize, top-p) and dropped at p - 0.1 by the joint one (both filters on the
  original row), when such a p exists; min_p puts its threshold halfway between the masses
  of ranks j and j + 1.

A row's expected share of draws on rank j is then about 1/j for flat rows, which is what
lets bench/sampling_support.py tell the wrong samplers from honest ones (its power is stated
in docs/evaluation.md). Filter inputs given by a workload are used as they are; rows read
from a blob too, and the filters are placed at rank j of those rows. A filter drawn before
its rows (a definition that lists top_p first) falls back to a random value (top_p in
[0.5, 1), min_p in [0.05, 0.5)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashtune.data.families import Draws

__all__ = [
    "SAMPLING_OP_TYPES",
    "RowPlan",
    "plan_rows",
    "sampling_logits",
    "top_k_values",
    "top_p_values",
    "min_p_values",
]

# Op types whose `probs` / `logits` input rows come from this module.
SAMPLING_OP_TYPES: frozenset[str] = frozenset({"sampling", "sampling_filter"})

_FLAT, _GEOMETRIC, _DIFFUSE = 0, 1, 2
_NARROW = (2, 6)  # boundary ranks of 7 flat rows in 8
_WIDE = (7, 100)  # ... and of the rest, log-uniform
_PEAKED = (2, 4)  # boundary ranks of geometric and diffuse rows


@dataclass(frozen=True)
class RowPlan:
    """Per row (CPU tensors): the shape code, boundary rank j (1-based), head size m, head
    mass, geometric ratio, tail spread; `tight`: m = j (top_k and top_p both filter)."""

    shape: torch.Tensor
    boundary: torch.Tensor
    head: torch.Tensor
    head_mass: torch.Tensor
    ratio: torch.Tensor
    tail_sigma: torch.Tensor
    tight: bool


def plan_rows(rows: int, vocab: int, gen: torch.Generator, tight: bool) -> RowPlan:
    """Each row's shape and boundary rank (module docstring), from `gen`."""
    u = torch.rand(rows, generator=gen, dtype=torch.float64)
    shape = torch.where(u < 0.6, _FLAT, torch.where(u < 0.85, _GEOMETRIC, _DIFFUSE))
    narrow = torch.randint(_NARROW[0], _NARROW[1] + 1, (rows,), generator=gen)
    near_peak = torch.randint(_PEAKED[0], _PEAKED[1] + 1, (rows,), generator=gen)
    lo, hi = math.log(_WIDE[0]), math.log(_WIDE[1])
    wide = torch.exp(lo + (hi - lo) * torch.rand(rows, generator=gen, dtype=torch.float64))
    is_wide = torch.rand(rows, generator=gen) < 1 / 8
    boundary = torch.where(is_wide, wide.round().long(), narrow)
    # Peaked and diffuse rows put their edge near the peak, where rank j still has mass.
    boundary = torch.where(shape == _FLAT, boundary, near_peak)
    extra = torch.randint(1, 5, (rows,), generator=gen)
    head = boundary if tight else boundary + extra
    mass_lo, mass_hi = (0.93, 0.98) if tight else (0.85, 0.97)
    head_mass = mass_lo + (mass_hi - mass_lo) * torch.rand(rows, generator=gen, dtype=torch.float64)
    ratio = 0.35 + 0.45 * torch.rand(rows, generator=gen, dtype=torch.float64)
    tail_sigma = 0.5 + 1.5 * torch.rand(rows, generator=gen, dtype=torch.float64)
    if vocab < 4:  # no room for a head: every row diffuse, its edge wherever it falls
        shape = torch.full((rows,), _DIFFUSE)
    boundary = boundary.clamp(1, max(vocab - 1, 1))
    head = torch.minimum(head, boundary.new_tensor(max(vocab - 2, 0)))
    head = torch.where(shape == _DIFFUSE, 0, head)
    tail_sigma = torch.where(shape == _DIFFUSE, 3.0, tail_sigma)
    return RowPlan(shape, boundary, head, head_mass, ratio, tail_sigma, tight)


def sampling_logits(plan: RowPlan, vocab: int, draws: Draws) -> torch.Tensor:
    """float32 logits [rows, vocab] whose softmax has the planned shape (module docstring);
    on the target GPU when large (Draws)."""
    rows = plan.boundary.numel()
    gen = draws.gen
    tail = draws.randn((rows, vocab))
    dev = tail.device
    tail = tail * plan.tail_sigma.float().to(dev).unsqueeze(1)
    width = int(plan.head.max()) if rows else 0
    if width == 0:
        return tail
    rank = torch.arange(width, dtype=torch.float64).unsqueeze(0)
    # Logit offsets per rank: flat heads fall by 1e-4..1e-3 a rank (near-ties, distinct in
    # float32), geometric ones by log(1 / ratio).
    steps = 1e-4 + 9e-4 * torch.rand(rows, width, generator=gen, dtype=torch.float64)
    flat = -(torch.cumsum(steps, 1) - steps[:, :1])
    geometric = rank * torch.log(plan.ratio).unsqueeze(1)
    offsets = torch.where((plan.shape == _FLAT).unsqueeze(1), flat, geometric)
    in_head = rank < plan.head.unsqueeze(1)
    # The level that gives the head its planned share of the row's mass.
    log_head = torch.logsumexp(offsets.masked_fill(~in_head, -math.inf), dim=1)
    log_tail = torch.logsumexp(tail.double(), dim=1).cpu()
    level = torch.log(plan.head_mass / (1 - plan.head_mass)) + log_tail - log_head
    head_logits = (level.unsqueeze(1) + offsets).float()
    # Distinct positions: a random start and stride, ranks shuffled over them.
    start = torch.randint(0, vocab, (rows, 1), generator=gen)
    stride = torch.randint(
        1, max((vocab - 1) // max(width - 1, 1), 1) + 1, (rows, 1), generator=gen
    )
    order = torch.argsort(torch.rand(rows, width, generator=gen), dim=1)
    positions = ((start + order * stride) % vocab).to(dev)
    kept = tail.gather(1, positions)
    values = torch.where(in_head.to(dev), head_logits.to(dev), kept)
    return tail.scatter(1, positions, values)


def _edges(weights: torch.Tensor, plan: RowPlan) -> tuple[torch.Tensor, ...]:
    """float64 CPU: (mass before rank j, w_j, w_{j+1}, w_1, row sum), ranks by value."""
    vocab = weights.shape[-1]
    j = plan.boundary.clamp(1, vocab)
    width = min(vocab, int(j.max()) + 1)
    top = torch.topk(weights.float(), width, dim=-1).values.double().cpu()
    total = weights.double().sum(-1).cpu()
    ranks = torch.arange(width).unsqueeze(0)
    before = torch.where(ranks < (j - 1).unsqueeze(1), top, 0.0).sum(1)
    at = top.gather(1, (j - 1).unsqueeze(1)).squeeze(1)
    after = top.gather(1, j.clamp(max=width - 1).unsqueeze(1)).squeeze(1)
    after = torch.where(j < width, after, 0.0)
    return before, at, after, top[:, 0], total


def top_k_values(plan: RowPlan) -> torch.Tensor:
    """top_k = the boundary rank (int64, CPU)."""
    return plan.boundary.clone()


def top_p_values(
    weights: torch.Tensor, plan: RowPlan, gen: torch.Generator, with_top_k: bool
) -> torch.Tensor:
    """top_p per row (float64, CPU) at the edge of rank j (module docstring)."""
    before, at, _, _, total = _edges(weights, plan)
    rows = before.numel()
    u = 0.25 + 0.5 * torch.rand(rows, generator=gen, dtype=torch.float64)
    single = (before + u * torch.minimum(at, 0.1 * total)) / total
    if not with_top_k:
        return single.clamp(0.0, 1.0)
    # Sequential keeps rank j iff before <= p * (before + at); joint at p - 0.1 drops it iff
    # before > (p - 0.1) * total. Both: p in [lo, hi].
    lo = before / (before + at)
    hi = (before / total + 0.1).clamp(max=0.999)
    loose = lo + (0.3 + 0.6 * torch.rand(rows, generator=gen, dtype=torch.float64)) * (1 - lo)
    return torch.where(hi - lo >= 0.02, lo + u * (hi - lo), loose).clamp(0.0, 1.0)


def min_p_values(weights: torch.Tensor, plan: RowPlan) -> torch.Tensor:
    """min_p per row (float64, CPU): the threshold halfway between ranks j and j + 1."""
    _, at, after, first, _ = _edges(weights, plan)
    return ((at + after) / 2 / first).clamp(0.0, 1.0)

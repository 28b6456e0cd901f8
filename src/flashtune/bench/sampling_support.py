"""Sampling: the exact set of tokens each row allows, and a test of the draws' mass at its
edge (docs/evaluation.md, "Sampling").

From a sampling definition's inputs, found by name (the `[rows, vocab]` float input whose
name ends in `probs` or `logits`, and `top_k`, `top_p`, `min_p` when present), each row gets
two sets of tokens, computed in float64 over the tokens sorted by probability:

- **allowed**: every token some honest sampler may draw. Ties are kept: top-k allows every
  token >= the k-th largest; top-p allows a token when the mass of the tokens strictly more
  likely is at most top_p of the row's (top_p <= 0: the most likely tokens), plus a slack of
  `P_SLACK` of the row's mass for float32 sums in another order; with top_k as well, both
  the sequential rule (top-k, renormalize, top-p: FlashInfer's default, the corpus's
  Definitions) and the joint one (both filters on the original row) are allowed; min-p
  allows tokens >= min_p * max (relative slack 1e-6). Probabilities of zero (logits of
  -inf) are never allowed. top_k <= 0 or >= vocab, top_p >= 1 and min_p <= 0 filter nothing.
- **sure**: the tokens that every honest sampler keeps (ties at an edge and the slack taken
  the other way, the sequential rule for top_p).

`support_problem`: a draw outside its row's allowed set fails, whatever the draw count.

`edge_problem`: a sampler that keeps too few tokens draws from a subset of the allowed set.
For each wrong sampler it names (argmax, top-(k-1), top-(p - 0.1), min-(p + 0.1)), the
*edge* of a row is the part of its sure set that the wrong sampler's allowed set lacks, and
q_r, the edge's mass over the allowed set's, is at most the chance that an honest draw lands
there. X, the draws landing on the edges of all rows, is then at least a sum of Binomial(n,
q_r) under an honest sampler, and zero under the wrong one. The check fails when a
Chernoff bound on P(X <= observed) falls below EDGE_ALPHA / (the number of edges tested):
a false failure has probability at most EDGE_ALPHA = 1e-6 per check. A wrong sampler is
caught for sure once sum_r n * -log(1 - q_r) > log(edges / EDGE_ALPHA) (flat rows of
bench's synthesized inputs: q_r = 1/k for top-(k-1)).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "EDGE_ALPHA",
    "P_SLACK",
    "Filters",
    "filters_from",
    "kept_sets",
    "support_problem",
    "outputs_outside_support",
    "edge_problem",
    "edge_powers",
    "lower_tail_log_bound",
]

# The false-failure probability of edge_problem, per check (split over the edges tested).
EDGE_ALPHA = 1e-6
# Slack of the top-p rule, as a fraction of the row's mass: float32 sums over 128k sorted
# values, in any order, stay well inside it; a wrong sampler's p - 0.1 is 100x outside.
P_SLACK = 1e-3
_MIN_P_SLACK = 1e-6  # relative: min_p * max rounded in float32


@dataclass(frozen=True)
class Filters:
    """One check's rows: `weights` [rows, vocab] float64 (probabilities, or the softmax of the
    logits rounded to float32, as a kernel sees them), and the filters (per row, or None
    where the definition has no such input)."""

    weights: torch.Tensor
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None


def _per_row(value: Any, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    return t.detach().to(device, dtype).reshape(-1).expand(rows).clone()


def filters_from(inputs: Mapping[str, Any], rows: int) -> Filters | None:
    """The rows and filters of `inputs`, by name (module docstring); None without a
    `[rows, vocab]` float input named `*probs` or `*logits`."""
    scores_name = None
    for name, value in inputs.items():
        if (
            name.lower().endswith(("probs", "logits"))
            and isinstance(value, torch.Tensor)
            and value.is_floating_point()
            and value.dim() == 2
            and value.shape[0] == rows
        ):
            scores_name = name
            break
    if scores_name is None:
        return None
    scores = inputs[scores_name].detach()
    device = scores.device
    if scores_name.lower().endswith("logits"):
        weights = torch.softmax(scores.double(), dim=-1).float().double()
    else:
        weights = scores.double().clamp_min(0.0)
    got = {n.lower(): v for n, v in inputs.items()}

    def per_row(name: str, dtype: torch.dtype) -> torch.Tensor | None:
        value = got.get(name)
        if value is None or (isinstance(value, torch.Tensor) and value.numel() not in (1, rows)):
            return None
        return _per_row(value, rows, dtype, device)

    return Filters(
        weights,
        per_row("top_k", torch.int64),
        per_row("top_p", torch.float64),
        per_row("min_p", torch.float64),
    )


@dataclass(frozen=True)
class _Sorted:
    values: torch.Tensor  # [rows, vocab] descending
    order: torch.Tensor  # token at each sorted position
    rank: torch.Tensor  # sorted position of each token
    cum: torch.Tensor  # inclusive cumulative mass
    greater: torch.Tensor  # mass strictly more likely than each position's token
    through_ties: torch.Tensor  # mass before the last of each position's ties
    first: torch.Tensor  # first sorted position of each position's value
    last: torch.Tensor  # last sorted position of each position's value
    total: torch.Tensor  # [rows] row mass


def _sort(weights: torch.Tensor) -> _Sorted:
    values, order = torch.sort(weights, dim=-1, descending=True)
    positions = torch.arange(order.shape[1], device=order.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(1, order, positions)
    cum = torch.cumsum(values, dim=-1)
    before = cum - values
    ascending = (-values).contiguous()
    first = torch.searchsorted(ascending, ascending, right=False)
    last = torch.searchsorted(ascending, ascending, right=True) - 1
    return _Sorted(
        values,
        order,
        rank,
        cum,
        before.gather(1, first),
        before.gather(1, last),
        first,
        last,
        cum[:, -1],
    )


def kept_sets(
    s: _Sorted,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(allowed, sure) [rows, vocab] in sorted order (module docstring)."""
    rows, vocab = s.values.shape
    pos = torch.arange(vocab, device=s.values.device).unsqueeze(0)
    positive = s.values > 0
    allowed, sure = positive.clone(), positive.clone()
    sure_mass = s.total
    k_active = None
    if top_k is not None:
        k_active = ((top_k > 0) & (top_k < vocab)).unsqueeze(1)
        kth = (top_k.clamp(1, vocab) - 1).unsqueeze(1)
        last_k, first_k = s.last.gather(1, kth), s.first.gather(1, kth)
        allowed &= ~k_active | (pos <= last_k)
        sure &= ~k_active | torch.where(last_k == kth, pos <= kth, pos < first_k)
        # The sequential rule renormalizes over the k most likely: its smallest mass.
        sure_mass = torch.where(k_active.squeeze(1), s.cum.gather(1, kth).squeeze(1), s.total)
    if top_p is not None:
        p = top_p.clamp_min(0.0).unsqueeze(1)
        active = p < 1.0
        slack = P_SLACK * s.total.unsqueeze(1)
        allowed &= ~active | (s.greater <= p * s.total.unsqueeze(1) + slack)
        sure &= ~active | (s.through_ties <= p * sure_mass.unsqueeze(1) - slack)
    if min_p is not None:
        threshold = (min_p.unsqueeze(1) * s.values[:, :1]).expand(rows, vocab)
        active = (min_p > 0).unsqueeze(1)
        allowed &= ~active | (s.values >= threshold * (1 - _MIN_P_SLACK))
        sure &= ~active | (s.values >= threshold * (1 + _MIN_P_SLACK))
    return allowed, sure


def _describe(f: Filters, row: int) -> str:
    parts = []
    for name in ("top_k", "top_p", "min_p"):
        value = getattr(f, name)
        if value is not None:
            v = value[row].item()
            parts.append(f"{name}={v:.6g}" if isinstance(v, float) else f"{name}={v}")
    return ", ".join(parts)


def support_problem(samples: torch.Tensor, f: Filters) -> str | None:
    """A draw outside its row's allowed set (samples [rows, draws], in the vocabulary)."""
    s = _sort(f.weights)
    allowed, _ = kept_sets(s, f.top_k, f.top_p, f.min_p)
    anything = ~allowed.any(1, keepdim=True)  # no allowed token: left to the other checks
    ranks = s.rank.gather(1, samples.to(s.rank.device))
    outside = ~(allowed.gather(1, ranks) | anything)
    if not bool(outside.any()):
        return None
    rows = outside.any(1).nonzero().flatten().tolist()
    row = rows[0]
    col = int(outside[row].nonzero()[0])
    token = int(samples[row, col])
    w = float(f.weights[row, token] / s.total[row])
    size = int(allowed[row].sum())
    return (
        f"drew tokens outside the allowed set in {len(rows)} of {samples.shape[0]} rows: row "
        f"{row} drew token {token} (probability {w:.3g}, rank {int(ranks[row, col]) + 1}), "
        f"outside its {size} allowed tokens ({_describe(f, row)})"
    )


def lower_tail_log_bound(q: torch.Tensor, n: int, x: int) -> float:
    """log of a bound on P(X <= x), X = sum_r Binomial(n, q_r): the Chernoff bound
    min over lam <= 0 of sum_r n log(1 - q_r + q_r e^lam) - lam x; exact at x = 0."""
    q = q.double().cpu()
    q = q[q > 0].clamp(max=1.0)
    if q.numel() == 0 or x >= n * float(q.sum()):
        return 0.0
    if x == 0:
        return float(n * torch.log1p(-q).sum()) if bool((q < 1).all()) else -math.inf

    def f(lam: float) -> float:
        return float(n * torch.log1p(q * math.expm1(lam)).sum()) - lam * x

    lo, hi = -60.0, 0.0  # f is convex: ternary search
    for _ in range(200):
        a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if f(a) < f(b):
            hi = b
        else:
            lo = a
    return min(f((lo + hi) / 2), 0.0)


# (label, what the edge holds, what a sampler that avoids it does)
_EDGES = {
    "mode": ("tokens other than each row's most likely one", "always draws the most likely"),
    "top_k": ("each row's k-th most likely token(s)", "keeps only k - 1 tokens"),
    "top_p": ("the tokens a top-(p - 0.1) filter drops", "uses top_p - 0.1"),
    "min_p": ("the tokens a min-(p + 0.1) filter drops", "uses min_p + 0.1"),
}


def _edges(s: _Sorted, f: Filters) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(each tested edge's mask [rows, vocab] in sorted order, the allowed mass [rows])."""
    allowed, sure = kept_sets(s, f.top_k, f.top_p, f.min_p)
    edges = {"mode": sure & (s.values < s.values[:, :1])}
    if f.top_k is not None:
        vocab = s.values.shape[1]
        fewer = torch.where((f.top_k >= 2) & (f.top_k < vocab), f.top_k - 1, 0)
        wrong, _ = kept_sets(s, fewer, f.top_p, f.min_p)
        # k <= 1, or no filter: nothing is dropped, the edge is empty
        edges["top_k"] = sure & ~(wrong | (fewer <= 0).unsqueeze(1))
    if f.top_p is not None:
        wrong, _ = kept_sets(s, f.top_k, (f.top_p - 0.1).clamp_min(0.0), f.min_p)
        edges["top_p"] = sure & ~wrong
    if f.min_p is not None:
        wrong, _ = kept_sets(s, f.top_k, f.top_p, (f.min_p + 0.1).clamp(max=1.0))
        edges["min_p"] = sure & ~wrong
    allowed_mass = (s.values * allowed).sum(1)
    if not bool((allowed_mass > 0).all()):
        return {}, allowed_mass
    tested = {n: m for n, m in edges.items() if bool(((s.values * m).sum(1) > 0).any())}
    return tested, allowed_mass


def edge_powers(f: Filters) -> dict[str, torch.Tensor]:
    """q_r per tested edge (CPU float64 [rows]): at most the share of honest draws that land
    on it (module docstring)."""
    s = _sort(f.weights)
    edges, allowed_mass = _edges(s, f)
    return {n: ((s.values * m).sum(1) / allowed_mass).cpu() for n, m in edges.items()}


def edge_problem(samples: torch.Tensor, f: Filters, alpha: float = EDGE_ALPHA) -> str | None:
    """Too few draws on an edge of the allowed sets (module docstring); samples [rows, n]."""
    s = _sort(f.weights)
    edges, allowed_mass = _edges(s, f)
    if not edges:
        return None
    n = samples.shape[1]
    ranks = s.rank.gather(1, samples.to(s.rank.device))
    each = alpha / len(edges)
    for name, mask in edges.items():
        q = (s.values * mask).sum(1) / allowed_mass
        observed = int(mask.gather(1, ranks).sum())
        log_p = lower_tail_log_bound(q, n, observed)
        if log_p < math.log(each):
            what, wrong = _EDGES[name]
            expected = n * float(q.sum())
            return (
                f"{observed} of {n} draws x {samples.shape[0]} rows landed on {what}, where "
                f"an honest sampler puts at least {expected:.1f} (P <= {math.exp(log_p):.1e} "
                f"< {each:.1e}): as a sampler that {wrong} would"
            )
    return None


def outputs_outside_support(outputs: Mapping[str, Any], inputs: Mapping[str, Any]) -> str | None:
    """A sampling call's draws (integer outputs of one token per row) outside the tokens its
    inputs allow (bench/sampling_support.py): checked on every call, timed ones included, so
    a sampler cannot be honest only on the draws the distribution check sees."""
    for name, value in outputs.items():
        if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dim() != 1:
            continue
        filters = filters_from(inputs, value.shape[0])
        if filters is None:
            continue
        problem = support_problem(value.reshape(-1, 1).long(), filters)
        if problem is not None:
            return f"output {name!r}: {problem}"
    return None

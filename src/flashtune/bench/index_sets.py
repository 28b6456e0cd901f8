"""Integer outputs that are *sets* of indices chosen by a score (the DSA indexer's
topk_indices): compared as sets, order-insensitive, with ties at the k-th score accepted.

A top-k selection has no unique answer where scores tie at the boundary, and its order among
equals is the implementation's: two honest kernels (an fp8 MMA and the fp32 reference)
return the same best k in different orders, and may keep different members of a group
tied (within rounding) at the k-th place. So a row passes when:

1. it holds as many valid indices (not -1) as the reference row, without duplicates;
2. every index is one its row may select (the scorer gives NaN for a slot the row's request
   does not hold: an out-of-range or foreign page);
3. every index not in the reference set scores at least kth - tol, and every reference index
   left out scores at most kth + tol, where kth is the reference set's lowest score and
   tol = SCORE_RTOL * |kth| + SCORE_ATOL * max |score| of the row: the swapped members are
   ties at the boundary, not better tokens dropped.

Scores come from the op's own scorer over the call's inputs, in float64 from the reference's
fp32 math. SCORE_RTOL 1e-3 of the k-th score, plus SCORE_ATOL 2e-3 of the row's largest
score: Hopper's fp8 x fp8 tensor-core MMA does not accumulate in full fp32 (about 14 bits
kept, as DeepSeek-V3's report measured), and the head-weighted sum (signed weights) cancels,
so an honest kernel's scores differ from the fp32 reference by up to ~1e-3 of the row's
scale: measured on an H200, a swap at 1.4e-3 of the k-th score (0.26956 for 0.26994) at
DeepSeek-V3.2's shapes. A wrong kernel (a missing ReLU, scale or head weight) reorders
tokens by O(1), far outside the bound.
Without the inputs (no scorer to call) the sets must be equal exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from flashtune.data import Definition

__all__ = ["SCORE_ATOL", "SCORE_RTOL", "index_set_problem", "index_set_scorer"]

SCORE_RTOL = 1e-3
SCORE_ATOL = 2e-3

# (the call's inputs by name, indices [rows, k] int32 on the CPU) -> float64 scores [rows, k]
# on the CPU: -inf for -1 padding, NaN for an index the row may not select.
Scorer = Callable[[Mapping[str, Any], torch.Tensor], torch.Tensor]


def _dsa_indexer_scores(inputs: Mapping[str, Any], indices: torch.Tensor) -> torch.Tensor:
    from flashtune.ops.dsa.reference import indexer_scores_at

    q = inputs["q_index_fp8"]
    scores = indexer_scores_at(
        q, inputs["k_index_cache_fp8"], inputs["weights"], inputs["seq_lens"],
        inputs["block_table"], indices.to(q.device),
    )  # fmt: skip
    return scores.cpu()


# (op_type, definition name prefix, output) -> the scorer of that output's indices.
_SCORERS: dict[tuple[str, str, str], Scorer] = {
    ("dsa_paged", "dsa_topk_indexer", "topk_indices"): _dsa_indexer_scores,
}


def index_set_scorer(definition: Definition, output: str) -> Scorer | None:
    """The scorer of `output` when it is an index set (see the module docstring), else None."""
    for (op_type, prefix, name), scorer in _SCORERS.items():
        if definition.op_type == op_type and definition.name.startswith(prefix) and output == name:
            return scorer
    return None


def _exact_sets(out: torch.Tensor, ref: torch.Tensor) -> str | None:
    o, r = out.sort(dim=-1).values, ref.sort(dim=-1).values
    bad = (o != r).any(dim=-1).nonzero()
    if bad.numel():
        return f"row {int(bad[0])} selects another set of indices than the reference"
    return None


def index_set_problem(
    name: str,
    out: torch.Tensor,
    ref: torch.Tensor,
    scorer: Scorer | None,
    inputs: Mapping[str, Any] | None,
) -> str | None:
    """Why `out` [rows, k] is not an acceptable selection where `ref` is one, or None."""
    out = out.detach().to("cpu", torch.int64).reshape(-1, out.shape[-1])
    ref = ref.detach().to("cpu", torch.int64).reshape(-1, ref.shape[-1])
    for row in range(out.shape[0]):
        o, r = out[row][out[row] != -1], ref[row][ref[row] != -1]
        if o.numel() != r.numel():
            return f"output {name!r}: row {row} selects {o.numel()} indices, expected {r.numel()}"
        if o.unique().numel() != o.numel():
            return f"output {name!r}: row {row} selects an index twice"
    problem = _exact_sets(out, ref)
    if problem is None:  # the same sets: nothing to score (the common case)
        return None
    if scorer is None or inputs is None:
        return f"output {name!r}: {problem}"
    out_scores = scorer(inputs, out.to(torch.int32))  # on the inputs' device, returned here
    ref_scores = scorer(inputs, ref.to(torch.int32))
    for row in range(out.shape[0]):
        valid = out[row] != -1
        if torch.isnan(out_scores[row][valid]).any():
            bad = int(out[row][valid][torch.isnan(out_scores[row][valid])][0])
            return f"output {name!r}: row {row} selects slot {bad}, which its request does not hold"
        ref_valid = ref[row] != -1
        if not ref_valid.any():
            continue
        finite = ref_scores[row][ref_valid]
        kth = float(finite.min())
        tol = SCORE_RTOL * abs(kth) + SCORE_ATOL * float(finite.abs().max())
        chosen, expected = set(out[row][valid].tolist()), set(ref[row][ref_valid].tolist())
        picked = zip(out[row][valid].tolist(), out_scores[row][valid].tolist(), strict=True)
        for idx, score in picked:
            if idx not in expected and score < kth - tol:
                return (
                    f"output {name!r}: row {row} selects index {idx} scoring {score:.6g}, "
                    f"below the k-th best {kth:.6g} (tolerance {tol:.3g})"
                )
        for idx, score in zip(ref[row][ref_valid].tolist(), finite.tolist(), strict=True):
            if idx not in chosen and score > kth + tol:
                return (
                    f"output {name!r}: row {row} leaves out index {idx} scoring {score:.6g}, "
                    f"above the k-th best {kth:.6g} (tolerance {tol:.3g})"
                )
    return None

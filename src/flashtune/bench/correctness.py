"""Correctness of a solution's outputs against the reference's.

Deterministic ops compare element-wise: an element matches when
``|out - ref| <= atol + rtol * |ref|`` (NaN matches NaN, +-Inf matches itself), and the
solution passes when the fraction of matching elements reaches `matched_ratio`.

Default tolerances by output dtype (`DEFAULT_TOLERANCES`):

    dtype          atol     rtol     matched_ratio   why
    float64        1e-7     1e-7     1.0
    float32        1e-3     1e-3     1.0             fp32 outputs of low-precision kernels (lse)
    float16        2e-3     2e-3     0.999           ~2 ulp; a few outliers from another
    bfloat16       1.6e-2   1.6e-2   0.999           accumulation order are tolerated
    float8_*       1.25e-1  1.25e-1  0.99
    integer/bool   0        0        1.0             exact

They are overridden, in increasing priority, per op_type (`OP_TYPE_TOLERANCES`), per
definition (tags ``tol:atol=0.05``, ``tol:rtol=0.05``, ``tol:matched_ratio=0.99``,
optionally per dtype: ``tol:bfloat16:atol=0.05``) and on the command line (--atol/--rtol).

Stochastic ops are chosen by the definition's op_type (`STOCHASTIC_OP_TYPES`), never by its
name, and are checked by distribution: many draws of the solution and of the reference on
the same inputs, and the total variation distance between their empirical distributions
per row, which must stay below `max(tvd, 3 * noise)` where noise is the TVD expected
between two samplings of the same distribution with that many draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from flashtune.data.models import Correctness, Definition, EvaluationStatus
from flashtune.data.synth import torch_dtype

__all__ = [
    "Tolerance",
    "DEFAULT_TOLERANCES",
    "OP_TYPE_TOLERANCES",
    "STOCHASTIC_OP_TYPES",
    "Verdict",
    "is_stochastic",
    "tolerance_for",
    "compare_outputs",
    "inputs_modified",
    "distribution_check",
]


@dataclass(frozen=True)
class Tolerance:
    """Element-wise tolerance and the fraction of elements that must meet it."""

    atol: float
    rtol: float
    matched_ratio: float = 1.0


_EXACT = Tolerance(0.0, 0.0, 1.0)
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-7, 1e-7, 1.0),
    "float32": Tolerance(1e-3, 1e-3, 1.0),
    "float16": Tolerance(2e-3, 2e-3, 0.999),
    "bfloat16": Tolerance(1.6e-2, 1.6e-2, 0.999),
    "float8_e4m3fn": Tolerance(1.25e-1, 1.25e-1, 0.99),
    "float8_e5m2": Tolerance(2.5e-1, 2.5e-1, 0.99),
}

# op_type -> dtype -> Tolerance. Attention's fp32 lse sums exp over up to 32k bf16 logits:
# kernels that round P to bf16 before the PV product differ from the fp32 reference by ~1e-2.
OP_TYPE_TOLERANCES: dict[str, dict[str, Tolerance]] = {
    "gqa_paged": {"float32": Tolerance(1e-2, 1e-2, 0.999)},
    "gqa_ragged": {"float32": Tolerance(1e-2, 1e-2, 0.999)},
}

# Op types whose outputs are random draws: checked by distribution, not element-wise.
STOCHASTIC_OP_TYPES: frozenset[str] = frozenset({"sampling"})


def is_stochastic(definition: Definition) -> bool:
    return definition.op_type in STOCHASTIC_OP_TYPES


def _tag_overrides(definition: Definition, dtype: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for raw in definition.tags_with("tol:"):
        key, _, value = raw.partition("=")
        scope, _, field = key.rpartition(":")
        if scope and scope != dtype:
            continue
        if field in ("atol", "rtol", "matched_ratio"):
            try:
                out[field] = float(value)
            except ValueError:
                raise ValueError(
                    f"{definition.name}: tag 'tol:{raw}' has a non-numeric value {value!r}"
                ) from None
    return out


def tolerance_for(
    definition: Definition,
    dtype: str,
    atol: float | None = None,
    rtol: float | None = None,
) -> Tolerance:
    """The tolerance for an output of `dtype`: defaults < op_type < definition tags < CLI."""
    tol = DEFAULT_TOLERANCES.get(dtype, _EXACT)
    tol = OP_TYPE_TOLERANCES.get(definition.op_type, {}).get(dtype, tol)
    tol = replace(tol, **_tag_overrides(definition, dtype))  # type: ignore[arg-type]
    if atol is not None:
        tol = replace(tol, atol=atol)
    if rtol is not None:
        tol = replace(tol, rtol=rtol)
    return tol


@dataclass
class Verdict:
    """The outcome of one comparison: a status, its reason and the figures behind it."""

    status: EvaluationStatus
    reason: str | None = None
    correctness: Correctness | None = None


def _as_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (int, float, bool)):
        return torch.tensor(value)
    return None


def compare_outputs(
    definition: Definition,
    reference: Mapping[str, Any],
    actual: Mapping[str, Any],
    atol: float | None = None,
    rtol: float | None = None,
) -> Verdict:
    """Compare outputs by name; the first shape, dtype or numerical failure decides."""
    worst_abs = worst_rel = 0.0
    worst_ratio = 1.0
    for name, spec in definition.outputs.items():
        ref = _as_tensor(reference[name])
        out = actual.get(name)
        if not isinstance(out, torch.Tensor):
            return Verdict(
                EvaluationStatus.INCORRECT_SHAPE,
                f"output {name!r} is {type(out).__name__}, not a tensor",
            )
        assert ref is not None
        if tuple(out.shape) != tuple(ref.shape):
            return Verdict(
                EvaluationStatus.INCORRECT_SHAPE,
                f"output {name!r} has shape {list(out.shape)}, expected {list(ref.shape)}",
            )
        expected_dtype = torch_dtype(spec.dtype)
        if out.dtype != expected_dtype:
            return Verdict(
                EvaluationStatus.INCORRECT_DTYPE,
                f"output {name!r} has dtype {out.dtype}, expected {expected_dtype}",
            )
        tol = tolerance_for(definition, spec.dtype, atol, rtol)
        o = out.detach().to(device="cpu", dtype=torch.float64)
        r = ref.detach().to(device="cpu", dtype=torch.float64)
        if o.numel() == 0:
            continue
        o_bad, r_bad = ~torch.isfinite(o), ~torch.isfinite(r)
        # Non-finite values match only the same non-finite value at the same place.
        same_nonfinite = o_bad & r_bad & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
        diff = (o - r).abs()
        finite = ~o_bad & ~r_bad
        matched = same_nonfinite | (finite & (diff <= tol.atol + tol.rtol * r.abs()))
        ratio = matched.double().mean().item()
        if finite.any():
            abs_err = diff[finite].max().item()
            rel_err = (diff[finite] / r.abs()[finite].clamp_min(1e-12)).max().item()
            worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        worst_ratio = min(worst_ratio, ratio)
        new_nonfinite = o_bad & ~r_bad
        figures = Correctness(
            max_absolute_error=worst_abs, max_relative_error=worst_rel, matched_ratio=worst_ratio
        )
        if new_nonfinite.any():
            kind = "NaN" if torch.isnan(o[new_nonfinite]).any() else "Inf"
            return Verdict(
                EvaluationStatus.INCORRECT_NUMERICAL,
                f"output {name!r} has {int(new_nonfinite.sum())} {kind} value(s) where the "
                "reference is finite",
                figures,
            )
        if ratio < tol.matched_ratio:
            return Verdict(
                EvaluationStatus.INCORRECT_NUMERICAL,
                f"output {name!r}: {ratio:.4%} of elements within atol={tol.atol:g}, "
                f"rtol={tol.rtol:g} (need {tol.matched_ratio:.4%}); max abs error {worst_abs:.4g}",
                figures,
            )
    return Verdict(
        EvaluationStatus.PASSED,
        None,
        Correctness(
            max_absolute_error=worst_abs, max_relative_error=worst_rel, matched_ratio=worst_ratio
        ),
    )


def inputs_modified(pristine: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Names of tensor inputs whose contents changed (a solution that wrote into them)."""
    changed = []
    for name, before in pristine.items():
        now = after[name]
        if isinstance(before, torch.Tensor) and not torch.equal(before, now):
            # torch.equal is False for NaN == NaN: inputs never hold NaN (synthesized).
            changed.append(name)
    return changed


def _noise_tvd(pooled: torch.Tensor, draws: int) -> float:
    # Expected TVD between two independent n-sample empirical distributions of p:
    # 0.5 * sum_t E|p1_t - p2_t| ~= 0.5 * sum_t sqrt(2 p_t (1 - p_t) / n) * sqrt(2 / pi).
    p = pooled
    return 0.5 * float((torch.sqrt(2 * p * (1 - p) / draws) * math.sqrt(2 / math.pi)).sum())


def distribution_check(
    definition: Definition,
    solution: Callable[[], Mapping[str, Any]],
    reference: Callable[[], Mapping[str, Any]],
    draws: int = 2000,
    max_tvd: float = 0.05,
) -> Verdict:
    """Check a sampling op: TVD per row between `draws` draws of each side (integer outputs)."""
    name = next(iter(definition.outputs))
    sol_draws, ref_draws = [], []
    for _ in range(draws):
        out = solution()[name]
        if not isinstance(out, torch.Tensor):
            return Verdict(EvaluationStatus.INCORRECT_SHAPE, f"output {name!r} is not a tensor")
        sol_draws.append(out.detach().reshape(-1).to("cpu", torch.int64))
        ref_draws.append(reference()[name].detach().reshape(-1).to("cpu", torch.int64))
    sol, ref = torch.stack(sol_draws, 1), torch.stack(ref_draws, 1)  # [rows, draws]
    if sol.shape != ref.shape:
        return Verdict(EvaluationStatus.INCORRECT_SHAPE, f"output {name!r} has the wrong shape")
    worst, worst_limit = 0.0, 0.0
    for row in range(sol.shape[0]):
        values = torch.cat([sol[row], ref[row]])
        support, inverse = torch.unique(values, return_inverse=True)
        p = torch.bincount(inverse[:draws], minlength=len(support)).double() / draws
        q = torch.bincount(inverse[draws:], minlength=len(support)).double() / draws
        tvd = 0.5 * float((p - q).abs().sum())
        limit = max(max_tvd, 3 * _noise_tvd((p + q) / 2, draws))
        if tvd - limit > worst - worst_limit or row == 0:
            worst, worst_limit = tvd, limit
    figures = Correctness(max_absolute_error=worst, max_relative_error=None, matched_ratio=None)
    if worst > worst_limit:
        return Verdict(
            EvaluationStatus.INCORRECT_NUMERICAL,
            f"sampled distribution differs from the reference's: total variation distance "
            f"{worst:.3f} > {worst_limit:.3f} over {draws} draws",
            figures,
        )
    return Verdict(EvaluationStatus.PASSED, None, figures)

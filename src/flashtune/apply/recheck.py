"""Re-judging a PASSED trace from the correctness figures it recorded, within a definition's
`Bounds` (flashtune.apply.table.correctness_bounds computes them): datasets come from
strangers, and a trace may have been judged by a looser bench than this one.

Two rules (`correctness_problem`): the bench's own element-wise rule, for traces that record
the element-wise atol/rtol their matched_ratio was counted with, no looser than the
definition's; else the max-error rule (max absolute error <= atol or max relative error <=
rtol), as apply has always judged traces that do not say which tolerance judged them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flashtune.data.models import Correctness, EvaluationStatus, Trace

__all__ = ["Bounds", "correctness_problem"]


@dataclass(frozen=True)
class Bounds:
    """The correctness a PASSED trace must have recorded to count as passed here
    (`correctness_problem` says how the two rules combine).

    matched_ratio: the least fraction of matching elements the bench accepts.
    max_rel_norm, max_abs: bounds on the relative norm error and on every element's absolute
    error, where the tolerances have them (None or inf: no bound).
    elementwise_atol/elementwise_rtol: the bench's rule: the loosest element-wise tolerance
    a trace may record having counted its matched_ratio with (None: the rule is off).
    atol/rtol: the max-error rule, for traces the bench's rule does not accept: the max
    absolute or max relative error must meet one of them (an allclose-like OR: relative
    error explodes near zero outputs, absolute error on large ones)."""

    atol: float
    rtol: float
    matched_ratio: float | None = None
    max_rel_norm: float | None = None
    max_abs: float | None = None
    elementwise_atol: float | None = None
    elementwise_rtol: float | None = None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return _number(value) and math.isfinite(value)


def _bench_rule_problem(
    c: Correctness, rel_norm: float | None, recorded: tuple[Any, Any], bounds: Bounds
) -> str | None:
    """Why a trace does not prove it passed the bench's element-wise rule at a tolerance no
    looser than `bounds` allow, or None: its matched_ratio counted at a recorded atol/rtol
    within elementwise_atol/rtol and meeting matched_ratio, a relative norm error recorded
    and met where the tolerance bounds it, and a max absolute error recorded where max_abs
    caps it (the caller checks every recorded figure against its bound)."""
    if bounds.elementwise_atol is None or bounds.elementwise_rtol is None:
        return "the definition has no element-wise tolerance"  # stochastic, or unknown
    rec_atol, rec_rtol = recorded
    if rec_atol is None or rec_rtol is None:
        return "no element-wise tolerance recorded"  # matched_ratio alone proves nothing
    if rec_atol > bounds.elementwise_atol or rec_rtol > bounds.elementwise_rtol:
        return (
            f"its element-wise tolerance (atol={rec_atol:g}, rtol={rec_rtol:g}) is looser than "
            f"atol={bounds.elementwise_atol:g}, rtol={bounds.elementwise_rtol:g}"
        )
    if c.matched_ratio is None or bounds.matched_ratio is None:
        return "no matched_ratio recorded"
    if bounds.max_rel_norm is not None and math.isfinite(bounds.max_rel_norm) and rel_norm is None:
        # The norm bounds what the unmatched elements add up to: unrecorded, nothing does.
        return "no relative norm error recorded"
    if bounds.max_abs is not None and math.isfinite(bounds.max_abs):
        if c.max_absolute_error is None:
            return "no max absolute error recorded"
    return None


def correctness_problem(trace: Trace, bounds: Bounds) -> str | None:
    """Why a PASSED trace does not count as passed within `bounds`, or None.

    Every trace must meet the bounds on what it recorded (matched_ratio, relative norm
    error, max_abs). Then it passes by either rule:
    - the bench's: it records the element-wise atol/rtol its matched_ratio was counted with
      (flashtune benches since they record them), no looser than elementwise_atol/rtol, and
      its matched_ratio and relative norm error (which it must record, where the tolerance
      bounds it) meet the bounds. This is how the bench judged it, so honest traces of large
      outputs pass (a bf16 GEMM with K >= 4096 errs by ~1 where |C| ~ 100);
    - the max-error rule, for every other trace (older benches, other tools, a tolerance
      recorded looser than the definition's): its max absolute error <= atol or its max
      relative error <= rtol.
    The bench's rule admits no trace a forger could not already pass: the recorded
    tolerance is one more claim beside the figures, which a forged trace could set to
    zero; a trace judged by a looser bench either says so or proves nothing and falls to
    the max-error rule, as before."""
    ev = trace.evaluation
    if ev is None or ev.status != EvaluationStatus.PASSED:
        return "not PASSED"
    if ev.performance is None:
        return "PASSED without a latency"
    latency = ev.performance.latency_ms
    if not (_finite(latency) and latency > 0):
        return f"latency {latency!r} ms is not a positive number"
    c = ev.correctness
    if c is None:
        return "PASSED without a correctness record: its tolerance cannot be checked"
    # Recorded by newer benches only (flashtune extensions).
    rel_norm = getattr(c, "rel_norm_error", None)
    recorded = (getattr(c, "atol", None), getattr(c, "rtol", None))
    figures = {
        "max_absolute_error": c.max_absolute_error,
        "max_relative_error": c.max_relative_error,
        "matched_ratio": c.matched_ratio,
        "rel_norm_error": rel_norm,
    }
    for name, value in figures.items():
        if value is not None and not (_finite(value) and value >= 0):
            return f"correctness.{name} is {value!r}"
    for name, value in zip(("atol", "rtol"), recorded, strict=True):
        # A tolerance may be inf (a tag turns a bound off), never NaN or negative.
        if value is not None and not (_number(value) and value >= 0):
            return f"correctness.{name} is {value!r}"
    if bounds.matched_ratio is not None and c.matched_ratio is not None:
        if c.matched_ratio < bounds.matched_ratio:
            return f"matched_ratio {c.matched_ratio:g} < {bounds.matched_ratio:g}"
    if bounds.max_rel_norm is not None and rel_norm is not None and rel_norm > bounds.max_rel_norm:
        return f"relative norm error {rel_norm:g} > {bounds.max_rel_norm:g}"
    abs_err, rel_err = c.max_absolute_error, c.max_relative_error
    if bounds.max_abs is not None and abs_err is not None and abs_err > bounds.max_abs:
        return f"max absolute error {abs_err:g} > {bounds.max_abs:g}"
    bench_rule = _bench_rule_problem(c, rel_norm, recorded, bounds)
    if bench_rule is None:
        return None
    if abs_err is None and rel_err is None:
        # Nothing recorded proves the outputs were compared at all (FlashInfer-Bench always
        # writes both; flashtune's bench writes one for every verdict it reaches).
        return "PASSED without a max error recorded: its correctness cannot be checked"
    if (abs_err is not None and abs_err <= bounds.atol) or (
        rel_err is not None and rel_err <= bounds.rtol
    ):
        return None
    why = f"max error (absolute {abs_err}, relative {rel_err}) exceeds atol={bounds.atol:g} "
    why += f"and rtol={bounds.rtol:g}"
    if bounds.elementwise_atol is not None:
        why += f", and the bench's element-wise rule cannot count: {bench_rule}"
    return why

"""Correctness of a solution's outputs against the reference's.

Deterministic ops compare each output in four ways, and all four must hold:

1. element-wise: an element matches when ``|y - r| <= atol + rtol * |r|`` (NaN matches NaN,
   +-Inf matches itself), and the fraction of matching elements reaches `matched_ratio`;
2. relative norm: ``||y - r||_2 / ||r||_2 <= max_rel_norm`` over the elements finite in both
   (skipped for an all-zero reference, where 1 and 3 decide);
3. per-row relative norm (rows: every dimension but the last; outputs of two rows or more):
   ``||y_i - r_i|| / max(||r_i||, floor) <= max(max_row_rel_norm, max_rel_norm)`` for every
   row i, where floor = max(ROW_FLOOR * ||r|| / sqrt(rows), tiny(dtype) * sqrt(row length)):
   a row whose reference norm is under 1e-3 of the tensor's RMS row norm is judged as if it
   had that norm (its error counts relative to the tensor's scale, not to a near-zero of its
   own), and rows in the output dtype's subnormal range as if their elements were normal;
4. absolute cap: ``|y - r| <= max_abs`` for every element finite in both.

A NaN or Inf where the reference is finite always fails. The figures go into the trace's
Correctness record: max_absolute_error, max_relative_error, matched_ratio, and
rel_norm_error (the worst ||y - r|| / ||r|| over the outputs), row_rel_norm_error (the
worst row of any output, as check 3 computes it), with the element-wise atol
and rtol the matches were counted with (the loosest over the outputs, as the figures are
the worst): a matched_ratio means nothing without them, and apply re-judges a trace by its
element-wise rule only when they are no looser than the definition's (flashtune.apply.table).

Why four: matched_ratio alone passed wrong attention kernels. Outputs averaged over 32k
zero-mean values are about 0.007 in size, below bf16's atol, so an all-zero output "matched"
92%; a head set to 100.0 is 1 element in 2,048 heads x 128, inside the 0.1% of outliers
bf16 allows. The relative norm bounds what the outliers add up to (zeros: 1.0; the 100.0
head: 3.8 at batch 64) whatever the output's size; max_abs bounds each one where an output
has a known scale, as the attention LSE has. The whole-tensor norm lets through a wrong part
that is small, or a small share of the output: one row of 2048 scaled by 1.1 (2.2e-3), the
small rows of an rmsnorm with eps 1000x too large or of a GEMM that flushes them; the
per-row norm sees each (0.1, 0.96, 1.0).

Default tolerances by output dtype (`DEFAULT_TOLERANCES`):

    dtype          atol     rtol     matched  max_rel_norm  max_row_rel_norm  max_abs
    float64        1e-7     1e-7     1.0      1e-6          1e-5              -
    float32        1e-3     1e-3     1.0      1e-3          1.5e-3            -
    float16        2e-3     2e-3     0.999    5e-3          5e-3              -
    bfloat16       1.6e-2   1.6e-2   0.999    1e-2          2.5e-2            -
    float8_e4m3fn  1.25e-1  1.25e-1  0.99     1e-1          3e-1              -
    float8_e5m2    2.5e-1   2.5e-1   0.99     2e-1          6e-1              -
    integer/bool   0        0        1.0      0             -                 0       exact

max_rel_norm is about 3x the worst honest error measured (CPU, and H100 for the bundled
kernels against their fp32 references, every bundled workload):
- bfloat16: 2.95e-3 silu_and_mul in eager torch (silu rounded to bf16, then the product);
  2.4e-3 attention that rounds P to bf16 before PV (flashtune's Triton kernels on H100 and
  a CPU emulation at 128..32k tokens, zero-mean V; 1.5e-3 with V of mean 0.5); 1e-4 GEMM,
  2e-5 rmsnorm and rope. Rounding alone costs 1.7e-3.
- float16: 9e-4 attention with P rounded to fp16 (CPU emulation); rounding alone 2e-4.
- float32: 2.9e-4 for a GEMM on TF32 tensor cores (CPU emulation, K = 1k..14k).
- float8: rounding alone costs 2.7e-2 (e4m3) and 5.3e-2 (e5m2) of the norm.
Under the input families of flashtune.data.families (rows over decades, outlier channels,
uniform and Laplace entries) the worst whole-tensor figures are 3.4e-3 bf16 (rotary
embedding in bf16 arithmetic, CPU), 3.3e-4 float32 (TF32 GEMM), 2.8e-4 float16.
max_row_rel_norm sits about 3x above the worst honest row, measured the same way:
- bfloat16: 7.0e-3 HuggingFace's RMSNorm (normalize in fp32, round, times the bf16 weight;
  CPU), 6.0e-3 fused add-RMSNorm with the sum rounded to bf16, 5.5e-3 rotary embedding in
  bf16 arithmetic, 5.0e-3 attention with P rounded to bf16 (CPU), 4.3e-3 flashtune's paged
  prefill, 4.1e-3 eager torch silu * up (H100). A row that one element dominates (an outlier
  channel) can lose up to 2^-8 per bf16 rounding: two roundings, 7.8e-3.
- float16: 6.2e-4 attention with P rounded to fp16 (CPU), 1.4e-4 GEMM (cuBLAS and
  flashtune, H100); the bound is the whole-tensor one (a row bound is never tighter).
- float32: 4.1e-4 TF32 GEMM (CPU emulation, K = 1k..14k).
- float8: a dominated row loses up to 6.25% (e4m3) / 12.5% (e5m2) per rounding.
Wrong kernels, for scale (bf16 output of a 32k-token decode, zero-mean V): skipping the
last 128 pages 0.25, softmax scale x1.05 0.068, x1.01 0.015, the last page skipped 0.021.
With V of mean 0.5, as flashtune.data.synth draws it, the same kernels give 5.1e-3, 2.3e-3,
1.1e-3 and 9.8e-4, under the bound: a constant in V cancels from the error of every kernel
whose weights still sum to 1, and only grows ||r||. The LSE bound catches those.

No max_abs by dtype: a cap needs a known output scale. Honest bf16 GEMMs of the bundled set
differ from the reference by up to 0.5 where |C| reaches 640 (H100), so any cap small enough
to matter on unit-scale outputs fails them; what matched_ratio lets through is bounded in
aggregate by max_rel_norm instead. Definitions whose outputs have a known scale set one by
tag.

Attention (op_types in `ATTENTION_OP_TYPES`): their fp32 output is the base-2 log-sum-exp
of the logits. Its error is absolute (a log: absolute error = relative error of the softmax
denominator), so it gets atol 1e-3, rtol 0, matched 1.0, max_abs 1e-3 (`OP_TYPE_TOLERANCES`).
Honest kernels differ by far less, but not all by the same: measured on H100 over every
bundled gqa workload (up to 32k tokens), flashtune's kernels differ by at most 2.9e-6 (1.9e-6
in a CPU emulation at 32k tokens); FlashInfer 0.2.14's decode kernels (exp2 approximations)
differ by more than 1e-4 on 5-88% of request-heads in the same run, so a 1e-4 bound failed a
peer its users trust. (An earlier comment here put the difference at 1e-2; that did not
reproduce.) Wrong kernels: skipping 128 of 2048 pages moves the LSE by 9.8e-2, a softmax
scale x1.05 by 7.6e-2, x1.01 by 1.8e-2: caught. The known gap: the last page of a 32k-token
request moves it by 9.8e-4 to 1.5e-3, at the bound; on the bundled workloads (requests of at
most a few thousand tokens) one page is a larger share and is caught. Kernels that approximate the logits (soft-capping through tanh.approx,
fp16 QK accumulation) err by ~1e-3 and need a tag such as ``tol:float32:max_abs=3e-3``.

Mamba's selective state update (op_type mamba_ssu) has two bf16 outputs, the output and the
whole state cache after one recurrence step (new_state), and the dtype's bounds hold both (no
override). Measured on the CPU at mamba_ssu_decode_h64_d64_s128_ng4 under its value family
(flashtune.data.families, SSM_OP_TYPES; batch 8 and 64, a cache of twice the batch, 4
seeds): the step in float64 differs from the fp32 reference by 2.1e-5 of the norm (rows
1.6e-3); an output taken from the state after its bf16 rounding by 2.6e-3 (rows 1.3e-2):
honest, and passing. Wrong kernels fail: no softplus (NaN), dt_bias or the decay dropped, the
output from the old state, heads mapped to groups by h % ngroups, D dropped (0.1 of the
output's norm), pad rows' state written. The untouched slots of new_state are exact copies
and dilute its whole-tensor norm (one head's state left stale: 8.4e-4, under max_rel_norm),
so the element bounds and the per-row bound (rows of dstate values: one slot, head and
channel) catch a partly wrong update: one head left stale fails matched_ratio (99.35%); the
last state column 5% off (1/128 of the elements) fails it too (99.82%, rows 2.0e-2).

Overrides, in increasing priority: per op_type (`OP_TYPE_TOLERANCES`), per definition (tags
``tol:atol=0.05``, ``tol:rtol=0.05``, ``tol:matched_ratio=0.99``, ``tol:max_rel_norm=0.02``,
``tol:max_abs=0.5``, optionally per dtype: ``tol:bfloat16:atol=0.05``; ``inf`` turns a bound
off) and on the command line.

Stochastic ops are chosen by the definition's op_type (`STOCHASTIC_OP_TYPES`), never by its
name, and are checked by distribution: many draws of the solution and of the reference on
the same inputs, and the total variation distance between their empirical distributions
per row, which must stay below `max(tvd, 3 * noise, noise' + spread)` where noise is the TVD
expected between two samplings of the same distribution with that many draws (noise' its
upper bound 0.5 * sum sqrt(2 p (1 - p) / n)), and spread = sqrt(log(rows / TVD_ALPHA) / n):
one draw moves the TVD by at most 1/n, so by McDiarmid's inequality an honest sampler fails
with probability at most TVD_ALPHA = 1e-6 per check. `3 * noise` alone failed honest samplers
on rows of two equal tokens 1.5% of the time (15 of 1000 checks at 1000 draws; the TVD of
two tokens is half-normal, and 3x its mean is 2.4 sigma).

Over a 128k-token vocabulary a thousand draws rarely hit a token twice: the per-token TVD is
then near 1 for two honest samplers and its noise bound says nothing. Two checks do not fade
with the vocabulary size, given the row's scores (the definition's `[rows, vocab]` float
input, probabilities or logits): a drawn token must be a real token with a non-zero
probability (index in range; probability > 0 or logit > -inf), and the scores of the tokens
drawn must be distributed alike on both sides. The second is a Mann-Whitney rank test per
row (mid-ranks, tie-corrected variance), its z-scores pooled over rows
(sum / sqrt(rows)): a kernel that draws from outside the top-k / top-p set, or ignores the
temperature, shifts the drawn scores the same way in every row. The pooled z must stay
within `RANK_Z_LIMIT` (6: about one false alarm in 5e8 honest checks). Measured on the CPU
with 1000 draws of 64 flat 128k-token rows: drawing from the full distribution instead of
the top-p 0.9 set gives z = -32; two honest samplers |z| < 1.

With the filter inputs (`top_k`, `top_p`, `min_p`) among the inputs, two more checks come
from flashtune.bench.sampling_support, before and after the rank test: every draw must lie
in its row's exact allowed set (top-k with ties, the top-p nucleus by the Definitions' rule,
min-p), and the draws must land on the sets' edges (the k-th token, the tokens p - 0.1
drops, anything but the most likely token) about as often as an honest sampler's must: a
one-sided test at a false-failure probability of 1e-6 (`EDGE_ALPHA`). Its power against a
top-(k-1), a top-(p - 0.1) and an argmax sampler is stated in docs/evaluation.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from flashtune.bench.index_sets import index_set_problem, index_set_scorer
from flashtune.bench.sampling_support import edge_problem, filters_from, support_problem
from flashtune.data.models import Correctness, Definition, EvaluationStatus
from flashtune.data.synth import ATTENTION_OP_TYPES, torch_dtype

__all__ = [
    "ATTENTION_OP_TYPES",
    "Tolerance",
    "DEFAULT_TOLERANCES",
    "OP_TYPE_TOLERANCES",
    "STOCHASTIC_OP_TYPES",
    "Verdict",
    "is_stochastic",
    "tolerance_for",
    "compare_outputs",
    "destination_inputs_definition",
    "inputs_modified",
    "distribution_check",
    "shape_dtype_verdict",
]


@dataclass(frozen=True)
class Tolerance:
    """The bounds one output must meet (module docstring: the defaults and why).

    atol/rtol/matched_ratio: element-wise, the fraction of elements within
    atol + rtol * |ref|; max_rel_norm: bound on ||out - ref|| / ||ref||; max_abs: bound on
    |out - ref| of every element. inf turns a bound off."""

    atol: float
    rtol: float
    matched_ratio: float = 1.0
    max_rel_norm: float = math.inf
    max_abs: float = math.inf
    max_row_rel_norm: float = math.inf


# Per-row bounds (module docstring: the honest errors measured behind them).
ROW_BOUND_BF16 = 2.5e-2
ROW_BOUND_F16 = 5e-3
ROW_BOUND_F32 = 1.5e-3
_FIELDS = ("atol", "rtol", "matched_ratio", "max_rel_norm", "max_abs", "max_row_rel_norm")
_EXACT = Tolerance(0.0, 0.0, 1.0, 0.0, 0.0)  # integers: matched_ratio 1.0 decides
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-7, 1e-7, 1.0, 1e-6, max_row_rel_norm=1e-5),
    "float32": Tolerance(1e-3, 1e-3, 1.0, 1e-3, max_row_rel_norm=ROW_BOUND_F32),
    "float16": Tolerance(2e-3, 2e-3, 0.999, 5e-3, max_row_rel_norm=ROW_BOUND_F16),
    "bfloat16": Tolerance(1.6e-2, 1.6e-2, 0.999, 1e-2, max_row_rel_norm=ROW_BOUND_BF16),
    "float8_e4m3fn": Tolerance(1.25e-1, 1.25e-1, 0.99, 1e-1, max_row_rel_norm=0.3),
    "float8_e5m2": Tolerance(2.5e-1, 2.5e-1, 0.99, 2e-1, max_row_rel_norm=0.6),
}
# Rows whose reference norm is below ROW_FLOOR x the tensor's RMS row norm (||ref|| /
# sqrt(rows)) are judged against that floor instead (module docstring).
ROW_FLOOR = 1e-3

# Attention's fp32 output, the base-2 LSE: an absolute bound of 1e-3 (flashtune <= 2.9e-6 on
# H100; FlashInfer's decode exceeds 1e-4 on many request-heads; see the module docstring).
# No per-row bound: max_abs bounds every element already, whatever its row's size.
_LSE = Tolerance(atol=1e-3, rtol=0.0, matched_ratio=1.0, max_rel_norm=1e-3, max_abs=1e-3)
# Gated Delta Net's fp32 output is its recurrent state (new_state: T rank-one updates summed
# into [V, K] per head, by the token recurrence in the reference and by 64-token chunks in a
# kernel): its elements near zero carry the summation order's noise, so the bound is on the
# whole state's relative norm and each row's, with element bounds loose enough for those
# (unmeasured on a GPU; flashtune's ieee-fp32 kernels differ by ~1e-6 on the CPU). Wrong
# kernels move it by O(1): a chunk's decay or state hand-over dropped, beta ignored.
_GDN_STATE = Tolerance(
    atol=1e-2, rtol=1e-2, matched_ratio=0.999, max_rel_norm=5e-3, max_row_rel_norm=2e-2
)
# op_type -> dtype -> Tolerance, replacing the dtype's default.
OP_TYPE_TOLERANCES: dict[str, dict[str, Tolerance]] = {
    **{op_type: {"float32": _LSE} for op_type in sorted(ATTENTION_OP_TYPES)},
    "gdn": {"float32": _GDN_STATE},
}

# The pooled rank test's bound on |z| (module docstring).
RANK_Z_LIMIT = 6.0
# The TVD check's false-failure probability per check, over all rows (module docstring).
TVD_ALPHA = 1e-6

# Op types whose outputs are random draws: checked by distribution, not element-wise.
STOCHASTIC_OP_TYPES: frozenset[str] = frozenset({"sampling"})


def is_stochastic(definition: Definition) -> bool:
    return definition.op_type in STOCHASTIC_OP_TYPES


def _tag_overrides(definition: Definition, dtype: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for raw in definition.tags_with("tol:"):
        key, _, value = raw.partition("=")
        scope, _, field = key.rpartition(":")
        if field not in _FIELDS:
            known = ", ".join(_FIELDS)
            raise ValueError(
                f"{definition.name}: tag 'tol:{raw}' names no tolerance; known: {known}"
            )
        if scope and scope != dtype:
            continue
        try:
            number = float(value)
        except ValueError:
            raise ValueError(
                f"{definition.name}: tag 'tol:{raw}' has a non-numeric value {value!r}"
            ) from None
        if not number >= 0:
            raise ValueError(f"{definition.name}: tag 'tol:{raw}' must be >= 0")
        out[field] = number
    return out


def tolerance_for(
    definition: Definition,
    dtype: str,
    atol: float | None = None,
    rtol: float | None = None,
    *,
    max_rel_norm: float | None = None,
    max_abs: float | None = None,
    max_row_rel_norm: float | None = None,
) -> Tolerance:
    """The tolerance for an output of `dtype`: defaults < op_type < definition tags < CLI
    (the keyword arguments; None leaves a bound as it is)."""
    tol = DEFAULT_TOLERANCES.get(dtype, _EXACT)
    tol = OP_TYPE_TOLERANCES.get(definition.op_type, {}).get(dtype, tol)
    tol = replace(tol, **_tag_overrides(definition, dtype))
    cli = {
        "atol": atol,
        "rtol": rtol,
        "max_rel_norm": max_rel_norm,
        "max_abs": max_abs,
        "max_row_rel_norm": max_row_rel_norm,
    }
    return replace(tol, **{k: v for k, v in cli.items() if v is not None})


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


def _row_scale(r: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """max(1, RMS of the finite values of each row) (rows: all dimensions but the last),
    broadcast to `r`'s shape."""
    rows = r.reshape(-1, r.shape[-1]) if r.dim() > 1 else r.reshape(1, -1)
    ok = finite.reshape(rows.shape)
    values = torch.where(ok, rows, 0.0)
    count = ok.sum(-1, keepdim=True).clamp_min(1)
    rms = (values.square().sum(-1, keepdim=True) / count).sqrt()
    return rms.clamp_min(1.0).expand_as(rows).reshape(r.shape)


def compare_outputs(
    definition: Definition,
    reference: Mapping[str, Any],
    actual: Mapping[str, Any],
    atol: float | None = None,
    rtol: float | None = None,
    *,
    max_rel_norm: float | None = None,
    max_abs: float | None = None,
    max_row_rel_norm: float | None = None,
    inputs: Mapping[str, Any] | None = None,
) -> Verdict:
    """Compare outputs by name; the first shape, dtype or numerical failure decides.

    The Correctness figures are the worst over the outputs compared so far, and its
    atol/rtol the loosest element-wise tolerance those were judged with. An output that is
    a set of indices chosen by score (the DSA indexer's) is compared as a set, ties at the
    k-th score accepted, scored from `inputs` (flashtune.bench.index_sets)."""
    worst_abs = worst_rel = 0.0
    worst_ratio = 1.0
    worst_norm: float | None = None
    worst_row: float | None = None
    loosest_atol = loosest_rtol = 0.0
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
        scorer = index_set_scorer(definition, name)
        if scorer is not None:
            problem = index_set_problem(name, out, ref, scorer, inputs)
            if problem is not None:
                return Verdict(EvaluationStatus.INCORRECT_NUMERICAL, problem)
            continue
        tol = tolerance_for(
            definition,
            spec.dtype,
            atol,
            rtol,
            max_rel_norm=max_rel_norm,
            max_abs=max_abs,
            max_row_rel_norm=max_row_rel_norm,
        )
        # Recorded with the figures: what matched_ratio was counted against (the loosest, so
        # that no output was judged more loosely than the record says).
        loosest_atol, loosest_rtol = max(loosest_atol, tol.atol), max(loosest_rtol, tol.rtol)
        o = out.detach().to(device="cpu", dtype=torch.float64)
        r = ref.detach().to(device="cpu", dtype=torch.float64)
        if o.numel() == 0:
            continue
        o_bad, r_bad = ~torch.isfinite(o), ~torch.isfinite(r)
        # Non-finite values match only the same non-finite value at the same place.
        same_nonfinite = o_bad & r_bad & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
        finite = ~o_bad & ~r_bad
        diff = torch.where(finite, o - r, 0.0).abs()
        # atol is an error for outputs of unit scale: a row whose values are larger (inputs
        # drawn with row scales over decades, outlier channels) carries rounding errors of
        # its own scale in every element, cancelling ones included, so atol grows with the
        # row's RMS above 1 (measured: an honest fp32-accumulating fp16 GEMM, K=12288, M=1,
        # failed with 99.83% matched at a fixed atol; max_abs and the norms are unchanged).
        matched = same_nonfinite | (
            finite & (diff <= tol.atol * _row_scale(r, finite) + tol.rtol * r.abs())
        )
        ratio = matched.double().mean().item()
        abs_err, rel_norm = 0.0, None
        if finite.any():
            abs_err = diff.max().item()
            rel_err = (diff[finite] / r.abs()[finite].clamp_min(1e-12)).max().item()
            worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
            # Relative norm error; undefined (None) for an all-zero reference.
            ref_norm = torch.linalg.vector_norm(torch.where(finite, r, 0.0)).item()
            err_norm = torch.linalg.vector_norm(diff).item()
            if ref_norm > 0:
                rel_norm = err_norm / ref_norm
            elif err_norm == 0:
                rel_norm = 0.0
        if rel_norm is not None:
            worst_norm = rel_norm if worst_norm is None else max(worst_norm, rel_norm)
        row = _worst_row(o, r, finite, expected_dtype) if finite.any() else None
        # Never tighter than the whole-tensor bound: loosening that loosens this too.
        row_bound = max(tol.max_row_rel_norm, tol.max_rel_norm)
        if row is not None:
            worst_row = row.error if worst_row is None else max(worst_row, row.error)
        worst_ratio = min(worst_ratio, ratio)
        new_nonfinite = o_bad & ~r_bad
        figures = Correctness(
            max_absolute_error=worst_abs,
            max_relative_error=worst_rel,
            matched_ratio=worst_ratio,
            rel_norm_error=worst_norm,
            row_rel_norm_error=worst_row,
            atol=loosest_atol,
            rtol=loosest_rtol,
        )
        failure = None
        if new_nonfinite.any():
            kind = "NaN" if torch.isnan(o[new_nonfinite]).any() else "Inf"
            failure = (
                f"output {name!r} has {int(new_nonfinite.sum())} {kind} value(s) where the "
                "reference is finite"
            )
        elif ratio < tol.matched_ratio:
            failure = (
                f"output {name!r}: {ratio:.4%} of elements within atol={tol.atol:g}, "
                f"rtol={tol.rtol:g} (need {tol.matched_ratio:.4%}); max abs error {abs_err:.4g}"
            )
        elif rel_norm is not None and rel_norm > tol.max_rel_norm:
            failure = (
                f"output {name!r}: relative norm error ||out - ref|| / ||ref|| = {rel_norm:.4g} "
                f"> max_rel_norm={tol.max_rel_norm:g}"
            )
        elif row is not None and row.error > row_bound:
            failure = (
                f"output {name!r}: row {row.index} has relative norm error "
                f"||out_row - ref_row|| / max(||ref_row||, floor) = {row.error:.4g} > "
                f"max_row_rel_norm={row_bound:g} (||ref_row|| {row.norm:.4g}, "
                f"floor {row.floor:.4g}: {ROW_FLOOR:g} x the RMS row norm)"
            )
        elif abs_err > tol.max_abs:
            at = [int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)]
            failure = (
                f"output {name!r}: abs error {abs_err:.4g} at {at} > max_abs={tol.max_abs:g} "
                f"(out {o[tuple(at)].item():.6g}, ref {r[tuple(at)].item():.6g})"
            )
        if failure is not None:
            return Verdict(EvaluationStatus.INCORRECT_NUMERICAL, failure, figures)
    return Verdict(
        EvaluationStatus.PASSED,
        None,
        Correctness(
            max_absolute_error=worst_abs,
            max_relative_error=worst_rel,
            matched_ratio=worst_ratio,
            rel_norm_error=worst_norm,
            row_rel_norm_error=worst_row,
            atol=loosest_atol,
            rtol=loosest_rtol,
        ),
    )


@dataclass(frozen=True)
class RowError:
    """The worst row of one output: its relative norm error, index, reference norm and the
    floor its norm was judged against."""

    error: float
    index: list[int]
    norm: float
    floor: float


def _worst_row(
    o: torch.Tensor, r: torch.Tensor, finite: torch.Tensor, dtype: torch.dtype
) -> RowError | None:
    """The per-row relative norm (rows: all dimensions but the last) with its floor,
    max(ROW_FLOOR * ||r|| / sqrt(rows), tiny(dtype) * sqrt(row length)); None for fewer than
    two rows (the whole-tensor norm is the row's), or an all-zero reference."""
    if o.dim() < 2 or o.numel() == 0 or o.numel() == o.shape[-1]:
        return None
    width = o.shape[-1]
    err = torch.where(finite, o - r, 0.0).reshape(-1, width)
    ref = torch.where(finite, r, 0.0).reshape(-1, width)
    err_rows = torch.linalg.vector_norm(err, dim=-1)
    ref_rows = torch.linalg.vector_norm(ref, dim=-1)
    total = float(torch.linalg.vector_norm(ref_rows))
    if total == 0.0:
        return None
    tiny = torch.finfo(dtype).tiny if dtype.is_floating_point else 0.0
    floor = max(ROW_FLOOR * total / math.sqrt(ref_rows.numel()), tiny * math.sqrt(width))
    errors = err_rows / ref_rows.clamp_min(floor)
    worst = int(errors.argmax())
    index = [int(i) for i in torch.unravel_index(torch.tensor(worst), o.shape[:-1])]
    return RowError(float(errors[worst]), index, float(ref_rows[worst]), floor)


def destination_inputs_definition(definition: Definition, names: Sequence[str]) -> Definition:
    """`definition` with the named inputs as its outputs: the destination buffers its
    reference writes into, judged as outputs are (same dtype rules and tolerances)."""
    return definition.model_copy(update={"outputs": {n: definition.inputs[n] for n in names}})


def inputs_modified(pristine: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Names of tensor inputs whose contents changed (a solution that wrote into them)."""
    changed = []
    for name, before in pristine.items():
        now = after[name]
        if isinstance(before, torch.Tensor) and not _equal(before, now):
            # torch.equal is False for NaN == NaN: inputs never hold NaN (synthesized).
            changed.append(name)
    return changed


_EQUAL_CHUNK = 1 << 28  # elements compared at once: a 60 GB input needs no 15 GB mask


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() <= _EQUAL_CHUNK or not (a.is_contiguous() and b.is_contiguous()):
        return torch.equal(a, b)
    x, y = a.view(-1), b.view(-1)
    return all(
        torch.equal(x[i : i + _EQUAL_CHUNK], y[i : i + _EQUAL_CHUNK])
        for i in range(0, x.numel(), _EQUAL_CHUNK)
    )


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
    inputs: Mapping[str, Any] | None = None,
) -> Verdict:
    """Check a sampling op: TVD per row between `draws` draws of each side (integer outputs).

    With `inputs` (the set both sides drew from), also the support of every draw and the
    pooled rank test on the drawn tokens' scores (module docstring)."""
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
    # McDiarmid: one draw moves the TVD by at most 1/draws, so P(TVD > E[TVD] + t) <=
    # exp(-draws t^2); with t = `spread` no row of an honest sampler fails but with
    # probability TVD_ALPHA in all (module docstring).
    spread = math.sqrt(math.log(max(sol.shape[0], 1) / TVD_ALPHA) / draws)
    for row in range(sol.shape[0]):
        values = torch.cat([sol[row], ref[row]])
        support, inverse = torch.unique(values, return_inverse=True)
        p = torch.bincount(inverse[:draws], minlength=len(support)).double() / draws
        q = torch.bincount(inverse[draws:], minlength=len(support)).double() / draws
        tvd = 0.5 * float((p - q).abs().sum())
        noise = _noise_tvd((p + q) / 2, draws)
        limit = max(max_tvd, 3 * noise, noise * math.sqrt(math.pi / 2) + spread)
        if tvd - limit > worst - worst_limit or row == 0:
            worst, worst_limit = tvd, limit
    figures = Correctness(max_absolute_error=worst, max_relative_error=None, matched_ratio=None)
    scores = _row_scores(inputs, sol.shape[0]) if inputs is not None else None
    if scores is not None:
        assert inputs is not None
        # Drawn tokens: in the vocabulary and possible; in the filters' exact sets; their
        # scores alike on both sides; enough of them at the sets' edges (sampling_support).
        filters = filters_from(inputs, sol.shape[0])
        problem = (
            _support_problem(sol, scores, draws)
            or (support_problem(sol, filters) if filters is not None else None)
            or _rank_problem(sol, ref, scores, draws)
            or (edge_problem(sol, filters) if filters is not None else None)
        )
        if problem is not None:
            return Verdict(EvaluationStatus.INCORRECT_NUMERICAL, problem, figures)
    if worst > worst_limit:
        return Verdict(
            EvaluationStatus.INCORRECT_NUMERICAL,
            f"sampled distribution differs from the reference's: total variation distance "
            f"{worst:.3f} > {worst_limit:.3f} over {draws} draws",
            figures,
        )
    return Verdict(EvaluationStatus.PASSED, None, figures)


def _row_scores(inputs: Mapping[str, Any], rows: int) -> torch.Tensor | None:
    """The first floating `[rows, vocab]` input (probabilities or logits), as float64 on CPU."""
    for value in inputs.values():
        if (
            isinstance(value, torch.Tensor)
            and value.is_floating_point()
            and value.dim() == 2
            and value.shape[0] == rows
        ):
            return value.detach().to("cpu", torch.float64)
    return None


def _support_problem(sol: torch.Tensor, scores: torch.Tensor, draws: int) -> str | None:
    vocab = scores.shape[1]
    outside = (sol < 0) | (sol >= vocab)
    if bool(outside.any()):
        row, col = (int(i) for i in outside.nonzero()[0])
        return f"row {row} drew token {int(sol[row, col])}, outside the vocabulary of {vocab}"
    drawn = scores.gather(1, sol)
    # Probabilities (no negative score): zero is impossible; logits: -inf is.
    impossible = drawn == 0 if bool((scores >= 0).all()) else drawn == -math.inf
    if bool(impossible.any()):
        rows = impossible.any(1).nonzero().flatten().tolist()
        row = rows[0]
        token = int(sol[row, int(impossible[row].nonzero()[0])])
        return (
            f"drew tokens of zero probability in {len(rows)} of {sol.shape[0]} rows "
            f"(e.g. row {row}, token {token}) over {draws} draws"
        )
    return None


def _rank_z(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """Mann-Whitney z of sample a against b (mid-ranks, tie-corrected); None if all tie."""
    n, m = a.numel(), b.numel()
    values, inverse, counts = torch.unique(
        torch.cat([a, b]), return_inverse=True, return_counts=True
    )
    if len(values) < 2:
        return None
    below = torch.cumsum(counts, 0) - counts  # values strictly smaller
    mid_ranks = below.double() + (counts.double() + 1) / 2
    u = float(mid_ranks[inverse[:n]].sum()) - n * (n + 1) / 2
    total = n + m
    ties = float((counts.double() ** 3 - counts.double()).sum())
    variance = n * m / 12 * ((total + 1) - ties / (total * (total - 1)))
    if variance <= 0:
        return None
    return (u - n * m / 2) / math.sqrt(variance)


def _rank_problem(
    sol: torch.Tensor, ref: torch.Tensor, scores: torch.Tensor, draws: int
) -> str | None:
    sol_scores, ref_scores = scores.gather(1, sol), scores.gather(1, ref)
    zs = [
        z
        for row in range(scores.shape[0])
        if (z := _rank_z(sol_scores[row], ref_scores[row])) is not None
    ]
    if not zs:
        return None
    pooled = sum(zs) / math.sqrt(len(zs))
    if abs(pooled) <= RANK_Z_LIMIT:
        return None
    side = "lower" if pooled < 0 else "higher"
    return (
        f"the tokens drawn have {side} scores than the reference's: pooled rank test "
        f"z = {pooled:.1f} over {len(zs)} rows x {draws} draws (|z| <= {RANK_Z_LIMIT:g})"
    )


def shape_dtype_verdict(
    definition: Definition, reference: Mapping[str, Any], actual: Mapping[str, Any]
) -> Verdict:
    """PASSED when every output has the reference's shape and the definition's dtype (what a
    stochastic op's single call can be held to, beside its support)."""
    for name, spec in definition.outputs.items():
        out, ref = actual.get(name), reference[name]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
            shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return Verdict(
                EvaluationStatus.INCORRECT_SHAPE,
                f"output {name!r} is {shape}, expected shape {list(ref.shape)}",
            )
        if out.dtype != torch_dtype(spec.dtype):
            return Verdict(
                EvaluationStatus.INCORRECT_DTYPE,
                f"output {name!r} has dtype {out.dtype}, expected {spec.dtype}",
            )
    return Verdict(EvaluationStatus.PASSED)

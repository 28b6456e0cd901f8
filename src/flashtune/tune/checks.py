"""Whether a tactic computes what the default tactic computes: the tuner times a tactic only
after its output matched the default's on the same inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from flashtune import timing
from flashtune.tune.runner import Tactic, TunableRunner, TuningConfig

__all__ = ["CHECK_TOL", "CHECK_TOL_LOW_PRECISION", "device_of", "result_difference", "tensors_of"]

# Relative (Frobenius) error above which a tactic's output is "different from the default
# tactic's". Wrong tactics are off by O(1); these leave room for reordered fp32 sums (split-K),
# TF32 and one rounding of the output dtype.
CHECK_TOL = {
    torch.float64: 1e-8,
    torch.float32: 5e-3,
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
}
CHECK_TOL_LOW_PRECISION = 0.15  # fp8 and other sub-16-bit floats


def result_difference(
    runner: TunableRunner,
    tactic: Tactic,
    inputs: Sequence[Any],
    baseline: list[torch.Tensor],
    config: TuningConfig,
) -> str:
    """Why this tactic's result differs from the default's ("" when it does not)."""
    args = timing.clone_inputs(inputs)
    got = tensors_of(runner.forward(args, tactic), args)
    if len(got) != len(baseline):
        return f"wrong result: {len(got)} tensors out, the default tactic gives {len(baseline)}"
    for i, (g, w) in enumerate(zip(got, baseline, strict=True)):
        if g.shape != w.shape:
            return f"wrong result: tensor {i} has shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        if not w.dtype.is_floating_point:
            if not torch.equal(g, w):
                return f"wrong result: tensor {i} differs from the default tactic's"
            continue
        wf = w.float()
        if not bool(torch.isfinite(wf).all()):
            continue  # nothing meaningful to compare against
        err = float((g.float() - wf).norm() / wf.norm().clamp_min(1e-30))
        tol = config.check_tolerance
        if tol is None:
            tol = CHECK_TOL.get(w.dtype, CHECK_TOL_LOW_PRECISION)
        if not err <= tol:  # also catches NaN
            return (
                f"wrong result: tensor {i} relative error {err:.3g} > {tol:g} vs the default tactic"
            )
    return ""


def device_of(inputs: Sequence[Any]) -> torch.device:
    """The device of the first tensor input (the CPU when there is none)."""
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def tensors_of(out: Any, args: Sequence[Any]) -> list[torch.Tensor]:
    """The tensors a call produced: its return value(s), then every tensor argument (which
    covers ops that write in place or into `out=`)."""
    found: list[torch.Tensor] = []
    stack = [out]
    while stack:
        item = stack.pop(0)
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, list | tuple):
            stack[:0] = list(item)
    return found + [a for a in args if isinstance(a, torch.Tensor)]

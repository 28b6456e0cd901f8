"""Triton solutions on a CPU: checked in Triton's interpreter, not timed.

Without a GPU a Triton solution cannot be timed, but Triton's interpreter (TRITON_INTERPRET=1)
runs its kernels on CPU tensors, operation by operation in NumPy: far too slow to time, fast
enough to check. So on a CPU device `flashtune run` runs a Triton solution in a sandbox whose
Triton interprets (a fresh process: the variable must be set before any kernel is
decorated, and the sandboxes' fork server has imported flashtune's kernels), checks its calls
against the reference as any solution's (the first call, `interpreter_samples` samples of new
values, and a sampling op's draws), and records the triple as SKIPPED with a correctness and
a reason that starts with `CORRECT_NOT_TIMED` (`flashtune.data.correct_not_timed`; why not
PASSED: see `_CORRECTNESS_OPTIONAL` in data/models.py). A failed check is the usual failure
(INCORRECT_NUMERICAL, ...), its reason saying it ran in the interpreter.

What the interpreter cannot run is SKIPPED, saying why: bfloat16 (Triton 3.6's interpreter
reads bfloat16 values wrong), float8 and float4 (no interpreted dot; numpy has no such
types) and float64 (not tried) inputs or outputs.

Cost, bounded per triple: `interpreter_seconds` for the checked samples (at least one) and
for a sampling op's draws (at least `interpreter_min_draws`), measured in the log. A kernel
the interpreter takes minutes over (a Triton GEMM at N = 28672, K = 4096) is bounded only by
--first-call-timeout on its first call; flashtune's own GEMM solution runs torch's path on a
CPU (its autotuner's default), so no Triton GEMM runs in the bundled CPU run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from flashtune.bench.build import MissingRequirement
from flashtune.bench.checked_timing import WorkerSamples
from flashtune.bench.correctness import Verdict
from flashtune.data.models import Correctness, Definition, EvaluationStatus, Solution

__all__ = [
    "CORRECT_NOT_TIMED",
    "INTERPRETED_DTYPES",
    "interpreted",
    "uninterpretable",
    "draws_for",
    "count_launches",
    "launches_text",
    "interpreted_outcome",
]

CORRECT_NOT_TIMED = "correct in the Triton interpreter, not timed"
# Floating dtypes the interpreter is trusted with (integers and bool are always fine).
INTERPRETED_DTYPES = frozenset({"float16", "float32"})
_WHY = {
    "bfloat16": "Triton 3.6's interpreter reads bfloat16 values wrong",
    "float8_e4m3fn": "the interpreter has no float8",
    "float8_e5m2": "the interpreter has no float8",
    "float4_e2m1": "the interpreter has no float4",
    "float64": "float64 is not checked in the interpreter",
}


def uninterpretable(definition: Definition) -> list[str]:
    """The definition's inputs and outputs whose floating dtype the interpreter cannot be
    trusted with ("hidden_states (bfloat16)"), in order."""
    out = []
    for name, spec in [*definition.inputs.items(), *definition.outputs.items()]:
        if spec.dtype.startswith(("float", "bfloat")) and spec.dtype not in INTERPRETED_DTYPES:
            out.append(f"{name} ({spec.dtype})")
    return out


def interpreted(definition: Definition, solution: Solution, device: torch.device) -> bool:
    """Whether `solution` is checked in Triton's interpreter here: a Triton solution on a CPU
    device. Raises MissingRequirement (SKIPPED) saying why such a solution cannot be."""
    if device.type == "cuda" or solution.spec.language != "triton":
        return False
    from flashtune import platform

    if platform.triton_version() is None:
        raise MissingRequirement(
            "no CUDA device for a triton solution, and Triton is not installed for its interpreter"
        )
    bad = uninterpretable(definition)
    if bad:
        dtypes = sorted({b.rpartition("(")[2].rstrip(")") for b in bad})
        why = "; ".join(_WHY.get(d, f"{d} is not checked there") for d in dtypes)
        raise MissingRequirement(
            "no CUDA device for a triton solution, and Triton's interpreter cannot check it "
            f"on the CPU: {why} ({', '.join(bad[:4])}{', ...' if len(bad) > 4 else ''})"
        )
    return True


def draws_for(call_seconds: Any, seconds: float, least: int, most: int) -> int:
    """How many draws a sampling op makes in the interpreter: `seconds` at the pace of its
    first call (`call_seconds`, as the sandbox measured it: an overestimate, it includes
    the interpreter's first rewrite of the kernel), within [least, most]."""
    most = max(1, most)
    least = min(max(1, least), most)
    if not isinstance(call_seconds, (int, float)) or not math.isfinite(call_seconds):
        return least
    pace = max(float(call_seconds), 1e-4)
    return int(min(most, max(least, seconds // pace)))


@contextmanager
def count_launches() -> Iterator[dict[str, int]]:
    """Count kernel launches in Triton's interpreter while inside (kernel name -> count):
    what the log says ran (flashtune's GEMM on a CPU launches none: it runs torch's path).
    Imports Triton: only in a process whose TRITON_INTERPRET is set."""
    from triton.runtime.interpreter import InterpretedFunction

    counts: dict[str, int] = {}
    original: Callable[..., Any] = InterpretedFunction.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = str(getattr(self, "__name__", "kernel"))[:80]
        counts[name] = counts.get(name, 0) + 1
        return original(self, *args, **kwargs)

    InterpretedFunction.run = run
    try:
        yield counts
    finally:
        InterpretedFunction.run = original


def launches_text(launches: Any) -> str:
    """'3 launches of sampling_kernel' or 'no Triton kernel launched (the solution ran
    without Triton on the CPU)' from the sandbox's counts (untrusted: plain data only)."""
    if not isinstance(launches, dict):
        return "Triton launches unknown"
    counts = {
        str(k)[:80]: v
        for k, v in launches.items()
        if isinstance(v, int) and not isinstance(v, bool)
    }
    if not counts or not any(counts.values()):
        return "no Triton kernel launched (the solution ran without Triton on the CPU)"
    parts = [f"{n} x {name}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1])[:6]]
    return "Triton kernel launches: " + ", ".join(parts)


def _launched(launches: Any) -> bool:
    return isinstance(launches, dict) and any(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in launches.values()
    )


def interpreted_outcome(
    samples: WorkerSamples, verdict: Verdict, stochastic: bool
) -> tuple[str, str, Verdict]:
    """A solution that passed every check in the interpreter: (the SKIPPED reason, the log's
    line, a verdict whose correctness marks it "correct, not timed"), saying how much was
    checked and which Triton kernels ran."""
    checked = f"the first call and {len(samples.times_ms)} sample(s) of new values checked"
    if stochastic:
        checked += f", {samples.draws} draws checked by distribution"
    ran = launches_text(samples.launches)
    text = (
        f"interpreter: {checked}; {ran}; not timed (the interpreter runs a kernel operation "
        "by operation in NumPy: its time says nothing of the kernel's)\n"
    )
    if not _launched(samples.launches):
        # Nothing of Triton ran (flashtune's GEMM takes torch's path on a CPU): the outputs
        # were right, but no kernel was checked, so this is not "correct, not timed".
        return (
            f"ran no Triton kernel on the CPU ({checked}; the op's path without Triton ran): "
            "no kernel to check here",
            text,
            Verdict(EvaluationStatus.SKIPPED, None, None),
        )
    correctness = verdict.correctness or Correctness()  # a sampling op's check has no figures
    return (
        f"{CORRECT_NOT_TIMED} ({checked}; {ran})",
        text,
        Verdict(EvaluationStatus.SKIPPED, None, correctness),
    )

"""The inputs and reference results of one workload, shared by its solutions.

The worker (bench/evaluate.py) builds one `WorkloadInputs` per workload before it runs the
workload's solutions: the input sets it holds (seeded, as each sandbox draws them), which
float inputs change every timed sample and which weights stay fixed
(bench/fixed_inputs.py), the reference's outputs on set 0 and on each sample's values
(`ReferenceResult`, with what the reference left in the inputs it writes into) and the
reference's timing. evaluate.py drives the sandboxes and judges their outputs against these
results; this module is only what it compares them with, kept apart from it so that each
stays within the project's file size limit (scripts/check_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from flashtune.bench.checked_timing import derive_seed, sets_that_fit
from flashtune.bench.config import BenchConfig, cpu_threads
from flashtune.bench.correctness import (
    destination_inputs_definition,
    inputs_modified,
    is_stochastic,
)
from flashtune.bench.fixed_inputs import checksum, weights_to_fix
from flashtune.bench.sandbox_child import float_input_names
from flashtune.data.models import Definition, Workload
from flashtune.data.reference import compile_reference, outputs_as_dict
from flashtune.data.synth import resolve_axes, synthesize_inputs
from flashtune.timing import Timing, TimingPolicy, cold_l2_sets, measure_robust, tensor_bytes

__all__ = ["ReferenceResult", "WorkloadInputs"]


def _args(definition: Definition, inputs: Mapping[str, Any]) -> list[Any]:
    return [inputs[name] for name in definition.inputs]


class ReferenceResult(dict):
    """The reference's outputs by name; `inputs_after`: what it left in the inputs it writes
    into (the workload's destination buffers)."""

    def __init__(self, outputs: Mapping[str, Any], inputs_after: dict[str, Any]):
        super().__init__(outputs)
        self.inputs_after = inputs_after


def _clone_except(inputs: Mapping[str, Any], keep: Sequence[str] = ()) -> dict[str, Any]:
    """A copy of the tensors among `inputs`, but for those named in `keep` (themselves)."""
    return {
        k: v.clone() if isinstance(v, torch.Tensor) and k not in keep else v
        for k, v in inputs.items()
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_reference(
    fn: Callable[..., Any], input_sets: list[list[Any]], cfg: BenchConfig, device
) -> Timing:
    """The reference is timed briefly (one trial, a smaller budget): it is a readable
    baseline, often slow (Python loops). Solutions are timed in their sandbox. On the CPU it
    is timed as they are: with `cfg.cpu_threads` threads, sampling on until its median's
    interval is within `cfg.spread_target` of it, for at most `cfg.reference_spread_seconds`
    (every speedup over it is divided by it)."""
    input_sets = cold_l2_sets(input_sets, device)
    budget = cfg.budget()
    cpu = device.type != "cuda"
    with cpu_threads(cfg.cpu_threads if cpu else 0):
        policy = TimingPolicy(
            method=cfg.method(),
            warmup=min(budget.warmup, 2),
            warmup_ms=min(budget.warmup_ms, 10.0),
            repetitions=min(budget.iterations, 3),
            trial_ms=min(budget.trial_ms, 30.0),
            trials=1,
            target_sample_ms=cfg.target_sample_ms,
            max_seconds=cfg.reference_max_seconds,
            spread=cfg.spread_target if cpu else None,
            spread_seconds=min(cfg.reference_spread_seconds, cfg.reference_max_seconds),
        )
        return measure_robust(fn, input_sets[0], policy, input_sets=input_sets)


# --------------------------------------------------------------------------- the workload


class WorkloadInputs:
    """Inputs and reference results of one workload, shared by its solutions.

    Input set i starts from seed `derive_seed(seed, i)` (index tensors and first values), in
    the worker and in each sandbox alike; `seed` derives from the run's seed, drawn from the
    operating system unless the run names one. Each timed sample of a solution then gets new
    float values from a sample seed the worker draws for that solution and sample
    (`sample_seed`), and the worker runs the reference on exactly those values (`case`)."""

    def __init__(
        self, definition: Definition, workload: Workload, cfg: BenchConfig, device, blob_root
    ):
        self.definition, self.workload, self.cfg, self.device = definition, workload, cfg, device
        self.blob_root = blob_root
        self.axes = resolve_axes(definition, workload)
        self.reference = compile_reference(definition)
        self.seed = derive_seed(cfg.seed, "workload", definition.name, workload.uuid)
        first = self.synth(derive_seed(self.seed, 0))
        # Weights too large for per-sample values stay fixed (bench/fixed_inputs.py).
        self.fixed = weights_to_fix(definition, first, device)
        n = sets_that_fit(tensor_bytes(first.values()), device, max(1, cfg.input_sets or 1))
        self.sets = [first] + [self.synth(derive_seed(self.seed, i)) for i in range(1, n)]
        self.floats = [k for k in float_input_names(self.sets[0]) if k not in self.fixed]
        if device.type == "cuda":  # synthesis temporaries, before the reference needs room
            torch.cuda.empty_cache()
        # Inputs the reference itself writes into are destination buffers (GDN MTP's
        # intermediate_states_buffer): a solution must leave in them what the reference
        # leaves, and every other input unchanged. Fixed weights are too large to copy:
        # a checksum says the reference left them alone.
        self.written: tuple[str, ...] = ()
        copy = _clone_except(first, self.fixed)
        sums = {k: checksum(first[k]) for k in self.fixed}
        # The reference's own peak (its temporaries, beyond its inputs): what the worker
        # needs again on every sample, while a sandbox holds its inputs too.
        self.reference_peak = 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        self.first_ref = self._call_reference(copy)
        if device.type == "cuda":
            self.reference_peak = max(0, torch.cuda.max_memory_allocated(device) - before)
        if any(checksum(first[k]) != sums[k] for k in self.fixed):
            raise RuntimeError(f"the reference wrote into its weight inputs {self.fixed}")
        self.written = tuple(inputs_modified(self.sets[0], copy))
        self.first_ref.inputs_after = {k: copy[k] for k in self.written}
        self.written_definition = destination_inputs_definition(definition, self.written)
        self.stochastic = is_stochastic(definition)
        self._reference_draws: list[dict[str, Any]] = []
        self._index_inputs: dict[int, dict[str, Any]] = {}

    def synth(self, seed: int, fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return synthesize_inputs(
            self.definition,
            self.workload,
            device=self.device,
            seed=seed,
            blob_root=self.blob_root,
            fixed=fixed,
        )

    def sample_seed(self, solution: str, k: int) -> int:
        return derive_seed(
            self.cfg.seed, "sample", self.definition.name, self.workload.uuid, solution, k
        )

    def case(self, sample_seed: int, index: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The inputs of set `index` in the sample of `sample_seed` (its index tensors and
        fixed weights, new float values) and the reference's outputs on them."""
        base = self._first_values(index)
        fresh = self.synth(derive_seed(sample_seed, index), fixed={k: base[k] for k in self.fixed})
        inputs = {k: fresh[k] if k in self.floats else base[k] for k in fresh}
        return inputs, self.run_reference(inputs)

    def _first_values(self, index: int) -> Mapping[str, Any]:
        """Set `index` as first drawn (the sets the worker holds; past them, a set drawn
        once and kept without its float values)."""
        if index < len(self.sets):
            return self.sets[index]
        if index not in self._index_inputs:
            initial = self.synth(derive_seed(self.seed, index))
            self._index_inputs[index] = {k: v for k, v in initial.items() if k not in self.floats}
        return self._index_inputs[index]

    def run_reference(self, inputs: Mapping[str, Any]) -> ReferenceResult:
        return self._call_reference(self._reference_inputs(inputs))

    def _reference_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """What the reference is called on: a copy of the inputs it writes into (found on
        set 0, where it ran on a copy of everything), the others themselves. A copy of every
        input, beside the set itself, doubled the worker's memory: 120 GB for one set of
        float32 MoE weights."""
        return {k: v.clone() if k in self.written else v for k, v in inputs.items()}

    def _call_reference(self, copy: dict[str, Any]) -> ReferenceResult:
        with torch.no_grad():
            out = outputs_as_dict(self.definition, self.reference(**copy))
        _sync(self.device)
        return ReferenceResult(out, {k: copy[k] for k in self.written})

    def reference_draws(self, count: int) -> list[dict[str, Any]]:
        """`count` draws of a stochastic reference on set 0, drawn once per workload and
        compared with every solution's own draws (each comparison stays valid; the
        reference's cost is paid once, not once per solution)."""
        if len(self._reference_draws) < count:
            more = count - len(self._reference_draws)
            self._reference_draws += [self.run_reference(self.sets[0]) for _ in range(more)]
        return self._reference_draws[:count]

    def reference_timing(self) -> Timing:
        sets = [_args(self.definition, self._reference_inputs(s)) for s in self.sets]
        names = list(self.definition.inputs)

        # By name, as run_reference calls it: a dataset reference may list its parameters in
        # another order than the definition's inputs (trtllm_fp8_per_tensor_scale_moe_*
        # takes routing_bias second, the definition lists it last).
        def by_name(*args: Any) -> Any:
            return self.reference(**dict(zip(names, args, strict=True)))

        with torch.no_grad():
            return _time_reference(by_name, sets, self.cfg, self.device)

    def roots(self) -> tuple[str, ...]:
        roots = getattr(self.blob_root, "roots", None)
        return tuple(str(r) for r in roots) if roots else ()

"""The runner/tactic model of the autotuner.

A *runner* is one way to compute an op (cuBLAS, a tiled Triton GEMM, ...). Each runner
offers *tactics* (block sizes, warps, stages, split-K, ...): ints or tuples of hashable
values. Tactic -1 is the runner's default; every runner implements it for every shape, so
the tuner can always fall back to it.

A `TuningConfig` says which input dimensions vary at run time and how a value maps to its
*bucket*; the bucketed shapes of all inputs form the *optimization profile*, the unit the
tuner profiles and caches.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "Tactic",
    "DEFAULT_TACTIC",
    "Profile",
    "TunableRunner",
    "DynamicDim",
    "TuningConfig",
    "pow2_buckets",
    "pow2_bucketer",
    "bucket_values",
    "make_profile",
    "make_tuning_inputs",
    "layout_of",
]

Tactic = Hashable
DEFAULT_TACTIC: Tactic = -1
# One bucketed shape per input (() for a non-tensor input): the key the tuner caches under.
Profile = tuple[tuple[int, ...], ...]


class TunableRunner(ABC):
    """One implementation of an op, with the tactics it can run.

    Optional hooks a runner may override:
    - `warmup(inputs, tactic)`: compile/load the tactic without timing it. The tuner calls it
      for all candidate tactics in a thread pool before timing them one at a time, so that
      compilation (the slow part of tuning a Triton kernel) runs in parallel.
    - `supports_cuda_graph`: False when the runner cannot be captured in a CUDA graph (host
      syncs, allocations the graph would not replay); profiling then times it with events.
    """

    supports_cuda_graph: bool = True
    # A vendor library (cuBLAS) or other reference implementation: its default tactic -1
    # always competes with the pick, like runner 0's (the never-slower-than-default guard).
    library: bool = False

    @abstractmethod
    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        """Tactics (besides -1) that are valid for these inputs; may be empty."""

    @abstractmethod
    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        """Run the op on `inputs` with `tactic`; tactic -1 must work for any valid input."""

    def warmup(self, inputs: Sequence[Any], tactic: Tactic) -> None:  # noqa: B027
        """Compile `tactic` for `inputs` ahead of timing (may run in a worker thread).

        The default does nothing: the first timed call's warm-up compiles instead."""

    def estimate_cost(self, inputs: Sequence[Any], profile: Any, tactic: Tactic) -> float | None:
        """A predicted relative cost of `tactic` at this shape (lower is better; only
        compared among this runner's tactics), or None for no prediction. The tuner times
        the tactics in order of this estimate and prunes those predicted worse than the
        best by more than `TuningConfig.prune_slack` (e.g. tiles that spend much of their
        work on padding at this shape, or too few CTAs for the SMs: see tune/search.py).
        The default predicts nothing, so nothing is pruned."""
        return None

    def compile_job(
        self, inputs: Sequence[Any], profile: Any, tactic: Tactic
    ) -> Callable[[], Any] | None:
        """A picklable zero-argument callable that compiles `tactic` in another process
        without touching CUDA, or None. With `TuningConfig.compile_processes` > 0 the tuner
        runs these in spawned worker processes before the `warmup` hooks, so compilation
        runs on several cores outside the GIL and the parent then loads the binaries from
        the compiler's on-disk cache. For Triton: a module-level function given the kernel's
        name, signature, constexprs and the target (`triton.compile(ASTSource(...),
        target=GPUTarget("cuda", capability, 32))`). Never a CUDA call in it: the worker has
        no CUDA context, by design (see tune/profiling.py). The default offers none."""
        return None

    def __call__(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        return self.forward(inputs, tactic)

    @property
    def name(self) -> str:
        return type(self).__name__

    def __hash__(self) -> int:  # runners are compared by class: one instance per kind
        return hash(type(self))

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __repr__(self) -> str:
        return f"{self.name}()"


def pow2_buckets(value: int, max_value: int = 8192) -> int:
    """Map a dimension to the smallest power of two >= value, capped at `max_value`.

    Rounding up means a shape is tuned at a size at least as large as itself, so a tactic
    chosen there has seen the real shape's tiling (masking, tail tiles) or a superset of it.
    """
    if value <= 1:
        return 1
    bucket = 1 << (int(value) - 1).bit_length()
    return min(bucket, max_value)


def pow2_bucketer(max_value: int) -> Callable[[int], int]:
    """`pow2_buckets` with another cap, e.g. `DynamicDim(0, 0, pow2_bucketer(16384))`."""
    return functools.partial(pow2_buckets, max_value=max_value)


def bucket_values(bucket: Callable[[int], int], limit: int = 1 << 20) -> list[int]:
    """Every bucket a monotone bucket function produces for values 1..limit, ascending.

    Used to tune a model ahead of time over all buckets of a dynamic dimension."""
    values: list[int] = []
    value = 1
    while value <= limit:
        b = int(bucket(value))
        if values and b <= values[-1]:  # capped: larger values map to the last bucket
            break
        values.append(b)
        value = max(b, value) + 1
    return values


@dataclass(frozen=True)
class DynamicDim:
    """Dimension `dim` of input `input_idx` varies at run time and is tuned per bucket."""

    input_idx: int
    dim: int
    bucket: Callable[[int], int] = pow2_buckets

    def buckets(self, limit: int = 1 << 20) -> list[int]:
        """All bucket values of this dimension (see `bucket_values`)."""
        return bucket_values(self.bucket, limit)


@dataclass(frozen=True)
class TuningConfig:
    """How the tuner treats an op's inputs.

    dynamic_dims: the dimensions tuned per bucket (the rest of the shape is part of the key).
    constraints: (input_idx, dim, fn): fn(bucketed shapes of all inputs) gives that
        dimension, for dimensions derived from others (e.g. a scale vector's length = M).
    make_inputs: make_inputs(inputs, profile) builds random, valid inputs at the profile's
        shapes; None randomizes float tensors (never zeros) and keeps integer tensors whose
        shape does not change (their values are the caller's, hence valid).
    cold_l2 / use_cuda_graph: how profiling times each tactic (see flashtune.timing.measure).
    key_dtypes: also key the cache on the inputs' dtypes (ops whose best tactic depends on
        dtype and whose op_name does not already say it).
    key_layouts: also key the cache on the inputs' layouts (`layout_of`: contiguous "c",
        last two dimensions transposed "t", other strides "s"), and tune "t" inputs
        transposed (a column-major B is another kernel's memory access than a row-major one).
    warmup / repetitions / max_seconds_per_tactic: the timing effort per tactic; tuning many
        tactics per shape must stay within seconds, and medians converge fast on a GPU.
    check_tolerance: a tactic whose output differs from the default tactic's by more than
        this relative (Frobenius) error is excluded as wrong; None picks one from the dtype.
    compile_workers: threads for the runners' `warmup` hooks (parallel compilation).
    compile_processes: spawned worker processes for the runners' `compile_job`s (0: none).
    confirm_top / confirm_rounds: after every tactic is timed once, the confirm_top fastest
        (and the default tactic) are timed again confirm_rounds times in turns, and the pick
        is the fastest by those medians alone: the least of many single measurements is
        biased low (one lucky measurement wins), and a pick made by noise would stay cached.
        0 rounds: the first measurements decide.
    guard_rounds / guard_margin / serving: the never-slower-than-default guard. The pick
        and the defaults (every runner's tactic -1 of runner 0 and of `library` runners)
        are timed again guard_rounds times in turns on fresh random inputs, the way the op
        serves (`serving`: "cuda_graph" replays a graph where every contender can be
        captured, "eager" times launches; always cold L2), and the pick replaces the
        default only if it is faster by more than the noise seen in those rounds and by
        more than guard_margin (a fraction of the default's time). 0 rounds: no guard.
    prune_slack: drop tactics whose `TunableRunner.estimate_cost` is more than this
        fraction above the runner's best estimate (None: no pruning).
    patience: once this many tactics ranked by `estimate_cost` in a row did not beat the
        best so far by more than guard_margin, the rest of the ranked ones is not timed
        (None: time every candidate). Tactics without an estimate are always timed (an
        unranked list's tail is not predicted worse); the defaults and the priors (winners
        at neighbouring buckets) are timed first.
    patience_band: patience never cuts a tactic estimated within this fraction of its
        runner's best estimate: a tie in the cost model is not a prediction. (The GEMM
        model prices every M=1 tactic by about the same bytes; with the tail cut after 12
        in a row, an H200 regret run missed the winner at M=1 N=1024 K=8192, ranked 24th
        among such ties and 20% faster than the pick. 8%: the widest gap between a winner
        and its runner's best estimate among the ties in a replay of 44 H200 winners.)
    """

    dynamic_dims: tuple[DynamicDim, ...] = ()
    constraints: tuple[tuple[int, int, Callable[[Sequence[torch.Size]], int]], ...] = ()
    make_inputs: Callable[[Sequence[Any], Any], Sequence[Any]] | None = None
    cold_l2: bool = True
    use_cuda_graph: bool = False
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    key_dtypes: bool = False
    key_layouts: bool = False
    warmup: int = 3
    repetitions: int = 20
    max_seconds_per_tactic: float = 1.0
    check_tolerance: float | None = None
    compile_workers: int = 8
    compile_processes: int = 0
    confirm_top: int = 3
    confirm_rounds: int = 2
    guard_rounds: int = 3
    guard_margin: float = 0.01
    serving: str = "cuda_graph"
    prune_slack: float | None = 0.5
    patience: int | None = 12
    patience_band: float = 0.08


def _shape_of(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if isinstance(x, torch.Tensor) else ()


def make_profile(inputs: Sequence[Any], config: TuningConfig) -> Profile:
    """The optimization profile of `inputs`: their shapes with every dynamic dimension
    replaced by its bucket, then the constrained dimensions derived from those."""
    shapes = [list(_shape_of(x)) for x in inputs]
    for d in config.dynamic_dims:
        shape = shapes[d.input_idx]
        if not shape:  # an optional input left out (None): nothing to bucket
            continue
        dim = d.dim % len(shape)
        shape[dim] = int(d.bucket(shape[dim]))
    for input_idx, dim, fn in config.constraints:
        shape = shapes[input_idx]
        if not shape:
            continue
        shape[dim % len(shape)] = int(fn([torch.Size(s) for s in shapes]))
    return tuple(tuple(s) for s in shapes)


def layout_of(x: Any) -> str:
    """An input's layout as a cache key part: "c" contiguous, "t" the last two dimensions
    transposed (a column-major matrix), "s" any other strides, "" not a tensor."""
    if not isinstance(x, torch.Tensor):
        return ""
    if x.is_contiguous():
        return "c"
    if x.dim() >= 2 and x.transpose(-1, -2).is_contiguous():
        return "t"
    return "s"


def make_tuning_inputs(inputs: Sequence[Any], profile: Profile, config: TuningConfig) -> list[Any]:
    """Random, valid inputs at the profile's shapes (never the caller's tensors, which a
    runner writing in place would clobber)."""
    if config.make_inputs is not None:
        return list(config.make_inputs(inputs, profile))
    out: list[Any] = []
    # profile[len(inputs):]: the dtype names of a key_dtypes config (a key part, not a shape).
    for i, (x, shape) in enumerate(zip(inputs, profile[: len(inputs)], strict=True)):
        if not isinstance(x, torch.Tensor):
            out.append(x)
        elif x.dtype.is_floating_point and config.key_layouts and layout_of(x) == "t":
            # The same transposed layout as the caller's, at the profile's shape.
            swapped = (*shape[:-2], shape[-1], shape[-2])
            t = torch.randn(swapped, device=x.device, dtype=torch.float32).to(x.dtype)
            out.append(t.transpose(-1, -2))
        elif x.dtype.is_floating_point:
            # randn in fp32 then cast: randn has no fp8 kernels, and the cast keeps the
            # values' distribution identical across dtypes.
            out.append(torch.randn(shape, device=x.device, dtype=torch.float32).to(x.dtype))
        elif tuple(x.shape) == tuple(shape):
            out.append(x.clone())
        else:
            raise ValueError(
                f"input {i} is a {x.dtype} tensor of shape {tuple(x.shape)} that the tuning "
                f"profile resizes to {tuple(shape)}; random values would not be valid indices: "
                "give the op's TuningConfig a make_inputs"
            )
    return out

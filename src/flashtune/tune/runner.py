"""The runner/tactic model of the autotuner.

A *runner* is one way to compute an op (cuBLAS, a tiled Triton GEMM, ...). Each runner
offers *tactics* (block sizes, warps, stages, split-K, ...): ints or tuples of hashable
values. Tactic -1 is the runner's default; every runner implements it for every shape, so
the tuner can always fall back to it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "Tactic",
    "DEFAULT_TACTIC",
    "TunableRunner",
    "DynamicDim",
    "TuningConfig",
    "pow2_buckets",
]

Tactic = Hashable
DEFAULT_TACTIC: Tactic = -1


class TunableRunner(ABC):
    """One implementation of an op, with the tactics it can run."""

    @abstractmethod
    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        """Tactics (besides -1) that are valid for these inputs; may be empty."""

    @abstractmethod
    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        """Run the op on `inputs` with `tactic`; tactic -1 must work for any valid input."""

    def __call__(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        return self.forward(inputs, tactic)

    @property
    def name(self) -> str:
        return type(self).__name__

    def __hash__(self) -> int:  # runners are compared by class: one instance per kind
        return hash(type(self))

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)


def pow2_buckets(value: int, max_value: int = 8192) -> int:
    """Map a dimension to the smallest power of two >= value, capped at `max_value`."""
    if value <= 1:
        return 1
    bucket = 1 << (int(value) - 1).bit_length()
    return min(bucket, max_value)


@dataclass(frozen=True)
class DynamicDim:
    """Dimension `dim` of input `input_idx` varies at run time and is tuned per bucket."""

    input_idx: int
    dim: int
    bucket: Callable[[int], int] = pow2_buckets


@dataclass(frozen=True)
class TuningConfig:
    """How the tuner treats an op's inputs.

    dynamic_dims: the dimensions tuned per bucket (the rest of the shape is part of the key).
    constraints: (input_idx, dim) -> function of the (bucketed) inputs' shapes giving that
        dimension, for dimensions derived from others.
    make_inputs: builds random, valid inputs for a bucketed profile; None means "randomize
        the given inputs' float tensors at the bucketed shape".
    cold_l2 / use_cuda_graph: how profiling times each tactic.
    """

    dynamic_dims: tuple[DynamicDim, ...] = ()
    constraints: tuple[tuple[int, int, Callable[[Sequence[torch.Size]], int]], ...] = ()
    make_inputs: Callable[[Sequence[Any], Any], Sequence[Any]] | None = None
    cold_l2: bool = True
    use_cuda_graph: bool = False
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

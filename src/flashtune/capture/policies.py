"""What capture keeps: which inputs are dumped as tensors (input_dump_policy) and which
calls become Workloads at all (filter_policy), per definition or op type (CaptureConfig)."""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import torch

from flashtune.data.models import Workload

__all__ = [
    "DUMP_POLICIES",
    "FILTER_POLICIES",
    "CaptureConfig",
    "DumpPolicy",
    "FilterPolicy",
    "WorkloadFilter",
    "resolve_config",
    "should_dump",
]

DumpPolicy = Union[Literal["dump_all", "dump_none", "dump_int"], Sequence[str]]
FilterPolicy = Union[
    Literal[
        "keep_all",
        "keep_first",
        "keep_first_k",
        "keep_first_k_by_axes",
        "shape_only",
        "keep_none",
    ],
    Callable[[Workload], Hashable],
]
DUMP_POLICIES = ("dump_all", "dump_none", "dump_int")
FILTER_POLICIES = (
    "keep_all",
    "keep_first",
    "keep_first_k",
    "keep_first_k_by_axes",
    "shape_only",
    "keep_none",
)
# Filters whose "drop" is final for a given shape signature: once a call is dropped, every
# later call with the same argument shapes is dropped too, so the hook may skip binding it.
STICKY_FILTERS = frozenset(
    {"keep_first", "keep_first_k", "keep_first_k_by_axes", "shape_only", "keep_none"}
)


@dataclass(frozen=True)
class CaptureConfig:
    """How one op (definition name, glob, or op_type) is captured.

    input_dump_policy:
      "dump_none": every tensor input is recorded as {"type": "random"} (shapes only);
      "dump_int": integer and bool tensors (indptr, indices, positions) are dumped, float
        payloads are not; "dump_all": every tensor; or a list of input names to dump.
      Python scalars are always recorded by value (they cost nothing and are needed to
      replay the call).
    filter_policy:
      "keep_all" every call; "keep_first" the first call per definition; "keep_first_k"
      the first k per definition; "keep_first_k_by_axes" the first k per var-axes value;
      "shape_only" the first per var-axes value (keep_first_k_by_axes with k=1);
      "keep_none" nothing; or a callable Workload -> dedup key (a seen key is dropped).
    """

    input_dump_policy: DumpPolicy = "dump_int"
    filter_policy: FilterPolicy = "shape_only"
    k: int = 8

    def __post_init__(self) -> None:
        dump = self.input_dump_policy
        if isinstance(dump, str):
            if dump not in DUMP_POLICIES:
                raise ValueError(
                    f"input_dump_policy={dump!r}: expected one of {DUMP_POLICIES} or a list of "
                    "input names"
                )
        elif isinstance(dump, Sequence) and all(isinstance(n, str) for n in dump):
            object.__setattr__(self, "input_dump_policy", tuple(dump))
        else:
            raise TypeError(
                f"input_dump_policy must be a policy name or a list of input names, got {dump!r}"
            )
        flt = self.filter_policy
        if isinstance(flt, str):
            if flt not in FILTER_POLICIES:
                raise ValueError(
                    f"filter_policy={flt!r}: expected one of {FILTER_POLICIES} or a callable"
                )
        elif not callable(flt):
            raise TypeError(f"filter_policy must be a policy name or a callable, got {flt!r}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")

    @property
    def sticky(self) -> bool:
        """True when a dropped shape signature stays dropped (see STICKY_FILTERS)."""
        return isinstance(self.filter_policy, str) and self.filter_policy in STICKY_FILTERS


def should_dump(policy: DumpPolicy, name: str, value: Any) -> bool:
    """Whether tensor input `name` is written to a blob under `policy`."""
    if not isinstance(value, torch.Tensor):
        return False
    if policy == "dump_none":
        return False
    if policy == "dump_all":
        return True
    if policy == "dump_int":
        return not (value.dtype.is_floating_point or value.dtype.is_complex)
    return name in policy


def resolve_config(
    configs: Mapping[str, CaptureConfig], default: CaptureConfig | None, name: str, op_type: str
) -> CaptureConfig | None:
    """The config for a definition: its exact name, then a matching glob, then its op_type,
    then `default` (None: the op is not captured)."""
    if name in configs:
        return configs[name]
    for pattern, config in configs.items():
        if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(name, pattern):
            return config
    if op_type in configs:
        return configs[op_type]
    return default


@dataclass
class WorkloadFilter:
    """Decides, per definition, whether a workload is kept; thread-safe, in memory."""

    config: CaptureConfig
    _counts: dict[Hashable, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _key(self, definition: str, workload: Workload) -> Hashable | None:
        policy = self.config.filter_policy
        if callable(policy):
            return (definition, policy(workload))
        if policy in ("keep_first", "keep_first_k"):
            return definition
        if policy in ("keep_first_k_by_axes", "shape_only"):
            return (definition, tuple(sorted(workload.axes.items())))
        return None

    def _limit(self) -> int:
        policy = self.config.filter_policy
        if callable(policy) or policy in ("keep_first", "shape_only"):
            return 1
        return self.config.k

    def keep(self, definition: str, workload: Workload) -> bool:
        policy = self.config.filter_policy
        if policy == "keep_all":
            return True
        if policy == "keep_none":
            return False
        key = self._key(definition, workload)
        with self._lock:
            seen = self._counts.get(key, 0)
            if seen >= self._limit():
                return False
            self._counts[key] = seen + 1
            return True

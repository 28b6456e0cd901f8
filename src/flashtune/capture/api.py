"""Workload capture: `with capture(dataset=...):` or FLASHTUNE_CAPTURE=1 records, for every
schema'd op call, a Workload (var axes and inputs) in
<dataset>/workloads/<op_type>/<definition>.jsonl, and the Definition when it is missing.

Dtypes: definition names carry none (FlashInfer Trace convention: rmsnorm_h4096 is bf16 by
its inputs' dtypes), so a bf16 and an fp16 call of the same shapes share a name. The first
definition of a name wins (the dataset's own, else the one built from the first call
captured); a later call whose input dtypes differ from it is NOT recorded (a workload of the
wrong dtype would be benchmarked in the definition's dtype): capture warns once per
(definition, dtype signature) and skips it. Names are never suffixed, so they keep matching
the corpus.

Constants: the same holds for the op's bound parameters that a definition bakes into its
reference (the norm's eps). A call whose constants differ from its definition's (an eps=1e-6
norm under a dataset's eps=1e-5 rmsnorm_h4096) is not recorded either: warned once per
(definition, constants), skipped.
"""

from __future__ import annotations

import logging
import threading
import uuid
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from flashtune import env
from flashtune.capture.policies import (
    CaptureConfig,
    FilterPolicy,
    WorkloadFilter,
    resolve_config,
    should_dump,
)
from flashtune.capture.writer import CaptureRecord, CaptureWriter, host_copies
from flashtune.data.dataset import Dataset
from flashtune.data.models import (
    Definition,
    RandomInput,
    SafetensorsInput,
    ScalarInput,
    Workload,
)
from flashtune.schema import NOT_HANDLED, add_hook, register_env_hook, remove_hook
from flashtune.schema.api import ApiOp
from flashtune.schema.core import BoundCall, Scalar, constant_mismatches, reference_constants

__all__ = [
    "CAPTURE_DUMP_POLICY",
    "CAPTURE_FILTER_POLICY",
    "CAPTURE_QUEUE",
    "CAPTURE_QUEUE_MB",
    "ACTIVE_CAPTURERS",
    "Capturer",
    "as_dataset",
    "capture",
    "env_config",
    "observe",
    "call_signature",
    "dtype_mismatches",
    "input_dtypes",
]

log = logging.getLogger("flashtune.capture")

# Capture's settings live in env.py with every other one.
CAPTURE_DUMP_POLICY = env.CAPTURE_DUMP_POLICY
CAPTURE_FILTER_POLICY = env.CAPTURE_FILTER_POLICY
CAPTURE_QUEUE = env.CAPTURE_QUEUE
CAPTURE_QUEUE_MB = env.CAPTURE_QUEUE_MB

_PRIMITIVES = frozenset({int, float, bool, str, type(None), torch.dtype})
_TENSOR = torch.Tensor
_RANDOM = RandomInput(type="random")  # shared: input specs are never mutated


def call_signature(
    op: ApiOp, args: tuple[Any, ...], kwargs: Mapping[str, Any], dtypes: bool = True
) -> tuple | None:
    """A cheap signature of a call (shapes, dtypes, primitive values), or None when an
    argument is an object whose state could change the definition (a wrapper's self).

    dtypes=False leaves tensor dtypes out (each costs a read on the hot path): safe where
    only the definition name and var axes matter and the op has a single schema, whose
    name is built from const axes alone."""
    key: list[Any] = [op]
    for a in args:
        t = type(a)
        if t is _TENSOR or (t not in _PRIMITIVES and isinstance(a, _TENSOR)):
            key.append(a.shape)
            if dtypes:
                key.append(a.dtype)
        elif t in _PRIMITIVES:
            key.append(a)
        else:
            return None
    if kwargs:
        for k, a in kwargs.items():
            key.append(k)
            if isinstance(a, _TENSOR):
                key.append(a.shape)
                if dtypes:
                    key.append(a.dtype)
            elif type(a) in _PRIMITIVES:
                key.append(a)
            else:
                return None
    return tuple(key)


def input_dtypes(definition: Definition) -> dict[str, str]:
    """The dtype of each of a definition's inputs, by input name (what BoundCall.dtypes holds
    for a call of that definition)."""
    return {name: spec.dtype for name, spec in definition.inputs.items()}


def dtype_mismatches(dtypes: Mapping[str, str], expected: Mapping[str, str]) -> dict[str, str]:
    """The inputs of a call (`dtypes`: BoundCall.dtypes) whose dtype differs from the
    definition's (`expected`: input_dtypes), as {name: call dtype}; {} when they agree.

    Inputs the definition lacks (an optional one it was built without) are not a dtype
    question and are left out."""
    if dtypes == expected:  # the common case: one dict comparison
        return {}
    return {n: d for n, d in dtypes.items() if expected.get(n, d) != d}


def _logical(value: torch.Tensor, rank: int) -> torch.Tensor:
    """The tensor as the definition sees it (leading dimensions merged into the first)."""
    if value.dim() > rank >= 1:
        return value.reshape(-1, *value.shape[value.dim() - rank + 1 :])
    return value


@dataclass
class _DefState:
    definition: Definition
    config: CaptureConfig
    filter: WorkloadFilter
    dtypes: dict[str, str] = field(default_factory=dict)  # input_dtypes(definition)
    constants: dict[str, Any] = field(default_factory=dict)  # reference_constants(definition)


@dataclass
class Capturer:
    """Records the workloads of schema'd op calls into a dataset (see `capture`)."""

    dataset: Dataset
    configs: Mapping[str, CaptureConfig] = field(default_factory=dict)
    default: CaptureConfig | None = field(default_factory=CaptureConfig)
    max_records: int = 1024
    max_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        self.writer = CaptureWriter(self.dataset, self.max_records, self.max_bytes)
        self._states: dict[str, _DefState | None] = {}
        self._dropped_fast: set[tuple] = set()  # call signatures a sticky filter drops for good
        # Ops seen called with dtypes their definition does not have: from then on their fast
        # signatures include dtypes, so a skipped dtype can be dropped fast without also
        # dropping the same shapes in the definition's dtype.
        self._mixed_ops: set[ApiOp] = set()
        self._warned_dtypes: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        self._warned_constants: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        self._lock = threading.Lock()
        self._warned_graph = False
        self.captured = 0

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> Capturer:
        self.writer.start()
        with _ACTIVE_LOCK:
            if self not in ACTIVE_CAPTURERS:
                ACTIVE_CAPTURERS.append(self)
        return self

    def close(self) -> None:
        """Stop recording and write everything queued."""
        with _ACTIVE_LOCK:
            if self in ACTIVE_CAPTURERS:
                ACTIVE_CAPTURERS.remove(self)
        self.writer.close()

    def flush(self) -> None:
        self.writer.flush()

    @property
    def stats(self) -> dict[str, int]:
        w = self.writer
        return {
            "captured": self.captured,
            "written": w.written,
            "dropped": w.dropped,
            "pending": w.pending,
            "errors": w.errors,
        }

    # ----------------------------------------------------------------- the hook
    def __call__(self, op: ApiOp, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _FORWARDED[0]:  # apply, when on, calls observe() itself (see observe)
            return NOT_HANDLED
        # The steady state of a sticky filter: a signature already dropped for good.
        fast = call_signature(op, args, kwargs, len(op.schemas) > 1 or op in self._mixed_ops)
        if fast is None or fast not in self._dropped_fast:
            self._observe(op, args, kwargs, fast)
        return NOT_HANDLED

    def observe(self, op: ApiOp, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Record one call (never raises: a call capture cannot bind is the op's business)."""
        fast = call_signature(op, args, kwargs, len(op.schemas) > 1 or op in self._mixed_ops)
        if fast is None or fast not in self._dropped_fast:
            self._observe(op, args, kwargs, fast)

    def _observe(
        self, op: ApiOp, args: tuple[Any, ...], kwargs: dict[str, Any], fast: tuple | None
    ) -> None:
        try:
            call = op.bind(*args, **kwargs)
            state = self._state(call)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.debug("capture skipped a call of %s: %s", op.qualname, exc)
            return
        if state is None:
            if fast is not None:
                self._dropped_fast.add(fast)
            return
        if call.dtypes != state.dtypes and self._wrong_dtypes(op, call, state, fast):
            return
        if state.constants and self._wrong_constants(call, state, fast):
            return
        if _graph_capturing(call):
            if not self._warned_graph:
                self._warned_graph = True
                warnings.warn(
                    "flashtune capture: calls made while a CUDA graph is being captured are not "
                    "recorded (warned once)",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return
        axes = call.var_axes
        inputs, dumps = self._inputs(call, state.config)
        workload = Workload.model_construct(uuid=str(uuid.uuid4()), axes=axes, inputs=inputs)
        if not state.filter.keep(state.definition.name, workload):
            if fast is not None and state.config.sticky:
                self._dropped_fast.add(fast)
            return
        self._submit(state, workload, dumps)

    def _wrong_dtypes(
        self, op: ApiOp, call: BoundCall, state: _DefState, fast: tuple | None
    ) -> bool:
        """True (warned once per definition and dtype signature) when the call's input dtypes
        are not its definition's: such a call is not recorded (see the module docstring)."""
        wrong = dtype_mismatches(call.dtypes, state.dtypes)
        if not wrong:
            return False
        if op not in self._mixed_ops:
            self._mixed_ops.add(op)  # later signatures carry dtypes (see __post_init__)
        elif fast is not None:
            self._dropped_fast.add(fast)  # fast already carries dtypes: skip it cheaply
        name = state.definition.name
        key = (name, tuple(sorted(call.dtypes.items())))
        if key not in self._warned_dtypes:
            self._warned_dtypes.add(key)
            found = ", ".join(f"{n}={d}" for n, d in wrong.items())
            want = ", ".join(f"{n}={state.dtypes[n]}" for n in wrong)
            warnings.warn(
                f"flashtune capture: a call of {name} has input dtypes {found} but the "
                f"definition has {want}; definition names carry no dtype, so these calls are "
                "not recorded (warned once per definition and dtypes)",
                RuntimeWarning,
                stacklevel=5,
            )
        return True

    def _wrong_constants(self, call: BoundCall, state: _DefState, fast: tuple | None) -> bool:
        """True (warned once per definition and constants) when the call's bound constants
        (eps) are not its definition's: such a call is not recorded (module docstring)."""
        wrong = constant_mismatches(call.constants, state.constants)
        if not wrong:
            return False
        if fast is not None:  # the signature holds every scalar argument: skip it cheaply
            self._dropped_fast.add(fast)
        name = state.definition.name
        key = (name, tuple(sorted((n, repr(v)) for n, (v, _) in wrong.items())))
        if key not in self._warned_constants:
            self._warned_constants.add(key)
            found = ", ".join(f"{n}={v!r}" for n, (v, _) in wrong.items())
            want = ", ".join(f"{n}={d!r}" for n, (_, d) in wrong.items())
            warnings.warn(
                f"flashtune capture: a call of {name} has {found} but the definition has "
                f"{want}; definition names carry no constants, so these calls are not "
                "recorded (warned once per definition and constants)",
                RuntimeWarning,
                stacklevel=5,
            )
        return True

    def _state(self, call: BoundCall) -> _DefState | None:
        name = call.name
        try:
            return self._states[name]
        except KeyError:
            pass
        with self._lock:
            if name not in self._states:
                config = resolve_config(self.configs, self.default, name, call.schema.op_type)
                if config is None or config.filter_policy == "keep_none":
                    self._states[name] = None
                else:
                    # The dataset's definition of this name, when it has one, is the one the
                    # workloads are written under: its dtypes are the ones to match.
                    definition = self.dataset.definitions.get(name) or call.definition()
                    self._states[name] = _DefState(
                        definition,
                        config,
                        WorkloadFilter(config),
                        input_dtypes(definition),
                        reference_constants(definition.reference, call.schema.bound),
                    )
            return self._states[name]

    def _inputs(
        self, call: BoundCall, config: CaptureConfig
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        inputs: dict[str, Any] = {}
        dumps: dict[str, torch.Tensor] = {}
        for name, value in call.inputs.items():
            spec = call.schema.inputs[name]
            if isinstance(spec, Scalar):
                if isinstance(value, (bool, int, float)):
                    inputs[name] = ScalarInput(type="scalar", value=value)
                else:
                    inputs[name] = _RANDOM
            elif should_dump(config.input_dump_policy, name, value):
                dumps[name] = _logical(value, len(spec.dims))
            else:
                inputs[name] = _RANDOM
        return inputs, dumps

    def _submit(self, state: _DefState, workload: Workload, dumps: dict[str, torch.Tensor]) -> None:
        definition = state.definition
        blob = None
        if dumps:
            blob = (
                f"./blob/workloads/{definition.op_type}/{definition.name}/"
                f"{definition.name}_{workload.uuid.replace('-', '')}.safetensors"
            )
            for name in dumps:
                workload.inputs[name] = SafetensorsInput(
                    type="safetensors", path=blob, tensor_key=name
                )
            # Keep the definition's input order in the JSON.
            workload.inputs = {
                n: workload.inputs[n] for n in definition.inputs if n in workload.inputs
            }
        nbytes = sum(t.numel() * t.element_size() for t in dumps.values())

        def make() -> CaptureRecord:
            tensors, event = host_copies(dumps) if dumps else ({}, None)
            return CaptureRecord(definition, workload, tensors, blob, event)

        if self.writer.submit(nbytes, make):
            self.captured += 1


def _graph_capturing(call: BoundCall) -> bool:
    for value in call.inputs.values():
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return torch.cuda.is_current_stream_capturing()
    return False


# --------------------------------------------------------------------------- registry

# The started capturers (read by apply's hook to skip a call when there are none; only
# Capturer.start/close change it).
ACTIVE_CAPTURERS: list[Capturer] = []
_ACTIVE_LOCK = threading.Lock()
# [True] while an apply hook is on: it calls observe() for every call before it dispatches,
# so a call answered by a solution is still captured, whatever the order of the hooks.
_FORWARDED = [False]


def observe(op: ApiOp, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Record a call with every active capturer (apply's hook calls this)."""
    for capturer in ACTIVE_CAPTURERS:
        capturer.observe(op, args, kwargs)


def set_forwarded(on: bool) -> None:
    """Apply turns this on while its hook is installed (see _FORWARDED)."""
    _FORWARDED[0] = on


def as_dataset(dataset: str | Path | Dataset | None) -> Dataset:
    """`dataset` as a Dataset: itself, a folder, or (None) FLASHTUNE_DATASET."""
    if isinstance(dataset, Dataset):
        return dataset
    return Dataset(dataset if dataset is not None else env.DATASET.get())


@contextmanager
def capture(
    dataset: str | Path | Dataset | None = None,
    configs: Mapping[str, CaptureConfig] | None = None,
    default: CaptureConfig | None = CaptureConfig(),
    max_records: int | None = None,
    max_bytes: int | None = None,
) -> Iterator[Capturer]:
    """Record the workloads of every schema'd op called inside the block.

    dataset: a Dataset or root folder (default FLASHTUNE_DATASET). configs: CaptureConfig by
    definition name, name glob or op_type; ops matching none use `default` (None: not
    captured). Everything queued is written when the block exits.
    """
    capturer = Capturer(
        as_dataset(dataset),
        dict(configs or {}),
        default,
        max_records if max_records is not None else CAPTURE_QUEUE.get(),
        max_bytes if max_bytes is not None else CAPTURE_QUEUE_MB.get() << 20,
    ).start()
    add_hook(capturer)
    try:
        yield capturer
    finally:
        remove_hook(capturer)
        capturer.close()


# --------------------------------------------------------------------------- FLASHTUNE_CAPTURE=1

_ENV_CAPTURER: list[Capturer] = []


def env_config() -> CaptureConfig:
    """The capture settings FLASHTUNE_CAPTURE_DUMP_POLICY / _FILTER_POLICY ask for."""
    dump = CAPTURE_DUMP_POLICY.get()
    dump_policy: Any = (
        dump
        if dump in ("dump_all", "dump_none", "dump_int")
        else [n.strip() for n in dump.split(",") if n.strip()]
    )
    # A string, not yet a FilterPolicy: CaptureConfig checks it (ValueError naming the choices).
    filter_policy = cast(FilterPolicy, CAPTURE_FILTER_POLICY.get())
    return CaptureConfig(input_dump_policy=dump_policy, filter_policy=filter_policy)


def _capture_hook_from_env() -> Capturer | None:
    for old in _ENV_CAPTURER:
        old.close()
    _ENV_CAPTURER.clear()
    if not env.CAPTURE.get():
        return None
    capturer = Capturer(
        as_dataset(None),
        {},
        env_config(),
        CAPTURE_QUEUE.get(),
        CAPTURE_QUEUE_MB.get() << 20,
    ).start()
    _ENV_CAPTURER.append(capturer)
    log.info("capture on: recording workloads into %s", capturer.dataset.root)
    return capturer


register_env_hook(_capture_hook_from_env)

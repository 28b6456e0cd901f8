"""Dispatch at run time: each call of a schema'd op (or of `apply(...)`) runs the solution
the apply table names for its definition and shape, or falls back to the original code.

Dtypes: definition names carry none (rmsnorm_h4096 is bf16 by its inputs' dtypes), so an
fp16 call can share the name of a bf16 definition. A table winner was benchmarked in the
definition's dtypes, so it is only used when the call's input dtypes equal the definition's
(BoundCall.dtypes against a dict precomputed per definition; a definition the dataset lacks
cannot be checked and falls back too). Otherwise the call runs the op's own path. The check
runs once per call signature (the cached plans are keyed by shapes AND dtypes), so the
per-call cost is unchanged.

Constants: a definition also bakes the op's bound parameters into its reference (the norm's
eps: rmsnorm_h4096 is eps=1e-5), and its name carries none of them either. A call whose
constants differ (an eps=1e-6 model's norm) runs the op's own path too: its winners were
proven against another function (schema.constant_mismatches; checked once per signature
like the dtypes).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from flashtune import env
from flashtune.apply.call_plan import CallPlan, derived
from flashtune.apply.solutions import (
    Guarded,
    SolutionFailed,
    UnsupportedSolution,
    broken_solutions,
    is_broken,
    load_solution,
    running_solution,
    runs_the_op_itself,
    with_destinations,
)
from flashtune.apply.table import ApplyConfig, ApplyTable
from flashtune.bench.build import solution_hash
from flashtune.capture import api as capture_api
from flashtune.data.dataset import Dataset, bundled_root
from flashtune.data.models import Solution
from flashtune.data.synth import torch_dtype
from flashtune.schema import NOT_HANDLED, add_hook, register_env_hook, remove_hook
from flashtune.schema.api import ApiOp
from flashtune.schema.core import BoundCall, constant_mismatches, reference_constants

__all__ = [
    "ApplyHandle",
    "ApplyHook",
    "ApplyRuntime",
    "SolutionFailed",
    "UnsupportedSolution",
    "apply",
    "broken_solutions",
    "disable_apply",
    "dispatch",
    "enable_apply",
    "load_solution",
    "route",
]

log = logging.getLogger("flashtune.apply")

# --------------------------------------------------------------------------- the runtime


class ApplyRuntime:
    """A dataset's apply table plus the loaded solutions it names.

    Given a folder (or None: FLASHTUNE_DATASET), the dataset is read with the bundled
    dataset's solutions attached to its definitions of the same contract, as `flashtune run`
    attaches them: the traces of a run on a captured dataset name bundled solutions, which
    the captured folder does not hold. Each is used only if its content hash is the one the
    signed trace recorded, like a solution of the folder itself. A Dataset is used as given
    (pass `Dataset(root, solution_sources=[...])` for the sources of a `--solutions-from`
    run)."""

    def __init__(
        self,
        dataset: Dataset | str | Path | None = None,
        config: ApplyConfig | None = None,
        table: ApplyTable | None = None,
    ) -> None:
        if not isinstance(dataset, Dataset):
            dataset = Dataset(
                dataset if dataset is not None else env.DATASET.get(),
                solution_sources=[bundled_root()],
            )
        self.dataset = dataset
        self.config = config or ApplyConfig()
        self.table = table if table is not None else ApplyTable.load(dataset, self.config)
        self._runners: dict[tuple[str, str], Guarded | None] = {}
        self._input_dims: dict[str, list[tuple[str, tuple[str, ...] | None]]] = {}
        self._const_axes: dict[str, dict[str, int]] = {}
        # Per definition: input dtypes by name (None: the dataset lacks the definition), and
        # the same as torch dtypes for apply(name, kwargs).
        self._dtypes: dict[str, dict[str, str] | None] = {}
        self._torch_dtypes: dict[str, list[tuple[str, torch.dtype]] | None] = {}
        self._warned_dtypes: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        # Per definition: the bound-parameter values its reference fixes (eps).
        self._constants: dict[str, dict[str, Any]] = {}
        self._warned_constants: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        # Per op: whether a call of it may reach a solution at all (op_routing).
        self._op_routing: dict[ApiOp, str] = {}
        self._own: dict[tuple[str, str], bool] = {}
        self._lock = threading.Lock()

    def reload(self) -> None:
        """Re-read the traces (rebuilding the table if they changed)."""
        self.table = ApplyTable.load(self.dataset, self.config)
        self._op_routing.clear()
        self._own.clear()
        self._runners.clear()
        self._dtypes.clear()
        self._torch_dtypes.clear()
        self._constants.clear()

    def input_dtypes(self, definition: str) -> dict[str, str] | None:
        """The definition's input dtypes by name, or None when the dataset lacks it."""
        try:
            return self._dtypes[definition]
        except KeyError:
            pass
        d = self.dataset.definitions.get(definition)
        dtypes = capture_api.input_dtypes(d) if d is not None else None
        self._dtypes[definition] = dtypes
        return dtypes

    def dtypes_match(self, definition: str, dtypes: Mapping[str, str]) -> bool:
        """Whether a call with these input dtypes (BoundCall.dtypes) may run the definition's
        winners: they were benchmarked in the definition's dtypes, and take exactly its inputs
        (an optional input, such as a GEMM's bias, does not change the name: present in the
        call and absent from the definition, or the reverse, the winner cannot run it).
        Logs a mismatch once."""
        expected = self.input_dtypes(definition)
        if expected is not None and dtypes == expected:
            return True
        wrong = capture_api.dtype_mismatches(dtypes, expected) if expected is not None else {}
        key = (definition, tuple(sorted(dtypes.items())))
        if key not in self._warned_dtypes:
            self._warned_dtypes.add(key)
            if expected is None:
                log.warning(
                    "apply: %s is not in %s, so the dtypes of a call cannot be checked "
                    "against it; falling back",
                    definition,
                    self.dataset,
                )
            elif wrong:
                log.warning(
                    "apply: a call of %s has input dtypes %s but its winners were benchmarked "
                    "with %s; falling back (definition names carry no dtype)",
                    definition,
                    wrong,
                    {n: expected[n] for n in wrong},
                )
            else:
                log.warning(
                    "apply: a call of %s has the inputs %s but the definition has %s (an "
                    "optional input differs); falling back",
                    definition,
                    sorted(dtypes),
                    sorted(expected),
                )
        return False

    def constants_match(self, definition: str, call: BoundCall) -> bool:
        """Whether the call's bound constants (eps) are the ones the definition's reference
        fixes, so its winners compute what the call asks for. A definition the dataset
        lacks fixes nothing here (dtypes_match already refuses it). Logs a mismatch once."""
        if not call.schema.bound:
            return True
        expected = self._constants.get(definition)
        if expected is None:
            d = self.dataset.definitions.get(definition)
            found = reference_constants(d.reference, call.schema.bound) if d is not None else {}
            expected = self._constants[definition] = found
        wrong = constant_mismatches(call.constants, expected)
        if not wrong:
            return True
        key = (definition, tuple(sorted((n, repr(v)) for n, (v, _) in wrong.items())))
        if key not in self._warned_constants:
            self._warned_constants.add(key)
            log.warning(
                "apply: a call of %s has %s but its winners were proven with %s; falling "
                "back (definition names carry no constants)",
                definition,
                ", ".join(f"{n}={v!r}" for n, (v, _) in wrong.items()),
                ", ".join(f"{n}={d!r}" for n, (_, d) in wrong.items()),
            )
        return False

    def kwargs_dtypes_match(self, definition: str, kwargs: Mapping[str, Any]) -> bool:
        """dtypes_match for apply(name, kwargs) and the adapters: the tensors among kwargs
        (inputs by definition name) against the definition's dtypes, as torch dtypes."""
        try:
            expected = self._torch_dtypes[definition]
        except KeyError:
            expected = self._torch_dtypes[definition] = self._expected_torch_dtypes(definition)
        if expected is None:
            return self.dtypes_match(definition, {})  # logs once, False
        for name, dtype in expected:
            # getattr: a missing input or a Python scalar has no dtype and is no mismatch.
            if getattr(kwargs.get(name), "dtype", dtype) is not dtype:
                found = {
                    n: str(v.dtype).removeprefix("torch.")
                    for n, v in kwargs.items()
                    if isinstance(v, torch.Tensor)
                }
                return self.dtypes_match(definition, found)  # logs once, False
        return True

    def _expected_torch_dtypes(self, definition: str) -> list[tuple[str, torch.dtype]] | None:
        d = self.dataset.definitions.get(definition)
        if d is None:
            return None
        try:  # tensor inputs only: scalars are Python values
            return [(n, torch_dtype(s.dtype)) for n, s in d.inputs.items() if s.shape is not None]
        except ValueError:  # a dtype torch cannot name: nothing can be checked
            return None

    def op_routing(self, op: ApiOp) -> str:
        """Where calls of flashtune's `op` can go, decided once per op from the table alone:
        "none" (no definition of its schemas has a winner), "own" (every winner of each is
        flashtune's own op, runs_the_op_itself: the op runs itself whatever the shapes), or
        "route" (some call may reach a solution: bind the call and look it up). Definition
        names start with their schema's name_prefix, so matching by prefix may only count
        too many definitions (never too few): the answer errs towards "route"."""
        try:
            return self._op_routing[op]
        except KeyError:
            pass
        prefixes = tuple(schema.name_prefix for schema in op.schemas)
        names = [
            n
            for n in self.table.definitions
            if any(n == p or n.startswith(p + "_") for p in prefixes)
        ]
        routing = "none"
        for name in names:
            table = self.table.definitions[name]
            winners = {w.solution for w in table.buckets.values()}
            if table.default is not None:
                winners.add(table.default)
            if winners:
                routing = "own"
            if not all(self.winner_runs_the_op_itself(name, w) for w in winners):
                routing = "route"
                break
        self._op_routing[op] = routing
        return routing

    def winner_runs_the_op_itself(self, definition: str, solution_name: str) -> bool:
        """Whether the table's `solution_name` of `definition`, as its traces measured it
        (content hash), is flashtune's own op (runs_the_op_itself)."""
        key = (definition, solution_name)
        if key not in self._own:
            expected = self.table.solution_hash(definition, solution_name)
            self._own[key] = any(
                s.name == solution_name and _hash_or_none(s) == expected and runs_the_op_itself(s)
                for s in self.dataset.solutions.get(definition, [])
            )
        return self._own[key]

    def runner(self, definition: str, var_axes: Mapping[str, int]) -> Guarded | None:
        """`run(axes, inputs_in_definition_order)` of the winning solution, or None."""
        name = self.table.lookup(definition, var_axes)
        if name is None:
            return None
        key = (definition, name)
        if is_broken(definition, name):
            return None
        try:
            return self._runners[key]
        except KeyError:
            pass
        with self._lock:
            if key not in self._runners:
                self._runners[key] = self._load(definition, name)
            return self._runners[key]

    def _load(self, definition_name: str, solution_name: str) -> Guarded | None:
        # Exact names (solutions_for reads a glob), and only the content the traces were
        # verified against: a solution edited since the table was built (or saved) differs.
        found = [
            s for s in self.dataset.solutions.get(definition_name, []) if s.name == solution_name
        ]
        definition = self.dataset.definitions.get(definition_name)
        if not found:
            log.warning(
                "apply: %s wins %s in the traces but no such solution is in %s; falling back",
                solution_name,
                definition_name,
                self.dataset,
            )
            return None
        expected = self.table.solution_hash(definition_name, solution_name)
        solution = next((s for s in found if _hash_or_none(s) == expected), None)
        if solution is None:
            log.warning(
                "apply: %s of %s is not the code its traces measured (content hash %s "
                "expected); falling back",
                solution_name,
                definition_name,
                expected,
            )
            return None
        try:
            fn = load_solution(solution)
        except Exception as exc:  # noqa: BLE001 - any load failure means: use the fallback
            log.warning(
                "apply: cannot load %s for %s (%s); falling back",
                solution_name,
                definition_name,
                exc,
            )
            return None
        if solution.spec.destination_passing_style:
            if definition is None:
                log.warning("apply: %s needs its definition to allocate outputs", solution_name)
                return None
            run = with_destinations(fn, definition)
        else:

            def run(axes: Mapping[str, int], inputs: Sequence[Any]) -> Any:
                return fn(*inputs)

        return Guarded(run, definition_name, solution_name, runs_the_op_itself(solution))

    # ----------------------------------------------------------------- apply() by kwargs
    def input_order(self, definition: str) -> list[str]:
        """The definition's input names in order ([] when the dataset lacks it)."""
        if definition not in self._input_dims:
            self.axes_from_kwargs(definition, {})
        return [n for n, _ in self._input_dims[definition]]

    def axes_from_kwargs(self, definition: str, kwargs: Mapping[str, Any]) -> dict[str, int]:
        """Var-axes values read off the shapes of named inputs."""
        dims = self._input_dims.get(definition)
        if dims is None:
            d = self.dataset.definitions.get(definition)
            dims = (
                [(n, tuple(s.shape) if s.shape is not None else None) for n, s in d.inputs.items()]
                if d is not None
                else []
            )
            self._input_dims[definition] = dims
            self._const_axes[definition] = d.const_axes if d is not None else {}
        axes: dict[str, int] = dict(self._const_axes[definition])
        for name, shape in dims:
            value = kwargs.get(name)
            if shape and isinstance(value, torch.Tensor):
                for axis, size in zip(shape, _logical_shape(value, len(shape)), strict=False):
                    axes[axis] = int(size)
        return axes


def _hash_or_none(solution: Solution) -> str | None:
    try:
        return solution_hash(solution)
    except Exception as exc:  # noqa: BLE001 - unverifiable: never loaded
        log.warning("apply: cannot hash solution %s: %s", solution.name, exc)
        return None


def _logical_shape(value: torch.Tensor, rank: int) -> tuple[int, ...]:
    shape = tuple(value.shape)
    if len(shape) > rank >= 1:
        lead = 1
        for s in shape[: len(shape) - rank + 1]:
            lead *= s
        return (lead, *shape[len(shape) - rank + 1 :])
    return shape


# --------------------------------------------------------------------------- op dispatch


_MISS = object()
# The winner is flashtune's own op (runs_the_op_itself): a call of that op runs itself.
_OWN = object()


class ApplyHook:
    """The per-call hook that sends schema'd op calls to their winning solution.

    Counters: `hits` (a solution ran), `misses` (no usable winner: the op's own code ran),
    `own` (the winner is flashtune's own op, runs_the_op_itself: the op ran itself)."""

    def __init__(self, runtime: ApplyRuntime) -> None:
        self.runtime = runtime
        # Per call signature: a CallPlan, _MISS or _OWN. Calls of flashtune's ops (the hook) and
        # a peer's calls described as one (route) are cached apart: an own-path winner means
        # "run the op itself" only for the first.
        self._plans: dict[tuple, Any] = {}
        self._routed: dict[tuple, Any] = {}
        self.hits = 0
        self.misses = 0
        self.own = 0

    def __call__(self, op: ApiOp, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if running_solution():
            return NOT_HANDLED  # a solution's own op calls: its code, not the table's
        if capture_api.ACTIVE_CAPTURERS:
            capture_api.observe(op, args, kwargs)
        # An op no call of which can reach a solution runs itself without binding the call
        # (a wrapper's run() binds through its plan state every call: tens of us a call,
        # which an eager decode step, bound by the host, pays in full).
        routing = self.runtime.op_routing(op)
        if routing != "route":
            if routing == "own":
                self.own += 1
            else:
                self.misses += 1
            return NOT_HANDLED
        return self._route(op, args, kwargs, self._plans, True)

    def route(self, op: ApiOp, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The winner's result for this call of `op`, or NOT_HANDLED (the caller runs the
        op's own code): the hook without its capture forwarding, for a peer's call (an
        adapter) described as a call of `op`: an own-path winner runs as a solution here,
        since the caller's own code is the peer's."""
        if running_solution():
            return NOT_HANDLED
        return self._route(op, args, kwargs, self._routed, False)

    def _route(
        self,
        op: ApiOp,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        plans: dict[tuple, Any],
        op_call: bool,
    ) -> Any:
        fast = capture_api.call_signature(op, args, kwargs)
        if fast is not None:
            plan = plans.get(fast)
            if plan is _MISS:
                self.misses += 1
                return NOT_HANDLED
            if plan is _OWN:
                self.own += 1
                return NOT_HANDLED
            if plan is not None:
                try:
                    result = plan.run(op, args, kwargs)
                except SolutionFailed:
                    plans[fast] = _MISS
                    self.misses += 1
                    return NOT_HANDLED  # the op's own path runs
                self.hits += 1
                return result
        try:
            call = op.bind(*args, **kwargs)
            name = call.name
        except (ValueError, TypeError, KeyError, AttributeError):
            return NOT_HANDLED  # the op's own validation reports bad input
        # The cached plans are keyed by dtypes too, so this check runs once per signature.
        runner = (
            self.runtime.runner(name, call.var_axes)
            if self.runtime.dtypes_match(name, call.dtypes)
            and self.runtime.constants_match(name, call)
            else None
        )
        if runner is None:
            if fast is not None and not derived(call):
                plans[fast] = _MISS
            self.misses += 1
            return NOT_HANDLED
        if op_call and runner.own_path:
            # The same kernels the solution would reach, minus its adaptation (a wrapper's
            # plan stays in use). Cached like a miss: by signature, for plain calls only.
            if fast is not None and not derived(call):
                plans[fast] = _OWN
            self.own += 1
            return NOT_HANDLED
        plan = CallPlan(op, call, runner, args, kwargs)
        # A call with derived inputs can change its var axes (so its bucket's winner) while
        # its argument shapes stay the same: it is never cached by argument signature.
        try:
            result = plan.run(op, args, kwargs)
        except SolutionFailed:
            if fast is not None and not plan.derived:
                plans[fast] = _MISS
            self.misses += 1
            return NOT_HANDLED  # the op's own path runs
        if fast is not None and not plan.derived:
            plans[fast] = plan
        self.hits += 1
        return result


# --------------------------------------------------------------------------- enable / apply()

_ENABLED: list[ApplyHook] = []
_ENV_HOOK: list[ApplyHook] = []
_RUNTIMES: dict[tuple[str, ApplyConfig], ApplyRuntime] = {}
_RT_LOCK = threading.Lock()


def _sync_forwarding() -> None:
    capture_api.set_forwarded(bool(_ENABLED or _ENV_HOOK))


def _runtime_for(dataset: Dataset | str | Path | None, config: ApplyConfig | None) -> ApplyRuntime:
    if isinstance(dataset, Dataset):
        return ApplyRuntime(dataset, config)
    raw = str(dataset if dataset is not None else env.DATASET.get())
    config = config or ApplyConfig()
    rt = _RUNTIMES.get((raw, config))  # per-call path: no filesystem access on a hit
    if rt is not None:
        return rt
    root = str(Path(raw).expanduser().resolve())
    with _RT_LOCK:
        rt = _RUNTIMES.get((root, config))
        if rt is None:
            rt = ApplyRuntime(root, config)
        _RUNTIMES[(root, config)] = _RUNTIMES[(raw, config)] = rt
        return rt


class ApplyHandle:
    """Returned by enable_apply: `.disable()`, or use it as a context manager."""

    def __init__(self, hook: ApplyHook) -> None:
        self.hook = hook

    @property
    def runtime(self) -> ApplyRuntime:
        return self.hook.runtime

    def disable(self) -> None:
        remove_hook(self.hook)
        if self.hook in _ENABLED:
            _ENABLED.remove(self.hook)
        _sync_forwarding()

    def __enter__(self) -> ApplyHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disable()


def enable_apply(
    dataset: Dataset | str | Path | None = None, config: ApplyConfig | None = None
) -> ApplyHandle:
    """Dispatch every schema'd op to the winners of `dataset`'s traces (default
    FLASHTUNE_DATASET). Calls the table does not cover run the op's own path: the autotuner's
    pick where the op asks it (`choose_one`); the plan-free attention calls (paged_decode,
    paged_prefill, ragged_prefill) never ask it and run their default tactic for the shape
    (or, for paged_decode, the caller's `launch`)."""
    hook = ApplyHook(
        ApplyRuntime(dataset, config)
        if isinstance(dataset, Dataset)
        else _runtime_for(dataset, config)
    )
    _ENABLED.append(hook)
    add_hook(hook)
    _sync_forwarding()
    return ApplyHandle(hook)


def disable_apply() -> None:
    """Turn off every hook enable_apply installed."""
    for hook in list(_ENABLED):
        ApplyHandle(hook).disable()


def _active_runtime(dataset: Dataset | str | Path | None) -> ApplyRuntime:
    if dataset is None and _ENABLED:
        return _ENABLED[-1].runtime
    if dataset is None and _ENV_HOOK:
        return _ENV_HOOK[0].runtime
    return _runtime_for(dataset, None)


_ADAPTER_HOOKS: dict[ApplyRuntime, ApplyHook] = {}  # for runtimes no enabled hook holds


def _active_hook() -> ApplyHook:
    """The hook adapters route through: the latest enable_apply's, FLASHTUNE_APPLY's, else
    one kept for the default dataset's runtime (so its plans are cached too)."""
    if _ENABLED:
        return _ENABLED[-1]
    if _ENV_HOOK:
        return _ENV_HOOK[0]
    rt = _runtime_for(None, None)
    hook = _ADAPTER_HOOKS.get(rt)
    if hook is None:
        hook = _ADAPTER_HOOKS[rt] = ApplyHook(rt)
    return hook


def route(op: ApiOp, arguments: Mapping[str, Any]) -> Any:
    """What a call of `op` with these arguments (by its parameter names) returns when the
    table has a winner for it, else NOT_HANDLED: an adapter's way in. A peer's call (a
    FlashInfer function, torch's linear) is described as the call of the flashtune op whose
    schema covers it, so its Definition, inputs and var axes all come from that schema."""
    return _active_hook().route(op, (), dict(arguments))


_WARNED: set[str] = set()


def dispatch(name: str, inputs: Mapping[str, Any], runtime: Any = None) -> list[Any] | None:
    """Run the winner of definition `name` on `inputs` (by input name): its outputs in
    definition order, or None when the table has no solution (the caller falls back).
    For calls that no op schema describes; an op's call goes through `route`."""
    if running_solution():
        return None  # called from inside a solution: the caller's own path
    rt = runtime if runtime is not None else _active_runtime(None)
    if name not in rt.table.definitions:
        return None
    definition = rt.dataset.definitions.get(name)
    if definition is None:  # without it the solution's argument order is unknown
        if name not in _WARNED:
            _WARNED.add(name)
            log.warning("apply: definition %s is not in %s; falling back", name, rt.dataset)
        return None
    if not rt.kwargs_dtypes_match(name, inputs):  # names carry no dtype: see the docstring
        return None
    axes = rt.axes_from_kwargs(name, inputs)
    runner = rt.runner(name, axes)
    if runner is None:
        return None
    try:
        result = runner(axes, [inputs[n] for n in definition.inputs if n in inputs])
        if isinstance(result, Mapping):
            return [result[n] for n in definition.outputs]
    except SolutionFailed:
        return None  # disabled (warned once): the caller runs the original function
    except KeyError as exc:  # an output the solution did not return: its fault too
        runner.fail(exc)
        return None
    if isinstance(result, (tuple, list)):
        return list(result)
    return [result]


def apply(
    def_name_or_resolver: str | Callable[[Mapping[str, Any]], str],
    runtime_kwargs: Mapping[str, Any] | None = None,
    fallback: Callable[..., Any] | None = None,
    *,
    dataset: Dataset | str | Path | None = None,
) -> Any:
    """Run the winning solution of a definition on `runtime_kwargs` (inputs by definition
    name), else `fallback(**runtime_kwargs)`.

    Without runtime_kwargs, a decorator: `@apply("gemm_n4096_k4096")` on a function whose
    parameters are the definition's inputs; the function itself is the fallback."""
    if runtime_kwargs is None:

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            signature = inspect.signature(fn)

            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                return apply(def_name_or_resolver, bound.arguments, fn, dataset=dataset)

            return wrapper

        return decorate
    if running_solution() and fallback is not None:
        return fallback(**runtime_kwargs)  # called from inside a solution
    rt = _active_runtime(dataset)
    name = (
        def_name_or_resolver(runtime_kwargs)
        if callable(def_name_or_resolver)
        else def_name_or_resolver
    )
    if (
        name is not None
        and name in rt.table.definitions
        and rt.kwargs_dtypes_match(name, runtime_kwargs)
    ):
        axes = rt.axes_from_kwargs(name, runtime_kwargs)
        runner = rt.runner(name, axes)
        if runner is not None:
            order = rt.input_order(name) or list(runtime_kwargs)
            try:
                return runner(axes, [runtime_kwargs[n] for n in order if n in runtime_kwargs])
            except SolutionFailed:
                if fallback is None:
                    raise
    if fallback is None:
        raise LookupError(
            f"apply: no solution for {name!r} at these shapes in {rt.dataset} and no fallback"
        )
    return fallback(**runtime_kwargs)


def _apply_hook_from_env() -> ApplyHook | None:
    _ENV_HOOK.clear()
    if env.APPLY.get():
        _ENV_HOOK.append(ApplyHook(_runtime_for(None, None)))
    _sync_forwarding()
    return _ENV_HOOK[0] if _ENV_HOOK else None


register_env_hook(_apply_hook_from_env)

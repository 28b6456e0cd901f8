"""Solutions as callables: load a solution's entry point, and disable one that fails.

`load_solution` imports an importable entry point or writes a source solution's files
under the cache folder and imports its entry file; `Guarded` wraps the loaded callable so
that its first exception disables it for the rest of the process (the caller falls back to
its own code, warned once).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from flashtune import env
from flashtune.data.io import write_text_if_changed
from flashtune.data.models import Definition, Solution
from flashtune.data.synth import torch_dtype

__all__ = [
    "Guarded",
    "SolutionFailed",
    "UnsupportedSolution",
    "broken_solutions",
    "clear_broken_solutions",
    "is_broken",
    "load_solution",
    "runs_the_op_itself",
    "with_destinations",
]

_LOADABLE = {"python", "torch", "triton"}


class UnsupportedSolution(RuntimeError):
    """A solution apply cannot load in this process (a language it does not build)."""


# --------------------------------------------------------------------------- loading solutions


def _sources_hash(solution: Solution) -> str:
    h = hashlib.sha256(solution.spec.entry_point.encode())
    for src in sorted(solution.sources, key=lambda s: s.path):
        h.update(src.path.encode() + b"\0" + src.content.encode() + b"\0")
    return h.hexdigest()[:20]


def load_solution(solution: Solution, cache_dir: Path | None = None) -> Callable[..., Any]:
    """The solution's entry point as a callable `run(*inputs)`.

    "pkg.mod:func" is imported; "file.py::func" has its sources written once to
    <cache>/apply/solutions/<content hash>/ (so Triton can read kernel source from real
    files) and the entry file imported from there, siblings importable."""
    spec = solution.spec
    if spec.is_importable:
        module_name, _, attr = spec.entry_point.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    if spec.language not in _LOADABLE:
        raise UnsupportedSolution(
            f"solution {solution.name!r}: language {spec.language!r} is not loaded by apply "
            f"(only {sorted(_LOADABLE)})"
        )
    digest = _sources_hash(solution)
    folder = (cache_dir or env.CACHE_DIR.get()) / "apply" / "solutions" / digest
    for src in solution.sources:
        path = folder / src.path
        write_text_if_changed(path, src.content)
    entry_file, _, func = spec.entry_point.partition("::")
    module_name = f"flashtune_solution_{digest}_{Path(entry_file).stem}"
    module = sys.modules.get(module_name)
    if module is None:
        mod_spec = importlib.util.spec_from_file_location(module_name, folder / entry_file)
        if mod_spec is None or mod_spec.loader is None:
            raise ImportError(f"cannot import {folder / entry_file}")
        module = importlib.util.module_from_spec(mod_spec)
        sys.path.insert(0, str(folder))
        try:
            sys.modules[module_name] = module
            mod_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        finally:
            sys.path.remove(str(folder))
    return getattr(module, func)


def runs_the_op_itself(solution: Solution) -> bool:
    """Whether the solution is flashtune's own op for its definition: its one source file
    only imports an entry of flashtune.bench.entry_points marked as running the op
    (OWN_PATH_ENTRIES: the bundled builder's `flashtune@` solutions) as its entry symbol.
    Decided from the source text alone (nothing runs), so the table and the runtime agree.

    For such a winner, a call of flashtune's op is better served by the op itself than by
    the solution: the same kernels, without the solution's adaptation (a wrapper's run()
    through a plan-free call would plan again every call)."""
    spec = solution.spec
    entry_file, _, symbol = spec.entry_point.partition("::")
    if spec.destination_passing_style or len(solution.sources) != 1 or not symbol:
        return False
    source = solution.sources[0]
    if source.path != entry_file:
        return False
    try:
        tree = ast.parse(source.content)
    except SyntaxError:
        return False
    from flashtune.bench import entry_points

    imported = None
    for node in tree.body:
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == entry_points.__name__
            and node.level == 0
        ):
            if imported is not None or len(node.names) != 1:
                return False
            alias = node.names[0]
            if (
                alias.name not in entry_points.OWN_PATH_ENTRIES
                or (alias.asname or alias.name) != symbol
            ):
                return False
            imported = alias.name
        elif isinstance(node, ast.Assign) and [
            t.id for t in node.targets if isinstance(t, ast.Name)
        ] == ["__all__"]:
            continue
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        else:
            return False
    return imported is not None


def with_destinations(
    fn: Callable[..., Any], definition: Definition
) -> Callable[[Mapping[str, int], Sequence[Any]], Any]:
    """Adapt a destination-passing `run(*inputs, *outputs)` to return its outputs."""

    def run(axes: Mapping[str, int], inputs: Sequence[Any]) -> Any:
        device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), "cpu")
        outs = [
            torch.empty(
                [axes[a] for a in spec.shape or ()], dtype=torch_dtype(spec.dtype), device=device
            )
            for spec in definition.outputs.values()
        ]
        fn(*inputs, *outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run


# --------------------------------------------------------------------------- failing solutions


class SolutionFailed(RuntimeError):
    """An applied solution raised (or returned what its definition does not produce); it is
    disabled for the rest of the process and the caller runs the original function."""


# (definition, solution) pairs that raised at call time: never dispatched to again in this
# process, whichever runtime or hook finds them in a table.
_BROKEN: dict[tuple[str, str], str] = {}
_BROKEN_LOCK = threading.Lock()


def broken_solutions() -> dict[tuple[str, str], str]:
    """(definition, solution) -> the exception, for the solutions disabled after raising."""
    return dict(_BROKEN)


# How many applied solutions this thread is inside. A solution may call the very op it
# replaces (flashtune's own solutions call flashtune's ops): such inner calls run the op's
# own code, never the table again, or each would dispatch to itself until the recursion
# limit (seen on the H100 in `flashtune e2e --loop`).
_DEPTH = threading.local()


def running_solution() -> bool:
    """True inside an applied solution's call (on this thread): op calls made there are the
    solution's own and are neither routed by apply nor captured."""
    return getattr(_DEPTH, "n", 0) > 0


class Guarded:
    """A loaded solution's `run(axes, inputs)`, disabled at its first exception."""

    __slots__ = ("definition", "fn", "own_path", "solution")

    def __init__(
        self, fn: Callable[..., Any], definition: str, solution: str, own_path: bool = False
    ) -> None:
        self.fn = fn
        self.definition = definition
        self.solution = solution
        # runs_the_op_itself: a call of flashtune's op runs the op instead (ApplyHook).
        self.own_path = own_path

    def __call__(self, axes: Mapping[str, int], inputs: Sequence[Any]) -> Any:
        if (self.definition, self.solution) in _BROKEN:
            raise SolutionFailed(f"solution {self.solution!r} is disabled")
        _DEPTH.n = getattr(_DEPTH, "n", 0) + 1
        try:
            return self.fn(axes, inputs)
        except Exception as exc:
            raise self.fail(exc) from exc
        finally:
            _DEPTH.n -= 1

    def fail(self, exc: BaseException) -> SolutionFailed:
        """Disable the solution (warning once) and return the exception to raise."""
        key = (self.definition, self.solution)
        with _BROKEN_LOCK:
            first = key not in _BROKEN
            _BROKEN.setdefault(key, repr(exc))
        if first:
            # A user's call must not fail because a dataset's solution does: it falls back
            # to the function the user called, and says so once.
            warnings.warn(
                f"flashtune apply: solution {self.solution!r} for {self.definition} raised "
                f"{exc!r}; falling back to the original function and not using this solution "
                "again in this process",
                RuntimeWarning,
                stacklevel=2,
            )
        return SolutionFailed(f"solution {self.solution!r} for {self.definition} raised {exc!r}")


def clear_broken_solutions() -> None:
    """Give every disabled solution another chance (tests, long-lived processes)."""
    with _BROKEN_LOCK:
        _BROKEN.clear()


def is_broken(definition: str, solution: str) -> bool:
    """Whether the solution raised at call time and is disabled in this process."""
    return (definition, solution) in _BROKEN

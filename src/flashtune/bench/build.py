"""Build a Solution into a callable, by language.

- python / torch / triton / tilelang: the sources are written under
  ``FLASHTUNE_CACHE_DIR/solutions/<content hash>/`` as a package and the entry file is
  imported (Triton and TileLang kernels compile lazily, on first call: TileLang code is
  Python, built as FlashInfer-Bench's TileLangBuilder builds it); an importable entry point
  ("package.module:function") is imported directly.
- cuda / cpp bound with TVM-FFI (FlashInfer-Bench's default binding: `binding` "tvm-ffi", or
  absent with sources that use TVM-FFI): ``tvm_ffi.cpp.build`` (build_tvm_ffi.py);
- other cuda / cpp: ``torch.utils.cpp_extension.load_inline`` over the sources, built in
  ``FLASHTUNE_CACHE_DIR/build/<content hash>/`` so an unchanged solution is not rebuilt.

`check_requirements` says why a solution cannot run here (no GPU for a Triton/CUDA solution,
a dependency not installed, a tilelang solution without the tilelang package): the
runner records SKIPPED with that reason. A build failure raises `BuildError` with the
compiler's (or the import's) log: COMPILE_ERROR.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import re
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flashtune import env
from flashtune.bench.build_errors import BuildError, MissingRequirement
from flashtune.bench.build_tvm_ffi import (
    TVM_FFI_PACKAGE,
    build_tvm_ffi,
    tvm_ffi_available,
    uses_tvm_ffi,
)
from flashtune.data.io import atomic_write_text, write_text_if_changed
from flashtune.data.models import Solution

__all__ = [
    "BUILDABLE_LANGUAGES",
    "BuildError",
    "MissingRequirement",
    "solution_hash",
    "check_requirements",
    "build_solution",
]

_GPU_LANGUAGES = {"triton", "cuda", "tilelang"}
# What _build knows how to build; any other language is SKIPPED with the reason.
BUILDABLE_LANGUAGES = frozenset({"python", "torch", "triton", "tilelang", "cuda", "cpp"})
# Languages whose sources are Python importing a compiler package: (language, module, what
# pip installs). Their solutions are SKIPPED, saying what to install, where it is missing.
_PYTHON_DSLS = {"tilelang": ("tilelang", "tilelang")}
_CPU_HARDWARE = {"cpu", "any", "*"}


def solution_hash(solution: Solution) -> str:
    """Hash of what determines a solution's behaviour: its build spec and sources and, for an
    importable entry point ("package.module:function"), the code that module is made of.

    That code is found without importing anything (a solution's import is untrusted code,
    and runs only in a worker): the module's file, or a package's .py files; for flashtune's
    own modules (the bundled entry points import flashtune's kernels) the hash of all of
    flashtune's sources. A changed kernel thus changes the hash, and --resume re-runs it.
    Cheap on repeat calls: file hashes are cached by (path, mtime, size)."""
    payload: dict[str, Any] = {
        "spec": solution.spec.model_dump(mode="json"),
        "sources": sorted((s.path, s.content) for s in solution.sources),
    }
    if solution.spec.is_importable:
        payload["module_code"] = _module_code_hash(solution.spec.entry_point.partition(":")[0])
    elif _imports_flashtune(solution):
        # A source calling flashtune's code (the bundled solutions bind `run` to an entry
        # point): a changed kernel changes what it runs, as for an importable entry point.
        payload["module_code"] = _module_code_hash("flashtune")
    text = json.dumps(payload, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _imports_flashtune(solution: Solution) -> bool:
    """Whether a Python source of `solution` imports flashtune (absolute imports only)."""
    for source in solution.sources:
        if not source.path.endswith(".py"):
            continue
        try:
            tree = ast.parse(source.content)
        except SyntaxError:
            continue  # fails at build time, with the import's own message
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(name.split(".")[0] == "flashtune" for name in names):
                return True
    return False


def _module_code_hash(module: str) -> str | None:
    """Hash of the files `module` is made of, found without importing it or its parents;
    None when it cannot be found here (check_requirements then skips the solution)."""
    from flashtune import platform

    parts = module.split(".")
    if parts[0] == "flashtune":
        return "flashtune:" + platform.source_hash()
    try:
        # A top-level name is looked up by the finders alone, which import nothing.
        spec = importlib.util.find_spec(parts[0])
        for i in range(1, len(parts)):
            if spec is None or spec.submodule_search_locations is None:
                return None
            # importlib.util.find_spec would import the parent package (and run its
            # __init__); PathFinder only searches the parent's folders.
            spec = importlib.machinery.PathFinder.find_spec(
                ".".join(parts[: i + 1]), list(spec.submodule_search_locations)
            )
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations is not None:  # a package: all of its .py files
        folders = list(spec.submodule_search_locations)
        return ";".join(sorted(platform.files_hash(f) for f in folders)) or None
    if spec.origin is None or not Path(spec.origin).is_file():  # built-in, frozen
        return f"{spec.origin}"
    return platform.files_hash(spec.origin)


def _module_of(requirement: str) -> str:
    # "flash-attn>=2.5" -> "flash_attn"; "pkg[extra]" -> "pkg".
    name = re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0]
    return name.replace("-", "_")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_requirements(solution: Solution, device: torch.device, interpret: bool = False) -> None:
    """Raise MissingRequirement saying why `solution` cannot run on `device`. `interpret`: a
    Triton solution runs in Triton's interpreter on the CPU (bench/interpreter.py decides
    when), whatever hardware it targets."""
    spec = solution.spec
    if spec.language not in BUILDABLE_LANGUAGES:
        raise MissingRequirement(
            f"flashtune does not build {spec.language} solutions (it builds "
            f"{', '.join(sorted(BUILDABLE_LANGUAGES))})"
        )
    interpreted = interpret and spec.language == "triton"
    if device.type != "cuda" and not interpreted:
        if spec.language in _GPU_LANGUAGES:
            raise MissingRequirement(f"no CUDA device for a {spec.language} solution")
        hardware = {h.lower() for h in spec.target_hardware}
        if hardware and not hardware & _CPU_HARDWARE:
            raise MissingRequirement(
                f"targets {', '.join(spec.target_hardware)}, not the CPU (no CUDA device here)"
            )
    if spec.language in _PYTHON_DSLS:
        module, package = _PYTHON_DSLS[spec.language]
        if not _importable(module):
            raise MissingRequirement(
                f"a {spec.language} solution needs the {module} package (`pip install {package}`)"
            )
    if uses_tvm_ffi(solution) and not tvm_ffi_available():
        raise MissingRequirement(
            f"a TVM-FFI-bound {spec.language} solution needs `pip install {TVM_FFI_PACKAGE}`"
        )
    for dep in spec.dependencies:
        if not _importable(_module_of(dep)):
            raise MissingRequirement(f"dependency {dep!r} is not installed")
    if spec.is_importable:
        top = spec.entry_point.partition(":")[0].split(".")[0]
        if not _importable(top):
            raise MissingRequirement(
                f"package {top!r} of entry point {spec.entry_point} is missing"
            )


_BUILT: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()


def build_solution(solution: Solution) -> Callable[..., Any]:
    """The solution's entry function, built once per content hash in this process."""
    key = solution_hash(solution)
    with _LOCK:
        fn = _BUILT.get(key)
        if fn is None:
            fn = _build(solution, key)
            _BUILT[key] = fn
        return fn


def _build(solution: Solution, key: str) -> Callable[..., Any]:
    spec = solution.spec
    if spec.is_importable:
        module_name, _, attr = spec.entry_point.partition(":")
        module = _import(module_name, solution)
        return _resolve(module, attr, solution)
    if spec.language in ("cuda", "cpp"):
        if uses_tvm_ffi(solution):
            return build_tvm_ffi(solution, key)
        return _build_extension(solution, key)
    if spec.language not in BUILDABLE_LANGUAGES:
        raise MissingRequirement(f"flashtune does not build {spec.language} solutions")
    return _build_python(solution, key)


def _import(module_name: str, solution: Solution) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and missing.split(".")[0] != module_name.split(".")[0]:
            # A third-party package the entry module needs: the environment lacks it.
            raise MissingRequirement(f"package {missing!r} is not installed") from None
        raise BuildError(f"cannot import {module_name}: {exc}", traceback.format_exc()) from None
    except BaseException as exc:  # noqa: BLE001 - any failure at import is a build failure
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise BuildError(
            f"importing {module_name} raised {type(exc).__name__}: {exc}", traceback.format_exc()
        ) from None


def _resolve(module: Any, attr: str, solution: Solution) -> Callable[..., Any]:
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise BuildError(
                f"{solution.name}: entry point {solution.spec.entry_point} names {attr!r}, "
                f"which {module.__name__} does not define"
            )
    if not callable(obj):
        raise BuildError(
            f"{solution.name}: entry point {solution.spec.entry_point} is not callable"
        )
    return obj


def _build_python(solution: Solution, key: str) -> Callable[..., Any]:
    package = f"_flashtune_solution_{key}"
    root = env.CACHE_DIR.get() / "solutions"
    pkg_dir = root / package
    for source in solution.sources:
        path = pkg_dir / source.path
        write_text_if_changed(path, source.content)
    for folder in {(pkg_dir / s.path).parent for s in solution.sources} | {pkg_dir}:
        while True:  # every folder on the way is a package, so relative imports work
            init = folder / "__init__.py"
            if not init.exists():
                atomic_write_text(init, "")
            if folder == pkg_dir:
                break
            folder = folder.parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    file, _, func = solution.spec.entry_point.partition("::")
    dotted = ".".join([package, *Path(file).with_suffix("").parts])
    module = _import(dotted, solution)
    return _resolve(module, func, solution)


def _build_extension(solution: Solution, key: str) -> Callable[..., Any]:
    from torch.utils.cpp_extension import load_inline

    build_dir = env.CACHE_DIR.get() / "build" / key
    build_dir.mkdir(parents=True, exist_ok=True)
    cpp, cuda = [], []
    for source in solution.sources:
        suffix = Path(source.path).suffix
        if suffix == ".cu":
            cuda.append(source.content)
        elif suffix in (".cpp", ".cc", ".cxx"):
            cpp.append(source.content)
        else:  # headers: written where the includes find them
            atomic_write_text(build_dir / source.path, source.content)
    file, _, func = solution.spec.entry_point.partition("::")
    has_module = any("PYBIND11_MODULE" in s.content for s in solution.sources)
    if not cpp and not has_module:
        raise BuildError(
            f"{solution.name}: CUDA sources need a PYBIND11_MODULE or a .cpp source declaring "
            f"{func!r} (load_inline binds the functions declared in the C++ sources)"
        )
    try:
        module = load_inline(
            name=f"flashtune_solution_{key}",
            cpp_sources=cpp or [""],
            cuda_sources=cuda or None,
            functions=None if has_module else [func],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3"],
            extra_include_paths=[str(build_dir)],
            build_directory=str(build_dir),
            with_cuda=bool(cuda),
            verbose=False,
        )
    except Exception as exc:  # noqa: BLE001 - the compiler's message is the log
        raise BuildError(f"{solution.name}: build failed: {str(exc)[:300]}", str(exc)) from None
    return _resolve(module, func, solution)

"""Build CUDA / C++ solutions bound with TVM-FFI, FlashInfer-Bench's default binding.

FlashInfer-Bench compiles a `cuda` or `cpp` solution whose `spec.binding` is "tvm-ffi" or
absent with apache-tvm-ffi: the sources export their entry with
``TVM_FFI_DLL_EXPORT_TYPED_FUNC(name, fn)`` and take ``tvm::ffi::TensorView`` arguments in
destination-passing style (inputs, then outputs). flashtune builds those the same way, so a
solution written for FlashInfer-Bench runs here unchanged:

- `uses_tvm_ffi(solution)`: which builder a cuda / cpp solution takes. binding "tvm-ffi" ->
  TVM-FFI; "torch" -> torch's load_inline (pybind11, build.py); absent -> TVM-FFI when the
  sources use it (its headers or export macro), else load_inline: FlashInfer-Bench's default
  for its own solutions, flashtune's earlier behaviour for sources written for torch.
- `build_tvm_ffi(solution, key)`: the sources written to
  ``FLASHTUNE_CACHE_DIR/build/tvm_ffi/<content hash>/`` (include root for the headers among
  them), compiled with ``tvm_ffi.cpp.build`` (CUDA sources with nvcc, linked against the CUDA
  driver and cuBLAS as FlashInfer-Bench links them), checked for unresolved symbols, loaded,
  and the exported entry symbol returned. The library is reused while the sources are
  byte-identical (the directory is named by the content hash).

TVM-FFI functions take torch tensors through DLPack and return None in destination-passing
style: the runner passes the outputs (`spec.destination_passing_style`, FlashInfer-Bench's
default).
"""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flashtune import env
from flashtune.bench.build_errors import BuildError
from flashtune.data.io import write_text_if_changed
from flashtune.data.models import Solution
from flashtune.platform import cuda_homes

__all__ = ["TVM_FFI_PACKAGE", "uses_tvm_ffi", "tvm_ffi_available", "build_tvm_ffi"]

TVM_FFI_PACKAGE = "apache-tvm-ffi"  # what pip installs as the `tvm_ffi` module
_CUDA_SUFFIXES = (".cu",)
_CPP_SUFFIXES = (".cpp", ".cc", ".cxx", ".c")
_MARKERS = ("tvm/ffi/", "TVM_FFI_DLL_EXPORT")


def uses_tvm_ffi(solution: Solution) -> bool:
    """A cuda / cpp solution that takes the TVM-FFI builder (module docstring)."""
    spec = solution.spec
    if spec.language not in ("cuda", "cpp"):
        return False
    if spec.binding is not None:
        return spec.binding == "tvm-ffi"
    return any(marker in s.content for s in solution.sources for marker in _MARKERS)


def tvm_ffi_available() -> bool:
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        return False
    return True


def _cuda_lib_dir() -> str | None:
    """The CUDA toolkit's library folder (libcudart, libcublas), found from nvcc or the
    usual prefixes."""
    nvcc = shutil.which("nvcc")
    toolkit = [Path(nvcc).resolve().parent.parent] if nvcc else []
    for home in toolkit + cuda_homes():
        for sub in ("targets/x86_64-linux/lib", "lib64", "lib"):
            if (home / sub / "libcudart.so").exists():
                return str(home / sub)
    return None


def build_tvm_ffi(solution: Solution, key: str) -> Callable[..., Any]:
    """The solution's exported entry function (module docstring). Raises BuildError with the
    compiler's log when it does not build, load, or export the entry symbol."""
    try:
        import tvm_ffi
        import tvm_ffi.cpp
    except ImportError:
        raise BuildError(
            f"{solution.name}: a TVM-FFI solution needs `pip install {TVM_FFI_PACKAGE}`"
        ) from None
    file, sep, symbol = solution.spec.entry_point.partition("::")
    if not sep or not symbol:
        raise BuildError(
            f"{solution.name}: entry point {solution.spec.entry_point!r} is not "
            "'<file>::<exported symbol>'"
        )
    folder = env.CACHE_DIR.get() / "build" / "tvm_ffi" / key
    folder.mkdir(parents=True, exist_ok=True)
    cpp, cuda = [], []
    for source in solution.sources:
        path = folder / source.path  # the Solution model refuses absolute and .. paths
        write_text_if_changed(path, source.content)
        if path.suffix in _CUDA_SUFFIXES:
            cuda.append(str(path))
        elif path.suffix in _CPP_SUFFIXES:
            cpp.append(str(path))
    if not cpp and not cuda:
        raise BuildError(f"{solution.name}: no .cu / .cpp source to compile")
    library = folder / f"flashtune_tvm_ffi_{key}.so"
    from tvm_ffi.utils import FileLock

    with FileLock(str(folder / ".build.lock")):  # one build per key, across processes
        if not library.exists():
            _compile(solution, key, folder, cpp, cuda, library)
    try:  # every symbol resolves now, not at the first call
        ctypes.CDLL(str(library), mode=os.RTLD_NOW)
        module = tvm_ffi.load_module(str(library))
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"{solution.name}: the built library does not load: {exc}") from None
    try:
        fn = getattr(module, symbol)
    except AttributeError:
        raise BuildError(
            f"{solution.name}: {file} does not export {symbol!r} "
            f"(TVM_FFI_DLL_EXPORT_TYPED_FUNC({symbol}, ...))"
        ) from None
    return fn


def _compile(
    solution: Solution, key: str, folder: Path, cpp: list[str], cuda: list[str], library: Path
) -> None:
    """tvm_ffi.cpp.build of the sources into `library` (BuildError with the log if not)."""
    import tvm_ffi.cpp

    ldflags: list[str] = []
    if cuda or any(h.lower() == "cuda" for h in solution.spec.target_hardware):
        ldflags = ["-lcuda", "-lcublas"]
        lib_dir = _cuda_lib_dir()
        if lib_dir:
            ldflags.insert(0, f"-L{lib_dir}")
    try:
        built = tvm_ffi.cpp.build(
            name=f"flashtune_tvm_ffi_{key}",
            cpp_files=cpp,
            cuda_files=cuda,
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3"],
            extra_ldflags=ldflags,
            extra_include_paths=[str(folder)],
            build_directory=str(folder),
        )
    except Exception as exc:  # noqa: BLE001 - the compiler's message is the log
        raise BuildError(
            f"{solution.name}: TVM-FFI build failed: {str(exc)[:300]}", str(exc)
        ) from None
    if Path(built) != library:
        shutil.copyfile(built, library)

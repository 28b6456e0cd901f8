"""flashtune: fast, autotuned Triton kernels for LLM inference.

Importing flashtune never touches CUDA or compiles anything; ops and the tuner are loaded on
first use.

FlashInfer's public names live here too, and its submodules under their FlashInfer names
(`flashtune.decode`, `.prefill`, `.cascade`, `.page`, `.norm`, `.activation`, `.rope`,
`.sampling`), so that `import flashtune as flashinfer` serves code written for FlashInfer.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from flashtune import env, flashinfer_names, switches

__version__ = "0.1.0"

# Submodules under FlashInfer's names, loaded on first access.
_MODULES = tuple(flashinfer_names.TOP_LEVEL)

# Public names loaded on first use (PEP 562), so that `import flashtune` stays cheap and
# CUDA-free: name -> the package that defines it.
_LAZY = {
    "autotune": "tune",
    "load_configs": "tune",
    "capture": "capture",
    "CaptureConfig": "capture",
    "apply": "apply",
    "enable_apply": "apply",
    "Dataset": "data",
    "Definition": "data",
    "Solution": "data",
    "Workload": "data",
    "Trace": "data",
    **{name: module for module, names in flashinfer_names.TOP_LEVEL.items() for name in names},
}


def __getattr__(name: str) -> Any:
    if name == "__all__":
        # Computed: a name the attention package does not have yet stays out of
        # `from flashtune import *` (which would otherwise fail on it).
        return ["__version__", *_MODULES, *(n for n in _LAZY if _has(n))]
    if name in _MODULES:
        return _package(name)
    package = _LAZY.get(name)
    if package is None:
        raise AttributeError(f"module 'flashtune' has no attribute {name!r}")
    try:
        return getattr(_package(package), name)
    except AttributeError:
        raise AttributeError(f"module 'flashtune' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULES, *_LAZY})


def _has(name: str) -> bool:
    return hasattr(_package(_LAZY[name]), name)


def _package(package: str) -> ModuleType:
    # Plain imports, not imports by string: the layering check (scripts/check_layers.py)
    # sees them. `import flashtune.x as x`, not `from flashtune import x`: the latter asks
    # this module's __getattr__ for x first and would recurse.
    if package == "tune":
        import flashtune.tune as tune

        return tune
    if package == "capture":
        import flashtune.capture as capture

        return capture
    if package == "apply":
        import flashtune.apply as apply

        return apply
    if package == "data":
        import flashtune.data as data

        return data
    return _facade(package)


def _facade(name: str) -> ModuleType:
    # FlashInfer's submodule names (flashinfer_names.TOP_LEVEL), each a facade module
    # flashtune.<name> re-exporting its family's ops: a new family adds no line here.
    if name not in flashinfer_names.TOP_LEVEL:
        raise AttributeError(f"module 'flashtune' has no submodule {name!r}")
    return importlib.import_module(f"{__name__}.{name}")


# FLASHTUNE_CAPTURE=1 / FLASHTUNE_APPLY=1 must work in a program that never imports capture or
# apply: the root (imported before any op) tells schema's hooks how to load them.
def _load_capture() -> None:
    import flashtune.capture  # noqa: F401  (importing it registers its env hook)


def _load_apply() -> None:
    import flashtune.apply  # noqa: F401  (importing it registers its env hook)


switches.register(env.CAPTURE.get, _load_capture)
switches.register(env.APPLY.get, _load_apply)

"""flashtune: fast, autotuned Triton kernels for LLM inference.

Importing flashtune never touches CUDA or compiles anything; ops and the tuner are loaded on
first use.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from flashtune import env, switches

__version__ = "0.1.0"

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
    # FlashInfer's sampling family, at the top level as in `flashinfer`
    **{
        name: "sampling"
        for name in (
            "softmax",
            "sampling_from_probs",
            "sampling_from_logits",
            "top_p_sampling_from_probs",
            "top_k_sampling_from_probs",
            "min_p_sampling_from_probs",
            "top_k_top_p_sampling_from_probs",
            "top_k_top_p_sampling_from_logits",
            "top_p_renorm_probs",
            "top_p_renorm_prob",
            "top_k_renorm_probs",
            "top_k_renorm_prob",
            "top_k_mask_logits",
            "chain_speculative_sampling",
        )
    },
}
# Submodules under FlashInfer's names (`flashtune.sampling` is flashtune.ops.sampling).
_MODULES = ("sampling",)

__all__ = ["__version__", *_MODULES, *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return _package(name)
    package = _LAZY.get(name)
    if package is None:
        raise AttributeError(f"module 'flashtune' has no attribute {name!r}")
    return getattr(_package(package), name)


def _package(package: str) -> ModuleType:
    # Plain imports, not imports by string: the layering check (scripts/check_layers.py)
    # sees them.
    if package == "tune":
        from flashtune import tune

        return tune
    if package == "capture":
        from flashtune import capture

        return capture
    if package == "apply":
        from flashtune import apply

        return apply
    if package == "sampling":
        from flashtune.ops import sampling

        return sampling
    from flashtune import data

    return data


# FLASHTUNE_CAPTURE=1 / FLASHTUNE_APPLY=1 must work in a program that never imports capture or
# apply: the root (imported before any op) tells schema's hooks how to load them.
def _load_capture() -> None:
    import flashtune.capture  # noqa: F401  (importing it registers its env hook)


def _load_apply() -> None:
    import flashtune.apply  # noqa: F401  (importing it registers its env hook)


switches.register(env.CAPTURE.get, _load_capture)
switches.register(env.APPLY.get, _load_apply)

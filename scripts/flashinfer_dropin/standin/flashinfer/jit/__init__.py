"""`flashinfer.jit`: FlashInfer's tests pre-build CUDA modules in a warm-up fixture; flashtune
has nothing to pre-build (Triton compiles each kernel variant on first call). The module
generators the tests import (`flashinfer.jit.attention.gen_*_module`) are in attention.py."""

from typing import Any

from . import attention  # noqa: F401  (flashinfer.jit.attention, as FlashInfer's package)


def build_jit_specs(specs: Any, verbose: bool = False, skip_prebuilt: bool = True) -> None:
    return None

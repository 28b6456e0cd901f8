"""`flashinfer.jit`: FlashInfer's tests pre-build CUDA modules in a warm-up fixture; flashtune
has nothing to pre-build (Triton compiles each kernel variant on first call)."""

from typing import Any


def build_jit_specs(specs: Any, verbose: bool = False, skip_prebuilt: bool = True) -> None:
    return None

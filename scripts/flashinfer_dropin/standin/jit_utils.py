"""Stand-in for FlashInfer's tests/jit_utils.py (not in the sdist): the functions that list
CUDA modules to pre-build. flashtune pre-builds nothing, so every list is empty."""

from typing import Any


def gen_decode_attention_modules(*args: Any, **kwargs: Any) -> list[Any]:
    return []


def gen_prefill_attention_modules(*args: Any, **kwargs: Any) -> list[Any]:
    return []


def gen_persistent_batch_attention_modules(*args: Any, **kwargs: Any) -> list[Any]:
    return []


def gen_pod_module(*args: Any, **kwargs: Any) -> list[Any]:
    return []

"""Stand-in for FlashInfer's tests/conftest.py, which the sdist lacks: test files import its
helpers as a module (test_deepseek_mla.py: `from conftest import clear_cuda_cache`). Only
the helpers live here: the real file's pytest hooks (torch.compile monkeypatching under
FLASHINFER_TEST_TORCH_COMPILE=1, OOM errors turned into skips) are not loaded, since this
folder is on sys.path, not under the tests' root."""

from __future__ import annotations

import functools
import gc
import os

import torch


@functools.cache
def get_device_properties(device: torch.device) -> object:
    return torch.cuda.get_device_properties(device)


def clear_cuda_cache(device: torch.device) -> None:
    """Free PyTorch's cached blocks when it holds more than FLASHINFER_TEST_MEMORY_THRESHOLD
    (0.9) of the device's memory, as FlashInfer's conftest; nothing to do off CUDA."""
    if torch.device(device).type != "cuda":
        return
    total_memory = get_device_properties(device).total_memory  # type: ignore[attr-defined]
    threshold = float(os.environ.get("FLASHINFER_TEST_MEMORY_THRESHOLD", "0.9"))
    if torch.cuda.memory_reserved() > threshold * total_memory:
        gc.collect()
        torch.cuda.empty_cache()

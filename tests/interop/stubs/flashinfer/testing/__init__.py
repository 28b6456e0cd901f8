"""FlashInfer's CUPTI-based GPU timer, which needs a GPU: calling it here is an error."""

from typing import Any


def bench_gpu_time_with_cupti(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("flashinfer.testing is a CPU stand-in (tests/interop/stubs): no GPU timing")

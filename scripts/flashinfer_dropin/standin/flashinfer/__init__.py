"""Stand-in `flashinfer` package: FlashInfer's names served by flashtune, so that FlashInfer's
own test files run unchanged against flashtune (scripts/flashinfer_dropin/run.py puts the
folder holding this package first on sys.path).

Submodules with FlashInfer's names are files here (decode.py, norm.py, ...), each re-exporting
flashtune's module of that name; jit/ and utils.py hold the few helpers FlashInfer's tests
call that are not kernels (JIT warm-up, compute capability); testing/ holds the fp8 block
quantization helpers of the GEMM tests. MLA's append
(`append_paged_mla_kv_cache`, top level and flashinfer.page) comes from flashtune.ops.mla.
"""

import importlib

from flashtune import *  # noqa: F403  (FlashInfer's top-level names; flashtune.__all__ is computed)
from flashtune import __version__ as flashtune_version
from flashtune.ops.mla import append_paged_mla_kv_cache  # noqa: F401  (flashinfer.page's)

# This package's own submodules, not flashtune's that the star import bound to these names
# (`from . import x` would keep those: it imports nothing when the attribute exists).
_SUBMODULES = (
    "activation",
    "cascade",
    "decode",
    "gemm",
    "jit",
    "mla",
    "norm",
    "page",
    "prefill",
    "rope",
    "sparse",
)
for _name in (*_SUBMODULES, "sampling", "testing", "utils"):
    globals()[_name] = importlib.import_module(f"{__name__}.{_name}")

__version__ = f"0.2.14+flashtune.{flashtune_version}"

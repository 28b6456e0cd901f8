"""Gluon's Hopper API, imported in one place (`HAVE_GLUON` is False where the installed
Triton lacks it, and the kernels built on it are then not offered), and compile reports for
Gluon kernels without a GPU: Triton's bundled ptxas over the PTX.

A kernel's tests compile it for sm_90a on the CPU and read ptxas's report: spills, and C7511
("wgmma.mma_async instructions are serialized due to insufficient register resources"),
which ptxas reports without a spill and which costs a warp-specialized kernel 17-30%
(docs/attention.md, the chained items).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

try:  # Gluon ships with Triton >= 3.5.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAVE_GLUON = True

    @gluon.constexpr_function
    def coalesced_rows_layout(width: Any) -> Any:
        """A [rows, width] register layout for storing a 16-bit tile to global memory: 8
        contiguous elements (16 bytes) a thread, a warp across whole rows, 4 warps (one
        warpgroup) down the rows. width: a power of two from 8 to 256."""
        width = gl._unwrap_if_constexpr(width)
        per_row = width // 8  # threads across a row
        return gl.BlockedLayout([1, 8], [32 // per_row, per_row], [4, 1], [1, 0])

except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False
    # Names the kernel modules import; unused there unless HAVE_GLUON.
    gluon = gl = mbarrier = tma = TensorDescriptor = None
    fence_async_shared = warpgroup_mma = warpgroup_mma_wait = coalesced_rows_layout = None

__all__ = [
    "HAVE_GLUON",
    "TensorDescriptor",
    "coalesced_rows_layout",
    "compile_in_subprocess",
    "compile_sm90",
    "fence_async_shared",
    "gl",
    "gluon",
    "mbarrier",
    "ptxas_report",
    "tma",
    "warpgroup_mma",
    "warpgroup_mma_wait",
]


def ptxas_report(ptx: str, arch: str = "sm_90a") -> dict[str, Any]:
    """{"ptxas": ptxas -v's report, "rc": its exit status, "wgmma": wgmma count in the PTX}."""
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        rep = subprocess.run(
            [ptxas, "-v", f"--gpu-name={arch}", path, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
            timeout=300,
        )
    return {"wgmma": ptx.count("wgmma.mma_async"), "ptxas": rep.stderr, "rc": rep.returncode}


def compile_sm90(kernel: Any, signature: dict[str, str], constexprs: dict[str, Any],
                 num_warps: int = 4) -> dict[str, Any]:  # fmt: skip
    """Compile a Gluon kernel for sm_90a and report: ptxas_report plus "shared" (bytes of
    shared memory the kernel asks for). Needs TRITON_INTERPRET unset at import (the
    interpreter replaces Gluon kernels with its own functions)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = dict(signature)
    sig.update(dict.fromkeys(constexprs, "constexpr"))
    src = GluonASTSource(kernel, sig, constexprs=constexprs)
    kern = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    report = ptxas_report(kern.asm["ptx"])
    report["shared"] = int(kern.metadata.shared)
    return report


def compile_in_subprocess(expression: str, timeout: float = 600) -> list[dict[str, Any]]:
    """Evaluate `expression` (Python printing nothing, returning a JSON-able list of
    reports) in a fresh interpreter with TRITON_INTERPRET unset, as the compile tests need
    (the interpreter, once imported, replaces Gluon kernels with its own functions)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = f"import json; print(json.dumps({expression}))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
    )
    if proc.returncode != 0:
        raise RuntimeError(f"compile failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])

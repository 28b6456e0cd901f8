"""Compile flashtune's paged decode kernel for sm_90 on a machine without a GPU and count its
SASS instructions by class: what a change to the kernel costs, before any GPU time is spent.

    env -u TRITON_INTERPRET python scripts/sass_decode.py --kv-dtype float8_e4m3fn
    env -u TRITON_INTERPRET python scripts/sass_decode.py --block-n 128 --warps 8 --stages 2

The decode wrapper is planned and run on CPU tensors as usual; the kernel's launch is
replaced by Triton's own binding of the arguments (the specialization a GPU launch would
compile) and a compile for sm_90 with Triton's bundled ptxas, then nvdisasm. Nothing runs.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime import jit

from flashtune import platform
from flashtune.ops.attention import BatchDecodeWithPagedKVCacheWrapper, decode_kernels
from flashtune.ops.attention.decode_config import DecodeLaunch, DecodeTactic
from flashtune.ops.attention.page import build_page_table

TARGET = GPUTarget("cuda", 90, 32)
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")


def sass_of_launch(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The SASS a GPU launch of `kernel` with these arguments would compile (sm_90)."""
    backend = make_backend(TARGET)
    binder = jit.create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, options)
    compiled = triton.compile(
        ASTSource(kernel, signature, constexprs, attrs), target=TARGET, options=options.__dict__
    )
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--q-dtype", default="bfloat16")
    ap.add_argument("--kv-dtype", default=None, help="e.g. float8_e4m3fn (default: q's)")
    ap.add_argument("--heads", default="32,8,128", help="query heads, KV heads, head_dim")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--block-n", type=int, help="a tactic instead of the default")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--rope", action="store_true", help="pos_encoding_mode=ROPE_LLAMA")
    ap.add_argument("--match", default="", help="only instruction names starting with this")
    opts = ap.parse_args()
    if platform.triton_interpret():
        raise SystemExit("unset TRITON_INTERPRET: the interpreter compiles nothing")
    platform.kernels_available = lambda device: True  # CPU tensors: only the launch is bound
    q_dtype = getattr(torch, opts.q_dtype)
    kv_dtype = getattr(torch, opts.kv_dtype) if opts.kv_dtype else q_dtype
    hq, hk, d = (int(x) for x in opts.heads.split(","))
    launch = None
    if opts.block_n:
        launch = DecodeLaunch(tactic=DecodeTactic(opts.block_n, opts.warps, opts.stages))
    sass: list[str] = []
    kernel = decode_kernels.paged_attn_kernel

    def capture(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        sass.append(sass_of_launch(kernel, args, kwargs))

    kernel.run = capture  # type: ignore[method-assign]
    indptr, indices, last, pages = build_page_table([4096] * 16, opts.page_size)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8), "NHD")
    wrapper.plan(
        indptr, indices, last, hq, hk, d, opts.page_size,
        q_data_type=q_dtype, kv_data_type=kv_dtype, launch=launch,
        pos_encoding_mode="ROPE_LLAMA" if opts.rope else "NONE",
    )  # fmt: skip
    q = torch.randn(16, hq, d).to(q_dtype)
    cache = torch.randn(pages, 2, opts.page_size, hk, d).to(kv_dtype)
    try:
        wrapper.run(q, cache)
    except Exception:  # past the launch nothing ran: outputs are not there to merge
        pass
    if not sass:
        raise SystemExit("the decode kernel was not launched")
    counts = collections.Counter(INSTRUCTION.findall(sass[0]))
    print(f"{sum(counts.values())} SASS instructions (sm_90); by class:")
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        if name.startswith(opts.match):
            print(f"  {n:6d}  {name}")


if __name__ == "__main__":
    main()

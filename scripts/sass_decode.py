"""Compile flashtune's paged decode kernel for sm_90 on a machine without a GPU and count its
SASS instructions by class: what a change to the kernel costs, before any GPU time is spent.

    env -u TRITON_INTERPRET python scripts/sass_decode.py --kv-dtype float8_e4m3fn
    env -u TRITON_INTERPRET python scripts/sass_decode.py --block-n 128 --warps 8 --stages 2
    env -u TRITON_INTERPRET python scripts/sass_decode.py --mla 32,8,3,0,2   # MLA prefill tile

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
from collections.abc import Callable
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime import jit

from flashtune import platform
from flashtune.ops.attention import BatchDecodeWithPagedKVCacheWrapper
from flashtune.ops.attention.decode import kernels as decode_kernels
from flashtune.ops.attention.decode.config import DecodeLaunch, DecodeTactic
from flashtune.ops.attention.page import build_page_table

TARGET = GPUTarget("cuda", 90, 32)
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")
RESOURCE = re.compile(r"\b(?:REG|STACK|SHARED|LOCAL):\d+")
# (nvdisasm writes an instruction's address in at least four hex digits: more past 64 KiB of code)
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")


def sass_of_launch(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The SASS a GPU launch of `kernel` with these arguments would compile (sm_90), after
    a line with its resources (registers, stack, local memory, shared memory)."""
    backend = make_backend(TARGET)
    binder = jit.create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, options)
    compiled = triton.compile(
        ASTSource(kernel, signature, constexprs, attrs), target=TARGET, options=options.__dict__
    )
    tools = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [os.path.join(tools, "cuobjdump"), "--dump-resource-usage", f.name],
            capture_output=True,
            text=True,
        ).stdout
        # Triton's shared memory is dynamic: cuobjdump's SHARED counts the static part only.
        resources = " ".join(RESOURCE.findall(usage)) + f" DYN_SHARED:{compiled.metadata.shared}"
        sass = subprocess.run(
            [os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True, text=True
        ).stdout
        return f"resources: {resources}\n{sass}"


def kv_loop_body(sass: str) -> str:
    """The SASS of the smallest loop (a label up to a branch back to it) that holds an MMA:
    the steady state of the KV loop, once per block."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := LABEL.match(line))}
    loops = []
    for i, line in enumerate(lines):
        m = BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i:
            body = "\n".join(lines[labels[m.group(1)] : i + 1])
            if "MMA" in body:
                loops.append(body)
    if not loops:
        raise SystemExit("no loop with an MMA found")
    return min(loops, key=len)


def first_launch_sass(kernel: Any, call: Callable[[], Any], **options: Any) -> str:
    """The resources line and SASS of the first launch of `kernel` that `call()` makes, as
    that launch binds its arguments, compiled for sm_90 (options: more compile options, e.g.
    maxnreg). Nothing runs: CPU tensors pass the kernels' device check, and the call stops
    at that launch."""
    if platform.triton_interpret():
        raise SystemExit("unset TRITON_INTERPRET: the interpreter compiles nothing")
    platform.kernels_available = lambda device: True  # CPU tensors: only the launch is bound
    sass: list[str] = []
    failed: list[Exception] = []

    def capture(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        try:
            sass.append(sass_of_launch(kernel, args, {**kwargs, **options}))
        except Exception as exc:  # a compile error: raised below, whatever call() catches
            failed.append(exc)
            raise
        raise _Captured

    kernel.run = capture
    try:
        call()
    except _Captured:
        pass
    except Exception:  # past the launch nothing ran: the call may fail on its outputs
        if not (sass or failed):
            raise
    finally:
        del kernel.run  # the class's own run again
    if failed:
        raise failed[0]
    if not sass:
        raise SystemExit(f"{kernel.fn.__name__} was not launched")
    return sass[0]


class _Captured(Exception):
    """Raised by a captured launch: nothing after it needs to run."""


def decode_sass(
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    heads: tuple[int, int, int],
    page_size: int,
    tactic: DecodeTactic | None = None,
    rope: bool = False,
    maxnreg: int | None = None,
) -> str:
    """The resources line and SASS of the decode kernel as a 16 x 4096-token batch of these
    heads (query heads, KV heads, head_dim) would launch it; tactic None: the default."""
    hq, hk, d = heads
    launch = None if tactic is None else DecodeLaunch(tactic=tactic)
    indptr, indices, last, pages = build_page_table([4096] * 16, page_size)
    ws = torch.empty(64 << 20, dtype=torch.uint8)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    wrapper.plan(
        indptr, indices, last, hq, hk, d, page_size,
        q_data_type=q_dtype, kv_data_type=kv_dtype, launch=launch,
        pos_encoding_mode="ROPE_LLAMA" if rope else "NONE",
    )  # fmt: skip
    q = torch.randn(16, hq, d).to(q_dtype)
    cache = torch.randn(pages, 2, page_size, hk, d).to(kv_dtype)
    options = {"maxnreg": maxnreg} if maxnreg else {}
    return first_launch_sass(
        decode_kernels.paged_attn_kernel, lambda: wrapper.run(q, cache), **options
    )


# Query tokens of the two requests `mla_sass` plans, by rows per program (16 heads): decode,
# MTP, and a causal prefill of 64-row tiles.
MLA_QUERIES = {16: [1, 1], 32: [2, 2], 64: [256, 256]}


def mla_sass(tactic: Any, block_m: int = 64, kv_dtype: torch.dtype = torch.bfloat16) -> str:
    """The resources line and SASS of the MLA kernel as a planned causal call launches it
    with `block_m` rows a program (16 heads, 512 + 64 dims, bf16 queries, a `kv_dtype`
    cache, page 64; two requests over 2048 and 1024 keys, `MLA_QUERIES[block_m]` queries
    each), with `tactic` (an MLATactic)."""
    from flashtune.ops.mla import BatchMLAPagedAttentionWrapper, MLALaunch
    from flashtune.ops.mla import kernels as mla_kernels

    heads, page, qo, kv = 16, 64, MLA_QUERIES[block_m], [2048, 1024]
    pages = [-(-n // page) for n in kv]
    kv_indptr = torch.tensor([0, pages[0], sum(pages)], dtype=torch.int32)
    qo_indptr = torch.tensor([0, qo[0], sum(qo)], dtype=torch.int32)
    wrapper = BatchMLAPagedAttentionWrapper(torch.empty(1 << 24, dtype=torch.uint8))
    wrapper.plan(
        qo_indptr, kv_indptr, torch.arange(sum(pages), dtype=torch.int32),
        torch.tensor(kv, dtype=torch.int32), heads, 512, 64, page, True, 0.07,
        torch.bfloat16, kv_dtype, launch=MLALaunch(tactic=tactic, block_m=block_m),
    )  # fmt: skip
    inputs = (
        torch.randn(sum(qo), heads, 512, dtype=torch.bfloat16),
        torch.randn(sum(qo), heads, 64, dtype=torch.bfloat16),
        torch.randn(sum(pages), page, 512).to(kv_dtype),
        torch.randn(sum(pages), page, 64).to(kv_dtype),
    )
    return first_launch_sass(mla_kernels.mla_paged_kernel, lambda: wrapper.run(*inputs))


def dynamic_shared(sass: str) -> int:
    """Bytes of dynamic shared memory a program takes, from the resources line."""
    m = re.search(r"DYN_SHARED:(\d+)", sass.splitlines()[0])
    if m is None:
        raise ValueError("no DYN_SHARED in the resources line")
    return int(m.group(1))


def registers(sass: str) -> int:
    """Registers a thread, from `decode_sass`'s resources line."""
    m = re.search(r"REG:(\d+)", sass.splitlines()[0])
    if m is None:
        raise ValueError("no REG in the resources line")
    return int(m.group(1))


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
    ap.add_argument("--maxnreg", type=int, help="cap the registers a thread (ptxas)")
    ap.add_argument("--loop", action="store_true", help="count the KV loop's body only")
    ap.add_argument("--dump", help="write the whole SASS to this file")
    ap.add_argument(
        "--mla",
        metavar="BN,WARPS,STAGES,RELOAD_Q,DV_SPLIT[,FUSED_MERGE[,P_SCRATCH]]",
        help="the MLA kernel as a causal call launches it, with this MLATactic",
    )
    ap.add_argument(
        "--mla-rows", type=int, default=64, choices=sorted(MLA_QUERIES),
        help="--mla: rows a program (16 decode, 32 MTP, 64 prefill)",
    )  # fmt: skip
    opts = ap.parse_args()
    q_dtype = getattr(torch, opts.q_dtype)
    kv_dtype = getattr(torch, opts.kv_dtype) if opts.kv_dtype else q_dtype
    hq, hk, d = (int(x) for x in opts.heads.split(","))
    tactic = DecodeTactic(opts.block_n, opts.warps, opts.stages) if opts.block_n else None
    if opts.mla:
        from flashtune.ops.mla import MLATactic

        bn, warps, stages, reload_q, dv, *flags = (int(x) for x in opts.mla.split(","))
        fused, p_scratch = (bool(f) for f in [*flags, 0, 0][:2])
        tactic = MLATactic(bn, warps, stages, bool(reload_q), dv, fused, p_scratch)
        sass = mla_sass(tactic, opts.mla_rows, kv_dtype)
    else:
        sass = decode_sass(
            q_dtype, kv_dtype, (hq, hk, d), opts.page_size, tactic, opts.rope, opts.maxnreg
        )
    print(sass.splitlines()[0])
    if opts.dump:
        with open(opts.dump, "w") as f:
            f.write(sass)
    code = kv_loop_body(sass) if opts.loop else sass
    counts = collections.Counter(INSTRUCTION.findall(code))
    where = "in the KV loop's body" if opts.loop else "(sm_90)"
    print(f"{sum(counts.values())} SASS instructions {where}; by class:")
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        if name.startswith(opts.match):
            print(f"  {n:6d}  {name}")


if __name__ == "__main__":
    main()

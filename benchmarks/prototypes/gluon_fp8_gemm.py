"""Prototype (session 24, not in the library): a warp-specialized, persistent fp8 GEMM for
Hopper in Gluon, the route docs/gemm-fp8.md names for the per-tensor gap to cuBLAS.

C[M, N] = (A[M, K] @ B[N, K]^T) * a_scale * b_scale in bf16, e4m3 operands, K-major both.
One producer warp issues TMA loads into a ring of NUM_STAGES shared-memory stages
(mbarriers: `ready` when a stage's bytes landed, `empty` when its MMA is done); the default
partition (num_warps warps) runs the wgmma chain and the epilogue. Programs are persistent
(one per SM at most) and walk the output tiles in grouped order, both partitions the same
sequence.

Written without a GPU: `--aot` compiles it for sm_90a here (no device needed); on an H100
or H200 the default mode checks it against torch._scaled_mm and times both, CUDA-graph
timed, on the bench_gemm_fp8 shapes. Triton's automatic warp specialization does not apply
on sm_90 in Triton 3.6 (docs/gemm-fp8.md), hence Gluon.

    python benchmarks/prototypes/gluon_fp8_gemm.py --aot
    python benchmarks/prototypes/gluon_fp8_gemm.py            # GPU: check and time
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """(pid_m, pid_n) of a tile index in grouped order (GROUP_M row tiles share B in L2)."""
    in_group = GROUP_M * num_pid_n
    first_m = (tile // in_group) * GROUP_M
    size_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % in_group) % size_m, (tile % in_group) // size_m


@gluon.jit
def _producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M: gl.constexpr):
    """One warp: TMA loads of every (tile, K step) this program owns, into the stage ring."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_bufs.shape[0]
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    step = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        for k in range(0, K, BLOCK_K):
            s = step % STAGES
            # A stage starts empty: the first wait on each passes (phase 1 is complete).
            mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(
                a_desc, [pid_m * BLOCK_M, k], ready.index(s), a_bufs.index(s)
            )
            tma.async_copy_global_to_shared(
                b_desc, [pid_n * BLOCK_N, k], ready.index(s), b_bufs.index(s)
            )
            step += 1


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, empty, c_ptr, scale_ptr, M, N, K, stride_cm,
              GROUP_M: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              BLOCK_K: gl.constexpr, INSTR_N: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """The default partition: wgmma over the stages as they land, then the scaled epilogue."""
    STAGES: gl.constexpr = a_bufs.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, INSTR_N, 32]
    )
    scale = gl.load(scale_ptr) * gl.load(scale_ptr + 1)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    step = 0
    prev = 0  # the stage of the previous K step's MMA
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
        for kk in range(0, gl.cdiv(K, BLOCK_K)):
            s = step % STAGES
            mbarrier.wait(ready.index(s), (step // STAGES) & 1)
            # B's tile is [BLOCK_N, BLOCK_K] (K-major): its transposed view is the K x N
            # operand fp8 wgmma reads.
            acc = warpgroup_mma(
                a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True
            )
            # One MMA stays in flight: once at most one is outstanding, the previous step's
            # is done and its stage goes back to the producer.
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(empty.index(prev), count=1, pred=kk > 0)
            prev = s
            step += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(prev), count=1)
        offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        gl.store(ptrs, (acc * scale).to(gl.bfloat16), mask=mask)


@gluon.jit
def fp8_gemm_ws_kernel(a_desc, b_desc, c_ptr, scale_ptr, M, N, K, stride_cm,
                       GROUP_M: gl.constexpr, NUM_STAGES: gl.constexpr, INSTR_N: gl.constexpr,
                       num_warps: gl.constexpr):  # fmt: skip
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    a_bufs = gl.allocate_shared_memory(
        a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout
    )
    b_bufs = gl.allocate_shared_memory(
        b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape, b_desc.layout
    )
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize(
        [
            (
                _consumer,
                (
                    a_bufs,
                    b_bufs,
                    ready,
                    empty,
                    c_ptr,
                    scale_ptr,
                    M,
                    N,
                    K,
                    stride_cm,
                    GROUP_M,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                    INSTR_N,
                    num_warps,
                ),
            ),  # fmt: skip
            (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M)),
        ],
        [1],
        [24],
    )


def _layout(block: list[int]) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for(block, gl.float8e4nv)


def descriptors(a: torch.Tensor, b: torch.Tensor, bm: int, bn: int, bk: int):
    """TMA descriptors of A [M, K] and B [N, K] (K contiguous, 16-byte rows)."""
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk], _layout([bm, bk]))
    b_desc = TensorDescriptor.from_tensor(b, [bn, bk], _layout([bn, bk]))
    return a_desc, b_desc


# (block_m, block_n, block_k, stages, group_m, warps) the GPU mode tries.
CONFIGS = ((128, 256, 128, 4, 8, 8), (128, 128, 128, 4, 8, 4), (128, 128, 128, 5, 8, 8))


def fp8_gemm_ws(a, b, scales, out, bm=128, bn=256, bk=128, stages=4, group_m=8, warps=8):
    """out[M, N] (bf16) = a @ b.T * scales[0] * scales[1]; a [M, K], b [N, K] e4m3."""
    M, K = a.shape
    N = b.shape[0]
    a_desc, b_desc = descriptors(a, b, bm, bn, bk)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    grid = (min(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count),)
    fp8_gemm_ws_kernel[grid](
        a_desc, b_desc, out, scales, M, N, K, out.stride(0),
        GROUP_M=group_m, NUM_STAGES=stages, INSTR_N=min(bn, 256), num_warps=warps,
    )  # fmt: skip
    return out


def aot(bm=128, bn=256, bk=128, stages=4, warps=8) -> str:
    """Compile for sm_90a without a GPU; returns the PTX's size and the kernel's warps."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    a = torch.empty(256, 512, dtype=torch.float8_e4m3fn)
    b = torch.empty(512, 512, dtype=torch.float8_e4m3fn)
    a_desc, b_desc = descriptors(a, b, bm, bn, bk)
    sig = {
        "a_desc": mangle_type(a_desc),
        "b_desc": mangle_type(b_desc),
        "c_ptr": "*bf16",
        "scale_ptr": "*fp32",
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "stride_cm": "i32",
        "GROUP_M": "constexpr",
        "NUM_STAGES": "constexpr",
        "INSTR_N": "constexpr",
        "num_warps": "constexpr",
    }
    consts = {"GROUP_M": 8, "NUM_STAGES": stages, "INSTR_N": min(bn, 256), "num_warps": warps}
    src = GluonASTSource(fp8_gemm_ws_kernel, sig, constexprs=consts)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    return f"sm_90a PTX {len(k.asm['ptx'])} chars, wgmma in PTX: {'wgmma' in k.asm['ptx']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aot", action="store_true", help="compile for sm_90a only (no GPU)")
    args = ap.parse_args()
    if args.aot:
        for bm, bn, stages, warps in ((128, 256, 4, 8), (128, 128, 4, 4), (128, 128, 5, 8)):
            print(f"{bm}x{bn} stages {stages} warps {warps}: {aot(bm, bn, 128, stages, warps)}")
        return
    if not torch.cuda.is_available():
        sys.exit("needs a GPU (or --aot)")
    sys.path.insert(0, "benchmarks")
    from bench_gemm_fp8 import NK

    from flashtune.ops.gemm.fp8 import launch as L
    from flashtune.timing import measure

    for N, K in NK:
        for M in (128, 4096):
            a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
            b = (torch.randn(N, K, device="cuda") / 4).to(torch.float8_e4m3fn)
            scales = torch.rand(2, device="cuda") + 0.5
            # cuBLASLt wants each scale's address 16-byte aligned: its own tensors.
            sa, sb = scales[0].clone(), scales[1].clone()
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)

            def cublas(a, b, scales, out, sa=sa, sb=sb):
                return torch._scaled_mm(a, b.T, scale_a=sa, scale_b=sb,
                                        out_dtype=torch.bfloat16)  # fmt: skip

            def default(a, b, scales, out, sa=sa, sb=sb):  # flashtune's Triton default tile
                inputs = L.Fp8Inputs(a[None], b[None], sa[None], sb[None], torch.bfloat16,
                                     mode="tensor", out=out[None])  # fmt: skip
                return L.TritonFp8Runner().forward(inputs, -1)

            want = cublas(a, b, scales, out).float()
            ft_ms = measure(default, [a, b, scales, out], cold_l2=True, use_cuda_graph=True)
            for cfg in CONFIGS:

                def ours(a, b, scales, out, cfg=cfg):
                    return fp8_gemm_ws(a, b, scales, out, *cfg)

                try:
                    got = ours(a, b, scales, out).float()
                    err = ((got - want).norm() / want.norm()).item()
                    ms = measure(
                        ours, [a, b, scales, out], cold_l2=True, use_cuda_graph=True
                    ).median_ms
                except Exception as exc:  # a prototype: say what failed, go on
                    print(f"M={M} N={N} K={K} {cfg}: {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                ref_ms = measure(
                    cublas, [a, b, scales, out], cold_l2=True, use_cuda_graph=True
                ).median_ms
                print(f"M={M:5d} N={N:5d} K={K:5d} {cfg} err {err:.1e}  ws {ms * 1e3:8.1f} us"
                      f"  cublas {ref_ms * 1e3:8.1f} us  triton default {ft_ms.median_ms * 1e3:8.1f} us"
                      f"  ratio {ref_ms / ms:.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()

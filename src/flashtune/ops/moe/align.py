"""Token alignment for the grouped GEMMs: the (token, k) routes sorted by local expert.

The expert kernels run over M-blocks of BLOCK_M rows, each block holding the routes of one
expert, so that a program loads one expert's weight tile and multiplies it by up to
BLOCK_M token rows. `align_routes` builds, from topk_ids [T, K] (GLOBAL expert ids):

- sorted_ids [P] int32: the flat route index t*K + k of each row, routes grouped by local
  expert (stable: ascending route index within an expert), each expert's group padded to a
  multiple of BLOCK_M with the sentinel T*K (rows the kernels mask);
- block_expert [P / BLOCK_M] int32: the local expert of each M-block, -1 for the blocks
  past the last expert's (the kernels' programs for those return at once);
- route_pos [T*K] int32: the row of each route in sorted order, -1 for a route whose expert
  is not local (the combine reads each token's K rows through it);
- used_blocks [1] int32: how many M-blocks hold routes, on the device: the GEMM kernels'
  persistent programs loop over exactly those blocks' tiles.

P is a bound known on the host without reading the ids, so nothing syncs with the device
and the launch can be captured in a CUDA graph: sum over non-empty experts of
ceil(n_e / BLOCK_M) <= (T*K + min(E, T*K) * (BLOCK_M - 1)) / BLOCK_M. At decode (T=1,
K=8, BLOCK_M=16) that is 8 blocks, whatever E is. Empty experts cost nothing: they own no
block, so no program computes for them and none of their weights are read.

Routes to non-local experts (expert parallelism) are dropped here, which is where the
"others contribute nothing" of the contract is kept.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from flashtune import platform
from flashtune.ops.moe.kernels import (
    _moe_align_count_kernel,
    _moe_align_kernel,
    _moe_align_scatter_kernel,
)
from flashtune.ops.pdl import launch_options

__all__ = ["Alignment", "max_blocks", "align_routes", "ONE_PROGRAM_MAX_ROUTES", "CHUNK_ROUTES"]

# Up to this many routes (T * K) one Triton program aligns them (one launch: decode's few
# microseconds). The program walks the routes twice in steps of 4096 / NBINS (a one-hot
# [step, experts] in registers), so its time grows with the routes and the expert count.
ONE_PROGRAM_MAX_ROUTES = 1024
# Beyond, two launches of a program per CHUNK_ROUTES routes (count, then place). They
# replaced about 35 PyTorch kernels (a radix sort, scans, scatters) that took ~150 us at
# DeepSeek-V3 EP8 T=4096 (32768 routes; H200, torch.profiler), 10% of the call.
CHUNK_ROUTES = 1024
# The one-hot's cells per step: registers, not shared memory, at 8 warps.
_ONE_HOT_CELLS = 4096


class Alignment(NamedTuple):
    sorted_ids: torch.Tensor  # [num_blocks * block_m] int32
    block_expert: torch.Tensor  # [num_blocks] int32
    route_pos: torch.Tensor  # [T * K] int32
    used_blocks: torch.Tensor  # [1] int32: the M-blocks that hold routes (the rest: -1)
    block_m: int
    num_blocks: int  # an upper bound of used_blocks, known on the host


def max_blocks(num_routes: int, num_local_experts: int, block_m: int) -> int:
    """The most M-blocks `num_routes` routes over `num_local_experts` experts can need."""
    busy = min(num_local_experts, num_routes)
    return max(1, (num_routes + busy * (block_m - 1)) // block_m)


def align_routes(
    topk_ids: torch.Tensor,
    num_local_experts: int,
    local_expert_offset: int,
    block_m: int,
    *,
    use_kernel: bool | None = None,
    chunk_routes: int | None = None,
    pdl: bool = False,
) -> Alignment:
    """Sort the routes of topk_ids [T, K] by local expert into BLOCK_M-padded groups (see
    the module docstring). use_kernel: the Triton kernels (None: where Triton runs) or the
    PyTorch ops; all give the same tensors, and none syncs with the host. The kernels are
    one program up to ONE_PROGRAM_MAX_ROUTES routes, else a program per `chunk_routes`
    (None: CHUNK_ROUTES; a value forces the chunked launches, for tests). pdl: the kernels
    launch with programmatic dependent launch (ops/pdl.py; the caller decides)."""
    if use_kernel is None:
        use_kernel = platform.kernels_available(topk_ids.device)
    if not use_kernel:
        return _align_torch(topk_ids, num_local_experts, local_expert_offset, block_m)
    if chunk_routes is None and topk_ids.numel() <= ONE_PROGRAM_MAX_ROUTES:
        return _align_kernel(topk_ids, num_local_experts, local_expert_offset, block_m, pdl)
    chunk = chunk_routes or CHUNK_ROUTES
    return _align_chunked(topk_ids, num_local_experts, local_expert_offset, block_m, chunk, pdl)


def _kernel_operands(
    topk_ids: torch.Tensor, num_local_experts: int, block_m: int
) -> tuple[torch.Tensor, int, int, Alignment]:
    """What both kernel paths start from: the ids as flat int32, the one-hot's bins (a power
    of two >= the experts), the routes a step of the one-hot takes (bins x routes within
    _ONE_HOT_CELLS) and the Alignment's tensors, allocated for the kernels to fill."""
    device = topk_ids.device
    num_routes = topk_ids.numel()
    nb = max_blocks(num_routes, num_local_experts, block_m)
    ids = topk_ids.reshape(-1)
    if ids.dtype != torch.int32:
        ids = ids.to(torch.int32)
    nbins = 1 << max(0, (num_local_experts - 1).bit_length())
    out = Alignment(
        torch.empty(nb * block_m, dtype=torch.int32, device=device),
        torch.empty(nb, dtype=torch.int32, device=device),
        torch.empty(num_routes, dtype=torch.int32, device=device),
        torch.empty(1, dtype=torch.int32, device=device),
        block_m,
        nb,
    )
    step = max(16, min(1024, _ONE_HOT_CELLS // nbins))
    return ids, nbins, step, out


def _align_kernel(
    topk_ids: torch.Tensor,
    num_local_experts: int,
    local_expert_offset: int,
    block_m: int,
    pdl: bool,
) -> Alignment:
    ids, nbins, step, al = _kernel_operands(topk_ids, num_local_experts, block_m)
    _moe_align_kernel[(1,)](
        ids,
        al.sorted_ids,
        al.block_expert,
        al.route_pos,
        al.used_blocks,
        ids.numel(),
        num_local_experts,
        int(local_expert_offset),
        al.num_blocks * block_m,
        al.num_blocks,
        BLOCK_M=block_m,
        NBINS=nbins,
        BLOCK=step,
        USE_PDL=pdl,
        num_warps=8,
        **launch_options(pdl),
    )
    return al


def _align_chunked(
    topk_ids: torch.Tensor,
    num_local_experts: int,
    local_expert_offset: int,
    block_m: int,
    chunk_routes: int,
    pdl: bool,
) -> Alignment:
    if chunk_routes < 1 or chunk_routes & (chunk_routes - 1):
        raise ValueError(f"chunk_routes must be a power of two, got {chunk_routes}")
    ids, nbins, step, al = _kernel_operands(topk_ids, num_local_experts, block_m)
    num_routes = ids.numel()
    chunks = max(1, -(-num_routes // chunk_routes))
    counts = torch.empty(chunks, nbins, dtype=torch.int32, device=ids.device)
    common = dict(
        CHUNK=chunk_routes,
        NBINS=nbins,
        BLOCK=min(step, chunk_routes),
        USE_PDL=pdl,
        num_warps=8,
        **launch_options(pdl),
    )
    offset = int(local_expert_offset)
    _moe_align_count_kernel[(chunks,)](ids, counts, num_routes, num_local_experts, offset, **common)
    _moe_align_scatter_kernel[(chunks,)](
        ids,
        counts,
        al.sorted_ids,
        al.block_expert,
        al.route_pos,
        al.used_blocks,
        num_routes,
        num_local_experts,
        offset,
        al.num_blocks,
        chunks,
        BLOCK_M=block_m,
        BLOCKS_STEP=max(1, min(_ONE_HOT_CELLS // nbins, _ONE_HOT_CELLS // block_m)),
        **common,
    )
    return al


def _align_torch(
    topk_ids: torch.Tensor, num_local_experts: int, local_expert_offset: int, block_m: int
) -> Alignment:
    device = topk_ids.device
    num_routes = topk_ids.numel()
    E = num_local_experts
    nb = max_blocks(num_routes, E, block_m)
    P = nb * block_m

    local = topk_ids.reshape(-1).to(torch.int64) - int(local_expert_offset)
    is_local = (local >= 0) & (local < E)
    key = torch.where(is_local, local, E)  # [TK]; E: not computed here
    counts = torch.zeros(E + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    padded = (counts + (block_m - 1)) // block_m * block_m
    # Dropped routes take no rows (zero_ on a view: assigning a Python scalar would copy
    # from the host, illegal inside CUDA graph capture).
    padded[E:].zero_()
    pad_end = torch.cumsum(padded, 0)  # [E+1]
    pad_start = pad_end - padded
    raw_start = torch.cumsum(counts, 0) - counts  # start of each expert in `order`

    order = torch.argsort(key, stable=True)  # route indices grouped by expert
    sorted_key = key[order]
    rank = torch.arange(num_routes, device=device) - raw_start[sorted_key]
    # Dropped routes all go to the spare slot P, cut off below.
    dest = torch.where(sorted_key < E, pad_start[sorted_key] + rank, P)

    sorted_ids = torch.full((P + 1,), num_routes, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    route_pos = torch.empty(num_routes, dtype=torch.int32, device=device)
    route_pos.scatter_(0, order, torch.where(sorted_key < E, dest, -1).to(torch.int32))

    # Block b belongs to the first expert whose padded rows end after b * block_m.
    starts = torch.arange(nb, device=device, dtype=torch.int64) * block_m
    owner = torch.searchsorted(pad_end[:E].contiguous(), starts, right=True)
    block_expert = torch.where(owner < E, owner, -1).to(torch.int32)
    used = (
        (pad_end[E - 1 : E] // block_m).to(torch.int32)
        if E
        else torch.zeros(1, dtype=torch.int32, device=device)
    )
    return Alignment(sorted_ids[:P], block_expert, route_pos, used, block_m, nb)

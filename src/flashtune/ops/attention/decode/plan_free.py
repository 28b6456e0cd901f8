"""Paged decode without a host-side plan: the split is scheduled on the device.

`BatchDecodeWithPagedKVCacheWrapper.plan` reads the page table on the CPU (one
device-to-host copy and a sync) and balances chunks with an LPT heap. That suits a serving
loop (one plan per step, reused by every layer), but a caller with only tensors in hand,
such as a Definition's function signature or a model step captured whole in a CUDA graph,
pays the sync and the Python scheduler on every call.

`paged_decode` needs no host copy. The chunk size is chosen on the host from shapes alone
(the page count bounds the total tokens); every program of the attention kernel then
derives its own work item from kv_indptr and kv_last_page_len: the chunk count of every
request (a prefix sum in registers), which request and chunk it owns, its KV range. The
grid is an upper bound (chunks of the longest possible split plus one per request); the
programs past the real chunk count exit at once. Requests split into several chunks write
partial (V, LSE) rows and are combined by the merge kernel of the planned path; the rest
write their output directly. So a call launches at most two kernels, never syncs, and can
be captured in a CUDA graph and replayed with new lengths as long as the shapes (batch,
page count) stay the same.

Load balance: chunks have equal length (the last of each request shorter), and the GPU's
block scheduler deals them to SMs as they free up, so a 32k request among short ones is
spread over many SMs, as with the planned path.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import triton
import triton.language as tl

from flashtune import env, platform
from flashtune.model_shapes import ModelConfig
from flashtune.ops.attention.decode.config import (
    DEFAULT_LAUNCH,
    DecodeLaunch,
    block_m_for,
    launch_shape,
    min_chunk,
    next_pow2,
    plan_sm_count,
)
from flashtune.ops.attention.decode.kernels import LOG2E, decode_item
from flashtune.ops.attention.decode.schema import (
    EXAMPLE_KV_LENS,
    EXAMPLE_PAGE_SIZE,
    GQA_PAGED_DECODE,
    PagedKV,
)
from flashtune.ops.attention.merge import merge_partials
from flashtune.ops.attention.page import (
    KV_LAYOUTS,
    build_page_table,
    split_kv_cache,
    validate_page_table,
)
from flashtune.ops.attention.reference import paged_attention_ref
from flashtune.ops.attention.variant import AttentionVariant
from flashtune.schema import REGISTRY, ApiOp
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = ["paged_decode", "paged_decode_examples"]

_TABLE_INPUTS = ("kv_indptr", "kv_indices", "kv_last_page_len", "sm_scale")

# The two widths of the in-kernel request search (see search_block).
_SEARCH_BLOCKS = (128, 1024)


def search_block(batch: int) -> int:
    """BLOCK_B of the in-kernel request search (decode and prefill): the requests scanned
    per step when a program looks for its work item. Two values only, so that batch sizes
    share compiled kernels: 128 up to 128 requests, else 1024 (one step up to 1024
    requests; more take a few steps of cheap L2 hits). A wider block costs registers in the
    search (8 lanes per thread at 1024), a narrower one more dependent steps per program."""
    narrow, wide = _SEARCH_BLOCKS
    return narrow if batch <= narrow else wide


# batch and chunk vary with every call: not specialized (Triton would compile a variant for
# values equal to 1 and for multiples of 16), they only bound loops and offsets.
@triton.jit(do_not_specialize=["batch", "chunk"])
def _plan_free_decode_kernel(
    q_ptr,  # [B, H_qo, D]
    k_ptr,  # [num_pages, page_size, H_kv, D] logical (strided)
    v_ptr,
    kv_indptr_ptr,  # [B + 1] int32
    kv_indices_ptr,  # [nnz_pages] int32
    last_ptr,  # [B] int32
    o_ptr,  # [B, H_qo, D]
    lse_ptr,  # [B, H_qo] fp32
    po_ptr,  # [num_programs, H_qo, D] fp32: partial row j belongs to program j
    plse_ptr,  # [num_programs, H_qo] fp32
    merge_info_ptr,  # [B, 3] int32: (first partial row, count or 0, stride 1)
    batch,
    chunk,  # KV tokens per chunk
    stride_qt,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    num_qo_heads,
    qk_scale,
    soft_cap,
    window_left,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    WINDOW: tl.constexpr,
):
    j = tl.program_id(0)
    kvh = tl.program_id(1)
    offs_b = tl.arange(0, BLOCK_B)
    # Find the request whose chunks cover program j: chunk counts of every request, prefix
    # summed; each quantity of the owner is picked out of the block with a masked sum.
    before = 0  # chunks of the requests of earlier steps
    req = -1
    c_first = 0  # the owner's first chunk (= its first partial row)
    n_req = 0
    kv_len = 0
    kv_lo = 0
    page_base = 0
    for b0 in range(0, batch, BLOCK_B):
        idx = b0 + offs_b
        ok = idx < batch
        p0 = tl.load(kv_indptr_ptr + idx, mask=ok, other=0)
        p1 = tl.load(kv_indptr_ptr + idx + 1, mask=ok, other=0)
        last = tl.load(last_ptr + idx, mask=ok, other=0)
        length = tl.where(p1 > p0, (p1 - p0 - 1) * PAGE_SIZE + last, 0)
        lo = tl.zeros_like(length)
        if WINDOW:
            # One query per request: the window only trims the KV range.
            lo = tl.maximum(length - 1 - window_left, 0)
        n = tl.where(ok, tl.maximum(tl.cdiv(length - lo, chunk), 1), 0)
        incl = tl.cumsum(n, 0) + before
        hit = ok & (incl - n <= j) & (j < incl)
        req += tl.sum(tl.where(hit, idx + 1, 0))
        c_first += tl.sum(tl.where(hit, incl - n, 0))
        n_req += tl.sum(tl.where(hit, n, 0))
        kv_len += tl.sum(tl.where(hit, length, 0))
        kv_lo += tl.sum(tl.where(hit, lo, 0))
        page_base += tl.sum(tl.where(hit, p0, 0))
        before += tl.sum(n)
    if req >= 0:
        c = j - c_first
        kv_start = kv_lo + c * chunk
        kv_end = tl.minimum(kv_start + chunk, kv_len)
        out_row = tl.where(n_req > 1, j, -1)
        if (kvh == 0) & (c == 0):
            info = merge_info_ptr + req * 3
            tl.store(info, c_first)
            tl.store(info + 1, tl.where(n_req > 1, n_req, 0))
            tl.store(info + 2, 1)
        decode_item(
            q_ptr,
            k_ptr + kvh * stride_kh,
            v_ptr + kvh * stride_vh,
            kv_indices_ptr,
            o_ptr,
            lse_ptr,
            po_ptr,
            plse_ptr,
            kvh,
            req,
            1,
            0,
            page_base,
            kv_start,
            kv_end,
            kv_len,
            out_row,
            stride_qt,
            stride_qh,
            stride_kp,
            stride_kt,
            stride_vp,
            stride_vt,
            stride_ot,
            stride_oh,
            num_qo_heads,
            qk_scale,
            soft_cap,
            window_left,
            GROUP,
            HEAD_DIM,
            BLOCK_D,
            PAGE_SIZE,
            BLOCK_M,
            BLOCK_N,
            SOFT_CAP,
            False,
            False,
            False,  # ROPE: not offered by the plan-free call
            1.0,
            0.0,
            0.0,  # no RoPE tables
            0.0,
            0.0,
            0.0,
        )


def _int_table(name: str, t: Any, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 (or int64), got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


# Cost model of a chunk choice, in KV tokens of one program: a program's fixed cost (its
# prologue, the Q load, the epilogue), and a factor on splits for the partial rows, the
# merge launch and the longer request search of more programs (H200: splitting b256 x 512
# or b256 x 2k in 2-4 chunks measured 7-22% slower than one chunk per request, while
# 64 x 32k gained 17% from 16 chunks).
_PROGRAM_COST = 32
_SPLIT_FACTOR = 1.2


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def chunk_tokens(
    batch: int,
    max_tokens: int,
    num_kv_heads: int,
    head_dim: int,
    group: int,
    device: torch.device,
    launch: DecodeLaunch | None = None,
) -> tuple[int, int]:
    """(KV tokens per chunk, programs per KV head) from shapes alone.

    max_tokens bounds the batch's KV tokens (pages x page_size); the lengths themselves are
    on the device, so the choice assumes max_tokens spread evenly over the batch. Programs
    run in rounds of `slots` (what the GPU holds at once per KV head); a round costs its
    longest chunk. Among splits of the mean length into n chunks (never below the planned
    path's smallest chunk), the one with the least modelled time wins: e.g. 64 requests
    of 32k on 49 slots per head split in 3 (4 full rounds), not 1 (a second round 30%
    full). The grid adds one program per request for the short last chunks.
    """
    limits = platform.device_limits(device)
    sm_count = plan_sm_count(limits, launch)
    block_m = block_m_for(group)
    # Slots and alignment of the page-size-16 tactic, for every page size (as measured on the
    # H200). At page size 1 the kernel itself runs 128-token blocks, so this is not its own
    # tactic's shape: sizing chunks with it is a follow-up that needs a GPU measurement.
    slots, align = launch_shape(
        sm_count, limits.shared_memory_per_block, head_dim, 16, block_m, num_kv_heads, launch
    )
    shortest = _round_up(min_chunk(batch, num_kv_heads, sm_count), align)
    mean = -(-max(max_tokens, 1) // max(batch, 1))
    best: tuple[float, int] | None = None
    for n in range(1, 257):
        chunk = max(shortest, _round_up(-(-mean // n), align))
        pieces = -(-mean // chunk)
        rounds = -(-(batch * pieces) // slots)
        cost = rounds * (chunk + _PROGRAM_COST) * (_SPLIT_FACTOR if pieces > 1 else 1.0)
        if best is None or cost < best[0]:
            best = (cost, chunk)
        if chunk == shortest:
            break
    assert best is not None
    chunk = best[1]
    return chunk, -(-max_tokens // chunk) + batch


# The decode Definition (gqa_paged_decode_*) with its inputs read from this function's
# arguments instead of a planned wrapper's state: captured and applied like the wrapper's run.
PLAN_FREE_DECODE = dataclasses.replace(
    GQA_PAGED_DECODE,
    inputs={
        name: dataclasses.replace(spec, param=None) if name in _TABLE_INPUTS else spec
        for name, spec in GQA_PAGED_DECODE.inputs.items()
    },
)


class PlanFreeOp(ApiOp):
    """`@api` for the plan-free calls (decode and prefill): the schema sees a paged cache as
    logical NHD (k, v) views (a 5-D tensor or an HND pair would give wrong axes), the default
    sm_scale as a value, and no window / soft-cap when unset (so a plain call's Definition
    matches the corpus and the wrappers' ops)."""

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        if "paged_kv_cache" in arguments:
            k, v = split_kv_cache(arguments["paged_kv_cache"], arguments["kv_layout"])
            arguments["paged_kv_cache"] = PagedKV(k, v)
        else:
            k = arguments["k"]
        if arguments["sm_scale"] is None:
            arguments["sm_scale"] = 1.0 / math.sqrt(k.shape[-1])
        if arguments["window_left"] is not None and arguments["window_left"] < 0:
            arguments["window_left"] = None
        arguments["logits_soft_cap"] = arguments["logits_soft_cap"] or None
        return arguments


def plan_free_api(schema: Any, schemas: Any = None) -> Any:
    """Register `fn` as a schema'd plan-free call (schema: an OpSchema, or a callable choosing
    one of `schemas` from the arguments)."""

    def wrap(fn: Any) -> PlanFreeOp:
        op = PlanFreeOp(fn, schema, None if schemas is None else list(schemas))
        REGISTRY[op.qualname] = op
        return op

    return wrap


@plan_free_api(PLAN_FREE_DECODE)
def paged_decode(
    q: torch.Tensor,
    paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    *,
    kv_layout: str = "NHD",
    sm_scale: float | None = None,
    logits_soft_cap: float | None = None,
    window_left: int = -1,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    launch: DecodeLaunch | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Batch decode attention over a paged KV cache in one call, with no host sync.

    q: [B, num_qo_heads, head_dim]; paged_kv_cache as for the decode wrapper (5-D tensor
    or (k, v), NHD or HND); kv_indptr [B+1], kv_indices [nnz], kv_last_page_len [B] int32
    on q's device. Returns out [B, num_qo_heads, head_dim] and, with return_lse, the base-2
    LSE [B, num_qo_heads] float32. The page table's contents are not checked (that needs a
    sync) unless FLASHTUNE_DEBUG_CHECKS is on; shapes, dtypes and devices always are.

    The tactic is the planned path's default for the shape (decode.config.default_tactic),
    or `launch.tactic`: the autotuner is not consulted (tuning the plan-free calls is not
    implemented).
    """
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(
            f"q must be a [batch, num_qo_heads, head_dim] tensor, got "
            f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}"
        )
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"q must be float16 or bfloat16, got {q.dtype}")
    if q.stride(-1) != 1:
        raise ValueError("q must be contiguous in its last dimension")
    k, v = split_kv_cache(paged_kv_cache, kv_layout)
    batch, num_qo_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, kv_dim = k.shape
    if kv_dim != head_dim:
        raise ValueError(f"q head_dim {head_dim} != paged_kv_cache head_dim {kv_dim}")
    if head_dim < 16 or head_dim > 256:
        raise ValueError(f"head_dim must be in 16..256, got {head_dim}")
    if num_qo_heads % num_kv_heads:
        raise ValueError(
            f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"paged_kv_cache {name} dtype {t.dtype} differs from q's {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"paged_kv_cache is on {t.device} but q is on {q.device}")
        if t.stride(-1) != 1:
            raise ValueError("paged_kv_cache must be contiguous in head_dim")
    dev = q.device
    indptr = _int_table("kv_indptr", kv_indptr, dev)
    indices = _int_table("kv_indices", kv_indices, dev)
    last = _int_table("kv_last_page_len", kv_last_page_len, dev)
    if indptr.numel() != batch + 1 or last.numel() != batch:
        raise ValueError(
            f"kv_indptr ({indptr.numel()}) and kv_last_page_len ({last.numel()}) must have "
            f"batch_size + 1 and batch_size entries; q has batch_size {batch}"
        )
    if not isinstance(window_left, int):
        raise TypeError(f"window_left must be an int, got {type(window_left).__name__}")
    if env.DEBUG_CHECKS.get() or dev.type == "cpu":
        # Contents: a sync on a GPU (debug only); on the CPU they are host memory already.
        validate_page_table(indptr, indices, last, page_size)
        nnz = int(indptr[-1])
        if nnz and (int(indices[:nnz].min()) < 0 or int(indices[:nnz].max()) >= num_pages):
            raise ValueError(f"kv_indices hold page ids outside the cache's {num_pages} pages")
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != dev or out.stride(-1) != 1:
        raise ValueError(
            f"out must be a {q.dtype} tensor of shape {tuple(q.shape)} on {dev} (contiguous "
            f"in its last dimension), got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    lse = torch.empty(batch, num_qo_heads, dtype=torch.float32, device=dev)
    if batch == 0:
        return (out, lse) if return_lse else out

    if not platform.kernels_available(dev) or env.FORCE_REFERENCE.get():
        o_ref, l_ref = paged_attention_ref(
            q,
            k,
            v,
            torch.arange(batch + 1, device=dev),
            indptr,
            indices,
            last,
            AttentionVariant(
                sm_scale=scale,
                causal=False,
                window_left=window_left,
                logits_soft_cap=logits_soft_cap,
            ),
        )
        out.copy_(o_ref)
        lse.copy_(l_ref)
        return (out, lse) if return_lse else out

    group = num_qo_heads // num_kv_heads
    chunk, programs = chunk_tokens(
        batch, indices.numel() * page_size, num_kv_heads, head_dim, group, dev, launch
    )
    # One fp32 allocation for the partial outputs and LSEs (row j belongs to program j).
    partial = torch.empty(programs * num_qo_heads * (head_dim + 1), dtype=torch.float32, device=dev)
    partial_o = partial[: programs * num_qo_heads * head_dim].view(programs, num_qo_heads, head_dim)
    partial_lse = partial[programs * num_qo_heads * head_dim :].view(programs, num_qo_heads)
    merge_info = torch.empty(batch, 3, dtype=torch.int32, device=dev)
    block_m = block_m_for(group)
    how = launch if launch is not None else DEFAULT_LAUNCH
    tactic = how.tactic_for(head_dim, page_size, block_m)
    if tactic.fused_merge:
        raise ValueError("DecodeTactic.fused_merge runs in planned calls only (the decode wrapper)")
    if logits_soft_cap:
        qk_scale, cap_arg = scale / logits_soft_cap, logits_soft_cap * LOG2E
    else:
        qk_scale, cap_arg = scale * LOG2E, 0.0
    _plan_free_decode_kernel[(programs, num_kv_heads)](
        q,
        k,
        v,
        indptr,
        indices,
        last,
        out,
        lse,
        partial_o,
        partial_lse,
        merge_info,
        batch,
        chunk,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        num_qo_heads,
        qk_scale,
        cap_arg,
        max(window_left, 0),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_D=next_pow2(head_dim),
        PAGE_SIZE=page_size,
        BLOCK_M=block_m,
        BLOCK_N=tactic.block_n,
        BLOCK_B=search_block(batch),
        SOFT_CAP=bool(logits_soft_cap),
        WINDOW=window_left >= 0,
        num_warps=tactic.num_warps,
        num_stages=tactic.num_stages,
    )
    # Nothing can be split when one chunk holds every token the page table could describe.
    if programs - batch > 1:
        sms = plan_sm_count(platform.device_limits(dev), launch)
        merge_partials(partial_o, partial_lse, merge_info, out, lse, sm_count=sms)
    return (out, lse) if return_lse else out


@register_examples(attention="gqa")
def paged_decode_examples(model: ModelConfig) -> list[Example]:
    """The plan-free decode at `model`'s shapes, on the planned wrapper's example page table
    (decode/schema.py): the same Definition."""
    hq, hk, d = model.num_qo_heads, model.num_kv_heads, model.head_dim
    lens = list(EXAMPLE_KV_LENS)
    indptr, indices, last, num_pages = build_page_table(lens, EXAMPLE_PAGE_SIZE, shuffle=False)
    q = meta_tensor(len(lens), hq, d)
    kv_cache = meta_tensor(num_pages, 2, EXAMPLE_PAGE_SIZE, hk, d)
    return [(paged_decode, (q, kv_cache, indptr, indices, last), {})]

"""MLA prefill for Hopper (sm_90) in Gluon: the absorbed form over a latent cache, the scores
computed once a tile and the probabilities shared through shared memory (docs/mla.md, "Next:
prefill in Gluon").

The Triton kernel (kernels.py) loses 0.35x to FlashInfer's FA3 MLA prefill because Triton
makes each warpgroup of a [64, 512]-output tile form all of the scores (the score product
runs twice, at N = 32) and spills. This kernel writes the roles out:

- a persistent program an SM walks work items: 64 query rows (tokens x heads, token-major,
  so a tile is 64 / H tokens of one request) of a request;
- one producer warp (24 registers) issues TMA loads: the item's Q (two 256-wide halves of
  the latent part and the 64-wide rotary part) and, per block of 64 keys, the latent cache
  rows (two halves; they are the keys and the values) and the rotary keys, into a two-stage
  ring;
- warpgroup 0 computes S = Q . [ckv | kpe]^T once (three chained MMAs, 36 k-steps), masks,
  runs the online softmax, writes P (bf16) and the rescale factors to shared memory for
  warpgroup 1, and accumulates output columns 0-255 from that P;
- warpgroup 1 accumulates output columns 256-511 from the same P;
- a stage of the ring frees when both warpgroups' output MMAs of its block are done; P's
  buffer frees when warpgroup 1's is (`p_full` / `p_empty`); the row sums travel the same
  way once an item, for warpgroup 1's epilogue.

The paged cache is gathered into contiguous rows first (`stage`), so every block is one TMA
box per part. Shared memory at the defaults: Q 72 KB, ring 2 x 72 KB, P 8 KB, row vectors:
about 225 KB of sm_90's 227.

`launch(overlap=True)` issues block j + 1's score MMA before block j's softmax in warpgroup
0, so that the tensor cores run it under the softmax (a few bytes of spill).

State: its cuda tests pass on an H200 (tests/ops/test_mla_hopper.py) and it is admitted to the
MLA wrapper's path (`ADMITTED`). Measured there against FlashInfer 0.2.14's MLA wrapper (FA3),
same inputs, CUDA graphs (benchmarks/results/mla.jsonl): 0.90-0.96x at prefill shapes of
1k-4k query tokens, where the Triton kernel is 0.33-0.36x; `overlap` is 20-35% slower than
without. At a few query tokens a request (MTP) a tile is one request's rows over its whole
prefix with no split of the keys: 0.1-0.2x. So the untuned default (`default_uses_gluon`)
takes it only where its work list fills the GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from flashtune import platform
from flashtune.ops.gluon_sm90 import (
    HAVE_GLUON,
    TensorDescriptor,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

__all__ = [
    "ADMITTED",
    "SPLIT_ADMITTED",
    "BLOCK_M",
    "BLOCK_N",
    "HAVE_GLUON",
    "compile_report",
    "default_uses_gluon",
    "launch",
    "plan_tables",
    "stage",
    "staged_rows",
    "supported",
    "work_items",
]

# Whether the MLA wrapper may run this kernel: False until its cuda tests have passed on a
# GPU and it has been timed (then `supported` decides per call).
ADMITTED = True
# Whether the tuner may time the split-KV form (`launch(partial=...)`, mla/hopper_split.py,
# the runner's tactic 2). Its cuda tests pass (H200, 2026-12-01: all 12 cases, decode, MTP
# and prefill plans), but it loses everywhere it was timed (bench_mla, the same run against
# FlashInfer 0.2.14 and the Triton kernel): decode at 16 heads 0.20-0.44x FlashInfer at
# batch >= 16 (64-row tiles hold 16 useful rows and stage the cache first) where Triton is
# 0.8-1.0x; MTP b1 0.80-0.85x where Triton is 0.84-1.18x; prefill 0.85-0.92x where the
# unsplit Gluon form is 0.91-0.97x. Kept out of the tuner's space (each tactic timed costs
# every new shape a compile and a profile) until a change makes it win somewhere.
SPLIT_ADMITTED = False
BLOCK_M = 64  # query rows (token x head pairs) a work item
BLOCK_N = 64  # keys a block
D_CKV = 512
D_KPE = 64
HALF = D_CKV // 2  # a warpgroup's output columns, and a TMA box's width
_LOG2E = 1.4426950408889634


def supported(q_nope: torch.Tensor, ckv: torch.Tensor, qo_lens: np.ndarray,
              kv_lens: np.ndarray, causal: bool) -> str | None:  # fmt: skip
    """None when the kernel can run this call, else why not."""
    if not HAVE_GLUON:
        return "this Triton has no Gluon"
    if q_nope.device.type != "cuda" or platform.triton_interpret():
        return "not a CUDA device"
    if platform.compute_capability(q_nope.device) != (9, 0):
        return "not sm_90 (wgmma)"
    if q_nope.dtype not in (torch.bfloat16, torch.float16) or ckv.dtype != q_nope.dtype:
        return "q and the cache must share one 16-bit dtype (no fp8 cache here)"
    if q_nope.shape[-1] != D_CKV or ckv.shape[-1] != D_CKV:
        return f"head_dim_ckv must be {D_CKV}"
    if ((kv_lens <= 0) & (qo_lens > 0)).any():
        return "a request with queries and no keys"
    if causal and (kv_lens < qo_lens).any():
        return "a causal request with more queries than keys (rows with no key)"
    return None


def plan_tables(qo_indptr: np.ndarray, kv_indptr: np.ndarray, kv_indices: torch.Tensor,
                kv_lens: np.ndarray, num_heads: int, page_size: int, causal: bool,
                device: torch.device, sm_count: int) -> tuple[torch.Tensor, torch.Tensor] | None:  # fmt: skip
    """The work list (on `device`) and staged cache rows of a multi-token plan on an sm_90
    GPU whose untuned default is this kernel (`default_uses_gluon`), made at plan time so
    that a run copies nothing from the host and can be captured in a CUDA graph; None
    elsewhere (not admitted, no Gluon, not sm_90, decode, too few items: a tuned pick of
    this kernel there builds them at its first run, outside a capture)."""
    if not (ADMITTED and HAVE_GLUON) or device.type != "cuda" or platform.triton_interpret():
        return None
    if platform.compute_capability(device) != (9, 0):
        return None
    if int(qo_indptr[-1]) <= len(qo_indptr) - 1:
        return None  # decode: one query token a request
    work = work_items(qo_indptr, kv_lens, num_heads, causal)
    if not default_uses_gluon(work, sm_count):
        return None
    rows = staged_rows(kv_indptr, kv_indices, kv_lens, page_size)
    return torch.from_numpy(work).to(device), rows


def default_uses_gluon(work: np.ndarray | torch.Tensor, num_sms: int) -> bool:
    """Tactic -1's choice between this kernel and the Triton one: this kernel has no split of
    the keys, so a work list of fewer items than SMs leaves SMs idle while each walks a whole
    prefix (0.1-0.2x at MTP shapes); with at least one item an SM it is 2.6-2.9x the Triton
    kernel at every prefill shape measured."""
    return int(work.shape[0]) >= num_sms


def work_items(qo_indptr: np.ndarray, kv_lens: np.ndarray, num_heads: int,
               causal: bool) -> np.ndarray:  # fmt: skip
    """[items, 8] int32, heaviest first: (first row of the request's queries in the
    [tokens * heads] view, the item's row offset in the request, qo_len, first key in the
    staged cache, kv_len, key blocks, 0, 0)."""
    qo_lens = np.diff(qo_indptr).astype(np.int64)
    kv_lens = np.asarray(kv_lens, dtype=np.int64)
    kv_starts = np.concatenate([[0], np.cumsum(kv_lens)[:-1]])
    rows = qo_lens * num_heads
    tiles = -(-rows // BLOCK_M)
    req = np.repeat(np.arange(qo_lens.size), tiles)
    first = np.concatenate([[0], np.cumsum(tiles)[:-1]])
    m0 = (np.arange(req.size) - np.repeat(first, tiles)) * BLOCK_M
    qo, kv = qo_lens[req], kv_lens[req]
    if causal:
        last_tok = np.minimum(qo - 1, (m0 + BLOCK_M - 1) // num_heads)
        hi = np.minimum(kv, last_tok + kv - qo + 1)
    else:
        hi = kv
    blocks = -(-hi // BLOCK_N)
    out = np.zeros((req.size, 8), dtype=np.int64)
    out[:, 0] = np.asarray(qo_indptr, dtype=np.int64)[req] * num_heads
    out[:, 1], out[:, 2], out[:, 3], out[:, 4], out[:, 5] = m0, qo, kv_starts[req], kv, blocks
    order = np.argsort(-blocks, kind="stable")
    return out[order].astype(np.int32)


def staged_rows(kv_indptr: np.ndarray, kv_indices: torch.Tensor, kv_lens: np.ndarray,
                page_size: int) -> torch.Tensor:  # fmt: skip
    """The rows of a paged cache viewed as [pages * page_size, D] that `stage` gathers:
    request b's tokens in order, from its pages kv_indices[kv_indptr[b] : kv_indptr[b + 1]].
    Depends on the page table only (a plan keeps it for both caches)."""
    lens = torch.as_tensor(np.asarray(kv_lens, dtype=np.int64), device=kv_indices.device)
    first_page = torch.as_tensor(np.asarray(kv_indptr[:-1], dtype=np.int64), device=lens.device)
    req = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    starts = torch.cumsum(lens, 0) - lens
    tok = torch.arange(req.numel(), device=lens.device) - starts[req]  # position in request
    page = kv_indices.long()[first_page[req] + tok // page_size]
    return page * page_size + tok % page_size


def stage(cache: torch.Tensor, kv_indptr: np.ndarray, kv_indices: torch.Tensor,
          kv_lens: np.ndarray, rows: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """A paged cache [pages, page_size, D] gathered into [sum(kv_lens), D]: request b's
    tokens in order (`staged_rows`, computed here unless given)."""
    if rows is None:
        rows = staged_rows(kv_indptr, kv_indices, kv_lens, cache.shape[1])
    return cache.reshape(-1, cache.shape[-1]).index_select(0, rows)


if HAVE_GLUON:

    @gluon.jit
    def _item(w, work_ptr, H: gl.constexpr, CAUSAL: gl.constexpr, SPLIT: gl.constexpr):
        """Work item w: (q_row0, m0, qo_len, kv_start, kv_len, n_blocks, mask_from, kb0,
        prow); rows m0 .. m0 + 63 of the request are tokens (m0 + r) // H; its key blocks
        are kb0 .. kb0 + n_blocks - 1 of the request's; prow >= 0: a chunk of a split tile,
        written as partial rows prow + r (hopper_split.py)."""
        row = work_ptr + w * 8
        q_row0 = gl.load(row)
        m0 = gl.load(row + 1)
        qo_len = gl.load(row + 2)
        kv_start = gl.load(row + 3)
        kv_len = gl.load(row + 4)
        n_blocks = gl.load(row + 5)
        if SPLIT:
            kb0 = gl.load(row + 6)
            prow = gl.load(row + 7)
        else:  # constants: the unsplit build's code does not change
            kb0 = 0
            prow = -1
        if CAUSAL:
            # The first block with a key past the tile's first token's limit, or the keys' end.
            first_tok = m0 // H
            mask_from = gl.minimum((first_tok + kv_len - qo_len + 1) // 64, kv_len // 64)
        else:
            mask_from = kv_len // 64
        return q_row0, m0, qo_len, kv_start, kv_len, n_blocks, mask_from, kb0, prow

    @gluon.jit
    def _producer(qn_desc, qp_desc, ckv_desc, kpe_desc, qn_smem, qp_smem, ckv_bufs, kpe_bufs,
                  q_ready, q_empty, kv_ready, kv_empty, work_ptr, n_items,
                  H: gl.constexpr, CAUSAL: gl.constexpr, SPLIT: gl.constexpr):  # fmt: skip
        STAGES: gl.constexpr = kpe_bufs.shape[0]
        it = 0
        item = 0
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            q_row0, m0, qo_len, kv_start, kv_len, n_blocks, mask_from, kb0, prow = _item(
                w, work_ptr, H, CAUSAL, SPLIT
            )
            # A barrier's phase "1" counts as complete before its first completion.
            mbarrier.wait(q_empty, (item & 1) ^ 1)
            mbarrier.expect(q_ready, 2 * qn_desc.block_type.nbytes + qp_desc.block_type.nbytes)
            for c in gl.static_range(2):
                tma.async_copy_global_to_shared(
                    qn_desc, [q_row0 + m0, c * 256], q_ready, qn_smem.index(c)
                )
            tma.async_copy_global_to_shared(qp_desc, [q_row0 + m0, 0], q_ready, qp_smem)
            for j in range(n_blocks):
                s = (it + j) % STAGES
                mbarrier.wait(kv_empty.index(s), (((it + j) // STAGES) & 1) ^ 1)
                mbarrier.expect(
                    kv_ready.index(s),
                    2 * ckv_desc.block_type.nbytes + kpe_desc.block_type.nbytes,
                )
                key = kv_start + (kb0 + j) * 64
                for c in gl.static_range(2):
                    tma.async_copy_global_to_shared(
                        ckv_desc, [key, c * 256], kv_ready.index(s), ckv_bufs.index(s * 2 + c)
                    )
                tma.async_copy_global_to_shared(
                    kpe_desc, [key, 0], kv_ready.index(s), kpe_bufs.index(s)
                )
            it += n_blocks
            item += 1

    @gluon.jit
    def _scores(qn_smem, qp_smem, ckv_bufs, kpe_bufs, st, zero):
        """S = Q . [ckv | kpe]^T of a block, issued asynchronously (three chained MMAs)."""
        s = warpgroup_mma(qn_smem.index(0), ckv_bufs.index(st * 2).permute((1, 0)), zero,
                          use_acc=False, is_async=True)  # fmt: skip
        s = warpgroup_mma(qn_smem.index(1), ckv_bufs.index(st * 2 + 1).permute((1, 0)), s,
                          is_async=True)  # fmt: skip
        return warpgroup_mma(qp_smem, kpe_bufs.index(st).permute((1, 0)), s, is_async=True)

    @gluon.jit
    def _store_half(o, l_i, rows, q_row0, qo_len, o_ptr, COL0: gl.constexpr,
                    H: gl.constexpr, o_layout: gl.constexpr):  # fmt: skip
        """Output columns COL0 .. COL0 + 255 of the item's rows below qo_len * H: o / l."""
        o_rows_l: gl.constexpr = gl.SliceLayout(1, o_layout)
        o_rows = gl.convert_layout(rows, o_rows_l)
        out = (o / gl.convert_layout(l_i, o_rows_l)[:, None]).to(o_ptr.dtype.element_ty)
        cols = COL0 + gl.arange(0, 256, layout=gl.SliceLayout(0, o_layout))
        ptrs = o_ptr + (q_row0 + o_rows).to(gl.int64)[:, None] * 512 + cols[None, :]
        gl.store(ptrs, out, mask=(o_rows < qo_len * H)[:, None])

    @gluon.jit
    def _store_partial_half(o, l_i, rows, prow0, qo_len, po_ptr, COL0: gl.constexpr,
                            H: gl.constexpr, o_layout: gl.constexpr):  # fmt: skip
        """A split tile's chunk: columns COL0 .. COL0 + 255 of o / l in float32 at partial
        rows prow0 + rows (0 where the chunk had no key for a row), for the merge."""
        o_rows_l: gl.constexpr = gl.SliceLayout(1, o_layout)
        o_rows = gl.convert_layout(rows, o_rows_l)
        l_o = gl.convert_layout(l_i, o_rows_l)
        out = gl.where(l_o[:, None] > 0, o / l_o[:, None], 0.0)
        cols = COL0 + gl.arange(0, 256, layout=gl.SliceLayout(0, o_layout))
        ptrs = po_ptr + (prow0 + o_rows).to(gl.int64)[:, None] * 512 + cols[None, :]
        gl.store(ptrs, out, mask=(o_rows < qo_len * H)[:, None])

    @gluon.jit
    def _store_rows_half(o, m_i, l_i, rows, q_row0, prow, m0, qo_len, o_ptr, lse_ptr, po_ptr,
                         plse_ptr, COL0: gl.constexpr, H: gl.constexpr,
                         WITH_LSE: gl.constexpr, o_layout: gl.constexpr):  # fmt: skip
        """The SPLIT build's epilogue of half the columns: a whole tile's rows to out (and
        lse), a chunk's (prow >= 0) to the partial rows; WITH_LSE: this half writes the
        lse (warpgroup 0: the partial lse always, the final one when asked)."""
        if prow >= 0:
            _store_partial_half(o, l_i, rows, prow - m0, qo_len, po_ptr, COL0, H, o_layout)
            if WITH_LSE or COL0 == 0:
                lse_part = gl.where(l_i > 0, m_i + gl.log2(l_i), -float("inf"))
                gl.store(plse_ptr + prow - m0 + rows, lse_part, mask=rows < qo_len * H)
        else:
            _store_half(o, l_i, rows, q_row0, qo_len, o_ptr, COL0, H, o_layout)
            if WITH_LSE:
                gl.store(lse_ptr + q_row0 + rows, m_i + gl.log2(l_i), mask=rows < qo_len * H)

    @gluon.jit
    def _softmax_pv(s, j, st, o, m_i, l_i, pev, mask_from, kv_len, limit, cols, qk_scale,
                    ckv_bufs, p_smem, a_smem, kv_empty, p_full, p_empty, CAUSAL: gl.constexpr,
                    o_rows_l: gl.constexpr, SPLIT: gl.constexpr):  # fmt: skip
        """Warpgroup 0's part of key block j after its scores: mask, online softmax, P and
        the rescale factors handed to warpgroup 1, output columns 0-255. Returns (o, m, l,
        P handovers so far)."""
        if j >= mask_from:
            keys = j * 64 + cols
            ok = keys[None, :] < kv_len
            if CAUSAL:
                ok = ok & (keys[None, :] <= limit[:, None])
            s = gl.where(ok, s, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        if SPLIT:
            # A chunk can begin past a row's last key (causal): its blocks are all masked
            # for that row, and -inf - -inf must not make NaN of alpha and P.
            m_use = gl.where(m_new == -float("inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(s * qk_scale - m_use[:, None])
        else:
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        # Warpgroup 1's output MMA of the previous block has read P.
        mbarrier.wait(p_empty, (pev & 1) ^ 1)
        p_smem.store(p.to(p_smem.dtype))
        a_smem.store(alpha)
        fence_async_shared()
        mbarrier.arrive(p_full, count=1)
        o = o * gl.convert_layout(alpha, o_rows_l)[:, None]
        o = warpgroup_mma(p_smem, ckv_bufs.index(st * 2), o, is_async=True)
        o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
        mbarrier.arrive(kv_empty.index(st), count=1)
        return o, m_new, l_i, pev + 1

    @gluon.jit
    def _softmax_wg(qn_smem, qp_smem, ckv_bufs, kpe_bufs, p_smem, a_smem, l_smem, q_ready,
                    q_empty, kv_ready, kv_empty, p_full, p_empty, o_ptr, lse_ptr, po_ptr,
                    plse_ptr, work_ptr, n_items, qk_scale, H: gl.constexpr,
                    CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, OVERLAP: gl.constexpr,
                    SPLIT: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
        """Warpgroup 0: the scores, the softmax, P for both, output columns 0-255. With
        OVERLAP the next block's score MMA runs under this block's softmax."""
        STAGES: gl.constexpr = kpe_bufs.shape[0]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 64, 16]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 256, 16]
        )
        rows_l: gl.constexpr = gl.SliceLayout(1, s_layout)
        o_rows_l: gl.constexpr = gl.SliceLayout(1, o_layout)
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, s_layout))
        zero = gl.zeros([64, 64], gl.float32, layout=s_layout)
        it = 0
        item = 0
        pev = 0  # P handovers so far (p_full / p_empty phases)
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            q_row0, m0, qo_len, kv_start, kv_len, n_blocks, mask_from, kb0, prow = _item(
                w, work_ptr, H, CAUSAL, SPLIT
            )
            rows = m0 + gl.arange(0, 64, layout=rows_l)
            limit = rows // H + kv_len - qo_len  # the last key each row sees (causal)
            m_i = gl.full([64], -float("inf"), gl.float32, layout=rows_l)
            l_i = gl.zeros([64], gl.float32, layout=rows_l)
            o = gl.zeros([64, 256], gl.float32, layout=o_layout)
            mbarrier.wait(q_ready, item & 1)
            if OVERLAP:
                # Block j + 1's score MMA is issued before block j's softmax and runs under it.
                st = it % STAGES
                mbarrier.wait(kv_ready.index(st), (it // STAGES) & 1)
                s = _scores(qn_smem, qp_smem, ckv_bufs, kpe_bufs, st, zero)
                for j in range(n_blocks - 1):
                    st = (it + j) % STAGES
                    nst = (it + j + 1) % STAGES
                    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
                    mbarrier.wait(kv_ready.index(nst), ((it + j + 1) // STAGES) & 1)
                    s_next = _scores(qn_smem, qp_smem, ckv_bufs, kpe_bufs, nst, zero)
                    o, m_i, l_i, pev = _softmax_pv(
                        s, kb0 + j, st, o, m_i, l_i, pev, mask_from, kv_len, limit, cols,
                        qk_scale, ckv_bufs, p_smem, a_smem, kv_empty, p_full, p_empty, CAUSAL,
                        o_rows_l, SPLIT,
                    )  # fmt: skip
                    s = s_next
                j = n_blocks - 1
                st = (it + j) % STAGES
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
                mbarrier.arrive(q_empty, count=1)  # every score MMA of the item done
                o, m_i, l_i, pev = _softmax_pv(
                    s, kb0 + j, st, o, m_i, l_i, pev, mask_from, kv_len, limit, cols,
                    qk_scale, ckv_bufs, p_smem, a_smem, kv_empty, p_full, p_empty, CAUSAL,
                    o_rows_l, SPLIT,
                )  # fmt: skip
            else:
                for j in range(n_blocks):
                    st = (it + j) % STAGES
                    mbarrier.wait(kv_ready.index(st), ((it + j) // STAGES) & 1)
                    s = _scores(qn_smem, qp_smem, ckv_bufs, kpe_bufs, st, zero)
                    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
                    if j == n_blocks - 1:
                        mbarrier.arrive(q_empty, count=1)  # every score MMA of the item done
                    o, m_i, l_i, pev = _softmax_pv(
                        s, kb0 + j, st, o, m_i, l_i, pev, mask_from, kv_len, limit, cols,
                        qk_scale, ckv_bufs, p_smem, a_smem, kv_empty, p_full, p_empty, CAUSAL,
                        o_rows_l, SPLIT,
                    )  # fmt: skip
            # The row sums for warpgroup 1's epilogue, once it has read the last P.
            mbarrier.wait(p_empty, (pev & 1) ^ 1)
            l_smem.store(l_i)
            mbarrier.arrive(p_full, count=1)
            pev += 1
            if SPLIT:
                _store_rows_half(o, m_i, l_i, rows, q_row0, prow, m0, qo_len, o_ptr, lse_ptr,
                                 po_ptr, plse_ptr, 0, H, RETURN_LSE, o_layout)  # fmt: skip
            else:
                _store_half(o, l_i, rows, q_row0, qo_len, o_ptr, 0, H, o_layout)
                if RETURN_LSE:
                    gl.store(lse_ptr + q_row0 + rows, m_i + gl.log2(l_i),
                             mask=rows < qo_len * H)  # fmt: skip
            it += n_blocks
            item += 1

    @gluon.jit
    def _output_wg(ckv_bufs, kpe_bufs, p_smem, a_smem, l_smem, kv_ready, kv_empty, p_full,
                   p_empty, o_ptr, po_ptr, work_ptr, n_items, H: gl.constexpr,
                   CAUSAL: gl.constexpr, SPLIT: gl.constexpr,
                   num_warps: gl.constexpr):  # fmt: skip
        """Warpgroup 1: output columns 256-511 from warpgroup 0's P."""
        STAGES: gl.constexpr = kpe_bufs.shape[0]
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 256, 16]
        )
        o_rows_l: gl.constexpr = gl.SliceLayout(1, o_layout)
        it = 0
        pev = 0
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            q_row0, m0, qo_len, kv_start, kv_len, n_blocks, mask_from, kb0, prow = _item(
                w, work_ptr, H, CAUSAL, SPLIT
            )
            o = gl.zeros([64, 256], gl.float32, layout=o_layout)
            for j in range(n_blocks):
                st = (it + j) % STAGES
                mbarrier.wait(kv_ready.index(st), ((it + j) // STAGES) & 1)
                mbarrier.wait(p_full, pev & 1)
                alpha = a_smem.load(o_rows_l)
                o = o * alpha[:, None]
                o = warpgroup_mma(p_smem, ckv_bufs.index(st * 2 + 1), o, is_async=True)
                o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
                mbarrier.arrive(p_empty, count=1)
                pev += 1
                mbarrier.arrive(kv_empty.index(st), count=1)
            mbarrier.wait(p_full, pev & 1)
            l_i = l_smem.load(o_rows_l)
            mbarrier.arrive(p_empty, count=1)
            pev += 1
            rows = m0 + gl.arange(0, 64, layout=o_rows_l)
            if SPLIT:
                _store_rows_half(o, l_i, l_i, rows, q_row0, prow, m0, qo_len, o_ptr, o_ptr,
                                 po_ptr, po_ptr, 256, H, False, o_layout)  # fmt: skip
            else:
                _store_half(o, l_i, rows, q_row0, qo_len, o_ptr, 256, H, o_layout)
            it += n_blocks

    @gluon.jit
    def mla_prefill_kernel(qn_desc, qp_desc, ckv_desc, kpe_desc, o_ptr, lse_ptr, po_ptr,
                           plse_ptr, work_ptr, n_items, qk_scale, H: gl.constexpr,
                           STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                           RETURN_LSE: gl.constexpr, OVERLAP: gl.constexpr = False,
                           SPLIT: gl.constexpr = False,
                           num_warps: gl.constexpr = 4):  # fmt: skip
        """Two 4-warp warpgroups (scores and softmax + columns 0-255; columns 256-511) and
        one producer warp."""
        qn_smem = gl.allocate_shared_memory(qn_desc.dtype, [2] + qn_desc.block_type.shape,
                                            qn_desc.layout)  # fmt: skip
        qp_smem = gl.allocate_shared_memory(qp_desc.dtype, qp_desc.block_type.shape,
                                            qp_desc.layout)  # fmt: skip
        ckv_bufs = gl.allocate_shared_memory(ckv_desc.dtype,
                                             [2 * STAGES] + ckv_desc.block_type.shape,
                                             ckv_desc.layout)  # fmt: skip
        kpe_bufs = gl.allocate_shared_memory(kpe_desc.dtype, [STAGES] + kpe_desc.block_type.shape,
                                             kpe_desc.layout)  # fmt: skip
        p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], qn_desc.dtype)
        p_smem = gl.allocate_shared_memory(qn_desc.dtype, [64, 64], p_layout)
        vec_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        a_smem = gl.allocate_shared_memory(gl.float32, [64], vec_layout)
        l_smem = gl.allocate_shared_memory(gl.float32, [64], vec_layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        p_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        p_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        mbarrier.init(q_empty, count=1)
        mbarrier.init(p_full, count=1)
        mbarrier.init(p_empty, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=2)  # both warpgroups' output MMAs
        gl.warp_specialize(
            [
                (_softmax_wg, (qn_smem, qp_smem, ckv_bufs, kpe_bufs, p_smem, a_smem, l_smem,
                               q_ready, q_empty, kv_ready, kv_empty, p_full, p_empty, o_ptr,
                               lse_ptr, po_ptr, plse_ptr, work_ptr, n_items, qk_scale, H,
                               CAUSAL, RETURN_LSE, OVERLAP, SPLIT, num_warps)),
                (_output_wg, (ckv_bufs, kpe_bufs, p_smem, a_smem, l_smem, kv_ready, kv_empty,
                              p_full, p_empty, o_ptr, po_ptr, work_ptr, n_items, H, CAUSAL,
                              SPLIT, num_warps)),
                (_producer, (qn_desc, qp_desc, ckv_desc, kpe_desc, qn_smem, qp_smem, ckv_bufs,
                             kpe_bufs, q_ready, q_empty, kv_ready, kv_empty, work_ptr,
                             n_items, H, CAUSAL, SPLIT)),
            ],
            [4, 1],
            [240, 24],
        )  # fmt: skip

    def _descriptor(t2d: torch.Tensor, rows: int, cols: int) -> Any:
        """TMA descriptor of a [rows_total, width] row-major tensor, boxes [rows, cols]."""
        gl_dtype = gl.bfloat16 if t2d.dtype == torch.bfloat16 else gl.float16
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], gl_dtype)
        return TensorDescriptor.from_tensor(t2d, [rows, cols], layout)


def launch(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    work: torch.Tensor,
    sm_scale: float,
    causal: bool,
    stages: int = 2,
    overlap: bool = False,
    partial: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Run the kernel: q_nope [T, H, 512], q_pe [T, H, 64], ckv [K, 512] and kpe [K, 64]
    contiguous (a paged cache staged by `stage`), out [T, H, 512] contiguous, lse [T, H]
    float32 contiguous or None, work from `work_items` on the device. partial: the float32
    (o [P, H, 512], lse [P, H]) a work list from `hopper_split.split_work` writes its
    chunks' rows to (the SPLIT build); the caller then merges them (`merge_partials`)."""
    t, h = q_nope.shape[0], q_nope.shape[1]
    for name, x in (("q_nope", q_nope), ("q_pe", q_pe), ("ckv", ckv), ("kpe", kpe), ("out", out)):
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if lse is not None and (not lse.is_contiguous() or lse.dtype != torch.float32):
        raise ValueError("lse must be contiguous float32")
    n_items = work.shape[0]
    if n_items == 0 or t == 0:
        return
    sms = torch.cuda.get_device_properties(q_nope.device).multi_processor_count
    po, plse = partial if partial is not None else (out, lse if lse is not None else out)
    mla_prefill_kernel[(min(n_items, sms),)](
        _descriptor(q_nope.view(t * h, D_CKV), BLOCK_M, HALF),
        _descriptor(q_pe.view(t * h, D_KPE), BLOCK_M, D_KPE),
        _descriptor(ckv, BLOCK_N, HALF),
        _descriptor(kpe, BLOCK_N, D_KPE),
        out, lse if lse is not None else out, po, plse, work, n_items, sm_scale * _LOG2E,
        H=h, STAGES=stages, CAUSAL=causal, RETURN_LSE=lse is not None, OVERLAP=overlap,
        SPLIT=partial is not None, num_warps=4,
    )  # fmt: skip


def compile_report(
    causal: bool = True,
    return_lse: bool = True,
    heads: int = 16,
    overlap: bool = False,
    split: bool = False,
) -> dict[str, Any]:
    """Compile the kernel for sm_90a without a GPU: flashtune.ops.gluon_sm90's report
    (wgmma count, ptxas -v, shared memory bytes). Needs TRITON_INTERPRET unset at import."""
    from triton.runtime.jit import mangle_type

    from flashtune.ops.gluon_sm90 import compile_sm90

    q = torch.empty(256 * heads, D_CKV, dtype=torch.bfloat16)
    qp = torch.empty(256 * heads, D_KPE, dtype=torch.bfloat16)
    c = torch.empty(256, D_CKV, dtype=torch.bfloat16)
    kp = torch.empty(256, D_KPE, dtype=torch.bfloat16)
    sig = {
        "qn_desc": mangle_type(_descriptor(q, BLOCK_M, HALF)),
        "qp_desc": mangle_type(_descriptor(qp, BLOCK_M, D_KPE)),
        "ckv_desc": mangle_type(_descriptor(c, BLOCK_N, HALF)),
        "kpe_desc": mangle_type(_descriptor(kp, BLOCK_N, D_KPE)),
        "o_ptr": "*bf16",
        "lse_ptr": "*fp32",
        "po_ptr": "*fp32" if split else "*bf16",
        "plse_ptr": "*fp32",
        "work_ptr": "*i32",
        "n_items": "i32",
        "qk_scale": "fp32",
    }
    consts: dict[str, Any] = dict(H=heads, STAGES=2, CAUSAL=causal, RETURN_LSE=return_lse)
    consts.update(OVERLAP=overlap, SPLIT=split, num_warps=4)
    return compile_sm90(mla_prefill_kernel, sig, consts)

"""Prefill attention for Hopper (sm_90) in Gluon, in the shape of FlashAttention-3's forward.

Triton 3.6 does not warp-specialize on sm_90 (prefill/config.py's notes), which held the
Triton prefill kernel at about 470 TFLOP/s on an H200 against FlashInfer's FA3 backend's
580. This kernel writes the specialization out in Gluon (`triton.experimental.gluon`):

- a persistent program an SM walks (query tile of 128 rows, query head) work items: the
  plan's work list (heaviest request first) times the heads, heads fastest so the query
  heads of one KV head read its blocks from L2;
- one producer warp (24 registers) issues TMA loads: each item's Q tile, then its K and V
  blocks of 128 keys into a two-stage ring; K and V each have their own `ready` and
  `empty` barriers (K frees after its score MMA, V after its output MMA, a block later),
  and the ring's stage and phase count blocks across items, so the next item's loads
  start under this item's last blocks and its epilogue;
- two consumer warpgroups (240 registers each) own 64 rows of the tile each and run
  FA3's intra-warpgroup overlap: block j's score MMA and block j-1's output MMA are issued
  back to back, asynchronously, and block j's softmax runs on the CUDA cores while the
  output MMA runs (P stays in registers as the output MMA's A operand).
Masks apply only to blocks that cross the causal diagonal or the keys' end. With `chained`
tactics the next item's first score MMA is issued right behind this item's last output
MMA (`_consumer_chained`, Q double-buffered): it pays where items are short (tactic -1's
table in hopper_schedule.py). Host-side choices (tactics, tactic -1, the host schedule)
live in `hopper_schedule.py`.

Measured on an H200 (session 28, causal, 32/8 heads, d128, bf16, CUDA graphs): 1.15-1.27x
the Triton kernel at 1k-8k tokens a request (563-584 TFLOP/s at 4k-8k); against FlashInfer
0.7.2's FA3 paged 1.149x and ragged 0.978x geomean over 12 shapes (docs/attention.md).

Runs where the plan is plain attention (causal or not, no window, soft cap, RoPE, ALiBi or
custom mask), head_dim 64, 128 or 256, 16-bit q/k/v of one dtype, every row with at least one key,
on sm_90 (wgmma is Hopper's; Blackwell has its own MMA), outside CUDA-graph mode
(`supported` says why not). `FLASHTUNE_PREFILL_GLUON=0` turns it off.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from flashtune import env, platform
from flashtune.ops.attention.prefill.hopper_schedule import (
    BLOCK_M,
    HEAD_DIMS,
    HOPPER_TACTICS,
    KERNEL_HEAD_DIMS,
    HopperTactic,
    block_n,
    default_prefers_triton,
    default_tactic,
    item_blocks,
    pick_tactic,
    q_stages,
    snake_schedule,
)
from flashtune.ops.gluon_sm90 import (
    HAVE_GLUON,
    TensorDescriptor,
    gl,
    gluon,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

__all__ = [
    "BLOCK_M",
    "HAVE_GLUON",
    "HEAD_DIMS",
    "HOPPER_TACTICS",
    "KERNEL_HEAD_DIMS",
    "HopperTactic",
    "block_n",
    "compile_report",
    "default_prefers_triton",
    "default_tactic",
    "item_blocks",
    "launch",
    "pick_tactic",
    "snake_schedule",
    "supported",
]

_LOG2E = 1.4426950408889634


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
              plan: Any, lse: torch.Tensor | None = None) -> str | None:  # fmt: skip
    """None when the Gluon kernel can run this call, else why not (for logs and tests)."""
    if not HAVE_GLUON:
        return "this Triton has no Gluon"
    if not env.PREFILL_GLUON.get():
        return "FLASHTUNE_PREFILL_GLUON=0"
    if q.device.type != "cuda" or platform.triton_interpret():
        return "not a CUDA device"
    if platform.compute_capability(q.device) != (9, 0):
        return "not sm_90 (wgmma)"
    if plan.graph_tactic is not None:
        return "CUDA-graph mode keeps the Triton kernel"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return "q, k and v must share one 16-bit dtype"
    if plan.head_dim not in HEAD_DIMS:
        return f"head_dim {plan.head_dim} (only {', '.join(map(str, HEAD_DIMS))} so far)"
    if plan.window_left >= 0 or plan.logits_soft_cap or plan.rope is not None or plan.alibi:
        return "not plain attention"
    if plan.mask_d is not None:
        return "custom mask"
    qo_lens = np.diff(plan.qo_indptr)
    if (plan.kv_lens[qo_lens > 0] <= 0).any():
        return "a request with queries and no keys"
    if plan.causal and (plan.kv_lens < qo_lens).any():
        return "a causal request with more queries than keys (rows with no key)"
    d = plan.head_dim
    if q.stride(2) != 1 or q.stride(1) != d or out.stride(2) != 1:
        return "q must be [tokens, heads, head_dim] with adjacent heads, out contiguous in head_dim"
    if lse is not None and lse.stride(1) != 1:
        return "lse must be contiguous in its heads"
    if (q.stride(0) * q.element_size()) % 16 or q.data_ptr() % 16:
        return "q rows not 16-byte aligned (TMA)"
    if not plan.paged:
        for t in (k, v):
            if t.stride(2) != 1 or t.stride(1) != d or (t.stride(0) * 2) % 16:
                return "k / v must be [tokens, heads, head_dim] with 16-byte aligned rows (TMA)"
            if t.data_ptr() % 16:
                return "k / v not 16-byte aligned (TMA)"
    return None


if HAVE_GLUON:
    from flashtune.ops.attention.prefill.hopper_device import (
        _epilogue,
        _finish_item,
        _first_scores,
        _item,
        _item_at,
        _pass_turn,
        _producer,
        _rest_blocks,
        _softmax_block,
        _take_turn,
        _walk,
    )

    @gluon.jit
    def _consumer_chained(q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty,
                          v_empty, turn_wait, turn_signal, o_ptr, lse_ptr, work_ptr,
                          sched_ptr, n_items, SCHEDULED: gl.constexpr, qk_scale, stride_o,
                          stride_oh, stride_lse, HALF: gl.constexpr, HQ: gl.constexpr,
                          CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr,
                          PINGPONG: gl.constexpr, RESCALE_EARLY: gl.constexpr,
                          num_warps: gl.constexpr):  # fmt: skip
        """`_consumer` with the items chained: the next item's first score MMA is issued
        right behind this item's last output MMA, so that the tensor cores see no gap
        between them; the next item's first softmax and this item's epilogue follow, after
        both MMAs (the epilogue beside an in-flight accumulator does not fit in the
        registers: ptxas then serializes every wgmma of the kernel, C7511). Q is
        double-buffered where shared memory allows (q_smem [2 * QSTAGES, 64, D]): the next
        item's Q loads during this one. A
        program's walk is never empty (the grid is at most the items; the schedule deals
        every program one in its first round)."""
        STAGES: gl.constexpr = k_bufs.shape[0]
        QSTAGES: gl.constexpr = q_smem.shape[0] // 2
        SUB_M: gl.constexpr = q_smem.shape[1]
        D: gl.constexpr = q_smem.shape[2]
        BLOCK_N: gl.constexpr = k_bufs.shape[1]
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, D, 16]
        )
        rows_l: gl.constexpr = gl.SliceLayout(1, s_layout)
        o_rows_l: gl.constexpr = gl.SliceLayout(1, o_layout)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        zero = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=s_layout)
        first, end, step = _walk(sched_ptr, n_items, SCHEDULED)

        # The first item's block 0.
        head, m0, q_start, qo_len, kv_start, kv_len, n_blocks, mask_from = _item(
            _item_at(first, sched_ptr, SCHEDULED), work_ptr, HQ, CAUSAL, 2 * SUB_M, BLOCK_N
        )
        rows = m0 + HALF * SUB_M + gl.arange(0, SUB_M, layout=rows_l)
        q_at = HALF  # the q_smem buffer of the item in hand
        mbarrier.wait(q_bar.index(0), 0)
        s, ev = _first_scores(q_smem.index(q_at), k_bufs, k_ready, k_empty, 0, 0, zero,
                              turn_wait, turn_signal, HALF, PINGPONG)  # fmt: skip
        m_i = gl.full([SUB_M], -float("inf"), gl.float32, layout=rows_l)
        l_i = gl.zeros([SUB_M], gl.float32, layout=rows_l)
        p, m_i, l_i, alpha = _softmax_block(
            s, 0, m_i, l_i, rows, cols, kv_len - qo_len, kv_len, qk_scale, mask_from, CAUSAL,
            p_layout, dtype, BLOCK_N,
        )  # fmt: skip
        acc = gl.zeros([SUB_M, D], gl.float32, layout=o_layout)
        it = 0
        item = 0
        for idx in range(first + step, end, step):
            acc, p, m_i, l_i, alpha, ev = _rest_blocks(
                q_smem.index(q_at), k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, turn_wait,
                turn_signal, acc, p, m_i, l_i, alpha, it, ev, n_blocks, rows, cols,
                kv_len - qo_len, kv_len, qk_scale, mask_from, zero, HALF, CAUSAL, PINGPONG,
                RESCALE_EARLY, o_rows_l, p_layout,
            )  # fmt: skip
            # Every score MMA of the item is done: its Q buffer may take a later item's.
            mbarrier.arrive(q_empty.index(item % QSTAGES), count=1)
            last = (it + n_blocks - 1) % STAGES
            last_phase = ((it + n_blocks - 1) // STAGES) & 1
            it += n_blocks
            item += 1
            # The next item's block 0, its score MMA issued with this item's last output MMA.
            nhead, nm0, nq_start, nqo_len, nkv_start, nkv_len, n_nblocks, nmask_from = _item(
                _item_at(idx, sched_ptr, SCHEDULED), work_ptr, HQ, CAUSAL, 2 * SUB_M, BLOCK_N
            )
            nrows = nm0 + HALF * SUB_M + gl.arange(0, SUB_M, layout=rows_l)
            nq_at = (item % QSTAGES) * 2 + HALF
            st = it % STAGES
            mbarrier.wait(q_bar.index(item % QSTAGES), (item // QSTAGES) & 1)
            mbarrier.wait(k_ready.index(st), (it // STAGES) & 1)
            mbarrier.wait(v_ready.index(last), last_phase)
            _take_turn(turn_wait, ev, PINGPONG, HALF == 0)
            if RESCALE_EARLY:
                acc = acc * gl.convert_layout(alpha, o_rows_l)[:, None]
            acc = warpgroup_mma(p, v_bufs.index(last), acc, is_async=True)
            s = warpgroup_mma(q_smem.index(nq_at), k_bufs.index(st).permute((1, 0)), zero,
                              use_acc=False, is_async=True)  # fmt: skip
            _pass_turn(turn_signal, PINGPONG)
            ev += 1
            acc, p, s = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p, s))
            mbarrier.arrive(v_empty.index(last), count=1)
            mbarrier.arrive(k_empty.index(st), count=1)
            nm_i = gl.full([SUB_M], -float("inf"), gl.float32, layout=rows_l)
            nl_i = gl.zeros([SUB_M], gl.float32, layout=rows_l)
            p, nm_i, nl_i, alpha = _softmax_block(
                s, 0, nm_i, nl_i, nrows, cols, nkv_len - nqo_len, nkv_len, qk_scale,
                nmask_from, CAUSAL, p_layout, dtype, BLOCK_N,
            )  # fmt: skip
            _epilogue(acc, m_i, l_i, rows, q_start, qo_len, head, o_ptr, lse_ptr, stride_o,
                      stride_oh, stride_lse, RETURN_LSE, o_layout, dtype)  # fmt: skip
            acc = gl.zeros([SUB_M, D], gl.float32, layout=o_layout)
            head = nhead
            q_start = nq_start
            qo_len = nqo_len
            kv_len = nkv_len
            n_blocks = n_nblocks
            mask_from = nmask_from
            rows = nrows
            m_i = nm_i
            l_i = nl_i
            q_at = nq_at

        # The last item's remaining blocks and epilogue.
        acc, p, m_i, l_i, alpha, ev = _rest_blocks(
            q_smem.index(q_at), k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, turn_wait, turn_signal,
            acc, p, m_i, l_i, alpha, it, ev, n_blocks, rows, cols, kv_len - qo_len, kv_len,
            qk_scale, mask_from, zero, HALF, CAUSAL, PINGPONG, RESCALE_EARLY, o_rows_l,
            p_layout,
        )  # fmt: skip
        mbarrier.arrive(q_empty.index(item % QSTAGES), count=1)
        _finish_item(acc, p, m_i, l_i, alpha, it, n_blocks, ev, v_bufs, v_ready, v_empty,
                     turn_wait, turn_signal, rows, q_start, qo_len, head, o_ptr, lse_ptr,
                     stride_o, stride_oh, stride_lse, HALF, PINGPONG, RESCALE_EARLY,
                     RETURN_LSE, o_layout, dtype)  # fmt: skip

    @gluon.jit
    def _consumer(q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty,
                  turn_wait, turn_signal, o_ptr, lse_ptr, work_ptr, sched_ptr, n_items,
                  SCHEDULED: gl.constexpr, qk_scale, stride_o,
                  stride_oh, stride_lse, HALF: gl.constexpr, HQ: gl.constexpr,
                  CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, PINGPONG: gl.constexpr,
                  RESCALE_EARLY: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
        """One warpgroup: rows HALF * 64 .. + 63 of every work item of the program. With
        PINGPONG the two take turns issuing their MMAs (`turn_wait` / `turn_signal`; HALF 0
        first), so that one's softmax runs while the other's MMAs hold the tensor cores."""
        SUB_M: gl.constexpr = q_smem.shape[1]
        D: gl.constexpr = q_smem.shape[2]
        BLOCK_N: gl.constexpr = k_bufs.shape[1]
        dtype: gl.constexpr = q_smem.dtype
        # The scores' and the output's accumulator layouts: one and the same where
        # BLOCK_N == D (head_dim 128), so that the row statistics' conversions between them
        # vanish there.
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, D, 16]
        )
        rows_l: gl.constexpr = gl.SliceLayout(1, s_layout)
        o_rows_l: gl.constexpr = gl.SliceLayout(1, o_layout)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        q_buf = q_smem.index(HALF)
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        zero = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=s_layout)
        it = 0
        item = 0
        ev = 0  # MMA issue events so far (the turns of PINGPONG)
        first, end, step = _walk(sched_ptr, n_items, SCHEDULED)
        for idx in range(first, end, step):
            w = _item_at(idx, sched_ptr, SCHEDULED)
            head, m0, q_start, qo_len, kv_start, kv_len, n_blocks, mask_from = _item(
                w, work_ptr, HQ, CAUSAL, 2 * SUB_M, BLOCK_N
            )
            delta = kv_len - qo_len
            rows = m0 + HALF * SUB_M + gl.arange(0, SUB_M, layout=rows_l)
            m_i = gl.full([SUB_M], -float("inf"), gl.float32, layout=rows_l)
            l_i = gl.zeros([SUB_M], gl.float32, layout=rows_l)
            acc = gl.zeros([SUB_M, D], gl.float32, layout=o_layout)

            mbarrier.wait(q_bar.index(0), item & 1)
            s, ev = _first_scores(q_buf, k_bufs, k_ready, k_empty, it, ev, zero, turn_wait,
                                  turn_signal, HALF, PINGPONG)  # fmt: skip
            p, m_i, l_i, alpha = _softmax_block(
                s, 0, m_i, l_i, rows, cols, delta, kv_len, qk_scale, mask_from, CAUSAL,
                p_layout, dtype, BLOCK_N,
            )  # fmt: skip
            acc, p, m_i, l_i, alpha, ev = _rest_blocks(
                q_buf, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, turn_wait,
                turn_signal, acc, p, m_i, l_i, alpha, it, ev, n_blocks, rows, cols, delta,
                kv_len, qk_scale, mask_from, zero, HALF, CAUSAL, PINGPONG, RESCALE_EARLY,
                o_rows_l, p_layout,
            )  # fmt: skip
            # Every score MMA of the item is done: the producer may load the next Q.
            mbarrier.arrive(q_empty.index(0), count=1)
            ev = _finish_item(acc, p, m_i, l_i, alpha, it, n_blocks, ev, v_bufs, v_ready,
                              v_empty, turn_wait, turn_signal, rows, q_start, qo_len, head,
                              o_ptr, lse_ptr, stride_o, stride_oh, stride_lse, HALF, PINGPONG,
                              RESCALE_EARLY, RETURN_LSE, o_layout, dtype)  # fmt: skip
            it += n_blocks
            item += 1

    @gluon.jit
    def hopper_prefill_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, work_ptr, sched_ptr,
                              n_items,
                              qk_scale, stride_o, stride_oh, stride_lse, HQ: gl.constexpr,
                              GROUP: gl.constexpr, STAGES: gl.constexpr,
                              CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr,
                              SCHEDULED: gl.constexpr = False,
                              PINGPONG: gl.constexpr = False,
                              RESCALE_EARLY: gl.constexpr = False,
                              CHAINED: gl.constexpr = False, QSTAGES: gl.constexpr = 1,
                              num_warps: gl.constexpr = 4):  # fmt: skip
        """Two consumer warpgroups (num_warps = 4 each) and one producer warp. Q has
        QSTAGES buffers a consumer (2 only with CHAINED)."""
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [2 * QSTAGES] + q_desc.block_type.shape,
                                           q_desc.layout)  # fmt: skip
        k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape,
                                           k_desc.layout)  # fmt: skip
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape,
                                           v_desc.layout)  # fmt: skip
        q_bar = gl.allocate_shared_memory(gl.int64, [QSTAGES, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [QSTAGES, 1], mbarrier.MBarrierLayout())
        turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(QSTAGES):
            mbarrier.init(q_bar.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=2)  # both consumers release it
        mbarrier.init(turns.index(0), count=1)
        mbarrier.init(turns.index(1), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)
            mbarrier.init(v_empty.index(i), count=2)
        if CHAINED:
            gl.warp_specialize(
                [
                    (_consumer_chained, (q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready,
                                         v_ready, k_empty, v_empty, turns.index(0),
                                         turns.index(1), o_ptr, lse_ptr, work_ptr, sched_ptr,
                                         n_items, SCHEDULED, qk_scale, stride_o, stride_oh,
                                         stride_lse, 0, HQ, CAUSAL, RETURN_LSE, PINGPONG,
                                         RESCALE_EARLY, num_warps)),
                    (_consumer_chained, (q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready,
                                         v_ready, k_empty, v_empty, turns.index(1),
                                         turns.index(0), o_ptr, lse_ptr, work_ptr, sched_ptr,
                                         n_items, SCHEDULED, qk_scale, stride_o, stride_oh,
                                         stride_lse, 1, HQ, CAUSAL, RETURN_LSE, PINGPONG,
                                         RESCALE_EARLY, num_warps)),
                    (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty,
                                 k_ready, v_ready, k_empty, v_empty, work_ptr, sched_ptr,
                                 n_items, SCHEDULED, HQ, GROUP, CAUSAL)),
                ],
                [4, 1],
                [240, 24],
            )  # fmt: skip
        else:
            gl.warp_specialize(
                [
                    (_consumer, (q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready,
                                 k_empty, v_empty, turns.index(0), turns.index(1), o_ptr,
                                 lse_ptr, work_ptr, sched_ptr, n_items, SCHEDULED, qk_scale,
                                 stride_o, stride_oh, stride_lse, 0, HQ, CAUSAL, RETURN_LSE,
                                 PINGPONG, RESCALE_EARLY, num_warps)),
                    (_consumer, (q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready,
                                 k_empty, v_empty, turns.index(1), turns.index(0), o_ptr,
                                 lse_ptr, work_ptr, sched_ptr, n_items, SCHEDULED, qk_scale,
                                 stride_o, stride_oh, stride_lse, 1, HQ, CAUSAL, RETURN_LSE,
                                 PINGPONG, RESCALE_EARLY, num_warps)),
                    (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty,
                                 k_ready, v_ready, k_empty, v_empty, work_ptr, sched_ptr,
                                 n_items, SCHEDULED, HQ, GROUP, CAUSAL)),
                ],
                [4, 1],
                [240, 24],
            )  # fmt: skip

    def _descriptor(t: torch.Tensor, rows: int) -> Any:
        """TMA descriptor of [tokens, heads, 128] viewed as [tokens, heads * 128], boxes of
        [rows, 128] (one head)."""
        gl_dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
        d = t.shape[-1]
        layout = gl.NVMMASharedLayout.get_default_for([rows, d], gl_dtype)
        view = t.as_strided((t.shape[0], t.shape[1] * d), (t.stride(0), 1))
        return TensorDescriptor.from_tensor(view, [rows, d], layout)


def launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    plan: Any,
    work: torch.Tensor,
    tactic: HopperTactic,
) -> None:
    """Run the kernel over `work` (plan.work_list(BLOCK_M, block_n(head_dim))); k/v ragged
    [T, Hkv, head_dim] (a paged cache staged by the caller); `supported` checked by the
    caller (the tests call it directly for head dims not yet admitted)."""
    if plan.head_dim not in KERNEL_HEAD_DIMS:
        raise ValueError(f"head_dim {plan.head_dim}: the kernel has {KERNEL_HEAD_DIMS}")
    bn = block_n(plan.head_dim)
    n_items = work.shape[0] * plan.num_qo_heads
    if n_items == 0:
        return
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    grid = (min(n_items, sms),) if tactic.persistent else (n_items,)
    sched = work
    if tactic.walks_schedule:
        key = (plan.num_qo_heads, grid[0], "hopper-snake")
        if key not in plan.works:
            rows = plan.work_rows(BLOCK_M, bn)
            table = snake_schedule(rows, plan.num_qo_heads, grid[0], plan.causal, bn)
            plan.works[key] = torch.from_numpy(table).to(q.device)
        sched = plan.works[key]
    hopper_prefill_kernel[grid](
        _descriptor(q, BLOCK_M // 2), _descriptor(k, bn), _descriptor(v, bn), out,
        lse if lse is not None else out, work, sched, n_items, plan.sm_scale * _LOG2E,
        out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0,
        HQ=plan.num_qo_heads, GROUP=plan.group_size, STAGES=tactic.stages,
        CAUSAL=plan.causal, RETURN_LSE=lse is not None, PINGPONG=tactic.pingpong,
        RESCALE_EARLY=tactic.rescale_early, SCHEDULED=tactic.walks_schedule,
        CHAINED=tactic.chained, QSTAGES=q_stages(plan.head_dim, tactic), num_warps=4,
    )  # fmt: skip


def compile_report(
    causal: bool = True,
    return_lse: bool = True,
    head_dim: int = 128,
    chained: bool = False,
) -> dict[str, Any]:
    """Compile the kernel for sm_90a without a GPU (Gluon, then Triton's bundled ptxas -v):
    {"wgmma": count in the PTX, "ptxas": ptxas's report}. Needs TRITON_INTERPRET unset at
    import (the interpreter replaces the kernel with its own function)."""
    from triton.runtime.jit import mangle_type

    from flashtune.ops.gluon_sm90 import compile_sm90

    q = torch.empty(256, 32, head_dim, dtype=torch.bfloat16)
    k = torch.empty(256, 8, head_dim, dtype=torch.bfloat16)
    sig = {
        "q_desc": mangle_type(_descriptor(q, BLOCK_M // 2)),
        "k_desc": mangle_type(_descriptor(k, block_n(head_dim))),
        "v_desc": mangle_type(_descriptor(k, block_n(head_dim))),
        "o_ptr": "*bf16",
        "lse_ptr": "*fp32",
        "work_ptr": "*i32",
        "sched_ptr": "*i32",
        "n_items": "i32",
        "qk_scale": "fp32",
        "stride_o": "i32",
        "stride_oh": "i32",
        "stride_lse": "i32",
    }
    consts: dict[str, Any] = dict(HQ=32, GROUP=4, STAGES=2, CAUSAL=causal)
    consts.update(RETURN_LSE=return_lse, SCHEDULED=True, RESCALE_EARLY=True, num_warps=4)
    consts.update(CHAINED=chained, QSTAGES=2 if chained and head_dim <= 128 else 1)
    return compile_sm90(hopper_prefill_kernel, sig, consts)

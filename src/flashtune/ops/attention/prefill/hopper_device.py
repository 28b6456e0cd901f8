"""Device functions of the Gluon Hopper prefill (`hopper.py`): a work item's extents, a
program's walk, the online softmax of a block, the TMA producer, the consumers' block loop
and epilogue, used by the consumers in `hopper.py`."""

from __future__ import annotations

from flashtune.ops.gluon_sm90 import (
    HAVE_GLUON,
    coalesced_rows_layout,
    gl,
    gluon,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

__all__: list[str] = []

if HAVE_GLUON:

    @gluon.jit
    def _item(
        w,
        work_ptr,
        HQ: gl.constexpr,
        CAUSAL: gl.constexpr,
        BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr,
    ):
        """Work item w of the plan's work list [items, 8] (request, first token, qo_start,
        qo_len, kv_len, -, KV start in tokens, -) times the heads: its head and extents."""
        tile = w // HQ
        head = w % HQ
        row = work_ptr + tile * 8
        m0 = gl.load(row + 1)
        q_start = gl.load(row + 2)
        qo_len = gl.load(row + 3)
        kv_len = gl.load(row + 4)
        kv_start = gl.load(row + 6)
        delta = kv_len - qo_len  # row i sees keys 0 .. i + delta (bottom-right aligned)
        if CAUSAL:
            n_blocks = gl.cdiv(gl.minimum(kv_len, m0 + BLOCK_M + delta), BLOCK_N)
            # The first block past the tile's first row's limit or the keys' end.
            mask_from = gl.minimum((m0 + delta + 1) // BLOCK_N, kv_len // BLOCK_N)
        else:
            n_blocks = gl.cdiv(kv_len, BLOCK_N)
            mask_from = kv_len // BLOCK_N
        return head, m0, q_start, qo_len, kv_start, kv_len, n_blocks, mask_from

    @gluon.jit
    def _walk(sched_ptr, n_items, SCHEDULED: gl.constexpr):
        """(first, end, step) of this program's walk: its slice of the host's schedule
        (SCHEDULED) or every num_programs-th item."""
        pid = gl.program_id(0)
        if SCHEDULED:
            first = gl.load(sched_ptr + pid)
            end = gl.load(sched_ptr + pid + 1)
            step = 1
        else:
            first = pid
            end = n_items
            step = gl.num_programs(0)
        return first, end, step

    @gluon.jit
    def _item_at(idx, sched_ptr, SCHEDULED: gl.constexpr):
        if SCHEDULED:
            # The item ids follow the num_programs + 1 offsets.
            return gl.load(sched_ptr + gl.num_programs(0) + 1 + idx)
        else:
            return idx

    @gluon.jit
    def _softmax_block(s, j, m_i, l_i, rows, cols, delta, kv_len, qk_scale, mask_from,
                       CAUSAL: gl.constexpr, p_layout: gl.constexpr,
                       p_dtype: gl.constexpr, BLOCK_N: gl.constexpr):  # fmt: skip
        """Online softmax of score block j: (P in the output MMA's A layout, m, l, alpha);
        m and the scores in log2 units (qk_scale carries log2(e))."""
        if j >= mask_from:
            keys = j * BLOCK_N + cols
            ok = keys[None, :] < kv_len
            if CAUSAL:
                ok = ok & (keys[None, :] <= rows[:, None] + delta)
            s = gl.where(ok, s, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        return gl.convert_layout(p.to(p_dtype), p_layout), m_new, l_i, alpha

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready,
                  v_ready, k_empty, v_empty, work_ptr, sched_ptr, n_items,
                  SCHEDULED: gl.constexpr, HQ: gl.constexpr,
                  GROUP: gl.constexpr, CAUSAL: gl.constexpr):  # fmt: skip
        STAGES: gl.constexpr = k_bufs.shape[0]
        QSTAGES: gl.constexpr = q_smem.shape[0] // 2
        SUB_M: gl.constexpr = q_desc.block_type.shape[0]
        D: gl.constexpr = q_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
        it = 0
        item = 0
        first, end, step = _walk(sched_ptr, n_items, SCHEDULED)
        for idx in range(first, end, step):
            w = _item_at(idx, sched_ptr, SCHEDULED)
            head, m0, q_start, qo_len, kv_start, kv_len, n_blocks, mask_from = _item(
                w, work_ptr, HQ, CAUSAL, 2 * SUB_M, BLOCK_N
            )
            kv_col = (head // GROUP) * D
            # A barrier's phase "1" counts as complete before its first completion: the
            # first wait on each `empty` barrier passes.
            qs = item % QSTAGES
            mbarrier.wait(q_empty.index(qs), ((item // QSTAGES) & 1) ^ 1)
            mbarrier.expect(q_bar.index(qs), 2 * q_desc.block_type.nbytes)
            for c in gl.static_range(2):
                tma.async_copy_global_to_shared(
                    q_desc, [q_start + m0 + c * SUB_M, head * D], q_bar.index(qs),
                    q_smem.index(qs * 2 + c),
                )  # fmt: skip
            for j in range(n_blocks):
                s = (it + j) % STAGES
                free = (((it + j) // STAGES) & 1) ^ 1
                mbarrier.wait(k_empty.index(s), free)
                mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(
                    k_desc, [kv_start + j * BLOCK_N, kv_col], k_ready.index(s), k_bufs.index(s)
                )
                mbarrier.wait(v_empty.index(s), free)
                mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(
                    v_desc, [kv_start + j * BLOCK_N, kv_col], v_ready.index(s), v_bufs.index(s)
                )
            it += n_blocks
            item += 1

    @gluon.jit
    def _take_turn(turn_wait, k, PINGPONG: gl.constexpr, FIRST: gl.constexpr):
        """Before a consumer's k-th MMA issue: wait until the other consumer has issued its
        (k-1)-th (FIRST) or its k-th: strict alternation."""
        if PINGPONG:
            if FIRST:
                # A fresh barrier's phase "1" counts as complete: the first turn is free.
                mbarrier.wait(turn_wait, (k & 1) ^ 1)
            else:
                mbarrier.wait(turn_wait, k & 1)

    @gluon.jit
    def _pass_turn(turn_signal, PINGPONG: gl.constexpr):
        if PINGPONG:
            mbarrier.arrive(turn_signal, count=1)

    @gluon.jit
    def _rest_blocks(q_buf, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, turn_wait,
                     turn_signal, acc, p, m_i, l_i, alpha, it, ev, n_blocks, rows, cols, delta,
                     kv_len, qk_scale, mask_from, zero, HALF: gl.constexpr,
                     CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                     RESCALE_EARLY: gl.constexpr, o_rows_l: gl.constexpr,
                     p_layout: gl.constexpr):  # fmt: skip
        """Blocks 1 .. n_blocks - 1 of an item whose block 0 is through its softmax: each
        block's score MMA issued with the previous block's output MMA, its softmax under
        that output MMA. Returns the state before the last block's output MMA."""
        STAGES: gl.constexpr = k_bufs.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.shape[1]
        for j in range(1, n_blocks):
            st = (it + j) % STAGES
            prev = (it + j - 1) % STAGES
            mbarrier.wait(k_ready.index(st), ((it + j) // STAGES) & 1)
            mbarrier.wait(v_ready.index(prev), ((it + j - 1) // STAGES) & 1)
            _take_turn(turn_wait, ev, PINGPONG, HALF == 0)
            s = warpgroup_mma(q_buf, k_bufs.index(st).permute((1, 0)), zero,
                              use_acc=False, is_async=True)  # fmt: skip
            if RESCALE_EARLY:
                # Block j-1's alpha, under block j's score MMA.
                acc = acc * gl.convert_layout(alpha, o_rows_l)[:, None]
            acc = warpgroup_mma(p, v_bufs.index(prev), acc, is_async=True)
            _pass_turn(turn_signal, PINGPONG)
            ev += 1
            p_prev = p
            # In order: with at most one outstanding, block j's scores (issued first)
            # are done while block j-1's output MMA runs under this block's softmax.
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
            mbarrier.arrive(k_empty.index(st), count=1)
            p, m_i, l_i, alpha = _softmax_block(
                s, j, m_i, l_i, rows, cols, delta, kv_len, qk_scale, mask_from, CAUSAL,
                p_layout, q_buf.dtype, BLOCK_N,
            )  # fmt: skip
            acc, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_prev))
            mbarrier.arrive(v_empty.index(prev), count=1)
            if not RESCALE_EARLY:
                acc = acc * gl.convert_layout(alpha, o_rows_l)[:, None]
        return acc, p, m_i, l_i, alpha, ev

    @gluon.jit
    def _epilogue(acc, m_i, l_i, rows, q_start, qo_len, head, o_ptr, lse_ptr, stride_o,
                  stride_oh, stride_lse, RETURN_LSE: gl.constexpr, o_layout: gl.constexpr,
                  dtype: gl.constexpr):  # fmt: skip
        """out = acc / l for the item's rows below qo_len (and its lse, log2 units)."""
        D: gl.constexpr = acc.shape[1]
        o_rows_l: gl.constexpr = gl.SliceLayout(1, o_layout)
        out = (acc / gl.convert_layout(l_i, o_rows_l)[:, None]).to(dtype)
        # Stored from a layout of 16 contiguous bytes a thread, whole rows a warp, not from
        # the MMA's (4-byte pieces of 8 rows a warp instruction, half of each sector):
        # 12-14% faster at 1k-2k tokens a request on an H200, and no spill in the chained
        # consumer (560 B before). The conversion goes through shared memory (16 KB at d128).
        st_l: gl.constexpr = coalesced_rows_layout(D)
        out = gl.convert_layout(out, st_l)
        o_rows = gl.convert_layout(rows, gl.SliceLayout(1, st_l))
        d = gl.arange(0, D, layout=gl.SliceLayout(0, st_l))
        ptrs = o_ptr + (q_start + o_rows)[:, None] * stride_o + head * stride_oh + d[None, :]
        gl.store(ptrs, out, mask=(o_rows < qo_len)[:, None])
        if RETURN_LSE:
            gl.store(lse_ptr + (q_start + rows) * stride_lse + head, m_i + gl.log2(l_i),
                     mask=rows < qo_len)  # fmt: skip

    @gluon.jit
    def _first_scores(q_buf, k_bufs, k_ready, k_empty, it, ev, zero, turn_wait, turn_signal,
                      HALF: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
        """Block 0's scores of an item whose first key block is the ring's `it`-th, issued
        and waited (nothing to overlap them with). Returns (scores, MMA issue events)."""
        STAGES: gl.constexpr = k_bufs.shape[0]
        st = it % STAGES
        mbarrier.wait(k_ready.index(st), (it // STAGES) & 1)
        _take_turn(turn_wait, ev, PINGPONG, HALF == 0)
        s = warpgroup_mma(q_buf, k_bufs.index(st).permute((1, 0)), zero, use_acc=False,
                          is_async=True)  # fmt: skip
        _pass_turn(turn_signal, PINGPONG)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        mbarrier.arrive(k_empty.index(st), count=1)
        return s, ev + 1

    @gluon.jit
    def _finish_item(acc, p, m_i, l_i, alpha, it, n_blocks, ev, v_bufs, v_ready, v_empty,
                     turn_wait, turn_signal, rows, q_start, qo_len, head, o_ptr, lse_ptr,
                     stride_o, stride_oh, stride_lse, HALF: gl.constexpr,
                     PINGPONG: gl.constexpr, RESCALE_EARLY: gl.constexpr,
                     RETURN_LSE: gl.constexpr, o_layout: gl.constexpr,
                     dtype: gl.constexpr):  # fmt: skip
        """An item's last output MMA (its key blocks are the ring's `it`-th on) and its
        epilogue. Returns the MMA issue events."""
        STAGES: gl.constexpr = v_bufs.shape[0]
        last = (it + n_blocks - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((it + n_blocks - 1) // STAGES) & 1)
        if RESCALE_EARLY:
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        _take_turn(turn_wait, ev, PINGPONG, HALF == 0)
        acc = warpgroup_mma(p, v_bufs.index(last), acc, is_async=True)
        _pass_turn(turn_signal, PINGPONG)
        acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
        mbarrier.arrive(v_empty.index(last), count=1)
        _epilogue(acc, m_i, l_i, rows, q_start, qo_len, head, o_ptr, lse_ptr, stride_o,
                  stride_oh, stride_lse, RETURN_LSE, o_layout, dtype)  # fmt: skip
        return ev + 1

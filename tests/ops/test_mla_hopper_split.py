"""Split-KV of the Gluon MLA kernel (ops/mla/hopper_split.py) on the CPU: the chunked work list
against its definition (every tile's key blocks once, partial rows written once, merge rows
that read exactly those), and an end-to-end emulation of the SPLIT build's items (o / l and
the base-2 lse of each chunk, in float64) through the real merge (`merge_partials`, in the
interpreter) against the MLA reference. The kernel itself runs in tests/ops/test_mla_hopper.py
(cuda)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_mla import DC, DP, _cumsum

from flashtune.ops.attention.merge import merge_partials
from flashtune.ops.mla import hopper, hopper_split, mla_paged_ref

CASES = [
    # (qo_lens, kv_lens): decode, MTP, a prefix, an empty request, odd lengths
    ([1, 1, 1], [700, 64, 1]),
    ([2, 4, 0, 3], [300, 129, 5, 64]),
    ([37, 1, 5], [1000, 9, 200]),
]


def _written(work, heads):
    """{(token, head): [(first key block, blocks, partial row or -1)]} of a work list."""
    seen: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for q_row0, m0, qo, _, _, n, kb0, prow in work.tolist():
        for r in range(64):
            if m0 + r >= qo * heads:
                break
            tok, h = (q_row0 + m0 + r) // heads, (q_row0 + m0 + r) % heads
            seen.setdefault((tok, h), []).append((kb0, n, prow + r if prow >= 0 else -1))
    return seen


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("heads", [16, 32, 64, 128, 3])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_split_covers_each_key_block_once_and_the_merge_reads_what_was_written(
    case, heads, causal, chunk
):
    qo_lens, kv_lens = case
    if causal and any(q > k for q, k in zip(qo_lens, kv_lens, strict=True)):
        pytest.skip("causal needs kv >= qo")
    qo_indptr = _cumsum(qo_lens).numpy()
    whole = hopper.work_items(qo_indptr, np.array(kv_lens), heads, causal)
    work, merge, slots = hopper_split.split_work(whole, qo_indptr, heads, chunk)
    assert (np.diff(work[:, 5]) <= 0).all()  # heaviest first
    tiles = {(int(w[0]), int(w[1])): int(w[5]) for w in whole}
    chunks: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for w in work:
        chunks.setdefault((int(w[0]), int(w[1])), []).append((int(w[6]), int(w[5])))
    assert chunks.keys() == tiles.keys()
    for key, parts in chunks.items():
        blocks = sorted(b for kb0, n in parts for b in range(kb0, kb0 + n))
        assert blocks == list(range(tiles[key])), key  # every key block once
    if not hopper_split.can_split(heads):
        assert (work[:, 7] == -1).all() and slots == 0 and not merge.any()
        return
    rows = [p for parts in _written(work, heads).values() for _, _, p in parts if p >= 0]
    assert len(rows) == len(set(rows)) and all(0 <= p < slots * heads for p in rows)
    for (tok, h), parts in _written(work, heads).items():
        first, count, stride = merge[tok].tolist()
        if len(parts) == 1 and parts[0][2] == -1:
            assert count == 0  # a whole tile writes the output itself
            continue
        assert count == len(parts)
        read = sorted((first + i * stride) * heads + h for i in range(count))
        assert read == sorted(p for _, _, p in parts)


def _emulate(work, q_nope, q_pe, ckv, kpe, sm_scale, causal, out, lse, po, plse):
    """What the SPLIT build computes per item, in float64 (base-2 lse, o / l; a row with no
    key in its chunk: o = 0, lse = -inf)."""
    heads = q_nope.shape[1]
    for q_row0, m0, qo, kv_start, kv_len, n, kb0, prow in work.tolist():
        r = torch.arange(min(64, qo * heads - m0))
        tok, h = (q_row0 + m0 + r) // heads, (q_row0 + m0 + r) % heads
        lo, hi = kb0 * 64, min((kb0 + n) * 64, kv_len)
        keys = torch.arange(lo, hi)
        s = q_nope[tok, h] @ ckv[kv_start + keys].T + q_pe[tok, h] @ kpe[kv_start + keys].T
        s = s * sm_scale / math.log(2)
        if causal:
            limit = (m0 + r) // heads + kv_len - qo
            s = s.masked_fill(keys[None, :] > limit[:, None], -math.inf)
        m = s.max(1).values
        p = torch.exp2(s - torch.where(m == -math.inf, 0.0, m)[:, None])
        total = p.sum(1)
        o = torch.where(total[:, None] > 0, (p @ ckv[kv_start + keys]) / total[:, None], 0.0)
        ls = torch.where(total > 0, m + torch.log2(total), -math.inf)
        if prow < 0:
            out[tok, h], lse[tok, h] = o, ls
        else:
            po.view(-1, DC)[prow + r], plse.view(-1)[prow + r] = o, ls


# 128 heads at decode only: the merge runs one interpreted program per (token, head).
@pytest.mark.parametrize(("case", "heads"), [*[(c, 16) for c in CASES], (CASES[0], 128)])
@pytest.mark.parametrize("causal", [True, False])
def test_split_items_merged_match_the_reference(case, heads, causal):
    qo_lens, kv_lens = case
    if causal and any(q > k for q, k in zip(qo_lens, kv_lens, strict=True)):
        pytest.skip("causal needs kv >= qo")
    torch.manual_seed(0)
    qo_indptr = _cumsum(qo_lens)
    total, nkv = sum(qo_lens), sum(kv_lens)
    q_nope = torch.randn(total, heads, DC, dtype=torch.float64)
    q_pe = torch.randn(total, heads, DP, dtype=torch.float64)
    ckv, kpe = torch.randn(nkv, DC, dtype=torch.float64), torch.randn(nkv, DP, dtype=torch.float64)
    whole = hopper.work_items(qo_indptr.numpy(), np.array(kv_lens), heads, causal)
    work, merge, slots = hopper_split.split_work(whole, qo_indptr.numpy(), heads, 2)
    assert slots > 0
    sm_scale = 1 / math.sqrt(DC + DP)
    out = torch.full((total, heads, DC), math.nan, dtype=torch.float64)
    lse = torch.full((total, heads), math.nan, dtype=torch.float64)
    po = torch.full((slots, heads, DC), math.nan, dtype=torch.float64)
    plse = torch.full((slots, heads), math.nan, dtype=torch.float64)
    _emulate(work, q_nope, q_pe, ckv, kpe, sm_scale, causal, out, lse, po, plse)
    out32, lse32 = out.float(), lse.float()
    merge_partials(po.float(), plse.float(), torch.from_numpy(merge), out32, lse32, sm_count=2)
    # The reference over a page table of page size 1 in staging order.
    kv_indptr = _cumsum(kv_lens)
    ref_o, ref_lse = mla_paged_ref(
        q_nope.float(), q_pe.float(), ckv.float()[:, None], kpe.float()[:, None], kv_indptr,
        torch.arange(nkv, dtype=torch.int32), sm_scale, qo_indptr=qo_indptr,
        kv_len_arr=torch.tensor(kv_lens, dtype=torch.int32), causal=causal,
    )  # fmt: skip
    torch.testing.assert_close(out32, ref_o.float(), atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(lse32, ref_lse.float(), atol=2e-4, rtol=2e-4)


def test_chunk_size_aims_at_two_items_an_sm():
    work = hopper.work_items(_cumsum([1] * 16).numpy(), np.array([1024] * 16), 16, True)
    assert hopper_split.chunk_blocks_for(work, 132) == hopper_split.MIN_CHUNK_BLOCKS
    work = hopper.work_items(_cumsum([1]).numpy(), np.array([32768]), 16, True)
    assert hopper_split.chunk_blocks_for(work, 132) == 2  # 512 blocks over 264 items
    many = hopper.work_items(_cumsum([4096]).numpy(), np.array([4096]), 16, True)
    assert hopper_split.chunk_blocks_for(many, 132) == many[:, 5].max()  # no split
    with pytest.raises(ValueError, match="chunk_blocks"):
        hopper_split.split_work(work, _cumsum([1]).numpy(), 16, 0)

"""merge_state / merge_state_in_place / merge_states against the float64 reference."""

from __future__ import annotations

import pytest
import torch

from flashtune.ops.attention import (
    batch_decode_ref,
    merge_state,
    merge_state_in_place,
    merge_state_ref,
    merge_states,
    merge_states_ref,
)

TOL = {torch.float16: (2e-3, 2e-3), torch.float32: (1e-5, 1e-5)}


def _state(seq, h, d, dtype, device, n=None):
    shape = (seq, h) if n is None else (seq, n, h)
    v = torch.randn(*shape, d, dtype=dtype, device=device)
    s = torch.randn(*shape, dtype=torch.float32, device=device) * 4
    return v, s


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("seq,h,d", [(5, 3, 64), (1, 8, 128), (7, 2, 96)])
def test_merge_state(seq, h, d, dtype, device):
    v_a, s_a = _state(seq, h, d, dtype, device)
    v_b, s_b = _state(seq, h, d, dtype, device)
    s_b[0, 0] = float("-inf")  # an empty state carries no weight
    v, s = merge_state(v_a, s_a, v_b, s_b)
    rv, rs = merge_state_ref(v_a, s_a, v_b, s_b)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(v, rv, atol=atol, rtol=rtol)
    torch.testing.assert_close(s, rs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v[0, 0], v_a[0, 0], atol=atol, rtol=rtol)


def test_merge_state_all_empty_gives_zero_and_minus_inf(device):
    v_a, s_a = _state(2, 2, 64, torch.float16, device)
    v_b, s_b = _state(2, 2, 64, torch.float16, device)
    s_a[1] = s_b[1] = float("-inf")
    v, s = merge_state(v_a, s_a, v_b, s_b)
    assert torch.all(v[1] == 0) and torch.all(s[1] == float("-inf"))
    assert torch.isfinite(v).all()


@pytest.mark.parametrize("use_mask", [False, True])
def test_merge_state_in_place(use_mask, device):
    v, s = _state(6, 4, 64, torch.float16, device)
    v_o, s_o = _state(6, 4, 64, torch.float16, device)
    mask = torch.tensor([True, False, True, True, False, True], device=device) if use_mask else None
    rv, rs = merge_state_ref(v, s, v_o, s_o)
    if use_mask:
        rv = torch.where(mask[:, None, None], rv, v)
        rs = torch.where(mask[:, None], rs, s)
    merge_state_in_place(v, s, v_o, s_o, mask=mask)
    torch.testing.assert_close(v, rv, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(s, rs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 3, 7])
def test_merge_states(n, device):
    v, s = _state(5, 3, 64, torch.float16, device, n=n)
    s[2, :, 1] = float("-inf")
    out_v, out_s = merge_states(v, s)
    rv, rs = merge_states_ref(v, s)
    torch.testing.assert_close(out_v, rv, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(out_s, rs, atol=1e-5, rtol=1e-5)
    assert torch.all(out_s[2, 1] == float("-inf")) and torch.all(out_v[2, 1] == 0)


def test_merging_split_attention_equals_full_attention(device):
    """Attention over two halves of the KV, merged, equals attention over all of it."""
    kv_len, hq, hk, d = 50, 4, 2, 64
    q = torch.randn(1, hq, d, dtype=torch.float32, device=device)
    k = torch.randn(kv_len, 1, hk, d, dtype=torch.float32, device=device)
    v = torch.randn(kv_len, 1, hk, d, dtype=torch.float32, device=device)

    def part(lo, hi):
        idx = torch.arange(lo, hi, dtype=torch.int32, device=device)
        indptr = torch.tensor([0, hi - lo], device=device)
        return batch_decode_ref(q, k, v, indptr, idx, torch.ones(1, device=device))

    full_v, full_s = part(0, kv_len)
    (a_v, a_s), (b_v, b_s) = part(0, 17), part(17, kv_len)
    m_v, m_s = merge_state(a_v, a_s, b_v, b_s)
    torch.testing.assert_close(m_v, full_v, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m_s, full_s, atol=1e-5, rtol=1e-5)


def test_merge_bad_input(device):
    v, s = _state(3, 2, 64, torch.float16, device)
    with pytest.raises(ValueError, match="s_a"):
        merge_state(v, s[:, :1], v, s)
    with pytest.raises(TypeError, match="float32"):
        merge_state(v, s.half(), v, s)
    with pytest.raises(ValueError, match="v_b shape"):
        merge_state(v, s, v[:2], s[:2])
    with pytest.raises(ValueError, match="mask"):
        merge_state_in_place(v, s, v, s, mask=torch.ones(2, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match="4-D"):
        merge_states(v, s)


@pytest.mark.parametrize("sm_count,d", [(2, 64), (132, 64), (132, 96)])
def test_merge_partials_head_dim_split(sm_count, d, device):
    """The split-KV merge, with head_dim split over CTAs (few rows) or not, and one or
    several steps of partials (merge_tiles: 4 or 32 a step); rows with count 0 are left
    untouched."""
    from flashtune.ops.attention.merge import merge_partials

    h, counts = 3, [3, 0, 1, 37]
    rows = sum(counts)
    po = torch.randn(rows, h, d, device=device)
    plse = torch.randn(rows, h, device=device) * 4
    plse[0, 1] = -float("inf")  # an empty chunk carries no weight
    info, first = [], 0
    for c in counts:
        info.append((first, c, 1))
        first += c
    info = torch.tensor(info, dtype=torch.int32, device=device)
    out = torch.randn(len(counts), h, d, device=device)
    lse = torch.randn(len(counts), h, device=device)
    out0, lse0 = out.clone(), lse.clone()
    merge_partials(po, plse, info, out, lse, sm_count=sm_count)
    first = 0
    for t, c in enumerate(counts):
        if c == 0:
            torch.testing.assert_close(out[t], out0[t])
            torch.testing.assert_close(lse[t], lse0[t])
        else:
            ref_v, ref_s = merge_states_ref(
                po[None, first : first + c], plse[None, first : first + c]
            )
            torch.testing.assert_close(out[t], ref_v[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(lse[t], ref_s[0], atol=1e-5, rtol=1e-5)
        first += c


def test_the_fused_merge_is_tried_only_over_a_few_chunks_a_tile():
    """The fused merge's last arrival merges every chunk of its tile alone: the tuner times
    it where some tile is split into at most ArrivalCounters.MAX_SPLITS chunks, not where
    nothing is split (it would be the plain kernel again) nor where one long request is cut
    over all SMs (91 us against 20 for MLA at b1 x 16k on an H200)."""
    import numpy as np

    from flashtune.ops.attention.merge import ArrivalCounters
    from flashtune.ops.attention.scheduler import plan_work

    def merge_info(kv_lens: list[int], ctas: int) -> np.ndarray:
        pages = np.concatenate([[0], np.cumsum([-(-n // 64) for n in kv_lens])])
        qo = np.arange(len(kv_lens) + 1)
        return plan_work(qo, kv_lens, pages, ctas, block_m=16).merge_info

    one_long = merge_info([16384], 132)
    assert one_long[:, 1].max() > ArrivalCounters.MAX_SPLITS
    assert not ArrivalCounters.worth_trying(one_long)
    few = merge_info([1024 + 7 * i for i in range(64)], 132)  # b64 x ~1k: 2-3 chunks a tile
    assert 1 < few[:, 1].max() <= ArrivalCounters.MAX_SPLITS
    assert ArrivalCounters.worth_trying(few)
    unsplit = merge_info([300] * 200, 132)
    assert unsplit[:, 1].max() <= 1 and not ArrivalCounters.worth_trying(unsplit)
    assert not ArrivalCounters.worth_trying(np.zeros((0, 3), dtype=np.int32))

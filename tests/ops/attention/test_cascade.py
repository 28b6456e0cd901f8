"""Multi-level cascade attention against attention over the concatenated page table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashtune.ops.attention import MultiLevelCascadeAttentionWrapper, paged_attention_ref
from flashtune.ops.attention.page import split_kv_cache
from flashtune.ops.attention.variant import AttentionVariant

I32 = torch.int32


def _t(xs, device):
    return torch.tensor(xs, dtype=I32, device=device)


def _run_case(levels, qo_lens, hq, hk, d, ps, layout, causal, device, num_pages):
    """levels: per level, a list of (qo request ids, page list, last_page_len) entries."""
    total_qo = sum(qo_lens)
    shape = (num_pages, 2, ps, hk, d) if layout == "NHD" else (num_pages, 2, hk, ps, d)
    cache = torch.randn(shape, dtype=torch.float16, device=device)
    q = torch.randn(total_qo, hq, d, dtype=torch.float16, device=device)
    q_off = [0]
    for n in qo_lens:
        q_off.append(q_off[-1] + n)
    qo_arr, ip_arr, idx_arr, last_arr = [], [], [], []
    full_pages = [[] for _ in qo_lens]
    full_last = [0] * len(qo_lens)
    for level in levels:
        qo_ip, ip, idx, last = [0], [0], [], []
        for reqs, pages, lp in level:
            qo_ip.append(q_off[reqs[-1] + 1])
            idx += pages
            ip.append(len(idx))
            last.append(lp)
            for r in reqs:
                full_pages[r] += pages
                full_last[r] = lp
        qo_arr.append(_t(qo_ip, device))
        ip_arr.append(_t(ip, device))
        idx_arr.append(_t(idx, device))
        last_arr.append(_t(last, device))
    ws = torch.empty(2**24, dtype=torch.uint8, device=device)
    w = MultiLevelCascadeAttentionWrapper(len(levels), ws, layout)
    w.plan(
        qo_arr, ip_arr, idx_arr, last_arr, hq, hk, d, ps, causal=causal, q_data_type=torch.float16
    )
    out = w.run(q, cache)
    k, v = split_kv_cache(cache, layout)
    full_ip = [0]
    for p in full_pages:
        full_ip.append(full_ip[-1] + len(p))
    ref, _ = paged_attention_ref(
        q,
        k,
        v,
        _t(q_off, device),
        _t(full_ip, device),
        _t(sum(full_pages, []), device),
        _t(full_last, device),
        AttentionVariant(causal=causal),
    )
    torch.testing.assert_close(out, ref, atol=3e-3, rtol=3e-3)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_two_level_decode(layout, device):
    # 5 requests share 3 full pages; each has its own 0..2 pages of suffix.
    ps = 8
    shared = [(list(range(5)), [10, 3, 7], ps)]
    own = [([0], [1], 3), ([1], [2, 4], 8), ([2], [5], 1), ([3], [6, 8], 5), ([4], [9], 8)]
    _run_case([shared, own], [1] * 5, 8, 2, 64, ps, layout, False, device, 12)


def test_three_level_decode_with_group_5(device):
    ps = 4
    l0 = [(list(range(6)), [0, 1], ps)]
    l1 = [([0, 1, 2], [2, 3], ps), ([3, 4, 5], [4], ps)]
    l2 = [([i], [5 + i], 1 + i % 4) for i in range(6)]
    _run_case([l0, l1, l2], [1] * 6, 10, 2, 64, ps, "NHD", False, device, 12)


def test_multi_query_levels(device):
    """Several query tokens per request (a small prefill), non-causal and causal."""
    ps = 8
    shared = [([0, 1], [0, 1], ps)]
    own = [([0], [2, 3], 5), ([1], [4], 6)]
    _run_case([shared, own], [3, 4], 8, 2, 64, ps, "NHD", False, device, 6)
    # One level: causal batch attention with bottom-right aligned queries.
    _run_case([[([0], [0, 1], 5), ([1], [2], 6)]], [3, 4], 8, 2, 64, ps, "NHD", True, device, 4)


def test_cascade_bad_input(device):
    ws = torch.empty(2**20, dtype=torch.uint8, device=device)
    w = MultiLevelCascadeAttentionWrapper(2, ws)
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(torch.randn(1, 8, 64, device=device), torch.randn(1, 2, 8, 2, 64, device=device))
    one = [_t([0, 1], device)]
    with pytest.raises(ValueError, match="list of 2"):
        w.plan(one, one, one, one, 8, 2, 64, 8)
    with pytest.raises(ValueError, match="every level"):
        w.plan(
            [_t([0, 2], device), _t([0, 1, 3], device)],
            [_t([0, 1], device), _t([0, 1, 2], device)],
            [_t([0], device), _t([1, 2], device)],
            [_t([8], device), _t([1, 1], device)],
            8,
            2,
            64,
            8,
        )
    with pytest.raises(NotImplementedError):
        MultiLevelCascadeAttentionWrapper(2, ws, use_cuda_graph=True)


def test_causal_level_with_more_queries_than_keys(device):
    # One level, so the cascade is plain causal attention: requests 0 and 2 have more
    # queries than keys (bottom-right alignment: their first rows see no key, output 0).
    ps = 4
    level = [([0], [0], 3), ([1], [1, 2, 3], 2), ([2], [4], 1)]
    _run_case([level], [6, 5, 2], 8, 2, 64, ps, "NHD", True, device, 5)


@pytest.mark.parametrize("stage", ["decode", "append"])
@pytest.mark.parametrize("batch,unique_len", [(12, 37), (17, 17), (17, 37)])
@pytest.mark.parametrize("shared_len,heads,head_dim", [(512, 16, 256), (2048, 16, 128)])
def test_flashinfer_shared_prefix_levels_fit_their_half_of_32_mb(
    stage, batch, unique_len, shared_len, heads, head_dim
):
    # FlashInfer's test_shared_prefix_kernels gives the cascade 32 MB for 2 levels; planned
    # for an H100 (132 SMs), the shared level of these shapes once asked for 19-52 MB of
    # partial outputs. Every level must plan in its 16 MB (plan only: no kernel runs).
    from flashtune.ops.attention.decode.config import DecodeLaunch
    from flashtune.ops.attention.decode.plan import DecodeSpec, Planner

    qo_len = unique_len if stage == "append" else 1
    ws = torch.empty(16 * 2**20, dtype=torch.uint8)
    shared_qo = np.array([0, batch * qo_len])
    own_qo = np.arange(batch + 1) * qo_len
    own_pages = -(-unique_len // 16)
    levels = [
        (shared_qo, [0, shared_len // 16], list(range(shared_len // 16)), [16]),
        (
            own_qo,
            list(range(0, (batch + 1) * own_pages, own_pages)),
            list(range(batch * own_pages)),
            [(unique_len - 1) % 16 + 1] * batch,
        ),
    ]
    for qo, indptr, indices, last in levels:
        planner = Planner(ws, False, None, None, None)
        spec = DecodeSpec(
            num_qo_heads=heads,
            num_kv_heads=heads,
            head_dim=head_dim,
            page_size=16,
            q_dtype=torch.float16,
            kv_dtype=torch.float16,
        )
        plan = planner.make(qo, indptr, indices, last, spec, launch=DecodeLaunch(sm_count=132))
        assert plan.host.num_partial_rows <= plan.partial_o.shape[0]

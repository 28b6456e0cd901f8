"""paged_decode (device-scheduled split, no plan) against the float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from flashtune.ops.attention import batch_decode_ref, split_kv_cache
from flashtune.ops.attention.decode import plan_free as decode_plan_free
from flashtune.ops.attention.decode.config import DecodeLaunch, launch_shape
from flashtune.ops.attention.decode.plan_free import paged_decode
from flashtune.ops.attention.page import build_page_table
from flashtune.platform import STAND_IN_LIMITS

TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _inputs(lens, hq, hk, d, page_size, layout, dtype, device, five_d=True):
    indptr, indices, last, num_pages = build_page_table(lens, page_size, extra_pages=2)
    shape = (page_size, hk, d) if layout == "NHD" else (hk, page_size, d)
    if five_d:
        cache = torch.randn(num_pages, 2, *shape, dtype=dtype, device=device)
    else:
        cache = tuple(torch.randn(num_pages, *shape, dtype=dtype, device=device) for _ in "kv")
    q = torch.randn(len(lens), hq, d, dtype=dtype, device=device)
    table = tuple(t.to(device) for t in (indptr, indices, last))
    return q, cache, table


def _check(lens, hq, hk, d, page_size, layout, device, dtype=torch.float16, five_d=True, **kw):
    q, cache, table = _inputs(lens, hq, hk, d, page_size, layout, dtype, device, five_d)
    out, lse = paged_decode(q, cache, *table, kv_layout=layout, return_lse=True, **kw)
    k, v = split_kv_cache(cache, layout)
    ref_o, ref_lse = batch_decode_ref(q, k, v, *table, **kw)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, ref_o, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3 if dtype == torch.float16 else 1e-2, rtol=0)


CASES = [
    # lens, hq, hk, d, page_size, layout
    ([0, 1, 37, 100, 16], 8, 2, 64, 16, "NHD"),
    ([0, 1, 37, 100, 16], 8, 2, 64, 16, "HND"),
    ([300], 4, 4, 64, 1, "NHD"),  # one long request: split over many programs
    ([33, 7], 10, 2, 64, 4, "HND"),  # group 5
    ([33, 0, 70], 12, 2, 128, 16, "NHD"),  # group 6
    ([65, 3], 16, 2, 64, 5, "NHD"),  # group 8, odd page size
    ([0], 4, 1, 64, 16, "NHD"),  # only an empty request
]


@pytest.mark.parametrize("lens,hq,hk,d,page_size,layout", CASES)
def test_paged_decode_matches_reference(lens, hq, hk, d, page_size, layout, device):
    _check(lens, hq, hk, d, page_size, layout, device)


@pytest.mark.parametrize(
    "kw", [dict(window_left=20), dict(window_left=0), dict(logits_soft_cap=5.0), dict(sm_scale=0.3)]
)
def test_paged_decode_variants(kw, device):
    _check([0, 90, 7, 130], 8, 2, 64, 16, "NHD", device, five_d=False, **kw)


# ~3 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
@pytest.mark.slow
def test_request_search_spans_several_steps(device, monkeypatch):
    # More requests than one step of the in-kernel search scans (BLOCK_B set to 16).
    monkeypatch.setattr(decode_plan_free, "_SEARCH_BLOCKS", (16, 16))
    lens = [int(x) for x in torch.randint(0, 90, (37,))]
    lens[5] = 400  # one long request among short ones: split, merged
    _check(lens, 4, 1, 64, 16, "NHD", device)


def test_chunking_splits_a_long_request_and_fills_the_rounds():
    h100 = DecodeLaunch(sm_count=132)  # plan as on an H100/H200
    dev = torch.device("cpu")
    chunk, programs = decode_plan_free.chunk_tokens(1, 32768, 8, 128, 4, dev, h100)
    assert chunk % 16 == 0 and programs == -(-32768 // chunk) + 1
    assert programs > 32  # batch 1: the request is spread over many programs
    slots, _ = launch_shape(132, STAND_IN_LIMITS.shared_memory_per_block, 128, 16, 16, 8)
    for batch, kv in ((64, 32768), (256, 8192), (64, 2048), (16, 8192)):
        chunk, programs = decode_plan_free.chunk_tokens(batch, batch * kv, 8, 128, 4, dev, h100)
        assert programs == -(-(batch * kv) // chunk) + batch
        used = batch * -(-kv // chunk)  # programs that do work, per KV head
        rounds = used / slots
        # Equal lengths: the last round of programs is nearly full (a half-empty round
        # would cost as much as a full one).
        assert rounds / math.ceil(rounds) >= 0.85, (batch, kv, chunk, rounds)


def test_bad_inputs_raise_before_any_kernel(device):
    q, cache, (indptr, indices, last) = _inputs([5, 9], 4, 2, 64, 16, "NHD", torch.float16, device)
    with pytest.raises(ValueError, match="batch_size"):
        paged_decode(q[:1], cache, indptr, indices, last)
    with pytest.raises(TypeError, match="kv_indptr must be int32"):
        paged_decode(q, cache, indptr.float(), indices, last)
    with pytest.raises(ValueError, match="head_dim"):
        paged_decode(q[..., :32].contiguous(), cache, indptr, indices, last)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode(q[:, :3].contiguous(), cache, indptr, indices, last)
    with pytest.raises(TypeError, match="dtype"):
        paged_decode(q, cache.float(), indptr, indices, last)
    bad = indices.clone()
    bad[0] = 10_000
    if device.type == "cpu":  # host memory: contents are checked without a sync
        with pytest.raises(ValueError, match="outside the cache"):
            paged_decode(q, cache, indptr, bad, last)
        with pytest.raises(ValueError, match="last_page_len"):
            paged_decode(q, cache, indptr, indices, last * 0 + 17)


@pytest.mark.cuda
def test_paged_decode_bf16_grid_on_gpu():
    dev = torch.device("cuda")
    for lens in ([1, 512, 2048], [32768] + [512] * 63, [0] * 3 + [4096] * 5, [7] * 257):
        for ps in (1, 16, 64):
            _check(lens, 32, 8, 128, ps, "NHD", dev, dtype=torch.bfloat16)
    _check([100, 3000], 8, 1, 256, 16, "HND", dev, dtype=torch.bfloat16)
    _check([100, 3000], 16, 4, 64, 16, "NHD", dev, dtype=torch.bfloat16, window_left=700)


@pytest.mark.cuda
def test_paged_decode_replays_in_a_cuda_graph_with_new_lengths():
    dev = torch.device("cuda")
    ps, hq, hk, d, batch = 16, 32, 8, 128, 8
    max_pages = 8 * 300
    cache = torch.randn(max_pages, 2, ps, hk, d, dtype=torch.bfloat16, device=dev)
    q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device=dev)
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
    indices = torch.randperm(max_pages, device=dev).to(torch.int32)
    last = torch.ones(batch, dtype=torch.int32, device=dev)

    def set_lengths(lens):
        pages = [-(-n // ps) for n in lens]
        indptr.copy_(torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32))
        last.copy_(
            torch.tensor(
                [n - (p - 1) * ps if p else 0 for n, p in zip(lens, pages, strict=True)],
                dtype=torch.int32,
            )
        )

    set_lengths([100] * batch)
    out = torch.empty_like(q)
    paged_decode(q, cache, indptr, indices, last, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode(q, cache, indptr, indices, last, out=out)
    for lens in ([100] * batch, [4000, 1, 0, 300, 2000, 17, 4096, 900], [16] * batch):
        set_lengths(lens)
        graph.replay()
        k, v = split_kv_cache(cache, "NHD")
        ref, _ = batch_decode_ref(q, k, v, indptr, indices, last)
        torch.testing.assert_close(out, ref, atol=1.6e-2, rtol=1.6e-2)

"""The Gluon prefill kernel for Hopper (ops/attention/prefill/hopper.py).

On the CPU: when it declines a call (and why), and an ahead-of-time compile for sm_90a (no
GPU needed) that keeps the kernel building without spills. On an sm_90 GPU (`cuda`): the
wrappers' output and LSE against the float64 reference over ragged and paged batches of odd
lengths, both tactics, fp16 and bf16, and a CUDA-graph replay."""

from __future__ import annotations

import math

import pytest
import torch
from test_prefill import _indptr, _paged_batch

from flashtune.ops.attention.page import split_kv_cache
from flashtune.ops.attention.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    hopper,
)
from flashtune.ops.attention.prefill.launch import HopperPrefillRunner
from flashtune.ops.attention.reference import batch_prefill_paged_ref, batch_prefill_ragged_ref
from flashtune.ops.attention.variant import AttentionVariant
from flashtune.ops.gluon_sm90 import compile_in_subprocess

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _ragged_plan(qo_lens, kv_lens, hq, hkv, d, device, causal=True, **kw):
    w = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    w.plan(_indptr(qo_lens), _indptr(kv_lens), hq, hkv, d, causal=causal, **kw)
    return w


def test_declines_off_hopper_and_says_why(monkeypatch):
    w = _ragged_plan([5], [9], 8, 2, 128, torch.device("cpu"))
    q = torch.randn(5, 8, 128)
    k = torch.randn(9, 2, 128)
    assert hopper.supported(q, k, k, q, w._plan) == "not a CUDA device"
    monkeypatch.setenv("FLASHTUNE_PREFILL_GLUON", "0")
    assert hopper.supported(q, k, k, q, w._plan) == "FLASHTUNE_PREFILL_GLUON=0"
    # Where it declines it offers the tuner nothing.
    inputs = (q, k, k, torch.empty_like(q), None, w._plan)
    assert HopperPrefillRunner().get_valid_tactics(inputs, None) == []


def test_hopper_kernel_compiles_for_sm90_without_spills():
    """An ahead-of-time compile (Gluon, ptxas -v; in a fresh process without the
    interpreter): the two consumer warpgroups at 240 registers and the producer at 24 must
    fit without spilling."""
    if not hopper.HAVE_GLUON:
        pytest.skip("Triton without Gluon")
    reports = compile_in_subprocess(
        "[__import__('flashtune.ops.attention.prefill.hopper', fromlist=['x'])"
        ".compile_report(c, l, d, ch) for c, l, d, ch in "
        "((True, True, 128, False), (False, False, 128, False), (True, True, 64, False), "
        "(True, False, 256, False), (True, True, 128, True), (True, False, 256, True))]"
    )
    # wgmma instructions (m64, k16): per consumer, the score MMA (head_dim / 16 of them) in
    # the first block and the loop, the output MMA (keys / 16) in the loop and the last
    # block; two consumer copies. head_dim 128: 128 keys; 64: 128 keys; 256: 64 keys. The
    # chained consumer has each twice more (the first item's block 0, the block loop of
    # every item but the last and of the last, the boundary, the last output MMA).
    dims = (128, 128, 64, 256, 128, 256)
    keys = (128, 128, 128, 64, 128, 64)
    chained = (False,) * 4 + (True,) * 2
    for rep, d, n, ch in zip(reports, dims, keys, chained, strict=True):
        assert rep["wgmma"] == (4 if ch else 2) * 2 * (d // 16 + n // 16), (d, rep["wgmma"])
        assert rep["rc"] == 0, rep["ptxas"][-2000:]
        # No spill, the chained consumer included since the epilogue stores from a coalesced
        # layout (it spilled 560 B at the item boundary storing from the MMA's layout).
        assert "0 bytes spill stores, 0 bytes spill loads" in rep["ptxas"], rep["ptxas"]
        assert "C7511" not in rep["ptxas"] and "serialized" not in rep["ptxas"], rep["ptxas"]


# ---- sm_90 GPU -------------------------------------------------------------------------------


def _need_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon prefill kernel is for sm_90")


def _check(out, lse, ref_out, ref_lse, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(out.float().cpu(), ref_out.float().cpu(), atol=tol, rtol=tol)
    if lse is not None:
        torch.testing.assert_close(lse.cpu(), ref_lse.float().cpu(), atol=tol, rtol=tol)


# Odd lengths, an empty request, one-token queries, a cached prefix (kv > qo), a request
# of exactly one tile and one of many.
QO = [300, 0, 1, 77, 513, 128, 1]
KV = [300, 64, 900, 1000, 513, 128, 1]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "tactic", [*hopper.HOPPER_TACTICS, hopper.HopperTactic(True, 2, True, True)], ids=str
)
def test_cuda_ragged(dtype, group, causal, tactic):
    _need_hopper()
    hkv, d = 2, 128
    dev = torch.device("cuda")
    w = _ragged_plan(QO, KV, hkv * group, hkv, d, dev, causal=causal, q_data_type=dtype)
    q = torch.randn(sum(QO), hkv * group, d, dtype=dtype, device=dev)
    k = torch.randn(sum(KV), hkv, d, dtype=dtype, device=dev)
    v = torch.randn(sum(KV), hkv, d, dtype=dtype, device=dev)
    out, lse = torch.empty_like(q), torch.empty(sum(QO), hkv * group, device=dev)
    assert hopper.supported(q, k, v, out, w._plan) is None
    work = w._plan.work_list(hopper.BLOCK_M, hopper.block_n(d))
    hopper.launch(q, k, v, out, lse, w._plan, work, tactic)
    ref = batch_prefill_ragged_ref(
        q,
        k,
        v,
        _indptr(QO),
        _indptr(KV),
        AttentionVariant(sm_scale=1 / math.sqrt(d), causal=causal),
        compute_dtype=torch.float64,
    )
    _check(out, lse, *ref, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("causal", [True, False])
def test_cuda_other_head_dims(head_dim, causal):
    """head_dim 64 (128-key blocks) and 256 (64-key blocks), launched directly."""
    _need_hopper()
    dev, dtype, hkv, group = torch.device("cuda"), torch.bfloat16, 2, 4
    w = _ragged_plan(QO, KV, hkv * group, hkv, head_dim, dev, causal=causal, q_data_type=dtype)
    q = torch.randn(sum(QO), hkv * group, head_dim, dtype=dtype, device=dev)
    k = torch.randn(sum(KV), hkv, head_dim, dtype=dtype, device=dev)
    v = torch.randn(sum(KV), hkv, head_dim, dtype=dtype, device=dev)
    out, lse = torch.empty_like(q), torch.empty(sum(QO), hkv * group, device=dev)
    for tactic in hopper.HOPPER_TACTICS:
        work = w._plan.work_list(hopper.BLOCK_M, hopper.block_n(head_dim))
        hopper.launch(q, k, v, out, lse, w._plan, work, tactic)
        ref = batch_prefill_ragged_ref(
            q, k, v, _indptr(QO), _indptr(KV),
            AttentionVariant(sm_scale=1 / math.sqrt(head_dim), causal=causal),
            compute_dtype=torch.float64,
        )  # fmt: skip
        _check(out, lse, *ref, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_cuda_paged_through_the_wrapper(page_size):
    """The wrapper's default (untuned) choice is this kernel; pages shuffled, partial last
    pages, a non-default sm_scale."""
    _need_hopper()
    dev, dtype, hq, hkv, d = torch.device("cuda"), torch.bfloat16, 8, 2, 128
    kv_indptr, perm, last, cache = _paged_batch(QO, KV, hkv, d, page_size, "NHD", dtype, dev)
    q = torch.randn(sum(QO), hq, d, dtype=dtype, device=dev)
    w = BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=dev))
    w.plan(_indptr(QO), kv_indptr, perm, last, hq, hkv, d, page_size, causal=True,
           sm_scale=0.07, q_data_type=dtype)  # fmt: skip
    k, v = split_kv_cache(cache, "NHD")
    assert hopper.supported(q, k, v, q, w._plan) is None
    out, lse = w.run(q, cache, return_lse=True)
    # The untuned choice is this runner's default, which is this kernel here.
    runner_out = HopperPrefillRunner().forward((q, k, v, torch.empty_like(q), None, w._plan), -1)
    torch.testing.assert_close(runner_out, out, atol=0, rtol=0)
    ref = batch_prefill_paged_ref(
        q, k, v, _indptr(QO), kv_indptr, perm, last,
        AttentionVariant(sm_scale=0.07, causal=True), compute_dtype=torch.float64,
    )  # fmt: skip
    _check(out, lse, *ref, dtype)


@pytest.mark.cuda
def test_cuda_graph_replay():
    """Captured in a CUDA graph and replayed on new inputs in the same buffers."""
    _need_hopper()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    qo, kv = [700, 5], [900, 5]
    w = _ragged_plan(qo, kv, 16, 2, 128, dev, q_data_type=dtype)
    q = torch.randn(sum(qo), 16, 128, dtype=dtype, device=dev)
    k = torch.randn(sum(kv), 2, 128, dtype=dtype, device=dev)
    v = torch.randn(sum(kv), 2, 128, dtype=dtype, device=dev)
    out = torch.empty_like(q)
    w.run(q, k, v, out=out)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, k, v, out=out)
    for t in (q, k, v):
        t.copy_(torch.randn_like(t))
    graph.replay()
    ref, _ = batch_prefill_ragged_ref(
        q, k, v, _indptr(qo), _indptr(kv),
        AttentionVariant(sm_scale=1 / math.sqrt(128), causal=True), compute_dtype=torch.float64,
    )  # fmt: skip
    _check(out, None, ref, None, dtype)


@pytest.mark.cuda
def test_cuda_declines_what_it_cannot_run():
    _need_hopper()
    dev = torch.device("cuda")
    q = torch.randn(10, 8, 128, dtype=torch.bfloat16, device=dev)
    k = torch.randn(12, 2, 128, dtype=torch.bfloat16, device=dev)
    # Causal with more queries than keys leaves rows with no key: the Triton kernel's job.
    w = _ragged_plan([10], [4], 8, 2, 128, dev)
    assert "more queries than keys" in hopper.supported(q, k[:4], k[:4], q, w._plan)
    w = _ragged_plan([10], [12], 8, 2, 128, dev, window_left=3)
    assert hopper.supported(q, k, k, q, w._plan) == "not plain attention"
    # fp32 stays with the Triton kernel (wgmma's 16-bit operands).
    q32 = q.float()
    w = _ragged_plan([10], [12], 8, 2, 128, dev, q_data_type=torch.float32)
    assert "16-bit" in hopper.supported(q32, k.float(), k.float(), q32, w._plan)


@pytest.mark.parametrize(
    ("batch", "seq", "expected"),
    [
        (4, 1024, "scheduled, chained"),  # 7.8 items a program of 4.5 blocks
        (1, 4096, "scheduled"),  # 7.8 items of 16.5 blocks
        (4, 2048, "scheduled, chained"),  # 15.5 items of 8.5 blocks
        (1, 8192, "round-robin"),  # 15.5 items of 32.5 blocks
        (16, 1024, "round-robin"),  # 31 items
    ],
)
def test_default_tactic_follows_the_measured_table(batch, seq, expected):
    """Tactic -1 from a plan's items per program and key blocks per item (132 SMs, causal,
    32 heads, 128-row tiles): the A/B table above hopper.pick_tactic."""
    w = _ragged_plan([seq] * batch, [seq] * batch, 32, 8, 128, torch.device("cpu"))
    blocks = hopper.item_blocks(w._plan.work_rows(hopper.BLOCK_M, 128), True, 128)
    t = hopper.pick_tactic(blocks.size * 32 / 132, float(blocks.mean()))
    got = ("scheduled" if t.walks_schedule else "round-robin") + (", chained" if t.chained else "")
    assert got == expected
    assert t in hopper.HOPPER_TACTICS
    # Chaining was measured at head_dim 128 only.
    assert not hopper.pick_tactic(blocks.size * 32 / 132, float(blocks.mean()), 256).chained


@pytest.mark.parametrize(
    ("head_dim", "kv_lens", "triton"),
    [(64, [1024, 2048], True), (64, [300, 5000], False), (128, [1024], False), (256, [64], False)],
)
def test_default_keeps_triton_for_short_head_dim_64(head_dim, kv_lens, triton):
    w = _ragged_plan(kv_lens, kv_lens, 8, 2, head_dim, torch.device("cpu"))
    assert hopper.default_prefers_triton(w._plan) is triton


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("qo_lens", "programs"), [([1024] * 4, 132), ([700, 5, 3000], 7)])
def test_snake_schedule_deals_every_item_once_and_evenly(qo_lens, programs, causal):
    w = _ragged_plan(qo_lens, qo_lens, 8, 2, 128, torch.device("cpu"), causal=causal)
    rows = w._plan.work_rows(hopper.BLOCK_M, 128)
    heads = 8
    table = hopper.snake_schedule(rows, heads, programs, causal)
    offsets, items = table[: programs + 1], table[programs + 1 :]
    assert offsets[0] == 0 and offsets[-1] == len(items) == len(rows) * heads
    assert sorted(items.tolist()) == list(range(len(rows) * heads))
    # Per-program cost (key blocks + 1) against a round-robin deal of the same order.
    t0, qo, kv = rows[:, 1], rows[:, 3], rows[:, 4]
    hi = [min(b, a + 128 + b - c) if causal else b for a, b, c in zip(t0, kv, qo, strict=True)]
    cost = [-(-h // 128) + 1 for h in hi]
    snake = [
        sum(cost[i // heads] for i in items[offsets[p] : offsets[p + 1]]) for p in range(programs)
    ]
    dealt = sorted(range(len(items)), key=lambda i: -cost[i // heads])
    robin = [
        sum(cost[dealt[j] // heads] for j in range(p, len(dealt), programs))
        for p in range(programs)
    ]
    assert max(snake) <= max(robin)
    assert max(snake) - min(snake) <= max(cost) + 1

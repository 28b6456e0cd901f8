"""The Gluon MLA prefill for sm_90 (ops/mla/hopper.py): its work list and staging on the CPU,
a compile for sm_90a on the CPU (no spills, no serialized wgmma, shared memory within the
limit), and on a Hopper GPU the kernel (with and without OVERLAP) against the reference over
odd lengths, a cached prefix, an empty request, page sizes 1 and 64, 16 and 128 heads, causal
or not, with LSE."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_mla import DC, DP, SCALE, _cumsum, _inputs, _table

from flashtune.ops.gluon_sm90 import compile_in_subprocess
from flashtune.ops.mla import BatchMLAPagedAttentionWrapper, hopper, mla_paged_ref

SM90_SHARED_LIMIT = 232448  # bytes of dynamic shared memory a block may have on sm_90


def _work_by_brute_force(qo_lens, kv_lens, heads, causal):
    """(row offset, key blocks) of every 64-row tile of every request, from the definition."""
    out = []
    for qo, kv in zip(qo_lens, kv_lens, strict=True):
        for m0 in range(0, qo * heads, hopper.BLOCK_M):
            rows = range(m0, min(m0 + hopper.BLOCK_M, qo * heads))
            last_key = max((r // heads + kv - qo if causal else kv - 1) for r in rows)
            out.append((m0, -(-(last_key + 1) // hopper.BLOCK_N)))
    return sorted(out)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [16, 128, 3])
def test_work_items_cover_every_row_once(causal, heads):
    qo_lens, kv_lens = [5, 0, 1, 33, 64], [9, 7, 1, 100, 64]
    work = hopper.work_items(_cumsum(qo_lens).numpy(), np.array(kv_lens), heads, causal)
    got = sorted((int(w[1]), int(w[5])) for w in work)
    assert got == _work_by_brute_force(qo_lens, kv_lens, heads, causal)
    assert (np.diff(work[:, 5]) <= 0).all()  # heaviest first
    # Each item names its request's first query row and its keys' place in the staged cache.
    kv_starts = np.concatenate([[0], np.cumsum(kv_lens)[:-1]])
    q_starts = _cumsum(qo_lens).numpy()[:-1]
    for w in work:
        b = [i for i in range(len(qo_lens)) if qo_lens[i] == w[2] and kv_starts[i] == w[3]]
        assert b and w[0] == q_starts[b[0]] * heads and w[4] == kv_lens[b[0]]


@pytest.mark.parametrize("page_size", [1, 64, 5])
def test_stage_gathers_each_request_in_order(page_size):
    kv_lens = [7, 0, 130]
    kv_indptr, kv_indices, _, _, num_pages = _table(kv_lens, page_size, torch.device("cpu"))
    cache = torch.randn(num_pages, page_size, DP)
    flat = hopper.stage(cache, kv_indptr.numpy(), kv_indices, np.array(kv_lens))
    assert flat.shape == (sum(kv_lens), DP)
    row = 0
    for b, n in enumerate(kv_lens):
        pages = kv_indices[kv_indptr[b] : kv_indptr[b + 1]].long()
        expect = cache[pages].reshape(-1, DP)[:n]
        torch.testing.assert_close(flat[row : row + n], expect, rtol=0, atol=0)
        row += n


def test_declines_off_hopper_and_says_why():
    q = torch.randn(4, 16, DC)
    assert hopper.supported(q, q[:, 0], np.array([4]), np.array([4]), True) in (
        "not a CUDA device",
        "this Triton has no Gluon",
    )


def test_compiles_for_sm90_without_spills():
    """Compiled for sm_90a with Triton's bundled ptxas (also the split-KV build): no spill,
    no C7511 (ptxas making
    every wgmma wait for the one before, for want of registers), shared memory within the
    limit, and the wgmma count of the design: the score product once (256 / 16 * 2 latent
    k-steps + 64 / 16 rotary ones = 36) and each warpgroup's output product (64 keys / 16)."""
    if not hopper.HAVE_GLUON:
        pytest.skip("Triton without Gluon")
    reports = compile_in_subprocess(
        "[__import__('flashtune.ops.mla.hopper', fromlist=['x']).compile_report(c, l, h, o, s) "
        "for c, l, h, o, s in ((True, True, 16, False, False), (False, False, 128, False, False), "
        "(True, True, 16, True, False), (True, True, 16, False, True))]"
    )
    # The last: the SPLIT build (chunks of a tile's keys to partial rows, hopper_split.py).
    for rep, overlap in zip(reports, (False, False, True, False), strict=True):
        assert rep["rc"] == 0, rep["ptxas"][-2000:]
        # OVERLAP issues the score MMA once before the block loop and once in it, and has
        # the loop's last block peeled (its output MMA twice).
        assert rep["wgmma"] == (2 * 36 + 2 * 4 + 4 if overlap else 36 + 4 + 4)
        if not overlap:  # OVERLAP spills a few bytes (4 at 16 heads, session 29)
            assert "0 bytes spill stores, 0 bytes spill loads" in rep["ptxas"], rep["ptxas"]
        assert "C751" not in rep["ptxas"] and "serialized" not in rep["ptxas"], rep["ptxas"]
        assert rep["shared"] <= SM90_SHARED_LIMIT


# ---- sm_90 GPU -------------------------------------------------------------------------------


def _need_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon MLA prefill kernel is for sm_90")


def _check(out, lse, inputs, table, qo_indptr, causal):
    """out and lse against mla_paged_ref of inputs (q_nope, q_pe, ckv, kpe) over table
    (kv_indptr, kv_indices, kv_len), at the tolerances of a bf16 kernel."""
    q_nope, q_pe, ckv, kpe = inputs
    kv_indptr, kv_indices, kv_len = table
    ref_out, ref_lse = mla_paged_ref(
        q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE,
        qo_indptr=qo_indptr, kv_len_arr=kv_len, causal=causal,
    )  # fmt: skip
    torch.testing.assert_close(out.float(), ref_out.float(), atol=1.6e-2, rtol=1.6e-2)
    torch.testing.assert_close(lse, ref_lse.float(), atol=1e-3, rtol=1e-3)


# A cached prefix (kv > qo), an empty request, one query token, a request of exactly one
# 64-key block, odd lengths across block and tile edges.
CASES = [([37, 0, 1, 64, 200], [300, 50, 1, 64, 713]), ([129], [129])]


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("overlap", [False, True])
def test_cuda_matches_reference(case, page_size, heads, causal, overlap):
    _need_hopper()
    dev = torch.device("cuda")
    qo_lens, kv_lens = case
    kv_indptr, kv_indices, kv_len, _, num_pages = _table(kv_lens, page_size, dev)
    dtype = torch.bfloat16
    q_nope, q_pe, ckv_cache, kpe_cache = _inputs(
        sum(qo_lens), num_pages, page_size, heads, dtype, dtype, dev
    )
    qo_indptr = _cumsum(qo_lens)
    assert hopper.supported(q_nope, ckv_cache, np.array(qo_lens), np.array(kv_lens), causal) is None
    ckv = hopper.stage(ckv_cache, kv_indptr.cpu().numpy(), kv_indices, np.array(kv_lens))
    kpe = hopper.stage(kpe_cache, kv_indptr.cpu().numpy(), kv_indices, np.array(kv_lens))
    work = hopper.work_items(qo_indptr.numpy(), np.array(kv_lens), heads, causal)
    out = torch.full_like(q_nope, float("nan"))
    lse = torch.full(q_nope.shape[:2], float("nan"), dtype=torch.float32, device=dev)
    hopper.launch(
        q_nope, q_pe, ckv, kpe, out, lse, torch.from_numpy(work).to(dev), SCALE, causal,
        overlap=overlap,
    )  # fmt: skip
    _check(
        out,
        lse,
        (q_nope, q_pe, ckv_cache, kpe_cache),
        (kv_indptr, kv_indices, kv_len),
        qo_indptr.to(dev),
        causal,
    )


@pytest.mark.cuda
def test_cuda_declines_rows_without_keys():
    _need_hopper()
    q = torch.randn(10, 16, DC, dtype=torch.bfloat16, device="cuda")
    why = hopper.supported(q, q[:, 0], np.array([10]), np.array([4]), True)
    assert "more queries than keys" in why
    assert "16-bit" in hopper.supported(
        q.float(), q[:, 0].float(), np.array([1]), np.array([1]), True
    )


def test_runner_in_the_path_once_admitted_and_declines_on_cpu():
    """The wrapper's runners include the Gluon one exactly when hopper.ADMITTED; on the CPU
    it offers nothing (its forward would run the Triton kernel's default)."""
    from flashtune.ops.mla.launch import RUNNERS, MLAHopperPrefillRunner

    assert any(isinstance(r, MLAHopperPrefillRunner) for r in RUNNERS) is hopper.ADMITTED
    q = torch.randn(4, 16, DC)
    w = BatchMLAPagedAttentionWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    kv_indptr, kv_indices, kv_len, _, num_pages = _table([9], 1, torch.device("cpu"))
    w.plan(_cumsum([4]), kv_indptr, kv_indices, kv_len, 16, DC, DP, 1, True, SCALE,
           torch.float16, torch.float16)  # fmt: skip
    plan = w._planner.plan
    lse = torch.empty(4, 16)
    inputs = (q, q[..., :DP], q[:, 0], q[:, 0, :DP], plan, q.clone(), lse)
    assert MLAHopperPrefillRunner().get_valid_tactics(inputs, None) == []


def test_runner_leaves_a_strided_query_to_the_triton_kernel(monkeypatch):
    """q_nope / q_pe sliced out of one fused query tensor (strided rows) do not qualify: the
    kernel reads q through flat row views. (On the CPU, with the device check passed.)"""
    from flashtune.ops.mla.launch import MLAHopperPrefillRunner

    monkeypatch.setattr(hopper, "supported", lambda *a: None)
    kv_indptr, kv_indices, kv_len, _, num_pages = _table([9], 1, torch.device("cpu"))
    w = BatchMLAPagedAttentionWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    w.plan(_cumsum([4]), kv_indptr, kv_indices, kv_len, 16, DC, DP, 1, True, SCALE,
           torch.float16, torch.float16)  # fmt: skip
    plan = w._planner.plan
    fused = torch.randn(4, 16, DC + DP, dtype=torch.float16)
    q_nope, q_pe = fused[..., :DC], fused[..., DC:]
    ckv, kpe = torch.randn(num_pages, 1, DC), torch.randn(num_pages, 1, DP)
    out, lse = torch.empty(4, 16, DC), torch.empty(4, 16)
    runner = MLAHopperPrefillRunner()
    assert not runner.qualifies((q_nope, q_pe, ckv, kpe, plan, out, lse))
    assert runner.qualifies((q_nope.contiguous(), q_pe.contiguous(), ckv, kpe, plan, out, lse))


@pytest.mark.parametrize(
    ("qo_lens", "kv_lens", "sms", "gluon"),
    [
        ([2] * 8, [500] * 8, 132, False),  # MTP: 8 half-empty items for 132 SMs
        ([300, 200], [900, 200], 132, False),  # 125 items
        ([300, 300], [900, 300], 132, True),  # 150 items
        ([300, 200], [900, 200], 100, True),  # the same 125 items on a smaller GPU
    ],
)
def test_default_tactic_takes_gluon_only_where_the_items_fill_the_gpu(
    monkeypatch, qo_lens, kv_lens, sms, gluon
):
    """Tactic -1 runs the Gluon kernel where its work list has an item for every SM and the
    Triton kernel's default elsewhere; tactics 0 and 1 always run the Gluon kernel. (On the
    CPU, with the device checks and both kernels replaced by recorders.)"""
    from flashtune.ops.mla import launch as mla_launch

    calls: list[str] = []
    monkeypatch.setattr(
        mla_launch.MLAHopperPrefillRunner, "qualifies", staticmethod(lambda _: True)
    )
    monkeypatch.setattr(
        mla_launch._TRITON, "forward", lambda inputs, tactic: calls.append("triton")
    )
    monkeypatch.setattr(hopper, "launch", lambda *a, **k: calls.append(f"gluon{int(k['overlap'])}"))
    limits = dataclasses.replace(mla_launch.platform.STAND_IN_LIMITS, sm_count=sms)
    monkeypatch.setattr(mla_launch.platform, "device_limits", lambda device: limits)
    kv_indptr, kv_indices, kv_len, _, num_pages = _table(kv_lens, 1, torch.device("cpu"))
    w = BatchMLAPagedAttentionWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    w.plan(_cumsum(qo_lens), kv_indptr, kv_indices, kv_len, 16, DC, DP, 1, True, SCALE,
           torch.float16, torch.float16)  # fmt: skip
    plan = w._planner.plan
    q_nope, q_pe, ckv, kpe = _inputs(sum(qo_lens), num_pages, 1, 16, torch.float16,
                                     torch.float16, torch.device("cpu"))  # fmt: skip
    lse = torch.empty(q_nope.shape[:2])
    runner = mla_launch.MLAHopperPrefillRunner()
    for tactic in (-1, 0, 1):
        runner.forward((q_nope, q_pe, ckv, kpe, plan, torch.empty_like(q_nope), lse), tactic)
    assert calls == ["gluon0" if gluon else "triton", "gluon0", "gluon1"]


@pytest.mark.cuda
def test_cuda_wrapper_default_runs_gluon_on_a_prefill(monkeypatch):
    """Untuned, the wrapper's own run takes the Gluon kernel at a prefill shape that fills
    the GPU, captured in a CUDA graph at its first call, and matches the reference."""
    _need_hopper()
    dev = torch.device("cuda")
    qo_lens, kv_lens, heads = [1000, 37, 700], [1500, 37, 2011], 16
    kv_indptr, kv_indices, kv_len, _, num_pages = _table(kv_lens, 64, dev)
    dtype = torch.bfloat16
    q_nope, q_pe, ckv, kpe = _inputs(sum(qo_lens), num_pages, 64, heads, dtype, dtype, dev)
    qo_indptr = _cumsum(qo_lens).to(dev)
    launched = []
    real_launch = hopper.launch
    monkeypatch.setattr(
        hopper, "launch", lambda *a, **k: launched.append(1) or real_launch(*a, **k)
    )
    w = BatchMLAPagedAttentionWrapper(torch.empty(1 << 24, dtype=torch.uint8, device=dev))
    w.plan(qo_indptr, kv_indptr, kv_indices, kv_len, heads, DC, DP, 64, True, SCALE,
           dtype, dtype)  # fmt: skip
    # plan() made the kernel's tables (a run needs no host-to-device copy), so the first run
    # can be captured in a CUDA graph.
    assert w._planner.plan.hopper_work is not None and w._planner.plan.hopper_rows is not None
    out = torch.full_like(q_nope, float("nan"))
    lse = torch.full(q_nope.shape[:2], float("nan"), device=dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse)
    graph.replay()
    torch.cuda.synchronize()
    assert launched, "the wrapper's default did not take the Gluon kernel"
    _check(out, lse, (q_nope, q_pe, ckv, kpe), (kv_indptr, kv_indices, kv_len), qo_indptr, True)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("qo_lens", "kv_lens"),
    [
        ([1] * 5, [700, 1, 64, 1000, 129]),
        ([2, 4, 3], [4000, 129, 64]),
        ([37, 0, 200], [300, 50, 713]),
    ],
)
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("causal", [True, False])
def test_cuda_split_tactic_matches_reference(qo_lens, kv_lens, heads, causal):
    """The runner's split-KV tactic (SPLIT build + merge; hopper_split.py) at decode, MTP and
    prefill plans, against the reference, and the work list it kept on the plan split."""
    _need_hopper()
    from flashtune.ops.mla.launch import SPLIT_TACTIC, MLAHopperPrefillRunner

    dev = torch.device("cuda")
    kv_indptr, kv_indices, kv_len, _, num_pages = _table(kv_lens, 64, dev)
    dtype = torch.bfloat16
    q_nope, q_pe, ckv, kpe = _inputs(sum(qo_lens), num_pages, 64, heads, dtype, dtype, dev)
    qo_indptr = _cumsum(qo_lens).to(dev)
    w = BatchMLAPagedAttentionWrapper(torch.empty(1 << 27, dtype=torch.uint8, device=dev))
    w.plan(qo_indptr, kv_indptr, kv_indices, kv_len, heads, DC, DP, 64, causal, SCALE,
           dtype, dtype)  # fmt: skip
    plan = w._planner.plan
    out = torch.full_like(q_nope, float("nan"))
    lse = torch.full(q_nope.shape[:2], float("nan"), device=dev)
    MLAHopperPrefillRunner().forward((q_nope, q_pe, ckv, kpe, plan, out, lse), SPLIT_TACTIC)
    assert plan.hopper_split is not None
    # Split exactly where hopper_split's rule cuts a tile: more key blocks than the chunk
    # sized for about two items an SM (a 128-head prefill has items enough: none is cut).
    from flashtune.ops.mla import hopper_split

    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    work = hopper.work_items(_cumsum(qo_lens).numpy(), np.array(kv_lens), heads, causal)
    cut = bool((work[:, 5] > hopper_split.chunk_blocks_for(work, sms)).any())
    assert bool((plan.hopper_split[0][:, 7] >= 0).any()) == cut
    _check(out, lse, (q_nope, q_pe, ckv, kpe), (kv_indptr, kv_indices, kv_len), qo_indptr, causal)


@pytest.mark.cuda
@pytest.mark.parametrize("page_size", [1, 64])
def test_cuda_runner_through_the_wrapper_plan(page_size):
    """The runner on a wrapper's plan (the path the wrapper takes once admitted): staging,
    the work list kept on the plan, and the result against the reference at the default
    tactic and at each the tuner may pick (0 plain, 1 overlap)."""
    _need_hopper()
    from flashtune.ops.mla.launch import MLAHopperPrefillRunner

    dev = torch.device("cuda")
    qo_lens, kv_lens, heads = [37, 0, 200], [300, 50, 713], 16
    kv_indptr, kv_indices, kv_len, _, num_pages = _table(kv_lens, page_size, dev)
    dtype = torch.bfloat16
    q_nope, q_pe, ckv, kpe = _inputs(sum(qo_lens), num_pages, page_size, heads, dtype, dtype, dev)
    qo_indptr = _cumsum(qo_lens).to(dev)
    w = BatchMLAPagedAttentionWrapper(torch.empty(1 << 24, dtype=torch.uint8, device=dev))
    w.plan(qo_indptr, kv_indptr, kv_indices, kv_len, heads, DC, DP, page_size, True, SCALE,
           dtype, dtype)  # fmt: skip
    plan = w._planner.plan
    ref_out, ref_lse = mla_paged_ref(
        q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE,
        qo_indptr=qo_indptr, kv_len_arr=kv_len, causal=True,
    )  # fmt: skip
    runner = MLAHopperPrefillRunner()
    for tactic in (-1, 0, 1):
        out = torch.full_like(q_nope, float("nan"))
        lse = torch.full(q_nope.shape[:2], float("nan"), device=dev)
        inputs = (q_nope, q_pe, ckv, kpe, plan, out, lse)
        assert runner.get_valid_tactics(inputs, None) == [0, 1]
        runner.forward(inputs, tactic)
        torch.testing.assert_close(out.float(), ref_out.float(), atol=1.6e-2, rtol=1.6e-2)
        torch.testing.assert_close(lse, ref_lse.float(), atol=1e-3, rtol=1e-3)
    assert plan.hopper_work is not None

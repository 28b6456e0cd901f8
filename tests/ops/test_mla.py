"""MLA (paged latent cache) kernels against the reference: the planned wrapper and the
plan-free calls, decode / MTP / prefill with a cached prefix, page sizes 1 and 64, empty
requests, fp8 caches; FlashInfer's run() conventions; CUDA-graph re-planning.

Interpreter tests run the Triton kernels on CPU tensors in float16 (the interpreter's bf16
dot is wrong); the `cuda` tests run bfloat16 on the GPU."""

from __future__ import annotations

import math

import pytest
import torch

from flashtune.ops.mla import (
    BatchMLAPagedAttentionWrapper,
    KVScales,
    MLALaunch,
    MLAOptions,
    MLATactic,
    mla_paged_decode,
    mla_paged_prefill,
    mla_paged_ref,
)

DC, DP = 512, 64
SCALE = 1.0 / math.sqrt(128 + 64)
# Output tolerance per q dtype: the kernels round the probabilities to q's dtype for the
# second MMA; LSE (base 2) within LSE_TOL.
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
LSE_TOL = 1e-3
CPU = torch.device("cpu")
WS_BYTES = 1 << 24


def _cumsum(xs: list[int]) -> torch.Tensor:
    out = torch.zeros(len(xs) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(xs, dtype=torch.int64).cumsum(0).to(torch.int32)
    return out


def _table(kv_lens, page_size, device, extra_pages=3):
    """(kv_indptr, kv_indices, kv_len_arr, kv_last_page_len, num_pages): shuffled pages."""
    pages = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages) + extra_pages
    indices = torch.randperm(num_pages)[: sum(pages)].to(torch.int32)
    last = torch.tensor([(n - 1) % page_size + 1 if n else 0 for n in kv_lens], dtype=torch.int32)
    kv_len = torch.tensor(kv_lens, dtype=torch.int32)
    return (
        _cumsum(pages).to(device),
        indices.to(device),
        kv_len.to(device),
        last.to(device),
        num_pages,
    )


def _inputs(total_q, num_pages, page_size, heads, dtype, kv_dtype, device, d_kpe=DP):
    q_nope = torch.randn(total_q, heads, DC, dtype=dtype, device=device)
    q_pe = torch.randn(total_q, heads, d_kpe, dtype=dtype, device=device)
    ckv = torch.randn(num_pages, page_size, DC, device=device).to(kv_dtype)
    kpe = torch.randn(num_pages, page_size, d_kpe, device=device).to(kv_dtype)
    return q_nope, q_pe, ckv, kpe


def _check(out, lse, ref_out, ref_lse, dtype, tol=None, lse_tol=LSE_TOL):
    tol = TOL[dtype] if tol is None else tol
    torch.testing.assert_close(out.float().cpu(), ref_out.float().cpu(), atol=tol, rtol=tol)
    empty = ref_lse.isinf().cpu()
    assert torch.equal(lse.isinf().cpu(), empty)  # rows that see no key: -inf
    assert torch.equal(out.cpu()[empty], torch.zeros_like(out.cpu()[empty]))  # ... and 0
    torch.testing.assert_close(lse.cpu()[~empty], ref_lse.cpu()[~empty], atol=lse_tol, rtol=0)


def _run_wrapper(qo_lens, kv_lens, page_size, causal, dtype, device, *, heads=16, split=None,
                 kv_dtype=None, run_kwargs=None, launch=None, d_kpe=DP):  # fmt: skip
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    kv_indptr, kv_indices, kv_len, _, num_pages = _table(kv_lens, page_size, device)
    qo_indptr = _cumsum(qo_lens).to(device)
    q_nope, q_pe, ckv, kpe = _inputs(
        sum(qo_lens), num_pages, page_size, heads, dtype, kv_dtype, device, d_kpe
    )
    w = BatchMLAPagedAttentionWrapper(torch.empty(WS_BYTES, dtype=torch.uint8, device=device))
    w.plan(qo_indptr, kv_indptr, kv_indices, kv_len, heads, DC, d_kpe, page_size, causal,
           SCALE, dtype, kv_dtype, fixed_split_size=split, launch=launch)  # fmt: skip
    kwargs = run_kwargs or {}
    out, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True, **kwargs)
    scale_args = {}
    if "kpe_scale" in kwargs:
        ckv_scale = kwargs.get("ckv_scale_arr", kwargs.get("ckv_scale"))
        scale_args["kv_scale"] = (ckv_scale, kwargs["kpe_scale"])
    ref = mla_paged_ref(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE,
                        qo_indptr=qo_indptr, kv_len_arr=kv_len, causal=causal, **scale_args)  # fmt: skip
    return w, out, lse, ref


# (qo_lens, kv_lens, causal): decode with an empty and odd lengths; MTP (several query
# tokens, causal); more queries than keys (the first rows see nothing) next to an empty
# request; non-causal multi-token.
CASES = [
    ([1, 1, 1, 1], [37, 0, 130, 1], True),
    ([2, 4, 1], [65, 9, 3], True),
    ([3, 6, 2], [2, 40, 0], True),
    ([5, 2], [70, 21], False),
]


# A forced split with 32-token tiles: chunks are aligned to the tile, so every case splits.
SPLIT_32 = {"split": 32, "launch": MLALaunch(tactic=MLATactic(32, 4, 2))}


@pytest.mark.interpreter
@pytest.mark.parametrize("split", [None, 32], ids=["auto", "split32"])
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("case", CASES, ids=["decode", "mtp", "qo_gt_kv", "noncausal"])
def test_wrapper_matches_reference(case, page_size, split):
    qo_lens, kv_lens, causal = case
    kwargs = SPLIT_32 if split else {}
    w, out, lse, (ref_out, ref_lse) = _run_wrapper(
        qo_lens, kv_lens, page_size, causal, torch.float16, CPU, **kwargs
    )
    if split:
        assert w._planner.plan.host.has_split  # the merge ran
    _check(out, lse, ref_out, ref_lse, torch.float16)


@pytest.mark.interpreter
def test_causal_prefill_with_prefix_in_tiles():
    # 9 query tokens x 16 heads = 144 rows: several 64-row tiles, planned as causal
    # sub-requests of 4 tokens, each split by the keys its last query sees.
    w, out, lse, (ref_out, ref_lse) = _run_wrapper(
        [9, 1], [50, 33], 1, True, torch.float16, CPU, **SPLIT_32
    )
    assert w._planner.plan.block_m == 64
    _check(out, lse, ref_out, ref_lse, torch.float16)


@pytest.mark.interpreter
# Unsplit runs in the slow step CI also runs (the main suite is near its 10 minutes).
@pytest.mark.parametrize(
    "split", [pytest.param(None, marks=pytest.mark.slow), 32], ids=["auto", "split32"]
)
@pytest.mark.parametrize("case", CASES[1:], ids=["mtp", "qo_gt_kv", "noncausal"])
def test_output_columns_split_over_two_programs(case, split):
    # dv_split=2: each program accumulates 256 of the 512 output columns; with a forced KV
    # split, both parts write their columns of the same partial rows and the merge reads them.
    qo_lens, kv_lens, causal = case
    launch = MLALaunch(tactic=MLATactic(32, 4, 2, dv_split=2))
    _, out, lse, (ref_out, ref_lse) = _run_wrapper(
        qo_lens, kv_lens, 64, causal, torch.float16, CPU, split=split, launch=launch
    )
    _check(out, lse, ref_out, ref_lse, torch.float16)


@pytest.mark.interpreter
# Two output parts in the slow step CI also runs (the main suite is near its 10 minutes).
@pytest.mark.parametrize("dv_split", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("case", CASES, ids=["decode", "mtp", "qo_gt_kv", "noncausal"])
def test_fused_merge_matches_reference(case, dv_split):
    # Every case split in 32-token chunks: the last chunk of each tile merges its partials in
    # the attention kernel (no merge kernel); its counters are back at zero afterwards, and a
    # second run (the counters reused) gives the same output.
    qo_lens, kv_lens, causal = case
    page_size, dtype = 64, torch.float16
    kv_indptr, kv_indices, kv_len, _, num_pages = _table(kv_lens, page_size, CPU)
    qo_indptr = _cumsum(qo_lens)
    inputs = _inputs(sum(qo_lens), num_pages, page_size, 16, dtype, dtype, CPU)
    w = BatchMLAPagedAttentionWrapper(torch.empty(WS_BYTES, dtype=torch.uint8))
    launch = MLALaunch(tactic=MLATactic(32, 4, 2, dv_split=dv_split, fused_merge=True))
    w.plan(qo_indptr, kv_indptr, kv_indices, kv_len, 16, DC, DP, page_size, causal, SCALE,
           dtype, dtype, fixed_split_size=32, launch=launch)  # fmt: skip
    plan = w._planner.plan
    assert plan.host.has_split and plan.counters is not None
    ref = mla_paged_ref(*inputs, kv_indptr, kv_indices, SCALE, qo_indptr=qo_indptr,
                        kv_len_arr=kv_len, causal=causal)  # fmt: skip
    out, lse = w.run(*inputs, return_lse=True)
    _check(out, lse, *ref, dtype)
    assert int(plan.counters.abs().sum()) == 0  # each last arrival reset its counter
    plan.partial_o.fill_(float("nan"))  # a second run: stale partials must not leak in
    out, lse = w.run(*inputs, return_lse=True)
    _check(out, lse, *ref, dtype)


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "case",
    # two of them in the slow step CI also runs (the main suite stays under 10 minutes)
    [CASES[1], *(pytest.param(c, marks=pytest.mark.slow) for c in CASES[2:])],
    ids=["mtp", "qo_gt_kv", "noncausal"],
)
def test_probabilities_through_scratch_match_reference(case):
    # MLATactic.p_scratch: P and the rescale factors reach the output MMA through the plan's
    # scratch tile a program; with a forced KV split the merge reads the partials as usual.
    qo_lens, kv_lens, causal = case
    launch = MLALaunch(tactic=MLATactic(32, 8, 2, True, p_scratch=True))
    w, out, lse, (ref_out, ref_lse) = _run_wrapper(
        qo_lens, kv_lens, 64, causal, torch.float16, CPU, split=32, launch=launch
    )
    plan = w._planner.plan
    assert plan.p_scratch is not None and plan.p_scratch.dtype == torch.float16
    _check(out, lse, ref_out, ref_lse, torch.float16)


def test_probabilities_through_scratch_are_a_manual_tactic_of_planned_calls():
    # Not offered to the tuner before a GPU has checked it (config.MLATactic.p_scratch).
    assert not any(t.p_scratch for t in MLATactic.space(64, 2))
    with pytest.raises(ValueError, match="planned calls only"):
        mla_paged_decode(
            *_inputs(2, 4, 1, 16, torch.float16, torch.float16, CPU),
            torch.tensor([0, 2, 4], dtype=torch.int32),
            torch.arange(4, dtype=torch.int32),
            SCALE,
            options=MLAOptions(launch=MLALaunch(tactic=MLATactic(32, 8, 2, p_scratch=True))),
        )


def test_output_column_split_is_offered_for_tall_bf16_tiles_only():
    tall = MLATactic.space(64, 2)
    assert any(t.dv_split == 2 for t in tall)
    assert all(t.dv_split == 1 for t in MLATactic.space(16, 2))  # decode: one token a tile
    assert all(t.dv_split == 1 for t in MLATactic.space(64, 1))  # fp8: its scales per group
    with pytest.raises(ValueError, match="planned calls only"):
        mla_paged_decode(
            *_inputs(2, 4, 1, 16, torch.float16, torch.float16, CPU),
            torch.tensor([0, 2, 4], dtype=torch.int32),
            torch.arange(4, dtype=torch.int32),
            SCALE,
            options=MLAOptions(launch=MLALaunch(tactic=MLATactic(32, 4, 2, dv_split=2))),
        )


@pytest.mark.interpreter
@pytest.mark.parametrize("heads,d_kpe", [(128, DP), (8, 0)], ids=["h128", "h8_nope"])
def test_other_head_counts(heads, d_kpe):
    # 128 heads: one token's rows span two 64-row tiles; no rotary part (head_dim_kpe 0).
    _, out, lse, (ref_out, ref_lse) = _run_wrapper(
        [1, 2], [20, 7], 1, True, torch.float16, CPU, heads=heads, d_kpe=d_kpe
    )
    _check(out, lse, ref_out, ref_lse, torch.float16)


@pytest.mark.interpreter
@pytest.mark.parametrize("groups", [False, True], ids=["tensor_scales", "group_scales"])
def test_fp8_cache(groups):
    kv_lens, page_size = [70, 0, 33], 16
    num_pages = sum(-(-n // page_size) for n in kv_lens) + 3
    if groups:
        kwargs = {
            "ckv_scale_arr": torch.rand(num_pages, page_size, DC // 128) + 0.25,
            "kpe_scale": 0.7,
        }
    else:
        kwargs = {"ckv_scale": 0.5, "kpe_scale": 2.0}
    _, out, lse, (ref_out, ref_lse) = _run_wrapper(
        [1, 1, 2], kv_lens, page_size, True, torch.float16, CPU,
        kv_dtype=torch.float8_e4m3fn, run_kwargs=kwargs, split=32,
    )  # fmt: skip
    # Group scales are applied to the tile as it is rounded to q's dtype (as FlashInfer's
    # dequantization to bf16), in the scores too; the reference scales in fp32.
    loose = {"tol": 4e-3, "lse_tol": 4e-3} if groups else {}
    _check(out, lse, ref_out, ref_lse, torch.float16, **loose)


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "page_size,block_n,in_page",
    [(64, 32, True), (32, 32, True), (16, 32, False), (1, 32, False)],
)
def test_tiles_inside_one_page(page_size, block_n, in_page):
    # Where block_n divides the page size and the chunks' starts, a tile's rows are one
    # page's consecutive slots (kernels.mla_item's TILE_IN_PAGE: one page id a tile): odd
    # lengths ending mid-page and mid-tile, an empty request, a forced split, fp8 with
    # per-group scales (their rows addressed the same way).
    from flashtune.ops.mla.launch import tile_in_page

    kv_lens = [70, 0, 33, 129]
    num_pages = sum(-(-n // page_size) for n in kv_lens) + 3
    kwargs = {
        "ckv_scale_arr": torch.rand(num_pages, page_size, DC // 128) + 0.25,
        "kpe_scale": 0.7,
    }
    tactic = MLATactic(block_n, 4, 2)
    w, out, lse, (ref_out, ref_lse) = _run_wrapper(
        [1, 1, 2, 3], kv_lens, page_size, True, torch.float16, CPU, split=64,
        kv_dtype=torch.float8_e4m3fn, run_kwargs=kwargs, launch=MLALaunch(tactic=tactic),
    )  # fmt: skip
    plan = w._planner.plan
    assert plan.host.has_split and tile_in_page(plan, tactic) is in_page
    _check(out, lse, ref_out, ref_lse, torch.float16, tol=4e-3, lse_tol=4e-3)


@pytest.mark.parametrize("fixed_split", [None, 17, 100, 250])
def test_work_items_start_on_the_plans_kv_alignment(fixed_split):
    # TILE_IN_PAGE trusts plan.kv_align: every item's first KV position is a multiple of it,
    # whatever chunk size the plan picked or was forced to.
    kv_lens = torch.randint(0, 3000, (37,)).tolist()
    qo_lens = torch.randint(1, 4, (37,)).tolist()
    kv_indptr, kv_indices, kv_len, _, _ = _table(kv_lens, 64, CPU)
    w = BatchMLAPagedAttentionWrapper(torch.empty(1 << 27, dtype=torch.uint8))
    w.plan(_cumsum(qo_lens), kv_indptr, kv_indices, kv_len, 16, DC, DP, 64, True, SCALE,
           torch.float16, torch.float16, fixed_split_size=fixed_split,
           launch=MLALaunch(sm_count=132))  # fmt: skip
    plan = w._planner.plan
    starts = plan.work[: plan.host.num_work, 4]
    assert plan.kv_align >= 16 and plan.host.num_work > 0
    assert bool((starts % plan.kv_align == 0).all()), starts[starts % plan.kv_align != 0]


@pytest.mark.interpreter
@pytest.mark.parametrize("page_size", [1, 64])
def test_plan_free_decode(page_size):
    kv_lens = [37, 0, 300, 5]
    kv_indptr, kv_indices, _, last, num_pages = _table(kv_lens, page_size, CPU)
    q_nope, q_pe, ckv, kpe = _inputs(4, num_pages, page_size, 16, torch.float16, torch.float16, CPU)
    last_arg = last if page_size > 1 else None
    out, lse = mla_paged_decode(
        q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE, last_arg, return_lse=True
    )
    ref = mla_paged_ref(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE, kv_last_page_len=last)
    _check(out, lse, *ref, torch.float16)


@pytest.mark.interpreter
@pytest.mark.parametrize("causal", [True, False])
def test_plan_free_prefill(causal):
    kv_lens, qo_lens, page_size = [37, 0, 90, 5], [3, 2, 4, 7], 64
    kv_indptr, kv_indices, _, last, num_pages = _table(kv_lens, page_size, CPU)
    qo_indptr = _cumsum(qo_lens)
    q_nope, q_pe, ckv, kpe = _inputs(
        16, num_pages, page_size, 16, torch.float16, torch.float16, CPU
    )
    out, lse = mla_paged_prefill(
        q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, SCALE, last,
        causal=causal, return_lse=True,
    )  # fmt: skip
    ref = mla_paged_ref(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE, qo_indptr=qo_indptr,
                        kv_last_page_len=last, causal=causal)  # fmt: skip
    _check(out, lse, *ref, torch.float16)


# --------------------------------------------------------------------------- FlashInfer's run()


@pytest.mark.interpreter
def test_run_conventions():
    """As FlashInfer's wrapper: a given lse is written without return_lse; out= is filled
    and returned; return_lse_base_on_e gives the natural-log LSE."""
    w, out, lse, _ = _run_wrapper([1, 1], [40, 3], 1, False, torch.float16, CPU)
    plan_inputs = w._planner.plan  # the same plan for the calls below
    q_nope = torch.randn(2, 16, DC, dtype=torch.float16)
    q_pe = torch.randn(2, 16, DP, dtype=torch.float16)
    ckv = torch.randn(plan_inputs.kv_indices.numel() + 3, 1, DC, dtype=torch.float16)
    kpe = torch.randn(ckv.shape[0], 1, DP, dtype=torch.float16)
    o_ref, lse_ref = w.run(q_nope, q_pe, ckv, kpe, return_lse=True)
    o_buf, lse_buf = torch.empty_like(o_ref), torch.empty_like(lse_ref)
    got = w.run(q_nope, q_pe, ckv, kpe, out=o_buf, lse=lse_buf)
    assert got is o_buf
    assert torch.equal(o_buf, o_ref) and torch.equal(lse_buf, lse_ref)
    _, lse_e = w.run(q_nope, q_pe, ckv, kpe, return_lse=True, return_lse_base_on_e=True)
    torch.testing.assert_close(lse_e, lse_ref * math.log(2.0))


@pytest.mark.interpreter
def test_cuda_graph_mode_replans_in_place():
    """use_cuda_graph: the work list, partial buffers and grid stay where the first plan put
    them (a captured run replays them), and each plan's results are right."""
    device, heads, batch = CPU, 16, 3
    bufs = dict(
        qo_indptr=torch.empty(batch + 1, dtype=torch.int32),
        kv_indptr=torch.empty(batch + 1, dtype=torch.int32),
        kv_indices=torch.empty(4096, dtype=torch.int32),
        kv_len_arr=torch.empty(batch, dtype=torch.int32),
    )
    w = BatchMLAPagedAttentionWrapper(torch.empty(WS_BYTES, dtype=torch.uint8), True, **bufs)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32)
    seen = None
    for kv_lens in ([0, 0, 0], [90, 3, 200], [7, 64, 1]):
        kv_indptr, kv_indices, kv_len, _, num_pages = _table(kv_lens, 1, device)
        w.plan(qo_indptr, kv_indptr, kv_indices, kv_len, heads, DC, DP, 1, False, SCALE,
               torch.float16, torch.float16, fixed_split_size=32)  # fmt: skip
        plan = w._planner.plan
        where = (
            plan.work.data_ptr(),
            plan.partial_o.data_ptr(),
            plan.grid_ctas,
            plan.kv_indices.data_ptr(),
        )
        assert seen is None or where == seen
        seen = where
        assert torch.equal(bufs["kv_len_arr"], kv_len)  # the caller's buffers follow the plan
        q_nope, q_pe, ckv, kpe = _inputs(batch, max(num_pages, 1), 1, heads, torch.float16,
                                         torch.float16, device)  # fmt: skip
        out, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True)
        ref = mla_paged_ref(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE, kv_len_arr=kv_len)
        _check(out, lse, *ref, torch.float16)
    with pytest.raises(ValueError, match="bakes them in"):
        w.plan(qo_indptr, kv_indptr, kv_indices, kv_len, heads, DC, DP, 1, False, 2 * SCALE,
               torch.float16, torch.float16)  # fmt: skip


@pytest.mark.interpreter
def test_kv_indptr_longer_than_the_batch():
    """FlashInfer reads kv_indptr[b] for b < len(kv_len_arr) only: its
    test_batch_mla_varlen_page_attention passes more entries than batch_size + 1."""
    kv_indptr, kv_indices, kv_len, _, num_pages = _table([20, 0, 33], 1, CPU)
    longer = torch.cat([kv_indptr, kv_indptr[-1:] + 7, kv_indptr[-1:] + 9])
    qo_indptr = torch.arange(4, dtype=torch.int32)
    q_nope, q_pe, ckv, kpe = _inputs(3, num_pages, 1, 16, torch.float16, torch.float16, CPU)
    w = BatchMLAPagedAttentionWrapper(torch.empty(WS_BYTES, dtype=torch.uint8))
    w.plan(qo_indptr, longer, kv_indices, kv_len, 16, DC, DP, 1, False, SCALE,
           torch.float16, torch.float16)  # fmt: skip
    out, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True)
    ref = mla_paged_ref(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE, kv_len_arr=kv_len)
    _check(out, lse, *ref, torch.float16)


def test_reference_path_without_kernels(monkeypatch):
    """FLASHTUNE_FORCE_REFERENCE (and a CPU without the interpreter) run the reference."""
    monkeypatch.setenv("FLASHTUNE_FORCE_REFERENCE", "1")
    _, out, lse, (ref_out, ref_lse) = _run_wrapper([2, 1], [30, 0], 64, True, torch.bfloat16, CPU)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


# --------------------------------------------------------------------------- bad input


def _planned(**plan_kwargs):
    kv_indptr, kv_indices, kv_len, _, num_pages = _table([20, 5], 1, CPU)
    w = BatchMLAPagedAttentionWrapper(torch.empty(WS_BYTES, dtype=torch.uint8))
    args = dict(qo_indptr=torch.arange(3, dtype=torch.int32), kv_indptr=kv_indptr,
                kv_indices=kv_indices, kv_len_arr=kv_len, num_heads=16, head_dim_ckv=DC,
                head_dim_kpe=DP, page_size=1, causal=True, sm_scale=SCALE,
                q_data_type=torch.float16, kv_data_type=torch.float16)  # fmt: skip
    args.update(plan_kwargs)
    w.plan(**args)
    return w, _inputs(2, num_pages, 1, 16, torch.float16, torch.float16, CPU)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="kv_indptr.dtype == torch.int32"):
        _planned(kv_indptr=torch.tensor([0, 20, 25], dtype=torch.int64))
    with pytest.raises(ValueError, match=r"kv_len_arr\[1\] = 6"):
        _planned(kv_len_arr=torch.tensor([20, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match="head_dim_ckv must be a power of two"):
        _planned(head_dim_ckv=320)
    with pytest.raises(TypeError, match="16-bit cache must have q's dtype"):
        _planned(kv_data_type=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="cutlass"):
        BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8), backend="cutlass")
    w = BatchMLAPagedAttentionWrapper(torch.empty(WS_BYTES, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(*_inputs(2, 4, 1, 16, torch.float16, torch.float16, CPU))
    w, (q_nope, q_pe, ckv, kpe) = _planned()
    with pytest.raises(ValueError, match="q_nope must be"):
        w.run(q_nope[:, :8], q_pe, ckv, kpe)
    with pytest.raises(ValueError, match="page ids in"):
        w.run(q_nope, q_pe, ckv[:5], kpe[:5])
    with pytest.raises(ValueError, match="only valid when kv_data_type is FP8"):
        w.run(q_nope, q_pe, ckv, kpe, ckv_scale=0.5)
    with pytest.raises(ValueError, match="cutlass backend"):
        w.run(q_nope, q_pe, ckv, kpe, o_scale=1.0)


def test_launch_choices_are_checked():
    with pytest.raises(ValueError, match="launch.block_m"):
        _planned(launch=MLALaunch(block_m=48))
    with pytest.raises(ValueError, match="kv_last_page_len has 3 entries"):
        mla_paged_decode(
            *_inputs(2, 4, 1, 16, torch.float16, torch.float16, CPU),
            torch.tensor([0, 2, 4], dtype=torch.int32),
            torch.arange(4, dtype=torch.int32),
            SCALE,
            torch.ones(3, dtype=torch.int32),
        )
    with pytest.raises(ValueError, match="only valid when kv_data_type is FP8"):
        mla_paged_decode(
            *_inputs(2, 4, 1, 16, torch.float16, torch.float16, CPU),
            torch.tensor([0, 2, 4], dtype=torch.int32),
            torch.arange(4, dtype=torch.int32),
            SCALE,
            options=MLAOptions(scales=KVScales(ckv=0.5)),
        )


# --------------------------------------------------------------------------- GPU (bf16)


@pytest.mark.cuda
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize(
    "qo_lens,kv_lens,causal",
    [
        ([1] * 33, [0, 1, 17, 4000, 999] + [300] * 28, True),  # decode, split and merged
        ([2, 3, 4, 1], [129, 2048, 7, 0], True),  # MTP, 64-row tiles
        ([2, 1, 2], [300, 5000, 17], True),  # MTP, 32-row tiles (q reloaded per KV tile)
        ([300, 64, 1], [1324, 64, 5000], True),  # prefill over a cached prefix
        ([40, 8], [90, 8], False),
    ],
    ids=["decode", "mtp", "mtp2", "prefill", "noncausal"],
)
def test_gpu_bf16(qo_lens, kv_lens, causal, page_size):
    _, out, lse, (ref_out, ref_lse) = _run_wrapper(
        qo_lens, kv_lens, page_size, causal, torch.bfloat16, torch.device("cuda")
    )
    _check(out, lse, ref_out, ref_lse, torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize("reload_q", [False, True])
def test_gpu_prefill_with_the_output_columns_split(reload_q):
    # 32/8/2: the split 64-row tile that fits (tests/ops/test_mla_smem.py), spill-free with q
    # reloaded.
    launch = MLALaunch(tactic=MLATactic(32, 8, 2, reload_q, dv_split=2))
    _, out, lse, (ref_out, ref_lse) = _run_wrapper(
        [300, 64, 1], [1324, 64, 5000], 64, True, torch.bfloat16, torch.device("cuda"),
        launch=launch,
    )  # fmt: skip
    _check(out, lse, ref_out, ref_lse, torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize("block_n,reload_q", [(64, True), (32, False)])
def test_gpu_prefill_with_probabilities_through_scratch(block_n, reload_q):
    # The CTA barriers order the scratch tile between the warpgroups: a race would show.
    launch = MLALaunch(tactic=MLATactic(block_n, 8, 2, reload_q, p_scratch=True))
    _, out, lse, (ref_out, ref_lse) = _run_wrapper(
        [300, 64, 1], [1324, 64, 5000], 64, True, torch.bfloat16, torch.device("cuda"),
        launch=launch,
    )  # fmt: skip
    _check(out, lse, ref_out, ref_lse, torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "qo_lens,kv_lens,tactic",
    [
        ([1] * 33, [0, 1, 17, 4000, 999] + [300] * 28, MLATactic(64, 8, 3, fused_merge=True)),
        ([2, 3, 4, 1], [129, 2048, 7, 0], MLATactic(32, 8, 3, fused_merge=True)),  # 64 rows
    ],
    ids=["decode", "mtp"],
)
def test_gpu_fused_merge(qo_lens, kv_lens, tactic):
    # The last chunk of each split tile merges in the attention kernel; run twice (the
    # counters each last arrival reset serve the second launch).
    launch = MLALaunch(tactic=tactic)
    for _ in range(2):
        w, out, lse, (ref_out, ref_lse) = _run_wrapper(
            qo_lens, kv_lens, 64, True, torch.bfloat16, torch.device("cuda"), split=64,
            launch=launch,
        )  # fmt: skip
        _check(out, lse, ref_out, ref_lse, torch.bfloat16)
        assert int(w._planner.plan.counters.abs().sum()) == 0


@pytest.mark.cuda
@pytest.mark.parametrize("heads", [16, 128])
def test_gpu_plan_free_and_fp8(heads):
    dev = torch.device("cuda")
    kv_lens, page_size = [3000, 0, 17, 257], 64
    kv_indptr, kv_indices, _, last, num_pages = _table(kv_lens, page_size, dev)
    q_nope, q_pe, ckv, kpe = _inputs(4, num_pages, page_size, heads, torch.bfloat16,
                                     torch.bfloat16, dev)  # fmt: skip
    out, lse = mla_paged_decode(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE, last,
                                return_lse=True)  # fmt: skip
    ref = mla_paged_ref(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE, kv_last_page_len=last)
    _check(out, lse, *ref, torch.bfloat16)
    fp8 = ckv.to(torch.float8_e4m3fn), kpe.to(torch.float8_e4m3fn)
    opts = MLAOptions(scales=KVScales(ckv=0.5, kpe=1.5))
    out, lse = mla_paged_decode(q_nope, q_pe, *fp8, kv_indptr, kv_indices, SCALE, last,
                                return_lse=True, options=opts)  # fmt: skip
    ref = mla_paged_ref(q_nope, q_pe, *fp8, kv_indptr, kv_indices, SCALE, kv_last_page_len=last,
                        kv_scale=(0.5, 1.5))  # fmt: skip
    _check(out, lse, *ref, torch.bfloat16)


@pytest.mark.cuda
def test_gpu_cuda_graph_replay_after_replan():
    """FlashInfer's pattern: plan a warm-up batch, capture run(), plan the real lengths,
    replay."""
    dev, heads, batch = torch.device("cuda"), 16, 8
    bufs = dict(
        qo_indptr=torch.empty(batch + 1, dtype=torch.int32, device=dev),
        kv_indptr=torch.empty(batch + 1, dtype=torch.int32, device=dev),
        kv_indices=torch.empty(1 << 16, dtype=torch.int32, device=dev),
        kv_len_arr=torch.empty(batch, dtype=torch.int32, device=dev),
    )
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    w = BatchMLAPagedAttentionWrapper(ws, True, **bufs)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    num_pages = 20000
    q_nope, q_pe, ckv, kpe = _inputs(
        batch, num_pages, 1, heads, torch.bfloat16, torch.bfloat16, dev
    )
    zeros = torch.zeros(batch, dtype=torch.int32, device=dev)
    w.plan(qo_indptr, torch.zeros(batch + 1, dtype=torch.int32, device=dev), bufs["kv_indices"][:1],
           zeros, heads, DC, DP, 1, False, SCALE, torch.bfloat16, torch.bfloat16)  # fmt: skip
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            out, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True)
    for kv_lens in ([5000, 1, 0, 300, 64, 2000, 7, 9000], [1] * batch):
        pages = torch.randperm(num_pages, device=dev)[: sum(kv_lens)].to(torch.int32)
        kv_len = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
        kv_indptr = _cumsum(kv_lens).to(dev)
        w.plan(qo_indptr, kv_indptr, pages, kv_len, heads, DC, DP, 1, False, SCALE,
               torch.bfloat16, torch.bfloat16)  # fmt: skip
        out.fill_(0)
        graph.replay()
        ref = mla_paged_ref(q_nope, q_pe, ckv, kpe, kv_indptr, pages, SCALE, kv_len_arr=kv_len)
        _check(out, lse, *ref, torch.bfloat16)


def test_a_fixed_tactic_too_large_for_the_device_is_refused_at_plan(monkeypatch):
    """A caller's tactic whose tiles exceed the device's shared memory fails at plan with the
    tactic named, not at the first launch with Triton's OutOfResources."""
    import dataclasses

    from flashtune import platform

    real = platform.STAND_IN_LIMITS
    monkeypatch.setattr(
        platform, "device_limits", lambda device=None: dataclasses.replace(real, stand_in=False)
    )
    with pytest.raises(ValueError, match=r"needs 288 KB of shared memory at 64 rows"):
        _run_wrapper([2, 3, 4, 1], [129, 2048, 7, 0], 64, True, torch.float16, CPU,
                     launch=MLALaunch(tactic=MLATactic(64, 8, 3)))  # fmt: skip

"""MLA paged decode and paged prefill on the interpreter, over the grid test_mla.py leaves
open: fp8 caches (per-tensor and per-128-channel group scales) at page sizes 1 and 64 through
the plan-free calls and the planned wrapper, the plan-free prefill at page size 1, and
requests with no query tokens next to requests with no keys; odd lengths throughout.

Small shapes for the interpreter: 4 heads, a 256-wide latent (two 128-channel scale groups),
a 64-wide RoPE part; float16 queries (the interpreter's bf16 loads are wrong). Every case
compares against the one reference, mla_paged_ref."""

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

DC, DP, HEADS = 256, 64, 4
SCALE = 1.0 / math.sqrt(128 + 64)
F16, FP8 = torch.float16, torch.float8_e4m3fn
# Output / LSE (base 2) tolerances: those of test_mla.py; group scales are applied to the
# tile as it is rounded to q's dtype (in the scores too), the reference scales in fp32.
TOL = {None: (2e-3, 1e-3), "tensor": (2e-3, 1e-3), "groups": (4e-3, 4e-3)}
WS_BYTES = 1 << 22


def _indptr(counts: list[int]) -> torch.Tensor:
    out = torch.zeros(len(counts) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    return out


def _table(kv_lens: list[int], page_size: int):
    """(kv_indptr, kv_indices, kv_len, kv_last_page_len, num_pages): shuffled pages, spares."""
    pages = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages) + 3
    indices = torch.randperm(num_pages)[: sum(pages)].to(torch.int32)
    last = [(n - 1) % page_size + 1 if n else 0 for n in kv_lens]
    kv_len = torch.tensor(kv_lens, dtype=torch.int32)
    return _indptr(pages), indices, kv_len, torch.tensor(last, dtype=torch.int32), num_pages


def _inputs(total_q: int, num_pages: int, page_size: int, scales: str | None):
    """Fresh random q, caches (fp8 when scales names a scheme) and the scales: (q_nope, q_pe,
    ckv, kpe, KVScales or None, the reference's kv_scale or None)."""
    q_nope = torch.randn(total_q, HEADS, DC, dtype=F16)
    q_pe = torch.randn(total_q, HEADS, DP, dtype=F16)
    kv_dtype = F16 if scales is None else FP8
    ckv = torch.randn(num_pages, page_size, DC).to(kv_dtype)
    kpe = torch.randn(num_pages, page_size, DP).to(kv_dtype)
    if scales is None:
        return q_nope, q_pe, ckv, kpe, None, None
    if scales == "groups":
        arr = torch.rand(num_pages, page_size, DC // 128) + 0.25
        return q_nope, q_pe, ckv, kpe, KVScales(kpe=0.7, ckv_arr=arr), (arr, 0.7)
    return q_nope, q_pe, ckv, kpe, KVScales(ckv=0.5, kpe=1.5), (0.5, 1.5)


def _check(out, lse, ref, scales):
    ref_out, ref_lse = ref
    tol, lse_tol = TOL[scales]
    torch.testing.assert_close(out.float(), ref_out.float(), atol=tol, rtol=tol)
    empty = ref_lse.isinf()
    assert torch.equal(lse.isinf(), empty)  # rows that see no key: -inf ...
    assert torch.count_nonzero(out[empty]) == 0  # ... and output 0
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=lse_tol, rtol=0)


SCALES = [None, "tensor", "groups"]
SCALE_IDS = ["f16", "fp8_tensor", "fp8_groups"]


@pytest.mark.interpreter
@pytest.mark.parametrize("scales", SCALES[1:], ids=SCALE_IDS[1:])
@pytest.mark.parametrize("page_size", [1, 64])
def test_plan_free_decode_fp8(page_size, scales):
    # Odd lengths, an empty request, one past a page of 64, one long enough to be split.
    kv_lens = [37, 0, 65, 1, 131]
    kv_indptr, kv_indices, _, last, num_pages = _table(kv_lens, page_size)
    q_nope, q_pe, ckv, kpe, kv_scales, ref_scale = _inputs(len(kv_lens), num_pages, page_size,
                                                           scales)  # fmt: skip
    out, lse = mla_paged_decode(
        q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE, last if page_size > 1 else None,
        return_lse=True, options=MLAOptions(scales=kv_scales),
    )  # fmt: skip
    ref = mla_paged_ref(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE,
                        kv_last_page_len=last, kv_scale=ref_scale)  # fmt: skip
    assert lse[1].isinf().all()  # the empty request
    _check(out, lse, ref, scales)


# Request 1 has no query tokens, request 2 no keys (its queries see nothing), request 3 more
# queries than keys (its first rows see nothing when causal); odd lengths elsewhere.
PREFILL_QO, PREFILL_KV = [3, 0, 5, 7, 1], [37, 12, 0, 4, 65]


@pytest.mark.interpreter
@pytest.mark.parametrize("scales", SCALES, ids=SCALE_IDS)
@pytest.mark.parametrize("page_size", [1, 64])
def test_plan_free_prefill_pages_empty_requests_and_fp8(page_size, scales):
    kv_indptr, kv_indices, _, last, num_pages = _table(PREFILL_KV, page_size)
    qo_indptr = _indptr(PREFILL_QO)
    q_nope, q_pe, ckv, kpe, kv_scales, ref_scale = _inputs(sum(PREFILL_QO), num_pages,
                                                           page_size, scales)  # fmt: skip
    last_arg = last if page_size > 1 else None
    out, lse = mla_paged_prefill(
        q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, SCALE, last_arg,
        causal=True, return_lse=True, options=MLAOptions(scales=kv_scales),
    )  # fmt: skip
    ref = mla_paged_ref(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE, qo_indptr=qo_indptr,
                        kv_last_page_len=last, causal=True, kv_scale=ref_scale)  # fmt: skip
    _check(out, lse, ref, scales)


# (qo_lens, kv_lens): decode with an empty request; MTP / prefill with a request of no query
# tokens, one of no keys and one of more queries than keys.
WRAPPER_CASES = {
    "decode": ([1, 1, 1, 1], [37, 0, 65, 131]),
    "prefill": (PREFILL_QO, PREFILL_KV),
}


# float16 decode at page sizes 1 and 64 with an empty request is test_mla.py's already.
WRAPPER_GRID = [
    pytest.param(case, scales, id=f"{case}-{sid}")
    for case in WRAPPER_CASES
    for scales, sid in zip(SCALES, SCALE_IDS, strict=True)
    if (case, scales) != ("decode", None)
]


@pytest.mark.interpreter
@pytest.mark.parametrize("split", [None, 32], ids=["auto", "split32"])
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize(("case", "scales"), WRAPPER_GRID)
def test_wrapper_pages_empty_requests_and_fp8(case, scales, page_size, split):
    qo_lens, kv_lens = WRAPPER_CASES[case]
    kv_indptr, kv_indices, kv_len, _, num_pages = _table(kv_lens, page_size)
    qo_indptr = _indptr(qo_lens)
    q_nope, q_pe, ckv, kpe, kv_scales, ref_scale = _inputs(sum(qo_lens), num_pages, page_size,
                                                           scales)  # fmt: skip
    w = BatchMLAPagedAttentionWrapper(torch.empty(WS_BYTES, dtype=torch.uint8))
    launch = MLALaunch(tactic=MLATactic(32, 4, 2)) if split else None
    w.plan(qo_indptr, kv_indptr, kv_indices, kv_len, HEADS, DC, DP, page_size, True, SCALE,
           F16, ckv.dtype, fixed_split_size=split, launch=launch)  # fmt: skip
    run_kwargs = {}
    if kv_scales is not None:
        run_kwargs["kpe_scale"] = kv_scales.kpe
        if kv_scales.ckv_arr is not None:
            run_kwargs["ckv_scale_arr"] = kv_scales.ckv_arr
        else:
            run_kwargs["ckv_scale"] = kv_scales.ckv
    out, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True, **run_kwargs)
    if split:
        assert w._planner.plan.host.has_split  # the 131-key request is split and merged
    ref = mla_paged_ref(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, SCALE, qo_indptr=qo_indptr,
                        kv_len_arr=kv_len, causal=True, kv_scale=ref_scale)  # fmt: skip
    _check(out, lse, ref, scales)

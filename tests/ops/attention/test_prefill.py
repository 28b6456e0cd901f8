"""Batch prefill attention: kernel (interpreter on CPU, GPU under `cuda`) vs the references."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from flashtune.ops.attention.page import split_kv_cache
from flashtune.ops.attention.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)
from flashtune.ops.attention.prefill.config import PREFILL_TACTICS
from flashtune.ops.attention.prefill.launch import TritonPrefillRunner
from flashtune.ops.attention.reference import (
    batch_prefill_paged_ref,
    batch_prefill_ragged_ref,
    single_prefill_ref,
)
from flashtune.ops.attention.variant import AttentionVariant

# (dtype, atol, rtol) of the output against the float64 reference; LSE is compared in fp32.
TOL = {
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
LSE_TOL = {torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _ws(device: torch.device) -> torch.Tensor:
    return torch.empty(1 << 16, dtype=torch.uint8, device=device)


def _indptr(lens: list[int]) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _paged_batch(qo_lens, kv_lens, num_kv_heads, head_dim, page_size, layout, dtype, device):
    """Random page table: shuffled pages, partial last pages, spare pages never referenced."""
    pages = [math.ceil(n / page_size) for n in kv_lens]
    total = sum(pages) + 3
    perm = torch.randperm(total).int()
    indices = perm[: sum(pages)]
    last = [n - (p - 1) * page_size if p else 1 for n, p in zip(kv_lens, pages, strict=True)]
    if layout == "NHD":
        shape = (total, 2, page_size, num_kv_heads, head_dim)
    else:
        shape = (total, 2, num_kv_heads, page_size, head_dim)
    cache = torch.randn(shape, dtype=dtype, device=device)
    return _indptr(pages), indices, torch.tensor(last, dtype=torch.int32), cache


def _compare(out, lse, ref_out, ref_lse, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float().cpu(), ref_out.float().cpu(), atol=atol, rtol=rtol)
    if lse is not None:
        assert torch.equal(lse.isinf().cpu(), ref_lse.isinf().cpu())
        finite = ~ref_lse.isinf().cpu()
        torch.testing.assert_close(
            lse.cpu()[finite], ref_lse.cpu()[finite], atol=LSE_TOL[dtype], rtol=LSE_TOL[dtype]
        )


def _run_paged(
    device,
    dtype,
    qo_lens,
    kv_lens,
    group,
    head_dim,
    page_size,
    layout,
    *,
    num_kv_heads=2,
    causal=True,
    window_left=-1,
    soft_cap=None,
    sm_scale=None,
    custom=False,
):
    num_qo_heads = num_kv_heads * group
    kv_indptr, indices, last, cache = _paged_batch(
        qo_lens, kv_lens, num_kv_heads, head_dim, page_size, layout, dtype, device
    )
    qo_indptr = _indptr(qo_lens)
    q = torch.randn(sum(qo_lens), num_qo_heads, head_dim, dtype=dtype, device=device)
    mask = None
    if custom:
        n = sum(a * b for a, b in zip(qo_lens, kv_lens, strict=True))
        mask = torch.rand(n, device=device) > 0.4
    w = BatchPrefillWithPagedKVCacheWrapper(_ws(device), kv_layout=layout)
    w.plan(
        qo_indptr,
        kv_indptr,
        indices,
        last,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        causal=causal,
        custom_mask=mask,
        window_left=window_left,
        logits_soft_cap=soft_cap,
        sm_scale=sm_scale,
        q_data_type=dtype,
    )
    out, lse = w.run(q, cache, return_lse=True)
    k, v = split_kv_cache(cache, layout)
    scale = sm_scale if sm_scale is not None else 1 / math.sqrt(head_dim)
    ref_out, ref_lse = batch_prefill_paged_ref(
        q,
        k,
        v,
        qo_indptr,
        kv_indptr,
        indices,
        last,
        AttentionVariant(
            sm_scale=scale, causal=causal, window_left=window_left, logits_soft_cap=soft_cap
        ),
        custom_mask=mask,
        compute_dtype=torch.float64,
    )
    _compare(out, lse, ref_out, ref_lse, dtype)


# ---- CPU (Triton interpreter) or GPU, small, float16 -----------------------------------------

# An empty request (qo_len 0) and a request with qo_len < kv_len (append) in every batch.
QO_LENS = [7, 0, 33, 1]
KV_LENS = [7, 5, 45, 20]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize(("group", "page_size"), [(1, 16), (4, 1), (5, 16), (6, 64), (8, 16)])
def test_paged_causal(device, layout, group, page_size):
    _run_paged(device, torch.float16, QO_LENS, KV_LENS, group, 64, page_size, layout)


@pytest.mark.parametrize(
    "variant",
    [
        dict(causal=False),
        dict(window_left=9),
        dict(causal=False, window_left=4),
        dict(soft_cap=5.0),
        dict(sm_scale=0.3),
        dict(custom=True),
    ],
    ids=["noncausal", "window", "window_noncausal", "softcap", "sm_scale", "custom_mask"],
)
def test_paged_variants(device, variant):
    _run_paged(device, torch.float16, QO_LENS, KV_LENS, 3, 64, 16, "NHD", **variant)


@pytest.mark.parametrize("window_left", [-1, 2])
def test_paged_causal_more_queries_than_keys(device, window_left):
    # Bottom-right alignment as FlashInfer's: rows before the KV give 0 and LSE -inf.
    qo, kv = [9, 40, 3, 4], [4, 17, 3, 0]
    _run_paged(device, torch.float16, qo, kv, 3, 64, 5, "NHD", window_left=window_left)


@pytest.mark.parametrize("head_dim", [128, 256])
def test_paged_head_dims(device, head_dim):
    _run_paged(device, torch.float16, [9, 20], [30, 20], 2, head_dim, 16, "NHD")


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize(
    "variant", [dict(causal=True), dict(causal=False, window_left=6), dict(custom=True)]
)
def test_ragged(device, layout, variant):
    dtype, group, hkv, d = torch.float16, 4, 2, 64
    qo_lens, kv_lens = [12, 0, 40], [12, 9, 47]
    qo_indptr, kv_indptr = _indptr(qo_lens), _indptr(kv_lens)
    q = torch.randn(sum(qo_lens), hkv * group, d, dtype=dtype, device=device)
    k = torch.randn(sum(kv_lens), hkv, d, dtype=dtype, device=device)
    v = torch.randn(sum(kv_lens), hkv, d, dtype=dtype, device=device)
    mask = None
    if variant.get("custom"):
        n = sum(a * b for a, b in zip(qo_lens, kv_lens, strict=True))
        mask = torch.rand(n, device=device) > 0.5
    w = BatchPrefillWithRaggedKVCacheWrapper(_ws(device), kv_layout=layout)
    causal = variant.get("causal", False)
    window = variant.get("window_left", -1)
    w.plan(
        qo_indptr,
        kv_indptr,
        hkv * group,
        hkv,
        d,
        causal=causal,
        custom_mask=mask,
        window_left=window,
    )
    kk, vv = (
        (k, v)
        if layout == "NHD"
        else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    )
    out, lse = w.run(q, kk, vv, return_lse=True)
    ref = batch_prefill_ragged_ref(
        q.cpu(),
        k.cpu(),
        v.cpu(),
        qo_indptr,
        kv_indptr,
        AttentionVariant(sm_scale=1 / math.sqrt(d), causal=causal, window_left=window),
        custom_mask=None if mask is None else mask.cpu(),
        compute_dtype=torch.float64,
    )
    _compare(out, lse, *ref, dtype)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_single_prefill(device, kv_layout):
    q = torch.randn(19, 6, 64, dtype=torch.float16, device=device)
    k = torch.randn(30, 2, 64, dtype=torch.float16, device=device)
    v = torch.randn(30, 2, 64, dtype=torch.float16, device=device)
    kk, vv = (k, v) if kv_layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
    out, lse = single_prefill_with_kv_cache(
        q, kk, vv, causal=True, kv_layout=kv_layout, logits_soft_cap=20.0, return_lse=True
    )
    ref = single_prefill_ref(
        q.cpu(),
        k.cpu(),
        v.cpu(),
        1 / 8,
        causal=True,
        logits_soft_cap=20.0,
        compute_dtype=torch.float64,
    )
    _compare(out, lse, *ref, torch.float16)
    mask = torch.rand(19, 30, device=device) > 0.5
    out = single_prefill_with_kv_cache(q, kk, vv, custom_mask=mask, kv_layout=kv_layout)
    ref = single_prefill_ref(
        q.cpu(), k.cpu(), v.cpu(), 1 / 8, custom_mask=mask.cpu(), compute_dtype=torch.float64
    )
    _compare(out, None, ref[0], None, torch.float16)


def test_out_and_lse_buffers_and_rerun(device):
    qo_lens, kv_lens = [5, 16], [8, 16]
    w = BatchPrefillWithRaggedKVCacheWrapper(_ws(device))
    w.plan(_indptr(qo_lens), _indptr(kv_lens), 4, 2, 64, causal=True)
    q = torch.randn(21, 4, 64, dtype=torch.float16, device=device)
    k = torch.randn(24, 2, 64, dtype=torch.float16, device=device)
    v = torch.randn(24, 2, 64, dtype=torch.float16, device=device)
    out = torch.empty_like(q)
    lse = torch.empty(21, 4, dtype=torch.float32, device=device)
    res = w.run(q, k, v, out=out, lse=lse, return_lse=True)
    assert res[0] is out and res[1] is lse
    first = out.clone()
    again = w.run(q, k, v)  # the plan is reusable (one plan per step, every layer)
    torch.testing.assert_close(again, first, atol=0, rtol=0)


def test_tactics_agree(device):
    """Non-default tactics of the runner give the same result (a sample of the space)."""
    if device.type != "cuda":
        pytest.skip("tactic sweep is GPU-only (interpreter too slow for 128-row tiles)")
    qo_lens, kv_lens = [100, 257], [300, 257]
    w = BatchPrefillWithRaggedKVCacheWrapper(_ws(device))
    w.plan(_indptr(qo_lens), _indptr(kv_lens), 8, 2, 128, causal=True)
    q = torch.randn(357, 8, 128, dtype=torch.bfloat16, device=device)
    k = torch.randn(557, 2, 128, dtype=torch.bfloat16, device=device)
    v = torch.randn(557, 2, 128, dtype=torch.bfloat16, device=device)
    ref = w.run(q, k, v)
    runner = TritonPrefillRunner()
    inputs = (q, k, v, torch.empty_like(q), None, w._plan)
    valid = runner.get_valid_tactics(inputs, None)
    assert valid
    for tactic in valid[:: max(1, len(valid) // 6)]:
        out = runner.forward(inputs, tactic)
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2, msg=str(PREFILL_TACTICS[tactic]))


def test_tma_tactic(device):
    """The TMA load path (2-D descriptors over ragged NHD K/V) agrees with the reference;
    rows past a request's end (the next request's keys) must be masked out."""
    from flashtune.ops.attention.prefill.config import PrefillTactic

    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        pytest.skip("TMA needs Hopper or newer")
    qo_lens, kv_lens = [12, 0, 40], [12, 9, 47]
    hkv, group, d = 2, 4, 64
    qo_indptr, kv_indptr = _indptr(qo_lens), _indptr(kv_lens)
    q = torch.randn(sum(qo_lens), hkv * group, d, dtype=torch.float16, device=device)
    k = torch.randn(sum(kv_lens), hkv, d, dtype=torch.float16, device=device)
    v = torch.randn(sum(kv_lens), hkv, d, dtype=torch.float16, device=device)
    w = BatchPrefillWithRaggedKVCacheWrapper(_ws(device))
    w.plan(qo_indptr, kv_indptr, hkv * group, hkv, d, causal=True)
    ref = batch_prefill_ragged_ref(
        q.cpu(),
        k.cpu(),
        v.cpu(),
        qo_indptr,
        kv_indptr,
        AttentionVariant(sm_scale=1 / math.sqrt(d), causal=True),
        compute_dtype=torch.float64,
    )
    small = device.type != "cuda"  # the interpreter wants small tiles
    for pack in (True, False):
        t = PrefillTactic(
            32 if small else 128, 16 if small else 64, pack, 4, 1 if small else 3, tma=True
        )
        out = TritonPrefillRunner().forward((q, k, v, torch.empty_like(q), None, w._plan), t)
        _compare(out, None, ref[0], None, torch.float16)


@pytest.mark.parametrize(("layout", "ws_bytes"), [("NHD", 1 << 20), ("HND", 16)])
def test_tma_tactic_paged_staging(device, layout, ws_bytes):
    """Paged + TMA: pages staged into the workspace (or a fresh buffer when it is too small),
    partial last pages and an empty request included."""
    from flashtune.ops.attention.prefill.config import PrefillTactic

    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        pytest.skip("TMA needs Hopper or newer")
    qo_lens, kv_lens, group, d, ps = [7, 0, 33, 1], [7, 5, 45, 20], 3, 64, 16
    kv_indptr, indices, last, cache = _paged_batch(
        qo_lens, kv_lens, 2, d, ps, layout, torch.float16, device
    )
    qo_indptr = _indptr(qo_lens)
    q = torch.randn(sum(qo_lens), 2 * group, d, dtype=torch.float16, device=device)
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=device)
    w = BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout=layout)
    w.plan(qo_indptr, kv_indptr, indices, last, 2 * group, 2, d, ps, causal=True)
    k, v = split_kv_cache(cache, layout)
    ref = batch_prefill_paged_ref(
        q,
        k,
        v,
        qo_indptr,
        kv_indptr,
        indices,
        last,
        AttentionVariant(sm_scale=1 / 8, causal=True),
        compute_dtype=torch.float64,
    )
    small = device.type != "cuda"
    t = PrefillTactic(
        32 if small else 128, 16 if small else 64, True, 4, 1 if small else 3, tma=True
    )
    out = TritonPrefillRunner().forward((q, k, v, torch.empty_like(q), None, w._plan), t)
    _compare(out, None, ref[0], None, torch.float16)


def test_work_list_request_major():
    """Heaviest request first, then its heaviest tiles; rows carry the request's offsets."""
    w = BatchPrefillWithRaggedKVCacheWrapper(_ws(torch.device("cpu")))
    qo_lens = [32, 64, 32]
    w.plan(_indptr(qo_lens), _indptr(qo_lens), 4, 1, 64, causal=True)
    work = w._plan.work_list(16, 16).tolist()
    assert [r[:2] for r in work] == [
        [1, 48],
        [1, 32],
        [1, 16],
        [1, 0],
        [0, 16],
        [0, 0],
        [2, 16],
        [2, 0],
    ]
    # (request, tok0, qo_start, qo_len, kv_len, kv offset in pages, in tokens, 0)
    assert work[0] == [1, 48, 32, 64, 64, 32, 32, 0]


def test_default_tactic_hopper(monkeypatch):
    """On Hopper tactic -1 reads K/V through TMA, staging pages unless that copy is too big."""
    from flashtune import platform
    from flashtune.ops.attention.prefill.plan import pick_default

    monkeypatch.setattr(platform, "compute_capability", lambda device: (9, 0))
    cap = 1 << 20  # staging copies up to 1 MiB
    cuda = torch.device("cuda")
    ragged = BatchPrefillWithRaggedKVCacheWrapper(_ws(torch.device("cpu")))
    ragged.plan(_indptr([100]), _indptr([100]), 32, 8, 128, causal=True)
    t = pick_default(ragged._plan, cuda, max_staging_bytes=cap)
    assert (t.block_m, t.block_n, t.pack_heads, t.tma) == (64, 64, True, True)

    def paged_default(num_pages: int, ws_bytes: int):
        p = BatchPrefillWithPagedKVCacheWrapper(torch.empty(ws_bytes, dtype=torch.uint8))
        idx = torch.arange(num_pages, dtype=torch.int32)
        p.plan(
            _indptr([5]),
            _indptr([num_pages]),
            idx,
            torch.tensor([16], dtype=torch.int32),
            32,
            8,
            128,
            16,
            causal=True,
        )
        return pick_default(p._plan, cuda, max_staging_bytes=cap)

    # 2 (K, V) * 16 tokens * 8 heads * 128 * 2 bytes = 64 KiB per page.
    assert paged_default(8, 16).tma  # 512 KiB: under the cap
    assert not paged_default(32, 16).tma  # 2 MiB: over the cap and the workspace
    assert paged_default(32, 4 << 20).tma  # fits the workspace


# ---- the corpus references -------------------------------------------------------------------


def _corpus_run(trace_corpus: Path, rel: str):
    definition = json.loads((trace_corpus / "definitions" / rel).read_text())
    scope: dict = {}
    exec(definition["reference"], scope)
    return scope["run"]


def test_corpus_paged_reference(device, trace_corpus):
    run = _corpus_run(trace_corpus, "gqa_paged/gqa_paged_prefill_causal_h32_kv8_d128_ps1.json")
    qo_lens, kv_lens = [3, 9], [6, 9]
    kv_indptr, indices, last, cache = _paged_batch(
        qo_lens, kv_lens, 8, 128, 1, "NHD", torch.float16, device
    )
    qo_indptr = _indptr(qo_lens)
    q = torch.randn(12, 32, 128, dtype=torch.float16, device=device)
    w = BatchPrefillWithPagedKVCacheWrapper(_ws(device))
    w.plan(qo_indptr, kv_indptr, indices, last, 32, 8, 128, 1, causal=True)
    out, lse = w.run(q, cache, return_lse=True)
    k, v = split_kv_cache(cache, "NHD")
    ref_out, ref_lse = run(
        q.cpu(), k.cpu(), v.cpu(), qo_indptr, kv_indptr, indices, 1 / math.sqrt(128)
    )
    _compare(out, lse, ref_out, ref_lse, torch.bfloat16)  # the corpus rounds to bf16


def test_corpus_ragged_reference(device, trace_corpus):
    run = _corpus_run(trace_corpus, "gqa_ragged/gqa_ragged_prefill_causal_h32_kv8_d128.json")
    qo_lens, kv_lens = [4, 7], [10, 7]
    qo_indptr, kv_indptr = _indptr(qo_lens), _indptr(kv_lens)
    q = torch.randn(11, 32, 128, dtype=torch.float16, device=device)
    k = torch.randn(17, 8, 128, dtype=torch.float16, device=device)
    v = torch.randn(17, 8, 128, dtype=torch.float16, device=device)
    w = BatchPrefillWithRaggedKVCacheWrapper(_ws(device))
    w.plan(qo_indptr, kv_indptr, 32, 8, 128, causal=True)
    out, lse = w.run(q, k, v, return_lse=True)
    ref_out, ref_lse = run(q.cpu(), k.cpu(), v.cpu(), qo_indptr, kv_indptr, 1 / math.sqrt(128))
    _compare(out, lse, ref_out, ref_lse, torch.bfloat16)


# ---- bad input: clear errors before any launch ----------------------------------------------


def _ragged_wrapper(**kw):
    w = BatchPrefillWithRaggedKVCacheWrapper(_ws(torch.device("cpu")))
    w.plan(_indptr([4, 6]), _indptr([4, 8]), 4, 2, 64, **kw)
    return w


def test_run_before_plan():
    w = BatchPrefillWithRaggedKVCacheWrapper(_ws(torch.device("cpu")))
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(torch.randn(1, 4, 64), torch.randn(1, 2, 64), torch.randn(1, 2, 64))


@pytest.mark.parametrize(
    ("q_shape", "k_shape", "match"),
    [
        ((10, 8, 64), (12, 2, 64), "num_qo_heads"),
        ((10, 4, 128), (12, 2, 64), "head_dim"),
        ((10, 4, 64), (12, 3, 64), "num_kv_heads"),
        ((10, 4, 64), (13, 2, 64), "tokens"),
        ((9, 4, 64), (12, 2, 64), "qo_indptr"),
    ],
)
def test_shape_mismatch_with_plan(q_shape, k_shape, match):
    w = _ragged_wrapper(causal=True)
    with pytest.raises(ValueError, match=match):
        w.run(torch.randn(q_shape), torch.randn(k_shape), torch.randn(k_shape))


def test_bad_plans():
    w = BatchPrefillWithRaggedKVCacheWrapper(_ws(torch.device("cpu")))
    with pytest.raises(ValueError, match="non-decreasing"):
        w.plan(torch.tensor([0, 5, 3], dtype=torch.int32), _indptr([5, 5]), 4, 2, 64)
    with pytest.raises(ValueError, match="custom_mask"):
        w.plan(_indptr([2, 2]), _indptr([3, 3]), 4, 2, 64, custom_mask=torch.ones(11, dtype=bool))
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        w.plan(_indptr([2]), _indptr([3]), 5, 2, 64)
    with pytest.raises(ValueError, match="head_dim_qk"):
        w.plan(_indptr([2]), _indptr([3]), 4, 2, 96)
    p = BatchPrefillWithPagedKVCacheWrapper(_ws(torch.device("cpu")))
    with pytest.raises(ValueError, match="last_page_len"):
        p.plan(
            _indptr([2]),
            _indptr([1]),
            torch.tensor([0], dtype=torch.int32),
            torch.tensor([17], dtype=torch.int32),
            4,
            2,
            64,
            16,
        )
    with pytest.raises(ValueError, match="paged_kv_indices"):
        p.plan(
            _indptr([2]),
            _indptr([3]),
            torch.tensor([0], dtype=torch.int32),
            torch.tensor([1], dtype=torch.int32),
            4,
            2,
            64,
            16,
        )


def test_paged_run_errors():
    p = BatchPrefillWithPagedKVCacheWrapper(_ws(torch.device("cpu")))
    p.plan(
        _indptr([3]),
        _indptr([2]),
        torch.tensor([0, 7], dtype=torch.int32),
        torch.tensor([4], dtype=torch.int32),
        4,
        2,
        64,
        16,
        causal=True,
    )
    q = torch.randn(3, 4, 64)
    with pytest.raises(ValueError, match="holds 4 pages"):
        p.run(q, torch.randn(4, 2, 16, 2, 64))
    with pytest.raises(ValueError, match="page_size"):
        p.run(q, torch.randn(8, 2, 8, 2, 64))
    with pytest.raises(TypeError, match="dtype"):
        p.run(q, torch.randn(8, 2, 16, 2, 64, dtype=torch.float16))


@pytest.mark.cuda
def test_q_on_other_device():
    w = BatchPrefillWithRaggedKVCacheWrapper(_ws(torch.device("cuda")))
    w.plan(_indptr([4]), _indptr([4]), 4, 2, 64)
    k = torch.randn(4, 2, 64, device="cuda")
    with pytest.raises(ValueError, match="device"):
        w.run(torch.randn(4, 4, 64), k, k)
    with pytest.raises(ValueError, match="device"):
        w.run(torch.randn(4, 4, 64, device="cuda"), k.cpu(), k.cpu())


# ---- GPU: bf16 grid ---------------------------------------------------------------------------


_GPU_GRID = [(d, g, 16) for d in (64, 128, 256) for g in (1, 5, 8)] + [
    (128, 4, 1),
    (128, 4, 64),
    (256, 6, 64),
    (64, 2, 1),
]


@pytest.mark.cuda
@pytest.mark.parametrize(("head_dim", "group", "page_size"), _GPU_GRID)
def test_cuda_paged_bf16_grid(head_dim, group, page_size):
    qo = [300, 0, 1, 77, 513]
    kv = [300, 64, 900, 1000, 513]
    _run_paged(
        torch.device("cuda"),
        torch.bfloat16,
        qo,
        kv,
        group,
        head_dim,
        page_size,
        "HND" if group == 5 else "NHD",
    )


@pytest.mark.cuda
@pytest.mark.parametrize(
    "variant",
    [
        dict(causal=False),
        dict(window_left=100),
        dict(soft_cap=30.0),
        dict(custom=True),
        dict(sm_scale=0.05),
    ],
)
def test_cuda_variants_bf16(variant):
    _run_paged(
        torch.device("cuda"),
        torch.bfloat16,
        [200, 3, 64],
        [400, 3, 64],
        4,
        128,
        16,
        "NHD",
        **variant,
    )


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("variant", "layout"),
    [
        (dict(causal=True), "HND"),
        (dict(causal=False), "NHD"),
        (dict(window_left=300), "NHD"),
        (dict(soft_cap=30.0), "HND"),
        (dict(custom=True), "NHD"),
    ],
)
def test_cuda_staged_pages_bf16(variant, layout):
    """KV >= 2048 on Hopper: the default tactic stages the pages and reads them through TMA."""
    _run_paged(
        torch.device("cuda"),
        torch.bfloat16,
        [300, 5, 0],
        [2100, 2048, 40],
        4,
        128,
        16,
        layout,
        **variant,
    )


@pytest.mark.cuda
def test_cuda_batch16_long():
    torch.manual_seed(1)
    lens = [int(x) for x in torch.randint(1, 2048, (15,))] + [4096]
    _run_paged(torch.device("cuda"), torch.bfloat16, lens, lens, 4, 128, 16, "NHD", num_kv_heads=8)


# ---- schemas: the Definitions equal the corpus files ----------------------------------------


def _same_definition(ours, theirs: dict) -> None:
    d = ours.model_dump(mode="json", exclude_none=True)
    assert d["name"] == theirs["name"]
    assert d["op_type"] == theirs["op_type"]
    assert {k: (v["type"], v.get("value")) for k, v in d["axes"].items()} == {
        k: (v["type"], v.get("value")) for k, v in theirs["axes"].items()
    }
    for kind in ("inputs", "outputs"):
        assert {k: (v.get("shape"), v["dtype"]) for k, v in d[kind].items()} == {
            k: (v.get("shape"), v["dtype"]) for k, v in theirs[kind].items()
        }


@pytest.mark.parametrize("page_size", [1, 64])
def test_paged_schema_matches_corpus(trace_corpus, page_size):
    from flashtune.ops.attention.prefill import gqa_paged_prefill

    rel = f"gqa_paged/gqa_paged_prefill_causal_h32_kv8_d128_ps{page_size}.json"
    theirs = json.loads((trace_corpus / "definitions" / rel).read_text())
    qo_lens, kv_lens = [3, 5], [6, 70]
    kv_indptr, indices, last, cache = _paged_batch(
        qo_lens, kv_lens, 8, 128, page_size, "NHD", torch.bfloat16, torch.device("cpu")
    )
    k, v = split_kv_cache(cache, "NHD")
    q = torch.randn(8, 32, 128, dtype=torch.bfloat16)
    qo_indptr = _indptr(qo_lens)
    d = gqa_paged_prefill.definition(
        q,
        k,
        v,
        qo_indptr,
        kv_indptr,
        indices,
        1 / math.sqrt(128),
        None if page_size == 1 else last,
        causal=True,
        plan=None,
        out=None,
        lse=None,
    )
    _same_definition(d, theirs)
    # The emitted reference runs and agrees with the corpus reference.
    scope: dict = {}
    exec(d.reference, scope)
    args = [q, k, v, qo_indptr, kv_indptr, indices] + ([] if page_size == 1 else [last])
    ours_out, ours_lse = scope["run"](*args, 1 / math.sqrt(128))
    ref_out, ref_lse = _corpus_run(trace_corpus, rel)(*args, 1 / math.sqrt(128))
    _compare(ours_out, ours_lse, ref_out, ref_lse, torch.bfloat16)


def test_ragged_schema_matches_corpus(trace_corpus):
    from flashtune.ops.attention.prefill import gqa_ragged_prefill

    rel = "gqa_ragged/gqa_ragged_prefill_causal_h32_kv8_d128.json"
    theirs = json.loads((trace_corpus / "definitions" / rel).read_text())
    q = torch.randn(9, 32, 128, dtype=torch.bfloat16)
    k = torch.randn(14, 8, 128, dtype=torch.bfloat16)
    v = torch.randn(14, 8, 128, dtype=torch.bfloat16)
    qo_indptr, kv_indptr = _indptr([4, 5]), _indptr([9, 5])
    d = gqa_ragged_prefill.definition(
        q, k, v, qo_indptr, kv_indptr, 0.1, causal=True, plan=None, out=None, lse=None
    )
    _same_definition(d, theirs)
    scope: dict = {}
    exec(d.reference, scope)
    out, lse = scope["run"](q, k, v, qo_indptr, kv_indptr, 0.1)
    ref = _corpus_run(trace_corpus, rel)(q, k, v, qo_indptr, kv_indptr, 0.1)
    _compare(out, lse, *ref, torch.bfloat16)


@pytest.mark.parametrize("order", ["request", "tile"])
def test_work_order_matches_the_lexsort_definition(order):
    """The radix-sorted launch order equals the 4-key lexsort it replaced (plan-time cost)."""
    import numpy as np

    from flashtune.ops.attention.prefill.plan import launch_order

    rng = np.random.default_rng(3)
    for _ in range(30):
        batch = int(rng.integers(1, 20))
        ntiles = rng.integers(0, 50, batch)
        req = np.repeat(np.arange(batch), ntiles)
        t0 = np.arange(req.size) - (np.cumsum(ntiles) - ntiles)[req]
        cost = rng.integers(1, 6, req.size) + t0 // 8
        if order == "request":
            req_cost = np.bincount(req, weights=cost, minlength=batch)[req]
            want = np.lexsort((t0, -cost, req, -req_cost))
        else:
            want = np.lexsort((t0, req, -cost))
        assert np.array_equal(launch_order(req, cost, ntiles, order), want)

"""paged_prefill / ragged_prefill (work items found on the device, no plan) vs the references."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from flashtune.ops.attention.decode import plan_free as decode_plan_free
from flashtune.ops.attention.page import split_kv_cache
from flashtune.ops.attention.prefill import BatchPrefillWithRaggedKVCacheWrapper
from flashtune.ops.attention.prefill import plan_free as prefill_plan_free
from flashtune.ops.attention.prefill.config import PrefillTactic
from flashtune.ops.attention.prefill.kernels import device_item
from flashtune.ops.attention.prefill.plan_free import paged_prefill, ragged_prefill
from flashtune.ops.attention.reference import batch_prefill_paged_ref, batch_prefill_ragged_ref
from flashtune.ops.attention.variant import AttentionVariant

TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
LSE_TOL = {torch.float16: 2e-3, torch.bfloat16: 2e-2}

# Every batch holds an empty request (no queries, no keys), a request with keys but no
# queries, and appends (qo_len < kv_len) of different lengths.
QO_LENS = [7, 0, 0, 33, 1, 12]
KV_LENS = [7, 0, 5, 45, 20, 30]


def _indptr(lens: list[int], device: torch.device) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def _paged_batch(kv_lens, hk, d, page_size, layout, dtype, device, five_d=True):
    """Shuffled pages, partial last pages, spare pages never referenced."""
    pages = [-(-n // page_size) for n in kv_lens]
    total = sum(pages) + 3
    indices = torch.randperm(total)[: sum(pages)].to(torch.int32).to(device)
    last = [n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages, strict=True)]
    shape = (page_size, hk, d) if layout == "NHD" else (hk, page_size, d)
    if five_d:
        cache = torch.randn(total, 2, *shape, dtype=dtype, device=device)
    else:
        cache = tuple(torch.randn(total, *shape, dtype=dtype, device=device) for _ in "kv")
    table = (_indptr(pages, device), indices, torch.tensor(last, dtype=torch.int32, device=device))
    return cache, table


def _compare(out, lse, ref_out, ref_lse, dtype, rows=None):
    rows = out.shape[0] if rows is None else rows
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out[:rows].float(), ref_out[:rows].float(), atol=atol, rtol=rtol)
    lse, ref_lse = lse[:rows], ref_lse[:rows]
    assert torch.equal(lse.isinf(), ref_lse.isinf())
    finite = ~ref_lse.isinf()
    tol = LSE_TOL[dtype]
    torch.testing.assert_close(lse[finite], ref_lse[finite].float(), atol=tol, rtol=tol)


def _check_paged(
    qo_lens,
    kv_lens,
    hq,
    hk,
    d,
    page_size,
    layout,
    device,
    *,
    dtype=torch.float16,
    five_d=True,
    **kw,
):
    cache, (kv_indptr, indices, last) = _paged_batch(
        kv_lens, hk, d, page_size, layout, dtype, device, five_d
    )
    qo_indptr = _indptr(qo_lens, device)
    q = torch.randn(sum(qo_lens), hq, d, dtype=dtype, device=device)
    out, lse = paged_prefill(
        q, cache, qo_indptr, kv_indptr, indices, last, kv_layout=layout, return_lse=True, **kw
    )
    k, v = split_kv_cache(cache, layout)
    scale = kw.get("sm_scale") or 1 / math.sqrt(d)
    ref = batch_prefill_paged_ref(
        q,
        k,
        v,
        qo_indptr,
        kv_indptr,
        indices,
        last,
        AttentionVariant(
            sm_scale=scale,
            causal=kw.get("causal", False),
            window_left=kw.get("window_left", -1),
            logits_soft_cap=kw.get("logits_soft_cap"),
        ),
        compute_dtype=torch.float64 if device.type == "cpu" else torch.float32,
    )
    _compare(out, lse, *ref, dtype)


def _ragged_inputs(qo_lens, kv_lens, hq, hk, d, dtype, device):
    q = torch.randn(sum(qo_lens), hq, d, dtype=dtype, device=device)
    k = torch.randn(sum(kv_lens), hk, d, dtype=dtype, device=device)
    v = torch.randn(sum(kv_lens), hk, d, dtype=dtype, device=device)
    return q, k, v, _indptr(qo_lens, device), _indptr(kv_lens, device)


def _check_ragged(qo_lens, kv_lens, hq, hk, d, device, *, dtype=torch.float16, **kw):
    q, k, v, qo_indptr, kv_indptr = _ragged_inputs(qo_lens, kv_lens, hq, hk, d, dtype, device)
    out, lse = ragged_prefill(q, k, v, qo_indptr, kv_indptr, return_lse=True, **kw)
    scale = kw.get("sm_scale") or 1 / math.sqrt(d)
    ref = batch_prefill_ragged_ref(
        q,
        k,
        v,
        qo_indptr,
        kv_indptr,
        AttentionVariant(
            sm_scale=scale,
            causal=kw.get("causal", False),
            window_left=kw.get("window_left", -1),
            logits_soft_cap=kw.get("logits_soft_cap"),
        ),
        compute_dtype=torch.float64 if device.type == "cpu" else torch.float32,
    )
    _compare(out, lse, *ref, dtype)


# ---- CPU (Triton interpreter) or GPU, small, float16 -----------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    ("page_size", "layout", "five_d"),
    [(1, "NHD", True), (16, "HND", True), (5, "NHD", False), (5, "HND", True), (16, "NHD", False)],
)
def test_paged_matches_reference(page_size, layout, five_d, causal, device):
    _check_paged(
        QO_LENS, KV_LENS, 8, 2, 64, page_size, layout, device, five_d=five_d, causal=causal
    )


@pytest.mark.parametrize(("hq", "hk", "d"), [(2, 2, 64), (4, 1, 128), (10, 2, 64), (5, 1, 128)])
def test_paged_group_sizes_and_head_dims(hq, hk, d, device):
    _check_paged([9, 0, 20], [30, 4, 20], hq, hk, d, 16, "NHD", device, causal=True)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("hq", "hk", "d"), [(4, 4, 64), (8, 2, 128), (10, 2, 64)])
def test_ragged_matches_reference(hq, hk, d, causal, device):
    _check_ragged(QO_LENS, KV_LENS, hq, hk, d, device, causal=causal)


VARIANTS = [
    dict(causal=True, window_left=9),
    dict(causal=False, window_left=4),
    dict(causal=True, window_left=0),
    dict(causal=True, logits_soft_cap=5.0),
    dict(causal=False, sm_scale=0.3),
]
# The two wider windows (~3 s each on 2 cores) in the slow step CI also runs (the main suite
# stays under 10 minutes); window_left=0 keeps the window path in it.
_SLOW_VARIANTS = (0, 1)


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param(v, marks=pytest.mark.slow) if i in _SLOW_VARIANTS else v
        for i, v in enumerate(VARIANTS)
    ],
    ids=[str(sorted(v.items())) for v in VARIANTS],
)
def test_variants(kw, device):
    _check_paged(QO_LENS, KV_LENS, 8, 2, 64, 5, "NHD", device, **kw)
    _check_ragged(QO_LENS, KV_LENS, 8, 2, 64, device, **kw)


@pytest.mark.parametrize("window_left", [-1, 3])
def test_causal_more_queries_than_keys(device, window_left):
    # FlashInfer's bottom-right alignment: the first qo_len - kv_len rows see no key and
    # give 0 with LSE -inf; a request with no KV at all too.
    qo_lens, kv_lens = [9, 40, 3, 5], [4, 17, 3, 0]
    kw = dict(causal=True, window_left=window_left)
    _check_paged(qo_lens, kv_lens, 6, 2, 64, 5, "NHD", device, **kw)
    _check_ragged(qo_lens, kv_lens, 6, 2, 64, device, **kw)


@pytest.mark.slow
def test_request_search_spans_several_steps(device, monkeypatch):
    # More requests than one step of the in-kernel search scans (BLOCK_B set to 16).
    monkeypatch.setattr(decode_plan_free, "_SEARCH_BLOCKS", (16, 16))
    qo = [int(x) for x in torch.randint(0, 6, (37,))]
    kv = [q + int(x) for q, x in zip(qo, torch.randint(0, 8, (37,)), strict=True)]
    qo[20], kv[20] = 40, 50  # a long request past the first step
    _check_paged(qo, kv, 4, 1, 64, 4, "NHD", device, causal=True)
    _check_ragged(qo, kv, 4, 1, 64, device, causal=False)


@pytest.mark.slow
@pytest.mark.parametrize("pack", [True, False])
def test_staged_pages_and_tma(device, monkeypatch, pack):
    """The TMA tactic: paged pages staged (all of kv_indices, spare entries included) and
    read as ragged KV at kv_indptr[b] * page_size; ragged K/V through descriptors."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        pytest.skip("TMA needs Hopper or newer")
    small = device.type != "cuda"  # the interpreter wants small tiles
    t = PrefillTactic(32 if small else 64, 16 if small else 64, pack, 4, 1 if small else 3, True)
    monkeypatch.setattr(prefill_plan_free, "_pick_tactic", lambda **_: t)
    _check_paged(QO_LENS, KV_LENS, 8, 2, 64, 16, "HND", device, causal=True)
    _check_paged(QO_LENS, KV_LENS, 6, 2, 64, 5, "NHD", device, causal=False, window_left=7)
    _check_ragged(QO_LENS, KV_LENS, 8, 2, 64, device, causal=True)


@triton.jit
def _items_kernel(
    QO,
    KV,
    LAST,
    OUT,
    batch,
    TOKENS: tl.constexpr,
    PS: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    j = tl.program_id(0)
    r = device_item(j, QO, KV, LAST, batch, TOKENS, PS, False, CAUSAL, BLOCK_B)
    for i in tl.static_range(6):
        tl.store(OUT + j * 6 + i, r[i])


@pytest.mark.parametrize("causal", [True, False])
def test_device_items_match_the_host_plan(device, causal):
    """Item by item: the same (request, tile) set as the host work list, heaviest tile of a
    request first under a causal mask, and the programs past the last item get nothing."""
    qo, kv, tokens = [32, 0, 64, 5, 17, 0], [40, 3, 64, 5, 20, 0], 16
    w = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(0))
    w.plan(_indptr(qo, "cpu"), _indptr(kv, "cpu"), 4, 1, 64, causal=causal)
    host = w._plan.work_list(tokens, 16)[:, :7].tolist()
    bound = -(-sum(qo) // tokens) + len(qo)
    out = torch.full((bound, 6), -7, dtype=torch.int32, device=device)
    _items_kernel[(bound,)](
        _indptr(qo, device),
        _indptr(kv, device),
        _indptr(kv, device),
        out,
        len(qo),
        TOKENS=tokens,
        PS=0,
        CAUSAL=causal,
        BLOCK_B=4,
    )
    items = out.cpu().tolist()
    real = [r for r in items if r[0] >= 0]
    assert len(real) == len(host)
    assert sorted(real) == sorted([h[0], h[1], h[2], h[3], h[4], h[6]] for h in host)
    assert all(r[3] == 0 and r[4] == 0 for r in items[len(real) :])  # nothing past the end
    for b in range(len(qo)):
        tok0 = [r[1] for r in real if r[0] == b]
        assert tok0 == sorted(tok0, reverse=causal), (b, tok0)


def test_out_buffer_padding_and_no_lse(device):
    """out= is written in place; q rows past qo_indptr[-1] (a padded batch) are left alone."""
    q, k, v, qo_indptr, kv_indptr = _ragged_inputs([5, 9], [8, 9], 4, 2, 64, torch.float16, device)
    pad = torch.cat([q, torch.randn(6, 4, 64, dtype=q.dtype, device=device)])
    out = torch.full_like(pad, 7.0)
    res = ragged_prefill(pad, k, v, qo_indptr, kv_indptr, causal=True, out=out)
    assert res is out
    assert bool((out[14:] == 7.0).all())
    ref = batch_prefill_ragged_ref(
        q, k, v, qo_indptr, kv_indptr, AttentionVariant(sm_scale=1 / 8, causal=True)
    )
    torch.testing.assert_close(out[:14], ref[0], atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("why", ["force_reference", "no_kernels"])
def test_reference_path(device, monkeypatch, why):
    if why == "force_reference":
        monkeypatch.setenv("FLASHTUNE_FORCE_REFERENCE", "1")
    else:
        monkeypatch.setattr(prefill_plan_free.platform, "kernels_available", lambda d: False)
    _check_paged(QO_LENS, KV_LENS, 4, 2, 64, 5, "HND", device, causal=True, window_left=6)
    _check_ragged(QO_LENS, KV_LENS, 4, 2, 64, device, causal=True, logits_soft_cap=3.0)


def test_empty_batches(device):
    q = torch.randn(0, 4, 64, dtype=torch.float16, device=device)
    k = torch.randn(0, 2, 64, dtype=torch.float16, device=device)
    z = torch.zeros(3, dtype=torch.int32, device=device)
    out, lse = ragged_prefill(q, k, k, z, z, causal=True, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4)
    cache = torch.randn(2, 2, 16, 2, 64, dtype=torch.float16, device=device)
    one = torch.zeros(1, dtype=torch.int32, device=device)
    empty = torch.zeros(0, dtype=torch.int32, device=device)
    assert paged_prefill(q, cache, one, one, empty, empty).shape == (0, 4, 64)


def test_bad_inputs_raise_before_any_kernel(device):
    qo, kv = [5, 9], [8, 9]
    cache, (kv_indptr, indices, last) = _paged_batch(kv, 2, 64, 16, "NHD", torch.float16, device)
    q = torch.randn(14, 4, 64, dtype=torch.float16, device=device)
    qo_indptr = _indptr(qo, device)
    args = (q, cache, qo_indptr, kv_indptr, indices, last)

    def paged(*over, **kw):
        a = list(args)
        for i, x in over:
            a[i] = x
        return paged_prefill(*a, **kw)

    with pytest.raises(ValueError, match="q must be"):
        paged((0, q[0]))
    with pytest.raises(TypeError, match="q must be float16"):
        paged((0, q.to(torch.int8)))
    with pytest.raises(ValueError, match="head_dim must be one of"):
        paged((0, q[..., :32].contiguous()))
    with pytest.raises(ValueError, match="multiple"):
        paged((0, q[:, :3].contiguous()))
    with pytest.raises(TypeError, match="paged_kv_cache has dtype"):
        paged((1, cache.float()))
    with pytest.raises(TypeError, match="kv_indptr must be int32"):
        paged((3, kv_indptr.float()))
    with pytest.raises(ValueError, match="kv_indptr must have 3 entries"):
        paged((3, kv_indptr[:2]))
    with pytest.raises(ValueError, match="kv_last_page_len must have batch_size=2"):
        paged((5, last[:1]))
    with pytest.raises(ValueError, match="kv_layout"):
        paged(kv_layout="NDH")
    with pytest.raises(TypeError, match="window_left"):
        paged(window_left=2.5)
    with pytest.raises(ValueError, match="logits_soft_cap"):
        paged(logits_soft_cap=-1.0)
    with pytest.raises(ValueError, match="out must be"):
        paged(out=torch.empty(14, 4, 32, dtype=q.dtype, device=device))
    with pytest.raises(NotImplementedError, match="BatchPrefillWithPagedKVCacheWrapper"):
        paged(custom_mask=torch.ones(98, dtype=torch.bool, device=device))
    k = torch.randn(17, 2, 64, dtype=q.dtype, device=device)
    with pytest.raises(ValueError, match="k must be"):
        ragged_prefill(q, k[0], k[0], qo_indptr, kv_indptr)
    with pytest.raises(ValueError, match="k shape"):
        ragged_prefill(q, k, k[:5], qo_indptr, _indptr(kv, device))
    if device.type == "cpu":  # host memory: contents are checked without a sync
        bad = indices.clone()
        bad[0] = 10_000
        with pytest.raises(ValueError, match="outside the cache"):
            paged((4, bad))
        with pytest.raises(ValueError, match="kv_last_page_len\\[0\\]"):
            paged((5, last * 0 + 17))
        with pytest.raises(ValueError, match="non-decreasing"):
            paged((2, torch.tensor([0, 9, 5], dtype=torch.int32)))
        with pytest.raises(ValueError, match="exceeds q's 14 tokens"):
            paged((2, torch.tensor([0, 5, 15], dtype=torch.int32)))
        with pytest.raises(ValueError, match="exceeds k/v's 17 tokens"):
            ragged_prefill(q, k, k, qo_indptr, _indptr([8, 10], device))


# ---- GPU only: bf16, realistic shapes, no sync, CUDA graphs ------------------------------------


def _gpu_lens(batch: int, length: int) -> tuple[list[int], list[int]]:
    # Different lengths per request (L, L/2, ...), appends (qo < kv) on every other one.
    kv = [max(1, length >> (i % 3)) for i in range(batch)]
    qo = [n if i % 2 == 0 else max(1, n // 3) for i, n in enumerate(kv)]
    return qo, kv


@pytest.mark.cuda
@pytest.mark.parametrize("length", [512, 1000, 2048, 4096])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_cuda_bf16_grid(length, batch):
    dev = torch.device("cuda")
    qo, kv = _gpu_lens(batch, length)
    _check_paged(
        qo, kv, 32, 8, 128, 16, "NHD", dev, dtype=torch.bfloat16, five_d=False, causal=True
    )
    _check_ragged(qo, kv, 32, 8, 128, dev, dtype=torch.bfloat16, causal=True)


@pytest.mark.cuda
def test_cuda_variants_bf16():
    dev = torch.device("cuda")
    for kw in VARIANTS:
        _check_paged(
            [300, 0, 1000], [700, 9, 1000], 32, 8, 128, 16, "HND", dev, dtype=torch.bfloat16, **kw
        )
    _check_ragged([300, 2000], [700, 2000], 8, 1, 128, dev, dtype=torch.bfloat16, causal=True)


@pytest.mark.cuda
def test_cuda_calls_never_sync():
    dev = torch.device("cuda")
    qo, kv = _gpu_lens(4, 1024)
    cache, table = _paged_batch(kv, 8, 128, 16, "NHD", torch.bfloat16, dev)
    q, k, v, qo_indptr, kv_indptr = _ragged_inputs(qo, kv, 32, 8, 128, torch.bfloat16, dev)
    paged_prefill(q, cache, qo_indptr, *table, causal=True)  # compile first
    ragged_prefill(q, k, v, qo_indptr, kv_indptr, causal=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        paged_out, _ = paged_prefill(q, cache, qo_indptr, *table, causal=True, return_lse=True)
        ragged_out, _ = ragged_prefill(q, k, v, qo_indptr, kv_indptr, causal=True, return_lse=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # No sync raised above; the outputs (read only now, a sync) are real values.
    assert torch.isfinite(paged_out).all() and torch.isfinite(ragged_out).all()


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_cuda_graph_replays_with_new_lengths(kind):
    """Capture one call, then change the indptr contents (same shapes) and replay."""
    dev = torch.device("cuda")
    ps, hq, hk, d, batch, total_q, max_kv = 16, 32, 8, 128, 6, 3000, 4096
    max_pages = batch * max_kv // ps
    q = torch.randn(total_q, hq, d, dtype=torch.bfloat16, device=dev)
    cache = torch.randn(max_pages, 2, ps, hk, d, dtype=torch.bfloat16, device=dev)
    k = torch.randn(batch * max_kv, hk, d, dtype=torch.bfloat16, device=dev)
    v = torch.randn_like(k)
    qo_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
    indices = torch.randperm(max_pages, device=dev).to(torch.int32)
    last = torch.ones(batch, dtype=torch.int32, device=dev)

    def set_lengths(qo, kv):
        qo_indptr.copy_(_indptr(qo, dev))
        if kind == "ragged":
            kv_indptr.copy_(_indptr(kv, dev))
            return
        pages = [-(-n // ps) for n in kv]
        kv_indptr.copy_(_indptr(pages, dev))
        last.copy_(
            torch.tensor(
                [n - (p - 1) * ps if p else 0 for n, p in zip(kv, pages, strict=True)],
                dtype=torch.int32,
            )
        )

    def call():
        if kind == "paged":
            return paged_prefill(
                q, cache, qo_indptr, kv_indptr, indices, last, causal=True, out=out, return_lse=True
            )
        return ragged_prefill(q, k, v, qo_indptr, kv_indptr, causal=True, out=out, return_lse=True)

    out = torch.empty_like(q)
    set_lengths([500] * batch, [500] * batch)
    call()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = call()
    cases = [
        ([500] * batch, [500] * batch),
        ([2000, 1, 0, 300, 600, 99], [4096, 1, 7, 300, 2000, 99]),
        ([100, 200, 0, 0, 0, 50], [100, 3000, 0, 0, 0, 4000]),  # 350 of 3000 rows
    ]
    for qo, kv in cases:
        set_lengths(qo, kv)
        graph.replay()
        if kind == "paged":
            kk, vv = split_kv_cache(cache, "NHD")
            ref = batch_prefill_paged_ref(
                q,
                kk,
                vv,
                qo_indptr,
                kv_indptr,
                indices,
                last,
                AttentionVariant(sm_scale=1 / math.sqrt(d), causal=True),
            )
        else:
            ref = batch_prefill_ragged_ref(
                q,
                k,
                v,
                qo_indptr,
                kv_indptr,
                AttentionVariant(sm_scale=1 / math.sqrt(d), causal=True),
            )
        _compare(out, lse, *ref, torch.bfloat16, rows=sum(qo))

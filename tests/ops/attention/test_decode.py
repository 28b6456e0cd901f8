"""Batch/single decode over a paged KV cache against the float64 reference and the corpus."""

from __future__ import annotations

import json
import math

import pytest
import torch

from flashtune.ops.attention import (
    BatchDecodeWithPagedKVCacheWrapper,
    batch_decode_ref,
    single_decode_ref,
    single_decode_with_kv_cache,
    split_kv_cache,
)
from flashtune.ops.attention.page import build_page_table

# (dtype, atol, rtol) of the output; the LSE is compared with LSE_ATOL (base-2 units).
TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
LSE_ATOL = 1e-3


def _cache(num_pages, page_size, hk, d, layout, dtype, device, five_d=True):
    shape = (num_pages, page_size, hk, d) if layout == "NHD" else (num_pages, hk, page_size, d)
    if five_d:
        return torch.randn(num_pages, 2, *shape[1:], dtype=dtype, device=device)
    return (
        torch.randn(shape, dtype=dtype, device=device),
        torch.randn(shape, dtype=dtype, device=device),
    )


def _check(
    lens,
    hq,
    hk,
    d,
    page_size,
    layout,
    dtype,
    device,
    *,
    five_d=True,
    split=None,
    window_left=-1,
    soft_cap=None,
    sm_scale=None,
    wrapper=None,
    launch=None,
):
    indptr, indices, last, num_pages = build_page_table(lens, page_size, extra_pages=2)
    cache = _cache(num_pages, page_size, hk, d, layout, dtype, device, five_d)
    q = torch.randn(len(lens), hq, d, dtype=dtype, device=device)
    if wrapper is None:
        # FlashInfer's recommended 128 MB on the GPU (batch 257 with MQA needs ~20 MB).
        mb = 128 if torch.device(device).type == "cuda" else 8
        ws = torch.empty(mb * 2**20, dtype=torch.uint8, device=device)
        wrapper = BatchDecodeWithPagedKVCacheWrapper(ws, layout)
    wrapper.plan(
        indptr.to(device),
        indices.to(device),
        last.to(device),
        hq,
        hk,
        d,
        page_size,
        window_left=window_left,
        logits_soft_cap=soft_cap,
        q_data_type=dtype,
        sm_scale=sm_scale,
        fixed_split_size=split,
        launch=launch,
    )
    out, lse = wrapper.run(q, cache, return_lse=True)
    k, v = split_kv_cache(cache, layout)
    ref_o, ref_lse = batch_decode_ref(
        q,
        k,
        v,
        indptr.to(device),
        indices.to(device),
        last.to(device),
        sm_scale=sm_scale,
        window_left=window_left,
        logits_soft_cap=soft_cap,
    )
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, ref_o, atol=atol, rtol=rtol)
    torch.testing.assert_close(
        lse, ref_lse, atol=LSE_ATOL * (10 if dtype == torch.bfloat16 else 1), rtol=0
    )
    return wrapper


# Small interpreter grid: every group size, head dims 64/128, page sizes 1/16/odd, both
# layouts, with and without split KV; lengths include empty and partial-page requests.
CASES = [
    # lens, hq, hk, d, page_size, layout, split
    ([0, 1, 37, 100, 16], 8, 2, 64, 16, "NHD", None),
    ([0, 1, 37, 100, 16], 8, 2, 64, 16, "HND", 16),
    ([50], 4, 4, 64, 1, "NHD", 16),
    ([33, 7], 10, 2, 64, 4, "HND", None),  # group 5
    ([33, 0, 70], 12, 2, 128, 16, "NHD", 32),  # group 6
    ([65, 3], 16, 2, 64, 5, "NHD", 16),  # group 8, odd page size
    ([20], 2, 1, 128, 16, "HND", None),
    ([9, 64, 17, 1, 30, 45, 2, 80, 5, 11, 23, 60], 4, 1, 64, 16, "NHD", 32),  # larger batch
]


@pytest.mark.parametrize("lens,hq,hk,d,page_size,layout,split", CASES)
def test_batch_decode_matches_reference(lens, hq, hk, d, page_size, layout, split, device):
    _check(lens, hq, hk, d, page_size, layout, torch.float16, device, split=split)


@pytest.mark.parametrize(
    "variant",
    [
        dict(window_left=20),
        dict(window_left=0, split=16),
        dict(soft_cap=5.0, split=16),
        dict(sm_scale=0.3),
        dict(five_d=False),
    ],
)
def test_batch_decode_variants(variant, device):
    _check([70, 1, 33], 8, 2, 64, 16, "NHD", torch.float16, device, **variant)


@pytest.mark.parametrize(
    "lens,hq,hk,d,page_size,layout,split",
    [c for c in CASES if c[-1] is not None] + [([70, 1, 33, 0], 8, 2, 64, 16, "NHD", 16)],
)
def test_fused_merge_matches_reference(lens, hq, hk, d, page_size, layout, split, device):
    # Split tiles merged by their last chunk in the attention kernel (no merge kernel); the
    # counters are back at zero after the run, for the next launch.
    from flashtune.ops.attention.decode.config import DecodeLaunch, DecodeTactic

    launch = DecodeLaunch(tactic=DecodeTactic(16, 4, 2, fused_merge=True))
    w = _check(lens, hq, hk, d, page_size, layout, torch.float16, device, split=split,
               launch=launch)  # fmt: skip
    plan = w._planner.plan
    assert plan.host.has_split and int(plan.counters.abs().sum()) == 0
    # A second run over stale partials, with a window and a soft cap as well.
    plan.partial_o.fill_(float("nan"))
    _check(lens, hq, hk, d, page_size, layout, torch.float16, device, split=split,
           launch=launch, wrapper=w, window_left=20, soft_cap=5.0)  # fmt: skip


def test_decode_is_deterministic_and_replans(device):
    lens = [100, 5, 64]
    indptr, indices, last, n = build_page_table(lens, 16)
    cache = torch.randn(n, 2, 16, 2, 64, dtype=torch.float16, device=device)
    q = torch.randn(3, 8, 64, dtype=torch.float16, device=device)
    ws = torch.empty(2**22, dtype=torch.uint8, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(indptr, indices, last, 8, 2, 64, 16, fixed_split_size=32)
    a = w.run(q, cache)
    b = w.run(q, cache)
    assert torch.equal(a, b)
    # Re-planning the same wrapper for other lengths gives the other lengths' result.
    _check([3, 90], 8, 2, 64, 16, "NHD", torch.float16, device, split=16, wrapper=w)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_decode(layout, device):
    kv_len, hq, hk, d = 45, 8, 2, 64
    q = torch.randn(hq, d, dtype=torch.float16, device=device)
    shape = (kv_len, hk, d) if layout == "NHD" else (hk, kv_len, d)
    k = torch.randn(shape, dtype=torch.float16, device=device)
    v = torch.randn(shape, dtype=torch.float16, device=device)
    out, lse = single_decode_with_kv_cache(q, k, v, kv_layout=layout, return_lse=True)
    kn, vn = (k, v) if layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
    ref_o, ref_lse = single_decode_ref(q, kn, vn)
    torch.testing.assert_close(out, ref_o, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse, ref_lse, atol=LSE_ATOL, rtol=0)


def test_matches_corpus_definition_reference(trace_corpus, device):
    """The FlashInfer-Trace reference of gqa_paged_decode_h32_kv8_d128_ps64 agrees."""
    path = trace_corpus / "definitions/gqa_paged/gqa_paged_decode_h32_kv8_d128_ps64.json"
    defn = json.loads(path.read_text())
    ns: dict = {}
    exec(defn["reference"], ns)
    lens = [70, 1, 128]
    indptr, indices, last, n = build_page_table(lens, 64)
    k_cache = torch.randn(n, 64, 8, 128, dtype=torch.float16, device=device)
    v_cache = torch.randn(n, 64, 8, 128, dtype=torch.float16, device=device)
    q = torch.randn(3, 32, 128, dtype=torch.float16, device=device)
    scale = 1 / math.sqrt(128)
    ref_o, ref_lse = ns["run"](q, k_cache, v_cache, indptr, indices, last, scale)
    ws = torch.empty(2**22, dtype=torch.uint8, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(indptr, indices, last, 32, 8, 128, 64, q_data_type=torch.float16, sm_scale=scale)
    out, lse = w.run(q, (k_cache, v_cache), return_lse=True)
    # The corpus reference rounds its output to bf16.
    torch.testing.assert_close(out.float(), ref_o.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=0)


# --------------------------------------------------------------------------- bad input


def _planned(device, **kw):
    indptr, indices, last, n = build_page_table([20, 5], 16)
    ws = torch.empty(2**22, dtype=torch.uint8, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(indptr, indices, last, 8, 2, 64, 16, **kw)
    cache = torch.randn(n, 2, 16, 2, 64, dtype=torch.float16, device=device)
    q = torch.randn(2, 8, 64, dtype=torch.float16, device=device)
    return w, q, cache, (indptr, indices, last, n)


def test_run_before_plan(device):
    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(1024, dtype=torch.uint8, device=device))
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(torch.randn(1, 8, 64, device=device), torch.randn(1, 2, 16, 2, 64, device=device))


def test_bad_shapes_at_run(device):
    w, q, cache, _ = _planned(device)
    with pytest.raises(ValueError, match="num_qo_heads"):
        w.run(torch.randn(2, 4, 64, dtype=torch.float16, device=device), cache)
    with pytest.raises(ValueError, match="head_dim"):
        w.run(q, torch.randn(cache.shape[0], 2, 16, 2, 32, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="num_kv_heads"):
        w.run(q, torch.randn(cache.shape[0], 2, 16, 4, 64, dtype=torch.float16, device=device))
    with pytest.raises(TypeError, match="dtype"):
        w.run(q.float(), cache)
    with pytest.raises(ValueError, match="meta"):
        w.run(q.to("meta"), cache)


def test_bad_page_tables(device):
    ws = torch.empty(2**22, dtype=torch.uint8, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(ws)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    with pytest.raises(ValueError, match="non-decreasing"):
        w.plan(i32([0, 2, 1]), i32([0, 1]), i32([1, 1]), 8, 2, 64, 16)
    with pytest.raises(ValueError, match="last_page_len"):
        w.plan(i32([0, 1, 2]), i32([0, 1]), i32([0, 1]), 8, 2, 64, 16)
    with pytest.raises(ValueError, match="last_page_len"):
        w.plan(i32([0, 1, 2]), i32([0, 1]), i32([17, 1]), 8, 2, 64, 16)
    with pytest.raises(ValueError, match="indices"):
        w.plan(i32([0, 1, 3]), i32([0, 1]), i32([1, 1]), 8, 2, 64, 16)
    with pytest.raises(ValueError, match="multiple"):
        w.plan(i32([0, 1]), i32([0]), i32([1]), 6, 4, 64, 16)
    # Page ids outside the cache: caught at run, before any launch.
    w.plan(i32([0, 1, 2]), i32([0, 9]), i32([3, 4]), 8, 2, 64, 16)
    cache = torch.randn(4, 2, 16, 2, 64, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="pages"):
        w.run(torch.randn(2, 8, 64, dtype=torch.float16, device=device), cache)


def test_graph_mode_buffer_checks(device):
    ws = torch.empty(2**22, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match="needs"):
        BatchDecodeWithPagedKVCacheWrapper(ws, use_cuda_graph=True)
    i32 = lambda n: torch.zeros(n, dtype=torch.int32, device=device)  # noqa: E731
    with pytest.raises(ValueError, match="last_page_len_buffer"):
        BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", True, False, i32(5), i32(10), i32(3))
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", True, False, i32(3), i32(4), i32(2))
    indptr, indices, last, _ = build_page_table([20, 5, 7], 16)
    with pytest.raises(ValueError, match="batch_size 2"):
        w.plan(indptr, indices, last, 8, 2, 64, 16)
    indptr, indices, last, _ = build_page_table([100, 5], 16)
    with pytest.raises(ValueError, match="indices_buffer"):
        w.plan(indptr, indices, last, 8, 2, 64, 16)
    small = BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(64, dtype=torch.uint8, device=device),
        "NHD",
        True,
        False,
        i32(3),
        i32(4),
        i32(2),
    )
    indptr, indices, last, _ = build_page_table([20, 5], 16)
    with pytest.raises(ValueError, match="workspace"):
        small.plan(indptr, indices, last, 8, 2, 64, 16)


def test_plan_splits_no_further_than_the_workspace_holds(device):
    # Planned for 132 SMs, a 2000-token request would be cut into ~32 chunks; the workspace
    # holds 10 partial rows (fp32 output + LSE per head) next to the LSE scratch, so the plan
    # uses a coarser split that fits, and the result is still exact.
    from flashtune.ops.attention.decode.config import DecodeLaunch
    from flashtune.ops.attention.decode.plan import partial_capacity

    lens, hq, hk, d, ps = [2000, 3, 5], 8, 2, 64, 16
    ws_bytes = 256 + 255 + 10 * hq * (d + 1) * 4
    assert partial_capacity(ws_bytes, len(lens), hq, d) == 10
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr, indices, last, num_pages = build_page_table(lens, ps, extra_pages=2)
    w.plan(indptr, indices, last, hq, hk, d, ps, launch=DecodeLaunch(sm_count=132))
    host = w._planner.plan.host
    assert 1 < host.num_partial_rows <= 10
    cache = _cache(num_pages, ps, hk, d, "NHD", torch.float16, device)
    q = torch.randn(len(lens), hq, d, dtype=torch.float16, device=device)
    k, v = split_kv_cache(cache, "NHD")
    ref, _ = batch_decode_ref(q, k, v, indptr, indices, last)
    torch.testing.assert_close(w.run(q, cache), ref, atol=2e-3, rtol=2e-3)


def test_window_left_must_match_plan(device):
    w, q, cache, _ = _planned(device, window_left=4)
    with pytest.raises(ValueError, match="window_left"):
        w.run(q, cache, window_left=8)


# --------------------------------------------------------------------------- GPU (bf16, large)


GPU_GRID = [
    # layout, hq, hk, d, page_size: every head dim x page size, every group size 1..8
    ("NHD", 32, 8, 64, 1),
    ("HND", 32, 8, 64, 16),
    ("NHD", 32, 8, 64, 64),
    ("HND", 32, 8, 128, 1),
    ("NHD", 32, 8, 128, 16),
    ("HND", 32, 8, 128, 64),
    ("NHD", 32, 8, 256, 1),
    ("HND", 32, 8, 256, 16),
    ("NHD", 32, 8, 256, 64),
    ("NHD", 8, 8, 128, 16),
    ("HND", 16, 8, 128, 16),
    ("NHD", 24, 8, 128, 64),
    ("HND", 40, 8, 128, 16),
    ("NHD", 48, 8, 128, 16),
    ("HND", 56, 8, 128, 16),
    ("NHD", 64, 8, 128, 16),
    ("NHD", 32, 1, 128, 16),
]


@pytest.mark.cuda
@pytest.mark.parametrize("layout,hq,hk,d,page_size", GPU_GRID)
def test_batch_decode_gpu_grid(layout, hq, hk, d, page_size):
    g = torch.Generator().manual_seed(hq * 1000 + d + page_size)
    lens = torch.randint(0, 3000, (257,), generator=g).tolist()
    lens[0], lens[1], lens[2] = 0, 1, 20000
    _check(lens, hq, hk, d, page_size, layout, torch.bfloat16, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("hq,hk,d", [(32, 8, 128), (64, 8, 128), (32, 4, 64)])
def test_batch_decode_gpu_fused_merge(hq, hk, d):
    from flashtune.ops.attention.decode.config import DecodeLaunch, DecodeTactic

    g = torch.Generator().manual_seed(hq + d)
    lens = torch.randint(0, 3000, (33,), generator=g).tolist()
    lens[0], lens[1], lens[2] = 0, 1, 20000
    launch = DecodeLaunch(tactic=DecodeTactic(64, 4, 2, fused_merge=True))
    for _ in range(2):  # the counters each last arrival reset serve the second launch
        w = _check(lens, hq, hk, d, 16, "NHD", torch.bfloat16, "cuda", split=256, launch=launch)
        assert w._planner.plan.host.has_split
        assert int(w._planner.plan.counters.abs().sum()) == 0


@pytest.mark.cuda
@pytest.mark.parametrize(
    "variant",
    [dict(window_left=500), dict(soft_cap=30.0), dict(sm_scale=0.05), dict(five_d=False)],
)
def test_batch_decode_gpu_variants(variant):
    lens = [0, 1, 7000, 300, 64, 4097] * 8
    _check(lens, 32, 8, 128, 16, "NHD", torch.bfloat16, "cuda", **variant)


@pytest.mark.cuda
def test_cuda_graph_replay_after_replan():
    dev = torch.device("cuda")
    batch, hq, hk, d, ps = 33, 32, 8, 128, 16
    max_pages = 4096
    ws = torch.empty(128 * 2**20, dtype=torch.uint8, device=dev)
    ip_buf = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
    idx_buf = torch.zeros(max_pages, dtype=torch.int32, device=dev)
    last_buf = torch.zeros(batch, dtype=torch.int32, device=dev)
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", True, False, ip_buf, idx_buf, last_buf)
    cache = torch.randn(max_pages, 2, ps, hk, d, dtype=torch.bfloat16, device=dev)
    q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device=dev)
    out = torch.empty_like(q)
    lse = torch.empty(batch, hq, dtype=torch.float32, device=dev)

    def plan(lens):
        indptr, indices, last, _ = build_page_table(
            lens, ps, extra_pages=max_pages - sum(-(-n // ps) for n in lens)
        )
        w.plan(indptr, indices, last, hq, hk, d, ps, q_data_type=torch.bfloat16)
        return indptr, indices, last

    plan([100] * batch)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w.run(q, cache, out=out, lse=lse, return_lse=True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, out=out, lse=lse, return_lse=True)
    # Each plan must fit the 4096 pages the graph was captured with.
    for lens in ([100] * batch, [30000] + [1] * (batch - 1), [0, 4000] * 16 + [17]):
        indptr, indices, last = plan(lens)
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        k, v = split_kv_cache(cache, "NHD")
        ref_o, ref_lse = batch_decode_ref(
            q, k, v, indptr.cuda(), indices.cuda(), last.cuda(), compute_dtype=torch.float32
        )
        torch.testing.assert_close(out, ref_o, atol=1.6e-2, rtol=1.6e-2)
        torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=0)


# --------------------------------------------------------------------------- schema


def _schema_wrapper(hq, hk, d, page_size, lens=(37, 100, 16)):
    indptr, indices, last, num_pages = build_page_table(list(lens), page_size)
    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(2**20, dtype=torch.uint8), "NHD")
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type=torch.bfloat16)
    return w, num_pages


@pytest.mark.parametrize("layout,five_d", [("NHD", True), ("HND", False)])
def test_definition_matches_corpus(trace_corpus, layout, five_d, monkeypatch):
    """The Definition of run() at Llama-3.1-8B shapes equals the corpus file's contract."""
    from flashtune.data import Definition

    path = trace_corpus / "definitions/gqa_paged/gqa_paged_decode_h32_kv8_d128_ps64.json"
    corpus = Definition.model_validate_json(path.read_text())
    indptr, indices, last, num_pages = build_page_table([70, 200, 1], 64)
    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(2**20, dtype=torch.uint8), layout)
    w.plan(indptr, indices, last, 32, 8, 128, 64, q_data_type=torch.bfloat16)
    q = torch.empty(3, 32, 128, dtype=torch.bfloat16, device="meta")
    kv = _cache(num_pages, 64, 8, 128, layout, torch.bfloat16, "meta", five_d)

    # No kernel may run: the definition comes from shapes and the plan alone.
    def boom(*a, **k):
        raise AssertionError("definition() launched the op")

    from flashtune.ops.attention import decode

    monkeypatch.setattr(decode, "run_plan", boom)
    ours = w.run.definition(q, kv)
    assert ours.name == corpus.name == "gqa_paged_decode_h32_kv8_d128_ps64"
    assert ours.op_type == corpus.op_type
    dump = lambda m: {k: v.model_dump(exclude_none=True) for k, v in m.items()}  # noqa: E731
    assert dump(ours.axes) == dump(corpus.axes)
    assert dump(ours.inputs) == dump(corpus.inputs)
    assert dump(ours.outputs) == dump(corpus.outputs)
    assert ours.constraints == corpus.constraints
    bound = w.run.bind(q, kv)
    assert bound.var_axes == {
        "batch_size": 3,
        "num_pages": num_pages,
        "len_indptr": 4,
        "num_kv_indices": 7,
    }


def test_definition_reference_agrees_with_corpus_reference(trace_corpus):
    """Our emitted reference and the corpus's compute the same thing (float32, CPU)."""
    from flashtune.data import Definition

    path = trace_corpus / "definitions/gqa_paged/gqa_paged_decode_h32_kv8_d128_ps64.json"
    corpus = Definition.model_validate_json(path.read_text())
    w, num_pages = _schema_wrapper(32, 8, 128, 64, lens=(70, 0, 130))
    q = torch.randn(3, 32, 128).to(torch.bfloat16)
    kv = _cache(num_pages, 64, 8, 128, "NHD", torch.bfloat16, "cpu")
    ours = w.run.definition(q, kv)
    args = dict(
        q=q,
        k_cache=kv[:, 0],
        v_cache=kv[:, 1],
        kv_indptr=w._kv_indptr,
        kv_indices=w._kv_indices,
        kv_last_page_len=w._kv_last_page_len,
        sm_scale=w._sm_scale,
    )
    results = []
    for definition in (ours, corpus):
        scope: dict = {}
        exec(compile(definition.reference, definition.name, "exec"), scope)
        results.append(scope["run"](**args))
    (o1, l1), (o2, l2) = results
    assert o1.dtype == torch.bfloat16 and l1.dtype == torch.float32
    torch.testing.assert_close(o1.float(), o2.float(), atol=1.6e-2, rtol=1.6e-2)
    torch.testing.assert_close(l1, l2, atol=1e-4, rtol=0)


def test_definition_names_follow_shapes_and_variants():
    w, num_pages = _schema_wrapper(24, 4, 64, 16)
    q = torch.empty(3, 24, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(num_pages, 2, 16, 4, 64, dtype=torch.bfloat16, device="meta")
    definition = w.run.definition(q, kv)
    assert definition.name == "gqa_paged_decode_h24_kv4_d64_ps16"
    assert "window_left=-1" in definition.reference
    indptr, indices, last, _ = build_page_table([37, 100, 16], 16)
    w.plan(
        indptr,
        indices,
        last,
        24,
        4,
        64,
        16,
        q_data_type=torch.bfloat16,
        window_left=7,
        logits_soft_cap=30.0,
    )
    definition = w.run.definition(q, kv)
    assert "window_left=7, logits_soft_cap=30.0" in definition.reference


def test_definition_before_plan_is_an_error():
    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(2**20, dtype=torch.uint8), "NHD")
    q = torch.empty(3, 8, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(4, 2, 16, 2, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="kv_indptr"):
        w.run.definition(q, kv)


def test_model_examples_register_decode():
    from flashtune.ops.attention.decode import decode_examples
    from flashtune.schema.dump import model_definitions

    defs = model_definitions(["llama-3.1-8b", "llama-3.1-70b-tp8"], [decode_examples])
    assert "gqa_paged_decode_h32_kv8_d128_ps16" in defs
    assert "gqa_paged_decode_h8_kv1_d128_ps16" in defs


def test_fast_page_table_check_agrees_with_the_detailed_one():
    """plan()'s one-pass validation accepts exactly the valid tables, with the same lengths."""
    import numpy as np

    from flashtune.ops.attention import page

    rng = np.random.default_rng(5)
    for _ in range(200):
        batch, ps = int(rng.integers(1, 9)), int(rng.choice([1, 4, 16]))
        pages = rng.integers(0, 4, batch)
        ip = np.concatenate([[0], np.cumsum(pages)]).astype(np.int64)
        lp = np.where(pages > 0, rng.integers(1, ps + 1, batch), 0).astype(np.int64)
        if rng.random() < 0.5:  # corrupt one entry
            b = int(rng.integers(batch))
            lp[b] = int(rng.choice([-1, 0, ps + 1]))
        try:
            want = page.explain_page_table(ip, lp, int(ip[-1]), ps)
        except ValueError:
            with pytest.raises(ValueError, match="last_page_len"):
                page.validate_host_page_table(ip, lp, int(ip[-1]), ps)
            continue
        got = page.validate_host_page_table(ip, lp, int(ip[-1]), ps)
        assert np.array_equal(got[2], want[2])


# --------------------------------------------------------------------------- plan equivalence


def _plan_digest(cases: int = 300, seed: int = 1234) -> str:
    """A SHA-256 of every plan (and every validation error) on `cases` random page tables.

    Host-side plan() optimizations must not change any plan: this digest, frozen below from
    the planner before they were made, covers the work list, merge info, CTA costs, the
    packed workspace integers and every scalar of the plan (batch 1..256, KV 0..32k, page
    sizes 1/16/64, 132 or 2 SMs, split/no-split/fixed chunks, windows, CUDA-graph mode).
    """
    import hashlib

    import numpy as np

    from flashtune.ops.attention.decode.config import DecodeLaunch

    rng = np.random.default_rng(seed)
    h = hashlib.sha256()
    ws = torch.empty(64 * 2**20, dtype=torch.uint8)
    for i in range(cases):
        sms = int(rng.choice([132, 2, 78]))
        launch = DecodeLaunch(sm_count=sms)  # plan for this many SMs
        batch = int(rng.choice([1, 2, 3, 5, 8, 16, 17, 33, 64, 100, 256]))
        ps = int(rng.choice([1, 16, 64]))
        max_kv = int(rng.choice([0, 1, 100, 2048, 8192, 32768]))
        lens = rng.integers(0, max_kv + 1, batch) if max_kv else np.zeros(batch, np.int64)
        if rng.random() < 0.3:
            lens = np.full(batch, int(lens.max(initial=0)))
        pages = -(-lens // ps)
        indptr = np.zeros(batch + 1, np.int64)
        np.cumsum(pages, out=indptr[1:])
        last = np.where(pages > 0, lens - (pages - 1) * ps, 0)
        nnz = int(indptr[-1])
        hq, hk = [(32, 8), (32, 32), (8, 1), (64, 4)][int(rng.integers(4))]
        d = int(rng.choice([64, 128, 256]))
        kind = rng.random()
        kw: dict = {}
        if kind < 0.15:
            kw["fixed_split_size"] = int(rng.choice([16, 100, 512, 4096]))
        elif kind < 0.25:
            kw["disable_split_kv"] = True
        if rng.random() < 0.15:
            kw["window_left"] = int(rng.integers(0, 4096))
        graph = rng.random() < 0.2
        ip_t = torch.from_numpy(indptr.astype(np.int32))
        last_t = torch.from_numpy(last.astype(np.int32))
        if rng.random() < 0.05 and batch > 1:  # an invalid table: the error must match
            last_t = last_t.clone()
            last_t[int(rng.integers(batch))] = ps + 1
        idx = torch.zeros(nnz + int(rng.integers(0, 3)), dtype=torch.int32)
        if graph:
            w = BatchDecodeWithPagedKVCacheWrapper(
                ws,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=ip_t.clone(),
                paged_kv_indices_buffer=torch.zeros(nnz + 8, dtype=torch.int32),
                paged_kv_last_page_len_buffer=last_t.clone(),
            )
        else:
            w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        h.update(repr((i, sms, batch, ps, hq, hk, d, sorted(kw.items()), graph)).encode())
        try:
            w.plan(ip_t, idx, last_t, hq, hk, d, ps, q_data_type=torch.float16, launch=launch, **kw)
        except (ValueError, TypeError) as e:
            h.update(f"{type(e).__name__}: {e}".encode())
            continue
        p = w._planner.plan
        host = p.host
        for a in (host.work_indptr, host.work, host.merge_info, host.cta_cost):
            h.update(repr((a.dtype.str, a.shape)).encode() + np.ascontiguousarray(a).tobytes())
        scalars = (
            host.num_ctas,
            host.num_partial_rows,
            host.kv_chunk_size,
            p.batch,
            p.total_qo,
            p.group,
            p.block_m,
            p.sm_scale,
            p.window_left,
            p.grid_ctas,
            p.nnz_pages,
            p.always_merge,
            p.mask_window,
            p.sm_count,
        )
        h.update(repr(scalars).encode())
        for t in (
            p.work_indptr,
            p.work,
            p.merge_info,
            p.partial_o,
            p.partial_lse,
            p.lse_scratch,
            p.kv_indices,
        ):
            # Shapes and strides, not storage offsets: where the arrays live in which
            # buffer is not the plan.
            h.update(repr((t.shape, t.stride(), t.dtype)).encode())
        for t in (p.work_indptr, p.work[: host.num_work], p.merge_info):
            h.update(t.numpy().tobytes())
        for a in (p.qo_indptr_host, p.indptr_host, p.last_host):
            h.update(repr((a.dtype.str, a.shape)).encode() + a.tobytes())
    return h.hexdigest()


# Frozen from the planner at commit a90ce93 (before the plan-path optimizations of issue
# "decode plan host cost, part 3"), recomputed for intended changes: the default tactic's 2
# stages fit 4 CTAs per SM (the persistent grid and chunk alignment follow); the integer
# arrays moved to a planner-owned buffer (plans identical; one "workspace too small" error
# names fewer bytes); plans cap their partial rows to the workspace and the plan no longer
# carries max_partials (no plan changed; four fixed-split cases that failed still fail, now
# naming the partial rows); the grid counts the kernel's registers as well as its shared
# memory (decode/registers.py: e.g. d256's 196 registers fit 2 CTAs where shared memory has
# room for 4; with the register limit off the digest is the one before). Recompute with
# _plan_digest() only for an intended change.
_PLAN_DIGEST = "99828b9dadef470bb6aa1c248a11e7b9dddc6e00b387eabbf584576895e77c7f"


def test_plans_are_unchanged_by_host_optimizations():
    assert _plan_digest() == _PLAN_DIGEST


def test_wrappers_sharing_a_workspace_keep_their_own_plans(device):
    # Serving engines share one float workspace between wrappers. Planning a second wrapper
    # must not overwrite the first one's work list (it once did: the first run then read
    # the second plan's items, an illegal memory access on the GPU).
    ws = torch.empty(8 * 2**20, dtype=torch.uint8, device=device)
    first = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    second = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    _check([40, 3, 77], 8, 2, 64, 16, "NHD", torch.float16, device, split=16, wrapper=first)
    _check([5, 300], 8, 2, 64, 16, "NHD", torch.float16, device, split=32, wrapper=second)
    # Re-run the first wrapper on its own (unchanged) plan after the second planned.
    plan = first._planner.plan
    lens = [40, 3, 77]
    indptr, indices, last, num_pages = build_page_table(lens, 16, extra_pages=2)
    cache = _cache(num_pages, 16, 2, 64, "NHD", torch.float16, device)
    q = torch.randn(3, 8, 64, dtype=torch.float16, device=device)
    first.plan(
        indptr.to(device),
        indices.to(device),
        last.to(device),
        8,
        2,
        64,
        16,
        q_data_type=torch.float16,
        fixed_split_size=16,
    )
    second.plan(
        *(t.to(device) for t in build_page_table([5, 300], 16)[:3]),
        8,
        2,
        64,
        16,
        q_data_type=torch.float16,
        fixed_split_size=32,
    )
    assert plan is not first._planner.plan
    out = first.run(q, cache)
    k, v = split_kv_cache(cache, "NHD")
    ref, _ = batch_decode_ref(q, k, v, indptr.to(device), indices.to(device), last.to(device))
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)

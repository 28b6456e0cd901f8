"""DSA kernels against their references: the indexer (fp8 scores over paged, packed keys, then
top-k as cache slots; rows shorter than topk padded with -1, empty rows, page sizes 1 and 64)
and the sparse attention (gathered latent rows, -1 slots skipped, split and unsplit, page
sizes 1 and 64). Indexer rows are compared as index sets with ties at the k-th score
accepted (flashtune.bench.index_sets), as the evaluator compares them.

Interpreter tests run the Triton kernels on CPU tensors, the attention in float16 (the
interpreter's bf16 dot is wrong; fp8 works); the `cuda` tests run bfloat16 / fp8 at
DeepSeek-V3.2's shapes on the GPU."""

from __future__ import annotations

import math

import pytest
import torch

from flashtune.bench.index_sets import index_set_problem, index_set_scorer
from flashtune.ops.dsa import (
    dsa_sparse_attention,
    dsa_sparse_attention_ref,
    dsa_topk_indexer,
    dsa_topk_indexer_ref,
    pack_index_cache,
    unpack_index_cache,
)
from flashtune.ops.dsa.config import AttentionTactic, IndexerTactic
from flashtune.ops.dsa.launch import run_indexer, run_sparse_attention
from flashtune.ops.dsa.reference import indexer_scores_at
from flashtune.ops.dsa.topk import SelectTactic

LSE_TOL = 1e-3
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


# --------------------------------------------------------------------------- inputs


def _indexer_inputs(seq_lens, heads, head_dim, page_size, device, spare_pages=3):
    """Random fp8 queries, packed keys in shuffled pages, positive and negative weights."""
    batch = len(seq_lens)
    pages = [-(-n // page_size) for n in seq_lens]
    max_pages = max(max(pages), 1) + 1  # a table wider than any request needs
    num_pages = sum(pages) + spare_pages
    perm = torch.randperm(num_pages)
    table = torch.full((batch, max_pages), 0, dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[start : start + n].to(torch.int32)
        start += n
    q = (torch.randn(batch, heads, head_dim) * 2).to(torch.float8_e4m3fn)
    keys = torch.randn(num_pages, page_size, head_dim) * torch.rand(num_pages, page_size, 1) * 3
    weights = torch.randn(batch, heads) / math.sqrt(heads)
    return (
        q.to(device),
        pack_index_cache(keys).to(device),
        weights.to(device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        table.to(device),
    )


def _assert_index_sets(out, ref, inputs):
    names = ("q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table")
    scorer = index_set_scorer(_IndexerDef, "topk_indices")
    problem = index_set_problem(
        "topk_indices", out, ref, scorer, dict(zip(names, inputs, strict=True))
    )
    assert problem is None, problem


class _IndexerDef:
    op_type = "dsa_paged"
    name = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"


def _attention_inputs(tokens, heads, d_ckv, d_kpe, num_pages, page_size, topk, dtype, device):
    slots = num_pages * page_size
    qn = torch.randn(tokens, heads, d_ckv, dtype=dtype, device=device)
    qp = torch.randn(tokens, heads, d_kpe, dtype=dtype, device=device)
    ckv = (torch.randn(num_pages, page_size, d_ckv) + 0.5).to(dtype).to(device)
    kpe = torch.randn(num_pages, page_size, d_kpe, dtype=dtype, device=device)
    idx = torch.stack([torch.randperm(slots)[:topk] for _ in range(tokens)]).to(torch.int32)
    # Padding as the indexer leaves it (a tail of -1) and scattered; one token with none.
    if tokens > 1:
        idx[1, topk // 3 :] = -1
    if tokens > 2:
        idx[2] = -1
    if tokens > 3:
        idx[3, ::5] = -1
    return qn, qp, ckv, kpe, idx.to(device)


def _check_attention(got, want, dtype):
    (out, lse), (ref_out, ref_lse) = got, want
    assert out.dtype == ref_out.dtype and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), ref_out.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(lse, ref_lse, atol=LSE_TOL, rtol=0)


# --------------------------------------------------------------------------- CPU: interpreter


@pytest.mark.interpreter
@pytest.mark.parametrize(
    ("seq_lens", "page_size", "topk"),
    [
        ([37, 0, 130, 5], 16, 24),  # rows longer and shorter than topk, an empty row
        ([1, 77], 1, 40),  # page size 1, a row below topk
        ([200, 64, 129], 64, 128),  # page size 64, partial last pages
        ([9], 64, 2048),  # DeepSeek-V3.2's topk over a short request: mostly padding
    ],
)
def test_indexer_matches_reference(seq_lens, page_size, topk):
    inputs = _indexer_inputs(seq_lens, heads=5, head_dim=32, page_size=page_size, device="cpu")
    out = run_indexer(*inputs, topk=topk)
    ref = dsa_topk_indexer_ref(*inputs, topk=topk)
    assert out.shape == ref.shape == (len(seq_lens), topk) and out.dtype == torch.int32
    for b, n in enumerate(seq_lens):  # -1 exactly past the row's tokens
        assert (out[b, : min(n, topk)] >= 0).all() and (out[b, min(n, topk) :] == -1).all()
    _assert_index_sets(out, ref, inputs)
    # torch.topk's select, best first: the row's scores descend (within rounding).
    ordered = run_indexer(*inputs, topk=topk, select=SelectTactic(method="torch"))
    _assert_index_sets(ordered, ref, inputs)
    scores = indexer_scores_at(*inputs, ordered)
    finite = torch.isfinite(scores)
    tol = 1e-4 * float(scores[finite].abs().max()) if finite.any() else 0.0
    scores = scores.masked_fill(~finite, -1e30)  # -1 padding comes last
    assert (scores[:, 1:] <= scores[:, :-1] + tol).all()
    # Programs of a few tiles each: rows ending mid-chunk, chunks wholly past seq_len.
    small = run_indexer(*inputs, topk=topk, tactic=IndexerTactic(block_n=16, chunk=32))
    _assert_index_sets(small, ref, inputs)


@pytest.mark.interpreter
def test_indexer_public_call_and_errors():
    inputs = _indexer_inputs([50, 3], heads=4, head_dim=16, page_size=8, device="cpu")
    out = dsa_topk_indexer(*inputs, topk=20)
    _assert_index_sets(out, dsa_topk_indexer_ref(*inputs, topk=20), inputs)
    q, cache, w, seq, table = inputs
    with pytest.raises(TypeError, match="q_index_fp8"):
        dsa_topk_indexer(q.float(), cache, w, seq, table)
    with pytest.raises(ValueError, match="weights"):
        dsa_topk_indexer(q, cache, w[:, :2].contiguous(), seq, table)
    with pytest.raises(TypeError, match="block_table"):
        dsa_topk_indexer(q, cache, w, seq, table.long())
    with pytest.raises(ValueError, match="k_index_cache_fp8"):
        dsa_topk_indexer(q, cache[..., :-4].contiguous(), w, seq, table)


def test_pack_index_cache_round_trips():
    keys = torch.randn(3, 16, 32) * torch.rand(3, 16, 1)
    cache = pack_index_cache(keys)
    assert cache.shape == (3, 16, 1, 36) and cache.dtype == torch.int8
    # fp8 e4m3 keeps 3 mantissa bits: each value within 1/16 of its token's max.
    err = (unpack_index_cache(cache) - keys).abs()
    assert (err <= keys.abs().amax(-1, keepdim=True) / 16 + 1e-6).all()


@pytest.mark.interpreter
@pytest.mark.parametrize(
    ("tokens", "heads", "page_size", "topk", "splits"),
    [
        (5, 3, 1, 40, 1),  # odd heads (masked), page size 1, unsplit
        (4, 16, 64, 96, 3),  # page size 64, split (the merge), a token without slots
        (1, 2, 4, 33, None),  # decode, topk not a tile multiple, splits by the device rule
    ],
)
def test_sparse_attention_matches_reference(tokens, heads, page_size, topk, splits):
    args = _attention_inputs(tokens, heads, 64, 16, 7, page_size, topk, torch.float16, "cpu")
    tactic = AttentionTactic(block_n=16, min_split_tiles=1)  # several tiles a split
    got = run_sparse_attention(*args, 0.125, tactic=tactic, num_splits=splits)
    _check_attention(got, dsa_sparse_attention_ref(*args, 0.125), torch.float16)
    if tokens > 2:  # no valid slot: output 0, LSE -inf
        assert (got[0][2] == 0).all() and torch.isneginf(got[1][2]).all()


@pytest.mark.interpreter
def test_sparse_attention_public_call_and_errors():
    args = _attention_inputs(3, 4, 64, 16, 5, 64, 20, torch.float16, "cpu")
    out = torch.empty_like(args[0])
    lse = torch.empty(3, 4)
    got = dsa_sparse_attention(*args, 0.2, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    _check_attention(got, dsa_sparse_attention_ref(*args, 0.2), torch.float16)
    qn, qp, ckv, kpe, idx = args
    with pytest.raises(ValueError, match="kpe_cache"):
        dsa_sparse_attention(qn, qp, ckv, kpe[..., :8], idx, 0.2)
    with pytest.raises(TypeError, match="sparse_indices"):
        dsa_sparse_attention(qn, qp, ckv, kpe, idx.long(), 0.2)
    with pytest.raises(ValueError, match="sparse_indices"):
        dsa_sparse_attention(qn, qp, ckv, kpe, idx[:2], 0.2)
    with pytest.raises(TypeError, match="ckv_cache"):  # an fp8 cache has no scales here
        dsa_sparse_attention(qn, qp, ckv.to(torch.float8_e4m3fn), kpe, idx, 0.2)


# --------------------------------------------------------------------------- GPU


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 7, 64])
@pytest.mark.parametrize("long", [False, True])
def test_indexer_deepseek_v32_cuda(batch, long):
    """DeepSeek-V3.2's indexer (64 heads of 128, pages of 64, topk 2048) in fp8, requests
    shorter and (long) much longer than topk."""
    gen = torch.Generator().manual_seed(batch)
    nominal = 20000 if long else 1500
    lens = torch.randint(nominal // 2, nominal + nominal // 2, (batch,), generator=gen).tolist()
    inputs = _indexer_inputs(lens, heads=64, head_dim=128, page_size=64, device="cuda")
    out = dsa_topk_indexer(*inputs, topk=2048)
    ref = dsa_topk_indexer_ref(*inputs, topk=2048)
    assert out.shape == (batch, 2048) and out.dtype == torch.int32
    _assert_index_sets(out, ref, inputs)


@pytest.mark.cuda
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("tokens", [1, 3, 64, 257])
def test_sparse_attention_deepseek_v32_cuda(page_size, tokens):
    """DeepSeek-V3.2 at TP 8: 16 heads, 512 + 64, topk 2048, bf16; split and unsplit."""
    num_pages = 20000 // page_size
    args = _attention_inputs(
        tokens, 16, 512, 64, num_pages, page_size, 2048, torch.bfloat16, "cuda"
    )
    scale = 1 / math.sqrt(192)
    want = dsa_sparse_attention_ref(*args, scale)
    _check_attention(dsa_sparse_attention(*args, scale), want, torch.bfloat16)
    _check_attention(run_sparse_attention(*args, scale, num_splits=1), want, torch.bfloat16)


@pytest.mark.cuda
def test_indexer_then_attention_cuda():
    """The pipeline: the indexer's slots (ps 64 pages) feed the attention over a ps-64 latent
    cache addressed by the same slots."""
    lens = [3000, 700, 5000]
    inputs = _indexer_inputs(lens, heads=64, head_dim=128, page_size=64, device="cuda")
    idx = dsa_topk_indexer(*inputs, topk=2048)
    num_pages = inputs[1].shape[0]
    qn, qp, ckv, kpe, _ = _attention_inputs(
        3, 16, 512, 64, num_pages, 64, 2048, torch.bfloat16, "cuda"
    )
    scale = 1 / math.sqrt(192)
    got = dsa_sparse_attention(qn, qp, ckv, kpe, idx, scale)
    _check_attention(got, dsa_sparse_attention_ref(qn, qp, ckv, kpe, idx, scale), torch.bfloat16)

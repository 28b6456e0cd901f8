"""MLA ragged prefill (the non-absorbed form: QK head dim 192, VO head dim 128, no KV pages):
the Triton kernel against the reference (odd lengths, a cached prefix, empty requests, more
queries than keys, several heads, GQA grouping, LSE), the host function's buffers, defaults
and errors, and the schemas against the FlashInfer-Trace mla_ragged Definitions
(tests/ops/data/mla/ragged, copied unchanged from flashinfer-ai/flashinfer-bench at ecafa9c,
Apache-2.0).

Interpreter tests run the kernel on CPU tensors in float16 and float32 (the interpreter's
bf16 dot is wrong); the `cuda` test runs bfloat16 at DeepSeek's shapes on the GPU."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import pytest
import torch

from flashtune.data import (
    Definition,
    resolve_axes,
    run_reference,
    small_workload,
    synthesize_inputs,
)
from flashtune.ops.mla.config import RaggedTactic, default_ragged_tactic, ragged_smem_bytes
from flashtune.ops.mla.ragged import mla_ragged_prefill, split_head_dim
from flashtune.ops.mla.reference import mla_ragged_prefill_ref
from flashtune.ops.mla.schema import RAGGED_SCHEMAS, ragged_schema_key

DQK, DVO = 192, 128
# Output tolerance per dtype: the kernel rounds the probabilities to the inputs' dtype for
# the second MMA; LSE (base 2) within LSE_TOL.
TOL = {torch.float16: 2e-3, torch.float32: 1e-5, torch.bfloat16: 1.6e-2}
LSE_TOL = 1e-3
CPU = torch.device("cpu")
DATA = Path(__file__).parent / "data" / "mla" / "ragged"
CORPUS = sorted(p.stem for p in DATA.glob("*.json"))


def _indptr(lens: list[int], device: torch.device) -> torch.Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    return out.to(device)


def _inputs(qo_lens, kv_lens, heads, dtype, device, kv_heads=None):
    kv_heads = heads if kv_heads is None else kv_heads
    q = torch.randn(sum(qo_lens), heads, DQK, device=device).to(dtype)
    k = torch.randn(sum(kv_lens), kv_heads, DQK, device=device).to(dtype)
    v = torch.randn(sum(kv_lens), kv_heads, DVO, device=device).to(dtype)
    return q, k, v, _indptr(qo_lens, device), _indptr(kv_lens, device)


def _check(out, lse, ref_out, ref_lse, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(out.float().cpu(), ref_out.float().cpu(), atol=tol, rtol=tol)
    empty = ref_lse.isinf().cpu()
    assert torch.equal(lse.isinf().cpu(), empty)  # rows that see no key: -inf ...
    assert not out.cpu()[empty].any()  # ... and output 0
    torch.testing.assert_close(lse.cpu()[~empty], ref_lse.cpu()[~empty], atol=LSE_TOL, rtol=0)


# (qo_lens, kv_lens, causal, heads, kv_heads)
CASES = {
    # Odd lengths, no prefix (DeepSeek's prefill without a prefix cache).
    "odd": ([1, 7, 33, 130], [1, 7, 33, 130], True, 2, 2),
    # A cached prefix: kv_len > qo_len, the mask aligned to the bottom right.
    "prefix": ([5, 17, 1], [40, 17, 64], True, 3, 3),
    # Empty requests (no queries; no keys), and more queries than keys (the first rows see
    # no key).
    "empty": ([0, 3, 0, 9, 4, 6], [0, 3, 5, 12, 0, 2], True, 2, 2),
    "noncausal": ([7, 33], [20, 5], False, 2, 2),
    # Query heads sharing a KV head (GQA; MLA has equal counts).
    "grouped": ([9, 20], [30, 20], True, 4, 2),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_reference(case):
    qo_lens, kv_lens, causal, heads, kv_heads = CASES[case]
    q, k, v, qo, kv = _inputs(qo_lens, kv_lens, heads, torch.float16, CPU, kv_heads)
    out, lse = mla_ragged_prefill(q, k, v, qo, kv, causal=causal, return_lse=True)
    assert out.shape == (sum(qo_lens), heads, DVO) and out.dtype == torch.float16
    assert lse.shape == (sum(qo_lens), heads) and lse.dtype == torch.float32
    ref_out, ref_lse = mla_ragged_prefill_ref(q, k, v, qo, kv, causal=causal)
    _check(out, lse, ref_out, ref_lse, torch.float16)


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "tactic", [RaggedTactic(64, 32, 4, 2), RaggedTactic(32, 64, 4, 2)], ids=["m64n32", "m32n64"]
)
def test_kernel_other_tiles_float32(tactic):
    """Taller and wider tiles than the interpreter's default, float32 (IEEE dots): tiles that
    straddle a request's end and the causal diagonal."""
    qo_lens, kv_lens = [70, 1, 33], [100, 1, 33]
    q, k, v, qo, kv = _inputs(qo_lens, kv_lens, 2, torch.float32, CPU)
    out, lse = mla_ragged_prefill(q, k, v, qo, kv, return_lse=True, tactic=tactic)
    _check(out, lse, *mla_ragged_prefill_ref(q, k, v, qo, kv), torch.float32)


def test_reference_matches_dense_attention():
    """One request, kv_len > qo_len: the reference is softmax(q k^T * scale + bottom-right
    causal mask) v per head, LSE base 2 (FlashInfer's tests/test_deepseek_mla.py
    attention_ref: mask arange(kv-qo, kv)[:, None] >= arange(kv), lse * log2(e))."""
    q, k, v, qo, kv = _inputs([5], [9], 2, torch.float32, CPU)
    out, lse = mla_ragged_prefill_ref(q, k, v, qo, kv)
    logits = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(DQK)
    mask = torch.arange(4, 9)[:, None] >= torch.arange(9)[None, :]
    logits = logits.masked_fill(~mask, -math.inf)
    want = torch.einsum("hqk,khd->qhd", logits.softmax(-1), v)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1).T * math.log2(math.e))


@pytest.mark.interpreter
def test_buffers_scale_and_lse_conventions():
    q, k, v, qo, kv = _inputs([3, 6], [8, 6], 2, torch.float16, CPU)
    plain = mla_ragged_prefill(q, k, v, qo, kv)
    assert isinstance(plain, torch.Tensor)
    # sm_scale None is 1/sqrt(head_dim_qk), as FlashInfer's run.
    scaled = mla_ragged_prefill(q, k, v, qo, kv, sm_scale=1 / math.sqrt(DQK))
    assert torch.equal(plain, scaled)
    # A given out and lse are written, lse even without return_lse (as FlashInfer).
    out = torch.full_like(plain, float("nan"))
    lse = torch.full((9, 2), float("nan"))
    got = mla_ragged_prefill(q, k, v, qo, kv, sm_scale=0.3, out=out, lse=lse)
    assert got is out
    ref_out, ref_lse = mla_ragged_prefill_ref(q, k, v, qo, kv, sm_scale=0.3)
    _check(out, lse, ref_out, ref_lse, torch.float16)


def test_reference_path_when_kernels_are_off(monkeypatch):
    """The CPU path without a kernel (FLASHTUNE_FORCE_REFERENCE, or no interpreter) is the
    reference, in bfloat16 too."""
    monkeypatch.setenv("FLASHTUNE_FORCE_REFERENCE", "1")
    q, k, v, qo, kv = _inputs([2, 5], [2, 9], 2, torch.bfloat16, CPU)
    out, lse = mla_ragged_prefill(q, k, v, qo, kv, return_lse=True)
    ref_out, ref_lse = mla_ragged_prefill_ref(q, k, v, qo, kv)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


@pytest.mark.interpreter
def test_nothing_to_do():
    q, k, v, qo, kv = _inputs([0, 0], [3, 0], 2, torch.float16, CPU)
    out, lse = mla_ragged_prefill(q, k, v, qo, kv, return_lse=True)
    assert out.shape == (0, 2, DVO) and lse.shape == (0, 2)
    q, k, v, qo, kv = _inputs([], [], 2, torch.float16, CPU)
    assert mla_ragged_prefill(q, k, v, qo, kv).shape == (0, 2, DVO)


def _bad(**change):
    q, k, v, qo, kv = _inputs([3, 2], [4, 2], 2, torch.float16, CPU)
    args = {"q": q, "k": k, "v": v, "qo_indptr": qo, "kv_indptr": kv, **change}
    return args


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"q": torch.zeros(5, 2, DQK, dtype=torch.float16)[0]}, ValueError, "q must be 3-D"),
        ({"k": torch.zeros(6, 2, DQK, dtype=torch.float32)}, TypeError, "k must have q's dtype"),
        ({"q": torch.zeros(5, 2, DQK, dtype=torch.int8)}, TypeError, "float16, bfloat16"),
        ({"k": torch.zeros(6, 2, 128, dtype=torch.float16)}, ValueError, "head_dim_qk"),
        ({"v": torch.zeros(5, 2, DVO, dtype=torch.float16)}, ValueError, "v must have k's"),
        ({"v": torch.zeros(6, 2, 96, dtype=torch.float16)}, ValueError, "head_dim_vo"),
        (
            {
                "k": torch.zeros(6, 3, DQK, dtype=torch.float16),
                "v": torch.zeros(6, 3, DVO, dtype=torch.float16),
            },
            ValueError,
            "multiple of num_kv_heads",
        ),
        (
            {
                "q": torch.zeros(5, 2, 100, dtype=torch.float16),
                "k": torch.zeros(6, 2, 100, dtype=torch.float16),
            },
            ValueError,
            "head_dim_qk must be",
        ),
        ({"qo_indptr": torch.tensor([0, 3, 5])}, TypeError, "qo_indptr must be int32"),
        ({"kv_indptr": torch.tensor([0, 6], dtype=torch.int32)}, ValueError, "both are"),
        ({"qo_indptr": torch.tensor([0, 3, 4], dtype=torch.int32)}, ValueError, r"\[-1\] = 4"),
        ({"kv_indptr": torch.tensor([0, 5, 4], dtype=torch.int32)}, ValueError, "never decrease"),
        ({"kv_indptr": torch.tensor([1, 2, 6], dtype=torch.int32)}, ValueError, "start at 0"),
        ({"out": torch.zeros(5, 2, DQK, dtype=torch.float16)}, ValueError, "out must be"),
        ({"lse": torch.zeros(5, 2, dtype=torch.float16)}, ValueError, "lse must be"),
    ],
)
def test_bad_input_is_named(change, error, match):
    with pytest.raises(error, match=match):
        mla_ragged_prefill(**_bad(**change))


@pytest.mark.interpreter
def test_bad_tactic_is_named():
    with pytest.raises(ValueError, match="tactic.block_m"):
        mla_ragged_prefill(**_bad(), tactic=RaggedTactic(24, 16, 4, 1))


def test_split_head_dim():
    assert split_head_dim(192) == (128, 64)
    assert split_head_dim(128) == (128, 0)
    assert split_head_dim(96) == (64, 32)
    for bad in (0, 8, 100, 136):
        with pytest.raises(ValueError):
            split_head_dim(bad)


def test_default_tactic_fits_shared_memory():
    h100 = default_ragged_tactic(True)
    assert h100 == RaggedTactic(128, 64, 8, 2)
    for limit in (227 * 1024, 164 * 1024, 99 * 1024):
        for itemsize in (2, 4):
            t = default_ragged_tactic(True, 192, 128, itemsize, limit)
            assert ragged_smem_bytes(t, 192, 128, itemsize) <= limit or t.block_n == 32
    assert default_ragged_tactic(False).block_m == 16  # the interpreter's short tiles


@pytest.mark.cuda
@pytest.mark.parametrize("heads", [16, 128])
def test_cuda_bf16_deepseek_shapes(heads):
    dev = torch.device("cuda")
    qo_lens = [1, 7, 130, 1000, 0, 513]
    kv_lens = [1, 7, 130, 1500, 9, 513]  # one request over a cached prefix
    q, k, v, qo, kv = _inputs(qo_lens, kv_lens, heads, torch.bfloat16, dev)
    out, lse = mla_ragged_prefill(q, k, v, qo, kv, return_lse=True)
    ref_out, ref_lse = mla_ragged_prefill_ref(q, k, v, qo, kv)
    _check(out, lse, ref_out, ref_lse, torch.bfloat16)


# --------------------------------------------------------------------------- schemas


def _corpus(name: str) -> Definition:
    return Definition.model_validate_json((DATA / f"{name}.json").read_text())


def _ours(heads: int, causal: bool = True) -> Definition:
    """The Definition of a call at these heads (meta tensors: nothing runs)."""
    meta = lambda *s, dt=torch.bfloat16: torch.empty(s, dtype=dt, device="meta")  # noqa: E731
    arguments = {
        "q": meta(10, heads, DQK),
        "k": meta(24, heads, DQK),
        "v": meta(24, heads, DVO),
        "qo_indptr": meta(3, dt=torch.int32),
        "kv_indptr": meta(3, dt=torch.int32),
        "sm_scale": 1 / math.sqrt(DQK),
        "causal": causal,
    }
    return RAGGED_SCHEMAS[ragged_schema_key(causal, heads)].bind(arguments).definition()


def _dump(fields):
    return {k: v.model_dump(exclude_none=True) for k, v in fields.items()}


def test_corpus_files_are_here():
    assert CORPUS == [
        "mla_ragged_prefill_causal_h16_qk192_vo128",
        "mla_ragged_prefill_causal_h8_qk192_vo128",
    ]


@pytest.mark.parametrize("name", CORPUS)
def test_definitions_equal_the_corpus(name):
    corpus = _corpus(name)
    ours = _ours(corpus.axes["num_qo_heads"].value)
    assert ours.name == corpus.name
    assert ours.op_type == corpus.op_type
    assert _dump(ours.axes) == _dump(corpus.axes)
    assert list(ours.axes) == list(corpus.axes)  # same order, so the same name
    assert _dump(ours.inputs) == _dump(corpus.inputs)
    assert list(ours.inputs) == list(corpus.inputs)
    assert _dump(ours.outputs) == _dump(corpus.outputs)
    assert ours.constraints == corpus.constraints
    assert ours.description.startswith(corpus.description)  # + " (causal=True)"
    # The corpus adds provenance tags (model, status, tp); the contract's tags agree.
    assert set(ours.tags) <= set(corpus.tags)


@pytest.mark.parametrize("name", CORPUS)
def test_reference_agrees_with_the_corpus_reference(name):
    corpus = _corpus(name)
    ours = _ours(corpus.axes["num_qo_heads"].value)
    workload = small_workload(ours)
    inputs = synthesize_inputs(ours, workload, seed=1)
    mine, theirs = run_reference(ours, inputs), run_reference(corpus, inputs)
    axes = resolve_axes(ours, workload)
    assert tuple(mine["output"].shape) == (axes["total_q"], axes["num_qo_heads"], DVO)
    # Both round the output to bf16 (one ulp apart at most); the LSE is fp32.
    torch.testing.assert_close(
        mine["output"].float(), theirs["output"].float(), atol=2e-2, rtol=1e-2
    )
    torch.testing.assert_close(mine["lse"], theirs["lse"], atol=1e-4, rtol=1e-5)


def test_other_definitions():
    """Non-causal (flashtune's own name) and head counts the corpus has no file for."""
    non = _ours(16, causal=False)
    assert non.name == "mla_ragged_prefill_noncausal_h16_qk192_vo128"
    assert "causal=False" in non.reference
    assert _ours(128).name == "mla_ragged_prefill_causal_h128_qk192_vo128"
    assert "causal=True" in _ours(128).reference


def test_emitted_reference_is_self_contained():
    d = _ours(16)
    namespace: dict = {}
    exec(d.reference, namespace)  # only math and torch
    assert set(json.loads(d.model_dump_json())["inputs"]) == set(
        inspect.signature(namespace["run"]).parameters
    )


# ---------------------------------------------------------------- FlashInfer's wrapper


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_ragged_wrapper_with_split_head_dims_serves_mla(causal, layout):
    """BatchPrefillWithRaggedKVCacheWrapper.plan(..., head_dim_qk=192, head_dim_vo=128) (as
    FlashInfer's test_deepseek_mla does) runs the MLA ragged kernel: out= and lse= buffers,
    both layouts, and single_prefill_with_kv_cache with those head dims."""
    import flashtune as flashinfer

    qo_lens, kv_lens, heads = [5, 1, 9], [7, 3, 9], 2
    q, k, v, qo, kv = _inputs(qo_lens, kv_lens, heads, torch.float16, CPU)
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(1 << 20, dtype=torch.uint8), layout
    )
    wrapper.plan(qo, kv, heads, heads, DQK, head_dim_vo=DVO, causal=causal)
    kk, vv = (k.transpose(0, 1), v.transpose(0, 1)) if layout == "HND" else (k, v)
    out = torch.full((q.shape[0], heads, DVO), float("nan"), dtype=torch.float16)
    lse = torch.full((q.shape[0], heads), float("nan"))
    wrapper.run(q, kk, vv, out=out, lse=lse)
    ref_out, ref_lse = mla_ragged_prefill_ref(q, k, v, qo, kv, 1 / math.sqrt(DQK), causal=causal)
    _check(out, lse, ref_out, ref_lse, torch.float16)
    with pytest.raises(NotImplementedError, match="logits_soft_cap"):
        wrapper.plan(qo, kv, heads, heads, DQK, head_dim_vo=DVO, logits_soft_cap=30.0)
    single = flashinfer.single_prefill_with_kv_cache(
        q[:5], k[:7], v[:7], causal=causal, return_lse=True
    )
    ref_single = mla_ragged_prefill_ref(
        q[:5], k[:7], v[:7], qo[:2], kv[:2], 1 / math.sqrt(DQK), causal=causal
    )
    _check(*single, *ref_single, torch.float16)

"""The sampling family against its sort-based references: draws in the CPU interpreter over
small vocabularies (64..512) checked by distribution and support, renormalization and masks
element for element, parameter forms, reproducibility, bad input, the schemas against the
FlashInfer-Trace corpus; bf16/fp32 at LLM vocabularies, CUDA graphs and no host sync on GPU.

Distribution checks: `DRAWS` draws of one row (indices all zero), total variation distance
from the filtered, renormalized distribution below 3x the TVD expected from sampling noise
alone (0.5 * sum sqrt(2 p (1 - p) / (pi n)) per row), and never a token outside the support.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import triton
import triton.language as tl

from _sampling_draws import DRAWS, check_draws, kept, row
from flashtune.ops.sampling import (
    chain_speculative_sampling,
    min_p_sampling_from_probs,
    sampling_from_logits,
    sampling_from_probs,
    softmax,
    top_k_mask_logits,
    top_k_renorm_prob,
    top_k_renorm_probs,
    top_k_sampling_from_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_probs,
    top_p_sampling_from_probs,
)
from flashtune.ops.sampling import kernels as sampling_kernels
from flashtune.ops.sampling.config import SamplingTactic
from flashtune.ops.sampling.launch import SamplingArgs, SamplingRunner
from flashtune.ops.sampling.reference import (
    top_k_mask_logits_ref,
    top_k_renorm_probs_ref,
    top_p_renorm_probs_ref,
)
from flashtune.ops.sampling.steps import pick_in_chunk


def _zeros(n: int, device="cpu") -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int32, device=device)


# ------------------------------------------------------------------------------ distributions


@pytest.mark.parametrize("vocab,zeros", [(64, 0.0), (300, 0.5)])
def test_sampling_from_probs_distribution(vocab, zeros):
    probs = row(vocab, zeros=zeros)
    check_draws(sampling_from_probs(probs, indices=_zeros(DRAWS)), kept(probs))


def test_sampling_from_logits_distribution():
    logits = torch.randn(1, 200)
    logits[0, :50] = -math.inf
    samples = sampling_from_logits(logits, indices=_zeros(DRAWS))
    check_draws(samples, kept(torch.softmax(logits, dim=-1)))


# The heavier draws (3-4 s each on 2 cores) in the slow step CI also runs: the main suite
# stays under 10 minutes.
@pytest.mark.parametrize("top_p", [pytest.param(0.4, marks=pytest.mark.slow), 0.9])
def test_top_p_sampling_distribution(top_p):
    probs = row(256, scale=1.5)
    samples = top_p_sampling_from_probs(probs, top_p, indices=_zeros(DRAWS))
    check_draws(samples, kept(probs, top_p=top_p))


# 10 and 100 (~4.5 s on 2 cores) in the slow step: the main suite stays under 10 minutes
@pytest.mark.parametrize(
    "top_k",
    [pytest.param(10, marks=pytest.mark.slow), pytest.param(100, marks=pytest.mark.slow), 256],
)
def test_top_k_sampling_distribution(top_k):
    probs = row(200)
    samples = top_k_sampling_from_probs(probs, top_k, indices=_zeros(DRAWS))
    check_draws(samples, kept(probs, top_k=top_k))


@pytest.mark.parametrize("min_p", [0.2, 0.7])
def test_min_p_sampling_distribution(min_p):
    probs = row(256, scale=1.5)
    samples = min_p_sampling_from_probs(probs, min_p, indices=_zeros(DRAWS))
    check_draws(samples, kept(probs, min_p=min_p))


@pytest.mark.parametrize(
    "order,top_k,top_p",
    [
        # ~4-5 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
        pytest.param("top_k_first", 30, 0.6, marks=pytest.mark.slow),
        pytest.param("joint", 30, 0.6, marks=pytest.mark.slow),
        pytest.param("top_k_first", 8, 0.95, marks=pytest.mark.slow),  # ~4 s, as above
        ("joint", 0, 0.5),
    ],
)
def test_top_k_top_p_sampling_distribution(order, top_k, top_p):
    probs = row(200, scale=1.2)
    samples = top_k_top_p_sampling_from_probs(
        probs, top_k, top_p, indices=_zeros(DRAWS), filter_apply_order=order
    )
    check_draws(samples, kept(probs, top_k=top_k, top_p=top_p, joint=order == "joint"))


def test_rows_get_their_own_parameters():
    # Two rows, each drawn DRAWS / 2 times through indices, with per-row top_k and top_p.
    probs = torch.cat([row(128), row(128, scale=2.0)])
    indices = torch.arange(DRAWS, dtype=torch.int32) % 2
    top_k = torch.tensor([5, 60], dtype=torch.int32).repeat(DRAWS // 2)
    top_p = torch.tensor([0.9, 0.4]).repeat(DRAWS // 2)
    samples = top_k_top_p_sampling_from_probs(
        probs, top_k, top_p, indices=indices, filter_apply_order="joint"
    )
    for r, (k, p) in enumerate([(5, 0.9), (60, 0.4)]):
        check_draws(samples[r::2], kept(probs[r : r + 1], top_k=k, top_p=p))


def test_fp16_probs_sample_within_support():
    probs = row(256, scale=2.0).half()
    samples = top_k_sampling_from_probs(probs, 20, indices=_zeros(500))
    expected = kept(probs.float(), top_k=20)
    assert bool((expected[samples.long()] > 0).all())


# ------------------------------------------------------------------------------ exact ops


@pytest.mark.parametrize("top_p", [-0.1, 0.0, 0.5, 0.9, 1.0])
def test_top_p_renorm_matches_reference(top_p):
    probs = torch.softmax(torch.randn(5, 333) * 2, dim=-1)
    expected = top_p_renorm_probs_ref(probs, torch.full((5,), top_p))
    torch.testing.assert_close(top_p_renorm_probs(probs, top_p), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("top_k", [1, 10, 100, 333, 0])
def test_top_k_renorm_matches_reference(top_k):
    probs = torch.softmax(torch.randn(5, 333), dim=-1)
    expected = top_k_renorm_probs_ref(probs, torch.full((5,), top_k))
    torch.testing.assert_close(top_k_renorm_probs(probs, top_k), expected, atol=1e-6, rtol=1e-5)
    assert top_k_renorm_prob is top_k_renorm_probs  # FlashInfer's alias


def test_per_row_tensor_parameters_match_reference():
    probs = torch.softmax(torch.randn(4, 257), dim=-1)
    k = torch.tensor([1, 7, 300, 64])
    p = torch.tensor([0.2, 0.99, 0.5, 1.0])
    torch.testing.assert_close(top_k_renorm_probs(probs, k), top_k_renorm_probs_ref(probs, k))
    torch.testing.assert_close(top_p_renorm_probs(probs, p), top_p_renorm_probs_ref(probs, p))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_top_k_mask_logits_matches_reference(dtype):
    logits = (torch.randn(6, 300) * 5).to(dtype)
    logits[torch.rand(6, 300) < 0.3] = -math.inf
    logits[5] = -math.inf  # a row with nothing finite stays so
    logits[5, 3] = 1.0
    k = torch.tensor([1, 5, 50, 299, 400, 10])
    masked = top_k_mask_logits(logits, k)
    assert masked.dtype == dtype
    assert torch.equal(masked, top_k_mask_logits_ref(logits, k))


@pytest.mark.parametrize("temperature", [1.0, 0.5, "tensor", None])
def test_softmax_matches_torch(temperature):
    logits = torch.randn(3, 500) * 4
    logits[0, :100] = -math.inf
    t = torch.tensor([0.3, 1.0, 2.0]) if temperature == "tensor" else temperature
    scale = 1.0 if t is None else (t.reshape(-1, 1) if isinstance(t, torch.Tensor) else t)
    torch.testing.assert_close(softmax(logits, t), torch.softmax(logits / scale, dim=-1))


# ------------------------------------------------------------------------------ forms and seeds


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_same_generator_state_same_samples_and_scalar_equals_tensor():
    probs = torch.softmax(torch.randn(8, 200), dim=-1)
    a = top_k_top_p_sampling_from_probs(probs, 20, 0.7, generator=_gen(3))
    b = top_k_top_p_sampling_from_probs(
        probs, torch.full((8,), 20), torch.full((8,), 0.7), generator=_gen(3)
    )
    assert torch.equal(a, b) and a.dtype == torch.int32 and a.shape == (8,)
    draws = torch.stack(
        [top_p_sampling_from_probs(probs, 0.9, generator=_gen(s)) for s in range(4)]
    )
    assert len({tuple(d.tolist()) for d in draws}) > 1  # other seeds, other draws


def test_indices_select_rows():
    probs = torch.softmax(torch.randn(3, 150), dim=-1)
    indices = torch.tensor([2, 0, 2, 1, 1], dtype=torch.int64)
    got = top_k_sampling_from_probs(probs, 30, indices=indices, generator=_gen(7))
    # Output row i draws from probs[indices[i]] with stream i: as sampling the gathered rows.
    assert torch.equal(got, top_k_sampling_from_probs(probs[indices], 30, generator=_gen(7)))


def test_logits_and_probs_paths_draw_the_same_tokens():
    # FlashInfer's test_top_k_top_p_sampling_from_probs_logits_alignment, both orders.
    logits = torch.randn(6, 256) * 5
    for order in ("top_k_first", "joint"):
        g1, g2 = _gen(11), _gen(11)
        a = top_k_top_p_sampling_from_logits(
            logits, 30, 0.6, filter_apply_order=order, generator=g1
        )
        b = top_k_top_p_sampling_from_probs(
            torch.softmax(logits, dim=-1), 30, 0.6, filter_apply_order=order, generator=g2
        )
        assert torch.equal(a, b)


def test_greedy_limits():
    probs = torch.softmax(torch.randn(5, 128) * 3, dim=-1)
    best = probs.argmax(dim=-1).to(torch.int32)
    assert torch.equal(top_k_sampling_from_probs(probs, 1), best)
    assert torch.equal(top_p_sampling_from_probs(probs, 0.0), best)
    assert torch.equal(min_p_sampling_from_probs(probs, 1.0), best)
    # An integer tensor is a valid min_p (FlashInfer's tests pass torch.full((batch,), 1)).
    assert torch.equal(min_p_sampling_from_probs(probs, torch.full((5,), 1)), best)


def test_tactics_draw_the_same_tokens(device):
    """The autotuner keeps a tactic only if it reproduces the default tactic's samples."""
    probs = torch.softmax(torch.randn(6, 300, device=device) * 2, dim=-1)
    seed = torch.tensor([5], dtype=torch.int64, device=device)
    p = torch.full((6,), 0.8, device=device)
    k = torch.full((6,), 40, dtype=torch.int32, device=device)

    def run(tactic):
        out = torch.empty(6, dtype=torch.int32, device=device)
        inputs = [probs, out, None, seed, k, p, SamplingArgs(sampling_kernels.MODE_JOINT)]
        return SamplingRunner().forward(inputs, tactic).clone()

    default = run(-1)
    tactics = SamplingTactic.space(300, 6)
    assert tactics
    for tactic in tactics[:: max(1, len(tactics) // 4)]:
        assert torch.equal(run(tactic), default), tactic


# ------------------------------------------------------------------------------ speculative


def test_chain_speculative_sampling_structure():
    batch, n, vocab = 4, 3, 100
    draft = torch.softmax(torch.randn(batch, n, vocab), dim=-1)
    target = torch.softmax(torch.randn(batch, n + 1, vocab), dim=-1)
    ids = torch.randint(vocab, (batch, n))
    accepted = torch.full((batch,), 5, dtype=torch.int32)
    emitted = torch.zeros(batch, dtype=torch.int32)
    out, acc, emi = chain_speculative_sampling(draft, ids, target, accepted, emitted)
    assert out.shape == (batch, n + 1) and out.dtype == torch.int32
    assert acc is accepted and emi is emitted and bool((acc >= 5).all())
    assert torch.equal(emi + 1, (out != -1).sum(dim=1).to(torch.int32))
    for b in range(batch):
        e = int(emi[b])
        assert torch.equal(out[b, :e], ids[b, :e].to(torch.int32))  # the accepted prefix
        assert 0 <= int(out[b, e]) < vocab and bool((out[b, e + 1 :] == -1).all())


def test_chain_speculative_sampling_onehot_target_accepts_all():
    batch, n, vocab = 3, 4, 64
    draft = torch.softmax(torch.randn(batch, n, vocab), dim=-1)
    target_ids = torch.randint(vocab, (batch, n + 1))
    target = torch.zeros(batch, n + 1, vocab).scatter_(2, target_ids.unsqueeze(-1), 1.0)
    out, _, emitted = chain_speculative_sampling(draft, target_ids[:, :n], target)
    assert torch.equal(out, target_ids.to(torch.int32))
    assert torch.equal(emitted, torch.full((batch,), n, dtype=torch.int32))


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda p: top_p_sampling_from_probs(p[0], 0.9), "probs must be 2-D"),
        (lambda p: top_p_sampling_from_probs(p.long(), 0.9), "probs must be float"),
        (
            lambda p: top_k_sampling_from_probs(p, torch.ones(3, dtype=torch.int32)),
            r"top_k must have shape \(4,\)",
        ),
        (
            lambda p: top_k_sampling_from_probs(p, torch.ones(4, dtype=torch.bool)),
            "top_k must be a real-valued tensor",
        ),
        (lambda p: top_k_sampling_from_probs(p, 2.5), "top_k must be an int"),
        (lambda p: top_p_sampling_from_probs(p, "0.9"), "top_p must be a tensor or a number"),
        (
            lambda p: min_p_sampling_from_probs(p, torch.ones(4, dtype=torch.complex64)),
            "min_p must be a real-valued tensor",
        ),
        (
            lambda p: sampling_from_probs(p, indices=torch.zeros(2)),
            "indices must be a 1-D int32/int64",
        ),
        (lambda p: sampling_from_probs(p, generator=3), "generator must be a torch.Generator"),
        (
            lambda p: top_k_top_p_sampling_from_probs(p, 5, 0.5, filter_apply_order="x"),
            "filter_apply_order",
        ),
        (lambda p: softmax(p, torch.ones(2)), r"temperature must have shape \(4,\)"),
        (
            lambda p: chain_speculative_sampling(p[:, None], torch.zeros(4, 1), p[:, None]),
            "target_probs must have shape",
        ),
    ],
)
def test_bad_input_names_the_argument(call, match):
    probs = torch.softmax(torch.randn(4, 16), dim=-1)
    with pytest.raises((ValueError, TypeError), match=match):
        call(probs)


def test_check_nan():
    probs = torch.softmax(torch.randn(2, 16), dim=-1)
    probs[1, 3] = math.nan
    with pytest.raises(ValueError, match="probs contains NaN"):
        top_p_sampling_from_probs(probs, 0.9, check_nan=True)
    with pytest.raises(ValueError, match="logits contains NaN"):
        sampling_from_logits(probs, check_nan=True)


# ------------------------------------------------------------------------------ schemas


CORPUS_OPS = {
    "top_k_sampling_from_probs": (top_k_sampling_from_probs, (50,)),
    "top_p_sampling_from_probs": (top_p_sampling_from_probs, (0.9,)),
    "top_k_top_p_sampling_from_probs": (top_k_top_p_sampling_from_probs, (50, 0.9)),
}


@pytest.mark.parametrize("prefix", sorted(CORPUS_OPS))
def test_definitions_equal_corpus(trace_corpus, prefix):
    op, params = CORPUS_OPS[prefix]
    files = sorted((trace_corpus / "definitions" / "sampling").glob(f"{prefix}_v*.json"))
    assert files, f"no {prefix} definitions in the corpus"
    for path in files:
        theirs = json.loads(path.read_text())
        vocab = theirs["axes"]["vocab_size"]["value"]
        probs = torch.empty(3, vocab, dtype=torch.float32, device="meta")
        ours = json.loads(op.definition(probs, *params).to_json())
        assert ours["name"] == theirs["name"] and ours["op_type"] == theirs["op_type"]
        for field in ("axes", "inputs", "outputs"):
            assert {
                k: (v["type"], v.get("value")) if field == "axes" else (v["shape"], v["dtype"])
                for k, v in ours[field].items()
            } == {
                k: (v["type"], v.get("value")) if field == "axes" else (v["shape"], v["dtype"])
                for k, v in theirs[field].items()
            }, field
        fi_api = {t for t in theirs["tags"] if t.startswith("fi_api:")}
        assert fi_api and fi_api <= set(ours["tags"])


def test_definition_of_tensor_and_scalar_calls_agree():
    probs = torch.empty(2, 1000, device="meta")
    scalar = top_k_top_p_sampling_from_probs.definition(probs, 5, 0.5)
    tensors = top_k_top_p_sampling_from_probs.definition(
        probs, torch.empty(2, dtype=torch.int64, device="meta"), torch.empty(2, device="meta")
    )
    assert scalar == tensors and scalar.name == "top_k_top_p_sampling_from_probs_v1000"
    joint = top_k_top_p_sampling_from_probs.definition(probs, 5, 0.5, filter_apply_order="joint")
    assert joint.name == "top_k_top_p_joint_sampling_from_probs_v1000"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"indices": torch.zeros(2, dtype=torch.int32)},
        {"generator": torch.Generator()},
        {"check_nan": True},
    ],
)
def test_calls_without_a_definition_are_refused_by_the_schema(kwargs):
    probs = torch.softmax(torch.randn(2, 50), dim=-1)
    with pytest.raises(ValueError, match="has no Definition"):
        top_p_sampling_from_probs.definition(probs, 0.9, **kwargs)
    assert top_p_sampling_from_probs(probs, 0.9, **kwargs).shape == (2,)  # the op still runs


def test_emitted_reference_draws_within_the_support():
    probs = row(1000, scale=3.0).repeat(4, 1)
    definition = top_k_top_p_sampling_from_probs.definition(probs, 10, 0.8)
    scope: dict = {}
    exec(definition.reference, scope)
    k, p = torch.full((4,), 10, dtype=torch.int32), torch.full((4,), 0.8)
    samples = scope["run"](probs, k, p)
    assert samples.dtype == torch.int64 and samples.shape == (4,)
    assert bool((kept(probs, top_k=10, top_p=0.8, joint=False)[samples] > 0).all())


# ------------------------------------------------------------------------------ GPU


GPU_VOCABS = [128256, 151936]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("vocab", GPU_VOCABS)
def test_gpu_filters_at_llm_vocabularies(dtype, vocab):
    # FlashInfer's test_top_k_sampling / test_top_p_sampling rules at batch 99, many rounds.
    probs = torch.rand(99, vocab, device="cuda")
    probs = (probs / probs.sum(dim=-1, keepdim=True)).to(dtype)
    ref = probs.float()
    ordered, order = torch.sort(ref, descending=False)
    top_p_mask = torch.zeros_like(ref, dtype=torch.int32)
    # The cumulative sum in float64: a float32 scan over 128k values can drift by ~1e-4, the
    # size of the margin below.
    cumulative = torch.cumsum(ordered.double(), dim=-1)
    top_p_mask.scatter_add_(1, order, (cumulative > (1 - 0.5) - 1e-4).int())
    # bf16 rows hold many equal values: a token tied with an allowed one is allowed too (the
    # sort above orders ties arbitrarily; the nucleus keeps or drops a tie as a whole).
    smallest_allowed = ref.masked_fill(top_p_mask == 0, float("inf")).min(-1, keepdim=True).values
    top_p_mask = (ref >= smallest_allowed).int()
    pivot = torch.sort(ref, descending=True).values[:, 49:50]
    for _ in range(50):
        s = top_p_sampling_from_probs(probs, 0.5)
        assert bool((top_p_mask.gather(1, s.long()[:, None]) == 1).all())
        s = top_k_sampling_from_probs(probs, 50)
        assert bool((ref.gather(1, s.long()[:, None]) >= pivot).all())


@pytest.mark.cuda
@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_gpu_distribution_of_one_row(order):
    probs = row(128256, scale=4.0, device="cuda")
    samples = top_k_top_p_sampling_from_probs(
        probs, 50, 0.9, indices=_zeros(200_000, "cuda"), filter_apply_order=order
    )
    expected = kept(probs.cpu(), top_k=50, top_p=0.9, joint=order == "joint")
    check_draws(samples, expected)


@pytest.mark.cuda
def test_gpu_no_host_sync_and_cuda_graph_replays_draw_anew():
    probs = torch.softmax(torch.randn(16, 128256, device="cuda") * 3, dim=-1)
    top_k = torch.full((16,), 50, device="cuda", dtype=torch.int32)
    top_p = torch.full((16,), 0.9, device="cuda")
    calls = [
        lambda: top_p_sampling_from_probs(probs, top_p),
        lambda: top_k_sampling_from_probs(probs, top_k),
        lambda: min_p_sampling_from_probs(probs, 0.1),
        lambda: top_k_top_p_sampling_from_probs(probs, top_k, top_p),
        lambda: top_k_renorm_probs(probs, top_k),
        lambda: sampling_from_logits(probs.log()),
    ]
    for call in calls:
        call()  # compile and tune outside the checks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for call in calls:
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        top_k_top_p_sampling_from_probs(probs, top_k, top_p)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = top_k_top_p_sampling_from_probs(probs, top_k, top_p)
    seen = []
    for _ in range(4):
        graph.replay()
        seen.append(out.clone())
    torch.cuda.synchronize()
    allowed = top_k_renorm_probs(probs, top_k) > 0
    for s in seen:
        assert bool(allowed.gather(1, s.long()[:, None]).all())
    assert len({tuple(s.tolist()) for s in seen}) > 1  # each replay draws anew


@triton.jit
def _pick_in_chunk_kernel(X, Low, Target, Out, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + cols)[None, :]
    low = tl.load(Low + tl.arange(0, 1))
    target = tl.load(Target + tl.arange(0, 1))
    tl.store(Out + tl.arange(0, 1), pick_in_chunk(x, low, target, BLOCK))


@pytest.mark.parametrize(
    "target, expected",
    [
        (-1e-7, 2),  # below zero by rounding: the first eligible value, not column 0
        (0.0, 2),
        (0.25, 2),
        (0.31, 5),  # past 0.3, the first eligible value's mass
        (0.6, 5),  # past everything (rounding): the last eligible value, not the last column
    ],
)
def test_a_draw_inside_a_chunk_never_takes_an_ineligible_value(target, expected):
    # FlashInfer's test_sampling_freq (5M draws, half the probabilities 0) drew zeros on an
    # H100 when rounding left the in-chunk target just below zero.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.tensor([0.0, 0.05, 0.3, 0.0, 0.0, 0.2, 0.0, 0.0], device=device)
    low = torch.tensor([0.1], device=device)  # 0.05 is not above low: ineligible too
    out = torch.empty(1, dtype=torch.int32, device=device)
    _pick_in_chunk_kernel[(1,)](x, low, torch.tensor([target], device=device), out, BLOCK=8)
    assert int(out[0]) == expected

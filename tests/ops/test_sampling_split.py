"""Split-row sampling (a row's passes shared by several programs, ops/sampling/split_kernels.py)
against the one-program kernel and the filtered distributions, in the CPU interpreter.

The split path runs the same rounds with the same thresholds and uniforms as the one-program
kernel, so it draws the same tokens (the autotuner's tactic check); its draws are also
checked by distribution as test_sampling.py checks the kernel's: DRAWS draws of one row,
TVD from the filtered, renormalized distribution within 3x the sampling noise, never a
token outside the support. The interpreter runs one program at a time, so these tactics
stack many rows a program (a GPU runs one).
"""

from __future__ import annotations

import os

import pytest
import torch

from _sampling_draws import DRAWS, check_draws, kept, row
from flashtune.ops.sampling import kernels, top_k_top_p_sampling_from_probs
from flashtune.ops.sampling.config import (
    SPLIT_ROUNDS,
    SamplingTactic,
    default_tactic,
    split_block,
    split_default,
)
from flashtune.ops.sampling.launch import (
    RenormRunner,
    SamplingArgs,
    SamplingRunner,
    launch_sampling,
    launch_split_rounds,
)
from flashtune.ops.sampling.split_kernels import SPLIT_DONE

# 300 values in 64-wide chunks: 5 chunks over 4 programs (2, 2, 1 and none).
VOCAB, BLOCK = 300, 64

# op -> (kernel mode, top_k, float parameter, _kept's filters)
OPS = {
    "plain": (kernels.MODE_PLAIN, 0, 0.0, {}),
    "top_p": (kernels.MODE_TOP_P, 0, 0.6, {"top_p": 0.6}),
    "top_k": (kernels.MODE_TOP_K, 12, 0.0, {"top_k": 12}),
    "min_p": (kernels.MODE_MIN_P, 0, 0.3, {"min_p": 0.3}),
    "joint": (kernels.MODE_JOINT, 20, 0.7, {"top_k": 20, "top_p": 0.7}),
    "top_k_first": (kernels.MODE_TOP_K_FIRST, 20, 0.7, {"top_k": 20, "top_p": 0.7, "joint": False}),
}


def _draw(probs, op, tactic, batch, indices=None, seed=3, per_row=False):
    """`batch` draws with `tactic` (parameters as (batch,) tensors when per_row)."""
    mode, top_k, param, _ = OPS[op]
    k_arr = p_arr = None
    if per_row:
        k_arr = torch.randint(1, 40, (batch,), dtype=torch.int32, generator=_gen(seed))
        p_arr = 0.3 + 0.7 * torch.rand(batch, generator=_gen(seed + 1))
    out = torch.empty(batch, dtype=torch.int32)
    seed_t = torch.tensor([seed], dtype=torch.int64)
    args = SamplingArgs(mode, top_k, param)
    inputs = [probs, out, indices, seed_t, k_arr, p_arr, args]
    return SamplingRunner().forward(inputs, tactic).clone()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _split(
    split: int, rounds: int, rows: int = 512, block: int = BLOCK, prefetch: bool = True
) -> SamplingTactic:
    return SamplingTactic(block, rows, 4, split, rounds, prefetch)


@pytest.mark.parametrize(
    "op",
    # top_k_first: ~4 s on 2 cores, in the slow step (the main suite stays under 10 minutes)
    [pytest.param(op, marks=pytest.mark.slow) if op == "top_k_first" else op for op in sorted(OPS)],
)
@pytest.mark.interpreter
def test_split_draws_the_filtered_distribution(op):
    # One split round, so rows both finish in the split kernels and go on in the resume.
    probs = row(VOCAB, scale=1.5)
    samples = _draw(probs, op, _split(4, 1), DRAWS, indices=torch.zeros(DRAWS, dtype=torch.int32))
    check_draws(samples, kept(probs, **OPS[op][3]))


@pytest.mark.interpreter
def test_split_fp16_draws_within_the_support():
    probs = row(VOCAB, scale=2.0).half()
    samples = _draw(probs, "joint", _split(4, 2), 500, indices=torch.zeros(500, dtype=torch.int32))
    assert bool((kept(probs.float(), top_k=20, top_p=0.7)[samples.long()] > 0).all())


@pytest.mark.parametrize(
    "op",
    # top_k_first (~6 s on 2 cores) and joint (~3 s): in the slow step (the main suite stays
    # under 10 minutes)
    [
        pytest.param(op, marks=pytest.mark.slow) if op in ("top_k_first", "joint") else op
        for op in sorted(OPS)
    ],
)
@pytest.mark.interpreter
def test_split_draws_the_same_tokens_as_one_program(op):
    # Rows of several shapes (flat to peaked), per-row parameters, outputs gathered from
    # rows through indices; every split, from all rounds in the resume to all in the split.
    batch = 32
    probs = torch.softmax(torch.randn(12, VOCAB) * torch.linspace(0.5, 6, 12)[:, None], dim=-1)
    indices = torch.randint(0, 12, (batch,), generator=_gen(5))
    default = _draw(probs, op, -1, batch, indices, per_row=True)
    for split, rounds, rows, prefetch in [(2, 0, 32, True), (4, 1, 8, False), (8, 6, 32, True)]:
        tactic = _split(split, rounds, rows, prefetch=prefetch)
        got = _draw(probs, op, tactic, batch, indices, per_row=True)
        assert torch.equal(got, default), tactic
    # One program a row, without the scan's prefetch.
    no_prefetch = SamplingTactic(BLOCK, 32, 4, prefetch=False)
    assert torch.equal(_draw(probs, op, no_prefetch, batch, indices, per_row=True), default)


@pytest.mark.parametrize("op", ["top_k", "top_p", "top_k_first"])
@pytest.mark.interpreter
def test_split_rounds_alone_decide_every_row(op):
    """Enough split rounds decide every row without the one-program resume, drawing what the
    one-program kernel draws."""
    batch = 32
    probs = torch.softmax(torch.randn(batch, VOCAB) * 2, dim=-1)
    mode, top_k, param, _ = OPS[op]
    out = torch.full((batch,), -1, dtype=torch.int32)
    seed = torch.tensor([11], dtype=torch.int64)
    args = SamplingArgs(mode, top_k, param)
    _, work_i = launch_split_rounds(probs, out, None, seed, None, None, args, _split(4, 12, 32))
    assert bool((work_i[:, 0] == SPLIT_DONE).all())
    expected = torch.empty(batch, dtype=torch.int32)
    launch_sampling(probs, expected, None, seed, None, None, args, default_tactic(VOCAB, batch))
    assert torch.equal(out, expected)


@pytest.mark.interpreter
def test_split_rows_left_undecided_finish_in_the_resume():
    # Top-k with a small k over flat rows: the first candidate is rarely in the top k, so
    # after the first pass alone most rows are still sampling; the resume finishes them.
    batch = 32
    probs = torch.softmax(torch.randn(batch, VOCAB) * 0.5, dim=-1)
    seed = torch.tensor([2], dtype=torch.int64)
    args = SamplingArgs(kernels.MODE_TOP_K, 3)
    out = torch.full((batch,), -1, dtype=torch.int32)
    _, work_i = launch_split_rounds(probs, out, None, seed, None, None, args, _split(4, 0, 32))
    undecided = work_i[:, 0] != SPLIT_DONE
    assert int(undecided.sum()) > batch // 2
    assert bool((out[undecided] == -1).all())  # not written yet
    launch_sampling(probs, out, None, seed, None, None, args, _split(4, 0, 32))
    allowed = probs >= probs.topk(3, dim=-1).values[:, -1:]
    assert bool(allowed.gather(1, out.long()[:, None]).all())


@pytest.mark.interpreter
def test_renorm_without_prefetch_matches():
    probs = torch.softmax(torch.randn(5, VOCAB) * 2, dim=-1)
    k = torch.tensor([1, 7, 300, 64, 0])

    def renorm(tactic):
        out = torch.empty_like(probs)
        inputs = [probs, out, k, None, SamplingArgs(kernels.RENORM_TOP_K)]
        return RenormRunner().forward(inputs, tactic)

    # Same chunks, same sums: equal; other chunks (the default's) round the sums otherwise.
    expected = renorm(SamplingTactic(BLOCK, 8, 4))
    assert torch.equal(renorm(SamplingTactic(BLOCK, 8, 4, prefetch=False)), expected)
    torch.testing.assert_close(expected, renorm(-1))


# ------------------------------------------------------------------------------ tactics


def test_default_splits_small_batches_of_long_rows():
    assert split_default(128256, 1, 1024) == 128  # one 1024-wide chunk a program
    assert split_default(262208, 1, 1024) == 128  # the cap
    assert split_default(128256, 16, 1024) == 32
    assert split_default(128256, 64, 1024) == 8
    assert split_default(128256, 256, 1024) == 4  # at least 4 a row
    assert split_default(128256, 512, 1024) == 1  # the batch fills the GPU
    assert split_default(2000, 1, 1024) == 1  # too few chunks to share
    # Wider chunks once a row would keep more than 256 chunk sums (register spills).
    assert [split_block(v) for v in (128256, 151936, 262208, 600000)] == [1024, 1024, 2048, 4096]
    # The interpreter's default never splits (its cost is per program); a GPU's does.
    expected = 1 if os.environ.get("TRITON_INTERPRET") == "1" else 128
    assert default_tactic(128256, 1, split=True).split == expected


def test_split_tactics_are_offered_to_the_tuner_for_sampling_only():
    probs = torch.empty(4, 128256, device="meta")
    out = torch.empty(4, dtype=torch.int32, device="meta")
    tactics = SamplingRunner().get_valid_tactics([probs, out], None)
    split = [t for t in tactics if t.split > 1]
    assert split and {t.rounds for t in split} == {SPLIT_ROUNDS}
    assert max(t.split for t in split) * 4 <= 1024  # at most ~4 programs an SM in all
    assert all(t.split == 1 for t in RenormRunner().get_valid_tactics([probs, out], None))
    huge = torch.empty(100_000, 1, device="meta")
    assert all(t.split == 1 for t in SamplingRunner().get_valid_tactics([probs, huge], None))


# ~4 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
@pytest.mark.slow
@pytest.mark.interpreter
def test_public_calls_accept_a_split_tactic_draw():
    # The split path behind the public API: the tactic the tuner would pick, same tokens;
    # one row a program, as on a GPU.
    probs = torch.softmax(torch.randn(6, VOCAB), dim=-1)
    g = _gen(4)
    public = top_k_top_p_sampling_from_probs(probs, 10, 0.8, generator=g)
    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64, generator=_gen(4))
    out = torch.empty(6, dtype=torch.int32)
    args = SamplingArgs(kernels.MODE_TOP_K_FIRST, 10, 0.8)
    launch_sampling(probs, out, None, seed, None, None, args, _split(2, 2, 1))
    assert torch.equal(out, public)


# ------------------------------------------------------------------------------ GPU


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 16])
def test_gpu_split_is_graph_capturable_and_draws_as_one_program(batch):
    vocab = 128256
    probs = torch.softmax(torch.randn(batch, vocab, device="cuda") * 3, dim=-1)
    top_k = torch.full((batch,), 50, device="cuda", dtype=torch.int32)
    top_p = torch.full((batch,), 0.9, device="cuda")
    seed = torch.tensor([9], dtype=torch.int64, device="cuda")
    args = SamplingArgs(kernels.MODE_JOINT)
    split = SamplingTactic(1024, 1, 4, split_default(vocab, batch, 1024), SPLIT_ROUNDS)
    assert split.split > 1
    out = torch.empty(batch, dtype=torch.int32, device="cuda")

    def one_program() -> torch.Tensor:
        one = torch.empty(batch, dtype=torch.int32, device="cuda")
        launch_sampling(probs, one, None, seed, top_k, top_p, args, SamplingTactic(1024, 1, 8))
        return one

    launch_sampling(probs, out, None, seed, top_k, top_p, args, split)  # compile
    torch.cuda.synchronize()
    assert torch.equal(out, one_program())
    torch.cuda.set_sync_debug_mode("error")
    try:
        launch_sampling(probs, out, None, seed, top_k, top_p, args, split)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch_sampling(probs, out, None, seed, top_k, top_p, args, split)
    seen = []
    for draw in range(8):
        seed.fill_(100 + draw)
        graph.replay()
        seen.append(out.clone())
        assert torch.equal(seen[-1], one_program()), draw  # same seed, same tokens
    torch.cuda.synchronize()
    k_support = probs >= probs.topk(50, dim=-1).values[:, -1:]
    ordered, order = torch.sort(probs.double(), dim=-1, descending=True)
    before = torch.zeros_like(ordered).scatter_(1, order, torch.cumsum(ordered, -1) - ordered)
    allowed = k_support & (before <= 0.9 * probs.double().sum(-1, keepdim=True))
    for s in seen:
        assert bool(allowed.gather(1, s.long()[:, None]).all())
    assert len({tuple(s.tolist()) for s in seen}) > 1  # each replay draws anew

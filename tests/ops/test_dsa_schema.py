"""DSA's schemas against FlashInfer-Trace's dsa_paged Definitions (ecafa9c, tests/_ecafa9c.py):
the same name, op type, axes, inputs, outputs, constraints and descriptions; the emitted
references compute what the corpus references compute; the supply gives the corpus
Definitions flashtune's and torch's solutions; the evaluator compares the indexer's output
as index sets (a permuted set passes, a tie swapped at the k-th place passes, a wrong set
fails)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from _ecafa9c import ecafa9c_files
from flashtune.bench.build import build_solution
from flashtune.bench.correctness import compare_outputs
from flashtune.data import (
    Definition,
    EvaluationStatus,
    outputs_as_dict,
    run_reference,
    small_workload,
    synthesize_inputs,
)
from flashtune.model_shapes import MODELS
from flashtune.ops.dsa import dsa_examples, pack_index_cache
from flashtune.ops.dsa.reference import indexer_scores_at

CORPUS = {
    json.loads(text)["name"]: Definition.model_validate_json(text)
    for path, text in ecafa9c_files().items()
    if path.startswith("dsa_paged/")
}
INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"


def _ours() -> dict[str, Definition]:
    out = {}
    for op, args, kwargs in dsa_examples(MODELS["deepseek-v3.2-tp8"]):
        d = op.definition(*args, **kwargs)
        out[d.name] = d
    return out


def _dump(fields):
    return {k: v.model_dump(exclude_none=True) for k, v in fields.items()}


def test_corpus_has_three_dsa_definitions():
    assert sorted(CORPUS) == sorted(_ours())
    assert len(CORPUS) == 3


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_definitions_equal_the_corpus(name):
    corpus, ours = CORPUS[name], _ours()[name]
    assert ours.op_type == corpus.op_type
    assert ours.description == corpus.description
    assert _dump(ours.axes) == _dump(corpus.axes) and list(ours.axes) == list(corpus.axes)
    assert _dump(ours.inputs) == _dump(corpus.inputs) and list(ours.inputs) == list(corpus.inputs)
    assert _dump(ours.outputs) == _dump(corpus.outputs)
    assert ours.constraints == corpus.constraints
    # The corpus adds provenance tags (model, status, tp); the contract's tags agree.
    assert set(ours.tags) <= set(corpus.tags)


def _indexer_inputs(gen: torch.Generator) -> dict:
    seq_lens = [2100, 300, 0]  # longer than topk, shorter, empty
    pages = [-(-n // 64) for n in seq_lens]
    num_pages = sum(pages) + 2
    perm = torch.randperm(num_pages, generator=gen)
    table = torch.zeros(3, 40, dtype=torch.int32)  # 40 * 64 >= topk (the constraint)
    start = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[start : start + n].to(torch.int32)
        start += n
    return {
        "q_index_fp8": torch.randn(3, 64, 128, generator=gen).to(torch.float8_e4m3fn),
        "k_index_cache_fp8": pack_index_cache(torch.randn(num_pages, 64, 128, generator=gen)),
        "weights": torch.randn(3, 64, generator=gen) / 8,
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
        "block_table": table,
    }


def _attention_inputs(page_size: int, gen: torch.Generator) -> dict:
    num_pages = 2600 // page_size
    idx = torch.randint(0, num_pages * page_size, (3, 2048), generator=gen, dtype=torch.int32)
    idx[1, 1000:] = -1
    idx[2] = -1

    def bf16(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    return {
        "q_nope": bf16(3, 16, 512),
        "q_pe": bf16(3, 16, 64),
        "ckv_cache": bf16(num_pages, page_size, 512),
        "kpe_cache": bf16(num_pages, page_size, 64),
        "sparse_indices": idx,
        "sm_scale": 1 / math.sqrt(192),
    }


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_reference_agrees_with_the_corpus_reference(name):
    gen = torch.Generator().manual_seed(7)
    ours, corpus = _ours()[name], CORPUS[name]
    if name == INDEXER:
        inputs = _indexer_inputs(gen)
        (mine,), (theirs,) = (
            run_reference(ours, inputs).values(),
            [run_reference(corpus, inputs)["topk_indices"]],
        )
        # Same sets per row (their order among equal scores is torch.topk's either way).
        assert torch.equal(mine.sort(-1).values, theirs.sort(-1).values)
        assert (mine[1, 300:] == -1).all() and (mine[2] == -1).all()
        return
    inputs = _attention_inputs(corpus.axes["page_size"].value, gen)
    mine, theirs = run_reference(ours, inputs), run_reference(corpus, inputs)
    torch.testing.assert_close(
        mine["output"].float(), theirs["output"].float(), atol=2e-2, rtol=1e-2
    )
    torch.testing.assert_close(mine["lse"], theirs["lse"], atol=1e-4, rtol=1e-5)


def test_supply_gives_the_corpus_definitions_flashtune_and_torch_solutions():
    from flashtune.ops import load_all
    from flashtune.ops.bundle.supply import supply

    load_all()
    for definition in CORPUS.values():
        found = supply(definition)
        kinds = sorted(s.name.split("@")[0] for s in found.solutions)
        assert kinds == ["flashtune", "torch"], (definition.name, found.problems)


def _run_supplied(name: str, kind: str, device: str = "cpu") -> None:
    """The supplied `kind` solution of corpus Definition `name` against the corpus's own
    reference on synthesized inputs (a packed key cache, slot rows with -1 padding), judged
    as the evaluator judges (index sets for the indexer)."""
    from flashtune.ops import load_all
    from flashtune.ops.bundle.supply import supply

    load_all()
    definition = CORPUS[name]
    (solution,) = [s for s in supply(definition).solutions if s.name.startswith(f"{kind}@")]
    inputs = synthesize_inputs(definition, small_workload(definition), seed=5, device=device)
    expected = run_reference(definition, inputs)
    got = outputs_as_dict(definition, build_solution(solution)(*inputs.values()))
    verdict = compare_outputs(definition, expected, got, inputs=inputs)
    assert verdict.status is EvaluationStatus.PASSED, verdict.reason


# The attention's reference gathers 2048 rows of 576 a token: seconds on a 2-core CPU (slow).
_TORCH_CASES = [
    pytest.param(name, marks=[pytest.mark.slow] if name != INDEXER else [])
    for name in sorted(CORPUS)
]


@pytest.mark.parametrize("name", _TORCH_CASES)
def test_supplied_torch_solution_passes_the_corpus_reference(name):
    _run_supplied(name, "torch")


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_supplied_flashtune_solution_passes_the_corpus_reference_cuda(name):
    """flashtune's kernels at the corpus's shapes (bf16 latent of 512, fp8 indexer of 64
    heads), through the supplied solution, judged as the evaluator judges."""
    _run_supplied(name, "flashtune", "cuda")


# --------------------------------------------------------------------------- index sets


def _verdict(ref: torch.Tensor, out: torch.Tensor, inputs: dict) -> EvaluationStatus:
    definition = CORPUS[INDEXER]
    v = compare_outputs(definition, {"topk_indices": ref}, {"topk_indices": out}, inputs=inputs)
    return v.status


def _tie_inputs() -> tuple[dict, torch.Tensor]:
    """One request of 8 tokens whose keys 2 and 5 are equal (so are their scores), topk of
    the definition; returns the inputs and the reference output."""
    gen = torch.Generator().manual_seed(3)
    keys = torch.randn(1, 64, 128, generator=gen)
    keys[0, 5] = keys[0, 2]
    inputs = {
        "q_index_fp8": torch.randn(1, 64, 128, generator=gen).to(torch.float8_e4m3fn),
        "k_index_cache_fp8": pack_index_cache(keys),
        "weights": torch.rand(1, 64, generator=gen),
        "seq_lens": torch.tensor([8], dtype=torch.int32),
        "block_table": torch.zeros(1, 32, dtype=torch.int32),
    }
    return inputs, run_reference(CORPUS[INDEXER], inputs)["topk_indices"]


def test_index_sets_compare_as_sets():
    inputs, ref = _tie_inputs()
    assert _verdict(ref, ref.clone(), inputs) is EvaluationStatus.PASSED
    permuted = ref.clone()
    permuted[0, :8] = ref[0, :8].flip(0)
    assert _verdict(ref, permuted, inputs) is EvaluationStatus.PASSED


def test_index_sets_accept_a_tie_at_the_kth_place():
    inputs, full = _tie_inputs()
    scores = indexer_scores_at(*inputs.values(), full)[0, :8]
    # Keep the best tokens down to one of the tied pair: either member is a right answer.
    order = full[0, :8].tolist()
    cut = max(order.index(2), order.index(5))
    ref = torch.full_like(full, -1)
    ref[0, :cut] = full[0, :cut]
    swapped = ref.clone()
    kept = ref[0, cut - 1].item()
    swapped[0, cut - 1] = 5 if kept == 2 else 2
    assert scores[order.index(2)] == scores[order.index(5)]
    assert _verdict(ref, swapped, inputs) is EvaluationStatus.PASSED


def test_index_sets_fail_a_wrong_set():
    inputs, ref = _tie_inputs()
    worse = torch.full_like(ref, -1)
    worse[0, :7] = ref[0, 1:8]  # the best token dropped, so a row of 7
    assert _verdict(ref, worse, inputs) is EvaluationStatus.INCORRECT_NUMERICAL
    top7 = torch.full_like(ref, -1)
    top7[0, :7] = ref[0, :7]
    wrong = top7.clone()
    wrong[0, 0] = ref[0, 7]  # the 8th best instead of the best (no tie)
    assert _verdict(top7, wrong, inputs) is EvaluationStatus.INCORRECT_NUMERICAL
    foreign = top7.clone()
    foreign[0, 0] = 64 + 3  # a slot of a page the request does not hold
    assert _verdict(top7, foreign, inputs) is EvaluationStatus.INCORRECT_NUMERICAL
    twice = top7.clone()
    twice[0, 1] = twice[0, 0]
    assert _verdict(top7, twice, inputs) is EvaluationStatus.INCORRECT_NUMERICAL

"""The fp4 MoE Definitions of FlashInfer-Trace (ecafa9c: 5 `trtllm_fp4_block_scale_moe_*`, 5
`trtllm_fp4_block_scale_routed_moe_*`), whose contract is bf16 activations and float32
weights: flashtune's schemas (variants fp32w / fp32w_routed) emit them field for field; its
reference and its op (`moe_fp32_weights`, `routed_moe_fp32_weights`: the bf16 Triton experts
on weights converted per call) compute what the corpus references compute, on CPU at
reduced sizes (the corpus reference's source with its hard-coded sizes rewritten), the
Triton kernels through the interpreter."""

from __future__ import annotations

import inspect
import json
import os
import re

import pytest
import torch

from _ecafa9c import ecafa9c_files
from flashtune.data import Definition, Workload, run_reference, synthesize_inputs
from flashtune.ops.moe import moe_fp32_weights, routed_moe_fp32_weights
from flashtune.ops.moe.keys import definition_key, schema_for_definition
from flashtune.ops.moe.routing import unpack_topk_ids
from flashtune.ops.moe.schema import MoEKey
from flashtune.schema.dump import meta_tensor

FP4 = {
    json.loads(text)["name"]: Definition.model_validate_json(text)
    for path, text in ecafa9c_files().items()
    if path.startswith("moe/trtllm_fp4_")
}
NAMES = sorted(FP4)
# The main suite runs each Definition at one token count (1, 7, 33 in turn: every count, both
# heads and both routings covered); the slow step runs every (Definition, count) pair.
CASES = [
    pytest.param(name, tokens, marks=() if tokens == (1, 7, 33)[i % 3] else pytest.mark.slow)
    for i, name in enumerate(NAMES)
    for tokens in (1, 7, 33)
]


def _definition_at(key: MoEKey, tokens: int = 5) -> Definition:
    """Our Definition of a call with this key (meta tensors)."""
    t, h, i, e = tokens, key.hidden_size, key.intermediate_size, key.num_experts
    weights = (
        meta_tensor(e, 2 * i, h, dtype=torch.float32),
        meta_tensor(e, h, i, dtype=torch.float32),
    )
    hidden = meta_tensor(t, h, dtype=torch.bfloat16)
    if key.variant == "fp32w_routed":
        ids = meta_tensor(t, key.top_k, dtype=torch.int32)
        return routed_moe_fp32_weights.definition(
            ids, hidden, *weights, routing_method_type=key.routing_method_type
        )
    llama4 = key.routing_method_type == 3
    bias = meta_tensor(e, dtype=torch.bfloat16) if llama4 else None
    return moe_fp32_weights.definition(
        meta_tensor(t, e, dtype=torch.bfloat16), hidden, *weights, bias,
        routing_method_type=key.routing_method_type, top_k=key.top_k,
    )  # fmt: skip


def _dump(fields):
    return {k: v.model_dump(exclude_none=True) for k, v in fields.items()}


def test_the_ten_fp4_definitions_are_here():
    assert len(NAMES) == 10
    assert sum(n.startswith("trtllm_fp4_block_scale_routed_moe_") for n in NAMES) == 5


@pytest.mark.parametrize("name", NAMES)
def test_definitions_equal_the_corpus(name):
    corpus = FP4[name]
    key = definition_key(corpus)
    assert key is not None and key.variant in ("fp32w", "fp32w_routed")
    assert key.routing_method_type == (3 if "Llama4" in (corpus.description or "") else 1)
    ours = _definition_at(key)
    assert ours.name == corpus.name
    assert ours.op_type == corpus.op_type
    assert ours.description == corpus.description
    assert _dump(ours.axes) == _dump(corpus.axes)
    assert list(ours.axes) == list(corpus.axes)
    assert _dump(ours.inputs) == _dump(corpus.inputs)
    assert list(ours.inputs) == list(corpus.inputs)
    assert _dump(ours.outputs) == _dump(corpus.outputs)
    assert ours.constraints == corpus.constraints
    # The corpus adds provenance tags (model, status, tp, gpu); the contract's tags agree.
    assert set(ours.tags) <= set(corpus.tags)
    assert schema_for_definition(corpus) is not None


# --------------------------------------------------------------------------- at reduced sizes

E_SMALL, H_SMALL, I_SMALL = 16, 64, 32


def _reduced_key(corpus: Definition) -> MoEKey:
    key = definition_key(corpus)
    assert key is not None
    return MoEKey(
        key.variant, key.routing_method_type, key.top_k, 1, 1, E_SMALL, E_SMALL, H_SMALL,
        I_SMALL,
    )  # fmt: skip


def _rewrite(reference: str) -> str:
    """The corpus reference with its hard-coded E, H, I set to the reduced sizes."""
    sizes = {"E": E_SMALL, "H": H_SMALL, "I": I_SMALL}
    out = []
    for line in reference.splitlines():
        m = re.match(r"\s*(E|H|I) = (\d+)$", line)
        if m:
            line = line.replace(m.group(0).strip(), f"{m.group(1)} = {sizes[m.group(1)]}")
        out.append(line)
    return "\n".join(out) + "\n"


def _corpus_run(corpus: Definition, inputs: dict) -> torch.Tensor:
    namespace: dict = {}
    exec(_rewrite(corpus.reference), namespace)
    params = inspect.signature(namespace["run"]).parameters
    return namespace["run"](**{k: inputs[k] for k in params})


def _inputs(corpus: Definition, tokens: int, seed: int) -> dict:
    """Synthesized inputs of our Definition at the reduced sizes (flashtune run's draw:
    valid packed topk_ids for the routed ones), weights scaled as a layer's are."""
    ours = _definition_at(_reduced_key(corpus), tokens)
    workload = Workload(uuid="t", axes={"seq_len": tokens}, inputs={})
    inputs = synthesize_inputs(ours, workload, seed=seed)
    inputs["gemm1_weights"] = inputs["gemm1_weights"] / H_SMALL**0.5
    inputs["gemm2_weights"] = inputs["gemm2_weights"] / I_SMALL**0.5
    return inputs


@pytest.mark.parametrize(("name", "tokens"), CASES)
def test_reference_agrees_with_the_corpus_reference(name, tokens):
    corpus = FP4[name]
    inputs = _inputs(corpus, tokens, seed=tokens)
    ours = _definition_at(_reduced_key(corpus), tokens)
    mine = run_reference(ours, inputs)["output"]
    theirs = _corpus_run(corpus, inputs)
    assert mine.shape == (tokens, H_SMALL) and mine.dtype == torch.bfloat16
    assert mine.float().abs().sum() > 0
    torch.testing.assert_close(mine.float(), theirs.float(), atol=1e-2, rtol=1e-2)


def test_synthesized_topk_ids_are_valid_routings():
    # 128 experts as the corpus's (small layers: the weights are drawn too)
    ours = _definition_at(MoEKey("fp32w_routed", 1, 8, 1, 1, 128, 128, 16, 8), 33)
    workload = Workload(uuid="t", axes={"seq_len": 33}, inputs={})
    for seed in range(3):
        packed = synthesize_inputs(ours, workload, seed=seed)["topk_ids"]
        assert packed.dtype == torch.int32 and packed.shape == (33, 8)
        ids, weights = unpack_topk_ids(packed)
        assert ((ids >= 0) & (ids < 128)).all()
        assert all(len(set(row)) == 8 for row in ids.tolist())  # distinct experts a row
        assert (weights > 0).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(33), atol=2e-2, rtol=0)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize(("name", "tokens"), CASES)
def test_op_agrees_with_the_corpus_reference(name, tokens):
    """flashtune's op (the bf16 Triton experts, in the interpreter) on the corpus's contract."""
    corpus = FP4[name]
    key = _reduced_key(corpus)
    inputs = _inputs(corpus, tokens, seed=100 + tokens)
    if key.variant == "fp32w_routed":
        mine = routed_moe_fp32_weights(
            inputs["topk_ids"], inputs["hidden_states"], inputs["gemm1_weights"],
            inputs["gemm2_weights"], routing_method_type=key.routing_method_type,
        )  # fmt: skip
    else:
        mine = moe_fp32_weights(
            inputs["routing_logits"], inputs["hidden_states"], inputs["gemm1_weights"],
            inputs["gemm2_weights"], inputs.get("routing_bias"),
            routing_method_type=key.routing_method_type, top_k=key.top_k,
        )  # fmt: skip
    theirs = _corpus_run(corpus, inputs).float()
    assert mine.dtype == torch.bfloat16 and mine.shape == theirs.shape
    # bf16 weights and a bf16 intermediate: ~1e-3 of the output's norm
    err = (mine.float() - theirs).norm() / theirs.norm()
    assert err < 1e-2, err
    torch.testing.assert_close(
        mine.float(), theirs, atol=5e-2 * theirs.abs().max().item(), rtol=5e-2
    )


def _reduced_corpus(corpus: Definition) -> Definition:
    """The corpus Definition at the reduced sizes: its const axes, name and reference's
    hard-coded sizes rewritten (what `flashtune run` supplies solutions for by name)."""
    data = corpus.model_dump(exclude_none=True)
    sizes = {"num_experts": E_SMALL, "hidden_size": H_SMALL, "intermediate_size": I_SMALL}
    sizes["gemm1_out_size"] = 2 * I_SMALL
    for axis, value in sizes.items():
        data["axes"][axis]["value"] = value
    data["name"] = re.sub(r"_e\d+_h\d+_i\d+$", f"_e{E_SMALL}_h{H_SMALL}_i{I_SMALL}", corpus.name)
    data["reference"] = _rewrite(corpus.reference)
    return Definition.model_validate(data)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
# Every other Definition in the main suite, the rest in the slow step (~2 s each on 2 cores;
# the main suite stays under 10 minutes).
@pytest.mark.parametrize(
    "name",
    [n if i % 2 == 0 else pytest.param(n, marks=pytest.mark.slow) for i, n in enumerate(NAMES)],
)
def test_supplied_flashtune_solution_agrees_with_the_corpus_reference(name):
    """The solution `flashtune run` / `solutions add` supplies (its source, with the routing
    constants the Definition differs in), built and run on 7 tokens (flashtune run itself
    skips bf16 Triton solutions on a CPU: the interpreter's bf16 loads)."""
    from flashtune.bench.build import build_solution
    from flashtune.ops.bundle.supply import supply

    corpus = _reduced_corpus(FP4[name])
    found = supply(corpus, kinds=("flashtune",))
    assert not found.problems, found.problems
    (solution,) = found.solutions
    workload = Workload(uuid="t", axes={"seq_len": 7}, inputs={})
    inputs = synthesize_inputs(corpus, workload, seed=11)
    inputs["gemm1_weights"] = inputs["gemm1_weights"] / H_SMALL**0.5
    inputs["gemm2_weights"] = inputs["gemm2_weights"] / I_SMALL**0.5
    mine = build_solution(solution)(*inputs.values())
    theirs = run_reference(corpus, inputs)["output"].float()
    err = (mine.float() - theirs).norm() / theirs.norm()
    assert err < 1e-2, err

"""The fused MoE family's schemas against the FlashInfer-Trace MoE Definitions
(tests/ops/data/moe, copied unchanged from flashinfer-ai/flashinfer-bench at ecafa9c,
Apache-2.0: the 3 `moe_fp8_block_scale_ds_routing_*`, the 3 `moe_fp8_block_scale_renorm_*`
and the 3 `trtllm_fp8_per_tensor_scale_moe_*`): the same name, op type, axes, inputs,
outputs, constraints and descriptions from the model examples' calls; the emitted reference
computes what the corpus reference computes (on CPU at reduced sizes: the corpus reference's
source with its hard-coded sizes rewritten; at the corpus's own sizes on a GPU); calls no
Definition describes are refused."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import torch

from flashtune.data import Definition, Workload, run_reference, synthesize_inputs
from flashtune.model_shapes import MODELS
from flashtune.ops.moe import MOE_OPS, moe_examples, trtllm_fp8_block_scale_moe
from flashtune.ops.moe.schema import VARIANT_SCHEMAS, MoEKey, schema_of
from flashtune.schema import Const, Tensor
from flashtune.schema.dump import meta_tensor

DATA = Path(__file__).parent / "data" / "moe"
CORPUS = sorted(p.stem for p in DATA.glob("*.json"))


def _corpus(name: str) -> Definition:
    return Definition.model_validate_json((DATA / f"{name}.json").read_text())


def _examples() -> dict[str, Definition]:
    """Definitions of every MoE model's example calls, by name (meta tensors: nothing runs)."""
    out: dict[str, Definition] = {}
    for model in MODELS.values():
        for op, args, kwargs in moe_examples(model):
            d = op.definition(*args, **kwargs)
            out[d.name] = d
    return out


EXAMPLES = _examples()


def _key(corpus: Definition) -> MoEKey:
    """The key of the call a corpus Definition describes (its name and const axes)."""
    c = corpus.const_axes
    top_k = int(re.search(r"topk(\d+)", corpus.name).group(1))
    h, i = c["hidden_size"], c["intermediate_size"]
    if corpus.name.startswith("moe_fp8_block_scale_ds"):
        ng, kg = (int(x) for x in re.search(r"ng(\d+)_kg(\d+)", corpus.name).groups())
        return MoEKey("ds", 2, top_k, ng, kg, c["num_experts"], c["num_local_experts"], h, i)
    if corpus.name.startswith("moe_fp8_block_scale_renorm"):
        e = c["num_local_experts"]
        return MoEKey("renorm", 1, top_k, 1, 1, e, e, h, i)
    method = 3 if "Llama4" in (corpus.description or "") else 1
    return MoEKey("per_tensor", method, top_k, 1, 1, c["num_experts"], c["num_experts"], h, i)


def _dump(fields):
    return {k: v.model_dump(exclude_none=True) for k, v in fields.items()}


def test_corpus_files_are_here():
    assert len(CORPUS) == 9


def test_model_examples_give_the_corpus_definitions_of_their_models():
    """DeepSeek-V3 and Kimi-K2 (EP 1 and 8), Qwen3-30B-A3B (block and per tensor), Llama-4
    Scout: their example calls' Definitions are the corpus's."""
    have = set(EXAMPLES) & set(CORPUS)
    assert len(have) == 6, sorted(have)
    for name in have:
        assert EXAMPLES[name] == _definition_at(_key(_corpus(name))), name


@pytest.mark.parametrize("name", CORPUS)
def test_definitions_equal_the_corpus(name):
    corpus = _corpus(name)
    ours = _definition_at(_key(corpus))
    assert ours.name == corpus.name
    assert ours.op_type == corpus.op_type
    assert ours.description == corpus.description
    assert _dump(ours.axes) == _dump(corpus.axes)
    assert list(ours.axes) == list(corpus.axes)  # same order, so the same name
    assert _dump(ours.inputs) == _dump(corpus.inputs)
    assert list(ours.inputs) == list(corpus.inputs)
    assert _dump(ours.outputs) == _dump(corpus.outputs)
    assert ours.constraints == corpus.constraints
    # The corpus adds provenance tags (model, status, tp); the contract's tags agree.
    assert set(ours.tags) <= set(corpus.tags)


# The reduced sizes each corpus reference is rewritten to (its hard-coded E / E_global, H,
# I) and the key of our schema at those sizes: the same routing constants (top_k, groups).
def _reduced(corpus: Definition) -> tuple[dict[str, int], MoEKey]:
    c = corpus.const_axes
    top_k = c.get("top_k") or int(re.search(r"topk(\d+)", corpus.name).group(1))
    if corpus.name.startswith("moe_fp8_block_scale_ds"):
        ng, kg = (int(x) for x in re.search(r"ng(\d+)_kg(\d+)", corpus.name).groups())
        ep = c["num_experts"] // c["num_local_experts"]
        experts = 64 if ng > 1 else 32
        key = MoEKey("ds", 2, top_k, ng, kg, experts, experts // ep, 256, 128)
        return {"E_global": experts, "E_local": experts // ep, "H": 256, "I": 128}, key
    experts = 16 if top_k < 16 else 32
    if corpus.name.startswith("moe_fp8_block_scale_renorm"):
        return {"E": experts, "H": 256, "I": 128}, MoEKey(
            "renorm", 1, top_k, 1, 1, experts, experts, 256, 128
        )
    method = 3 if "Llama4" in (corpus.description or "") else 1
    key = MoEKey("per_tensor", method, top_k, 1, 1, experts, experts, 256, 128)
    return {"E": experts, "H": 256, "I": 128}, key


def _rewrite(reference: str, sizes: dict[str, int]) -> str:
    """The corpus reference with its hard-coded sizes set to `sizes` and the asserts that
    pin them dropped (nothing else changes)."""
    lines = []
    for line in reference.replace("\r\n", "\n").splitlines():
        stripped = line.strip()
        m = re.match(r"(E_global|E_local|E|H|I) = (\d+)$", stripped)
        if m and m.group(1) in sizes:
            line = line.replace(m.group(0), f"{m.group(1)} = {sizes[m.group(1)]}")
        elif stripped.startswith("assert") and re.search(r"\b(H|I|E_global|E_local) ==", stripped):
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def _draw_inputs(ours: Definition, seq_len: int, offset: int) -> dict:
    workload = Workload(uuid="t", axes={"seq_len": seq_len}, inputs={})
    inputs = synthesize_inputs(ours, workload, seed=3)
    if "local_expert_offset" in inputs:
        inputs["local_expert_offset"] = offset
    if "routed_scaling_factor" in inputs:
        inputs["routed_scaling_factor"] = 2.5
    for name, value in inputs.items():  # positive scales, as quantizers make them
        if name.endswith(("_scale", "_scalar")) and isinstance(value, torch.Tensor):
            inputs[name] = value.abs() + 0.05
    return inputs


def _run_corpus(source: str, ours: Definition, inputs: dict) -> torch.Tensor:
    namespace: dict = {}
    exec(source, namespace)
    params = inspect.signature(namespace["run"]).parameters
    return namespace["run"](**{k: inputs[k] for k in params})


@pytest.mark.parametrize("name", CORPUS)
def test_reference_agrees_with_the_corpus_reference_at_reduced_sizes(name):
    corpus = _corpus(name)
    sizes, key = _reduced(corpus)
    ours = schema_of(key)
    # A call's Definition at the reduced sizes (the schema's own, for this key)
    ours_def = _definition_at(key)
    assert ours_def.name.startswith(ours.name_prefix)
    offset = key.num_local_experts if key.expert_parallel > 1 else 0
    inputs = _draw_inputs(ours_def, 11, offset)
    mine = run_reference(ours_def, inputs)["output"]
    theirs = _run_corpus(_rewrite(corpus.reference, sizes), ours_def, inputs)
    assert mine.shape == (11, 256) and mine.dtype == torch.bfloat16
    assert mine.float().abs().sum() > 0  # some tokens reached this rank's experts
    torch.testing.assert_close(mine.float(), theirs.float(), atol=1e-2, rtol=1e-2)


def _definition_at(key: MoEKey) -> Definition:
    """Our Definition of a call with this key (meta tensors; seq_len 5; the second rank's
    experts under expert parallelism)."""
    t, h, i, e, b = 5, key.hidden_size, key.intermediate_size, key.num_local_experts, 128
    f8, f32 = torch.float8_e4m3fn, torch.float32
    offset = e if key.expert_parallel > 1 else 0
    if key.variant == "per_tensor":
        from flashtune.ops.moe import trtllm_fp8_per_tensor_scale_moe as op

        llama4 = key.routing_method_type == 3
        args = (
            meta_tensor(t, e), meta_tensor(e) if llama4 else None, meta_tensor(t, h, dtype=f8),
            meta_tensor(e, 2 * i, h, dtype=f8), meta_tensor(e, dtype=f32),
            meta_tensor(e, dtype=f32), meta_tensor(e, h, i, dtype=f8), meta_tensor(e, dtype=f32),
            e, key.top_k, None, None, i, 0, e, None, llama4,
        )  # fmt: skip
    else:
        op = trtllm_fp8_block_scale_moe
        ds = key.variant == "ds"
        args = (
            meta_tensor(t, key.num_experts, dtype=f32 if ds else torch.bfloat16),
            meta_tensor(key.num_experts) if ds else None, meta_tensor(t, h, dtype=f8),
            meta_tensor(h // b, t, dtype=f32), meta_tensor(e, 2 * i, h, dtype=f8),
            meta_tensor(e, 2 * i // b, h // b, dtype=f32), meta_tensor(e, h, i, dtype=f8),
            meta_tensor(e, h // b, i // b, dtype=f32), key.num_experts, key.top_k, key.n_group,
            key.topk_group, i, offset, e, 2.5 if ds else None,
        )  # fmt: skip
    return op.definition(*args, routing_method_type=key.routing_method_type)


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("name", CORPUS)
def test_reference_agrees_with_the_corpus_reference_at_corpus_sizes(name):
    """At the corpus's own sizes (tens of GB of fp32 weights in the corpus references: a
    GPU's memory), two tokens."""
    corpus = _corpus(name)
    ours = _definition_at(_key(corpus))
    offset = 0
    if corpus.const_axes.get("num_experts", 0) > corpus.const_axes.get("num_local_experts", 0) > 0:
        offset = corpus.const_axes["num_local_experts"]
    workload = Workload(uuid="t", axes={"seq_len": 2}, inputs={})
    inputs = synthesize_inputs(ours, workload, seed=5, device="cuda")
    if "local_expert_offset" in inputs:
        inputs["local_expert_offset"] = offset
    mine = run_reference(ours, inputs)["output"]
    theirs = run_reference(corpus, inputs)["output"]
    torch.testing.assert_close(mine.float(), theirs.float(), atol=1e-2, rtol=1e-2)


def test_calls_no_definition_describes_are_refused():
    key = MoEKey("renorm", 1, 4, 1, 1, 32, 32, 256, 128)
    ((op, args, kwargs),) = [e for e in moe_examples(MODELS["mini-moe"]) if e[0] is op_block()]
    assert op.definition(*args, **kwargs).name == schema_of(key).name_prefix + "_e32_h256_i128"
    with pytest.raises(ValueError, match="use_shuffled_weight"):
        op.definition(*args, **kwargs, use_shuffled_weight=True)
    with pytest.raises(ValueError, match="routing_replay_out"):
        op.definition(*args, **kwargs, routing_replay_out=meta_tensor(5, 4))
    from flashtune.ops.moe import trtllm_fp8_per_tensor_scale_moe as per_tensor

    ((op, args, kwargs),) = [e for e in moe_examples(MODELS["mini-moe"]) if e[0] is per_tensor]
    with pytest.raises(ValueError, match="fp8_per_tensor MoE with Default routing"):
        op.definition(*args, routing_method_type=0)


@pytest.mark.slow  # ~4 s on 2 cores: the main suite stays under its 10 minutes
def test_other_block_scale_routings_are_flashinfers_template_definitions():
    """Block-scale calls of the other routing methods (and Renormalize calls the renorm
    Definitions do not describe: a bias, experts of other ranks) are named and laid out as
    FlashInfer's trace templates: top_k an axis and an input, an optional bias."""
    ((op, args, kwargs),) = [e for e in moe_examples(MODELS["mini-moe"]) if e[0] is op_block()]
    names = {m: op.definition(*args, routing_method_type=m).name for m in (0, 3, 4, 5) if m != 3}
    assert names == {
        0: "moe_fp8_block_scale_default_routing_topk4_e32_h256_i128",
        4: "moe_fp8_block_scale_renormalize_naive_routing_topk4_e32_h256_i128",
        5: "moe_fp8_block_scale_topk_routing_topk4_e32_h256_i128",
    }
    biased = op.definition(args[0], meta_tensor(32), *args[2:], **kwargs)
    assert biased.name == "moe_fp8_block_scale_renormalize_routing_topk4_e32_h256_i128"
    assert list(biased.inputs)[:2] == ["routing_logits", "routing_bias"]
    assert {"top_k", "local_expert_offset", "routed_scaling_factor"} <= set(biased.inputs)
    assert biased.description == "FP8 block scale MoE with Renormalize routing (TopK → Softmax)."
    llama4 = op.definition(*args[:9], 1, *args[10:], routing_method_type=3)
    assert llama4.name == "moe_fp8_block_scale_llama4_routing_topk1_e32_h256_i128"
    # The emitted reference runs and computes what the API does (Default routing, EP 1).
    d = op.definition(*args, routing_method_type=0)
    inputs = {**_draw_inputs(d, 3, 0), "top_k": 4}  # a scalar input: the workload's value
    from flashtune.ops.moe import trtllm_fp8_block_scale_moe as api

    want = run_reference(d, inputs)["output"]
    got = api(
        inputs["routing_logits"], None, inputs["hidden_states"], inputs["hidden_states_scale"],
        inputs["gemm1_weights"], inputs["gemm1_weights_scale"], inputs["gemm2_weights"],
        inputs["gemm2_weights_scale"], 32, 4, None, None, 128, 0, 32, 2.5,
        routing_method_type=0,
    )  # fmt: skip
    assert want.float().abs().sum() > 0
    # The kernels may round GEMM1's output to fp8 for GEMM2 (experts.py): a norm bound
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < 3e-2, err


def op_block():
    return trtllm_fp8_block_scale_moe


def test_routing_constants_are_baked_into_the_reference():
    d = EXAMPLES["moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"]
    assert "routing_method_type=2, top_k=8, n_group=8, topk_group=4" in d.reference
    assert d.description == "FP8 block scale MoE operation. Routing and two grouped-GEMM included."


def test_schemas_are_consistent():
    """What tests/schema/test_registry.py checks of registered ops, for the variants: params
    exist in the ops' signatures, const axes resolve, the reference takes every input and
    bound parameter; each op lists its variants under their short prefixes."""
    params = {op.qualname: set(op.signature.parameters) for op in MOE_OPS}
    for op in MOE_OPS:
        for schema in op.schemas:
            for name in schema.inputs:
                assert schema.param_of(name).split(".")[0] in params[op.qualname]
            dims = {d for s in schema.inputs.values() if isinstance(s, Tensor) for d in s.dims}
            assert all(a in dims or s.param for a, s in schema.axes.items() if isinstance(s, Const))
            ref = inspect.signature(schema.reference).parameters
            assert all(n in ref for n in [*schema.inputs, *schema.bound])
    assert {s.name_prefix for op in MOE_OPS for s in op.schemas} == {
        s.name_prefix for s in VARIANT_SCHEMAS.values()
    }
    for name in EXAMPLES:
        assert any(name.startswith(s.name_prefix + "_") for s in VARIANT_SCHEMAS.values())


def test_emitted_reference_is_self_contained():
    d = EXAMPLES["moe_fp8_block_scale_renorm_topk4_e32_h256_i128"]
    namespace: dict = {}
    exec(d.reference, namespace)  # only math and torch
    assert set(json.loads(d.model_dump_json())["inputs"]) == set(
        inspect.signature(namespace["run"]).parameters
    )
    assert "def select_experts(" in d.reference and "def run_experts_ref(" in d.reference


def test_bf16_definitions_are_named_by_their_routing():
    """flashtune's own bf16 MoE Definitions (FlashInfer-Trace has none): the routing method
    and its constants in the name; a bias only where the method reads one as its input."""
    names = {n for n in EXAMPLES if n.startswith("trtllm_bf16_moe_")}
    assert {
        "trtllm_bf16_moe_ds_routing_topk8_ng8_kg4_e32_h7168_i2048",
        "trtllm_bf16_moe_renormalize_routing_topk8_e128_h2048_i768",
        "trtllm_bf16_moe_llama4_routing_topk1_e16_h5120_i8192",
    } <= names
    ds = EXAMPLES["trtllm_bf16_moe_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"]
    assert "routing_bias" in ds.inputs and ds.inputs["hidden_states"].dtype == "bfloat16"
    renorm = EXAMPLES["trtllm_bf16_moe_renormalize_routing_topk8_e128_h2048_i768"]
    assert "routing_bias" not in renorm.inputs
    from flashtune.ops.moe import trtllm_bf16_moe

    ((op, args, kwargs),) = [e for e in moe_examples(MODELS["mini-moe"]) if e[0] is trtllm_bf16_moe]
    assert op.definition(*args, **{**kwargs, "routing_method_type": 4}).name == (
        "trtllm_bf16_moe_renormalize_naive_routing_topk4_e32_h256_i128"
    )
    with pytest.raises(ValueError, match="routing_bias and Renormalize"):
        op.definition(args[0], meta_tensor(32), *args[2:], **kwargs)


def test_synthesized_expert_offset_is_rank_0():
    """A workload that leaves local_expert_offset to synthesis gets rank 0's (0): any other
    value puts an all-local definition's experts out of range."""
    d = EXAMPLES["trtllm_bf16_moe_renormalize_routing_topk4_e32_h256_i128"]
    inputs = synthesize_inputs(d, Workload(uuid="t", axes={"seq_len": 2}, inputs={}), seed=0)
    assert inputs["local_expert_offset"] == 0 and inputs["routed_scaling_factor"] == 1.0

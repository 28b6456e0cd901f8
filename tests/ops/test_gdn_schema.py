"""GDN's schemas against FlashInfer-Trace's 9 gdn Definitions (ecafa9c: gdn_prefill_*,
gdn_decode_*, gdn_mtp_* of Qwen3-Next at TP 1, 2, 4): the same name, op type, axes, inputs,
outputs (names, shapes, dtypes, in order) and constraints, tags within theirs (theirs add
provenance: model, status, tp; their descriptions vary from file to file and are not
compared); each gets flashtune's and torch's solutions, which pass the evaluator against the
Definition's own reference (the TP 4 ones at a few tokens, on CPU: the interpreter runs the
kernels); the value families draw what the recurrence needs."""

from __future__ import annotations

import pytest
import torch

from _ecafa9c import ecafa9c_files
from flashtune.bench.build import build_solution
from flashtune.bench.correctness import compare_outputs
from flashtune.data import (
    Definition,
    Workload,
    outputs_as_dict,
    run_reference,
    synthesize_inputs,
)
from flashtune.model_shapes import MODELS
from flashtune.ops import load_all
from flashtune.ops.bundle.supply import match_schema, schema_definition_at, supply_all
from flashtune.ops.gdn import gdn_examples
from flashtune.ops.gdn.schema import GDN_SCHEMAS

load_all()

CORPUS = {
    Definition.model_validate_json(text).name: Definition.model_validate_json(text)
    for path, text in ecafa9c_files().items()
    if path.startswith("gdn/")
}


def _specs(d: Definition, kind: str) -> list[tuple[str, object, str]]:
    return [(n, s.shape, s.dtype) for n, s in getattr(d, kind).items()]


def test_the_corpus_has_the_nine_gdn_definitions():
    assert len(CORPUS) == 9
    assert {n.split("_qk")[0] for n in CORPUS} == {"gdn_prefill", "gdn_decode", "gdn_mtp"}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_definitions_equal_the_corpus(name):
    corpus = CORPUS[name]
    (schema,) = [s for s in GDN_SCHEMAS if name.startswith(f"{s.name_prefix}_")]
    ours = schema_definition_at(schema, corpus)
    assert ours.name == corpus.name and ours.op_type == corpus.op_type
    axes = {n: (a.type, getattr(a, "value", None)) for n, a in ours.axes.items()}
    assert axes == {n: (a.type, getattr(a, "value", None)) for n, a in corpus.axes.items()}
    assert list(ours.axes) == list(corpus.axes)
    assert _specs(ours, "inputs") == _specs(corpus, "inputs")
    assert _specs(ours, "outputs") == _specs(corpus, "outputs")
    assert ours.constraints == corpus.constraints
    assert set(ours.tags) <= set(corpus.tags)
    assert not isinstance(match_schema(corpus), str)


def test_every_corpus_gdn_definition_gets_flashtune_and_torch_solutions():
    found = supply_all(CORPUS.values())
    for item in found:
        kinds = sorted(s.name.split("@")[0] for s in item.solutions)
        assert kinds == ["flashtune", "torch"], (item.definition.name, item.problems)
        for solution in item.solutions:
            build_solution(solution)  # its source imports and binds `run`


def _inputs(definition: Definition, axes: dict[str, int]) -> dict:
    inputs = synthesize_inputs(definition, Workload(uuid="t", axes=axes, inputs={}), seed=5)
    for name, value in inputs.items():  # bf16 loads are wrong in Triton's interpreter
        if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16:
            inputs[name] = value.half()
    return inputs


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "name, axes",
    [
        ("gdn_decode_qk4_v8_d128_k_last", {"batch_size": 2}),
        # seconds each in the interpreter at head size 128: slow
        pytest.param("gdn_mtp_qk4_v8_d128_k_last",
                     {"batch_size": 2, "seq_len": 3, "pool_size": 3}, marks=pytest.mark.slow),
        pytest.param("gdn_prefill_qk4_v8_d128_k_last",
                     {"total_seq_len": 5, "num_seqs": 2, "len_cu_seqlens": 3},
                     marks=pytest.mark.slow),
    ],
)  # fmt: skip
def test_supplied_solutions_pass_against_the_corpus_reference(name, axes):
    definition = CORPUS[name]
    (item,) = supply_all([definition])
    inputs = _inputs(definition, axes)
    expected = run_reference(definition, inputs)
    for solution in item.solutions:
        args = [inputs[n] for n in definition.inputs if n in inputs]
        got = outputs_as_dict(definition, build_solution(solution)(*args))
        got = {k: v.to(expected[k].dtype) for k, v in got.items()}  # fp16 runs, bf16 contract
        verdict = compare_outputs(definition, expected, got)
        assert verdict.status.value == "PASSED", (solution.name, verdict.reason)


def test_the_mini_model_examples_are_the_bundled_definitions():
    names = {op.definition(*args, **kw).name for op, args, kw in gdn_examples(MODELS["mini-gdn"])}
    assert names == {f"gdn_{s}_qk1_v2_d128_k_last" for s in ("prefill", "decode", "mtp")}
    assert gdn_examples(MODELS["llama-3.1-8b"]) == []


def test_a_definition_round_trips_as_json():
    op, args, kwargs = gdn_examples(MODELS["mini-gdn"])[0]
    d = op.definition(*args, **kwargs)
    assert Definition.model_validate_json(d.to_json()) == d
    assert "def run(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)" in d.reference


def test_value_families_draw_unit_keys_and_lasting_decays():
    definition = CORPUS["gdn_decode_qk4_v8_d128_k_last"]
    inputs = synthesize_inputs(definition, Workload(uuid="t", axes={"batch_size": 64},
                                                    inputs={}), seed=1)  # fmt: skip
    for name in ("q", "k"):
        norms = inputs[name].float().norm(dim=-1)
        torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-2, rtol=0)
    from flashtune.ops.gdn import gdn_gates

    g, _ = gdn_gates(inputs["A_log"], inputs["a"], inputs["dt_bias"], inputs["b"])
    assert 0.0 < float(g.min()) and float(g.max()) < 1.0
    assert float((g > 0.9).float().mean()) > 0.3  # many heads remember tens of tokens
    assert float((g < 0.9).float().mean()) > 0.01  # and some forget fast

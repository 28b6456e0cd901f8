"""The selective state update's schemas against FlashInfer-Trace's `mamba_ssu_decode_*`
Definitions (ecafa9c: NemotronH-8B at TP 1 and 2): the same name, op type, axes, inputs,
outputs, constraints and descriptions from the model examples' calls; the emitted reference
computes what the corpus's does (CPU, at the corpus's shapes, a few rows); calls no
Definition describes are refused; the dataset supply gives both Definitions flashtune's and
torch's solutions."""

from __future__ import annotations

import json

import pytest
import torch

from _ecafa9c import ecafa9c_files
from flashtune.bench.build import build_solution
from flashtune.data import Definition, outputs_as_dict
from flashtune.model_shapes import MODELS
from flashtune.ops import load_all
from flashtune.ops.bundle.supply import supply
from flashtune.ops.mamba import mamba_examples, selective_state_update
from flashtune.ops.mamba.schema import SSUKey, definition_key, schema_for_definition, schema_of
from flashtune.schema.dump import meta_tensor

CORPUS = {
    name.split("/")[1].removesuffix(".json"): text
    for name, text in ecafa9c_files().items()
    if name.startswith("mamba_ssu/")
}
MODELS_OF = {  # the corpus Definition each model's example call gives
    "nemotron-h-8b": "mamba_ssu_decode_h128_d64_s128_ng8",
    "nemotron-h-8b-tp2": "mamba_ssu_decode_h64_d64_s128_ng4",
}


def _corpus(name: str) -> Definition:
    return Definition.model_validate_json(CORPUS[name])


def _dump(fields):
    return {k: v.model_dump(exclude_none=True) for k, v in fields.items()}


def test_the_corpus_has_two_mamba_definitions():
    assert sorted(CORPUS) == sorted(MODELS_OF.values())


@pytest.mark.parametrize("model", sorted(MODELS_OF))
def test_model_examples_give_the_corpus_definitions(model):
    ((op, args, kwargs),) = mamba_examples(MODELS[model])
    ours, corpus = op.definition(*args, **kwargs), _corpus(MODELS_OF[model])
    assert ours.name == corpus.name
    assert ours.op_type == corpus.op_type
    assert ours.description == corpus.description
    assert _dump(ours.axes) == _dump(corpus.axes)
    assert list(ours.axes) == list(corpus.axes)  # same order, so the same name
    assert _dump(ours.inputs) == _dump(corpus.inputs)
    assert list(ours.inputs) == list(corpus.inputs)
    assert _dump(ours.outputs) == _dump(corpus.outputs)
    assert list(ours.outputs) == list(corpus.outputs)
    assert ours.constraints == corpus.constraints
    # The corpus adds provenance tags (model, status, tp); the contract's tags agree.
    assert set(ours.tags) <= set(corpus.tags)


def _run(source: str, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    namespace: dict = {}
    exec(source, namespace)
    return namespace["run"](**{k: v.clone() for k, v in inputs.items()})


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_emitted_reference_computes_the_corpus_reference(name):
    corpus = _corpus(name)
    ours = schema_for_definition(corpus)
    assert ours is not None
    h, d, s, g = (corpus.const_axes[a] for a in ("nheads", "head_dim", "dstate", "ngroups"))
    gen = torch.Generator().manual_seed(0)
    batch, slots = 3, 5
    idx = torch.tensor([4, -1, 1], dtype=torch.int32)

    def randn(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(torch.bfloat16)

    inputs = {
        "state": randn(slots, h, d, s),
        "x": randn(batch, h, d),
        "dt": randn(batch, h, d),
        "A": -torch.rand(h, generator=gen).view(h, 1, 1).expand(h, d, s) * 4,
        "B": randn(batch, g, s),
        "C": randn(batch, g, s),
        "D": randn(h, d),
        "dt_bias": randn(h, d, scale=0.5),
        "state_batch_indices": idx,
    }
    source = ours.build_definition(
        ours.bind(dict(inputs, dt_softplus=True, pad_slot_id=-1))
    ).reference
    want_y, want_state = _run(corpus.reference, inputs)
    y, state = _run(source, inputs)
    torch.testing.assert_close(y, want_y, atol=0, rtol=0)
    torch.testing.assert_close(state, want_state, atol=0, rtol=0)


def _call(**change):
    args = {
        "state": meta_tensor(9, 8, 16, 32),
        "x": meta_tensor(3, 8, 16),
        "dt": meta_tensor(3, 8, 16),
        "A": meta_tensor(8, 16, 32, dtype=torch.float32),
        "B": meta_tensor(3, 2, 32),
        "C": meta_tensor(3, 2, 32),
        "D": meta_tensor(8, 16),
        "dt_bias": meta_tensor(8, 16),
        "dt_softplus": True,
        "state_batch_indices": meta_tensor(3, dtype=torch.int32),
    }
    args.update(change)
    return args


def test_a_call_at_other_shapes_gets_its_own_definition():
    d = selective_state_update.definition(**_call())
    assert d.name == "mamba_ssu_decode_h8_d16_s32_ng2"
    assert d.const_axes == {"nheads": 8, "head_dim": 16, "dstate": 32, "ngroups": 2}
    assert "8 heads" in (d.description or "")
    assert definition_key(d) == SSUKey(8, 16, 32, 2)


@pytest.mark.parametrize(
    "change,what",
    [
        ({"z": meta_tensor(3, 8, 16)}, "z"),
        ({"dt_softplus": False}, "dt_softplus=False"),
        ({"dt_bias": None}, "no dt_bias"),
        ({"state_batch_indices": None}, "no state_batch_indices"),
        ({"disable_state_update": True}, "disable_state_update"),
    ],
)
def test_calls_no_definition_describes_are_refused(change, what):
    with pytest.raises(ValueError, match=f"describes a call with {what}"):
        selective_state_update.definition(**_call(**change))


def test_definition_key_reads_names_only_of_its_own():
    corpus = _corpus("mamba_ssu_decode_h64_d64_s128_ng4")
    assert definition_key(corpus) == SSUKey(64, 64, 128, 4)
    assert schema_of(SSUKey(64, 64, 128, 4)) is schema_for_definition(corpus)
    other = corpus.model_copy(update={"name": "mamba_ssu_prefill_h64_d64_s128_ng4"})
    assert definition_key(other) is None
    wrong = json.loads(CORPUS["mamba_ssu_decode_h64_d64_s128_ng4"])
    wrong["axes"]["nheads"]["value"] = 32  # the name says 64
    assert definition_key(Definition.model_validate(wrong)) is None


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_supply_gives_flashtune_and_torch_solutions(name):
    load_all()
    corpus = _corpus(name)
    found = supply(corpus)
    assert found.problems == []
    assert {s.name for s in found.solutions} == {f"flashtune@{name}", f"torch@{name}"}
    for solution in found.solutions:
        build_solution(solution)  # its source imports and binds `run` (no kernel runs)
    # The torch solution runs the op's reference on the CPU: the corpus reference's outputs.
    (torch_solution,) = [s for s in found.solutions if s.name.startswith("torch@")]
    h, d, s, g = (corpus.const_axes[a] for a in ("nheads", "head_dim", "dstate", "ngroups"))
    gen = torch.Generator().manual_seed(1)
    inputs = [
        torch.randn(3, h, d, s, generator=gen).bfloat16(),
        torch.randn(2, h, d, generator=gen).bfloat16(),
        torch.randn(2, h, d, generator=gen).bfloat16(),
        -torch.rand(h, d, s, generator=gen),
        torch.randn(2, g, s, generator=gen).bfloat16(),
        torch.randn(2, g, s, generator=gen).bfloat16(),
        torch.randn(h, d, generator=gen).bfloat16(),
        torch.randn(h, d, generator=gen).bfloat16(),
        torch.tensor([2, 0], dtype=torch.int32),
    ]
    got = outputs_as_dict(corpus, build_solution(torch_solution)(*inputs))
    namespace: dict = {}
    exec(corpus.reference, namespace)
    want_y, want_state = namespace["run"](*inputs)
    torch.testing.assert_close(got["output"], want_y, atol=0, rtol=0)
    torch.testing.assert_close(got["new_state"], want_state, atol=0, rtol=0)

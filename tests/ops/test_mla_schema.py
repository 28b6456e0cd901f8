"""MLA's schemas against the FlashInfer-Trace mla_paged Definitions (tests/ops/data/mla,
copied unchanged from flashinfer-ai/flashinfer-bench at ecafa9c, Apache-2.0): the same name,
op type, axes, inputs, outputs and constraints (descriptions included), from the planned
wrapper's run and from the plan-free calls; the emitted reference computes what the corpus
reference computes; calls no Definition describes are refused."""

from __future__ import annotations

import inspect
import json
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
from flashtune.ops.mla import MLA_OPS, BatchMLAPagedAttentionWrapper, mla_examples, mla_paged_decode
from flashtune.ops.mla.schema import MLA_SCHEMAS, WRAPPER_SCHEMAS
from flashtune.schema import Const, Tensor

DATA = Path(__file__).parent / "data" / "mla"
CORPUS = sorted(p.stem for p in DATA.glob("*.json"))


def _corpus(name: str) -> Definition:
    return Definition.model_validate_json((DATA / f"{name}.json").read_text())


def _ours(heads: int, page_size: int) -> dict[str, list[Definition]]:
    """Definitions of every example call (wrapper decode, wrapper prefill, plan-free decode,
    plan-free prefill) by name; no kernel runs (meta tensors)."""
    out: dict[str, list[Definition]] = {}
    for op, args, kwargs in mla_examples(heads, page_size=page_size):
        d = op.definition(*args, **kwargs)
        out.setdefault(d.name, []).append(d)
    return out


def _dump(fields):
    return {k: v.model_dump(exclude_none=True) for k, v in fields.items()}


def test_corpus_files_are_here():
    assert len(CORPUS) == 6


@pytest.mark.parametrize("name", CORPUS)
def test_definitions_equal_the_corpus(name):
    corpus = _corpus(name)
    heads = corpus.axes["num_qo_heads"].value
    page_size = corpus.axes["page_size"].value
    ours = _ours(heads, page_size)[name]
    assert len(ours) == 2  # the wrapper's run and the plan-free call
    for d in ours:
        assert d.name == corpus.name
        assert d.op_type == corpus.op_type
        assert _dump(d.axes) == _dump(corpus.axes)
        assert list(d.axes) == list(corpus.axes)  # same order, so the same name
        assert _dump(d.inputs) == _dump(corpus.inputs)
        assert list(d.inputs) == list(corpus.inputs)
        assert _dump(d.outputs) == _dump(corpus.outputs)
        assert d.constraints == corpus.constraints
        # The corpus adds provenance tags (model, status, tp); the contract's tags agree.
        assert set(d.tags) <= set(corpus.tags)


@pytest.mark.parametrize("name", CORPUS)
def test_reference_agrees_with_the_corpus_reference(name):
    corpus = _corpus(name)
    ours = _ours(corpus.axes["num_qo_heads"].value, corpus.axes["page_size"].value)[name][0]
    workload = small_workload(ours)
    inputs = synthesize_inputs(ours, workload, seed=1)
    mine, theirs = run_reference(ours, inputs), run_reference(corpus, inputs)
    axes = resolve_axes(ours, workload)
    assert tuple(mine["output"].shape) == (
        axes[ours.outputs["output"].shape[0]],
        axes["num_qo_heads"],
        512,
    )
    # Both round the output to bf16 (one ulp apart at most); the LSE is fp32.
    torch.testing.assert_close(
        mine["output"].float(), theirs["output"].float(), atol=2e-2, rtol=1e-2
    )
    torch.testing.assert_close(mine["lse"], theirs["lse"], atol=1e-4, rtol=1e-5)


def test_wrapper_trims_the_page_table_as_the_definition_sees_it():
    """FlashInfer's plan takes kv_len_arr and may be given more pages than a request uses:
    the Definition's inputs are the pages each kv_len uses and the last page's length."""
    w = BatchMLAPagedAttentionWrapper(torch.empty(1 << 22, dtype=torch.uint8))
    kv_indptr = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    kv_indices = torch.tensor([9, 4, 8, 1, 2, 3, 5], dtype=torch.int32)
    kv_len = torch.tensor([65, 0, 128], dtype=torch.int32)
    w.plan(torch.arange(4, dtype=torch.int32), kv_indptr, kv_indices, kv_len, 16, 512, 64, 64,
           False, 0.1, torch.bfloat16, torch.bfloat16)  # fmt: skip
    view = w.definition_inputs
    assert view.kv_indptr.tolist() == [0, 2, 2, 4]
    assert view.kv_indices.tolist() == [9, 4, 1, 2]
    assert view.kv_last_page_len.tolist() == [1, 0, 64]
    assert view.sm_scale == 0.1
    meta = lambda *s: torch.empty(s, dtype=torch.bfloat16, device="meta")  # noqa: E731
    bound = w.run.bind(meta(3, 16, 512), meta(3, 16, 64), meta(10, 64, 512), meta(10, 64, 64))
    assert bound.name == "mla_paged_decode_h16_ckv512_kpe64_ps64"
    assert bound.var_axes == {
        "batch_size": 3,
        "num_pages": 10,
        "len_indptr": 4,
        "num_kv_indices": 4,
    }


def test_calls_no_definition_describes_are_refused():
    """Scaled fp8 caches and a natural-log LSE have no Definition: the schema's view raises
    ValueError, so capture, apply and the dump leave the call to the op."""
    w = BatchMLAPagedAttentionWrapper(torch.empty(1 << 22, dtype=torch.uint8))
    w.plan(torch.arange(2, dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32),
           torch.arange(2, dtype=torch.int32), torch.tensor([2], dtype=torch.int32), 16, 512, 64,
           1, True, 0.1, torch.bfloat16, torch.float8_e4m3fn)  # fmt: skip
    meta = lambda *s, dt=torch.bfloat16: torch.empty(s, dtype=dt, device="meta")  # noqa: E731
    f8 = torch.float8_e4m3fn
    args = (meta(1, 16, 512), meta(1, 16, 64), meta(2, 1, 512, dt=f8), meta(2, 1, 64, dt=f8))
    assert w.run.definition(*args).inputs["ckv_cache"].dtype == "float8_e4m3fn"  # unscaled: fine
    with pytest.raises(ValueError, match="ckv_scale"):
        w.run.definition(*args, ckv_scale=0.5, kpe_scale=1.0)
    with pytest.raises(ValueError, match="natural-log"):
        w.run.definition(*args, return_lse_base_on_e=True)
    fresh = BatchMLAPagedAttentionWrapper(torch.empty(1 << 22, dtype=torch.uint8))
    with pytest.raises(ValueError, match="before plan"):
        fresh.run.definition(*args)


def test_noncausal_prefill_has_its_own_definition():
    ((op, args, _),) = [e for e in mla_examples(16) if e[0] is not mla_paged_decode][-1:]
    causal = op.definition(*args)
    non = op.definition(*args, causal=False)
    assert causal.name == "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1"
    assert non.name == "mla_paged_prefill_noncausal_h16_ckv512_kpe64_ps1"
    assert "causal=False" in non.reference and "causal=True" in causal.reference


def test_schemas_are_consistent():
    """What tests/schema/test_registry.py checks of registered ops, for these (not yet in
    the registry): params exist in the ops' signatures, const axes resolve, the reference
    takes every input and bound parameter."""
    params = {op.qualname: set(op.signature.parameters) for op in MLA_OPS}
    for op in MLA_OPS:
        for schema in op.schemas:
            for name in schema.inputs:
                assert schema.param_of(name).split(".")[0] in params[op.qualname]
            dims = {d for s in schema.inputs.values() if isinstance(s, Tensor) for d in s.dims}
            assert all(a in dims for a, s in schema.axes.items() if isinstance(s, Const))
            ref = inspect.signature(schema.reference).parameters
            assert all(n in ref for n in [*schema.inputs, *schema.bound])
    assert len(MLA_SCHEMAS) == len(WRAPPER_SCHEMAS) == 18


def test_emitted_reference_is_self_contained():
    d = _ours(16, 64)["mla_paged_decode_h16_ckv512_kpe64_ps64"][0]
    namespace: dict = {}
    exec(d.reference, namespace)  # only math and torch
    assert set(json.loads(d.model_dump_json())["inputs"]) == set(
        inspect.signature(namespace["run"]).parameters
    )

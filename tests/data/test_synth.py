"""Input synthesis: reproducible, never zeros, valid index tensors, blobs, clear failures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from flashtune.data import (
    ConstraintError,
    Dataset,
    Definition,
    Workload,
    small_workload,
    synthesize_inputs,
)
from flashtune.data.constraints import evaluate_constraint, holds

PAGED = Definition.model_validate(
    {
        "name": "paged_demo",
        "op_type": "gqa_paged",
        "axes": {
            "batch_size": {"type": "var"},
            "len_indptr": {"type": "var"},
            "num_pages": {"type": "var"},
            "num_kv_indices": {"type": "var"},
            "total_q": {"type": "var"},
            "page_size": {"type": "const", "value": 16},
            "h": {"type": "const", "value": 2},
            "d": {"type": "const", "value": 8},
        },
        "constraints": [
            "len_indptr == batch_size + 1",
            "num_kv_indices == kv_indptr[-1].item()",
            "total_q == qo_indptr[-1].item()",
        ],
        "inputs": {
            "q": {"shape": ["total_q", "h", "d"], "dtype": "float16"},
            "k_cache": {"shape": ["num_pages", "page_size", "h", "d"], "dtype": "float16"},
            "qo_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
            "kv_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
            "kv_indices": {"shape": ["num_kv_indices"], "dtype": "int32"},
            "kv_last_page_len": {"shape": ["batch_size"], "dtype": "int32"},
            "sm_scale": {"shape": None, "dtype": "float32"},
        },
        "outputs": {"o": {"shape": ["total_q", "h", "d"], "dtype": "float16"}},
        "reference": "def run(**kw):\n    return kw['q']\n",
    }
)


def _workload(**axes: int) -> Workload:
    base = {"batch_size": 5, "len_indptr": 6, "num_pages": 64, "num_kv_indices": 20, "total_q": 40}
    return Workload(uuid="w", axes=base | axes, inputs={})


def test_reproducible_and_seed_dependent() -> None:
    a = synthesize_inputs(PAGED, _workload(), seed=3)
    b = synthesize_inputs(PAGED, _workload(), seed=3)
    c = synthesize_inputs(PAGED, _workload(), seed=4)
    assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))
    assert not torch.equal(a["q"], c["q"])


def test_index_tensors_are_valid() -> None:
    for seed in range(20):
        x = synthesize_inputs(PAGED, _workload(), seed=seed)
        kv, qo = x["kv_indptr"].tolist(), x["qo_indptr"].tolist()
        assert kv[0] == 0 and kv[-1] == 20 and all(a <= b for a, b in zip(kv, kv[1:], strict=False))
        assert qo[0] == 0 and qo[-1] == 40
        assert 0 <= int(x["kv_indices"].min()) and int(x["kv_indices"].max()) < 64
        assert len(set(x["kv_indices"].tolist())) == 20  # distinct pages, as an allocator gives
        last = x["kv_last_page_len"]
        assert bool(((last >= 1) & (last <= 16)).all())
        # causal prefill: every request's KV covers its queries
        for b in range(5):
            pages = kv[b + 1] - kv[b]
            kv_len = (pages - 1) * 16 + int(last[b]) if pages else 0
            assert qo[b + 1] - qo[b] <= kv_len
        assert x["sm_scale"] == pytest.approx(1.0)  # no head_dim axis: neutral default
        assert x["q"].abs().sum() > 0


def test_scalar_inputs_taken_from_workload() -> None:
    inputs = {"sm_scale": {"type": "scalar", "value": 0.25}}
    w = Workload.model_validate({"uuid": "w", "axes": _workload().axes, "inputs": inputs})
    assert synthesize_inputs(PAGED, w)["sm_scale"] == 0.25


def test_blob_loaded_when_present_and_synthesized_when_missing(tmp_path: Path) -> None:
    ptr = torch.tensor([0, 4, 4, 8, 12, 20], dtype=torch.int32)
    (tmp_path / "blob").mkdir()
    save_file({"kv_indptr": ptr}, str(tmp_path / "blob" / "x.safetensors"))
    inputs = {
        "kv_indptr": {
            "type": "safetensors",
            "path": "./blob/x.safetensors",
            "tensor_key": "kv_indptr",
        }
    }
    w = Workload.model_validate({"uuid": "w", "axes": _workload().axes, "inputs": inputs})
    got = synthesize_inputs(PAGED, w, blob_root=Dataset(tmp_path))
    assert torch.equal(got["kv_indptr"], ptr)
    missing = {
        "kv_indptr": {
            "type": "safetensors",
            "path": "./blob/gone.safetensors",
            "tensor_key": "kv_indptr",
        }
    }
    w2 = Workload.model_validate({"uuid": "w", "axes": _workload().axes, "inputs": missing})
    assert int(synthesize_inputs(PAGED, w2, blob_root=tmp_path)["kv_indptr"][-1]) == 20


def test_blob_escaping_root_is_refused(tmp_path: Path) -> None:
    inputs = {
        "kv_indptr": {"type": "safetensors", "path": "../x.safetensors", "tensor_key": "kv_indptr"}
    }
    w = Workload.model_validate({"uuid": "w", "axes": _workload().axes, "inputs": inputs})
    with pytest.raises(ValueError, match="escapes the dataset root"):
        synthesize_inputs(PAGED, w, blob_root=tmp_path)


def test_unsatisfiable_constraint_is_named() -> None:
    with pytest.raises(ConstraintError, match=r"len_indptr == batch_size \+ 1"):
        synthesize_inputs(PAGED, _workload(len_indptr=3))


def test_small_workload_satisfies_axis_constraints() -> None:
    w = small_workload(PAGED)
    assert w.axes["len_indptr"] == w.axes["batch_size"] + 1
    synthesize_inputs(PAGED, w)


@pytest.mark.parametrize("size", [1, 2, 7])
def test_small_workload_gives_offsets_one_entry_per_segment_and_one_more(size: int) -> None:
    # FlashInfer-Trace's ragged / paged prefill definitions have len_indptr with no
    # batch_size axis beside it: at size 1 it must still hold one segment (2 entries).
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _ecafa9c import ecafa9c_files

    text = ecafa9c_files()["mla_ragged/mla_ragged_prefill_causal_h8_qk192_vo128.json"]
    definition = Definition.model_validate_json(text)
    workload = small_workload(definition, size)
    assert workload.axes["len_indptr"] == size + 1
    inputs = synthesize_inputs(definition, workload)
    assert int(inputs["qo_indptr"][-1]) == workload.axes["total_q"]


def test_probabilities_are_distributions() -> None:
    d = Definition.model_validate(
        {
            "name": "p",
            "op_type": "sampling",
            "axes": {"b": {"type": "var"}, "v": {"type": "const", "value": 50}},
            "inputs": {
                "probs": {"shape": ["b", "v"], "dtype": "float32"},
                "top_k": {"shape": ["b"], "dtype": "int32"},
            },
            "outputs": {"s": {"shape": ["b"], "dtype": "int64"}},
            "reference": "def run(probs, top_k):\n    return probs.argmax(-1)\n",
        }
    )
    x = synthesize_inputs(d, Workload(uuid="w", axes={"b": 7}, inputs={}))
    assert torch.allclose(x["probs"].sum(-1), torch.ones(7), atol=1e-5)
    assert bool((x["probs"] >= 0).all())
    assert bool(((x["top_k"] >= 1) & (x["top_k"] <= 50)).all())


def test_every_name_validation_allows_can_be_evaluated() -> None:
    """A constraint that passes Definition validation also evaluates (same name list)."""
    calls_every_allowed_name = [
        "all([len(kv_indices) >= 0, any([True]), sum([1, 2]) == 3, abs(-1) == int(1.0)])",
        "min(batch_size, 1) <= max(batch_size, 1)",
    ]
    raw = PAGED.model_dump(mode="json", exclude_unset=True)
    raw["constraints"] = [*raw["constraints"], *calls_every_allowed_name]
    definition = Definition.model_validate(raw)
    workload = _workload()
    inputs = synthesize_inputs(definition, workload)  # raises if a constraint cannot evaluate
    names = {**definition.const_axes, **workload.axes, **inputs}
    for expr in calls_every_allowed_name:
        assert holds(evaluate_constraint(expr, names)), expr


def _varlen(name: str, dtype: str) -> Definition:
    return Definition.model_validate(
        {
            "name": "varlen_demo",
            "op_type": "norm",
            "axes": {
                "batch": {"type": "var"},
                "len_cu": {"type": "var"},
                "total_tokens": {"type": "var"},
                "d": {"type": "const", "value": 8},
            },
            "constraints": ["len_cu == batch + 1", f"total_tokens == {name}[-1].item()"],
            "inputs": {
                "x": {"shape": ["total_tokens", "d"], "dtype": "float32"},
                name: {"shape": ["len_cu"], "dtype": dtype},
            },
            "outputs": {"y": {"shape": ["total_tokens", "d"], "dtype": "float32"}},
            "reference": f"def run(x, {name}):\n    return x\n",
        }
    )


@pytest.mark.parametrize(
    ("name", "dtype"), [("cu_seqlens", "int64"), ("seq_offsets", "int32"), ("starts", "int16")]
)
def test_cumulative_lengths_named_in_a_constraint_satisfy_it(name: str, dtype: str) -> None:
    """Whatever its name or integer dtype, an input whose last element a constraint equates
    with an axis is built as cumulative lengths: from 0, non-decreasing, ending at the total."""
    definition = _varlen(name, dtype)
    for axes in (small_workload(definition).axes, {"batch": 3, "len_cu": 4, "total_tokens": 50}):
        inputs = synthesize_inputs(definition, Workload(uuid="w", axes=axes, inputs={}), seed=3)
        offsets = inputs[name]
        assert offsets.dtype == getattr(torch, dtype)
        assert offsets[0] == 0 and offsets[-1] == axes["total_tokens"]
        assert bool((offsets[1:] >= offsets[:-1]).all())


def _inequalities(constraints: list[str], axes: dict[str, dict]) -> Definition:
    return Definition.model_validate(
        {
            "name": "inequality_demo",
            "op_type": "sampling",
            "axes": axes,
            "constraints": constraints,
            "inputs": {"x": {"shape": ["batch", "max_num_pages"], "dtype": "float32"}},
            "outputs": {"y": {"shape": ["batch"], "dtype": "float32"}},
            "reference": "def run(x):\n    return x.sum(-1)\n",
        }
    )


@pytest.mark.parametrize(
    ("constraints", "const"),
    [
        (["topk <= max_num_pages * page_size"], {"topk": 256, "page_size": 1}),
        (["max_num_pages * page_size >= topk"], {"topk": 100, "page_size": 3}),
        (["batch < 2", "topk <= max_num_pages"], {"topk": 64, "page_size": 1}),
        (["max_num_pages > batch * 20", "batch >= 3"], {"topk": 1, "page_size": 1}),
    ],
)
def test_small_workload_satisfies_inequalities(constraints: list[str], const: dict) -> None:
    axes = {"batch": {"type": "var"}, "max_num_pages": {"type": "var"}}
    axes |= {name: {"type": "const", "value": value} for name, value in const.items()}
    definition = _inequalities(constraints, axes)
    workload = small_workload(definition)
    values = {**definition.const_axes, **workload.axes}
    assert all(holds(evaluate_constraint(c, values)) for c in constraints), values
    assert max(workload.axes.values()) <= 4096  # still small
    synthesize_inputs(definition, workload)  # checks every constraint again

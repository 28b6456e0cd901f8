"""The sampling family under apply: FlashInfer's sampling functions mirrored (a stand-in
`flashinfer` module with 0.2.14's signatures), winners' int64 samples returned as the ops'
int32, and the calls no Definition describes (indices, generator, check_nan) left to the
original."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch
from _apply_helpers import add_traces, calls_of, plant, trace

from flashtune.apply import enable_adapters, enable_apply
from flashtune.apply.adapters import builtin_adapters
from flashtune.data import Dataset
from flashtune.ops.sampling import top_k_top_p_sampling_from_probs, top_p_sampling_from_probs

# A "winner" that always draws the most likely token, so a routed call is recognizable.
GREEDY_SRC = """import torch
CALLS = []

def run(probs, top_p):
    CALLS.append(tuple(top_p.tolist()))
    return probs.argmax(dim=-1)
"""


def _fake_flashinfer() -> dict[str, types.ModuleType]:
    calls: list[str] = []
    fi = types.ModuleType("flashinfer")
    sampling = types.ModuleType("flashinfer.sampling")

    def top_p_sampling_from_probs(
        probs, top_p, indices=None, deterministic=True, generator=None, check_nan=False
    ):
        calls.append("top_p")
        return torch.zeros(probs.shape[0], dtype=torch.int32)

    sampling.top_p_sampling_from_probs = top_p_sampling_from_probs
    fi.top_p_sampling_from_probs = top_p_sampling_from_probs
    fi.sampling = sampling
    fi.calls = calls
    fi.__spec__ = types.SimpleNamespace(name="flashinfer")
    return {"flashinfer": fi, "flashinfer.sampling": sampling}


def _dataset(root: Path, probs: torch.Tensor) -> tuple[Dataset, object]:
    ds = Dataset(root)
    definition = top_p_sampling_from_probs.definition(probs, 0.9)
    assert definition.name == "top_p_sampling_from_probs_v16"
    assert definition.outputs["samples"].dtype == "int64"
    ds.add_definition(definition)
    sol = plant(ds, definition.name, "greedy", GREEDY_SRC)
    add_traces(ds, [trace(definition.name, "greedy", {"batch_size": 3}, 0.1)])
    return ds, sol


def test_flashinfer_sampling_is_mirrored_and_samples_come_back_int32(tmp_path, monkeypatch):
    mods = _fake_flashinfer()
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    fi = mods["flashinfer"]
    probs = torch.softmax(torch.randn(3, 16), dim=-1)
    ds, sol = _dataset(tmp_path, probs)
    specs = builtin_adapters()
    assert {
        "flashinfer.sampling.top_p_sampling_from_probs",
        "flashinfer.top_p_sampling_from_probs",
    } <= {s.target for s in specs}
    greedy = probs.argmax(dim=-1).to(torch.int32)
    with enable_apply(dataset=ds), enable_adapters(specs):
        got = fi.sampling.top_p_sampling_from_probs(probs, 0.9)
        assert got.dtype == torch.int32 and torch.equal(got, greedy) and fi.calls == []
        assert calls_of(sol)[-1] == (0.8999999761581421,) * 3  # the scalar as a per-row tensor
        # No Definition describes these calls: FlashInfer's own function runs.
        fi.sampling.top_p_sampling_from_probs(probs, 0.9, generator=torch.Generator())
        fi.sampling.top_p_sampling_from_probs(probs, 0.9, indices=torch.zeros(5, dtype=torch.int32))
        fi.sampling.top_p_sampling_from_probs(probs, 0.9, check_nan=True)
        assert fi.calls == ["top_p"] * 3


def test_flashtune_op_routes_to_the_winner(tmp_path):
    probs = torch.softmax(torch.randn(3, 16), dim=-1)
    ds, sol = _dataset(tmp_path, probs)
    with enable_apply(dataset=ds) as handle:
        got = top_p_sampling_from_probs(probs, torch.full((3,), 0.5))
        assert got.dtype == torch.int32 and torch.equal(got, probs.argmax(dim=-1).to(torch.int32))
        assert calls_of(sol)[-1] == (0.5,) * 3 and handle.hook.hits == 1
        # Another definition (the joint order has its own name): the op's own kernel.
        joint = top_k_top_p_sampling_from_probs(probs, 5, 0.9, filter_apply_order="joint")
        assert joint.shape == (3,) and handle.hook.misses >= 1

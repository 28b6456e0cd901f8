"""What a schema'd op returns when apply answers it: the op's own conventions (out=, in
place), and a call whose optional input the traced Definition lacks falls back without
disabling the winner."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _apply_helpers import GEMM_SRC, NORM_SRC, add_traces, calls_of, plant, trace

from flashtune.apply import enable_apply
from flashtune.apply.adapters.mirror import peer_targets
from flashtune.data import Dataset
from flashtune.ops.attention import BatchDecodeWithPagedKVCacheWrapper
from flashtune.ops.gemm import mm
from flashtune.ops.norm import fused_add_rmsnorm, rmsnorm

FUSED_SRC = NORM_SRC.replace(
    "def run(hidden_states, weight)", "def run(hidden_states, residual, weight)"
).replace("x = hidden_states.float()", "x = (hidden_states + residual).float()")


def _winner(ds: Dataset, definition, source: str, axes: dict[str, int]):
    ds.add_definition(definition)
    solution = plant(ds, definition.name, "fast", source)
    add_traces(ds, [trace(definition.name, "fast", axes, 0.1)])
    return solution


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def test_out_argument_receives_the_single_output(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    x, w = torch.randn(2, 16), torch.rand(16) + 0.5
    solution = _winner(ds, rmsnorm.definition(x, w), NORM_SRC, {"batch_size": 2})
    out = torch.empty_like(x)
    seen = len(calls_of(solution))  # a module per source: other tests' calls are there too
    with enable_apply(dataset=ds):
        assert rmsnorm(x, w, out=out) is out
    assert calls_of(solution)[seen:] == [(2, 16)]
    torch.testing.assert_close(out, _rms(x, w))


def test_fused_add_rmsnorm_is_answered_in_place(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    x, r, w = torch.randn(2, 16), torch.randn(2, 16), torch.rand(16) + 0.5
    solution = _winner(ds, fused_add_rmsnorm.definition(x, r, w), FUSED_SRC, {"batch_size": 2})
    total = x + r
    seen = len(calls_of(solution))
    with enable_apply(dataset=ds):
        assert fused_add_rmsnorm(x, r, w, eps=1e-6) is None
    assert len(calls_of(solution)) == seen + 1
    torch.testing.assert_close(r, total)
    torch.testing.assert_close(x, _rms(total, w))


def test_an_optional_input_the_definition_lacks_falls_back_and_keeps_the_winner(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ds = Dataset(tmp_path)
    A, B, bias = torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)
    solution = _winner(ds, mm.definition(A, B), GEMM_SRC, {"M": 4})
    seen = len(calls_of(solution))
    with enable_apply(dataset=ds), caplog.at_level("WARNING", "flashtune.apply"):
        torch.testing.assert_close(mm(A, B, bias), A @ B.T + bias, rtol=1e-4, atol=1e-4)
        assert len(calls_of(solution)) == seen  # the winner takes (A, B): it was not called
        torch.testing.assert_close(mm(A, B), A @ B.T)
    assert calls_of(solution)[seen:] == [(4, 8)]  # and the bias call did not disable it
    assert any("optional input differs" in r.getMessage() for r in caplog.records)


def test_flashinfer_peers_come_from_the_schemas_fi_api_tags() -> None:
    assert peer_targets(rmsnorm) == ["flashinfer.norm.rmsnorm", "flashinfer.rmsnorm"]
    assert peer_targets(fused_add_rmsnorm) == [
        "flashinfer.norm.fused_add_rmsnorm",
        "flashinfer.fused_add_rmsnorm",
    ]
    assert peer_targets(mm) == []  # its schema names no FlashInfer function
    # A wrapper's run is a method: its peer is a class (adapters/attention.py).
    assert peer_targets(BatchDecodeWithPagedKVCacheWrapper.run) == []

"""A definition's baked-in constants (the norm's eps) are part of matching a call to it: a
solution proven on an eps=1e-5 definition is not applied to an eps=1e-6 call (the op's own
path runs), and capture does not record such a call under that definition."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch
from _apply_helpers import NORM_SRC, add_definition, add_traces, calls_of, plant, trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from _capture_toys import toy_norm, toy_norm_ref  # noqa: E402

import flashtune  # noqa: E402
from flashtune.apply import enable_apply  # noqa: E402
from flashtune.capture import capture  # noqa: E402
from flashtune.data import Dataset  # noqa: E402
from flashtune.ops.norm.reference import rmsnorm_ref  # noqa: E402
from flashtune.schema import constant_mismatches, reference_constants  # noqa: E402

BUNDLED_RMSNORM = (
    Path(flashtune.__file__).parent / "dataset" / "definitions" / "rmsnorm" / "rmsnorm_h4096.json"
)
FLASHINFER_STYLE = """import torch

@torch.no_grad()
def run(hidden_states, weight):
    EPS = 1e-5
    x = hidden_states.to(torch.float32)
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)).to(hidden_states.dtype)
"""


def test_reference_constants_reads_both_spellings() -> None:
    flashtune_style = json.loads(BUNDLED_RMSNORM.read_text())["reference"]
    assert reference_constants(flashtune_style, ["eps"]) == {"eps": 1e-5}
    assert reference_constants(FLASHINFER_STYLE, ["eps"]) == {"eps": 1e-5}
    assert reference_constants("def run(x):\n    return x\n", ["eps"]) == {}
    assert reference_constants("not python (", ["eps"]) == {}


def test_constant_mismatches_compare_only_values_both_fix() -> None:
    assert constant_mismatches({"eps": 1e-6}, {"eps": 1e-5}) == {"eps": (1e-6, 1e-5)}
    assert constant_mismatches({"eps": 1e-5}, {"eps": 1e-05}) == {}
    assert constant_mismatches({"eps": 1e-6}, {}) == {}  # the definition does not say
    assert constant_mismatches({"window_left": -1}, {"window_left": None}) == {}


@pytest.fixture
def norm_ds(tmp_path: Path) -> Dataset:
    """toy_norm_h16 defined at eps=1e-5, with a planted winner."""
    ds = Dataset(tmp_path / "ds")
    add_definition(ds, toy_norm.definition(torch.randn(2, 16), torch.randn(16), eps=1e-5))
    plant(ds, "toy_norm_h16", "planted", NORM_SRC)
    add_traces(ds, [trace("toy_norm_h16", "planted", {"batch_size": 4}, 0.1)])
    return ds


def test_a_call_with_another_eps_falls_back(norm_ds: Dataset) -> None:
    x, w = torch.randn(4, 16), torch.rand(16) + 0.5
    solution = norm_ds.solutions["toy_norm_h16"][0]
    with enable_apply(norm_ds) as handle:
        toy_norm(x, w, eps=1e-5)  # the definition's eps: the winner runs
        ran = len(calls_of(solution))
        hits = handle.hook.hits
        out = toy_norm(x, w, eps=1e-6)  # another eps: the op's own code
        default = toy_norm(x, w)  # the op's default eps is 1e-6 too
    assert ran >= 1 and hits >= 1
    assert len(calls_of(solution)) == ran and handle.hook.hits == hits
    assert handle.hook.misses >= 2
    torch.testing.assert_close(out, toy_norm_ref(x, w, 1e-6))
    torch.testing.assert_close(default, toy_norm_ref(x, w, 1e-6))


def test_flashtune_rmsnorm_at_another_eps_skips_the_bundled_definition(tmp_path: Path) -> None:
    # The bundled rmsnorm_h4096 fixes eps=1e-5; a model with eps=1e-6 (Qwen3) names it too.
    ds = Dataset(tmp_path / "ds")
    ds.add_definition(flashtune.rmsnorm.definition(torch.randn(2, 4096), torch.randn(4096), 1e-5))
    plant(ds, "rmsnorm_h4096", "planted", NORM_SRC)
    add_traces(ds, [trace("rmsnorm_h4096", "planted", {"batch_size": 2}, 0.1)])
    x, w = torch.randn(2, 4096), torch.rand(4096) + 0.5
    with enable_apply(ds) as handle:
        out = flashtune.rmsnorm(x, w, eps=1e-6)
        assert handle.hook.hits == 0 and handle.hook.misses == 1
        flashtune.rmsnorm(x, w, eps=1e-5)
        assert handle.hook.hits == 1
    torch.testing.assert_close(out, rmsnorm_ref(x, w, 1e-6))


def test_capture_skips_calls_whose_eps_is_not_the_definitions(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    ds.add_definition(toy_norm.definition(torch.randn(2, 16), torch.randn(16), eps=1e-5))
    w = torch.rand(16) + 0.5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(dataset=ds) as cap:
            for batch in (3, 3, 5):
                toy_norm(torch.randn(batch, 16), w)  # eps=1e-6 (the default): skipped
            toy_norm(torch.randn(7, 16), w, eps=1e-5)  # the definition's: recorded
    eps_warnings = [c for c in caught if "eps=1e-06" in str(c.message)]
    assert len(eps_warnings) == 1 and "eps=1e-05" in str(eps_warnings[0].message)
    assert cap.stats["written"] == 1
    lines = (tmp_path / "workloads" / "toy_norm" / "toy_norm_h16.jsonl").read_text().splitlines()
    assert [json.loads(line)["workload"]["axes"]["batch_size"] for line in lines] == [7]

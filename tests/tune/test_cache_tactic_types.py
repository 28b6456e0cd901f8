"""Tactics that are dataclasses (norm, activation, rope, sampling, GEMM) survive the config
file: written as tagged objects, read back without importing anything, and swapped by the
tuner for the runner's own tactic of the same class and fields; names that match nothing a
runner offers are ignored as stale."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from flashtune.ops.activation.config import ActivationTactic
from flashtune.ops.gemm.config import TiledTactic
from flashtune.ops.norm.config import RMSNormTactic
from flashtune.ops.rope.config import RopeTactic
from flashtune.ops.sampling.config import SamplingTactic
from flashtune.tune import (
    AutotuneWarning,
    DynamicDim,
    TunableRunner,
    TuningConfig,
    autotune,
    choose_one,
)
from flashtune.tune.cache_file import (
    StoredTactic,
    current_metadata,
    read_cache_file,
    stored_form,
    write_cache_file,
)

NORM = RMSNormTactic(block_n=1024, rows=2, num_warps=4)
TACTICS = [
    NORM,
    ActivationTactic(block_d=2048, rows=1, num_warps=8),
    RopeTactic(block_h=4, num_warps=4),
    SamplingTactic(block=1024, rows=1, num_warps=8, split=16, rounds=3),
    TiledTactic(block_m=64, split_k=2),
]


@pytest.mark.parametrize("tactic", TACTICS, ids=lambda t: type(t).__name__)
def test_dataclass_tactic_round_trips(tmp_path, tactic):
    path = tmp_path / "cfg.json"
    key = ("op", "SomeRunner", ((16, 4096),))
    write_cache_file(path, {key: ("SomeRunner", tactic)}, current_metadata())
    read = read_cache_file(path)
    assert read.status == "ok", read.reason
    stored = read.entries[key][1]
    assert isinstance(stored, StoredTactic)
    assert stored == stored_form(tactic)
    hash(stored)
    # A file read and written back (merge, incremental saves) keeps the entry as it was.
    again = tmp_path / "again.json"
    write_cache_file(again, read.entries, current_metadata())
    assert json.loads(again.read_text())[str(key)] == json.loads(path.read_text())[str(key)]


@dataclass(frozen=True)
class Tile:
    block: int
    warps: int


class TileRunner(TunableRunner):
    """y = 2x with a dataclass tactic; remembers the tactic it last ran."""

    last: Any = None

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Any]:
        return [Tile(64, 4), Tile(128, 8)]

    def forward(self, inputs: Sequence[Any], tactic: Any = -1) -> torch.Tensor:
        TileRunner.last = tactic
        return inputs[0] * 2


CFG = TuningConfig(dynamic_dims=(DynamicDim(0, 0),), cold_l2=False)


def _file_with(path, tactic_doc):
    key = ("tile", "TileRunner", ((4, 4),))
    write_cache_file(path, {key: ("TileRunner", Tile(128, 8))}, current_metadata())
    doc = json.loads(path.read_text())
    doc[str(key)][1] = tactic_doc
    path.write_text(json.dumps(doc))


def test_tuner_uses_the_runners_own_tactic_from_a_file(tmp_path):
    path = tmp_path / "cfg.json"
    key = ("tile", "TileRunner", ((4, 4),))
    write_cache_file(path, {key: ("TileRunner", Tile(128, 8))}, current_metadata())
    with autotune(False, cache=path):
        runner, tactic = choose_one("tile", [TileRunner()], CFG, [torch.randn(4, 4)])
    assert tactic == Tile(128, 8) and type(tactic) is Tile


@pytest.mark.parametrize(
    "doc",
    [
        {"__tactic__": "os:system", "block": 128, "warps": 8},  # another class
        {"__tactic__": f"{__name__}:Tile", "block": 128, "warps": 8, "extra": 1},  # new field
        {"__tactic__": f"{__name__}:Tile", "block": 96, "warps": 8},  # not offered
    ],
    ids=["foreign-class", "other-fields", "not-offered"],
)
def test_unmatched_stored_tactics_are_stale(tmp_path, doc):
    path = tmp_path / "cfg.json"
    _file_with(path, doc)
    with pytest.warns(AutotuneWarning, match="no longer offers"), autotune(False, cache=path):
        runner, tactic = choose_one("tile", [TileRunner()], CFG, [torch.randn(4, 4)])
    assert tactic == -1  # the default: the file's entry reached no kernel


@pytest.mark.parametrize("tactic", TACTICS, ids=lambda t: type(t).__name__)
def test_a_file_written_before_the_family_packages_keeps_its_tactics(tmp_path, tactic):
    """Issue 32 moved each family's tactics from ops/<family>_config.py to
    ops/<family>/config.py: a cache file naming the old module still matches."""
    path = tmp_path / "cfg.json"
    key = ("op", "SomeRunner", ((16, 4096),))
    write_cache_file(path, {key: ("SomeRunner", tactic)}, current_metadata())
    module = type(tactic).__module__
    old_module = module.replace(".config", "_config")  # flashtune.ops.norm_config, ...
    text = path.read_text().replace(f'"{module}:', f'"{old_module}:')
    assert old_module in text
    path.write_text(text)
    read = read_cache_file(path)
    assert read.status == "ok", read.reason
    assert read.entries[key][1] == stored_form(tactic)


@dataclass(frozen=True)
class GrownTile:
    """Tile after its class gained a field: a file written before names it without `split`."""

    block: int
    warps: int
    split: int = 1


class GrownRunner(TileRunner):
    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Any]:
        return [GrownTile(64, 4), GrownTile(128, 8), GrownTile(128, 8, split=2)]


@pytest.mark.parametrize(
    "doc,expected",
    [
        ({"block": 128, "warps": 8}, GrownTile(128, 8)),  # the new field at its default
        ({"block": 128, "warps": 8, "split": 2}, GrownTile(128, 8, split=2)),
    ],
    ids=["written-before", "written-after"],
)
def test_a_file_written_before_a_tactic_gained_a_field_keeps_its_entry(tmp_path, doc, expected):
    path = tmp_path / "cfg.json"
    key = ("tile", "GrownRunner", ((4, 4),))
    write_cache_file(path, {key: ("GrownRunner", GrownTile(64, 4))}, current_metadata())
    file = json.loads(path.read_text())
    file[str(key)][1] = {"__tactic__": f"{__name__}:GrownTile", **doc}
    path.write_text(json.dumps(file))
    with autotune(False, cache=path):
        runner, tactic = choose_one("tile", [GrownRunner()], CFG, [torch.randn(4, 4)])
    assert tactic == expected and type(tactic) is GrownTile

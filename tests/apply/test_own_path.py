"""A winner that is flashtune's own op (the bundled builder's `flashtune@` solutions): a call
of that op runs itself instead of going through the solution, so a wrapper keeps its plan and
no adaptation is paid; a peer's call routed to the same winner still runs the solution."""

from __future__ import annotations

import pytest
import torch
from _apply_helpers import add_definition, add_traces, plant, trace

from flashtune.apply import enable_apply
from flashtune.apply.solutions import runs_the_op_itself
from flashtune.bench import entry_points
from flashtune.data import Dataset, Solution
from flashtune.ops.activation import silu_and_mul
from flashtune.ops.activation.reference import silu_and_mul_ref
from flashtune.ops.bundle import entry_functions

OWN = "from flashtune.bench.entry_points import flashtune_silu_and_mul as run\n"


def _solution(source: str, **spec: object) -> Solution:
    return Solution.model_validate(
        {
            "name": "s",
            "definition": "d",
            "author": "a",
            "spec": {
                "language": "python",
                "entry_point": "main.py::run",
                "destination_passing_style": False,
                **spec,
            },
            "sources": [{"path": "main.py", "content": source}],
        }
    )


def _plant_silu(
    ds: Dataset, x: torch.Tensor, solutions: dict[str, tuple[str, float]]
) -> tuple[str, dict[str, Solution]]:
    """silu_and_mul's definition at x's shape in `ds`, and a solution per name (source,
    traced latency) with a PASSED trace at x's var axes: (definition name, solutions)."""
    add_definition(ds, silu_and_mul.definition(x))
    call = silu_and_mul.bind(x)
    planted = {n: plant(ds, call.name, n, src) for n, (src, _) in solutions.items()}
    axes = dict(call.var_axes)
    add_traces(ds, [trace(call.name, n, axes, latency) for n, (_, latency) in solutions.items()])
    return call.name, planted


def test_every_flashtune_entry_of_the_bundled_builder_is_marked() -> None:
    flashtune_entries = {n for n in entry_functions() if n.startswith("flashtune_")}
    assert flashtune_entries and flashtune_entries == entry_points.OWN_PATH_ENTRIES


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (OWN, True),
        ('"""doc"""\n# comment\n' + OWN + '\n__all__ = ["run"]\n', True),
        # a peer's entry, an unmarked name, another symbol, extra code: not the op itself
        ("from flashtune.bench.entry_points import flashinfer_silu_and_mul as run\n", False),
        ("from flashtune.bench.entry_points import torch_gemm as run\n", False),
        ("from flashtune.bench.entry_points import flashtune_silu_and_mul as other\n", False),
        (OWN + "print('side effect')\n", False),
        (OWN + "def run(x):\n    return x\n", False),
        (OWN + "from flashtune.bench.entry_points import flashtune_gemm as run\n", False),
        ("from .entry_points import flashtune_silu_and_mul as run\n", False),
        ("from flashtune.bench.entry_points import (\n", False),  # a syntax error
    ],
)
def test_runs_the_op_itself_reads_the_source(source: str, expected: bool) -> None:
    assert runs_the_op_itself(_solution(source)) is expected


def test_destination_passing_or_several_files_is_not_the_op_itself() -> None:
    assert not runs_the_op_itself(_solution(OWN, destination_passing_style=True))
    two = _solution(OWN).model_copy(
        update={"sources": [*_solution(OWN).sources, *_solution("x = 1\n").sources]}
    )
    assert not runs_the_op_itself(two)


def test_an_own_path_winner_lets_the_op_run_itself(tmp_path) -> None:
    x = torch.randn(4, 32)
    ds = Dataset(tmp_path)
    _plant_silu(ds, x, {"flashtune@own": (OWN, 0.1)})
    expected = silu_and_mul_ref(x)
    with enable_apply(dataset=ds) as handle:
        for _ in range(3):  # decided once, then cached by call signature
            torch.testing.assert_close(silu_and_mul(x), expected)
        assert (handle.hook.own, handle.hook.hits, handle.hook.misses) == (3, 0, 0)
        # A peer's call described as this op (an adapter's route) runs the solution: the
        # caller's own code is the peer's, not flashtune's.
        torch.testing.assert_close(handle.hook.route(silu_and_mul, (), {"input": x}), expected)
        assert handle.hook.hits == 1


@pytest.mark.parametrize(("own_latency", "winner"), [(0.104, "flashtune@own"), (0.106, "peer")])
def test_the_table_keeps_the_own_op_within_its_margin(tmp_path, own_latency, winner) -> None:
    """A peer 4% faster than the op itself is within the measurement's noise (own_margin
    0.05): the op keeps running itself; 6% faster, the peer wins."""
    from _apply_helpers import NORM_SRC

    from flashtune.apply import ApplyConfig, ApplyTable

    x = torch.randn(4, 32)
    ds = Dataset(tmp_path)
    name, _ = _plant_silu(ds, x, {"flashtune@own": (OWN, own_latency), "peer": (NORM_SRC, 0.1)})
    axes = dict(silu_and_mul.bind(x).var_axes)
    table = ApplyTable.build(ds)
    assert table.lookup(name, axes) == winner
    assert ApplyTable.build(ds, ApplyConfig(own_margin=0.0)).lookup(name, axes) == "peer"


def test_an_op_with_any_routed_definition_still_binds_its_calls(tmp_path) -> None:
    """op_routing decides per op, from the table: one definition of the op won by another
    solution makes every call of it bind and look up (the own-won shape still runs itself)."""
    from _apply_helpers import calls_of

    peer_src = "CALLS = []\n\ndef run(input):\n    CALLS.append(1)\n    d = input.shape[-1] // 2\n"
    peer_src += "    return (input[..., :d].float().sigmoid() * input[..., :d].float()"
    peer_src += " * input[..., d:].float()).to(input.dtype)\n"
    small, wide = torch.randn(4, 32), torch.randn(4, 64)
    ds = Dataset(tmp_path)
    _plant_silu(ds, small, {"flashtune@own": (OWN, 0.1)})
    _, planted = _plant_silu(ds, wide, {"peer": (peer_src, 0.1)})
    sol = planted["peer"]
    with enable_apply(dataset=ds) as handle:
        assert handle.runtime.op_routing(silu_and_mul) == "route"
        torch.testing.assert_close(silu_and_mul(small), silu_and_mul_ref(small))
        torch.testing.assert_close(silu_and_mul(wide), silu_and_mul_ref(wide))
        assert (handle.hook.own, handle.hook.hits) == (1, 1)
    assert calls_of(sol) == [1]


def test_an_op_the_table_does_not_cover_runs_itself_unbound(tmp_path) -> None:
    from flashtune.ops.activation import gelu_and_mul

    x = torch.randn(4, 32)
    ds = Dataset(tmp_path)
    _plant_silu(ds, x, {"flashtune@own": (OWN, 0.1)})
    with enable_apply(dataset=ds) as handle:
        assert handle.runtime.op_routing(gelu_and_mul) == "none"
        assert handle.runtime.op_routing(silu_and_mul) == "own"
        gelu_and_mul(x)
        assert handle.hook.misses == 1

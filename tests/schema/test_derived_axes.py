"""Var axes no input shows, fixed by a constraint `axis == expr` of the known axes."""

from __future__ import annotations

import torch

from flashtune.ops.activation import silu_and_mul


def test_output_only_axis_is_derived_from_its_constraint() -> None:
    call = silu_and_mul.bind(torch.zeros(3, 256))
    assert call.var_axes == {"num_tokens": 3, "hidden_size": 128}
    # So a captured workload sets every var axis of its definition.
    definition = call.definition()
    assert set(call.var_axes) == {a for a, s in definition.axes.items() if s.type == "var"}

"""Mamba-2's selective state update over the odd sizes test_mamba.py leaves open: odd batch
sizes with odd head counts, odd head_dim and odd dstate (every tile partial, in both
dimensions), one group per head and one for all, pad rows; float16 and float32 on the CPU
(Triton's interpreter), on the GPU where there is one. Each against
selective_state_update_ref, through test_mamba.py's inputs and tolerances."""

from __future__ import annotations

import pytest
import torch
from test_mamba import CPU_DTYPES, _check, _inputs

# (batch, slots, nheads, head_dim, dstate, ngroups)
ODD_SHAPES = [(5, 7, 3, 5, 9, 3), (1, 1, 1, 3, 5, 1), (3, 5, 5, 7, 3, 1)]


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
def test_odd_batch_heads_and_dims(dtype, shape, device):
    batch, slots, h, d, s, g = shape
    seed = int(torch.randint(1 << 30, ()))
    t = _inputs(batch, slots, h, d, s, g, dtype, device, pads=batch // 3, seed=seed)
    _check(t, dtype, z=True, D=True, bias=True, softplus=True, slots=True)

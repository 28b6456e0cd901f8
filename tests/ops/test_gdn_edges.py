"""Gated Delta Net on the interpreter, over what test_gdn.py leaves open: prefill batches of
mixed odd lengths straddling the first and the second chunk boundary (127 and 129 = 2 * 64
-+ 1, next to sequences of 1 and 3 tokens), with and without an initial state; decode and
MTP at odd batch sizes and an odd step count, reading a shuffled state pool. Each case
against the op's reference (gdn_prefill_ref, gdn_decode_ref, gdn_mtp_ref), with
test_gdn.py's inputs and bounds."""

from __future__ import annotations

import pytest
import torch
from test_gdn import HALF_STATE_REL, HV, _prefill_case, _rel, _step_inputs

from flashtune.ops.gdn import (
    gdn_decode,
    gdn_decode_ref,
    gdn_mtp,
    gdn_mtp_ref,
    gdn_prefill,
    gdn_prefill_ref,
)
from flashtune.ops.gdn.kernels import CHUNK

D = 32  # test_gdn.py's head size on the interpreter


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "with_state, lengths",
    [
        # with a state: ~5 s on 2 cores, in the slow step (the main suite stays under 10 minutes)
        pytest.param(True, (127, 3, 129, 1), marks=pytest.mark.slow),
        (False, (1, 129, 127)),
    ],
    ids=["state", "no_state"],
)
def test_prefill_mixed_odd_lengths_across_two_chunk_boundaries(with_state, lengths):
    assert CHUNK == 64  # the lengths sit one either side of 2 * CHUNK
    x = _prefill_case(lengths, 1, HV, with_state=with_state, seed=int(torch.randint(1 << 30, ())))
    out, new_state = gdn_prefill(*x, 0.0)
    ref_out, ref_state = gdn_prefill_ref(*x, 0.0)
    assert _rel(out, ref_out) < 5e-3
    cu = x[-1].tolist()
    for i in range(len(lengths)):  # every sequence alone: its outputs and its final state
        rows = slice(cu[i], cu[i + 1])
        assert _rel(out[rows], ref_out[rows]) < 5e-3, i
        assert _rel(new_state[i], ref_state[i]) < HALF_STATE_REL, i


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "batch,steps",
    [
        pytest.param(1, 1, id="1-decode"),
        pytest.param(5, 1, id="5-decode"),
        pytest.param(1, 3, id="1-mtp3"),
        # ~3 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
        pytest.param(5, 3, id="5-mtp3", marks=pytest.mark.slow),
    ],
)
def test_decode_and_mtp_at_odd_batch_sizes(batch, steps):
    q, k, v, a_log, a, dt_bias, b = _step_inputs(batch, steps)
    if steps == 1:
        state = torch.randn(batch, HV, D, D)
        out, new_state = gdn_decode(q, k, v, state, a_log, a, dt_bias, b, 0.0)
        ref_out, ref_state = gdn_decode_ref(q, k, v, state, a_log, a, dt_bias, b, 0.0)
        assert _rel(out, ref_out) < 5e-3 and _rel(new_state, ref_state) < 1e-5
        return
    pool = torch.randn(2 * batch + 1, HV, D, D)
    idx = torch.randperm(2 * batch + 1)[:batch].to(torch.int32)
    buf = torch.zeros(2 * batch + 1, steps, HV, D, D)
    ref_buf = torch.zeros_like(buf)
    out, final = gdn_mtp(q, k, v, pool, idx, a_log, a, dt_bias, b, 0.0, buf)
    ref_out, ref_final = gdn_mtp_ref(q, k, v, pool, idx, a_log, a, dt_bias, b, 0.0, ref_buf)
    assert _rel(out, ref_out) < 5e-3 and torch.equal(final, ref_final)
    assert _rel(buf, ref_buf) < 1e-5  # every step's state, in each request's slot

"""The Mamba-2 selective state update (one decode step of the SSM recurrence) in plain
PyTorch: the contract the Triton kernel, the CPU path, the tests and the benchmarks share.

Per batch row b, head h (group g = h // (nheads / ngroups)), channel d and state index s:

    dt'      = softplus(dt + dt_bias) if dt_softplus else dt + dt_bias
    dA       = exp(dt' * A[h, d, s])                      (a decay in (0, 1) for A < 0)
    state'   = state[slot] * dA + (dt' * x)[d] * B[g, s]
    out[d]   = sum_s state'[d, s] * C[g, s] + D[h, d] * x[d]
    out     *= silu(z)                                    (when z is given)

slot = state_batch_indices[b] (b itself when None); a row whose slot is pad_slot_id leaves
every state untouched and outputs zeros. All arithmetic in fp32; the new state is rounded to
the state's dtype when stored, the output computed from the fp32 (unrounded) state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["mamba_ssu_ref", "selective_state_update_ref"]


@torch.no_grad()
def selective_state_update_ref(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
    dst_state_batch_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [batch, nheads, head_dim] in x's dtype, new_state: a copy of `state` with the
    rows' slots updated). state [slots, nheads, head_dim, dstate]; x, dt, z [batch, nheads,
    head_dim]; A [nheads, head_dim, dstate] (fp32); B, C [batch, ngroups, dstate]; D, dt_bias
    [nheads, head_dim]; state_batch_indices [batch] (None: row b uses slot b);
    dst_state_batch_indices [batch]: the slot each row's new state is written to instead
    (pad_slot_id: not written). Slots must be distinct."""
    batch, nheads, _ = x.shape
    ratio = nheads // B.shape[1]
    dt_f = dt.float()
    if dt_bias is not None:
        dt_f = dt_f + dt_bias.float()
    if dt_softplus:
        dt_f = F.softplus(dt_f)
    dA = torch.exp(A.float().unsqueeze(0) * dt_f.unsqueeze(-1))  # [batch, H, D, S]
    B_h = B.float().repeat_interleave(ratio, dim=1)  # [batch, H, S]
    C_h = C.float().repeat_interleave(ratio, dim=1)
    dBx = (dt_f * x.float()).unsqueeze(-1) * B_h.unsqueeze(-2)  # [batch, H, D, S]
    if state_batch_indices is None:
        slots = torch.arange(batch, device=x.device)
    else:
        slots = state_batch_indices.to(torch.int64)
    live = slots != pad_slot_id
    new_state = state.clone()
    s = new_state[slots[live]].float() * dA[live] + dBx[live]  # [live, H, D, S]
    if dst_state_batch_indices is None:
        new_state[slots[live]] = s.to(state.dtype)
    else:
        dst = dst_state_batch_indices.to(torch.int64)[live]
        written = dst != pad_slot_id
        new_state[dst[written]] = s[written].to(state.dtype)
    y = torch.zeros(batch, nheads, x.shape[2], dtype=torch.float32, device=x.device)
    y_live = (s * C_h[live].unsqueeze(-2)).sum(-1)
    if D is not None:
        y_live = y_live + x[live].float() * D.float()
    if z is not None:
        y_live = y_live * F.silu(z[live].float())
    y[live] = y_live
    return y.to(x.dtype), new_state


def mamba_ssu_ref(state, x, dt, A, B, C, D, dt_bias, state_batch_indices):
    """The FlashInfer-Trace `mamba_ssu_decode_*` contract: softplus(dt + dt_bias), D skip, no
    z gate, slots from state_batch_indices (-1 pads). Returns (output, new_state)."""
    return selective_state_update_ref(
        state, x, dt, A, B, C, D, None, dt_bias, True, state_batch_indices, -1
    )

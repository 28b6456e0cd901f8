"""The GDN contract in plain PyTorch: Qwen3-Next's gated delta rule, token by token.

Per value head h (GVA: query/key head h // (num_v_heads // num_q_heads)), with the state
S [V, K] (k-last, float32) and, for each token t,

    g = exp(-exp(A_log) * softplus(a + dt_bias)),  beta = sigmoid(b)
    S <- g * S + beta * (v - (g * S) k) k^T          (the delta rule: v's error along k)
    o = scale * S q                                   (scale 0/None: 1/sqrt(head_size))

Written once here; the schemas emit these functions as their Definitions' references
(FlashInfer-Trace's gdn_prefill_*, gdn_decode_*, gdn_mtp_*), and tests, benchmarks and the
torch solutions import them. Each is self-contained (its source becomes a reference).
`recurrent_ref` is the shared form the kernels' tests use (gates given, optional l2 norm).
"""

from __future__ import annotations

import torch

__all__ = [
    "gdn_gates",
    "recurrent_ref",
    "gdn_prefill_ref",
    "gdn_decode_ref",
    "gdn_mtp_ref",
]


def gdn_gates(
    A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta), float32, shaped like `a`: the decay g = exp(-exp(A_log) * softplus(a +
    dt_bias)) and the write strength beta = sigmoid(b); A_log, dt_bias per value head."""
    import torch.nn.functional as F

    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float()))
    return g, torch.sigmoid(b.float())


def recurrent_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    scale: float,
    use_qk_l2norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence batch of the recurrence: q, k [B, T, H, K], v [B, T, HV, V], g, beta
    [B, T, HV] (float32), state [B, HV, V, K] float32 or None (zeros). Returns (output
    [B, T, HV, V] float32, final state [B, HV, V, K] float32)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    qf, kf = q.float(), k.float()
    if use_qk_l2norm:  # FlashInfer's and fla's: x / sqrt(sum(x^2) + 1e-6)
        qf = qf * torch.rsqrt((qf * qf).sum(-1, keepdim=True) + 1e-6)
        kf = kf * torch.rsqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)
    qf = qf.repeat_interleave(HV // H, dim=2)
    kf = kf.repeat_interleave(HV // H, dim=2)
    s = torch.zeros(B, HV, V, K) if state is None else state.float().clone()
    s = s.to(q.device)
    out = torch.empty(B, T, HV, V, dtype=torch.float32, device=q.device)
    for t in range(T):
        s = s * g[:, t, :, None, None]
        kv = torch.einsum("bhvk,bhk->bhv", s, kf[:, t])
        u = beta[:, t, :, None] * (v[:, t].float() - kv)
        s = s + u[..., None] * kf[:, t, :, None, :]
        out[:, t] = scale * torch.einsum("bhvk,bhk->bhv", s, qf[:, t])
    return out, s


@torch.no_grad()
def gdn_prefill_ref(q, k, v, state=None, A_log=None, a=None, dt_bias=None, b=None,
                    cu_seqlens=None, scale=None):  # fmt: skip
    """GDN prefill (chunk_gated_delta_rule's contract, k-last state): q, k [T, H, K], v
    [T, HV, V], packed sequences by cu_seqlens [N + 1]; state [N, HV, V, K] float32 or None
    (zeros); a, b [T, HV]; A_log, dt_bias [HV]. Returns (output [T, HV, V] bfloat16,
    new_state [N, HV, V, K] float32; zeros for an empty sequence). Token by token, float32."""
    import math

    import torch.nn.functional as F

    total, num_q_heads, head_size = q.shape
    num_v_heads = v.shape[1]
    group = num_v_heads // num_q_heads
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(head_size)
    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float()))
    beta = torch.sigmoid(b.float())
    qf = q.float().repeat_interleave(group, dim=1)
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float()
    num_seqs = cu_seqlens.shape[0] - 1
    output = torch.zeros(total, num_v_heads, v.shape[2], dtype=torch.bfloat16, device=q.device)
    new_state = torch.zeros(
        num_seqs, num_v_heads, v.shape[2], head_size, dtype=torch.float32, device=q.device
    )
    for n in range(num_seqs):
        start, end = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        if end <= start:  # an empty sequence's new state stays zeros (FlashInfer-Trace's)
            continue
        s = new_state[n] if state is None else state[n].float().clone()  # [HV, V, K]
        for t in range(start, end):
            s = s * g[t, :, None, None]
            kv = torch.einsum("hvk,hk->hv", s, kf[t])
            s = s + (beta[t, :, None] * (vf[t] - kv))[..., None] * kf[t, :, None, :]
            output[t] = (scale * torch.einsum("hvk,hk->hv", s, qf[t])).to(torch.bfloat16)
        new_state[n] = s
    return output, new_state


@torch.no_grad()
def gdn_decode_ref(q, k, v, state=None, A_log=None, a=None, dt_bias=None, b=None,
                   scale=None):  # fmt: skip
    """GDN decode (one token per request, k-last state): q, k [B, 1, H, K], v [B, 1, HV,
    V], state [B, HV, V, K] float32 or None (zeros), a, b [B, 1, HV]. Returns (output
    [B, 1, HV, V] bfloat16, new_state [B, HV, V, K] float32)."""
    import math

    import torch.nn.functional as F

    batch, _, num_q_heads, head_size = q.shape
    num_v_heads, head_v = v.shape[2], v.shape[3]
    group = num_v_heads // num_q_heads
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(head_size)
    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a[:, 0].float() + dt_bias.float()))
    beta = torch.sigmoid(b[:, 0].float())  # [B, HV]
    qf = q[:, 0].float().repeat_interleave(group, dim=1)  # [B, HV, K]
    kf = k[:, 0].float().repeat_interleave(group, dim=1)
    if state is None:
        s = torch.zeros(batch, num_v_heads, head_v, head_size, device=q.device)
    else:
        s = state.float()
    s = s * g[..., None, None]
    kv = torch.einsum("bhvk,bhk->bhv", s, kf)
    s = s + (beta[..., None] * (v[:, 0].float() - kv))[..., None] * kf[:, :, None, :]
    output = scale * torch.einsum("bhvk,bhk->bhv", s, qf)
    return output.unsqueeze(1).to(torch.bfloat16), s


@torch.no_grad()
def gdn_mtp_ref(q, k, v, initial_state=None, initial_state_indices=None, A_log=None, a=None,
                dt_bias=None, b=None, scale=None, intermediate_states_buffer=None):  # fmt: skip
    """GDN multi-token (speculative verification) with a state pool: q, k [B, T, H, K], v
    [B, T, HV, V], initial_state [P, HV, V, K] float32, request i reads slot
    initial_state_indices[i]; a, b [B, T, HV]. The pool is not updated (FlashInfer's
    disable_state_update=True): final_state is a copy of it. intermediate_states_buffer
    [P, T, HV, V, K], when given, receives the state after each token at [slot, t].
    Returns (output [B, T, HV, V] bfloat16, final_state [P, HV, V, K] float32)."""
    import math

    import torch.nn.functional as F

    batch, steps, num_q_heads, head_size = q.shape
    num_v_heads = v.shape[2]
    group = num_v_heads // num_q_heads
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(head_size)
    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float()))
    beta = torch.sigmoid(b.float())  # [B, T, HV]
    qf = q.float().repeat_interleave(group, dim=2)
    kf = k.float().repeat_interleave(group, dim=2)
    slots = initial_state_indices.long()
    s = initial_state[slots].float()  # [B, HV, V, K]
    output = torch.zeros(batch, steps, num_v_heads, v.shape[3], dtype=torch.bfloat16,
                         device=q.device)  # fmt: skip
    for t in range(steps):
        s = s * g[:, t, :, None, None]
        kv = torch.einsum("bhvk,bhk->bhv", s, kf[:, t])
        s = s + (beta[:, t, :, None] * (v[:, t].float() - kv))[..., None] * kf[:, t, :, None, :]
        output[:, t] = (scale * torch.einsum("bhvk,bhk->bhv", s, qf[:, t])).to(torch.bfloat16)
        if intermediate_states_buffer is not None:
            intermediate_states_buffer[slots, t] = s
    return output, initial_state.clone()

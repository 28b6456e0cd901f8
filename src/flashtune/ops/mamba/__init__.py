"""Mamba-2's selective state update in FlashInfer's API (`flashinfer.mamba`): one decode step
of the SSM recurrence of hybrid models (Nemotron-H, Zamba2, Falcon-H1, ...), the state cache
updated in place.

    dt' = softplus(dt + dt_bias);  state = state * exp(dt' * A) + dt' * x (outer) B
    out = state . C + D * x  (* silu(z))

Decode only: the chunked scan of prefill (FlashInfer's `ssd_combined`) is not implemented,
and FlashInfer-Trace has no Definition of it. Single-token calls only (no MTP / varlen, no
quantized state, no intermediate-state cache, no stochastic rounding): refused by name.

Layout: reference.py (the contract, PyTorch), schema.py (the FlashInfer-Trace Definitions),
kernels.py (the Triton kernel), config.py (its tactics and default), launch.py (checks,
launch, the autotuner's runner, the CPU path). docs/mamba.md: semantics, API, numbers.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.data.models import Definition
from flashtune.model_shapes import ModelConfig
from flashtune.ops.mamba.launch import check_ssu, run_ssu
from flashtune.ops.mamba.reference import mamba_ssu_ref, selective_state_update_ref
from flashtune.ops.mamba.schema import TEMPLATE, schema_for_call, schema_for_definition
from flashtune.schema import REGISTRY, ApiOp, OpSchema
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = [
    "MAMBA_OPS",
    "mamba_examples",
    "mamba_ssu_ref",
    "selective_state_update",
    "selective_state_update_ref",
]

_ALGORITHMS = ("auto", "simple", "vertical", "horizontal", "async_horizontal")
_BACKENDS = ("auto", "flashinfer", "cake")


def _refuse(**options: Any) -> None:
    """FlashInfer's options flashtune does not implement, refused by name when used."""
    why = {
        "state_scale": "int16 block-scaled state is not implemented",
        "intermediate_states_buffer": "speculative decoding's intermediate states are not "
        "implemented",
        "intermediate_state_indices": "speculative decoding's intermediate states are not "
        "implemented",
        "intermediate_state_scales": "speculative decoding's intermediate states are not "
        "implemented",
        "rand_seed": "stochastic rounding of the state is not implemented",
        "cu_seqlens": "varlen multi-token calls are not implemented",
        "num_accepted_tokens": "multi-token (MTP) calls are not implemented",
    }
    for name, value in options.items():
        if value is not None:
            raise ValueError(f"{name} is not supported: {why[name]}")


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
    state_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    disable_state_update: bool = False,
    intermediate_states_buffer: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    intermediate_state_scales: torch.Tensor | None = None,
    rand_seed: torch.Tensor | None = None,
    philox_rounds: int = 10,
    cache_steps: int = 0,
    algorithm: str = "auto",
    dst_state_batch_indices: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """One decode step of Mamba-2's SSM (FlashInfer's `mamba.selective_state_update`, its
    signature): returns the output (x's shape and dtype, or `out`) and updates `state` in
    place.

    state [slots, nheads, dim, dstate] (or [slots, dim, dstate]), float16/bfloat16/float32;
    x, dt, z [batch, nheads, dim] (or [batch, dim]); A [nheads, dim, dstate] (Mamba-2's one
    value per head: a view with strides (1, 0, 0), read as one decay per channel); B, C
    [batch, ngroups, dstate] (ngroups dividing nheads); D, dt_bias [nheads, dim] (strides
    (1, 0) for one value per head). dt' = softplus(dt + dt_bias) when dt_softplus, else
    dt + dt_bias. Row b reads and writes slot state_batch_indices[b] (b when None); a row
    whose slot is pad_slot_id is skipped (its output is zeros, no state changes).
    dst_state_batch_indices: write row b's new state to that slot instead (pad: not
    written); disable_state_update: compute the output only. Slots must be distinct.

    Accepted and unused: algorithm, backend, philox_rounds (FlashInfer's kernel choices).
    Refused by name: multi-token calls (cache_steps > 0, cu_seqlens, num_accepted_tokens, a
    4-D x), state_scale, intermediate states, rand_seed.
    """
    _refuse(
        state_scale=state_scale,
        intermediate_states_buffer=intermediate_states_buffer,
        intermediate_state_indices=intermediate_state_indices,
        intermediate_state_scales=intermediate_state_scales,
        rand_seed=rand_seed,
        cu_seqlens=cu_seqlens,
        num_accepted_tokens=num_accepted_tokens,
    )
    if cache_steps:
        raise ValueError(f"cache_steps={cache_steps} is not supported: multi-token calls are "
                         "not implemented")  # fmt: skip
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"Unknown algorithm: {algorithm!r}; known: {', '.join(_ALGORITHMS)}")
    if backend not in _BACKENDS:
        raise ValueError(f"Unknown backend: {backend!r}; known: {', '.join(_BACKENDS)}")
    st, x3, dt3, A3, B3, C3, D2, z3, bias2 = check_ssu(
        state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices, dst_state_batch_indices, out
    )
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out3 = out if out.dim() == 3 else out.unsqueeze(1)
    run_ssu(
        st, x3, dt3, A3, B3, C3, D2, z3, bias2, state_batch_indices, dst_state_batch_indices,
        out3, bool(dt_softplus), int(pad_slot_id), not disable_state_update,
    )  # fmt: skip
    return out


class _SSUOp(ApiOp):
    """The schema's view of a call: the schema made for its shape (schema.schema_for_call);
    calls no Definition describes raise ValueError there (capture, apply and the dump leave
    them to the op)."""

    def __init__(self, fn: Any) -> None:
        super().__init__(fn, self.schema_for, [TEMPLATE])

    def schema_for(self, *args: Any, **kwargs: Any) -> OpSchema:
        return schema_for_call(self.arguments(args, kwargs))

    def schema_for_definition(self, definition: Definition) -> OpSchema | None:
        """The schema of a dataset's `mamba_ssu_decode_*` Definition at its shape, or None."""
        return schema_for_definition(definition)


selective_state_update = _SSUOp(selective_state_update)
MAMBA_OPS: tuple[ApiOp, ...] = (selective_state_update,)
for _op in MAMBA_OPS:
    REGISTRY[_op.qualname] = _op


# --------------------------------------------------------------------------- model examples

EXAMPLE_BATCH = 7
EXAMPLE_SLOTS = 64


@register_examples
def mamba_examples(model: ModelConfig) -> list[Example]:
    """A hybrid model's Mamba-2 decode step at its per-GPU shapes (meta tensors), as the
    FlashInfer-Trace Definitions call it: bf16 state and activations, fp32 A (one value per
    head), softplus(dt + dt_bias), int32 slots."""
    m = model.mamba
    if m is None:
        return []
    b, h, d, s, g = EXAMPLE_BATCH, m.nheads, m.head_dim, m.dstate, m.ngroups
    args = (
        meta_tensor(EXAMPLE_SLOTS, h, d, s),
        meta_tensor(b, h, d),
        meta_tensor(b, h, d),
        meta_tensor(h, d, s, dtype=torch.float32),
        meta_tensor(b, g, s),
        meta_tensor(b, g, s),
        meta_tensor(h, d),
    )
    kwargs = {
        "dt_bias": meta_tensor(h, d),
        "dt_softplus": True,
        "state_batch_indices": meta_tensor(b, dtype=torch.int32),
    }
    return [(selective_state_update, args, kwargs)]

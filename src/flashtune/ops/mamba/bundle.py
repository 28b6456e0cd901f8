"""The bundled dataset's selective state update: `mamba_ssu_decode` at a reduced hybrid
model's shapes (model_shapes' mini-mamba: 8 heads of 32 channels, dstate 64, 2 groups), small
enough for a 2-core CPU to run the reference; flashtune's solution and torch's (the op's
reference).

The Definitions are value-returning with two outputs, (output, new_state): new_state is the
whole state cache with the batch's slots updated. Both entries work on a copy of the state
(the harness checks that no solution writes into its inputs), so each timed call includes
copying the cache: state_cache_size is kept at twice the batch, as a serving engine's
cache is about its batch. FlashInfer-Trace's `mamba_ssu_decode_*` Definitions (NemotronH-8B)
get these entries too (flashtune.ops.bundle.supply, through the op's
`schema_for_definition`). No FlashInfer entry: its mamba module is newer than the FlashInfer
these solutions are run against.
"""

from __future__ import annotations

import torch

from flashtune.data import Definition, Workload
from flashtune.ops.bundle import (
    TORCH_EAGER,
    BundledOp,
    Entry,
    WorkloadContext,
    runs_the_op,
    tuned_api,
)
from flashtune.ops.bundle.workloads import stable_uuid
from flashtune.ops.mamba.schema import PREFIX

BATCHES = [1, 3, 16, 64, 256]  # sequences decoded per step
MODELS = ("mini-mamba",)
_SLOTS_PER_ROW = 2  # state_cache_size = 2 * batch_size


def _workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
    """One workload per batch size; slots drawn by input synthesis (distinct, some pads)."""
    return [
        Workload(
            uuid=stable_uuid(definition.name, n),
            axes={"batch_size": n, "state_cache_size": _SLOTS_PER_ROW * n},
            inputs={},
        )
        for n in BATCHES
    ]


@runs_the_op
def flashtune_mamba_ssu_decode(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    state_batch_indices: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    from flashtune.ops.mamba import selective_state_update

    new_state = state.clone()
    out = selective_state_update(
        new_state, x, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=True,
        state_batch_indices=state_batch_indices, pad_slot_id=-1,
    )  # fmt: skip
    return out, new_state


def torch_mamba_ssu_decode(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    state_batch_indices: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    from flashtune.ops.mamba.reference import mamba_ssu_ref

    return mamba_ssu_ref(state, x, dt, A, B, C, D, dt_bias, state_batch_indices)


BUNDLED = (
    BundledOp(
        prefix=PREFIX,
        workloads=_workloads,
        models=MODELS,
        entries=(
            Entry(
                "flashtune",
                flashtune_mamba_ssu_decode,
                tuned_api(
                    "ops.mamba.selective_state_update",
                    " on a copy of the state cache (the op updates it in place; the copy is "
                    "timed too)",
                ),
            ),
            Entry(
                "torch",
                torch_mamba_ssu_decode,
                f"{TORCH_EAGER} The op's reference (ops.mamba.reference), fp32.",
            ),
        ),
    ),
)

"""The bundled dataset's GDN ops at reduced shapes a 2-core CPU runs the token-by-token
references of (model_shapes' mini-gdn: one query/key head, two value heads, head size 128),
named as FlashInfer-Trace names them (gdn_prefill_qk1_v2_d128_k_last, ...): prefill, decode
and MTP, flashtune's solutions and torch's (the ops' references).

The entries take the Definitions' inputs in their order, so FlashInfer-Trace's own gdn
Definitions (Qwen3-Next at TP 1, 2 and 4) get them as they are (flashtune.ops.bundle.supply):
no constant is baked into an entry (head counts and sizes come from the shapes). FlashInfer's
GDN kernels need SM90+ and different gate inputs (its prefill takes g and beta, its decode
normalizes q and k by default), so no op has a FlashInfer entry.
"""

from __future__ import annotations

from flashtune.data import Definition, Workload
from flashtune.data.models import RandomInput, SafetensorsInput, ScalarInput
from flashtune.ops.bundle import (
    NO_SETUP,
    TORCH_EAGER,
    BundledOp,
    Entry,
    WorkloadContext,
    runs_the_op,
)
from flashtune.ops.bundle.workloads import solve_axes, stable_uuid

MODELS = ("mini-gdn",)
# (sequences, tokens each): cu_seqlens splits the tokens at random, across chunk boundaries
PREFILL = [(1, 1), (1, 64), (2, 100), (4, 300), (1, 1000)]
DECODE = [1, 8, 32, 64, 256]  # requests
MTP = [(1, 2), (4, 3), (8, 4), (32, 4), (64, 2)]  # (requests, tokens each); a pool of 2x


def _scale() -> dict[str, RandomInput | ScalarInput | SafetensorsInput]:
    return {"scale": ScalarInput(type="scalar", value=0.0)}  # 0: 1/sqrt(head_size)


def _prefill_workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
    # cu_seqlens is synthesized (random split of the tokens, as the constraint fixes).
    return [
        Workload(
            uuid=stable_uuid(definition.name, n, t),
            axes=solve_axes(definition, {"total_seq_len": n * t, "num_seqs": n}),
            inputs=_scale(),
        )
        for n, t in PREFILL
    ]


def _decode_workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
    return [
        Workload(uuid=stable_uuid(definition.name, n), axes={"batch_size": n}, inputs=_scale())
        for n in DECODE
    ]


def _mtp_workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
    return [
        Workload(
            uuid=stable_uuid(definition.name, n, t),
            axes={"batch_size": n, "seq_len": t, "pool_size": 2 * n},
            inputs=_scale(),
        )
        for n, t in MTP
    ]


# --------------------------------------------------------------------------- entries


@runs_the_op
def flashtune_gdn_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):  # noqa: N803
    from flashtune.ops.gdn import gdn_prefill

    return gdn_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, float(scale))


def torch_gdn_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):  # noqa: N803
    from flashtune.ops.gdn.reference import gdn_prefill_ref

    return gdn_prefill_ref(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, float(scale))


@runs_the_op
def flashtune_gdn_decode(q, k, v, state, A_log, a, dt_bias, b, scale):  # noqa: N803
    from flashtune.ops.gdn import gdn_decode

    return gdn_decode(q, k, v, state, A_log, a, dt_bias, b, float(scale))


def torch_gdn_decode(q, k, v, state, A_log, a, dt_bias, b, scale):  # noqa: N803
    from flashtune.ops.gdn.reference import gdn_decode_ref

    return gdn_decode_ref(q, k, v, state, A_log, a, dt_bias, b, float(scale))


@runs_the_op
def flashtune_gdn_mtp(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b,
                      scale, intermediate_states_buffer=None):  # fmt: skip  # noqa: N803
    from flashtune.ops.gdn import gdn_mtp

    return gdn_mtp(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b,
                   float(scale), intermediate_states_buffer)  # fmt: skip


def torch_gdn_mtp(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale,
                  intermediate_states_buffer=None):  # fmt: skip  # noqa: N803
    from flashtune.ops.gdn.reference import gdn_mtp_ref

    return gdn_mtp_ref(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b,
                       float(scale), intermediate_states_buffer)  # fmt: skip


# --------------------------------------------------------------------------- declarations

_FLASHTUNE = "flashtune's Triton kernels through its definition-shaped op ({call}). " + NO_SETUP
_TORCH = f"{TORCH_EAGER} The op's reference (ops.gdn.reference): the token recurrence, fp32."


def _op(prefix: str, workloads, flashtune, reference, call: str) -> BundledOp:  # noqa: ANN001
    return BundledOp(
        prefix=prefix,
        workloads=workloads,
        models=MODELS,
        entries=(
            Entry("flashtune", flashtune, _FLASHTUNE.format(call=call)),
            Entry("torch", reference, _TORCH),
        ),
    )


BUNDLED = (
    _op("gdn_prefill", _prefill_workloads, flashtune_gdn_prefill, torch_gdn_prefill,
        "flashtune.gdn.gdn_prefill: chunks of 64 tokens, then the state pass"),
    _op("gdn_decode", _decode_workloads, flashtune_gdn_decode, torch_gdn_decode,
        "flashtune.gdn.gdn_decode: one program per request, value head and V tile"),
    _op("gdn_mtp", _mtp_workloads, flashtune_gdn_mtp, torch_gdn_mtp,
        "flashtune.gdn.gdn_mtp: the decode kernel over the request's tokens"),
)  # fmt: skip

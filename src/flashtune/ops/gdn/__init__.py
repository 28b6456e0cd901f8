"""Gated Delta Net (Qwen3-Next's linear attention) in FlashInfer's API (`flashinfer.gdn_prefill`,
`flashinfer.gdn_decode`), plus the definition-shaped ops FlashInfer-Trace's gdn Definitions
describe.

- `chunk_gated_delta_rule`: prefill over packed variable-length sequences (cu_seqlens), gates
  given as g (decay, linear) and beta, the state [N, HV, V, K] (k-last) float32;
- `gated_delta_rule_decode_pretranspose`: one token per request, k-last state [B, HV, V, K]
  updated in place (or a pool, by initial_state / initial_state_indices);
- `gated_delta_rule_decode`: the same with a k-major state [B, HV, K, V];
- `gated_delta_rule_mtp`: T > 1 tokens per request from a state pool, optionally caching each
  token's state (speculative verification);
- `gdn_prefill`, `gdn_decode`, `gdn_mtp`: the Definitions' contracts (raw gate inputs A_log,
  a, dt_bias, b; no q/k normalization; output and new state returned), schema'd.

GVA: num_v_heads a multiple of num_q_heads == num_k_heads; value head h reads query/key head
h // (num_v_heads // num_q_heads). Layout: reference.py (the contract), kernels.py (Triton),
launch.py (host side and tactics), schema.py (the Definitions). docs/gdn.md: semantics,
API, examples.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.model_shapes import ModelConfig
from flashtune.ops.gdn import launch
from flashtune.ops.gdn.launch import check, check_shape, default_scale
from flashtune.ops.gdn.reference import (
    gdn_decode_ref,
    gdn_gates,
    gdn_mtp_ref,
    gdn_prefill_ref,
    recurrent_ref,
)
from flashtune.ops.gdn.schema import GDN_DECODE, GDN_MTP, GDN_PREFILL
from flashtune.schema import REGISTRY, ApiOp, OpSchema
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = [
    "chunk_gated_delta_rule",
    "gated_delta_rule_decode",
    "gated_delta_rule_decode_pretranspose",
    "gated_delta_rule_mtp",
    "gdn_prefill",
    "gdn_decode",
    "gdn_mtp",
    "gdn_prefill_ref",
    "gdn_decode_ref",
    "gdn_mtp_ref",
    "recurrent_ref",
    "gdn_gates",
    "GDN_OPS",
    "gdn_examples",
]

_HALF = (torch.bfloat16, torch.float16)
_FLOAT = (torch.bfloat16, torch.float16, torch.float32)
_INDEX = (torch.int32, torch.int64)


# --------------------------------------------------------------------------- checks


def _check_qkv(q: Any, k: Any, v: Any, dims: int) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check(name, t, dims, _HALF)
    if k.shape[:-2] != q.shape[:-2] or v.shape[:-2] != q.shape[:-2]:
        raise ValueError(
            f"q, k and v must agree on their leading dimensions, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}, q {q.dtype} on {q.device}")


def _check_gates(A_log: Any, a: Any, dt_bias: Any, b: Any, lead: tuple[int, ...], hv: int) -> None:
    check("A_log", A_log, 1, (torch.float32,))
    check_shape("A_log", A_log, (hv,))
    check("dt_bias", dt_bias, 1, _FLOAT)
    check_shape("dt_bias", dt_bias, (hv,))
    for name, t in (("a", a), ("b", b)):
        check(name, t, len(lead) + 1, _FLOAT)
        check_shape(name, t, (*lead, hv))


def _check_state(name: str, t: Any, shape: tuple[int, ...]) -> None:
    check(name, t, 4, (torch.float32,))
    if tuple(t.shape[1:]) != shape[1:] or (shape[0] >= 0 and t.shape[0] != shape[0]):
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")


def _out(output: Any, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    if output is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    check("output", output, len(shape))
    check_shape("output", output, shape)
    if not output.is_contiguous():
        raise ValueError("output must be contiguous")
    return output


# --------------------------------------------------------------------------- prefill


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    output: torch.Tensor | None = None,
    output_state: torch.Tensor | None = None,
    state_checkpoints: torch.Tensor | None = None,
    checkpoint_cu_starts: torch.Tensor | None = None,
    checkpoint_every_n_tokens: int = 0,
    use_cp: Any = "auto",
    state_indices: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule (prefill): FlashInfer's `chunk_gated_delta_rule`.

    q, k [T, H, K], v [T, HV, V] (bf16/fp16; GVA: HV a multiple of H), packed sequences by
    cu_seqlens [N + 1]; g (the decay, linear, in (0, 1]) and beta [T, HV] float32 (None: all
    ones); initial_state [N, HV, V, K] float32 (None: zeros). Returns the output [T, HV, V],
    and with output_final_state the final state [N, HV, V, K] float32 (into output_state when
    given). use_qk_l2norm_in_kernel: q and k l2-normalized first. Accepted and unused: use_cp
    (a FlashInfer backend choice). Refused by name: state checkpoints, state_indices pools.
    """
    if state_checkpoints is not None or checkpoint_every_n_tokens:
        raise ValueError("state checkpoints are not supported by flashtune's GDN prefill")
    if state_indices is not None:
        raise ValueError("state_indices (a state pool) is not supported by flashtune's GDN prefill")
    if cu_seqlens is None:
        raise ValueError("cu_seqlens is required (packed variable-length sequences)")
    _check_qkv(q, k, v, 3)
    check("cu_seqlens", cu_seqlens, 1, _INDEX)
    total, hv, vdim = v.shape
    num_seqs = cu_seqlens.shape[0] - 1
    for name, t in (("g", g), ("beta", beta)):
        if t is not None:
            check(name, t, 2, (torch.float32,))
            check_shape(name, t, (total, hv))
    ones = torch.ones(total, hv, dtype=torch.float32, device=q.device)
    log_g = ones.zero_() if g is None else torch.log(g)
    beta_ = torch.ones(total, hv, dtype=torch.float32, device=q.device) if beta is None else beta
    if initial_state is not None:
        _check_state("initial_state", initial_state, (num_seqs, hv, vdim, q.shape[2]))
    out = _out(output, (total, hv, vdim), q)
    if use_qk_l2norm_in_kernel:  # float32: the kernels read either
        q, k = _l2norm(q), _l2norm(k)
    if output_state is not None:
        _check_state("output_state", output_state, (num_seqs, hv, vdim, q.shape[2]))
        new_state = output_state
    else:
        new_state = torch.empty(num_seqs, hv, vdim, q.shape[2], dtype=torch.float32,
                                device=q.device)  # fmt: skip
    launch.chunked(
        q, k, v, log_g, log_g, log_g, beta_, cu_seqlens, initial_state, new_state, out,
        default_scale(scale, q.shape[2]), raw_gates=False,
    )  # fmt: skip
    return (out, new_state) if output_final_state else out


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + 1e-6)


# --------------------------------------------------------------------------- decode / MTP


def _recurrent_call(
    q: Any, k: Any, v: Any, A_log: Any, a: Any, dt_bias: Any, b: Any, scale: float | None,
    output: Any, use_qk_l2norm: bool, pool: torch.Tensor | None, read: Any, write: Any,
    update: bool, intermediate: Any = None, intermediate_by_slot: bool = False,
    new_state: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Checks shared by the decode and MTP calls, then the recurrence; returns the output."""
    _check_qkv(q, k, v, 4)
    batch, steps, _, kdim = q.shape
    hv, vdim = v.shape[2], v.shape[3]
    _check_gates(A_log, a, dt_bias, b, (batch, steps), hv)
    if pool is not None:
        _check_state("state", pool, (-1, hv, vdim, kdim))
    for name, t in (("initial_state_indices", read), ("output_state_indices", write)):
        if t is not None:
            check(name, t, 1, _INDEX)
            check_shape(name, t, (batch,))
    if intermediate is not None:
        check("intermediate_states_buffer", intermediate, 5, (torch.float32,))
        if (
            tuple(intermediate.shape[1:]) != (steps, hv, vdim, kdim)
            or not intermediate.is_contiguous()
        ):
            raise ValueError(
                f"intermediate_states_buffer must be a contiguous [*, {steps}, {hv}, {vdim}, "
                f"{kdim}] tensor, got {tuple(intermediate.shape)}"
            )
    own_output = output is None
    if own_output:
        # Padding requests' rows (negative slots) are written as zeros by the kernel itself.
        out = torch.empty(batch, steps, hv, vdim, dtype=q.dtype, device=q.device)
    else:
        out = _out(output, (batch, steps, hv, vdim), q)
    target = new_state if new_state is not None else (pool if update else None)
    launch.recurrent(
        q, k, v, A_log, a, dt_bias, b, pool, target, out, default_scale(scale, kdim),
        read_indices=read, write_indices=write, intermediate=intermediate,
        intermediate_by_slot=intermediate_by_slot, use_qk_l2norm=use_qk_l2norm,
        zero_padding=own_output and (read is not None or write is not None),
    )  # fmt: skip
    return out


def gated_delta_rule_decode_pretranspose(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor | None,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    scale: float | None = None,
    output: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    initial_state: torch.Tensor | None = None,
    initial_state_indices: torch.Tensor | None = None,
    output_state_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode, k-last state: FlashInfer's `gated_delta_rule_decode_pretranspose`.

    q, k [B, 1, H, K], v [B, 1, HV, V], a, b [B, 1, HV], A_log, dt_bias [HV]; state [B, HV,
    V, K] float32, updated in place. Or a pool: initial_state [P, HV, V, K] with
    initial_state_indices [B] (negative: padding, skipped) and output_state_indices [B]
    (default: the slots read). Returns (output [B, 1, HV, V], the state or pool).
    use_qk_l2norm (FlashInfer's default True): q and k l2-normalized in the kernel.
    """
    if q.dim() == 4 and q.shape[1] != 1:
        raise ValueError(f"decode takes one token per request (q [B, 1, H, K]), got T={q.shape[1]}")
    if initial_state is not None:
        if state is not None:
            raise ValueError("pass state or initial_state (a pool), not both")
        if initial_state_indices is None:
            raise ValueError("initial_state (a pool) needs initial_state_indices")
        pool = initial_state
    elif state is None:
        raise ValueError("state is required (or initial_state with initial_state_indices)")
    else:
        pool = state
        if state.shape[0] != q.shape[0]:
            raise ValueError(
                f"state must have {q.shape[0]} rows (one per request), got {state.shape[0]}"
            )
    out = _recurrent_call(
        q, k, v, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, pool,
        initial_state_indices, output_state_indices, True,
    )  # fmt: skip
    return out, pool


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    scale: float | None = None,
    output: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode, k-major state: FlashInfer's `gated_delta_rule_decode`. As
    `gated_delta_rule_decode_pretranspose` with state [B, HV, K, V] (updated in place: the
    kernel reads and writes it through its transposed view)."""
    check("state", state, 4, (torch.float32,))
    view = state.transpose(-1, -2)
    out, _ = gated_delta_rule_decode_pretranspose(
        q, k, v, view, A_log, a, dt_bias, b, scale, output, use_qk_l2norm
    )
    return out, state


def gated_delta_rule_mtp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    initial_state: torch.Tensor,
    initial_state_indices: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    scale: float | None = None,
    output: torch.Tensor | None = None,
    intermediate_states_buffer: torch.Tensor | None = None,
    ssm_state_indices: torch.Tensor | None = None,
    disable_state_update: bool | None = None,
    use_qk_l2norm: bool = True,
    output_state_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-token (T > 1) decode from a state pool: FlashInfer's `gated_delta_rule_mtp`.

    q, k [B, T, H, K], v [B, T, HV, V], a, b [B, T, HV]; initial_state [P, HV, V, K] float32,
    request i reads slot initial_state_indices[i] (negative: padding) and, unless
    disable_state_update (None: True, FlashInfer's current default), writes its final state
    to output_state_indices[i] (default: the slot read). intermediate_states_buffer [>= B, T,
    HV, V, K] float32 receives each token's state at [i, t] (per request, as FlashInfer's).
    Returns (output [B, T, HV, V], the pool). Refused: ssm_state_indices.
    """
    if ssm_state_indices is not None:
        raise ValueError("ssm_state_indices (per-token pool scatter) is not supported")
    update = disable_state_update is False
    if intermediate_states_buffer is not None and intermediate_states_buffer.shape[0] < q.shape[0]:
        raise ValueError(
            f"intermediate_states_buffer needs >= {q.shape[0]} rows (one per request), got "
            f"{intermediate_states_buffer.shape[0]}"
        )
    out = _recurrent_call(
        q, k, v, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state,
        initial_state_indices, output_state_indices, update, intermediate_states_buffer,
    )  # fmt: skip
    return out, initial_state


# --------------------------------------------------------------------------- the Definitions' ops


class _GDNOp(ApiOp):
    """The schema's view of a definition-shaped call: a scale of None is 0 (the Definitions'
    spelling of 1/sqrt(head_size))."""

    def __init__(self, fn: Any, schema: OpSchema) -> None:
        super().__init__(fn, schema, None)

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        arguments["scale"] = 0.0 if arguments["scale"] is None else float(arguments["scale"])
        return arguments


def gdn_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor | None,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer-Trace's gdn_prefill: q, k [T, H, K], v [T, HV, V] bf16, state [N, HV, V, K]
    float32 or None (zeros), A_log, dt_bias [HV] float32, a, b [T, HV], cu_seqlens [N + 1]
    int64, scale (None/0: 1/sqrt(K)). Returns (output [T, HV, V], new_state [N, HV, V, K])."""
    _check_qkv(q, k, v, 3)
    check("cu_seqlens", cu_seqlens, 1, _INDEX)
    total, hv, vdim = v.shape
    num_seqs = cu_seqlens.shape[0] - 1
    _check_gates(A_log, a, dt_bias, b, (total,), hv)
    if state is not None:
        _check_state("state", state, (num_seqs, hv, vdim, q.shape[2]))
    out = torch.empty(total, hv, vdim, dtype=q.dtype, device=q.device)
    new_state = torch.empty(num_seqs, hv, vdim, q.shape[2], dtype=torch.float32, device=q.device)
    launch.chunked(
        q, k, v, A_log, a, dt_bias, b, cu_seqlens, state, new_state, out,
        default_scale(scale, q.shape[2]),
    )  # fmt: skip
    return out, new_state


def gdn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor | None,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer-Trace's gdn_decode: q, k [B, 1, H, K], v [B, 1, HV, V], state [B, HV, V, K]
    float32 or None (zeros; left unchanged), a, b [B, 1, HV]. Returns (output [B, 1, HV, V],
    new_state [B, HV, V, K]). No q/k normalization (the Definitions' reference has none)."""
    if q.dim() == 4 and q.shape[1] != 1:
        raise ValueError(f"decode takes one token per request (q [B, 1, H, K]), got T={q.shape[1]}")
    batch, _, _, kdim = q.shape
    hv, vdim = v.shape[2], v.shape[3]
    if state is not None:
        _check_state("state", state, (batch, hv, vdim, kdim))
    new_state = torch.empty(batch, hv, vdim, kdim, dtype=torch.float32, device=q.device)
    out = _recurrent_call(
        q, k, v, A_log, a, dt_bias, b, scale, None, False, state, None, None, False,
        new_state=new_state,
    )  # fmt: skip
    return out, new_state


def gdn_mtp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    initial_state: torch.Tensor,
    initial_state_indices: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    scale: float | None = None,
    intermediate_states_buffer: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer-Trace's gdn_mtp: as `gated_delta_rule_mtp` with state updates disabled and
    no q/k normalization, intermediate_states_buffer [P, T, HV, V, K] indexed by pool slot
    (the Definitions' reference). Returns (output [B, T, HV, V], a copy of the pool)."""
    out = _recurrent_call(
        q, k, v, A_log, a, dt_bias, b, scale, None, False, initial_state,
        initial_state_indices, None, False, intermediate_states_buffer, True,
    )  # fmt: skip
    return out, initial_state.clone()


gdn_prefill = _GDNOp(gdn_prefill, GDN_PREFILL)
gdn_decode = _GDNOp(gdn_decode, GDN_DECODE)
gdn_mtp = _GDNOp(gdn_mtp, GDN_MTP)

# The schema'd ops of the family (flashtune.schema.REGISTRY: definition dump, apply, capture).
GDN_OPS: tuple[ApiOp, ...] = (gdn_prefill, gdn_decode, gdn_mtp)
for _op in GDN_OPS:
    REGISTRY[_op.qualname] = _op


# --------------------------------------------------------------------------- model examples

EXAMPLE_TOKENS = 7  # prefill: two sequences (4 + 3 tokens); MTP: tokens per request
EXAMPLE_BATCH = 3


@register_examples
def gdn_examples(model: ModelConfig) -> list[Example]:
    """A Gated Delta Net model's linear-attention calls at its per-GPU shapes, on the meta
    device: prefill (two sequences with initial states), decode and MTP (a pool of 8)."""
    gdn = model.gdn
    if gdn is None:
        return []
    h, hv, d, t, n = gdn.num_k_heads, gdn.num_v_heads, gdn.head_dim, EXAMPLE_TOKENS, EXAMPLE_BATCH
    f32 = torch.float32

    def gates(*lead: int) -> tuple[torch.Tensor, ...]:
        return (meta_tensor(hv, dtype=f32), meta_tensor(*lead, hv), meta_tensor(hv, dtype=f32),
                meta_tensor(*lead, hv))  # fmt: skip

    prefill = (
        meta_tensor(t, h, d), meta_tensor(t, h, d), meta_tensor(t, hv, d),
        meta_tensor(2, hv, d, d, dtype=f32), *gates(t), meta_tensor(3, dtype=torch.int64), 0.0,
    )  # fmt: skip
    decode = (
        meta_tensor(n, 1, h, d), meta_tensor(n, 1, h, d), meta_tensor(n, 1, hv, d),
        meta_tensor(n, hv, d, d, dtype=f32), *gates(n, 1), 0.0,
    )  # fmt: skip
    mtp = (
        meta_tensor(n, 4, h, d), meta_tensor(n, 4, h, d), meta_tensor(n, 4, hv, d),
        meta_tensor(8, hv, d, d, dtype=f32), meta_tensor(n, dtype=torch.int32), *gates(n, 4),
        0.0,
    )  # fmt: skip
    return [(gdn_prefill, prefill, {}), (gdn_decode, decode, {}), (gdn_mtp, mtp, {})]

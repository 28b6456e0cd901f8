"""Host side of the selective state update: input checks, the kernel's launch, the
autotuner's runner and tactics, the CPU path (the reference) and the torch custom op that
torch.compile traces through."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import triton

from flashtune.ops.call import FLOATS, KernelOp, check_tensor, field_index, inputs_of, named, traced
from flashtune.ops.mamba.config import SSUTactic, default_tactic
from flashtune.ops.mamba.kernels import _ssu_kernel
from flashtune.ops.mamba.reference import selective_state_update_ref
from flashtune.tune import DEFAULT_TACTIC, DynamicDim, Tactic, TunableRunner, TuningConfig

__all__ = ["SSUInputs", "SSURunner", "SSU_TUNING", "check_ssu", "run_ssu"]

_INDEX_DTYPES = (torch.int32, torch.int64)


class SSUInputs(NamedTuple):
    """SSURunner's inputs (the 3-D / 4-D forms; `check_ssu` makes them from the API's)."""

    state: torch.Tensor  # [slots, nheads, dim, dstate], updated in place
    x: torch.Tensor  # [batch, nheads, dim]
    dt: torch.Tensor  # [batch, nheads, dim]
    A: torch.Tensor  # [nheads, dim, dstate]
    B: torch.Tensor  # [batch, ngroups, dstate]
    C: torch.Tensor  # [batch, ngroups, dstate]
    D: torch.Tensor | None  # [nheads, dim]
    z: torch.Tensor | None  # [batch, nheads, dim]
    dt_bias: torch.Tensor | None  # [nheads, dim]
    slots: torch.Tensor | None  # [batch] slot per row (None: row b is slot b)
    dst: torch.Tensor | None  # [batch] slot written per row (None: the slot read)
    out: torch.Tensor  # [batch, nheads, dim]
    dt_softplus: bool
    pad_slot_id: int
    write_state: bool


# ----------------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------------


def _shape(name: str, t: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} ({what}), got {tuple(t.shape)}")


def check_ssu(
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any,
    z: Any,
    dt_bias: Any,
    slots: Any,
    dst: Any,
    out: Any,
) -> tuple[torch.Tensor, ...]:
    """Check a single-token call (FlashInfer's 2-D / 3-D forms) and return its tensors in
    the kernel's forms: (state, x, dt, A, B, C, D, z, dt_bias) with a heads dimension. Raises
    TypeError / ValueError naming the argument, what was expected and what it got."""
    state = check_tensor("state", state, FLOATS, contiguous=True)
    dev = state.device
    x = check_tensor("x", x, FLOATS, dev, "state")
    if x.dim() == 4 or state.dim() not in (3, 4):
        raise ValueError(
            "only single-token decode is implemented: state [slots, nheads, dim, dstate] (or "
            f"[slots, dim, dstate]) and x [batch, nheads, dim] (or [batch, dim]); got state "
            f"{tuple(state.shape)}, x {tuple(x.shape)} (multi-token / MTP is not supported)"
        )
    heads = state.dim() == 4
    st = state if heads else state.unsqueeze(1)
    _, nheads, dim, dstate = st.shape

    def lift(name: str, t: Any, rank: int, dtypes: Sequence[torch.dtype] = FLOATS) -> Any:
        if t is None:
            return None
        t = check_tensor(name, t, dtypes, dev, "state")
        if t.dim() == rank - 1 and not heads:
            return t.unsqueeze(1 if rank == 3 and name not in ("A", "D", "dt_bias") else 0)
        if t.dim() != rank:
            raise ValueError(f"{name} must be {rank}-D (with a heads dimension), got shape "
                             f"{tuple(t.shape)}")  # fmt: skip
        return t

    x3 = lift("x", x, 3)
    batch = x3.shape[0]
    row = (batch, nheads, dim)
    _shape("x", x3, row, "[batch, nheads, dim] from state")
    dt3 = lift("dt", dt, 3)
    _shape("dt", dt3, row, "x's shape")
    z3 = lift("z", z, 3)
    if z3 is not None:
        _shape("z", z3, row, "x's shape")
    A3 = lift("A", A, 3)
    _shape("A", A3, (nheads, dim, dstate), "[nheads, dim, dstate] from state")
    B3 = lift("B", B, 3)
    C3 = lift("C", C, 3)
    ngroups = B3.shape[1]
    if ngroups < 1 or nheads % ngroups:
        raise ValueError(f"B's groups ({ngroups}) must divide nheads ({nheads})")
    _shape("B", B3, (batch, ngroups, dstate), "[batch, ngroups, dstate]")
    _shape("C", C3, (batch, ngroups, dstate), "B's shape")
    for name, t in (("state", st), ("B", B3), ("C", C3)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in dstate (stride 1), got strides "
                             f"{tuple(t.stride())}")  # fmt: skip
    D2 = lift("D", D, 2)
    if D2 is not None:
        _shape("D", D2, (nheads, dim), "[nheads, dim]")
    bias2 = lift("dt_bias", dt_bias, 2)
    if bias2 is not None:
        _shape("dt_bias", bias2, (nheads, dim), "[nheads, dim]")
    for name, idx in (("state_batch_indices", slots), ("dst_state_batch_indices", dst)):
        if idx is not None:
            check_tensor(name, idx, _INDEX_DTYPES, dev, "state")
            _shape(name, idx, (batch,), "[batch]")
    if out is not None:
        check_tensor("out", out, FLOATS, dev, "state")
        _shape("out", out, tuple(x.shape), "x's shape")
    return st, x3, dt3, A3, B3, C3, D2, z3, bias2


# ----------------------------------------------------------------------------------------------
# Launch, runner, tactics
# ----------------------------------------------------------------------------------------------


def _strides(t: torch.Tensor | None, n: int) -> tuple[int, ...]:
    return (0,) * n if t is None else tuple(t.stride())


def _launch(a: SSUInputs, tactic: Tactic) -> None:
    batch, nheads, dim = a.x.shape
    dstate = a.state.shape[-1]
    if batch == 0:
        return
    cfg = default_tactic(batch, nheads, dim, dstate) if tactic == DEFAULT_TACTIC else tactic
    assert isinstance(cfg, SSUTactic)
    tie_a = a.A.stride(1) == 0 and a.A.stride(2) == 0
    dummy = a.x  # never read: its flag is off
    grid = (triton.cdiv(dim, cfg.block_d), batch, nheads)
    _ssu_kernel[grid](
        a.state, a.x, a.dt, a.A, a.B, a.C,
        dummy if a.D is None else a.D,
        dummy if a.z is None else a.z,
        dummy if a.dt_bias is None else a.dt_bias,
        dummy if a.slots is None else a.slots,
        dummy if a.dst is None else a.dst,
        a.out, dim, dstate, nheads // a.B.shape[1], a.pad_slot_id,
        *a.state.stride()[:3], *a.x.stride(), *a.dt.stride(), *a.A.stride(),
        *a.B.stride()[:2], *a.C.stride()[:2], *_strides(a.D, 2), *_strides(a.z, 3),
        *_strides(a.dt_bias, 2), *a.out.stride(),
        BLOCK_D=cfg.block_d,
        BLOCK_S=triton.next_power_of_2(dstate),
        TIE_A=tie_a,
        HAS_D=a.D is not None,
        HAS_Z=a.z is not None,
        HAS_DT_BIAS=a.dt_bias is not None,
        HAS_SLOTS=a.slots is not None,
        HAS_DST=a.dst is not None,
        SOFTPLUS=a.dt_softplus,
        WRITE_STATE=a.write_state,
        num_warps=cfg.num_warps,
    )  # fmt: skip


class SSURunner(TunableRunner):
    """The Triton selective-state-update kernel. inputs: SSUInputs."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        a = named(SSUInputs, inputs)
        return list(SSUTactic.space(a.x.shape[2], a.state.shape[3]))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        a = named(SSUInputs, inputs)
        _launch(a, tactic)
        return a.out


_ROWS = ("x", "dt", "B", "C", "z", "slots", "dst", "out")  # their dim 0 is the batch


def _tuning_inputs(inputs: Sequence[Any], profile: Any) -> list[Any]:
    """Fresh valid inputs at the profile's batch: random rows, a fresh state cache (with at
    least a slot per row), distinct random slots, and the caller's weights D and dt_bias (their
    shapes do not change) and A, made negative."""
    a = named(SSUInputs, inputs)
    batch = int(profile[field_index(SSUInputs, "x")][0])
    slots_n = max(a.state.shape[0], batch)
    dev = a.x.device

    def rand(t: torch.Tensor) -> torch.Tensor:
        return torch.randn((batch, *t.shape[1:]), device=dev).mul_(0.1).to(t.dtype)

    state = torch.randn((slots_n, *a.state.shape[1:]), device=dev).mul_(0.1).to(a.state.dtype)
    perm = torch.randperm(slots_n, device=dev)[:batch]
    slots = None if a.slots is None else perm.to(a.slots.dtype)
    dst = None if a.dst is None else perm.flip(0).to(a.dst.dtype)
    out = torch.empty((batch, *a.out.shape[1:]), dtype=a.out.dtype, device=dev)
    # The caller's A made negative, its layout kept (per head: a stride-0 view): timing calls
    # the kernel many times on one state, which a decay above 1 (a tune target's random A)
    # would grow to inf.
    if a.A.stride(1) == 0 and a.A.stride(2) == 0:
        per_head = -(a.A[:, 0, 0].float().abs() + 0.1)
        A = per_head.to(a.A.dtype).view(-1, 1, 1).expand(a.A.shape)
    else:
        A = -(a.A.float().abs() + 0.1).to(a.A.dtype)
    fresh = a._replace(state=state, x=rand(a.x), dt=rand(a.dt), A=A, B=rand(a.B), C=rand(a.C),
                       z=None if a.z is None else rand(a.z), slots=slots, dst=dst, out=out)  # fmt: skip
    return list(fresh)


SSU_TUNING = TuningConfig(
    dynamic_dims=(DynamicDim(input_idx=field_index(SSUInputs, "x"), dim=0),),
    constraints=tuple(
        (field_index(SSUInputs, name), 0, lambda shapes: shapes[1][0])
        for name in _ROWS
        if name != "x"
    ),
    make_inputs=_tuning_inputs,
)


def _reference(a: SSUInputs) -> None:
    """The CPU path: the reference, written into out (and state)."""
    y, new_state = selective_state_update_ref(
        a.state, a.x, a.dt, a.A, a.B, a.C, a.D, a.z, a.dt_bias, a.dt_softplus, a.slots,
        a.pad_slot_id, a.dst,
    )  # fmt: skip
    if a.write_state:
        a.state.copy_(new_state)
    a.out.copy_(y)


_SSU = KernelOp("flashtune::selective_state_update", (SSURunner(),), SSU_TUNING, _reference)


@traced("selective_state_update", mutates=("state", "out"))
def run_ssu(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    slots: torch.Tensor | None,
    dst: torch.Tensor | None,
    out: torch.Tensor,
    dt_softplus: bool,
    pad_slot_id: int,
    write_state: bool,
) -> None:
    """One decode step on checked tensors in the kernel's forms (check_ssu's)."""
    _SSU(inputs_of(SSUInputs, (state, x, dt, A, B, C, D, z, dt_bias, slots, dst, out,
                               dt_softplus, pad_slot_id, write_state)))  # fmt: skip

"""Mamba-2's selective state update against its reference: a grid (fp16/fp32, on the CPU
under Triton's interpreter or on the GPU; odd batch sizes, head_dim and dstate that leave
partial tiles, one and several groups, with and without z / D / dt_bias / softplus, slots
with pad rows, Mamba-2's per-head A, the 2-D forms), tactics, the in-place and
destination-slot semantics, bad input, the autotuner's inputs, bf16 at the FlashInfer-Trace
shapes on the GPU, and the kernel compiled for sm_90 without a GPU (slow)."""

from __future__ import annotations

import pytest
import torch

from flashtune.ops.mamba import selective_state_update, selective_state_update_ref
from flashtune.ops.mamba.config import SSUTactic, default_tactic
from flashtune.ops.mamba.launch import SSUInputs, SSURunner, check_ssu

TOL = {  # dtype -> (atol, rtol): one rounding of each output; the fp32 math agrees closely
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}
CPU_DTYPES = [torch.float16, torch.float32]  # bf16 loads are wrong in Triton's interpreter


def _inputs(
    batch: int,
    slots: int,
    nheads: int,
    dim: int,
    dstate: int,
    ngroups: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    tie_a: bool = True,
    pads: int = 0,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Fresh random inputs (never zeros): Mamba-2's negative A (one value per head as a
    stride-0 view, or one per element), distinct slots with `pads` rows padded (-1)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * scale).to(dtype).to(device)

    if tie_a:
        a = -(torch.rand(nheads, generator=g) * 3 + 0.5)
        A = a.to(device).view(nheads, 1, 1).expand(nheads, dim, dstate)
    else:
        A = -(torch.rand(nheads, dim, dstate, generator=g) * 3 + 0.1).to(device)
    idx = torch.randperm(slots, generator=g)[:batch].to(torch.int32)
    idx[torch.randperm(batch, generator=g)[:pads]] = -1
    return {
        "state": randn(slots, nheads, dim, dstate),
        "x": randn(batch, nheads, dim),
        "dt": randn(batch, nheads, dim, scale=0.5),
        "A": A,
        "B": randn(batch, ngroups, dstate),
        "C": randn(batch, ngroups, dstate),
        "D": randn(nheads, dim),
        "z": randn(batch, nheads, dim),
        "dt_bias": randn(nheads, dim, scale=0.5),
        "state_batch_indices": idx.to(device),
    }


def _check(
    t: dict[str, torch.Tensor],
    dtype: torch.dtype,
    *,
    z: bool,
    D: bool,
    bias: bool,
    softplus: bool,
    slots: bool,
) -> None:
    args = {
        "D": t["D"] if D else None,
        "z": t["z"] if z else None,
        "dt_bias": t["dt_bias"] if bias else None,
        "dt_softplus": softplus,
        "state_batch_indices": t["state_batch_indices"] if slots else None,
    }
    want_y, want_state = selective_state_update_ref(
        t["state"], t["x"], t["dt"], t["A"], t["B"], t["C"], **args
    )
    state = t["state"].clone()
    y = selective_state_update(state, t["x"], t["dt"], t["A"], t["B"], t["C"], **args)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y, want_y, atol=atol, rtol=rtol)
    torch.testing.assert_close(state, want_state, atol=atol, rtol=rtol)


# (batch, slots, nheads, head_dim, dstate, ngroups): head_dim 12 and dstate 12 / 20 leave
# partial tiles; ngroups 1 (every head shares B / C) and nheads (none does).
SHAPES = [(1, 3, 2, 12, 16, 1), (3, 5, 2, 12, 12, 2), (5, 9, 4, 8, 20, 2)]


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference_with_every_input(dtype, shape, device):
    batch, slots, h, d, s, g = shape
    t = _inputs(batch, slots, h, d, s, g, dtype, device, pads=batch // 2)
    _check(t, dtype, z=True, D=True, bias=True, softplus=True, slots=True)


@pytest.mark.parametrize(
    "z,D,bias,softplus,slots",
    [
        (False, True, True, True, True),  # the FlashInfer-Trace form
        (False, False, False, False, False),  # the bare recurrence, row b in slot b
        (True, False, True, False, True),
    ],
)
def test_optional_inputs(z, D, bias, softplus, slots, device):
    t = _inputs(3, 4, 2, 12, 12, 1, torch.float32, device, tie_a=False, pads=1 if slots else 0)
    _check(t, torch.float32, z=z, D=D, bias=bias, softplus=softplus, slots=slots)


def test_two_dimensional_forms(device):
    """FlashInfer's head-less forms: state [slots, dim, dstate], x [batch, dim], A [dim,
    dstate], B / C [batch, dstate], D / dt_bias [dim]."""
    t = _inputs(3, 4, 1, 12, 12, 1, torch.float32, device, tie_a=False, pads=1)
    flat = {k: t[k].squeeze(1) for k in ("state", "x", "dt", "B", "C", "z")}
    flat.update(A=t["A"][0], D=t["D"][0], dt_bias=t["dt_bias"][0])
    want_y, want_state = selective_state_update_ref(
        t["state"], t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], t["z"], t["dt_bias"],
        True, t["state_batch_indices"],
    )  # fmt: skip
    state = flat["state"].clone()
    y = selective_state_update(
        state, flat["x"], flat["dt"], flat["A"], flat["B"], flat["C"], flat["D"], z=flat["z"],
        dt_bias=flat["dt_bias"], dt_softplus=True, state_batch_indices=t["state_batch_indices"],
    )  # fmt: skip
    assert y.shape == flat["x"].shape
    torch.testing.assert_close(y, want_y.squeeze(1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state, want_state.squeeze(1), atol=1e-4, rtol=1e-4)


def test_every_tactic_agrees(device):
    t = _inputs(2, 3, 2, 16, 16, 1, torch.float32, device, pads=1)
    st, x, dt, A, B, C, D, z, bias = check_ssu(
        t["state"], t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], t["z"], t["dt_bias"],
        t["state_batch_indices"], None, None,
    )  # fmt: skip
    want_y, want_state = selective_state_update_ref(
        st, x, dt, A, B, C, D, z, bias, True, t["state_batch_indices"]
    )
    runner = SSURunner()
    # One tactic per tile width (num_warps changes no arithmetic): all of them under the
    # interpreter would cost seconds.
    tactics = {tac.block_d: tac for tac in SSUTactic.space(16, 16)}
    assert len(tactics) >= 2
    for tactic in tactics.values():
        state, out = st.clone(), torch.empty_like(x)
        inputs = SSUInputs(state, x, dt, A, B, C, D, z, bias, t["state_batch_indices"], None,
                           out, True, -1, True)  # fmt: skip
        runner.forward(inputs, tactic)
        torch.testing.assert_close(out, want_y, atol=1e-4, rtol=1e-4, msg=str(tactic))
        torch.testing.assert_close(state, want_state, atol=1e-4, rtol=1e-4, msg=str(tactic))


def test_destination_slots_and_disabled_update(device):
    """dst_state_batch_indices: read slot i, write slot j (the source unchanged; a pad
    destination writes nothing); disable_state_update: the output only."""
    t = _inputs(3, 7, 2, 8, 16, 1, torch.float32, device)
    src = t["state_batch_indices"]
    free = [s for s in range(7) if s not in src.tolist()]  # slots no row reads
    dst = torch.tensor([free[0], -1, free[1]], dtype=torch.int32, device=device)
    base = (t["state"], t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"])
    want_y, want_state = selective_state_update_ref(
        *base, dt_bias=t["dt_bias"], dt_softplus=True, state_batch_indices=src,
        dst_state_batch_indices=dst,
    )  # fmt: skip
    state = t["state"].clone()
    y = selective_state_update(
        state, *base[1:], dt_bias=t["dt_bias"], dt_softplus=True, state_batch_indices=src,
        dst_state_batch_indices=dst,
    )  # fmt: skip
    torch.testing.assert_close(y, want_y, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state, want_state, atol=1e-4, rtol=1e-4)
    assert torch.equal(state[src.long()], t["state"][src.long()])

    state = t["state"].clone()
    y2 = selective_state_update(
        state, *base[1:], dt_bias=t["dt_bias"], dt_softplus=True, state_batch_indices=src,
        disable_state_update=True,
    )  # fmt: skip
    assert torch.equal(state, t["state"])
    torch.testing.assert_close(y2, want_y, atol=1e-4, rtol=1e-4)


def test_pad_rows_output_zeros_and_keep_the_cache():
    t = _inputs(4, 6, 2, 8, 8, 1, torch.float32, torch.device("cpu"), pads=2)
    y, new_state = selective_state_update_ref(
        t["state"], t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], t["z"], t["dt_bias"],
        True, t["state_batch_indices"],
    )  # fmt: skip
    pad = t["state_batch_indices"] == -1
    assert int(pad.sum()) == 2 and torch.all(y[pad] == 0) and torch.all(y[~pad] != 0)
    live = t["state_batch_indices"][~pad].long()
    untouched = torch.ones(6, dtype=torch.bool)
    untouched[live] = False
    assert torch.equal(new_state[untouched], t["state"][untouched])
    assert not torch.equal(new_state[live], t["state"][live])


def test_default_tactic_is_in_the_space_and_fills_the_gpu():
    for batch in (1, 7, 64, 1024):
        for dim, dstate in ((64, 128), (32, 64), (12, 20)):
            tactic = default_tactic(batch, 64, dim, dstate)
            assert tactic in SSUTactic.space(dim, dstate), (batch, dim, dstate)
    assert default_tactic(1, 64, 64, 128).block_d == 8  # one row: more, shorter programs
    assert default_tactic(256, 64, 64, 128).block_d == 16


def _bad(**change):
    t = _inputs(2, 3, 2, 8, 8, 1, torch.float32, torch.device("cpu"))
    args = {k: t[k] for k in ("state", "x", "dt", "A", "B", "C", "D")}
    args.update(change)
    return args


@pytest.mark.parametrize(
    "change,error,match",
    [
        ({"x": torch.randn(2, 3, 8)}, ValueError, r"x must have shape \(2, 2, 8\)"),
        ({"A": torch.randn(2, 8, 4)}, ValueError, r"A must have shape \(2, 8, 8\)"),
        ({"B": torch.randn(2, 3, 8)}, ValueError, "B's groups"),
        ({"C": torch.randn(2, 1, 4)}, ValueError, r"C must have shape \(2, 1, 8\)"),
        ({"D": torch.randn(3, 8)}, ValueError, r"D must have shape \(2, 8\)"),
        ({"x": torch.randn(2, 2, 8, dtype=torch.float64)}, TypeError, "x must be"),
        ({"state": torch.randn(3, 2, 8, 8).transpose(-1, -2)}, ValueError, "contiguous"),
        ({"x": torch.randn(2, 1, 2, 8)}, ValueError, "only single-token decode"),
    ],
)
def test_bad_input_is_named(change, error, match):
    with pytest.raises(error, match=match):
        selective_state_update(**_bad(**change))


@pytest.mark.parametrize(
    "option",
    [
        {"state_scale": torch.ones(1)},
        {"intermediate_states_buffer": torch.ones(1)},
        {"rand_seed": torch.ones(1, dtype=torch.int64)},
        {"cu_seqlens": torch.zeros(2, dtype=torch.int32)},
        {"cache_steps": 2},
        {"algorithm": "fastest"},
    ],
    ids=lambda o: next(iter(o)),
)
def test_unsupported_options_are_refused_by_name(option):
    name = next(iter(option))
    with pytest.raises(ValueError, match=name if name != "algorithm" else "Unknown algorithm"):
        selective_state_update(**_bad(), **option)


def test_slots_must_be_int_and_per_row():
    with pytest.raises(TypeError, match="state_batch_indices must be"):
        selective_state_update(**_bad(), state_batch_indices=torch.zeros(2))
    with pytest.raises(ValueError, match=r"state_batch_indices must have shape \(2,\)"):
        selective_state_update(**_bad(), state_batch_indices=torch.zeros(3, dtype=torch.int32))


# --------------------------------------------------------------------------- GPU


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 7, 64, 256])
@pytest.mark.parametrize("nheads,ngroups", [(128, 8), (64, 4)])
def test_dataset_shapes_bf16_on_gpu(batch, nheads, ngroups):
    """The FlashInfer-Trace shapes (head_dim 64, dstate 128), bf16, as FlashInfer-Bench's
    reference test lays them out: per-head dt, A, D and dt_bias as stride-0 views, a cache
    larger than the batch, a few pad rows."""
    device = torch.device("cuda")
    t = _inputs(batch, 2 * batch + 3, nheads, 64, 128, ngroups, torch.bfloat16, device,
                pads=batch // 8)  # fmt: skip
    t["dt"] = t["dt"][:, :, :1].expand_as(t["dt"])
    for name in ("D", "dt_bias"):
        t[name] = t[name][:, :1].expand_as(t[name])
    _check(t, torch.bfloat16, z=False, D=True, bias=True, softplus=True, slots=True)
    _check(t, torch.bfloat16, z=True, D=True, bias=True, softplus=True, slots=True)


@pytest.mark.cuda
def test_every_tactic_on_gpu():
    device = torch.device("cuda")
    t = _inputs(5, 9, 16, 64, 128, 2, torch.bfloat16, device, pads=1)
    st, x, dt, A, B, C, D, z, bias = check_ssu(
        t["state"], t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], t["z"], t["dt_bias"],
        t["state_batch_indices"], None, None,
    )  # fmt: skip
    want_y, want_state = selective_state_update_ref(
        st, x, dt, A, B, C, D, z, bias, True, t["state_batch_indices"]
    )
    for tactic in SSUTactic.space(64, 128):
        state, out = st.clone(), torch.empty_like(x)
        inputs = SSUInputs(state, x, dt, A, B, C, D, z, bias, t["state_batch_indices"], None,
                           out, True, -1, True)  # fmt: skip
        SSURunner().forward(inputs, tactic)
        torch.testing.assert_close(out, want_y, atol=2e-2, rtol=2e-2, msg=str(tactic))
        torch.testing.assert_close(state, want_state, atol=2e-2, rtol=2e-2, msg=str(tactic))


@pytest.mark.cuda
def test_compiles_under_torch_compile():
    device = torch.device("cuda")
    t = _inputs(3, 5, 4, 64, 128, 2, torch.bfloat16, device)

    def step(state, x, dt, A, B, C, D, dt_bias, idx):
        return selective_state_update(state, x, dt, A, B, C, D, dt_bias=dt_bias,
                                      dt_softplus=True, state_batch_indices=idx)  # fmt: skip

    names = ("x", "dt", "A", "B", "C", "D", "dt_bias", "state_batch_indices")
    eager_state, compiled_state = t["state"].clone(), t["state"].clone()
    want = step(eager_state, *(t[k] for k in names))
    got = torch.compile(step)(compiled_state, *(t[k] for k in names))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(compiled_state, eager_state)


def test_tuning_inputs_are_fresh_and_valid():
    """The autotuner profiles on inputs it draws at the bucket's batch: a fresh cache with a
    slot for each row (grown past the caller's when the bucket is larger), distinct slots,
    the caller's weights, A made negative (timing repeats calls on one state)."""
    from flashtune.ops.mamba.launch import SSU_TUNING, _tuning_inputs
    from flashtune.tune.runner import make_profile

    t = _inputs(3, 3, 2, 8, 16, 1, torch.float32, torch.device("cpu"))
    out = torch.empty(3, 2, 8)
    inputs = SSUInputs(t["state"], t["x"], t["dt"], t["A"], t["B"], t["C"], None, None,
                       None, t["state_batch_indices"].abs(), None, out, True, -1, True)  # fmt: skip
    profile = make_profile(inputs, SSU_TUNING)
    fresh = SSUInputs(*_tuning_inputs(list(inputs), profile))
    assert fresh.x.shape == (4, 2, 8) and fresh.out.shape == (4, 2, 8)  # batch 3 -> bucket 4
    assert fresh.B.shape == (4, 1, 16) and fresh.state.shape == (4, 2, 8, 16)
    assert fresh.slots is not None and sorted(fresh.slots.tolist()) == [0, 1, 2, 3]
    assert fresh.state is not inputs.state and fresh.D is inputs.D
    assert torch.all(fresh.A < 0) and fresh.A.stride() == inputs.A.stride()  # per head, < 0
    grown = SSUInputs(*_tuning_inputs(list(inputs._replace(A=inputs.A.neg())), profile))
    assert torch.all(grown.A < 0)  # a random A's positive heads: decays below 1 all the same


_AOT_CHILD = r"""
import json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashtune.ops.mamba.kernels import _ssu_kernel

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
PTRS = {"STATE": "*bf16", "X": "*bf16", "DT": "*bf16", "A": "*fp32", "Bm": "*bf16",
        "Cm": "*bf16", "Dv": "*bf16", "Z": "*bf16", "DT_BIAS": "*bf16", "SLOTS": "*i32",
        "DST": "*i32", "OUT": "*bf16"}

def compile_one(consts, warps):
    sig, attrs = {}, {}
    for i, n in enumerate(_ssu_kernel.arg_names):
        if n in consts:
            sig[n] = "constexpr"
        elif n in PTRS:
            sig[n] = PTRS[n]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[n] = "i32"
    src = ASTSource(_ssu_kernel, sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    if not os.path.exists(PTXAS):
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    out = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                         capture_output=True, text=True, check=True).stderr
    return sum(int(v) for v in re.findall(r"(\d+) bytes spill stores", out))

results = []
for block_d, warps, tie, z, dst in json.loads(sys.argv[1]):
    consts = dict(BLOCK_D=block_d, BLOCK_S=128, TIE_A=bool(tie), HAS_D=True, HAS_Z=bool(z),
                  HAS_DT_BIAS=True, HAS_SLOTS=True, HAS_DST=bool(dst), SOFTPLUS=True,
                  WRITE_STATE=True)
    results.append([block_d, warps, tie, z, dst, compile_one(consts, warps)])
print(json.dumps(results))
"""


@pytest.mark.slow
def test_kernel_compiles_for_sm90_without_spills():
    """Every tactic at the dataset's head_dim 64 / dstate 128, with Mamba-2's per-head A and
    with per-element A, z and destination slots, compiles for sm_90 (the H200) through
    ptxas with no register spills: what the interpreter cannot check."""
    import json
    import os
    import subprocess
    import sys

    space = SSUTactic.space(64, 128)
    cases = [(t.block_d, t.num_warps, 1, 0, 0) for t in space]
    cases += [(t.block_d, t.num_warps, 0, 1, 1) for t in space]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _AOT_CHILD, json.dumps(cases)],
        env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(cases)
    for block_d, warps, tie, z, dst, spills in results:
        assert spills == 0, f"BLOCK_D {block_d}, {warps} warps, tie {tie}, z {z}, dst {dst}"


@pytest.mark.slow
def test_autotune_profiles_on_its_own_inputs(device):
    """Inside autotune() a call profiles its bucket's tactics on inputs the tuner draws, then
    runs the pick: the caller's cache is updated once, as without tuning (16 s on the CPU)."""
    from flashtune.tune import autotune

    t = _inputs(2, 3, 1, 8, 16, 1, torch.float32, device)
    want_y, want_state = selective_state_update_ref(
        t["state"], t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], None, None, True,
        t["state_batch_indices"],
    )  # fmt: skip
    state = t["state"].clone()
    with autotune(True) as tuner:
        before = tuner.stats.shapes_tuned
        y = selective_state_update(
            state, t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], dt_softplus=True,
            state_batch_indices=t["state_batch_indices"],
        )  # fmt: skip
        assert tuner.stats.shapes_tuned == before + 1
    torch.testing.assert_close(y, want_y, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state, want_state, atol=1e-4, rtol=1e-4)


def test_served_under_flashinfers_submodule_name():
    """`import flashtune as flashinfer`: flashinfer.mamba.selective_state_update, which
    FlashInfer keeps out of its top level."""
    import flashtune as flashinfer

    assert flashinfer.mamba.selective_state_update is selective_state_update
    assert flashinfer.mamba.__all__ == ["selective_state_update"]
    assert "selective_state_update" not in flashinfer.__all__

"""Gated Delta Net (ops/gdn): the Triton kernels against the token-by-token references.

On CPU the kernels run in Triton's interpreter (float16: its bfloat16 loads are wrong) at a
head size of 32 (the kernels take any power of two; the Definitions' 128 costs the
interpreter 16x), one query/key head and two value heads (GVA): prefill over sequences of
1, 63, 0, 64, 65 and 130 tokens (a chunk is 64: partial, exact, one past, two and a bit; an
empty one), with and without an initial state; decode and MTP from a pool with padding. On the GPU (`-m
cuda`) the Definitions' shapes in bfloat16 (Qwen3-Next at TP 1), with the evaluator's
tolerances (bench/correctness.py). q and k are unit rows, the gates in Qwen3-Next's ranges,
as the value families draw them (flashtune.data.families.gdn_values): the delta rule is
unstable for |k| > sqrt(2).
"""

from __future__ import annotations

import math

import pytest
import torch

from flashtune.ops.gdn import (
    chunk_gated_delta_rule,
    gated_delta_rule_decode,
    gated_delta_rule_decode_pretranspose,
    gated_delta_rule_mtp,
    gdn_decode,
    gdn_decode_ref,
    gdn_gates,
    gdn_mtp,
    gdn_mtp_ref,
    gdn_prefill,
    gdn_prefill_ref,
    recurrent_ref,
)

D = 32  # head size on the interpreter
H, HV = 1, 2
LENGTHS = (1, 63, 0, 64, 65, 130)  # an empty sequence too: its new state is zeros
# The prefill's final state against the fp32 reference. The default tactic ("half") rounds
# the chunk intermediates (W, U0, the corrected values, each chunk's entering state) to the
# input's half type for tensor-core products, as fla does: in float16 that alone costs ~3e-4
# (measured here; 8x that in bf16, under the evaluator's 5e-3), so 1e-3, not the 1e-4 the
# float32 kernels met. The "ieee" tactic keeps float32 throughout and is held to 1e-4
# (test_prefill_ieee_tactic_keeps_float32_accuracy): a wrong kernel misses both by far.
HALF_STATE_REL = 1e-3


def _unit(*shape: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    x = torch.randn(*shape, device=device)
    return (x / x.norm(dim=-1, keepdim=True)).to(dtype)


def _gate_params(hv: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A_log, dt_bias in Qwen3-Next's ranges (decays from ~0.01 to ~0.999 a token)."""
    a_log = torch.rand(hv, device=device) * math.log(16.0)
    dt = torch.pow(10.0, -3.0 + 2.0 * torch.rand(hv, device=device))
    return a_log, torch.log(torch.expm1(dt))


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))


def _cu(lengths: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64,
                        device=device)  # fmt: skip


# --------------------------------------------------------------------------- prefill


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "with_state, lengths",
    [(True, LENGTHS), (False, (65, 0, 1))],  # no state: fewer chunks
)
def test_prefill_matches_the_reference_across_chunk_boundaries(with_state, lengths):
    dt = torch.float16
    cu = _cu(lengths)
    t, n = int(cu[-1]), len(lengths)
    q, k = _unit(t, H, D, dtype=dt), _unit(t, H, D, dtype=dt)
    v = torch.randn(t, HV, D).to(dt)
    a_log, dt_bias = _gate_params(HV)
    a, b = torch.randn(t, HV).to(dt), torch.randn(t, HV).to(dt)
    state = torch.randn(n, HV, D, D) if with_state else None
    out, new_state = gdn_prefill(q, k, v, state, a_log, a, dt_bias, b, cu, 0.0)
    ref_out, ref_state = gdn_prefill_ref(q, k, v, state, a_log, a, dt_bias, b, cu, 0.0)
    assert out.shape == (t, HV, D) and new_state.shape == (n, HV, D, D)
    assert _rel(out, ref_out) < 5e-3
    assert _rel(new_state, ref_state) < HALF_STATE_REL
    for i, length in enumerate(lengths):  # every sequence's state, also the one-token one
        if length == 0:
            assert torch.count_nonzero(new_state[i]) == 0  # an empty sequence's: zeros
        else:
            assert _rel(new_state[i], ref_state[i]) < HALF_STATE_REL, i


def _prefill_case(lengths, h, hv, *, with_state=True, strong=False, seed=0):
    """Raw-gate prefill inputs; strong: decays near 0 a token (log g down to ~-400), whose
    in-chunk cumulative sums underflow exp: only differences <= 0 may be exponentiated."""
    torch.manual_seed(seed)
    dt = torch.float16
    cu = _cu(lengths)
    t, n = int(cu[-1]), len(lengths)
    q, k = _unit(t, h, D, dtype=dt), _unit(t, h, D, dtype=dt)
    v = torch.randn(t, hv, D).to(dt)
    a_log, dt_bias = _gate_params(hv)
    if strong:
        a_log = torch.full((hv,), math.log(16.0))
        dt_bias = torch.full((hv,), 20.0)
    a, b = torch.randn(t, hv).to(dt), torch.randn(t, hv).to(dt)
    state = torch.randn(n, hv, D, D) if with_state else None
    return q, k, v, state, a_log, a, dt_bias, b, cu


@pytest.mark.interpreter
@pytest.mark.parametrize("length", [1, 63, 64, 65, 130])
@pytest.mark.parametrize("with_state", [False, True])
def test_prefill_one_sequence_of_any_length(length, with_state):
    x = _prefill_case((length,), H, HV, with_state=with_state, seed=length)
    out, new_state = gdn_prefill(*x, 0.0)
    ref_out, ref_state = gdn_prefill_ref(*x, 0.0)
    assert _rel(out, ref_out) < 5e-3 and _rel(new_state, ref_state) < HALF_STATE_REL


@pytest.mark.interpreter
@pytest.mark.parametrize("h, hv", [(2, 2), (1, 4), (2, 4)])  # GROUP 1, 4, 2
def test_prefill_gva_groups_and_an_empty_sequence(h, hv):
    lengths = (70, 0, 33)
    x = _prefill_case(lengths, h, hv, seed=h * 10 + hv)
    out, new_state = gdn_prefill(*x, 0.0)
    ref_out, ref_state = gdn_prefill_ref(*x, 0.0)
    assert _rel(out, ref_out) < 5e-3 and _rel(new_state, ref_state) < HALF_STATE_REL
    assert torch.count_nonzero(new_state[1]) == 0


@pytest.mark.interpreter
@pytest.mark.parametrize("with_state", [False, True])
def test_prefill_strong_decay_stays_finite(with_state):
    x = _prefill_case((130, 5), H, HV, with_state=with_state, strong=True)
    g, _ = gdn_gates(x[4], x[5], x[6], x[7])
    assert float(torch.log(g).min()) < -100  # 64 such tokens: exp(G) underflows to 0
    out, new_state = gdn_prefill(*x, 0.0)
    ref_out, ref_state = gdn_prefill_ref(*x, 0.0)
    assert torch.isfinite(out.float()).all() and torch.isfinite(new_state).all()
    assert _rel(out, ref_out) < 5e-3 and _rel(new_state, ref_state) < HALF_STATE_REL


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "precision",
    [pytest.param("ieee", marks=pytest.mark.slow), "tf32"],  # ieee: ~4 s
)
def test_prefill_float32_tactics_keep_float32_accuracy(precision):
    """The float32 intermediates (the interpreter computes tf32 as float32: on a GPU tf32
    rounds its operands to 10 bits) hold the bound the float32 kernels met; strided state
    views (a k-major pool's transposes) in and out."""
    from flashtune.ops.gdn.launch import GDNTactic, chunked

    lengths = (63, 0, 130)
    q, k, v, state, a_log, a, dt_bias, b, cu = _prefill_case(lengths, H, HV, seed=7)
    assert state is not None
    ref_out, ref_state = gdn_prefill_ref(q, k, v, state, a_log, a, dt_bias, b, cu, 0.0)
    kmajor = state.transpose(-1, -2).contiguous().transpose(-1, -2)  # [N, HV, V, K] view
    new_pool = torch.full((len(lengths), HV, D, D), float("nan"))
    new_state = new_pool.transpose(-1, -2)  # strided output too
    out = torch.empty(int(cu[-1]), HV, D, dtype=q.dtype)
    chunked(q, k, v, a_log, a, dt_bias, b, cu, kmajor, new_state, out, D**-0.5,
            tactic=GDNTactic(32, 4, precision, 2))  # fmt: skip
    assert _rel(out, ref_out) < 5e-3 and _rel(new_state, ref_state) < 1e-4
    with pytest.raises(ValueError, match="precision"):
        chunked(q, k, v, a_log, a, dt_bias, b, cu, kmajor, new_state, out, D**-0.5,
                tactic=GDNTactic(32, 4, "fp8", 2))  # fmt: skip


def _chunk_quantities(k, v, logg, beta, starts, lengths, group):
    """T = (I + A)^-1, W = T diag(beta gamma) K, U0 = T diag(beta) V and G per (chunk, value
    head), in float64 from the definitions (module docstring of kernels.py), scattered into
    [T, HV, CHUNK], [T, HV, K], [T, HV, V] and [T, HV] (T's rows zero-padded past a chunk's
    end)."""
    from flashtune.ops.gdn.kernels import CHUNK

    t, hv = v.shape[0], v.shape[1]
    t_ref = torch.zeros(t, hv, CHUNK, dtype=torch.float64)
    w_ref = torch.zeros(t, hv, k.shape[-1], dtype=torch.float64)
    u_ref = torch.zeros(t, hv, v.shape[-1], dtype=torch.float64)
    g_ref = torch.zeros(t, hv, dtype=torch.float64)
    for s0, n in zip(starts.tolist(), lengths.tolist(), strict=True):
        rows = slice(s0, s0 + n)
        for h in range(hv):
            kk = k[rows, h // group].double()
            big_g = logg[rows, h].double().cumsum(0)
            bt = beta[rows, h].double()
            a = bt[:, None] * torch.exp((big_g[:, None] - big_g[None, :]).tril(-1)) * (kk @ kk.T)
            tt = torch.linalg.inv(torch.eye(n, dtype=torch.float64) + a.tril(-1))
            t_ref[rows, h, :n] = tt
            w_ref[rows, h] = tt @ (kk * (bt * big_g.exp())[:, None])
            u_ref[rows, h] = tt @ (v[rows, h].double() * bt[:, None])
            g_ref[rows, h] = big_g
    return t_ref, w_ref, u_ref, g_ref


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "lengths",
    [(4096,), (1, 17, 64, 65, 130), (0, 5, 0, 64, 0), tuple((i * 37) % 150 for i in range(70))],
    ids=["one-long", "odd", "empty-seqs", "70-seqs"],
)
def test_chunk_table_kernel_matches_torch(lengths):
    """The prefill's chunk table from its one Triton kernel equals the torch form: every
    slot's length, the first slot of each sequence, the start of every used slot (unused
    slots are only ever read for their length 0); 70 sequences walk the kernel's sequence
    loop more than once, empty ones own no slot."""
    from flashtune.ops.gdn.launch import chunk_table, chunk_table_device

    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    total = int(cu[-1])
    starts, lens, first = chunk_table(cu, total)
    d_starts, d_lens, d_first = chunk_table_device(cu, total)
    assert torch.equal(d_lens, lens)
    assert torch.equal(d_first, first)
    used = lens > 0
    assert torch.equal(d_starts[used], starts[used])
    assert int(lens.sum()) == total


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "precision,blockwise",
    [
        ("half", True),  # the default
        ("ieee", False),
        # the other two in the slow step CI also runs (the main suite stays under 10 minutes)
        pytest.param("half", False, marks=pytest.mark.slow),
        pytest.param("ieee", True, marks=pytest.mark.slow),
    ],
    ids=["half-blockwise", "ieee-one-product", "half-one-product", "ieee-blockwise"],
)
def test_chunk_solve_and_wu_kernels_match_torch(precision, blockwise):
    """The prefill's first two kernels alone, on chunks of 1, 17, 64, 65 and 130 tokens (a
    partial one, a full one, one past, two and a bit; and unused slots), GVA group 2: T =
    (I + A)^-1 (its block lower part: the blocks above are never written), G, W and U0
    against float64. "half": T and the scaled rows rounded to float16 for the products
    (~2^-11 each), "ieee": float32 throughout."""
    from flashtune.ops.gdn.kernels import CHUNK, SUB, _chunk_solve_kernel, _chunk_wu_kernel
    from flashtune.ops.gdn.launch import chunk_table

    lengths, h, hv = (1, 17, 64, 65, 130), 1, 2
    q, k, v, _, a_log, a, dt_bias, b, cu = _prefill_case(lengths, h, hv, seed=3)
    total = int(cu[-1])
    starts, lens, _ = chunk_table(cu, total)
    assert int((lens == 0).sum()) > 0  # unused slots too: nothing written for them
    g, beta = gdn_gates(a_log, a, dt_bias, b)
    t_ref, w_ref, u_ref, g_ref = _chunk_quantities(k, v, torch.log(g), beta, starts, lens, 2)
    dt = torch.float16 if precision == "half" else torch.float32
    t_out = torch.zeros(total, hv, CHUNK, dtype=dt)
    g_out = torch.zeros(total, hv)
    w = torch.zeros(total, hv, D, dtype=dt)
    u = torch.zeros(total, hv, D, dtype=dt)
    prec = "ieee"  # "half" keeps T's own products in float32 too
    _chunk_solve_kernel[(starts.numel(), hv)](
        k, a, b, a_log, dt_bias, starts, lens, t_out, g_out,
        HV=hv, GROUP=2, K=D, C=CHUNK, SUB=SUB, PRECISION=prec, RAW_GATES=True,
        BLOCKWISE=blockwise, BK=16,  # two column steps of the blockwise products at D 32
    )  # fmt: skip
    _chunk_wu_kernel[(starts.numel(), hv)](
        k, v, b, t_out, g_out, starts, lens, w, u,
        HV=hv, GROUP=2, K=D, V=D, C=CHUNK, SUB=SUB, BK=16, BV=D, PRECISION=prec, RAW_GATES=True,
    )  # fmt: skip
    bound = 1e-3 if precision == "half" else 1e-5  # measured: 3.6e-4, 1.8e-6
    assert _rel(g_out, g_ref) < 1e-5
    assert _rel(t_out, t_ref) < bound
    assert _rel(w, w_ref) < bound and _rel(u, u_ref) < bound
    for s0, n in zip(starts.tolist(), lens.tolist(), strict=True):  # every chunk alone
        if n:
            rows = slice(s0, s0 + n)
            assert _rel(t_out[rows], t_ref[rows]) < bound, (s0, n)
            assert _rel(w[rows], w_ref[rows]) < bound and _rel(u[rows], u_ref[rows]) < bound


@pytest.mark.interpreter
def test_chunk_gated_delta_rule_takes_g_and_beta_and_normalizes():
    dt = torch.float16
    lengths = (5, 70)
    cu = _cu(lengths)
    t = int(cu[-1])
    q, k = torch.randn(t, H, D).to(dt), torch.randn(t, H, D).to(dt)  # normalized in the op
    v = torch.randn(t, HV, D).to(dt)
    g = torch.rand(t, HV) * 0.2 + 0.8
    beta = torch.rand(t, HV)
    s0 = torch.randn(2, HV, D, D)
    out, state = chunk_gated_delta_rule(
        q, k, v, g, beta, None, s0, True, cu, use_qk_l2norm_in_kernel=True
    )
    assert chunk_gated_delta_rule(q, k, v, g, beta, None, s0, False, cu, True).shape == out.shape
    for i, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        r_out, r_state = recurrent_ref(
            q[None, lo:hi], k[None, lo:hi], v[None, lo:hi], g[None, lo:hi], beta[None, lo:hi],
            s0[i : i + 1], D**-0.5, use_qk_l2norm=True,
        )  # fmt: skip
        assert _rel(out[lo:hi], r_out[0]) < 5e-3
        assert _rel(state[i], r_state[0]) < HALF_STATE_REL


def test_prefill_refuses_bad_inputs_by_name():
    q = torch.randn(4, 2, 16, dtype=torch.float16)
    v = torch.randn(4, 3, 16, dtype=torch.float16)  # 3 value heads: not a multiple of 2
    a_log, dt_bias = _gate_params(3)
    gates = torch.randn(4, 3)
    with pytest.raises(ValueError, match="num_v_heads"):
        gdn_prefill(q, q, v, None, a_log, gates, dt_bias, gates, _cu((4,)), 0.0)
    v = torch.randn(4, 4, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="A_log"):
        gdn_prefill(q, q, v, None, a_log, gates, dt_bias, gates, _cu((4,)), 0.0)
    with pytest.raises(TypeError, match="cu_seqlens"):
        gdn_prefill(q, q, v, None, a_log, gates, dt_bias, gates, _cu((4,)).float(), 0.0)
    with pytest.raises(ValueError, match="checkpoints"):
        chunk_gated_delta_rule(q, q, v, cu_seqlens=_cu((4,)), checkpoint_every_n_tokens=64)


# --------------------------------------------------------------------------- decode / MTP


def _step_inputs(batch: int, steps: int, dtype=torch.float16, device="cpu", d=D, h=H, hv=HV):
    q, k = (
        _unit(batch, steps, h, d, dtype=dtype, device=device),
        _unit(batch, steps, h, d, dtype=dtype, device=device),
    )
    v = torch.randn(batch, steps, hv, d, device=device).to(dtype)
    a_log, dt_bias = _gate_params(hv, device)
    a = torch.randn(batch, steps, hv, device=device).to(dtype)
    b = torch.randn(batch, steps, hv, device=device).to(dtype)
    return q, k, v, a_log, a, dt_bias, b


@pytest.mark.interpreter
@pytest.mark.parametrize("with_state", [False, True])
def test_decode_matches_the_reference(with_state):
    q, k, v, a_log, a, dt_bias, b = _step_inputs(3, 1)
    state = torch.randn(3, HV, D, D) if with_state else None
    before = None if state is None else state.clone()
    out, new_state = gdn_decode(q, k, v, state, a_log, a, dt_bias, b, 0.5)
    ref_out, ref_state = gdn_decode_ref(q, k, v, state, a_log, a, dt_bias, b, 0.5)
    assert _rel(out, ref_out) < 5e-3 and _rel(new_state, ref_state) < 1e-5
    if state is not None:
        assert torch.equal(state, before)  # the Definition's op leaves its input alone


@pytest.mark.interpreter
def test_flashinfer_decode_updates_in_place_both_layouts_and_pools():
    q, k, v, a_log, a, dt_bias, b = _step_inputs(3, 1)
    g, beta = gdn_gates(a_log, a, dt_bias, b)
    state = torch.randn(3, HV, D, D)
    ref_out, ref_state = recurrent_ref(q, k, v, g, beta, state, D**-0.5, use_qk_l2norm=True)
    s = state.clone()
    out, same = gated_delta_rule_decode_pretranspose(q, k, v, s, a_log, a, dt_bias, b)
    assert same is s and _rel(s, ref_state) < 1e-5 and _rel(out, ref_out) < 5e-3
    kmajor = state.transpose(-1, -2).contiguous()  # [B, HV, K, V]
    out, _ = gated_delta_rule_decode(q, k, v, kmajor, a_log, a, dt_bias, b)
    assert _rel(kmajor.transpose(-1, -2), ref_state) < 1e-5 and _rel(out, ref_out) < 5e-3
    # A pool: request 1 is padding (skipped: its output zeros, no slot written).
    pool = torch.randn(6, HV, D, D)
    pool[[4, 0, 2]] = state
    pool_before = pool.clone()
    idx = torch.tensor([4, -1, 2], dtype=torch.int32)
    out, _ = gated_delta_rule_decode_pretranspose(
        q, k, v, None, a_log, a, dt_bias, b, initial_state=pool, initial_state_indices=idx
    )
    assert _rel(pool[4], ref_state[0]) < 1e-5 and _rel(pool[2], ref_state[2]) < 1e-5
    assert torch.equal(pool[[0, 1, 3, 5]], pool_before[[0, 1, 3, 5]])
    assert torch.count_nonzero(out[1]) == 0 and _rel(out[2], ref_out[2]) < 5e-3


@pytest.mark.interpreter
@pytest.mark.parametrize("zero_padding", [False, True])
def test_padding_rows_zeroed_only_in_the_calls_own_output(zero_padding):
    """A padding request (slot -1): its output rows are zeros when the call allocated the
    output (the kernel writes them: no memset first), a given output's are left alone."""
    from flashtune.ops.gdn import launch

    q, k, v, a_log, a, dt_bias, b = _step_inputs(3, 2)
    pool = torch.randn(4, HV, D, D)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32)
    out = torch.full((3, 2, HV, D), float("nan"), dtype=q.dtype)
    launch.recurrent(q, k, v, a_log, a, dt_bias, b, pool, None, out, D**-0.5,
                     read_indices=idx, zero_padding=zero_padding)  # fmt: skip
    assert not out[[0, 2]].isnan().any()
    if zero_padding:
        assert torch.count_nonzero(out[1]) == 0
    else:
        assert out[1].isnan().all()


@pytest.mark.interpreter
@pytest.mark.parametrize("with_buffer", [False, True])
def test_mtp_matches_the_reference(with_buffer):
    q, k, v, a_log, a, dt_bias, b = _step_inputs(3, 4)
    pool = torch.randn(5, HV, D, D)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    buf = torch.zeros(5, 4, HV, D, D) if with_buffer else None
    ref_buf = torch.zeros(5, 4, HV, D, D) if with_buffer else None
    out, final = gdn_mtp(q, k, v, pool, idx, a_log, a, dt_bias, b, 0.0, buf)
    ref_out, ref_final = gdn_mtp_ref(q, k, v, pool, idx, a_log, a, dt_bias, b, 0.0, ref_buf)
    assert _rel(out, ref_out) < 5e-3
    assert torch.equal(final, ref_final) and final.data_ptr() != pool.data_ptr()
    if with_buffer:
        assert _rel(buf, ref_buf) < 1e-5


@pytest.mark.interpreter
def test_flashinfer_mtp_writes_back_when_asked_and_caches_per_request():
    q, k, v, a_log, a, dt_bias, b = _step_inputs(2, 3)
    g, beta = gdn_gates(a_log, a, dt_bias, b)
    pool = torch.randn(4, HV, D, D)
    idx = torch.tensor([3, 1], dtype=torch.int32)
    ref_out, ref_state = recurrent_ref(q, k, v, g, beta, pool[idx.long()], D**-0.5, True)
    buf = torch.zeros(2, 3, HV, D, D)
    before = pool.clone()
    out, _ = gated_delta_rule_mtp(q, k, v, pool, idx, a_log, a, dt_bias, b,
                                  intermediate_states_buffer=buf)  # fmt: skip
    assert torch.equal(pool, before)  # disable_state_update defaults to True
    assert _rel(out, ref_out) < 5e-3 and _rel(buf[:, -1], ref_state) < 1e-5
    out, _ = gated_delta_rule_mtp(q, k, v, pool, idx, a_log, a, dt_bias, b,
                                  disable_state_update=False)  # fmt: skip
    assert _rel(pool[idx.long()], ref_state) < 1e-5 and torch.equal(pool[[0, 2]], before[[0, 2]])


def test_decode_refuses_bad_inputs_by_name():
    q, k, v, a_log, a, dt_bias, b = _step_inputs(2, 1)
    with pytest.raises(ValueError, match="state"):
        gdn_decode(q, k, v, torch.zeros(2, HV, D, D + 1), a_log, a, dt_bias, b)
    with pytest.raises(ValueError, match=r"\bb\b"):
        gdn_decode(q, k, v, None, a_log, a, dt_bias, b[:, :, :1])
    with pytest.raises(ValueError, match="one token"):
        gdn_decode(*_step_inputs(2, 2)[:3], None, a_log, a, dt_bias, b)
    with pytest.raises(ValueError, match="ssm_state_indices"):
        gated_delta_rule_mtp(q, k, v, torch.zeros(2, HV, D, D), torch.zeros(2, dtype=torch.int32),
                             a_log, a, dt_bias, b, ssm_state_indices=torch.zeros(2, 1))  # fmt: skip


# --------------------------------------------------------------------------- GPU, real shapes

QWEN3_NEXT_TP1 = (16, 32, 128)  # query/key heads, value heads, head size


def _evaluator_bounds(out, ref_out, state, ref_state) -> None:
    # bench/correctness.py: bf16 output relative norm 1e-2; the gdn state 5e-3.
    assert _rel(out, ref_out) < 1e-2
    assert _rel(state, ref_state) < 5e-3


@pytest.mark.cuda
@pytest.mark.parametrize("lengths", [(1,), (63, 64, 65), (1000, 7, 4096)])
def test_prefill_bf16_at_qwen3_next_shapes(lengths):
    h, hv, d = QWEN3_NEXT_TP1
    dev, bf = "cuda", torch.bfloat16
    cu = _cu(lengths, dev)
    t, n = int(cu[-1]), len(lengths)
    q, k = _unit(t, h, d, dtype=bf, device=dev), _unit(t, h, d, dtype=bf, device=dev)
    v = torch.randn(t, hv, d, device=dev).to(bf)
    a_log, dt_bias = _gate_params(hv, dev)
    a = torch.randn(t, hv, device=dev).to(bf)
    b = torch.randn(t, hv, device=dev).to(bf)
    state = torch.randn(n, hv, d, d, device=dev)
    out, new_state = gdn_prefill(q, k, v, state, a_log, a, dt_bias, b, cu, None)
    ref = gdn_prefill_ref(q, k, v, state, a_log, a, dt_bias, b, cu, None)
    _evaluator_bounds(out, ref[0], new_state, ref[1])


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 64, 257])
def test_decode_and_mtp_bf16_at_qwen3_next_shapes(batch):
    h, hv, d = QWEN3_NEXT_TP1
    q, k, v, a_log, a, dt_bias, b = _step_inputs(batch, 1, torch.bfloat16, "cuda", d, h, hv)
    state = torch.randn(batch, hv, d, d, device="cuda")
    out, new_state = gdn_decode(q, k, v, state, a_log, a, dt_bias, b)
    ref = gdn_decode_ref(q, k, v, state, a_log, a, dt_bias, b)
    _evaluator_bounds(out, ref[0], new_state, ref[1])
    q, k, v, a_log, a, dt_bias, b = _step_inputs(batch, 4, torch.bfloat16, "cuda", d, h, hv)
    pool = torch.randn(2 * batch, hv, d, d, device="cuda")
    idx = torch.randperm(2 * batch, device="cuda")[:batch].to(torch.int32)
    buf = torch.zeros(2 * batch, 4, hv, d, d, device="cuda")
    ref_buf = torch.zeros_like(buf)
    out, final = gdn_mtp(q, k, v, pool, idx, a_log, a, dt_bias, b, None, buf)
    ref = gdn_mtp_ref(q, k, v, pool, idx, a_log, a, dt_bias, b, None, ref_buf)
    _evaluator_bounds(out, ref[0], buf, ref_buf)
    assert torch.equal(final, pool)


# --------------------------------------------------------------------------- tactics


@pytest.mark.interpreter
@pytest.mark.slow  # 24 tactics, ~4.5 s on 2 cores: in the slow step CI also runs
def test_every_recurrent_tactic_computes_the_same():
    from flashtune.ops.gdn.launch import RecurrentInputs, RecurrentRunner

    q, k, v, a_log, a, dt_bias, b = _step_inputs(2, 2)
    state = torch.randn(2, HV, D, D)
    ref_out, _ = gdn_mtp_ref(q, k, v, state, torch.arange(2, dtype=torch.int32), a_log, a,
                             dt_bias, b, 0.0)  # fmt: skip
    runner = RecurrentRunner()
    out = torch.empty(2, 2, HV, D, dtype=q.dtype)
    inputs = RecurrentInputs(q, k, v, a_log, a, dt_bias, b, state, None, out, None, None, None,
                             D**-0.5, True, False, True)  # fmt: skip
    tactics = runner.get_valid_tactics(inputs, None)
    assert len(tactics) >= 6 and all(t.block_v <= D for t in tactics)
    for tactic in tactics:
        out.zero_()
        runner.forward(inputs, tactic)
        assert _rel(out, ref_out) < 5e-3, tactic


@pytest.mark.interpreter
def test_chunked_tactics_compute_the_same():
    from flashtune.ops.gdn.launch import ChunkedInputs, ChunkedRunner

    dt, cu = torch.float16, _cu((70,))
    q, k = _unit(70, H, D, dtype=dt), _unit(70, H, D, dtype=dt)
    v = torch.randn(70, HV, D).to(dt)
    a_log, dt_bias = _gate_params(HV)
    a, b = torch.randn(70, HV).to(dt), torch.randn(70, HV).to(dt)
    ref_out, ref_state = gdn_prefill_ref(q, k, v, None, a_log, a, dt_bias, b, cu, 0.0)
    runner = ChunkedRunner()
    out, state = torch.empty(70, HV, D, dtype=dt), torch.empty(1, HV, D, D)
    inputs = ChunkedInputs(q, k, v, a_log, a, dt_bias, b, cu, None, state, out, D**-0.5, True)
    tactics = runner.get_valid_tactics(inputs, None)
    assert {t.block_v for t in tactics} == {16, 32}  # block_v <= D = 32
    assert {t.precision for t in tactics} == {"half"}  # the tuner trades no accuracy
    # One per V tile: warps and stages change nothing the interpreter computes.
    for tactic in {t.block_v: t for t in tactics}.values():
        out.zero_()
        runner.forward(inputs, tactic)
        assert _rel(out, ref_out) < 5e-3 and _rel(state, ref_state) < HALF_STATE_REL, tactic

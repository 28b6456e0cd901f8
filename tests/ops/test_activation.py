"""Gated activations against their references: CPU interpreter grids, layouts, out=, bad
input, torch.compile, and bf16 / large shapes on the GPU."""

from __future__ import annotations

import pytest
import torch

from flashtune.ops.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from flashtune.ops.activation.config import ActivationTactic, default_tactic
from flashtune.ops.activation.launch import GatedActivationRunner
from flashtune.ops.activation.reference import (
    gelu_and_mul_ref,
    gelu_tanh_and_mul_ref,
    silu_and_mul_ref,
)

TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (3e-2, 3e-2),
}
CPU_DTYPES = [torch.float16, torch.float32]
OPS = [
    (silu_and_mul, silu_and_mul_ref),
    (gelu_and_mul, gelu_and_mul_ref),
    (gelu_tanh_and_mul, gelu_tanh_and_mul_ref),
]
IDS = ["silu", "gelu", "gelu_tanh"]


def _close(actual, expected):
    atol, rtol = TOL[expected.dtype]
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("op,ref", OPS, ids=IDS)
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 10), (7, 246), (3, 5, 2 * 123), (2, 2 * 4097), (18,)])
def test_matches_reference(op, ref, dtype, shape, device):
    # Scaled so the gates reach both saturation regions of the activations.
    x = (torch.randn(shape, device=device) * 6).to(dtype)
    out = op(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2)
    _close(out, ref(x))


@pytest.mark.parametrize("op,ref", OPS, ids=IDS)
def test_strided_rows_and_out(op, ref, device):
    x = torch.randn(6, 300, device=device)[:, :246]
    base = torch.full((6, 200), 3.0, device=device)
    out = base[:, :123]
    assert op(x, out=out) is out
    _close(out, ref(x))
    assert torch.all(base[:, 123:] == 3.0)
    # 3-D input whose rows cannot be flattened into a view; 3-D out that cannot either.
    x3 = torch.randn(4, 6, 20, device=device)[:, ::2]
    out3 = torch.empty(4, 6, 10, device=device)[:, ::2]
    op(x3, out=out3)
    _close(out3, ref(x3))


@pytest.mark.parametrize("d", [300, 2500])  # 2500: tiles up to 4096 wide, 32 values a thread
def test_every_tactic_is_correct(device, d):
    x = torch.randn(5, 2 * d, device=device)
    runner = GatedActivationRunner()
    out = torch.empty(5, d, device=device)
    tactics = runner.get_valid_tactics([x, out, 0], None)
    assert tactics and all(isinstance(t, ActivationTactic) for t in tactics)
    refs = [silu_and_mul_ref, gelu_and_mul_ref, gelu_tanh_and_mul_ref]
    for tactic in [-1, *tactics]:
        # Every activation at the narrow width; the wide one checks the tiles with silu.
        for act, ref in enumerate(refs if d == 300 else refs[:1]):
            _close(runner.forward([x, torch.empty(5, d, device=device), act], tactic), ref(x))


def test_columns_first_falls_back_past_the_grids_y_limit(device, monkeypatch):
    """A cols_fastest tactic puts the row blocks on the grid's y axis (at most 65535);
    past that it launches rows first, with the same result."""
    from flashtune import platform

    x = torch.randn(7, 2 * 300, device=device)
    tactic = ActivationTactic(256, 1, 4, cols_fastest=True)
    runner = GatedActivationRunner()
    want = silu_and_mul_ref(x)
    _close(runner.forward([x, torch.empty(7, 300, device=device), 0], tactic), want)
    monkeypatch.setattr(platform, "MAX_GRID_YZ", 3)  # 7 row blocks: over the limit
    _close(runner.forward([x, torch.empty(7, 300, device=device), 0], tactic), want)


def test_bad_inputs():
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match="even last dimension"):
        silu_and_mul(torch.randn(4, 15))
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        silu_and_mul(x.long())
    with pytest.raises(ValueError, match=r"out must have shape \(4, 8\)"):
        silu_and_mul(x, out=torch.empty(4, 16))
    with pytest.raises(TypeError, match="out must have dtype"):
        silu_and_mul(x, out=torch.empty(4, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="out is on meta but input is on cpu"):
        gelu_and_mul(x, out=torch.empty(4, 8, device="meta"))
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        gelu_tanh_and_mul(torch.randn(16, 4).t())


def test_custom_op_and_compile(device):
    x = torch.randn(3, 64, device=device)
    torch.library.opcheck(
        torch.ops.flashtune.gated_act_out.default, (x, torch.empty(3, 32, device=device), 0)
    )
    # One eager call first: the @api wrapper reads its FLASHTUNE_* switches under a lock on
    # the first call of any op, which dynamo cannot trace (fullgraph would fail).
    expected = silu_and_mul(x) + 1
    compiled = torch.compile(lambda t: silu_and_mul(t) + 1, backend="aot_eager", fullgraph=True)
    _close(compiled(x), expected)


@pytest.mark.parametrize("enable_pdl", [None, False, True])
def test_enable_pdl_is_accepted_and_changes_nothing(enable_pdl, device):
    """FlashInfer's signature: enable_pdl on every activation, ignored where unsupported."""
    x = torch.randn(3, 5, 2 * 77, dtype=torch.float16, device=device)
    for op, ref in OPS:
        _close(op(x, enable_pdl=enable_pdl), ref(x))
    with pytest.raises(TypeError, match="enable_pdl"):
        silu_and_mul(x, enable_pdl=1)


@pytest.mark.cuda
@pytest.mark.parametrize("op,ref", OPS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 2 * 11008), (77, 2 * 14336), (4096, 2 * 4096), (3, 2 * 5)])
def test_cuda_grid(op, ref, dtype, shape):
    x = (torch.randn(shape, device="cuda") * 4).to(dtype)
    _close(op(x), ref(x))


@pytest.mark.cuda
def test_cuda_every_tactic_bf16():
    x = torch.randn(100, 2 * 3000, dtype=torch.bfloat16, device="cuda")
    runner = GatedActivationRunner()
    out = torch.empty(100, 3000, dtype=torch.bfloat16, device="cuda")
    for tactic in runner.get_valid_tactics([x, out, 0], None):
        _close(runner.forward([x, out, 0], tactic), silu_and_mul_ref(x))


def test_definitions():
    x = torch.empty(2, 3, 2 * 14336, dtype=torch.bfloat16, device="meta")
    d = silu_and_mul.definition(x)
    assert d.name == "silu_and_mul_i28672"
    assert d.inputs["input"].shape == ["num_tokens", "input_size"]
    assert d.outputs["output"].shape == ["num_tokens", "hidden_size"]
    assert d.outputs["output"].dtype == "bfloat16"
    assert gelu_tanh_and_mul.definition(x).name == "gelu_tanh_and_mul_i28672"
    assert gelu_and_mul.definition(x).name == "gelu_and_mul_i28672"


def test_default_tactic_is_a_valid_launch():
    # Triton needs power-of-two warps and block sizes (the interpreter does not check).
    for d in (1, 5, 123, 4097, 11008, 14336):
        for rows in (1, 3, 64, 100_000):
            t = default_tactic(d, rows)
            for value in (t.block_d, t.rows, t.num_warps):
                assert value >= 1 and value & (value - 1) == 0, t


@pytest.mark.cuda
def test_cuda_back_to_back_with_pdl():
    """A chain of activations launched with PDL equals the chain without it."""
    x = torch.randn(33, 2 * 4096, dtype=torch.bfloat16, device="cuda")
    outs = []
    for pdl in (False, True):
        y = x
        for op, _ in OPS * 2:
            y = op(torch.cat([y, y], dim=-1), enable_pdl=pdl)
        outs.append(y)
    torch.testing.assert_close(outs[1], outs[0], atol=0, rtol=0)


def test_the_many_rows_default_matches_the_reference(device):
    """From 1024 rows the default launches column blocks first (cols_fastest); an odd width
    leaves a partial last block in every row band."""
    x = torch.randn(1030, 2 * 600, device=device)
    assert default_tactic(600, 1030).cols_fastest
    _close(GatedActivationRunner().forward([x, torch.empty(1030, 600, device=device), 0], -1),
           silu_and_mul_ref(x))  # fmt: skip

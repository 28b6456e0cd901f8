"""RMSNorm family against its references: CPU interpreter grids (fp16/fp32, odd hidden sizes,
strided and 3-D rows, both kernel paths), in-place semantics, bad input, torch.compile, and
bf16 / large shapes on the GPU."""

from __future__ import annotations

import json

import pytest
import torch

from flashtune.ops.norm import (
    fused_add_rmsnorm,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    rmsnorm,
)
from flashtune.ops.norm.config import RMSNormTactic, default_tactic
from flashtune.ops.norm.launch import RMSNormRunner
from flashtune.ops.norm.reference import (
    fused_add_rmsnorm_ref,
    gemma_fused_add_rmsnorm_ref,
    gemma_rmsnorm_ref,
    rmsnorm_ref,
)

TOL = {  # dtype -> (atol, rtol): one rounding of the output, summation order differs
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (3e-2, 3e-2),
}
CPU_DTYPES = [torch.float16, torch.float32]  # bf16 loads are wrong in Triton's interpreter
NORMS = [(rmsnorm, rmsnorm_ref), (gemma_rmsnorm, gemma_rmsnorm_ref)]
FUSED = [
    (fused_add_rmsnorm, fused_add_rmsnorm_ref),
    (gemma_fused_add_rmsnorm, gemma_fused_add_rmsnorm_ref),
]


def _expect_fused(ref, x, r, w, eps=1e-6):
    """(output, new residual) the fused ops must produce."""
    return ref(x, r, w, eps), (x.float() + r.float()).to(r.dtype)


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    atol, rtol = TOL[expected.dtype]
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("op,ref", NORMS, ids=["rmsnorm", "gemma"])
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("rows,hidden", [(1, 5), (7, 123), (3, 4097), (2, 16400)])
def test_rmsnorm_matches_reference(op, ref, dtype, rows, hidden, device):
    # 16400 > the single-block limit: exercises the two-pass kernel.
    x = torch.randn(rows, hidden, dtype=dtype, device=device)
    w = torch.randn(hidden, dtype=dtype, device=device)
    _close(op(x, w, eps=1e-5), ref(x, w, eps=1e-5))


@pytest.mark.parametrize("op,ref", FUSED, ids=["fused_add", "gemma_fused_add"])
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("rows,hidden", [(1, 5), (7, 123), (3, 4097), (2, 16400)])
def test_fused_add_is_in_place(op, ref, dtype, rows, hidden, device):
    x = torch.randn(rows, hidden, dtype=dtype, device=device)
    r = torch.randn(rows, hidden, dtype=dtype, device=device)
    w = torch.randn(hidden, dtype=dtype, device=device)
    expected_out, expected_res = _expect_fused(ref, x, r, w)
    x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
    assert op(x, r, w) is None
    assert (x.data_ptr(), r.data_ptr()) == (x_ptr, r_ptr)
    _close(r, expected_res)
    _close(x, expected_out)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_strided_rows_and_out(dtype, device):
    base = torch.randn(6, 200, dtype=dtype, device=device)
    x = base[:, :123]  # rows 200 apart
    w = torch.randn(123, dtype=dtype, device=device)
    out_base = torch.full((6, 150), 7.0, dtype=dtype, device=device)
    out = out_base[:, :123]
    assert rmsnorm(x, w, out=out) is out
    _close(out, rmsnorm_ref(x, w))
    assert torch.all(out_base[:, 123:] == 7.0), "wrote outside out's rows"


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_3d_inputs_including_non_flattenable(dtype, device):
    x = torch.randn(2, 3, 123, dtype=dtype, device=device)
    w = torch.randn(123, dtype=dtype, device=device)
    _close(rmsnorm(x, w), rmsnorm_ref(x, w))
    # [b, s, h] sliced along s: no 2-D view exists, the kernel addresses rows with 2 strides.
    xs = torch.randn(3, 8, 37, dtype=dtype, device=device)[:, ::3]
    ws = torch.randn(37, dtype=dtype, device=device)
    _close(rmsnorm(xs, ws), rmsnorm_ref(xs, ws))
    r = torch.randn(4, 5, 37, dtype=dtype, device=device).transpose(0, 1)  # strided too
    xr = torch.randn(5, 4, 37, dtype=dtype, device=device)
    expected_out, expected_res = _expect_fused(fused_add_rmsnorm_ref, xr, r, ws)
    fused_add_rmsnorm(xr, r, ws)
    _close(r, expected_res)
    _close(xr, expected_out)


@pytest.mark.parametrize("hidden", [123, 2500])
def test_every_tactic_is_correct(hidden, device):
    x = torch.randn(5, hidden, dtype=torch.float32, device=device)
    r = torch.randn(5, hidden, dtype=torch.float32, device=device)
    w = torch.randn(hidden, dtype=torch.float32, device=device)
    runner = RMSNormRunner()
    inputs = [x, w, torch.empty_like(x), None, 1e-6, 0.0]
    tactics = runner.get_valid_tactics(inputs, None)
    if hidden > 1024:
        assert any(t.block_n < hidden for t in tactics), "no two-pass tactic offered"
    expected = rmsnorm_ref(x, w)
    exp_out, exp_res = _expect_fused(fused_add_rmsnorm_ref, x, r, w)
    for tactic in [-1, *tactics]:
        out = runner.forward([x, w, torch.empty_like(x), None, 1e-6, 0.0], tactic)
        _close(out, expected)
        xf, rf = x.clone(), r.clone()
        runner.forward([xf, w, xf, rf, 1e-6, 0.0], tactic)
        _close(xf, exp_out)
        _close(rf, exp_res)


def test_default_tactics_cover_any_hidden():
    for hidden in (1, 5, 127, 128, 4096, 5120, 16384, 16385, 100_000):
        for rows in (1, 100, 100_000):
            t = default_tactic(hidden, rows)
            for value in (t.block_n, t.rows, t.num_warps):  # Triton needs powers of two
                assert value >= 1 and value & (value - 1) == 0, t
            assert t.block_n >= hidden or t.rows == 1
            assert t in RMSNormTactic.space(hidden) or t.block_n < hidden


def test_zero_rows(device):
    x = torch.randn(0, 64, device=device)
    assert rmsnorm(x, torch.randn(64, device=device)).shape == (0, 64)


# ---------------------------------------------------------------------------------- bad input


def test_bad_inputs_are_rejected_with_clear_errors():
    x = torch.randn(4, 16)
    w = torch.randn(16)
    with pytest.raises(TypeError, match="input must be float16, bfloat16 or float32"):
        rmsnorm(x.to(torch.int32), w)
    with pytest.raises(TypeError, match="weight must have dtype torch.float32"):
        rmsnorm(x, w.half())
    with pytest.raises(ValueError, match=r"weight must have shape \(16,\).*\(15,\)"):
        rmsnorm(x, torch.randn(15))
    with pytest.raises(ValueError, match="weight is on meta but input is on cpu"):
        rmsnorm(x, torch.randn(16, device="meta"))
    with pytest.raises(ValueError, match="must be 2-D .* or 3-D"):
        rmsnorm(torch.randn(16), w)
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        rmsnorm(torch.randn(16, 4).t(), w)
    with pytest.raises(ValueError, match=r"out must have input's shape"):
        rmsnorm(x, w, out=torch.empty(4, 15))
    with pytest.raises(ValueError, match=r"residual must have input's shape"):
        fused_add_rmsnorm(x, torch.randn(3, 16), w)
    with pytest.raises(TypeError, match="residual must have dtype"):
        fused_add_rmsnorm(x, torch.randn(4, 16).half(), w)
    with pytest.raises(ValueError, match="residual is on meta"):
        fused_add_rmsnorm(x, torch.randn(4, 16, device="meta"), w)
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        rmsnorm(x, [1.0] * 16)
    # The kernel reads weight with stride 1: a strided one would be read wrong, not copied.
    with pytest.raises(ValueError, match="weight must be contiguous in its last dimension"):
        rmsnorm(x, torch.randn(32)[::2])
    # Merged leading dimensions are not enough: out has input's shape exactly.
    with pytest.raises(ValueError, match=r"out must have input's shape \(4, 16\)"):
        rmsnorm(x, w, out=torch.empty(2, 2, 16))


# ------------------------------------------------------------------------------ torch.compile


def test_custom_ops_pass_opcheck(device):
    x = torch.randn(3, 40, device=device)
    w = torch.randn(40, device=device)
    out = torch.library.opcheck(
        torch.ops.flashtune.rmsnorm_out.default, (x, w, torch.empty_like(x), 1e-6, 0.0)
    )
    r = torch.randn(3, 40, device=device)
    fused = torch.library.opcheck(
        torch.ops.flashtune.fused_add_rmsnorm.default, (x, r, w, 1e-6, 1.0)
    )
    # opcheck raises on a failed check; every check it ran must report success.
    for results in (out, fused):
        assert results and set(results.values()) == {"SUCCESS"}, results


def test_torch_compile_traces_through(device):
    def block(x, r, w):
        y = rmsnorm(x, w)
        fused_add_rmsnorm(y, r, w)
        return y * 2

    x = torch.randn(5, 64, device=device)
    r = torch.randn(5, 64, device=device)
    w = torch.randn(64, device=device)
    r_eager = r.clone()
    expected = block(x.clone(), r_eager, w)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    r_comp = r.clone()
    _close(compiled(x.clone(), r_comp, w), expected)
    _close(r_comp, r_eager)


# ---------------------------------------------------------------------------------------- GPU


@pytest.mark.parametrize("enable_pdl", [None, False, True])
def test_enable_pdl_is_accepted_and_changes_nothing(enable_pdl, device):
    """FlashInfer's signature: enable_pdl on every norm. Off the GPU (and before Hopper) it is
    accepted and ignored; where it is used, it changes when the kernel starts, not what it
    computes."""
    x = torch.randn(5, 300, dtype=torch.float16, device=device)
    w = torch.randn(300, dtype=torch.float16, device=device)
    for op, ref in NORMS:
        _close(op(x, w, enable_pdl=enable_pdl), ref(x, w))
    for op, ref in FUSED:
        xi, r = x.clone(), torch.randn_like(x)
        expected, residual = _expect_fused(ref, xi, r, w)
        op(xi, r, w, enable_pdl=enable_pdl)
        _close(xi, expected)
        _close(r, residual)
    with pytest.raises(TypeError, match="enable_pdl"):
        rmsnorm(x, w, enable_pdl="yes")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("rows", [1, 33, 4096])
@pytest.mark.parametrize("hidden", [128, 2048, 4096, 5120, 7168, 8192, 16384, 20000])
def test_cuda_grid(dtype, rows, hidden):
    x = torch.randn(rows, hidden, dtype=dtype, device="cuda")
    r = torch.randn(rows, hidden, dtype=dtype, device="cuda")
    w = torch.randn(hidden, dtype=dtype, device="cuda")
    _close(rmsnorm(x, w), rmsnorm_ref(x, w))
    _close(gemma_rmsnorm(x, w), gemma_rmsnorm_ref(x, w))
    exp_out, exp_res = _expect_fused(fused_add_rmsnorm_ref, x, r, w)
    fused_add_rmsnorm(x, r, w)
    _close(r, exp_res)
    _close(x, exp_out)


@pytest.mark.cuda
def test_cuda_every_tactic_bf16():
    x = torch.randn(300, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    runner = RMSNormRunner()
    expected = rmsnorm_ref(x, w)
    for tactic in runner.get_valid_tactics([x, w, None, None, 1e-6, 0.0], None):
        _close(runner.forward([x, w, torch.empty_like(x), None, 1e-6, 0.0], tactic), expected)


@pytest.mark.cuda
def test_cuda_rejects_cpu_weight():
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(ValueError, match="weight is on cpu but input is on cuda"):
        rmsnorm(x, torch.randn(64))


# ------------------------------------------------------------------------------------ schemas


def _same_definition(ours, theirs: dict) -> None:
    d = json.loads(ours.to_json())
    assert d["name"] == theirs["name"]
    assert d["op_type"] == theirs["op_type"]
    assert {k: (v["type"], v.get("value")) for k, v in d["axes"].items()} == {
        k: (v["type"], v.get("value")) for k, v in theirs["axes"].items()
    }
    for kind in ("inputs", "outputs"):
        assert {k: (v.get("shape"), v["dtype"]) for k, v in d[kind].items()} == {
            k: (v.get("shape"), v["dtype"]) for k, v in theirs[kind].items()
        }


def _run_source(source: str):
    scope: dict = {}
    exec(source, scope)
    return scope["run"]


@pytest.mark.parametrize(
    "op,name", [(rmsnorm, "rmsnorm"), (fused_add_rmsnorm, "fused_add_rmsnorm")]
)
def test_definition_equals_corpus(trace_corpus, op, name):
    theirs = json.loads((trace_corpus / f"definitions/rmsnorm/{name}_h4096.json").read_text())
    x = torch.randn(3, 4096, dtype=torch.bfloat16)
    w = torch.randn(4096, dtype=torch.bfloat16)
    args = (x, w) if name == "rmsnorm" else (x, torch.randn_like(x), w)
    ours = op.definition(*args, eps=1e-5)
    _same_definition(ours, theirs)
    # Our emitted reference computes what the corpus reference computes.
    torch.testing.assert_close(
        _run_source(ours.reference)(*args), _run_source(theirs["reference"])(*args)
    )


def test_definitions_for_3d_inputs_and_meta_tensors():
    x = torch.empty(2, 5, 123, dtype=torch.float16, device="meta")
    w = torch.empty(123, dtype=torch.float16, device="meta")
    assert rmsnorm.definition(x, w).name == "rmsnorm_h123"
    assert gemma_rmsnorm.definition(x, w).name == "gemma_rmsnorm_h123"
    d = gemma_fused_add_rmsnorm.definition(x, x, w)
    assert d.name == "gemma_fused_add_rmsnorm_h123"
    assert d.inputs["residual"].dtype == "float16"


@pytest.mark.cuda
@pytest.mark.parametrize("hidden", [111, 4096, 16384])
def test_cuda_back_to_back_with_pdl(hidden):
    """Each kernel of a PDL chain reads what the one before it wrote (it waits before its
    first load): a chain of fused add + norm calls equals the same chain without PDL."""
    x = torch.randn(67, hidden, dtype=torch.bfloat16, device="cuda")
    r = torch.randn_like(x)
    w = torch.randn(hidden, dtype=torch.bfloat16, device="cuda")
    outs = []
    for pdl in (False, True):
        xi, ri = x.clone(), r.clone()
        for _ in range(4):
            fused_add_rmsnorm(xi, ri, w, enable_pdl=pdl)
            xi = rmsnorm(xi, w, enable_pdl=pdl)
        outs.append((xi, ri))
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=0, rtol=0)
    torch.testing.assert_close(outs[1][1], outs[0][1], atol=0, rtol=0)

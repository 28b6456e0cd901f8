"""PatchManager, ArgBinder, ContextStore, and the built-in adapters (torch linear; FlashInfer's
functions and wrappers, against a stand-in `flashinfer` module with the same signatures)."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _apply_helpers import GEMM_SRC, NORM_SRC, add_traces, calls_of, plant, trace

from flashtune.apply import ArgBinder, ContextStore, PatchManager, enable_adapters, enable_apply
from flashtune.apply.adapters import builtin_adapters, resolve_target
from flashtune.data import Dataset, Definition
from flashtune.ops.attention import paged_decode
from flashtune.ops.norm import fused_add_rmsnorm, rmsnorm

# --------------------------------------------------------------------------- patching


def target_function(x: int) -> int:
    return x + 1


class Base:
    def method(self, x: int) -> int:
        return x * 2

    @staticmethod
    def static(x: int) -> int:
        return x * 3

    @classmethod
    def klass(cls, x: int) -> str:
        return f"{cls.__name__}{x}"


class Child(Base):
    pass


MOD = __name__


def _plus100(original):
    def wrapped(*args, **kwargs):
        return ("patched", original(*args, **kwargs))

    return wrapped


def test_patch_and_unpatch_function_and_methods() -> None:
    raw = {k: Base.__dict__[k] for k in ("method", "static", "klass")}
    with PatchManager() as pm:
        pm.patch(f"{MOD}.target_function", _plus100)
        pm.patch(f"{MOD}.Base.method", _plus100)
        pm.patch(f"{MOD}.Base.static", _plus100)
        pm.patch(f"{MOD}.Base.klass", _plus100)
        pm.patch(f"{MOD}.Child.method", _plus100)  # inherited: restored by deletion
        mod = sys.modules[MOD]
        assert mod.target_function(1) == ("patched", 2)
        assert Base().method(2) == ("patched", 4)
        assert Base.static(2) == ("patched", 6) and Base().static(2) == ("patched", 6)
        assert Child.klass(1) == ("patched", "Child1")
        assert Child().method(1) == ("patched", ("patched", 2))
        assert pm.is_patched(f"{MOD}.Base.method") and len(pm.targets) == 5
    assert target_function(1) == 2
    assert Base().method(2) == 4 and Base.static(2) == 6 and Child.klass(1) == "Child1"
    assert "method" not in Child.__dict__
    assert all(Base.__dict__[k] is v for k, v in raw.items())


def test_patch_twice_replaces_and_bad_targets_raise() -> None:
    pm = PatchManager()
    pm.patch(f"{MOD}.target_function", _plus100)
    pm.patch(f"{MOD}.target_function", _plus100)
    assert sys.modules[MOD].target_function(1) == ("patched", 2)
    pm.unpatch_all()
    assert target_function(1) == 2
    with pytest.raises(AttributeError):
        resolve_target(f"{MOD}.nope")
    with pytest.raises(ImportError):
        resolve_target("no_such_package_xyz.f")


def test_arg_binder() -> None:
    def f(input, weight, eps=1e-6, *, out=None):
        pass

    b = ArgBinder(f, rename={"input": "hidden_states"})
    expected = {"hidden_states": 1, "weight": 2, "eps": 1e-6, "out": None}
    assert b.bind((1, 2), {}) == expected
    assert b.bind((), {"input": 1, "weight": 2}) == expected
    assert b.bind((1,), {"weight": 2, "eps": 0.1})["eps"] == 0.1
    with pytest.raises(TypeError):
        b.bind((1,), {})
    with pytest.raises(TypeError):
        b.bind((1, 2), {"bogus": 3})

    def g(*args, **kwargs):
        pass

    assert ArgBinder(g).bind((1,), {"a": 2}) == {"args": (1,), "kwargs": {"a": 2}}


def test_context_store() -> None:
    store = ContextStore()

    class W:
        pass

    w = W()
    store.set(w, a=1)
    assert store.get(w) == {"a": 1}
    key = (1, 2)
    store.set(key, b=2)  # tuples are not weak-referenceable: kept by id
    assert store.get(key) == {"b": 2}
    store.clear(w)
    assert store.get(w) == {}
    w2 = W()
    store.set(w2, x=1)
    del w2  # weakly keyed: state goes with the object
    assert len(store._weak) == 0


# --------------------------------------------------------------------------- linear


def test_linear_adapter_dispatches_and_restores(tmp_path: Path, caplog) -> None:
    ds = Dataset(tmp_path)
    ds.add_definition(
        Definition.model_validate(
            {
                "name": "gemm_n8_k4",
                "op_type": "gemm",
                "axes": {
                    "M": {"type": "var"},
                    "N": {"type": "const", "value": 8},
                    "K": {"type": "const", "value": 4},
                },
                "inputs": {
                    "A": {"shape": ["M", "K"], "dtype": "float32"},
                    "B": {"shape": ["N", "K"], "dtype": "float32"},
                },
                "outputs": {"C": {"shape": ["M", "N"], "dtype": "float32"}},
                "reference": "def run(A, B):\n    return A @ B.T\n",
            }
        )
    )
    sol = plant(ds, "gemm_n8_k4", "planted", GEMM_SRC)
    add_traces(ds, [trace("gemm_n8_k4", "planted", {"M": 4}, 0.1)])
    original = F.linear
    x, w = torch.randn(2, 3, 4), torch.randn(8, 4)
    with (
        enable_apply(dataset=ds),
        enable_adapters([s for s in builtin_adapters() if "linear" in s.target]),
    ):
        assert F.linear is not original
        y = torch.nn.functional.linear(x, w)
        assert y.shape == (2, 3, 8)
        torch.testing.assert_close(y, x @ w.T)
        assert calls_of(sol)[-1] == (6, 4)
        n = len(calls_of(sol))
        F.linear(x, w, torch.randn(8))  # bias: no definition, original
        F.linear(torch.randn(2, 5), torch.randn(8, 5))  # gemm_n8_k5: not in the table
        layer = torch.nn.Linear(4, 8, bias=False)
        layer(torch.randn(1, 4))  # nn.Linear goes through F.linear
        assert len(calls_of(sol)) == n + 1
        # float64: the same name gemm_n8_k4, but the winner was benchmarked in float32
        xd, wd = x.double(), w.double()
        with caplog.at_level("WARNING", "flashtune.apply"):
            torch.testing.assert_close(F.linear(xd, wd), xd @ wd.T)
        assert len(calls_of(sol)) == n + 1
        assert any("float64" in r.getMessage() for r in caplog.records)
    assert F.linear is original


# --------------------------------------------------------------------------- flashinfer


def _fake_flashinfer() -> dict[str, types.ModuleType]:
    """A stand-in for FlashInfer with its signatures (0.2.x); the originals compute with
    torch and count calls, so a test sees whether the patch or the original ran."""
    calls: list[str] = []
    fi = types.ModuleType("flashinfer")
    norm = types.ModuleType("flashinfer.norm")
    decode = types.ModuleType("flashinfer.decode")
    prefill = types.ModuleType("flashinfer.prefill")

    def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
        calls.append("rmsnorm")
        x = input.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight).to(input.dtype)

    def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
        calls.append("fused_add_rmsnorm")
        residual.add_(input)
        input.copy_(rmsnorm(residual, weight, eps))

    class BatchDecodeWithPagedKVCacheWrapper:
        def __init__(self, workspace_buffer, kv_layout="NHD"):
            self._kv_layout = kv_layout

        def plan(
            self,
            indptr,
            indices,
            last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            pos_encoding_mode="NONE",
            window_left=-1,
            logits_soft_cap=None,
            q_data_type="float16",
            kv_data_type=None,
            data_type=None,
            sm_scale=None,
            rope_scale=None,
            rope_theta=None,
            non_blocking=True,
        ):
            calls.append("plan")

        def run(
            self,
            q,
            paged_kv_cache,
            *args,
            q_scale=None,
            k_scale=None,
            v_scale=None,
            out=None,
            lse=None,
            return_lse=False,
            enable_pdl=None,
            window_left=None,
        ):
            calls.append("run")
            return torch.zeros_like(q)

    norm.rmsnorm, norm.fused_add_rmsnorm = rmsnorm, fused_add_rmsnorm
    fi.rmsnorm, fi.fused_add_rmsnorm = rmsnorm, fused_add_rmsnorm
    decode.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
    fi.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
    fi.norm, fi.decode, fi.prefill = norm, decode, prefill
    fi.calls = calls
    fi.__spec__ = types.SimpleNamespace(name="flashinfer")  # find_spec() sees it
    return {
        "flashinfer": fi,
        "flashinfer.norm": norm,
        "flashinfer.decode": decode,
        "flashinfer.prefill": prefill,
    }


DECODE_TABLE = (
    torch.tensor([0, 1, 3], dtype=torch.int32),  # kv_indptr
    torch.tensor([0, 1, 2], dtype=torch.int32),  # kv_indices
    torch.ones(2, dtype=torch.int32),  # kv_last_page_len
)


def _definitions(x: torch.Tensor, w: torch.Tensor, q: torch.Tensor, kv: torch.Tensor):
    """The Definitions of the calls below, from flashtune's op schemas (as the adapters
    name them)."""
    return [
        rmsnorm.definition(x, w),
        fused_add_rmsnorm.definition(x, x, w),
        paged_decode.definition(q, kv, *DECODE_TABLE),
    ]


DECODE_SRC = """CALLS = []

def run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    CALLS.append(sm_scale)
    return q * 2, q[..., 0].float()
"""


def test_flashinfer_adapters(tmp_path: Path, monkeypatch) -> None:
    mods = _fake_flashinfer()
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    fi = mods["flashinfer"]
    ds = Dataset(tmp_path)
    x, w = torch.randn(2, 16), torch.rand(16) + 0.5
    q, kv = torch.randn(2, 4, 8), torch.randn(3, 2, 1, 2, 8)
    definitions = _definitions(x, w, q, kv)
    assert [d.name for d in definitions] == [
        "rmsnorm_h16",
        "fused_add_rmsnorm_h16",
        "gqa_paged_decode_h4_kv2_d8_ps1",
    ]
    for definition in definitions:
        ds.add_definition(definition)
    norm_sol = plant(ds, "rmsnorm_h16", "fast", NORM_SRC)
    fused_src = NORM_SRC.replace(
        "def run(hidden_states, weight)", "def run(hidden_states, residual, weight)"
    ).replace("x = hidden_states.float()", "x = (hidden_states + residual).float()")
    fused_sol = plant(ds, "fused_add_rmsnorm_h16", "fast", fused_src)
    dec_sol = plant(ds, "gqa_paged_decode_h4_kv2_d8_ps1", "fast", DECODE_SRC)
    add_traces(
        ds,
        [
            trace("rmsnorm_h16", "fast", {"batch_size": 2}, 0.1),
            trace("fused_add_rmsnorm_h16", "fast", {"batch_size": 2}, 0.1),
            trace(
                "gqa_paged_decode_h4_kv2_d8_ps1",
                "fast",
                {"batch_size": 2, "num_pages": 3, "len_indptr": 3, "num_kv_indices": 3},
                0.1,
            ),
        ],
    )
    specs = builtin_adapters()
    targets = {s.target for s in specs}
    assert {
        "flashinfer.rmsnorm",
        "flashinfer.norm.fused_add_rmsnorm",
        "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run",
    } <= targets
    originals = (
        fi.rmsnorm,
        fi.norm.fused_add_rmsnorm,
        fi.decode.BatchDecodeWithPagedKVCacheWrapper.run,
    )
    with enable_apply(dataset=ds), enable_adapters(specs):
        expected = originals[0](x, w)
        fi.calls.clear()
        torch.testing.assert_close(fi.rmsnorm(x, w), expected)
        out = torch.empty_like(x)
        assert fi.norm.rmsnorm(x, w, out=out) is out
        assert calls_of(norm_sol)[-2:] == [(2, 16), (2, 16)] and fi.calls == []
        fi.rmsnorm(torch.randn(2, 8), torch.randn(8))  # rmsnorm_h8: not in table
        assert fi.calls == ["rmsnorm"]

        inp, res = torch.randn(2, 16), torch.randn(2, 16)
        inp2, res2 = inp.clone(), res.clone()
        fi.calls.clear()
        fi.fused_add_rmsnorm(inp, res, w)
        assert fi.calls == [] and len(calls_of(fused_sol)) == 1
        originals[1](inp2, res2, w)
        torch.testing.assert_close(res, res2)
        torch.testing.assert_close(inp, inp2)

        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1))
        wrapper.plan(*DECODE_TABLE, 4, 2, 8, 1)
        fi.calls.clear()
        o, lse = wrapper.run(q, kv, return_lse=True)
        torch.testing.assert_close(o, q * 2)
        assert fi.calls == [] and calls_of(dec_sol) == [pytest.approx(1 / math.sqrt(8))]
        indptr = DECODE_TABLE[0]
        wrapper.plan(indptr, indptr, indptr, 4, 2, 8, 1, pos_encoding_mode="ROPE_LLAMA")
        fi.calls.clear()
        wrapper.run(q, kv)  # a feature no definition covers: original
        assert fi.calls == ["run"]
    assert (
        fi.rmsnorm,
        fi.norm.fused_add_rmsnorm,
        fi.decode.BatchDecodeWithPagedKVCacheWrapper.run,
    ) == originals

"""The FlashInfer attention adapters' setup phase, on the CPU: a stand-in `flashinfer` module
whose wrappers record their plan() and run() calls (and compute with the torch baselines)
shows that setup plans once per distinct index set, that a runner only runs and reads the
float inputs at call time, that a direct call still plans and runs, and that the decode
backend follows FlashInfer's group-size rule."""

from __future__ import annotations

import gc
import math
import sys
import types

import pytest
import torch

from flashtune.bench import entry_points as ep
from flashtune.cli import bundled_dataset
from flashtune.data import Dataset, synthesize_inputs
from flashtune.ops.attention.bundle import flashinfer_decode_uses_tensor_cores
from flashtune.ops.bundle import planned

DS = Dataset(bundled_dataset())
DECODE = "gqa_paged_decode_h32_kv8_d128_ps16"
PAGED = "gqa_paged_prefill_causal_h32_kv8_d128_ps16"
RAGGED = "gqa_ragged_prefill_causal_h32_kv8_d128"
PLANNED = {  # entry point -> definition
    "flashinfer_gqa_paged_decode": DECODE,
    "flashinfer_gqa_paged_decode_tensor_cores": DECODE,
    "flashinfer_gqa_paged_decode_cuda_cores": DECODE,
    "flashinfer_gqa_paged_prefill": PAGED,
    "flashinfer_gqa_ragged_prefill": RAGGED,
}
# Both block-sparse wrappers plan once too (tested in tests/dataset/test_bundled.py).
BLOCK_SPARSE_PLANNED = {"flashtune_block_sparse_attention", "flashinfer_block_sparse_attention"}


class _Log(list):
    def kinds(self) -> list[str]:
        return [event[0] for event in self]


class _Wrapper:
    """Records init/plan/run; run() computes with the torch baseline from the planned index
    tensors and the call's float tensors."""

    log: _Log

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_tensor_cores=False, **kw):
        assert kv_layout == "NHD" and not kw
        self.workspace = float_workspace_buffer
        self.use_tensor_cores = use_tensor_cores
        self.planned: tuple | None = None
        self.log.append(("init", type(self).__name__, use_tensor_cores))

    def plan(self, *args, **kwargs):
        self.planned = (args, kwargs)
        self.log.append(("plan", type(self).__name__, args, kwargs))

    def _check_run(self, return_lse):
        assert self.planned is not None, "run() before plan()"
        assert return_lse is True
        self.log.append(("run", type(self).__name__))


class _Decode(_Wrapper):
    def run(self, q, paged_kv_cache, return_lse=False):
        self._check_run(return_lse)
        (indptr, indices, last, *_), kw = self.planned
        k_cache, v_cache = paged_kv_cache
        return ep.torch_gqa_paged_decode(q, k_cache, v_cache, indptr, indices, last, kw["sm_scale"])


class _PagedPrefill(_Wrapper):
    def run(self, q, paged_kv_cache, return_lse=False):
        self._check_run(return_lse)
        (qo_indptr, indptr, indices, last, *_), kw = self.planned
        assert kw["causal"] is True
        k_cache, v_cache = paged_kv_cache
        return ep.torch_gqa_paged_prefill(
            q, k_cache, v_cache, qo_indptr, indptr, indices, last, kw["sm_scale"]
        )


class _RaggedPrefill(_Wrapper):
    def run(self, q, k, v, return_lse=False):
        self._check_run(return_lse)
        (qo_indptr, kv_indptr, *_), kw = self.planned
        assert kw["causal"] is True
        return ep.torch_gqa_ragged_prefill(q, k, v, qo_indptr, kv_indptr, kw["sm_scale"])


@pytest.fixture
def fake_flashinfer(monkeypatch) -> _Log:
    log = _Log()
    module = types.ModuleType("flashinfer")
    for name, base in (
        ("BatchDecodeWithPagedKVCacheWrapper", _Decode),
        ("BatchPrefillWithPagedKVCacheWrapper", _PagedPrefill),
        ("BatchPrefillWithRaggedKVCacheWrapper", _RaggedPrefill),
    ):
        setattr(module, name, type(name, (base,), {"log": log}))
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setattr(planned, "_WORKSPACE_BYTES", 1024)  # no 128 MB buffer here
    monkeypatch.setattr(planned, "_workspaces", {})
    monkeypatch.setattr(planned, "_plans", type(planned._plans)())
    return log


def _args(definition: str, seed: int = 1) -> list:
    d = DS.definition(definition)
    w = DS.workloads_for(definition)[0].workload
    inputs = synthesize_inputs(d, w, device="cpu", seed=seed, blob_root=DS)
    return [inputs[k] for k in d.inputs]


def _torch_twin(entry: str):
    return getattr(ep, "torch_" + PLANNED[entry].split("_h")[0].replace("_causal", ""))


def _same(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def _refill_floats(args: list) -> None:
    """New float values in the same tensors (index tensors unchanged), as the harness does."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
            a.copy_(torch.randn(a.shape, generator=torch.Generator().manual_seed(7)))


@pytest.mark.parametrize("entry", sorted(PLANNED))
def test_setup_plans_once_and_the_runner_only_runs(fake_flashinfer, entry):
    fn = getattr(ep, entry)
    args = _args(PLANNED[entry])
    runner = fn.setup(*args)
    assert fake_flashinfer.kinds() == ["init", "plan"]
    fake_flashinfer.clear()
    for _ in range(3):
        got = runner(*args)
    assert fake_flashinfer.kinds() == ["run"] * 3
    _same(got, _torch_twin(entry)(*args))

    _refill_floats(args)  # the runner reads q / K / V when called, not at setup
    _same(runner(*args), _torch_twin(entry)(*args))
    assert fake_flashinfer.kinds() == ["run"] * 4


@pytest.mark.parametrize("entry", sorted(PLANNED))
def test_direct_call_still_plans_and_runs_every_call(fake_flashinfer, entry):
    fn = getattr(ep, entry)
    args = _args(PLANNED[entry])
    _same(fn(*args), _torch_twin(entry)(*args))
    fn(*args)
    assert fake_flashinfer.kinds() == ["init", "plan", "run"] * 2
    names = list(DS.definition(PLANNED[entry]).inputs)
    fn(**dict(zip(names, args, strict=True)))  # by keyword, as a user may call it
    assert fake_flashinfer.kinds()[-3:] == ["init", "plan", "run"]
    assert len(planned._plans) == 0  # a direct call leaves no plan behind


@pytest.mark.parametrize("entry", ["torch_gqa_paged_prefill", "flashinfer_gqa_paged_prefill"])
def test_page_size_one_prefill_without_kv_last_page_len(fake_flashinfer, entry):
    """FlashInfer-Trace's ps1 paged prefill definitions list no kv_last_page_len (every page
    is full): by position (sm_scale in its place) or by keyword, the entries run as with a
    last page of one token each."""
    fn = getattr(ep, entry)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(7, 4, 8, generator=gen)
    k_cache, v_cache = torch.randn(2, 20, 1, 2, 8, generator=gen).unbind(0)
    qo_indptr = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    kv_indices = torch.randperm(20, generator=gen)[:13].to(torch.int32)
    scale = 0.3
    table = (q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices)
    want = ep.torch_gqa_paged_prefill(*table, torch.ones(3, dtype=torch.int32), scale)
    names = ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices")
    _same(fn(*table, scale), want)
    _same(fn(**dict(zip(names, table, strict=True)), sm_scale=scale), want)
    with pytest.raises(TypeError, match="sm_scale"):
        fn(*table)


def test_identical_index_sets_share_one_plan_and_distinct_ones_do_not(fake_flashinfer):
    fn = ep.flashinfer_gqa_paged_decode
    a = _args(DECODE, seed=1)
    clone = [x.clone() if isinstance(x, torch.Tensor) else x for x in a]  # a cold-L2 copy
    _refill_floats(clone)
    first, second = fn.setup(*a), fn.setup(*clone)
    assert fake_flashinfer.kinds().count("plan") == 1
    _same(second(*clone), ep.torch_gqa_paged_decode(*clone))  # its own q / K / V

    other = [x.clone() if isinstance(x, torch.Tensor) else x for x in a]
    other[5] -= 1  # kv_last_page_len: same shapes, another index set
    third = fn.setup(*other)
    assert fake_flashinfer.kinds().count("plan") == 2
    _same(third(*other), ep.torch_gqa_paged_decode(*other))

    # The variants never share a plan with the default, even on the same index set.
    ep.flashinfer_gqa_paged_decode_cuda_cores.setup(*a)
    assert fake_flashinfer.kinds().count("plan") == 3

    # A plan lives as long as a runner uses it.
    del first, second, third
    gc.collect()
    fake_flashinfer.clear()
    fn.setup(*a)
    assert fake_flashinfer.kinds() == ["init", "plan"]


def _decode_args(hq: int, hk: int, dtype=torch.bfloat16) -> list:
    g = torch.Generator().manual_seed(0)
    pages, ps, d = 6, 16, 64
    q = torch.randn(2, hq, d, generator=g).to(torch.bfloat16)
    k = torch.randn(pages, ps, hk, d, generator=g).to(dtype)
    v = torch.randn(pages, ps, hk, d, generator=g).to(dtype)
    indptr = torch.tensor([0, 2, 5], dtype=torch.int32)
    indices = torch.tensor([4, 0, 1, 5, 3], dtype=torch.int32)
    last = torch.tensor([7, 16], dtype=torch.int32)
    return [q, k, v, indptr, indices, last, 1 / math.sqrt(d)]


@pytest.mark.parametrize(
    ("hq", "hk", "dtype", "tensor_cores"),
    [
        (32, 8, torch.bfloat16, True),  # group 4: Llama-3.1-8B, Qwen3-8B
        (8, 1, torch.bfloat16, True),  # group 8: Llama-3.1-70B at TP 8
        (12, 4, torch.float16, False),  # group 3
        (16, 8, torch.bfloat16, False),  # group 2
        (8, 8, torch.bfloat16, False),  # MHA
        (8, 8, torch.float8_e4m3fn, True),  # fp8 KV: tensor cores at any group size
    ],
)
def test_decode_backend_follows_flashinfers_group_size_rule(hq, hk, dtype, tensor_cores):
    assert flashinfer_decode_uses_tensor_cores(hq, hk, dtype) is tensor_cores


@pytest.mark.parametrize(("hq", "hk"), [(32, 8), (16, 8)])
def test_decode_entries_build_the_wrapper_on_the_chosen_backend(fake_flashinfer, hq, hk):
    args = _decode_args(hq, hk)
    rule = hq // hk >= 4
    for entry, expected in (
        (ep.flashinfer_gqa_paged_decode, rule),
        (ep.flashinfer_gqa_paged_decode_tensor_cores, True),
        (ep.flashinfer_gqa_paged_decode_cuda_cores, False),
    ):
        fake_flashinfer.clear()
        runner = entry.setup(*args)
        assert fake_flashinfer[0] == ("init", "BatchDecodeWithPagedKVCacheWrapper", expected)
        _same(runner(*args), ep.torch_gqa_paged_decode(*args))


MLA_PLANNED = {
    "flashinfer_mla_paged_decode",
    "flashinfer_mla_paged_prefill",
    "flashinfer_mla_ragged_prefill",
}


def test_only_planned_adapters_have_a_setup():
    for name in dir(ep):
        fn = getattr(ep, name)
        if name.startswith(("flashtune_", "torch_", "flashinfer_")) and callable(fn):
            # FlashInfer's MLA wrappers plan in setup too (ops/mla/bundle.py).
            planned = name in PLANNED or name in BLOCK_SPARSE_PLANNED or name in MLA_PLANNED
            assert callable(getattr(fn, "setup", None)) == planned, name


@pytest.mark.cuda
@pytest.mark.parametrize("entry", ["flashtune_gqa_paged_decode", "flashtune_gqa_paged_prefill"])
def test_plan_free_entries_take_the_page_table_on_the_host(entry):
    """Under apply a solution gets what a planned wrapper was given, and FlashInfer-style
    wrappers take the page table on the host: the plan-free entries move it to q's device
    (the H100 loop's decode solution raised 'kv_indptr is on cpu but q is on cuda:0')."""
    name = DECODE if "decode" in entry else PAGED
    definition = DS.definitions[name]
    workload = DS.workloads_for(name)[0].workload
    inputs = synthesize_inputs(definition, workload, device="cuda", blob_root=DS)
    fn = getattr(ep, entry)
    on_device = fn(*inputs.values())
    on_host = fn(
        *(
            x.cpu() if isinstance(x, torch.Tensor) and x.dtype == torch.int32 else x
            for x in inputs.values()
        )
    )
    for a, b in zip(on_device, on_host, strict=True):
        torch.testing.assert_close(a, b)

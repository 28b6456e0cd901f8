"""A new batch must not compile a new kernel variant.

Triton compiles one variant per specialization key: every constexpr, and for the other
arguments the dtype, whether an int equals 1 or is a multiple of 16, and whether a pointer is
16-byte aligned. Serving runs a new batch (sizes, lengths) every step, and a key that follows
it means a compile (seconds) in the middle of serving. Here every attention kernel launch
records its key, computed as `JITFunction.run` does (Triton 3.6), and skips the kernel
itself: only plans and launch arguments matter, so the tests are fast on the interpreter.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from flashtune.ops.attention import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge,
    paged_decode,
    paged_prefill,
)
from flashtune.ops.attention.decode import kernels as decode_kernels
from flashtune.ops.attention.decode import plan_free as decode_plan_free
from flashtune.ops.attention.page import build_page_table
from flashtune.ops.attention.prefill import kernels as prefill_kernels

jit = pytest.importorskip("triton.runtime.jit")

KERNELS = {
    "paged_attn": (decode_kernels, "paged_attn_kernel"),
    "merge_partials": (merge, "_merge_partials_kernel"),
    "plan_free_decode": (decode_plan_free, "_plan_free_decode_kernel"),
    "prefill": (prefill_kernels, "prefill_kernel"),
}
HQ, HK, D, PS = 8, 2, 64, 16


def _binder(kernel: Any) -> Callable[..., Any]:
    """Triton's own (args -> specialization) function for `kernel`, jitted or interpreted."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    fn = getattr(kernel, "fn", kernel)
    sig = inspect.signature(fn)
    if hasattr(kernel, "params"):  # a JITFunction: its parameters are built already
        params = kernel.params
    else:  # an InterpretedFunction keeps the jit options
        dns = kernel.kwargs.get("do_not_specialize") or []
        dna = kernel.kwargs.get("do_not_specialize_on_alignment") or []
        params = [
            jit.KernelParam(i, p, i in dns or p.name in dns, i in dna or p.name in dna)
            for i, p in enumerate(sig.parameters.values())
        ]
    backend = make_backend(GPUTarget("cuda", 90, 32))
    return jit.create_function_from_signature(sig, params, backend)


@pytest.fixture
def variants(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, set[Any]]]:
    """Per kernel, the set of specialization keys launched (the kernels do not run)."""
    keys: dict[str, set[Any]] = defaultdict(set)
    for name, (module, attr) in KERNELS.items():
        kernel = getattr(module, attr)
        bind = _binder(kernel)

        def record(*args: Any, grid: Any, warmup: bool, _n=name, _b=bind, **kwargs: Any) -> None:
            _, spec, options = _b(*args, **kwargs)
            keys[_n].add((tuple(spec), tuple(sorted(options.items()))))

        monkeypatch.setattr(kernel, "run", record)
    yield keys


def _batch(seed: int, batch: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 3000, batch)
    qo_lens = np.minimum(rng.integers(1, 40, batch), lens)
    indptr, indices, last, num_pages = build_page_table(lens.tolist(), PS)
    qo = np.zeros(batch + 1, np.int32)
    np.cumsum(qo_lens, out=qo[1:])
    kv = np.zeros(batch + 1, np.int32)
    np.cumsum(lens, out=kv[1:])
    return dict(
        batch=batch,
        table=(indptr, indices, last),
        num_pages=num_pages,
        qo_indptr=torch.from_numpy(qo),
        kv_indptr=torch.from_numpy(kv),
    )


# Batch sizes chosen to flip what used to change the key: 1 (an int equal to 1), 2 and 3
# (16-byte alignment of packed index arrays), 16 (a multiple of 16), 37 and 70 (other
# power-of-two blocks and chunk counts).
BATCHES = [3, 2, 1, 16, 37, 70]


def _each_batch(run: Callable[[dict[str, Any]], None]) -> None:
    for seed, batch in enumerate(BATCHES):
        run(_batch(seed, batch))


def _cache(b: dict[str, Any], device: torch.device) -> torch.Tensor:
    return torch.empty(b["num_pages"], 2, PS, HK, D, dtype=torch.float16, device=device)


def test_decode_wrapper_compiles_once_for_every_batch(variants, device):
    ws = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)

    def run(b: dict[str, Any]) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(*(t.to(device) for t in b["table"]), HQ, HK, D, PS, q_data_type=torch.float16)
        q = torch.empty(b["batch"], HQ, D, dtype=torch.float16, device=device)
        w.run(q, _cache(b, device), return_lse=True)

    _each_batch(run)
    assert len(variants["paged_attn"]) == 1
    # The merge runs wherever a plan split KV; on the interpreter's 2 SMs it never takes
    # the small-batch head-dim split (the one other variant, for fewer rows x heads than SMs).
    assert len(variants["merge_partials"]) == 1


@pytest.mark.parametrize("paged", [True, False])
def test_prefill_wrappers_compile_once_for_every_batch(paged, variants, device):
    ws = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)

    def run(b: dict[str, Any]) -> None:
        qo = b["qo_indptr"].to(device)
        q = torch.empty(int(qo[-1]), HQ, D, dtype=torch.float16, device=device)
        if paged:
            w = BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
            table = (t.to(device) for t in b["table"])
            w.plan(qo, *table, HQ, HK, D, PS, causal=True, q_data_type=torch.float16)
            w.run(q, _cache(b, device))
        else:
            w = BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
            kv = b["kv_indptr"].to(device)
            w.plan(qo, kv, HQ, HK, D, causal=True, q_data_type=torch.float16)
            k = torch.empty(int(kv[-1]), HK, D, dtype=torch.float16, device=device)
            w.run(q, k, k)

    _each_batch(run)
    assert len(variants["prefill"]) == 1


def test_plan_free_calls_compile_once_for_every_batch(variants, device):
    def run(b: dict[str, Any]) -> None:
        table = tuple(t.to(device) for t in b["table"])
        q = torch.empty(b["batch"], HQ, D, dtype=torch.float16, device=device)
        paged_decode(q, _cache(b, device), *table)
        qo = b["qo_indptr"].to(device)
        q = torch.empty(int(qo[-1]), HQ, D, dtype=torch.float16, device=device)
        paged_prefill(q, _cache(b, device), qo, *table, causal=True)

    _each_batch(run)
    assert len(variants["plan_free_decode"]) == 1
    assert len(variants["prefill"]) == 1


@pytest.mark.parametrize("sm_count", [1, 2, 3, 5, 132])
def test_decode_plan_arrays_are_16_byte_aligned_for_every_grid(sm_count, device):
    # The work list follows work_indptr (one entry per CTA + 1) in one buffer: without
    # padding its alignment, and so the kernel's key, followed the grid size.
    from flashtune.ops.attention.decode.config import DecodeLaunch

    ws = torch.empty(8 * 2**20, dtype=torch.uint8, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    table = (t.to(device) for t in build_page_table([300, 7, 1000], PS)[:3])
    w.plan(*table, HQ, HK, D, PS, launch=DecodeLaunch(sm_count=sm_count))
    plan = w._planner.plan
    assert plan is not None
    for t in (plan.work_indptr, plan.work, plan.merge_info):
        assert t.data_ptr() % 16 == 0

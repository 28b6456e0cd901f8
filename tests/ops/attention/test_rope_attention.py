"""pos_encoding_mode="ROPE_LLAMA": q and k rotated inside the attention kernels (interpreter
on CPU, GPU under cuda) against the reference, which rotates them explicitly first."""

from __future__ import annotations

import math

import pytest
import torch

from _position_encoding import ATOL, HKV, HQ, RTOL, D, compare, offsets, ragged_qkv
from flashtune.ops.attention.decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    single_decode_with_kv_cache,
)
from flashtune.ops.attention.page import build_page_table, split_kv_cache
from flashtune.ops.attention.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)
from flashtune.ops.attention.reference import (
    apply_llama_rope_ref,
    batch_decode_ref,
    batch_prefill_paged_ref,
    batch_prefill_ragged_ref,
    single_prefill_ref,
)
from flashtune.ops.attention.variant import AttentionVariant


def test_reference_rotation_is_the_complex_rotation():
    x = torch.randn(7, 3, 16, dtype=torch.float64)
    pos = torch.arange(7) * 5 + 2
    out = apply_llama_rope_ref(x, pos, rope_scale=2.0, rope_theta=500.0)
    # Pair (i, i + D/2) as the complex number x_i + j x_{i+D/2}, turned by pos * freq_i.
    freq = 500.0 ** (-2.0 * torch.arange(8, dtype=torch.float64) / 16) / 2.0
    z = torch.complex(x[..., :8], x[..., 8:]) * torch.polar(
        torch.ones(7, 1, 8, dtype=torch.float64), (pos[:, None, None] * freq).double()
    )
    torch.testing.assert_close(out, torch.cat([z.real, z.imag], dim=-1))
    assert torch.equal(apply_llama_rope_ref(x, torch.zeros(7), 1.0, 1e4), x)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("page_size", [1, 5])
def test_paged_rope(device, causal, page_size):
    qo_lens, kv_lens = [5, 17, 1, 0], [9, 40, 1, 3]
    indptr, indices, last, num_pages = build_page_table(kv_lens, page_size)
    cache = torch.randn(num_pages, 2, page_size, HKV, D, dtype=torch.float16, device=device)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=torch.float16, device=device)
    w = BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    rope = dict(rope_scale=1.5, rope_theta=500.0)
    w.plan(
        offsets(qo_lens),
        indptr,
        indices,
        last,
        HQ,
        HKV,
        D,
        page_size,
        causal=causal,
        pos_encoding_mode="ROPE_LLAMA",
        **rope,
    )
    out, lse = w.run(q, cache, return_lse=True)
    k, v = split_kv_cache(cache, "NHD")
    ref = batch_prefill_paged_ref(
        q,
        k,
        v,
        offsets(qo_lens),
        indptr,
        indices,
        last,
        AttentionVariant(sm_scale=1 / math.sqrt(D), causal=causal, rope=(1.5, 500.0)),
        compute_dtype=torch.float64,
    )
    compare(out, lse, *ref)


def test_ragged_and_single_rope(device):
    qo_lens, kv_lens = [3, 20], [30, 20]
    q, k, v = ragged_qkv(qo_lens, kv_lens, device)
    w = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    w.plan(
        offsets(qo_lens), offsets(kv_lens), HQ, HKV, D, causal=True, pos_encoding_mode="ROPE_LLAMA"
    )
    out, lse = w.run(q, k, v, return_lse=True)
    ref = batch_prefill_ragged_ref(
        q,
        k,
        v,
        offsets(qo_lens),
        offsets(kv_lens),
        AttentionVariant(sm_scale=1 / math.sqrt(D), causal=True, rope=(1.0, 1e4)),
        compute_dtype=torch.float64,
    )
    compare(out, lse, *ref)
    # The rotation changes the result (the test would not see a kernel ignoring it).
    plain = single_prefill_with_kv_cache(q[3:], k[30:], v[30:], causal=True)
    single = single_prefill_with_kv_cache(
        q[3:], k[30:], v[30:], causal=True, pos_encoding_mode="ROPE_LLAMA", rope_theta=1e4
    )
    ref_single, _ = single_prefill_ref(
        q[3:],
        k[30:],
        v[30:],
        1 / math.sqrt(D),
        causal=True,
        compute_dtype=torch.float64,
        rope=(1.0, 1e4),
    )
    torch.testing.assert_close(single.float().cpu(), ref_single.float().cpu(), atol=ATOL, rtol=RTOL)
    assert not torch.allclose(plain.float(), single.float(), atol=1e-2)


def test_unsupported_modes_raise(device):
    w = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    with pytest.raises(NotImplementedError, match="XPOS"):
        w.plan(offsets([2]), offsets([3]), HQ, HKV, D, pos_encoding_mode="XPOS")
    with pytest.raises(ValueError, match="rope_theta"):
        w.plan(offsets([2]), offsets([3]), HQ, HKV, D, pos_encoding_mode="ROPE_LLAMA", rope_theta=0)


def test_rope_table_holds_the_block_rotations():
    """The decode kernel's table: cos/sin of j * freq_i (rows j: offsets in a KV block, and row
    BLOCK_N a whole block), one kept tensor per setting (a captured graph reads it)."""
    from flashtune.ops.attention.rotary import ROPE_TABLE_ROWS, rope_table

    table = rope_table(64, (2.0, 1000.0), torch.device("cpu"))
    assert table.shape == (2, ROPE_TABLE_ROWS, 32) and table.dtype == torch.float32
    j, i = 100, 5
    angle = j * 1000.0 ** (-2 * i / 64) / 2.0
    assert table[0, j, i].item() == pytest.approx(math.cos(angle), abs=1e-7)
    assert table[1, j, i].item() == pytest.approx(math.sin(angle), abs=1e-7)
    assert rope_table(64, (2.0, 1000.0), torch.device("cpu")) is table
    assert rope_table(64, (1.0, 1000.0), torch.device("cpu")) is not table


# head_dim D (a power of two) takes the kernel's half-by-half rotation, 48 its general one.
@pytest.mark.parametrize("page_size,head_dim", [(1, D), (16, D), (16, 48)])
def test_decode_rope(device, page_size, head_dim):
    # 3000 tokens: the query's rotation advances block by block (a recurrence) for ~50 blocks
    kv_lens = [1, 37, 300, 0, 64, 3000]
    indptr, indices, last, num_pages = build_page_table(kv_lens, page_size)
    cache = torch.randn(num_pages, 2, page_size, HKV, head_dim, dtype=torch.float16, device=device)
    q = torch.randn(len(kv_lens), HQ, head_dim, dtype=torch.float16, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 22, dtype=torch.uint8, device=device))
    w.plan(
        indptr,
        indices,
        last,
        HQ,
        HKV,
        head_dim,
        page_size,
        pos_encoding_mode="ROPE_LLAMA",
        rope_scale=2.0,
        rope_theta=1000.0,
        q_data_type=torch.float16,
    )
    out, lse = w.run(q, cache, return_lse=True)
    k, v = split_kv_cache(cache, "NHD")
    ref = batch_decode_ref(q, k, v, indptr, indices, last, rope=(2.0, 1000.0))
    compare(out, lse, *ref)
    with pytest.raises(ValueError, match="pos_encoding_mode"):
        w.forward(q, cache)  # FlashInfer's forward defaults to NONE: not what was planned


def test_single_decode_rope(device):
    q = torch.randn(HQ, D, dtype=torch.float16, device=device)
    k = torch.randn(50, HKV, D, dtype=torch.float16, device=device)
    v = torch.randn(50, HKV, D, dtype=torch.float16, device=device)
    out = single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA")
    indptr = torch.tensor([0, 50], dtype=torch.int32)
    ref, _ = batch_decode_ref(
        q[None],
        k[:, None],
        v[:, None],
        indptr,
        torch.arange(50, dtype=torch.int32),
        torch.ones(1, dtype=torch.int32),
        rope=(1.0, 1e4),
    )
    torch.testing.assert_close(out.float().cpu(), ref[0].float().cpu(), atol=ATOL, rtol=RTOL)


@pytest.mark.cuda
def test_rope_gpu_sizes():
    """Realistic sizes on the GPU (bf16, d128): split-KV decode and causal paged prefill."""
    dev = torch.device("cuda")
    hkv, hq, d, ps = 8, 32, 128, 16
    kv_lens = [1, 5000, 700, 64, 2049, 0] * 4
    indptr, indices, last, num_pages = build_page_table(kv_lens, ps, device=dev)
    cache = torch.randn(num_pages, 2, ps, hkv, d, dtype=torch.bfloat16, device=dev)
    k, v = split_kv_cache(cache, "NHD")
    q = torch.randn(len(kv_lens), hq, d, dtype=torch.bfloat16, device=dev)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    rope = dict(pos_encoding_mode="ROPE_LLAMA", rope_scale=1.0, rope_theta=5e5)
    w = BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=torch.bfloat16, **rope)
    out, lse = w.run(q, cache, return_lse=True)
    ref = batch_decode_ref(
        q, k, v, indptr, indices, last, compute_dtype=torch.float32, rope=(1.0, 5e5)
    )
    torch.testing.assert_close(out.float(), ref[0].float(), atol=2e-2, rtol=2e-2)
    qo_lens = [1, 300, 700, 64, 100, 0] * 4
    qo_indptr = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)
    qp = torch.randn(sum(qo_lens), hq, d, dtype=torch.bfloat16, device=dev)
    p = BatchPrefillWithPagedKVCacheWrapper(ws)
    p.plan(qo_indptr, indptr, indices, last, hq, hkv, d, ps, causal=True, **rope)
    out = p.run(qp, cache)
    ref = batch_prefill_paged_ref(
        qp,
        k,
        v,
        qo_indptr,
        indptr,
        indices,
        last,
        AttentionVariant(sm_scale=d**-0.5, causal=True, rope=(1.0, 5e5)),
    )
    torch.testing.assert_close(out.float(), ref[0].float(), atol=2e-2, rtol=2e-2)


def test_rope_decode_bypasses_the_hooks(device, monkeypatch):
    # Capture and apply hook the schema'd run: RoPE decode (no Definition describes it) must
    # not reach them, plain decode must.
    import importlib

    api = importlib.import_module(
        "flashtune.schema.api"
    )  # the module (the package exports a function of this name)
    seen = []
    monkeypatch.setattr(api._HOOKS, "active", True)
    monkeypatch.setattr(api, "_run_hooks", lambda op, a, k: seen.append(op) or api.NOT_HANDLED)
    indptr, indices, last, num_pages = build_page_table([9, 3], 4)
    cache = torch.randn(num_pages, 2, 4, HKV, D, dtype=torch.float16, device=device)
    q = torch.randn(2, HQ, D, dtype=torch.float16, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 22, dtype=torch.uint8, device=device))
    w.plan(indptr, indices, last, HQ, HKV, D, 4)
    w.run(q, cache)
    assert len(seen) == 1
    w.plan(indptr, indices, last, HQ, HKV, D, 4, pos_encoding_mode="ROPE_LLAMA")
    w.run(q, cache)
    assert len(seen) == 1

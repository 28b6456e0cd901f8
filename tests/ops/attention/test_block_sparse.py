"""Block-sparse attention (flashtune.sparse): the wrappers, run by the paged prefill kernels
(interpreter on CPU, GPU under `cuda`), against the dense masked reference and, for the
options that depend on key order (causal, RoPE), FlashInfer's gathered semantics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import flashtune
from flashtune.ops.attention.sparse import (
    BlockSparseAttentionWrapper,
    VariableBlockSparseAttentionWrapper,
    convert_bsr_mask_layout,
    unpack_mask_bits,
)
from flashtune.ops.attention.sparse.reference import (
    block_sparse_attention_ref,
    bsr_dense_mask,
    dense_masked_attention_ref,
    variable_block_sparse_attention_ref,
)
from flashtune.ops.attention.sparse.schema import block_sparse_attention_ref as definition_ref
from flashtune.ops.attention.variant import AttentionVariant

# (atol, rtol) of the output against the float32 reference; LSE likewise.
TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2), torch.float32: (1e-3, 1e-3)}


def _ws(device: torch.device) -> torch.Tensor:
    return torch.empty(1 << 16, dtype=torch.uint8, device=device)


def _random_bsr(
    num_block_rows: int, num_block_cols: int, density: float, empty_row: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """indptr [MB + 1] int32, indices [nnz] int32: each block present with probability
    `density`, the blocks of a row in shuffled order (the key order the wrapper must keep);
    `empty_row` empties the first block row (its queries see no key)."""
    present = torch.rand(num_block_rows, num_block_cols) < density
    if empty_row:
        present[0] = False
    rows = [torch.nonzero(r).flatten() for r in present]
    rows = [r[torch.randperm(r.numel())] for r in rows]
    counts = torch.tensor([0] + [r.numel() for r in rows])
    indices = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
    return counts.cumsum(0).int(), indices.int()


def _compare(out, lse, ref_out, ref_lse, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float().cpu(), ref_out.float().cpu(), atol=atol, rtol=rtol)
    if lse is not None:
        assert torch.equal(lse.isinf().cpu(), ref_lse.isinf().cpu())
        finite = ~ref_lse.isinf().cpu()
        torch.testing.assert_close(lse.cpu()[finite], ref_lse.cpu()[finite], atol=atol, rtol=rtol)


def _qkv(M, N, hq, hk, d, dtype, device):
    return (
        torch.randn(M, hq, d, dtype=dtype, device=device),
        torch.randn(N, hk, d, dtype=dtype, device=device),
        torch.randn(N, hk, d, dtype=dtype, device=device),
    )


# (R, C, M, N, density, heads (qo, kv), dtype, mask inside the blocks): every R x C in
# {1, 4, 16}^2; M not a multiple of R where R > 1 (the last block row is cut).
BSR_CASES = [
    (1, 1, 23, 17, 0.2, (4, 2), torch.float16, False),
    (1, 4, 9, 32, 0.7, (2, 2), torch.float32, True),
    (1, 16, 7, 48, 1.0, (4, 1), torch.float16, True),
    (4, 1, 18, 13, 0.7, (4, 4), torch.float16, True),
    (4, 4, 30, 40, 0.2, (4, 2), torch.float32, False),
    (4, 16, 13, 64, 1.0, (2, 1), torch.float16, False),
    (16, 1, 40, 24, 1.0, (1, 1), torch.float32, True),
    (16, 4, 37, 36, 0.7, (8, 2), torch.float16, False),
    (16, 16, 33, 64, 0.2, (4, 2), torch.float16, True),
]


@pytest.mark.parametrize("R,C,M,N,density,heads,dtype,masked", BSR_CASES)
def test_block_sparse_matches_dense_reference(device, R, C, M, N, density, heads, dtype, masked):
    hq, hk = heads
    head_dim = 64
    indptr, indices = _random_bsr(-(-M // R), N // C, density, empty_row=density < 1.0)
    mask = torch.rand(int(indptr[-1]), R, C) > 0.5 if masked else None
    q, k, v = _qkv(M, N, hq, hk, head_dim, dtype, device)
    wrapper = BlockSparseAttentionWrapper(_ws(device))
    wrapper.plan(
        indptr.to(device),
        indices.to(device),
        M,
        N,
        R,
        C,
        hq,
        hk,
        head_dim,
        mask=None if mask is None else mask.to(device),
        q_data_type=dtype,
        o_data_type=dtype,
    )
    out, lse = wrapper.run(q, k, v, return_lse=True)
    dense = bsr_dense_mask(indptr, indices, M, N, R, C, mask)
    ref_out, ref_lse = dense_masked_attention_ref(q, k, v, dense)
    assert out.shape == q.shape and out.dtype == dtype
    _compare(out, lse, ref_out, ref_lse, dtype)
    # Pre-allocated outputs receive the same result.
    out_buf = torch.empty_like(q)
    lse_buf = torch.empty(M, hq, dtype=torch.float32, device=device)
    wrapper.run(q, k, v, out=out_buf, lse=lse_buf, return_lse=True)
    _compare(out_buf, lse_buf, ref_out, ref_lse, dtype)


def test_packed_mask_equals_mask(device):
    R, C, M, N, hq, hk, d = 4, 4, 14, 32, 2, 1, 64
    indptr, indices = _random_bsr(-(-M // R), N // C, 0.6)
    mask = torch.rand(int(indptr[-1]), R, C) > 0.5
    q, k, v = _qkv(M, N, hq, hk, d, torch.float16, device)
    flat = convert_bsr_mask_layout(mask, indptr).numpy()
    packed = torch.from_numpy(np.packbits(flat, bitorder="little")).to(device)
    wrapper = BlockSparseAttentionWrapper(_ws(device))
    wrapper.plan(indptr, indices, M, N, R, C, hq, hk, d, mask=mask.to(device))
    with_mask = wrapper.run(q, k, v)
    wrapper.plan(indptr, indices, M, N, R, C, hq, hk, d, packed_mask=packed)
    with_packed = wrapper.run(q, k, v)
    torch.testing.assert_close(with_packed, with_mask, atol=0, rtol=0)
    ref, _ = dense_masked_attention_ref(q, k, v, bsr_dense_mask(indptr, indices, M, N, R, C, mask))
    _compare(with_mask, None, ref, None, torch.float16)


@pytest.mark.parametrize(
    "causal,rope,soft_cap,sm_scale", [(True, None, None, None), (True, (2.0, 5e4), 30.0, 0.1)]
)
def test_variants_follow_flashinfer_semantics(device, causal, rope, soft_cap, sm_scale):
    """causal and RoPE act on each block row's keys concatenated in `indices` order (the
    gathered reference); soft cap and sm_scale pass through."""
    R, C, M, N, hq, hk, d = 4, 4, 19, 48, 4, 2, 64
    indptr, indices = _random_bsr(-(-M // R), N // C, 0.5, empty_row=True)
    q, k, v = _qkv(M, N, hq, hk, d, torch.float16, device)
    wrapper = BlockSparseAttentionWrapper(_ws(device))
    wrapper.plan(
        indptr,
        indices,
        M,
        N,
        R,
        C,
        hq,
        hk,
        d,
        causal=causal,
        pos_encoding_mode="NONE" if rope is None else "ROPE_LLAMA",
        logits_soft_cap=soft_cap,
        sm_scale=sm_scale,
        rope_scale=None if rope is None else rope[0],
        rope_theta=None if rope is None else rope[1],
    )
    out, lse = wrapper.run(q, k, v, return_lse=True)
    ref_out, ref_lse = block_sparse_attention_ref(
        q,
        k,
        v,
        indptr,
        indices,
        R,
        C,
        AttentionVariant(sm_scale=sm_scale, causal=causal, logits_soft_cap=soft_cap, rope=rope),
    )
    _compare(out, lse, ref_out, ref_lse, torch.float16)


def test_output_dtype_is_o_data_type(device):
    R, C, M, N, hq, hk, d = 2, 2, 6, 8, 2, 2, 64
    indptr, indices = _random_bsr(M // R, N // C, 1.0)
    q, k, v = _qkv(M, N, hq, hk, d, torch.float32, device)
    wrapper = BlockSparseAttentionWrapper(_ws(device))
    # FlashInfer's default o_data_type is float16, whatever q's dtype.
    wrapper.plan(indptr, indices, M, N, R, C, hq, hk, d, q_data_type="float32")
    out = wrapper.run(q, k, v)
    assert out.dtype == torch.float16
    ref, _ = dense_masked_attention_ref(q, k, v, bsr_dense_mask(indptr, indices, M, N, R, C))
    _compare(out, None, ref, None, torch.float16)


def test_references_agree_without_order_dependent_options():
    R, C, M, N = 4, 2, 11, 12
    indptr, indices = _random_bsr(-(-M // R), N // C, 0.6)
    mask = torch.rand(int(indptr[-1]), R, C) > 0.3
    q, k, v = _qkv(M, N, 2, 1, 16, torch.float64, "cpu")
    dense = bsr_dense_mask(indptr, indices, M, N, R, C, mask)
    a, lse_a = dense_masked_attention_ref(q, k, v, dense, compute_dtype=torch.float64)
    b, lse_b = block_sparse_attention_ref(
        q, k, v, indptr, indices, R, C, mask=mask, compute_dtype=torch.float64
    )
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(lse_a, lse_b)


def test_convert_bsr_mask_layout_is_flashinfers():
    """FlashInfer's definition: per block row, mask[blocks].transpose(0, 1) flattened."""
    R, C = 3, 2
    indptr, indices = _random_bsr(4, 5, 0.5)
    mask = torch.rand(int(indptr[-1]), R, C) > 0.5
    expected = torch.cat(
        [
            mask[int(indptr[i]) : int(indptr[i + 1])].transpose(0, 1).reshape(-1)
            for i in range(len(indptr) - 1)
        ]
    )
    assert torch.equal(convert_bsr_mask_layout(mask, indptr), expected)


def test_unpack_mask_bits_inverts_little_endian_packbits():
    bits = np.random.default_rng(0).random(29) > 0.5
    packed = torch.from_numpy(np.packbits(bits, bitorder="little"))
    assert torch.equal(unpack_mask_bits(packed, 29), torch.from_numpy(bits))


def test_plan_and_run_reject_what_flashinfer_cannot_mean():
    ws = _ws(torch.device("cpu"))
    wrapper = BlockSparseAttentionWrapper(ws)
    indptr, indices = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 1])
    with pytest.raises(RuntimeError, match="before plan"):
        wrapper.run(torch.zeros(8, 1, 64), torch.zeros(8, 1, 64), torch.zeros(8, 1, 64))
    with pytest.raises(ValueError, match="multiple of C"):
        wrapper.plan(indptr, indices, 8, 9, 4, 4, 1, 1, 64)
    with pytest.raises(ValueError, match=r"ceil\(M / R\)"):
        wrapper.plan(indptr, indices, 12, 8, 4, 4, 1, 1, 64)
    with pytest.raises(ValueError, match="indices must be in"):
        wrapper.plan(indptr, torch.tensor([0, 2]), 8, 8, 4, 4, 1, 1, 64)
    with pytest.raises(ValueError, match="mask must have shape"):
        wrapper.plan(indptr, indices, 8, 8, 4, 4, 1, 1, 64, mask=torch.ones(2, 4, 2).bool())
    with pytest.raises(NotImplementedError, match="ALIBI"):
        wrapper.plan(indptr, indices, 8, 8, 4, 4, 1, 1, 64, pos_encoding_mode="ALIBI")
    wrapper.plan(indptr, indices, 8, 8, 4, 4, 1, 1, 64)
    q = torch.zeros(8, 1, 64, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="scale_q"):
        wrapper.run(q, q, q, scale_q=torch.ones(1))
    with pytest.raises(ValueError, match="k must be"):
        wrapper.run(q, q[:4], q)


def _partition(total: int, parts: int) -> torch.Tensor:
    cuts = torch.sort(torch.randperm(total - 1)[: parts - 1] + 1).values
    return torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([total])])).int()


# (qo heads, kv heads, qo_len, kv_len, block rows, block cols, density, dtype)
VARIABLE_CASES = [
    (1, 1, 20, 30, 3, 5, 0.2, torch.float16),
    (4, 2, 33, 17, 4, 3, 0.7, torch.float32),
    (8, 2, 16, 40, 5, 8, 1.0, torch.float16),
]


@pytest.mark.parametrize("hq,hk,qo_len,kv_len,mb,nb,density,dtype", VARIABLE_CASES)
def test_variable_block_sparse_matches_dense_reference(
    device, hq, hk, qo_len, kv_len, mb, nb, density, dtype
):
    d = 64
    rows = torch.stack([_partition(qo_len, mb) for _ in range(hk)])
    cols = torch.stack([_partition(kv_len, nb) for _ in range(hk)])
    block_mask = torch.rand(hk, mb, nb) < density
    block_mask[0, 0] = False  # a block row that sees no key
    q = torch.randn(hq, qo_len, d, dtype=dtype, device=device)
    k = torch.randn(hk, kv_len, d, dtype=dtype, device=device)
    v = torch.randn(hk, kv_len, d, dtype=dtype, device=device)
    wrapper = VariableBlockSparseAttentionWrapper(_ws(device))
    wrapper.plan(block_mask.to(device), rows, cols, hq, hk, d, q_data_type=dtype)
    out, lse = wrapper.run(q, k, v, return_lse=True)
    ref_out, ref_lse = variable_block_sparse_attention_ref(q, k, v, block_mask, rows, cols)
    assert out.shape == q.shape and lse.shape == (hq, qo_len)
    _compare(out, lse, ref_out, ref_lse, dtype)
    out_buf = torch.empty_like(q)
    wrapper.run(q, k, v, out=out_buf)
    _compare(out_buf, None, ref_out, None, dtype)


def test_variable_plan_rejects_inconsistent_sizes():
    wrapper = VariableBlockSparseAttentionWrapper(_ws(torch.device("cpu")))
    block_mask = torch.ones(2, 2, 2, dtype=torch.bool)
    rows = torch.tensor([[2, 2], [1, 2]])
    cols = torch.tensor([[2, 2], [2, 2]])
    with pytest.raises(ValueError, match="same length"):
        wrapper.plan(block_mask, rows, cols, 2, 2, 64)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        wrapper.plan(block_mask, cols, cols, 3, 2, 64)


def test_top_level_and_submodule_names():
    assert flashtune.sparse.BlockSparseAttentionWrapper is BlockSparseAttentionWrapper
    assert flashtune.BlockSparseAttentionWrapper is BlockSparseAttentionWrapper
    assert flashtune.VariableBlockSparseAttentionWrapper is VariableBlockSparseAttentionWrapper


@pytest.mark.cuda
@pytest.mark.parametrize("R,C", [(1, 64), (16, 16), (64, 64)])
@pytest.mark.parametrize("density", [0.2, 0.9])
def test_block_sparse_realistic_sizes(R, C, density):
    """4096 x 4096, 32 query heads over 8 KV heads, head_dim 128, fp16 (a Llama-3-8B layer)."""
    device = torch.device("cuda")
    M = N = 4096
    hq, hk, d = 32, 8, 128
    indptr, indices = _random_bsr(math.ceil(M / R), N // C, density)
    q, k, v = _qkv(M, N, hq, hk, d, torch.float16, device)
    wrapper = BlockSparseAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=device))
    wrapper.plan(indptr.to(device), indices.to(device), M, N, R, C, hq, hk, d)
    out, lse = wrapper.run(q, k, v, return_lse=True)
    dense = bsr_dense_mask(indptr, indices, M, N, R, C)
    ref_out, ref_lse = dense_masked_attention_ref(q, k, v, dense)
    _compare(out, lse, ref_out, ref_lse, torch.float16)


def test_deprecated_forward_plans_its_variant_again(device):
    R, C, M, N, hq, hk, d = 4, 4, 8, 16, 2, 1, 64
    indptr, indices = _random_bsr(M // R, N // C, 1.0)
    q, k, v = _qkv(M, N, hq, hk, d, torch.float16, device)
    wrapper = BlockSparseAttentionWrapper(_ws(device))
    wrapper.plan(indptr, indices, M, N, R, C, hq, hk, d)
    out = wrapper.forward(q, k, v, logits_soft_cap=5.0, sm_scale=0.3)
    ref, _ = block_sparse_attention_ref(
        q, k, v, indptr, indices, R, C, AttentionVariant(sm_scale=0.3, logits_soft_cap=5.0)
    )
    _compare(out, None, ref, None, torch.float16)


def test_definition_reference_matches_the_gathered_reference():
    """The Definition's self-contained reference (K/V as column blocks) is the gathered
    reference in the plain configuration (M a multiple of R, no mask, not causal)."""
    R, C, M, N, hq, hk, d = 4, 2, 12, 16, 4, 2, 16
    indptr, indices = _random_bsr(M // R, N // C, 0.5, empty_row=True)
    q, k, v = _qkv(M, N, hq, hk, d, torch.float32, "cpu")
    out, lse = definition_ref(
        q, k.view(-1, C, hk, d), v.view(-1, C, hk, d), indptr, indices, 0.2, 10.0
    )
    ref_out, ref_lse = block_sparse_attention_ref(
        q, k, v, indptr, indices, R, C, AttentionVariant(sm_scale=0.2, logits_soft_cap=10.0)
    )
    _compare(out, lse, ref_out, ref_lse, torch.float32)


def test_merge_identical_block_rows_joins_runs_only():
    from flashtune.ops.attention.sparse import merge_identical_block_rows

    # rows: [0 1] [0 1] [1 0] [] [] [2] [2] [0 1] (a repeat of row 0, not adjacent to it)
    indptr = np.array([0, 2, 4, 6, 6, 6, 7, 8, 10])
    indices = np.array([0, 1, 0, 1, 1, 0, 2, 2, 0, 1])
    qo = np.array([0, 4, 8, 12, 16, 20, 24, 28, 30])  # the last block row cut at 30
    merged_qo, merged_ptr, merged = merge_identical_block_rows(qo, indptr, indices)
    assert merged_qo.tolist() == [0, 8, 12, 20, 28, 30]
    assert merged_ptr.tolist() == [0, 2, 4, 4, 5, 7]
    assert merged.tolist() == [0, 1, 1, 0, 2, 0, 1]
    # Nothing to merge, and a single row, come back as they were.
    one = merge_identical_block_rows(np.array([0, 3]), np.array([0, 2]), np.array([1, 0]))
    assert [a.tolist() for a in one] == [[0, 3], [0, 2], [1, 0]]


@pytest.mark.parametrize("R,C,M,N", [(1, 4, 9, 32), (4, 16, 30, 64), (16, 4, 37, 36)])
def test_block_rows_with_the_same_blocks_run_as_one(device, R, C, M, N):
    """Identical consecutive rows (dense, and runs inside a sparse pattern) are merged into
    one request by plan: the result is still the reference's, LSE included."""
    mb, nb = -(-M // R), N // C
    rows = []
    for b in range(mb):  # runs of 1-3 equal rows, each run's blocks in a random order
        if b == 0 or torch.rand(()) < 0.4:
            cols = torch.nonzero(torch.rand(nb) < 0.6).flatten()
            cols = cols[torch.randperm(cols.numel())]
        rows.append(cols)
    for pattern in (rows, [torch.arange(nb)] * mb):
        counts = torch.tensor([0] + [r.numel() for r in pattern])
        indptr, indices = counts.cumsum(0).int(), torch.cat(pattern).int()
        q, k, v = _qkv(M, N, 4, 2, 64, torch.float16, device)
        wrapper = BlockSparseAttentionWrapper(_ws(device))
        wrapper.plan(
            indptr.to(device),
            indices.to(device),
            M,
            N,
            R,
            C,
            4,
            2,
            64,
            q_data_type=torch.float16,
            o_data_type=torch.float16,
        )
        out, lse = wrapper.run(q, k, v, return_lse=True)
        ref_out, ref_lse = dense_masked_attention_ref(
            q, k, v, bsr_dense_mask(indptr, indices, M, N, R, C, None)
        )
        _compare(out, lse, ref_out, ref_lse, torch.float16)

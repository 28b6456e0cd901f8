"""The references of the fp8 GEMMs in plain PyTorch (fp32 products and sums): the schemas'
references (schema.py), the CPU path where no kernel runs, and the tests' expected values.

`bmm_fp8_ref` and `gemm_fp8_nt_groupwise_ref` are the Definitions' references and are
self-contained (their source is emitted into the Definitions); `block_scaled_mm_ref` is the
general block-scaled product every block-scaled call reduces to (scales in the canonical
K-major layout, any granularity, sizes that the blocks do not divide).
"""

from __future__ import annotations

import torch

__all__ = [
    "bmm_fp8_ref",
    "gemm_fp8_nt_groupwise_ref",
    "batch_deepgemm_fp8_nt_groupwise_ref",
    "block_scaled_mm_ref",
    "expand_scale",
]


def bmm_fp8_ref(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    dtype: torch.dtype | int = torch.bfloat16,
) -> torch.Tensor:
    """C[b] = (A[b] * A_scale) @ (B[b] * B_scale) for fp8 A [batch, M, K] and B [batch, K, N],
    per-tensor fp32 scales (their first element: the Definition's `scalar` axis is 1 in
    practice), fp32 products and sums, rounded once to `dtype` (an integer dtype enum, as
    the Definitions carry it, means the Definitions' bfloat16)."""
    import torch

    scale = A_scale.float().reshape(-1)[0] * B_scale.float().reshape(-1)[0]
    C = torch.matmul(A.float(), B.float()) * scale
    return C.to(dtype if isinstance(dtype, torch.dtype) else torch.bfloat16)


def gemm_fp8_nt_groupwise_ref(
    a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor
) -> torch.Tensor:
    """C = dequant(a) @ dequant(b).T for fp8 a [M, K] with a_scale [M, K/bk] (one scale per
    row and K block) and b [N, K] with b_scale [N/bn, K/bk] (one per N block and K block),
    in bfloat16. The block is 128 wherever the scale shapes allow it (DeepSeek's 1x128 /
    128x128 format, K and N rounded up), else K // K_div_block."""
    import torch

    M, K = a.shape
    N = b.shape[0]
    k_blocks, n_blocks = a_scale.shape[1], b_scale.shape[0]
    bk = 128 if -(-K // 128) == k_blocks else max(1, K // max(k_blocks, 1))
    bn = 128 if -(-N // 128) == n_blocks else max(1, N // max(n_blocks, 1))
    sa = a_scale.float().repeat_interleave(bk, dim=1)[:, :K]
    sb = b_scale.float().repeat_interleave(bn, dim=0)[:N].repeat_interleave(bk, dim=1)[:, :K]
    return torch.matmul(a.float() * sa, (b.float() * sb).T).to(torch.bfloat16)


def batch_deepgemm_fp8_nt_groupwise_ref(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int = 0,
) -> torch.Tensor:
    """out[g, :masked_m[g]] = dequant(a[g]) @ dequant(b[g]).T for fp8 a [batch, M_max, K]
    with a_scale [batch, M_max, K/128] (1x128 groups) and b [batch, N, K] with b_scale
    [batch, N/128, K/128] (128x128 blocks), in bfloat16; the rows past masked_m[g] are zeros.
    expected_m is a performance hint with no effect on the result."""
    import torch

    M_max, K = a.shape[1:]
    N = b.shape[1]
    sa = a_scale.float().repeat_interleave(128, dim=2)[:, :, :K]
    sb = b_scale.float().repeat_interleave(128, dim=1)[:, :N].repeat_interleave(128, dim=2)
    out = torch.matmul(a.float() * sa, (b.float() * sb[:, :, :K]).transpose(1, 2))
    rows = torch.arange(M_max, device=a.device)
    valid = rows[None, :] < masked_m.to(a.device).long()[:, None]
    return (out * valid[:, :, None]).to(torch.bfloat16)


def expand_scale(scale: torch.Tensor, rows: int, cols: int, block: tuple[int, int]) -> torch.Tensor:
    """A [ceil(rows/br), ceil(cols/bc)] block-scale tensor spread to one value per element
    [rows, cols] (leading batch dimensions kept)."""
    br, bc = block
    out = scale.float().repeat_interleave(br, dim=-2)[..., :rows, :]
    return out.repeat_interleave(bc, dim=-1)[..., :cols]


def block_scaled_mm_ref(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    granularity: tuple[int, int, int] = (1, 128, 128),
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """C = (a * a_scale) @ (b * b_scale).T for fp8 a [..., M, K] and b [..., N, K], the
    scales K-major: a_scale [..., ceil(M/gm), ceil(K/gk)], b_scale [..., ceil(N/gn),
    ceil(K/gk)] for granularity (gm, gn, gk); fp32 products and sums, rounded once."""
    gm, gn, gk = granularity
    M, K = a.shape[-2:]
    N = b.shape[-2]
    a_deq = a.float() * expand_scale(a_scale, M, K, (gm, gk))
    b_deq = b.float() * expand_scale(b_scale, N, K, (gn, gk))
    return torch.matmul(a_deq, b_deq.transpose(-2, -1)).to(out_dtype)

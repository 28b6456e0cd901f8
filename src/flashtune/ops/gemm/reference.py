"""The references of the GEMM ops in plain PyTorch (fp32 products and sums): the schemas'
references (schema.py), the CPU path where no kernel runs, and the fp8 fallback of cuBLASLt.

Each is self-contained (its source is emitted into the Definitions as their reference).
"""

from __future__ import annotations

import torch

__all__ = ["gemm_ref", "gemm_kn_ref", "gemm_fp8_ref"]


def gemm_ref(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T (+ bias), B [N, K]: fp32 products and sums, rounded once to A's dtype."""
    import torch

    C = torch.matmul(A.float(), B.float().T)
    if bias is not None:
        C = C + bias.float()
    return C.to(A.dtype)


def gemm_kn_ref(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B (+ bias), B stored [K, N]: fp32 products and sums, rounded once to A's dtype."""
    import torch

    C = torch.matmul(A.float(), B.float())
    if bias is not None:
        C = C + bias.float()
    return C.to(A.dtype)


def gemm_fp8_ref(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """C = (A * A_scale) @ (B * B_scale).T (+ bias) for fp8 A [M, K], B [N, K], in fp32."""
    import torch

    C = torch.matmul(A.float(), B.float().T) * (A_scale.float() * B_scale.float())
    if bias is not None:
        C = C + bias.float()
    return C.to(dtype)

"""The bundled dataset's RMSNorm ops: rmsnorm and fused_add_rmsnorm at Llama-3 / Qwen3 eps."""

from __future__ import annotations

import torch

from flashtune.ops.bundle import (
    TORCH_EAGER,
    BundledOp,
    Entry,
    flashinfer_direct,
    runs_the_op,
    tuned_api,
)
from flashtune.ops.bundle.workloads import token_sweep

RMS_EPS = 1e-5  # Llama-3.1 and Qwen3 (rms_norm_eps)
TOKENS = [1, 16, 64, 256, 2048]  # rows normalized per call
# The in-place op is wrapped so that no solution writes into its inputs: flashtune's and
# FlashInfer's adapters clone the two tensors it updates alike, so their comparison is fair.
_CLONES = "on clones of hidden_states and residual (the op updates them in place)"


@runs_the_op
def flashtune_rmsnorm(
    hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = RMS_EPS
) -> torch.Tensor:
    from flashtune.ops.norm import rmsnorm

    return rmsnorm(hidden_states, weight, eps=eps)


@runs_the_op
def flashtune_fused_add_rmsnorm(
    hidden_states: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = RMS_EPS,
) -> torch.Tensor:
    from flashtune.ops.norm import fused_add_rmsnorm

    x, r = hidden_states.clone(), residual.clone()
    fused_add_rmsnorm(x, r, weight, eps=eps)
    return x


def flashinfer_rmsnorm(
    hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = RMS_EPS
) -> torch.Tensor:
    import flashinfer

    return flashinfer.norm.rmsnorm(hidden_states, weight, eps=eps)


def flashinfer_fused_add_rmsnorm(
    hidden_states: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = RMS_EPS,
) -> torch.Tensor:
    import flashinfer

    x, r = hidden_states.clone(), residual.clone()
    flashinfer.norm.fused_add_rmsnorm(x, r, weight, eps=eps)
    return x


def torch_rmsnorm(
    hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = RMS_EPS
) -> torch.Tensor:
    x = hidden_states.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(hidden_states.dtype)


def torch_fused_add_rmsnorm(
    hidden_states: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = RMS_EPS,
) -> torch.Tensor:
    return torch_rmsnorm(hidden_states.float() + residual.float(), weight, eps).to(
        hidden_states.dtype
    )


BUNDLED = (
    BundledOp(
        prefix="rmsnorm",
        workloads=token_sweep(TOKENS),
        entries=(
            Entry("flashtune", flashtune_rmsnorm, tuned_api("ops.norm.rmsnorm")),
            Entry("torch", torch_rmsnorm, TORCH_EAGER),
            Entry("flashinfer", flashinfer_rmsnorm, flashinfer_direct("flashinfer.norm.rmsnorm")),
        ),
    ),
    BundledOp(
        prefix="fused_add_rmsnorm",
        workloads=token_sweep(TOKENS),
        entries=(
            Entry(
                "flashtune",
                flashtune_fused_add_rmsnorm,
                tuned_api("ops.norm.fused_add_rmsnorm", f" {_CLONES}, as FlashInfer's is"),
            ),
            Entry("torch", torch_fused_add_rmsnorm, TORCH_EAGER),
            Entry(
                "flashinfer",
                flashinfer_fused_add_rmsnorm,
                flashinfer_direct(
                    f"flashinfer.norm.fused_add_rmsnorm {_CLONES}, as flashtune's is"
                ),
            ),
        ),
    ),
)

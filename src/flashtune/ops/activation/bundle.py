"""The bundled dataset's activation op: silu_and_mul (the SwiGLU of Llama-3 and Qwen3)."""

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

TOKENS = [1, 16, 64, 256, 2048]  # rows per call


@runs_the_op
def flashtune_silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    from flashtune.ops.activation import silu_and_mul

    return silu_and_mul(input)


def flashinfer_silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    import flashinfer

    return flashinfer.activation.silu_and_mul(input)


def torch_silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    d = input.shape[-1] // 2
    return torch.nn.functional.silu(input[..., :d]) * input[..., d:]


BUNDLED = (
    BundledOp(
        prefix="silu_and_mul",
        workloads=token_sweep(TOKENS),
        entries=(
            Entry("flashtune", flashtune_silu_and_mul, tuned_api("ops.activation.silu_and_mul")),
            Entry("torch", torch_silu_and_mul, TORCH_EAGER),
            Entry(
                "flashinfer",
                flashinfer_silu_and_mul,
                flashinfer_direct("flashinfer.activation.silu_and_mul"),
            ),
        ),
    ),
)

"""The bundled dataset's GEMM: C = A @ B.T in bf16 at the models' projection shapes.
FlashInfer 0.2 has no plain bf16 GEMM, so it has no FlashInfer solution."""

from __future__ import annotations

import torch

from flashtune.ops.bundle import NO_SETUP, TORCH_EAGER, BundledOp, Entry, runs_the_op
from flashtune.ops.bundle.workloads import token_sweep

TOKENS = [1, 16, 64, 256, 2048]  # M


@runs_the_op
def flashtune_gemm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    from flashtune.ops.gemm import mm

    return mm(A, B)


def torch_gemm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.matmul(A, B.T)


_FLASHTUNE = (
    "flashtune's public mm (ops.gemm.mm): per M bucket the autotuner's dispatch picks "
    "cuBLAS (through torch) or one of flashtune's Triton GEMMs from a loaded cache file or "
    "bundled configs matching this GPU, else cuBLAS (it profiles only under `flashtune run "
    f"--autotune`), so this is not a Triton-only figure. {NO_SETUP}"
)

BUNDLED = (
    BundledOp(
        prefix="gemm",
        workloads=token_sweep(TOKENS),
        entries=(
            Entry("flashtune", flashtune_gemm, _FLASHTUNE),
            Entry("torch", torch_gemm, TORCH_EAGER),
        ),
    ),
)

"""Toy schema'd ops on CPU tensors, for the capture and apply tests (real ops may not carry
schemas yet, and these keep the tests independent of kernels)."""

from __future__ import annotations

import torch

from flashtune.schema import Const, OpSchema, Scalar, Tensor, Var, api


def toy_norm_ref(hidden_states, weight, eps=1e-6):
    x = hidden_states.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(hidden_states.dtype)


TOY_NORM = OpSchema(
    op_type="toy_norm",
    name_prefix="toy_norm",
    axes={"batch_size": Var("rows"), "hidden_size": Const("hidden size", abbrev="h")},
    inputs={
        "hidden_states": Tensor(["batch_size", "hidden_size"], dtype_from="input", param="input"),
        "weight": Tensor(["hidden_size"], dtype_from="input"),
    },
    outputs={"output": Tensor(["batch_size", "hidden_size"], dtype_from="input", param="out")},
    reference=toy_norm_ref,
    bound=("eps",),
)


@api(schema=TOY_NORM)
def toy_norm(input, weight, eps=1e-6, out=None):
    y = toy_norm_ref(input, weight, eps)
    if out is not None:
        out.copy_(y)
        return out
    return y


def toy_gemm_ref(A, B):
    return A @ B.T


TOY_GEMM = OpSchema(
    op_type="toy_gemm",
    name_prefix="toy_gemm",
    axes={"M": Var(), "N": Const(abbrev="n"), "K": Const(abbrev="k")},
    inputs={"A": Tensor(["M", "K"], dtype_from="A"), "B": Tensor(["N", "K"], dtype_from="A")},
    outputs={"C": Tensor(["M", "N"], dtype_from="A")},
    reference=toy_gemm_ref,
)


@api(schema=TOY_GEMM)
def toy_gemm(A, B):
    return toy_gemm_ref(A, B)


def toy_gather_ref(table, indices, scale):
    return table[indices.long()] * scale


TOY_GATHER = OpSchema(
    op_type="toy_gather",
    name_prefix="toy_gather",
    axes={"num_rows": Var(), "num_indices": Var(), "dim": Const(abbrev="d")},
    inputs={
        "table": Tensor(["num_rows", "dim"], dtype_from="table"),
        "indices": Tensor(["num_indices"], dtype="int64"),
        "scale": Scalar("float32"),
    },
    outputs={"output": Tensor(["num_indices", "dim"], dtype_from="table")},
    reference=toy_gather_ref,
)


@api(schema=TOY_GATHER)
def toy_gather(table, indices, scale=1.0):
    return toy_gather_ref(table, indices, scale)


class ToyModel(torch.nn.Module):
    """Two layers of norm + projection: what a decode step of a tiny model calls."""

    def __init__(self, hidden: int = 16, layers: int = 2) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.norms = [torch.rand(hidden, generator=gen) + 0.5 for _ in range(layers)]
        self.projs = [
            torch.randn(hidden, hidden, generator=gen) / hidden**0.5 for _ in range(layers)
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w, p in zip(self.norms, self.projs, strict=False):
            x = x + toy_gemm(toy_norm(x, w), p)
        return x

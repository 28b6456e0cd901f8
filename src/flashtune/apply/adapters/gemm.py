"""The GEMM family under apply: torch.nn.functional.linear (and so nn.Linear) as flashtune's
`gemm` op, C = A @ B.T with A = input and B = weight."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from flashtune.apply.patching import AdapterSpec
from flashtune.apply.runtime import route
from flashtune.ops.gemm import gemm
from flashtune.schema import NOT_HANDLED

__all__ = ["adapters", "linear"]


def linear(original: Callable[..., Any]) -> Callable[..., Any]:
    """The patch of F.linear: a call without bias is gemm(input, weight)."""

    @functools.wraps(original)
    def patched(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Any:
        # With a bias the call has an input that the traced (bias-free) Definitions of the
        # same name lack: their winners cannot take it.
        if bias is not None or weight.dim() != 2 or input.dim() < 1:
            return original(input, weight, bias)
        rows = input if input.dim() > 1 else input.unsqueeze(0)
        result = route(gemm, {"A": rows, "B": weight, "bias": None})
        if result is NOT_HANDLED:
            return original(input, weight, bias)
        return result if input.dim() > 1 else result.squeeze(0)

    return patched


def adapters() -> list[AdapterSpec]:
    return [AdapterSpec("torch.nn.functional.linear", linear)]

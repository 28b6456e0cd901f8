"""Schemas of the GEMM ops (the FlashInfer-Trace `gemm` Definitions, and `gemm_kn` for B stored
[K, N]) and the family's model examples.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.model_shapes import ModelConfig
from flashtune.ops.gemm.reference import gemm_kn_ref, gemm_ref
from flashtune.schema import ApiOp, Const, OpSchema, Tensor, Var, family_op
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = ["GEMM", "GEMM_KN", "gemm_examples"]

# ----------------------------------------------------------------------------------------------
# Schemas. Axes and tensors carry no description so that the generated Definitions equal the
# corpus files (gemm_n4096_k4096.json) field for field.
# ----------------------------------------------------------------------------------------------


def _gemm_schema(prefix: str, b_dims: list[str], reference: Any, layout: str) -> OpSchema:
    return OpSchema(
        op_type="gemm",
        name_prefix=prefix,
        axes={"M": Var(), "N": Const(abbrev="n"), "K": Const(abbrev="k")},
        inputs={
            "A": Tensor(["M", "K"], dtype_from="A"),
            "B": Tensor(b_dims, dtype_from="A"),
            "bias": Tensor(["N"], dtype_from="A", optional=True),
        },
        outputs={"C": Tensor(["M", "N"], dtype_from="A")},
        reference=reference,
        description=f"General matrix multiply (GEMM) C = {layout} (+ bias).",
    )


GEMM = _gemm_schema("gemm", ["N", "K"], gemm_ref, "A @ B.T")
# B stored [K, N]: its own Definition, since its B tensor has the other shape.
GEMM_KN = _gemm_schema("gemm_kn", ["K", "N"], gemm_kn_ref, "A @ B")


def _mm_schema(A: Any, B: Any, bias: Any = None, out: Any = None, b_layout: str = "nk") -> OpSchema:
    return GEMM_KN if b_layout == "kn" else GEMM


def _op(name: str) -> ApiOp:
    return family_op(__name__, name)


@register_examples
def gemm_examples(model: ModelConfig) -> list[Example]:
    """The layer's linear layers at decode (M = 1), float16 like the corpus definitions; and
    the down projection with its weight stored [K, N]."""
    gemm, mm = _op("gemm"), _op("mm")
    examples: list[Example] = []
    for n, k in model.gemm_nk():
        A, B = meta_tensor(1, k, dtype=torch.float16), meta_tensor(n, k, dtype=torch.float16)
        examples.append((gemm, (A, B), {}))
    n, k = model.gemm_nk()[-1]
    A = meta_tensor(1, k, dtype=torch.float16)
    B_kn = meta_tensor(k, n, dtype=torch.float16)
    examples.append((mm, (A, B_kn), {"b_layout": "kn"}))
    return examples

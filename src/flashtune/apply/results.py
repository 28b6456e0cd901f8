"""Result adapters: how a solution's outputs become what an op returns.

A solution returns its Definition's outputs; most ops return them as they are (an `out=`
argument, when given, receives the single output: the runtime does that). An op with other
conventions (in place, like fused_add_rmsnorm; `return_lse` and caller buffers, like the
attention calls) registers a result adapter here, from the adapter module of its family.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flashtune.schema.api import ApiOp

__all__ = ["RESULT_ADAPTERS", "ResultAdapter", "register_result_adapter", "result_adapter_for"]

ResultAdapter = Callable[[dict[str, Any], dict[str, Any]], Any]
"""(the op's bound arguments, the solution's outputs by definition output name) -> what the
op returns (writing into its arguments first when the op works in place)."""

RESULT_ADAPTERS: dict[ApiOp | str, ResultAdapter] = {}
"""By op, or by op qualname or op_type (for ops registered before they exist)."""


def register_result_adapter(key: ApiOp | str, fn: ResultAdapter) -> None:
    RESULT_ADAPTERS[key] = fn


def result_adapter_for(op: ApiOp) -> ResultAdapter | None:
    return (
        RESULT_ADAPTERS.get(op)
        or RESULT_ADAPTERS.get(op.qualname)
        or RESULT_ADAPTERS.get(op.schemas[0].op_type)
    )

"""Building blocks of the bundled workloads: stable ids, request lengths, index blobs."""

from __future__ import annotations

import ast
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch

from flashtune.data import Definition, Workload
from flashtune.ops.bundle import WorkloadContext

__all__ = [
    "blob",
    "indptr",
    "page_table",
    "paged_sweep",
    "ragged_sweep",
    "request_lengths",
    "solve_axes",
    "stable_uuid",
    "token_sweep",
]

_NS = uuid.UUID("6b3c1b9e-5a55-4d7c-8f0e-1f2a3b4c5d6e")


def stable_uuid(*parts: object) -> str:
    """A workload id from what defines it: regenerating the dataset keeps workload uuids (and
    so --resume) intact."""
    return str(uuid.uuid5(_NS, "/".join(map(str, parts))))


def request_lengths(batch: int, nominal: int, gen: torch.Generator) -> list[int]:
    """Per-request lengths around `nominal` (0.5x..1.5x), never empty; exact for batch 1."""
    if batch == 1:
        return [nominal]
    lo, hi = max(1, nominal // 2), max(1, nominal + nominal // 2)
    return torch.randint(lo, hi + 1, (batch,), generator=gen).tolist()


def indptr(lengths: Sequence[int]) -> torch.Tensor:
    """The int32 offsets [0, l0, l0 + l1, ...] of consecutive segments."""
    return torch.tensor([0, *torch.tensor(list(lengths)).cumsum(0).tolist()], dtype=torch.int32)


def page_table(lengths: Sequence[int], page_size: int) -> tuple[list[int], list[int]]:
    """Pages per request and each request's last-page length, for tokens `lengths`."""
    pages = [-(-n // page_size) for n in lengths]
    last = [n - (p - 1) * page_size for n, p in zip(lengths, pages, strict=True)]
    return pages, last


def blob(
    ctx: WorkloadContext, definition: Definition, wid: str, tensors: dict[str, torch.Tensor]
) -> dict[str, Any]:
    """Save a workload's index tensors as one safetensors blob; its inputs pointing at them."""
    from safetensors.torch import save_file

    rel = f"blob/workloads/{definition.op_type}/{definition.name}/{wid}.safetensors"
    path = ctx.root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return {k: {"type": "safetensors", "path": rel, "tensor_key": k} for k in tensors}


def solve_axes(definition: Definition, axes: dict[str, int]) -> dict[str, int]:
    """Fill var axes fixed by `axis == <expression of other axes>` constraints."""
    known = {**definition.const_axes, **axes}
    for expr in definition.constraints:
        tree = ast.parse(expr, mode="eval").body
        if isinstance(tree, ast.Compare) and isinstance(tree.left, ast.Name):
            target = tree.left.id
            if target in definition.var_axes and target not in axes:
                code = compile(ast.Expression(tree.comparators[0]), "<axis>", "eval")
                axes[target] = int(eval(code, {"__builtins__": {}}, known))  # noqa: S307
                known[target] = axes[target]
    return axes


def token_sweep(
    tokens: Sequence[int],
) -> Callable[[Definition, WorkloadContext], list[Workload]]:
    """Workloads at each of `tokens` on the definition's first var axis (rows of a norm or an
    activation, M of a GEMM), the other var axes solved from its constraints."""

    def workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
        axis = definition.var_axes[0]
        return [
            Workload(
                uuid=stable_uuid(definition.name, n),
                axes=solve_axes(definition, {axis: n}),
                inputs={},
            )
            for n in tokens
        ]

    return workloads


def ragged_sweep(
    sizes: Sequence[tuple[int, int]],
) -> Callable[[Definition, WorkloadContext], list[Workload]]:
    """Workloads of a ragged self-attention prefill (qo_len = kv_len per request) at each
    (batch, nominal length) of `sizes`: lengths drawn around the nominal one, the indptr
    arrays stored as a blob; the axes the definition declares as var axes."""

    def workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
        out = []
        for batch, n in sizes:
            wid = stable_uuid(definition.name, batch, n)
            lens = request_lengths(batch, n, ctx.generator)
            tensors = {"qo_indptr": indptr(lens), "kv_indptr": indptr(lens)}
            inputs = blob(ctx, definition, wid, tensors)
            axes = {"total_q": sum(lens), "total_kv": sum(lens), "len_indptr": batch + 1}
            axes = {k: v for k, v in axes.items() if k in definition.var_axes}
            out.append(Workload(uuid=wid, axes=axes, inputs=inputs))
        return out

    return workloads


# Pages of a paged cache that no request reads: the cache is never exactly the table.
SPARE_PAGES = 64


def paged_sweep(
    decode: Sequence[tuple[int, ...]], prefill: Sequence[tuple[int, ...]]
) -> Callable[[Definition, WorkloadContext], list[Workload]]:
    """Workloads of a paged attention definition: a decode (no qo_indptr input: one query a
    request) at each row of `decode`, a prefill at each row of `prefill`. A row is (batch,
    kv_len), whose prefill queries are each request's whole length, or (batch, qo_len,
    kv_len), whose queries are its last qo_len tokens; it also names the workload (its id).
    Request lengths are drawn around kv_len; the page table (at the definition's page size)
    is stored as a blob, kv_last_page_len where the definition takes it; the axes are those
    the definition declares as var axes."""

    def workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
        is_decode = "qo_indptr" not in definition.inputs
        page_size = definition.const_axes["page_size"]
        out = []
        for row in decode if is_decode else prefill:
            batch, kv_len = row[0], row[-1]
            wid = stable_uuid(definition.name, *row)
            lens = request_lengths(batch, kv_len, ctx.generator)
            qo = lens if len(row) == 2 else [min(row[1], n) for n in lens]
            pages, last = page_table(lens, page_size)
            tensors = {} if is_decode else {"qo_indptr": indptr(qo)}
            tensors["kv_indptr"] = indptr(pages)
            if "kv_last_page_len" in definition.inputs:
                tensors["kv_last_page_len"] = torch.tensor(last, dtype=torch.int32)
            axes = {
                "total_q": sum(qo),
                "batch_size": batch,
                "len_indptr": batch + 1,
                "num_kv_indices": sum(pages),
                "num_pages": sum(pages) + SPARE_PAGES,
            }
            axes = {k: v for k, v in axes.items() if k in definition.var_axes}
            inputs = blob(ctx, definition, wid, tensors)
            out.append(Workload(uuid=wid, axes=axes, inputs=inputs))
        return out

    return workloads

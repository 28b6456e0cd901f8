"""Paged attention for the model, per backend: plan once a step, then append and run per layer.

- torch: gathers each request's pages into a dense [B, L] cache and calls SDPA (the eager
  baseline: what a model without a paged-attention kernel does);
- flashtune / flashinfer: the libraries' `BatchDecodeWithPagedKVCacheWrapper` and
  `BatchPrefillWithPagedKVCacheWrapper` (same API), planned per step, and their
  `append_paged_kv_cache`.

A decode attention built with a `GraphShape` keeps every tensor its `append_kv`/`run` read in
buffers of fixed address and size: `plan` rewrites their contents, so a CUDA graph of the
decode step captured once replays correctly for the next step (FlashInfer's
use_cuda_graph=True contract).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F

from flashtune.models.paging import StepBatch

__all__ = [
    "AttentionShape",
    "check_graph_batch",
    "fill_static",
    "padded_page_table",
    "workspace_buffer",
    "GraphShape",
    "PagedAttention",
    "TorchDecodeAttention",
    "TorchPrefillAttention",
    "WrapperDecodeAttention",
    "WrapperPrefillAttention",
]


@dataclass(frozen=True)
class AttentionShape:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype
    device: torch.device

    @property
    def group(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def sm_scale(self) -> float:
        return self.head_dim**-0.5


@dataclass(frozen=True)
class GraphShape:
    """The fixed sizes of a CUDA-graph decode step: its batch, the pages all its requests
    hold together, and the most pages one request holds (torch gathers that many)."""

    batch_size: int
    max_pages: int
    max_pages_per_request: int


class PagedAttention(ABC):
    """One step's attention over the paged cache, shared by all layers of the step."""

    def __init__(self, shape: AttentionShape, graph: GraphShape | None = None) -> None:
        self.shape = shape
        self.graph = graph

    @abstractmethod
    def plan(self, batch: StepBatch) -> None:
        """Host work for the step (before a graph replay, never inside one)."""

    @abstractmethod
    def append_kv(self, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor) -> None:
        """Write the step's new k, v [nnz, Hk, D] into the layer's pool `cache`."""

    @abstractmethod
    def run(self, q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        """Attention of q [nnz, Hq, D] over the planned KV; returns [nnz, Hq, D]."""

    def _check_graph_batch(self, batch: StepBatch) -> GraphShape:
        assert self.graph is not None
        return check_graph_batch(self.graph, batch)


def check_graph_batch(graph: GraphShape, batch: StepBatch) -> GraphShape:
    """`graph`, after checking that `batch` is a decode step it holds (ValueError if not)."""
    if batch.batch_size != graph.batch_size or not batch.is_decode:
        raise ValueError(
            f"this decode attention was built for CUDA-graph steps of {graph.batch_size} "
            f"requests, got a step of q_lens {batch.q_lens}"
        )
    if sum(len(p) for p in batch.pages) > graph.max_pages:
        raise ValueError(f"the step's requests hold more than {graph.max_pages} pages")
    if max(len(p) for p in batch.pages) > graph.max_pages_per_request:
        raise ValueError(
            f"a request holds more than {graph.max_pages_per_request} pages (GraphShape)"
        )
    return graph


def fill_static(buffer: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Copy `values` into the front of `buffer` (fixed address); return that part."""
    part = buffer[: values.shape[0]]
    part.copy_(values, non_blocking=True)
    return part


def padded_page_table(batch: StepBatch, width: int) -> torch.Tensor:
    """[B, width] int64 on the device: each request's pages from the CSR table, padded with
    page 0 (read, then masked out by the caller); no host loop over pages."""
    starts, ends = batch.kv_indptr[:-1, None], batch.kv_indptr[1:, None]
    slots = starts + torch.arange(width, device=starts.device)
    last = max(batch.kv_indices.shape[0] - 1, 0)
    return torch.where(slots < ends, batch.kv_indices[slots.clamp(max=last)], 0).long()


# Outside torch.compile's graph: written there, the new K/V rows are a mutation of a view of
# the whole multi-layer cache, which inductor turned into a copy of every layer's K and V plus
# a rewrite of the entire cache each step (its generated code, tests/models): the decode step
# of `torch_compile` then moved the cache, not the step's bytes (53.9 ms against torch eager's
# 1.7 ms on an H100). Eager, the write is two index_put kernels, captured in the step's graph.
@torch.compiler.disable
def _write_slots(
    cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_pages: torch.Tensor,
    slot_offsets: torch.Tensor,
) -> None:
    cache[slot_pages, 0, slot_offsets] = k
    cache[slot_pages, 1, slot_offsets] = v


# ---------------------------------------------------------------------------------- torch


class TorchDecodeAttention(PagedAttention):
    """Decode with SDPA over each request's gathered pages, padded to the longest request.

    GQA without copying K/V per query head: the `group` query heads sharing a KV head are
    handed to SDPA as `group` query *rows* of that head, all attending to the same keys, so
    the mask [B, 1, 1, L] (valid KV) is the only extra tensor.
    """

    def __init__(self, shape: AttentionShape, graph: GraphShape | None = None) -> None:
        super().__init__(shape, graph)
        if graph is not None:
            dev, b = shape.device, graph.batch_size
            self._table = torch.zeros(b, graph.max_pages_per_request, dtype=torch.int64, device=dev)
            self._kv_lens = torch.zeros(b, dtype=torch.int64, device=dev)
            self._slot_pages = torch.zeros(b, dtype=torch.int64, device=dev)
            self._slot_offsets = torch.zeros(b, dtype=torch.int64, device=dev)

    def plan(self, batch: StepBatch) -> None:
        width = max(len(p) for p in batch.pages)
        if self.graph is not None:
            width = self._check_graph_batch(batch).max_pages_per_request
        table = padded_page_table(batch, width)
        kv_lens = torch.tensor(batch.kv_lens, dtype=torch.int64).to(self.shape.device)
        if self.graph is None:
            self._table, self._kv_lens = table, kv_lens
            self._slot_pages, self._slot_offsets = batch.slot_pages, batch.slot_offsets
        else:
            fill_static(self._table, table)
            fill_static(self._kv_lens, kv_lens)
            fill_static(self._slot_pages, batch.slot_pages)
            fill_static(self._slot_offsets, batch.slot_offsets)

    def append_kv(self, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor) -> None:
        _write_slots(cache, k, v, self._slot_pages, self._slot_offsets)

    def run(self, q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        s = self.shape
        b, hk, d = q.shape[0], s.num_kv_heads, s.head_dim
        # K, V pages gathered [B, P, page, Hk, D] -> [B, Hk, P * page, D] (views)
        k = cache[:, 0][self._table].view(b, -1, hk, d).transpose(1, 2)
        v = cache[:, 1][self._table].view(b, -1, hk, d).transpose(1, 2)
        valid = torch.arange(k.shape[2], device=q.device) < self._kv_lens[:, None]  # [B, L]
        grouped_q = q.view(b, hk, s.group, d)  # query head h = kv head h // group
        out = F.scaled_dot_product_attention(
            grouped_q, k, v, attn_mask=valid[:, None, None, :], scale=s.sm_scale
        )
        return out.reshape(b, hk * s.group, d)


class TorchPrefillAttention(PagedAttention):
    """Prefill with SDPA, one request at a time over its gathered pages (causal: the new
    tokens are the last q_len of the request's KV)."""

    def plan(self, batch: StepBatch) -> None:
        if self.graph is not None:
            raise ValueError("prefill runs eagerly: build it without a GraphShape")
        dev = self.shape.device
        self._batch = batch
        self._pages = [torch.tensor(p, dtype=torch.int64, device=dev) for p in batch.pages]

    def append_kv(self, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor) -> None:
        _write_slots(cache, k, v, self._batch.slot_pages, self._batch.slot_offsets)

    def run(self, q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        s, batch = self.shape, self._batch
        out = torch.empty_like(q)
        start = 0
        for q_len, kv_len, pages in zip(batch.q_lens, batch.kv_lens, self._pages, strict=True):
            kv = cache[pages].transpose(0, 1).reshape(2, -1, s.num_kv_heads, s.head_dim)
            k, v = (t[:kv_len].transpose(0, 1) for t in kv)  # [Hk, kv_len, D]
            q_req = q[start : start + q_len].transpose(0, 1)  # [Hq, q_len, D]
            # 4-D (a batch of one): SDPA's fused kernels take nothing else.
            q4, k4, v4 = q_req[None], k[None], v[None]
            if q_len == kv_len:  # a fresh prompt: plain causal (SDPA's flash kernel)
                o = F.scaled_dot_product_attention(
                    q4, k4, v4, is_causal=True, scale=s.sm_scale, enable_gqa=True
                )
            else:  # appending to a prefix: query i sees KV up to kv_len - q_len + i
                rows = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)
                mask = torch.arange(kv_len, device=q.device)[None, :] <= rows
                o = F.scaled_dot_product_attention(
                    q4, k4, v4, attn_mask=mask, scale=s.sm_scale, enable_gqa=True
                )
            out[start : start + q_len] = o[0].transpose(0, 1)
            start += q_len
        return out


# ------------------------------------------------------------- flashtune and flashinfer


def workspace_buffer(device: torch.device) -> torch.Tensor:
    # FlashInfer's recommended 128 MB on a GPU; the CPU test's plans need far less.
    nbytes = 128 * 2**20 if device.type == "cuda" else 16 * 2**20
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


class WrapperDecodeAttention(PagedAttention):
    """`lib.BatchDecodeWithPagedKVCacheWrapper` (lib: flashtune.ops.attention or flashinfer),
    planned per step; K/V appended with `lib.append_paged_kv_cache`."""

    def __init__(
        self,
        lib: ModuleType,
        shape: AttentionShape,
        graph: GraphShape | None = None,
        use_tensor_cores: bool = True,
    ) -> None:
        super().__init__(shape, graph)
        self._lib = lib
        wrapper = lib.BatchDecodeWithPagedKVCacheWrapper
        if graph is None:
            self._wrapper = wrapper(
                workspace_buffer(shape.device), "NHD", use_tensor_cores=use_tensor_cores
            )
            return
        dev, b = shape.device, graph.batch_size

        def ints(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int32, device=dev)

        self._indptr, self._indices, self._last = ints(b + 1), ints(graph.max_pages), ints(b)
        self._batch_indices, self._positions = ints(b), ints(b)
        self._wrapper = wrapper(
            workspace_buffer(dev),
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=self._indptr,
            paged_kv_indices_buffer=self._indices,
            paged_kv_last_page_len_buffer=self._last,
        )

    def plan(self, batch: StepBatch) -> None:
        # plan() gets the lengths on the host, as serving engines hand them over (no
        # device-to-host sync in plan); in graph mode the wrapper copies the whole table into
        # the buffers the graph reads, which append_kv reads too, and without a graph the
        # page ids stay the caller's device tensor.
        indptr, indices, last = (
            batch.kv_indptr_host,
            batch.kv_indices_host,
            batch.kv_last_page_len_host,
        )
        if self.graph is None:
            self._indptr, self._indices = batch.kv_indptr, batch.kv_indices
            self._last = batch.kv_last_page_len
            self._batch_indices, self._positions = batch.batch_indices, batch.positions
            indices = self._indices
        else:
            self._check_graph_batch(batch)
            fill_static(self._batch_indices, batch.batch_indices)
            fill_static(self._positions, batch.positions)
        s = self.shape
        self._wrapper.plan(
            indptr,
            indices,
            last,
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            s.page_size,
            q_data_type=s.dtype,
            kv_data_type=s.dtype,
            sm_scale=s.sm_scale,
        )

    def append_kv(self, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor) -> None:
        # The whole indices buffer: entries past the step's pages are never looked up.
        self._lib.append_paged_kv_cache(
            k,
            v,
            self._batch_indices,
            self._positions,
            cache,
            self._indices,
            self._indptr,
            self._last,
            "NHD",
        )

    def run(self, q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._wrapper.run(q, cache)
        return out


class WrapperPrefillAttention(PagedAttention):
    """`lib.BatchPrefillWithPagedKVCacheWrapper`, causal, planned per step."""

    def __init__(self, lib: ModuleType, shape: AttentionShape) -> None:
        super().__init__(shape)
        self._lib = lib
        self._wrapper = lib.BatchPrefillWithPagedKVCacheWrapper(
            workspace_buffer(shape.device), "NHD"
        )

    def plan(self, batch: StepBatch) -> None:
        s = self.shape
        self._batch = batch
        self._wrapper.plan(
            batch.qo_indptr,
            batch.kv_indptr,
            batch.kv_indices,
            batch.kv_last_page_len,
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            s.page_size,
            causal=True,
            sm_scale=s.sm_scale,
            q_data_type=s.dtype,
            kv_data_type=s.dtype,
        )

    def append_kv(self, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor) -> None:
        b = self._batch
        self._lib.append_paged_kv_cache(
            k,
            v,
            b.batch_indices,
            b.positions,
            cache,
            b.kv_indices,
            b.kv_indptr,
            b.kv_last_page_len,
            "NHD",
        )

    def run(self, q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._wrapper.run(q, cache)
        return out

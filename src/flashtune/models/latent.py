"""Multi-head Latent Attention for the DeepSeek-V3 decoder (deepseek.py), per backend, over a
paged latent cache: plan once a step, then append and run per layer.

A token's cache entry is its compressed latent `ckv` (kv_lora_rank, 512) and its RoPE key
`kpe` (qk_rope_head_dim, 64), shared by every query head; one pool of each per layer
([num_pages, page_size, 512] and [num_pages, page_size, 64]: FlashInfer's MLA layout).

Two forms of the same attention:

- absorbed (`LatentAttention`: decode, and prefill over a cached prefix): a query head
  brings q_nope absorbed into the latent space (q_nope @ W_UK, [H, 512]) and its q_pe [H,
  64]; logit = sm_scale * (q_nope . ckv + q_pe . kpe); the output is the softmax-weighted sum
  of ckv [H, 512] (the model projects it through W_UV). torch: SDPA over the gathered pages;
  flashtune / flashinfer: the libraries' `BatchMLAPagedAttentionWrapper`, planned per step.
- non-absorbed (`RaggedAttention`: prefill of fresh prompts, as DeepSeek serves long
  prompts): keys and values decompressed per head by the model (kv_b_proj), QK head dim 192
  (128 nope + 64 rope), V 128, causal attention over each prompt's own tokens. torch: SDPA
  per prompt; flashtune: `mla_ragged_prefill`; flashinfer:
  `BatchPrefillWithRaggedKVCacheWrapper`.

Every backend writes the step's latents into the pages by index (no library has a faster
way worth the difference at one token a request: FlashInfer's append_paged_mla_kv_cache is
the same scatter). A decode attention built with a `GraphShape` keeps what its append / run
read in buffers of fixed address, as attention.py's do (CUDA-graph replay).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F

from flashtune.models.attention import (
    GraphShape,
    check_graph_batch,
    fill_static,
    padded_page_table,
    workspace_buffer,
)
from flashtune.models.paging import StepBatch

__all__ = [
    "PagedLatentCache",
    "MLAShape",
    "MLAStep",
    "LatentAttention",
    "RaggedAttention",
    "TorchLatentDecode",
    "TorchLatentPrefill",
    "TorchRaggedPrefill",
    "WrapperLatentAttention",
    "FlashtuneRaggedPrefill",
    "FlashinferRaggedPrefill",
    "host_qo_indptr",
]

LatentPool = tuple[torch.Tensor, torch.Tensor]  # one layer's (ckv, kpe) pages


class PagedLatentCache:
    """The latent pages of every layer: ckv [layers, num_pages, page_size, kv_lora_rank] and
    kpe [layers, num_pages, page_size, qk_rope_head_dim]."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        kv_lora_rank: int,
        rope_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.ckv = torch.zeros(
            num_layers, num_pages, page_size, kv_lora_rank, dtype=dtype, device=device
        )
        self.kpe = torch.zeros(
            num_layers, num_pages, page_size, rope_dim, dtype=dtype, device=device
        )
        self.page_size = page_size
        self.num_pages = num_pages

    def layer(self, index: int) -> LatentPool:
        """Layer `index`'s pools (ckv [num_pages, page_size, Dc], kpe [.., Dp]; contiguous)."""
        return self.ckv[index], self.kpe[index]

    def fill_random(self, generator: torch.Generator | None = None) -> None:
        """Random latents everywhere (a benchmark's stand-in for prompts it did not prefill)."""
        self.ckv.normal_(generator=generator)
        self.kpe.normal_(generator=generator)


@dataclass(frozen=True)
class MLAShape:
    num_heads: int
    kv_lora_rank: int  # the latent: head_dim_ckv of the absorbed form
    rope_dim: int  # head_dim_kpe
    qk_nope_dim: int  # the non-absorbed form's QK head dim is qk_nope_dim + rope_dim
    v_head_dim: int
    page_size: int
    sm_scale: float
    dtype: torch.dtype
    device: torch.device

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_dim + self.rope_dim


# Outside torch.compile's graph, as attention.py's _write_slots (a mutation of a view of the
# whole multi-layer cache would make inductor copy every layer's pages each step).
@torch.compiler.disable
def _write_latent(
    cache: LatentPool,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    slot_pages: torch.Tensor,
    slot_offsets: torch.Tensor,
) -> None:
    cache[0][slot_pages, slot_offsets] = ckv
    cache[1][slot_pages, slot_offsets] = kpe


class MLAStep(ABC):
    """One step's MLA, shared by all layers of the step: `plan` (host), then per layer
    `append` (the step's latents into the layer's pages) and the form's `run`."""

    absorbed: bool = True

    def __init__(self, shape: MLAShape, graph: GraphShape | None = None) -> None:
        self.shape = shape
        self.graph = graph
        if graph is not None:
            dev, b = shape.device, graph.batch_size
            self._slot_pages = torch.zeros(b, dtype=torch.int64, device=dev)
            self._slot_offsets = torch.zeros(b, dtype=torch.int64, device=dev)

    def plan(self, batch: StepBatch) -> None:
        """Host work for the step (before a graph replay, never inside one)."""
        if self.graph is None:
            self._slot_pages, self._slot_offsets = batch.slot_pages, batch.slot_offsets
        else:
            check_graph_batch(self.graph, batch)
            fill_static(self._slot_pages, batch.slot_pages)
            fill_static(self._slot_offsets, batch.slot_offsets)
        self._plan(batch)

    @abstractmethod
    def _plan(self, batch: StepBatch) -> None: ...

    def append(self, ckv: torch.Tensor, kpe: torch.Tensor, cache: LatentPool) -> None:
        """Write the step's new latents ckv [nnz, Dc] and RoPE keys kpe [nnz, Dp]."""
        _write_latent(cache, ckv, kpe, self._slot_pages, self._slot_offsets)


class LatentAttention(MLAStep):
    """The absorbed form over the paged latent cache."""

    absorbed = True

    @abstractmethod
    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, cache: LatentPool) -> torch.Tensor:
        """q_nope [nnz, H, Dc] (absorbed), q_pe [nnz, H, Dp] -> [nnz, H, Dc]."""


class RaggedAttention(MLAStep):
    """The non-absorbed form over the step's own tokens (fresh prompts)."""

    absorbed = False

    def plan(self, batch: StepBatch) -> None:
        if any(q != kv for q, kv in zip(batch.q_lens, batch.kv_lens, strict=True)):
            raise ValueError("the ragged (non-absorbed) prefill takes fresh prompts only")
        super().plan(batch)

    @abstractmethod
    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k [nnz, H, Dqk], v [nnz, H, Dv] -> [nnz, H, Dv], causal per prompt."""


def _sdpa_latent(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """The absorbed form as one-KV-head attention: q [B, H, q, Dc + Dp] against k = [ckv |
    kpe] [B, 1, L, Dc + Dp], v = ckv [B, 1, L, Dc]; mask [B, 1, q, L] (True: attend).

    Written out (two score matmuls, an fp32 softmax, one value matmul), as DeepSeek's own
    inference code writes the absorbed form, not through SDPA: torch.compile lowered SDPA at
    these head sizes (576 / 512) to the memory-efficient kernel, which has none for them
    ("cutlassF: no kernel found to launch", H200, 2026-11-29), so the compiled torch peer of
    the MoE decoder could not run at all."""
    scores = torch.matmul(q_nope, ckv.transpose(-1, -2)) + torch.matmul(q_pe, kpe.transpose(-1, -2))
    scores = scores.float() * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1).to(ckv.dtype), ckv)


# ---------------------------------------------------------------------------------- torch


class TorchLatentDecode(LatentAttention):
    """Decode with SDPA over each request's gathered latent pages, padded to the longest."""

    def __init__(self, shape: MLAShape, graph: GraphShape | None = None) -> None:
        super().__init__(shape, graph)
        if graph is not None:
            dev, b = shape.device, graph.batch_size
            self._table = torch.zeros(b, graph.max_pages_per_request, dtype=torch.int64, device=dev)
            self._kv_lens = torch.zeros(b, dtype=torch.int64, device=dev)

    def _plan(self, batch: StepBatch) -> None:
        if not batch.is_decode:
            raise ValueError(f"decode attention got a step of q_lens {batch.q_lens}")
        graph = self.graph
        width = max(len(p) for p in batch.pages) if graph is None else graph.max_pages_per_request
        table = padded_page_table(batch, width)
        kv_lens = torch.tensor(batch.kv_lens, dtype=torch.int64).to(self.shape.device)
        if graph is None:
            self._table, self._kv_lens = table, kv_lens
        else:
            fill_static(self._table, table)
            fill_static(self._kv_lens, kv_lens)

    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, cache: LatentPool) -> torch.Tensor:
        b, s = q_nope.shape[0], self.shape
        ckv = cache[0][self._table].view(b, 1, -1, s.kv_lora_rank)  # [B, 1, L, Dc]
        kpe = cache[1][self._table].view(b, 1, -1, s.rope_dim)
        valid = torch.arange(ckv.shape[2], device=q_nope.device) < self._kv_lens[:, None]
        # The H query heads as H query rows of the one latent head.
        out = _sdpa_latent(
            q_nope[:, None], q_pe[:, None], ckv, kpe, valid[:, None, None, :], s.sm_scale
        )
        return out[:, 0]


class TorchLatentPrefill(LatentAttention):
    """Prefill over a cached prefix, absorbed: SDPA one request at a time, causal with the
    new tokens the last q_len of the request's KV."""

    def _plan(self, batch: StepBatch) -> None:
        if self.graph is not None:
            raise ValueError("prefill runs eagerly: build it without a GraphShape")
        self._batch = batch
        dev = self.shape.device
        self._pages = [torch.tensor(p, dtype=torch.int64, device=dev) for p in batch.pages]

    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, cache: LatentPool) -> torch.Tensor:
        s, batch = self.shape, self._batch
        out = q_nope.new_empty(q_nope.shape)
        start = 0
        for q_len, kv_len, pages in zip(batch.q_lens, batch.kv_lens, self._pages, strict=True):
            ckv = cache[0][pages].reshape(-1, s.kv_lora_rank)[:kv_len]
            kpe = cache[1][pages].reshape(-1, s.rope_dim)[:kv_len]
            rows = torch.arange(q_len, device=q_nope.device)[:, None] + (kv_len - q_len)
            mask = torch.arange(kv_len, device=q_nope.device)[None, :] <= rows  # [q, L]
            end = start + q_len
            o = _sdpa_latent(
                q_nope[start:end].transpose(0, 1)[None],  # [1, H, q, Dc]
                q_pe[start:end].transpose(0, 1)[None],
                ckv[None, None],
                kpe[None, None],
                mask[None, None],
                s.sm_scale,
            )
            out[start:end] = o[0].transpose(0, 1)
            start = end
        return out


class TorchRaggedPrefill(RaggedAttention):
    """Fresh prompts, non-absorbed: causal SDPA per prompt (QK 192, V 128 per head)."""

    def _plan(self, batch: StepBatch) -> None:
        self._q_lens = batch.q_lens

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = v.new_empty(*q.shape[:2], v.shape[-1])
        start = 0
        for n in self._q_lens:
            end = start + n
            q4, k4, v4 = (t[start:end].transpose(0, 1)[None] for t in (q, k, v))
            o = F.scaled_dot_product_attention(
                q4, k4, v4, is_causal=True, scale=self.shape.sm_scale
            )
            out[start:end] = o[0].transpose(0, 1)
            start = end
        return out


# ------------------------------------------------------------- flashtune and flashinfer


def host_qo_indptr(batch: StepBatch) -> torch.Tensor:
    """[B + 1] int32 on the host: the step's qo_indptr, as plan() reads it."""
    qo_indptr = torch.zeros(batch.batch_size + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.tensor(batch.q_lens, dtype=torch.int32).cumsum(0)
    return qo_indptr


class WrapperLatentAttention(LatentAttention):
    """`lib.BatchMLAPagedAttentionWrapper` (lib: flashtune.ops.mla or flashinfer.mla), planned
    per step with the page table on the host; causal for prefill over a prefix (decode: one
    query a request, causal or not the same)."""

    def __init__(
        self,
        lib: ModuleType,
        shape: MLAShape,
        graph: GraphShape | None = None,
        causal: bool = False,
        contiguous_q: bool = False,
    ) -> None:
        super().__init__(shape, graph)
        self._causal = causal
        self._contiguous_q = contiguous_q  # FlashInfer's kernels: dense q rows
        wrapper = lib.BatchMLAPagedAttentionWrapper
        dev = shape.device
        if graph is None:
            self._wrapper = wrapper(workspace_buffer(dev))
            return
        b = graph.batch_size

        def ints(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int32, device=dev)

        self._wrapper = wrapper(
            workspace_buffer(dev),
            use_cuda_graph=True,
            qo_indptr=ints(b + 1),
            kv_indptr=ints(b + 1),
            kv_indices=ints(graph.max_pages),
            kv_len_arr=ints(b),
        )

    def _plan(self, batch: StepBatch) -> None:
        s = self.shape
        kv_len = torch.tensor(batch.kv_lens, dtype=torch.int32)
        # Graph mode: the wrapper copies the host table into the buffers its graph reads;
        # without a graph, the page ids stay the caller's device tensor.
        indices = batch.kv_indices_host if self.graph is not None else batch.kv_indices
        self._wrapper.plan(
            host_qo_indptr(batch),
            batch.kv_indptr_host,
            indices,
            kv_len,
            s.num_heads,
            s.kv_lora_rank,
            s.rope_dim,
            s.page_size,
            self._causal,
            s.sm_scale,
            s.dtype,
            s.dtype,
        )

    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, cache: LatentPool) -> torch.Tensor:
        if self._contiguous_q:
            q_nope, q_pe = q_nope.contiguous(), q_pe.contiguous()
        out: torch.Tensor = self._wrapper.run(q_nope, q_pe, cache[0], cache[1])
        return out


class FlashtuneRaggedPrefill(RaggedAttention):
    """flashtune's `mla_ragged_prefill` (plan-free): each prompt's keys are its queries'."""

    def __init__(self, mla: ModuleType, shape: MLAShape) -> None:
        super().__init__(shape)
        self._mla = mla

    def _plan(self, batch: StepBatch) -> None:
        self._qo_indptr = batch.qo_indptr

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._mla.mla_ragged_prefill(
            q, k, v, self._qo_indptr, self._qo_indptr, True, self.shape.sm_scale
        )
        return out


class FlashinferRaggedPrefill(RaggedAttention):
    """FlashInfer's `BatchPrefillWithRaggedKVCacheWrapper` (head_dim_qk 192, head_dim_vo 128),
    causal, planned per step."""

    def __init__(self, lib: ModuleType, shape: MLAShape) -> None:
        super().__init__(shape)
        self._wrapper = lib.BatchPrefillWithRaggedKVCacheWrapper(
            workspace_buffer(shape.device), "NHD"
        )

    def _plan(self, batch: StepBatch) -> None:
        s = self.shape
        qo_indptr = host_qo_indptr(batch)  # on the host: no device-to-host sync in plan
        self._wrapper.plan(
            qo_indptr,
            qo_indptr,
            s.num_heads,
            s.num_heads,
            s.qk_head_dim,
            head_dim_vo=s.v_head_dim,
            causal=True,
            sm_scale=s.sm_scale,
            q_data_type=s.dtype,
            kv_data_type=s.dtype,
        )

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._wrapper.run(q, k, v)
        return out

"""The model's paged KV cache: the page pool, a host-side page table, and one step's batch.

A request's KV lives in pages of `page_size` tokens scattered through one pool per layer
([num_pages, 2, page_size, num_kv_heads, head_dim], K at index 0, V at 1: FlashInfer's
5-D NHD layout). The host keeps which pages each request owns (`PageTable`); before every
forward it describes the step to the attention backends as a `StepBatch`: the CSR page table
FlashInfer's wrappers take, and where each new token's K/V goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["PagedKVCache", "PageTable", "StepBatch"]


class PagedKVCache:
    """The K/V pages of every layer in one tensor [layers, num_pages, 2, page_size, Hk, D]."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (num_layers, num_pages, 2, page_size, num_kv_heads, head_dim)
        self.pages = torch.zeros(shape, dtype=dtype, device=device)
        self.page_size = page_size
        self.num_pages = num_pages

    def layer(self, index: int) -> torch.Tensor:
        """Layer `index`'s pool [num_pages, 2, page_size, Hk, D] (a contiguous view)."""
        return self.pages[index]

    def fill_random(self, generator: torch.Generator | None = None) -> None:
        """Random K/V everywhere: a benchmark's stand-in for the prompts it did not prefill
        (attention over zeros would time the kernels on data they never see)."""
        self.pages.normal_(generator=generator)


@dataclass(frozen=True)
class StepBatch:
    """One forward step's requests, described for the attention backends.

    Device tensors are int32 unless noted; `nnz` is the number of new tokens in the step.
    """

    q_lens: tuple[int, ...]  # new tokens of each request
    kv_lens: tuple[int, ...]  # each request's KV length after the step (new tokens included)
    pages: tuple[tuple[int, ...], ...]  # each request's page ids, in order
    page_size: int
    qo_indptr: torch.Tensor  # [B + 1] the new tokens of request b: qo_indptr[b]:qo_indptr[b+1]
    kv_indptr: torch.Tensor  # [B + 1] its pages: kv_indices[kv_indptr[b]:kv_indptr[b+1]]
    kv_indices: torch.Tensor  # [nnz_pages]
    kv_last_page_len: torch.Tensor  # [B] tokens in each request's last page
    batch_indices: torch.Tensor  # [nnz] the request of each new token
    positions: torch.Tensor  # [nnz] each new token's position in its request's KV
    slot_pages: torch.Tensor  # [nnz] int64: the page each new token's K/V goes to
    slot_offsets: torch.Tensor  # [nnz] int64: its slot in that page
    # The page table on the host, as serving engines hand it to plan(): a plan reads its
    # lengths on the host, and device inputs would cost it a device-to-host sync.
    kv_indptr_host: torch.Tensor  # kv_indptr, kv_indices and kv_last_page_len on the host
    kv_indices_host: torch.Tensor
    kv_last_page_len_host: torch.Tensor

    @property
    def batch_size(self) -> int:
        return len(self.q_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)

    @property
    def is_decode(self) -> bool:
        return all(n == 1 for n in self.q_lens)

    @property
    def last_token_rows(self) -> torch.Tensor:
        """[B] int64: the row of each request's last new token (the one to sample from)."""
        return (self.qo_indptr[1:] - 1).to(torch.int64)


class PageTable:
    """Which pages each request owns, on the host; hands out pages from a free list."""

    def __init__(self, num_pages: int, page_size: int, device: torch.device | str) -> None:
        self.page_size = page_size
        self.device = torch.device(device)
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out page 0 first
        self.pages: list[list[int]] = []
        self.lens: list[int] = []

    def add_request(self, kv_len: int = 0) -> int:
        """A new request holding `kv_len` tokens already (their K/V is whatever its pages
        hold: a benchmark's stand-in for a prefilled prompt); returns its id."""
        self.pages.append([])
        self.lens.append(0)
        request = len(self.lens) - 1
        self._grow(request, kv_len)
        return request

    def release(self, requests: Sequence[int]) -> None:
        """End these requests: their pages return to the free list (their ids stay taken,
        holding no pages and no tokens)."""
        for request in requests:
            self._free.extend(reversed(self.pages[request]))
            self.pages[request] = []
            self.lens[request] = 0

    def _grow(self, request: int, new_tokens: int) -> None:
        needed = -(-(self.lens[request] + new_tokens) // self.page_size)
        missing = needed - len(self.pages[request])
        if missing > len(self._free):  # checked first: a refused request takes nothing
            raise RuntimeError(
                f"the KV cache is out of pages (request {request} needs {needed}); "
                "build the model with more pages"
            )
        self.lens[request] += new_tokens
        for _ in range(missing):
            self.pages[request].append(self._free.pop())

    def step(self, requests: Sequence[int], q_lens: Sequence[int]) -> StepBatch:
        """Append q_lens[i] new tokens to requests[i] (allocating pages) and describe the
        step. Decode is q_lens = [1] * B; a prefill of fresh prompts is their lengths."""
        if len(requests) != len(q_lens):
            raise ValueError(f"{len(requests)} requests but {len(q_lens)} q_lens")
        if any(n < 1 for n in q_lens):
            raise ValueError(f"every request of a step needs a new token, got q_lens={q_lens}")
        for request, n in zip(requests, q_lens, strict=True):
            self._grow(request, n)
        ps = self.page_size
        kv_lens = tuple(self.lens[r] for r in requests)
        pages = tuple(tuple(self.pages[r]) for r in requests)
        qo_indptr, kv_indptr = [0], [0]
        batch_indices: list[int] = []
        positions: list[int] = []
        slot_pages: list[int] = []
        for b, (n, kv_len, own) in enumerate(zip(q_lens, kv_lens, pages, strict=True)):
            qo_indptr.append(qo_indptr[-1] + n)
            kv_indptr.append(kv_indptr[-1] + len(own))
            batch_indices += [b] * n
            new_positions = list(range(kv_len - n, kv_len))
            positions += new_positions
            slot_pages += [own[p // ps] for p in new_positions]

        def device(values: Sequence[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        host_indptr = torch.tensor(kv_indptr, dtype=torch.int32)
        host_indices = torch.tensor([p for own in pages for p in own], dtype=torch.int32)
        host_last = torch.tensor([(n - 1) % ps + 1 for n in kv_lens], dtype=torch.int32)
        return StepBatch(
            q_lens=tuple(q_lens),
            kv_lens=kv_lens,
            pages=pages,
            page_size=ps,
            qo_indptr=device(qo_indptr),
            kv_indptr=host_indptr.to(self.device, non_blocking=True),
            kv_indices=host_indices.to(self.device, non_blocking=True),
            kv_last_page_len=host_last.to(self.device, non_blocking=True),
            batch_indices=device(batch_indices),
            positions=device(positions),
            slot_pages=device(slot_pages, torch.int64),
            slot_offsets=device([p % ps for p in positions], torch.int64),
            kv_indptr_host=host_indptr,
            kv_indices_host=host_indices,
            kv_last_page_len_host=host_last,
        )

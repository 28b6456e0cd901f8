"""CUDA-graph mode of the prefill wrappers: fixed buffers, a fixed grid, a fixed tactic.

FlashInfer's serving pattern: plan a warm-up batch, capture `run()` in a CUDA graph, then
every step plan again with the real lengths and `replay()`. A replay re-launches the kernel
exactly as captured: the same grid, the same pointers, the same scalar arguments. So in
graph mode every array the kernel reads lives in a buffer allocated once and rewritten in
place by each plan, the grid is an upper bound fixed at the first plan, and what is baked
into the launch (heads, head_dim, page size, causal, window, soft-cap, scale, the custom
mask's presence, the tactic) must not change between plans: a plan that would change it
raises instead of letting a replay compute garbage.

- Work list: [max_items, 8] int32 with max_items = cdiv(max_total_rows, tokens per tile) +
  batch (each request rounds its last tile up at most once); rows past the plan's items are
  zeros, i.e. empty requests whose programs store nothing.
- max_total_rows: the first plan's qo_indptr[-1], as FlashInfer fixes it; later plans may
  have fewer query tokens, never more.
- Page ids: copied into the caller's paged_kv_indices_buf (the kernel reads it directly).
- Custom mask: a byte per element in buffers of this module sized from custom_mask_buf
  (FlashInfer's bit-packed buffer: numel * 8 elements) and mask_indptr_buf (batch + 1).
- Tactic: the default for the batch size and the longest KV the buffers allow (paged) with
  no page staging (its copy's size is the plan's page count, a shape the graph would fix);
  the autotuner is not consulted, as a tuned tactic could change between plans.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashtune.ops.attention.prefill.config import PrefillTactic, default_tactic_for
from flashtune.ops.attention.staging import packed_offsets

__all__ = ["PrefillGraph", "LaunchSignature"]


@dataclass(frozen=True)
class LaunchSignature:
    """What a captured launch bakes in besides the buffers' contents."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    causal: bool
    window_left: int
    logits_soft_cap: float
    sm_scale: float
    custom_mask: bool
    q_dtype: torch.dtype | None
    kv_dtype: torch.dtype | None
    rope: tuple[float, float] | None
    alibi: bool = False


def _int32_buffer(t: object, name: str, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} should be a torch.Tensor in CUDA graph mode")
    if t.dim() != 1 or t.dtype != torch.int32 or t.device != device:
        raise ValueError(
            f"{name} must be a 1-D int32 tensor on {device} (the workspace's device), got "
            f"shape {tuple(t.shape)} {t.dtype} on {t.device}"
        )
    return t


class PrefillGraph:
    """The fixed buffers of one graph-mode prefill wrapper (paged or ragged)."""

    def __init__(
        self,
        device: torch.device,
        qo_indptr_buf: torch.Tensor | None,
        kv_indptr_buf: torch.Tensor | None,
        kv_indices_buf: torch.Tensor | None,
        kv_last_page_len_buf: torch.Tensor | None,
        custom_mask_buf: torch.Tensor | None,
        mask_indptr_buf: torch.Tensor | None,
        *,
        paged: bool,
    ) -> None:
        kv_name = "paged_kv_indptr_buf" if paged else "kv_indptr_buf"
        self.qo_indptr_buf = _int32_buffer(qo_indptr_buf, "qo_indptr_buf", device)
        self.kv_indptr_buf = _int32_buffer(kv_indptr_buf, kv_name, device)
        self.batch = self.qo_indptr_buf.numel() - 1
        if self.batch < 0:
            raise ValueError("qo_indptr_buf must hold batch_size + 1 >= 1 entries")
        if self.kv_indptr_buf.numel() != self.batch + 1:
            raise ValueError(
                f"The length of {kv_name} should be batch_size + 1 = {self.batch + 1} (from "
                f"qo_indptr_buf), got {self.kv_indptr_buf.numel()}"
            )
        self.kv_indices_buf: torch.Tensor | None = None
        self.kv_last_page_len_buf: torch.Tensor | None = None
        if paged:
            self.kv_indices_buf = _int32_buffer(kv_indices_buf, "paged_kv_indices_buf", device)
            last = _int32_buffer(kv_last_page_len_buf, "paged_kv_last_page_len_buf", device)
            if last.numel() != self.batch:
                raise ValueError(
                    f"The length of paged_kv_last_page_len_buf should be batch_size = "
                    f"{self.batch}, got {last.numel()}"
                )
            self.kv_last_page_len_buf = last
        # Custom masks: FlashInfer's buffers are bit-packed; the kernel reads a byte per
        # element, so only their sizes are taken (buffers of our own, allocated on use).
        self.mask_capacity = None if custom_mask_buf is None else custom_mask_buf.numel() * 8
        self.has_mask_indptr_buf = mask_indptr_buf is not None
        self.mask: torch.Tensor | None = None  # [mask_capacity] uint8
        self.mask_indptr: torch.Tensor | None = None  # [batch + 1] int64
        self.device = device
        # Fixed at the first plan.
        self.signature: LaunchSignature | None = None
        self.max_total_rows: int | None = None
        self.tactic: PrefillTactic | None = None
        self.max_items = 0
        self.ints: torch.Tensor | None = None  # qo_indptr | kv_indptr | kv_lens | work

    def check_batch(self, batch: int, total_rows: int, nnz_pages: int) -> None:
        """FlashInfer's graph-mode limits: a fixed batch size, no more rows than the first
        plan's, no more pages than paged_kv_indices_buf holds."""
        if batch != self.batch:
            raise ValueError(
                f"The batch size should be fixed during the lifecycle of the wrapper in cuda "
                f"graph mode, the runtime batch size {batch} mismatches the batch size "
                f"{self.batch} set during initialization (qo_indptr_buf)"
            )
        if self.max_total_rows is not None and total_rows > self.max_total_rows:
            raise ValueError(
                f"The total number of rows in qo_indptr {total_rows} in cuda graph mode cannot "
                f"exceed the number of rows set by the first plan {self.max_total_rows}"
            )
        if self.kv_indices_buf is not None and nnz_pages > self.kv_indices_buf.numel():
            raise ValueError(
                f"paged_kv_indptr[-1]={nnz_pages} pages exceed paged_kv_indices_buf's "
                f"{self.kv_indices_buf.numel()} entries"
            )

    def fix_launch(
        self, signature: LaunchSignature, total_rows: int, group: int, paged: bool, kv_len: int
    ) -> PrefillTactic:
        """The tactic of every plan of this wrapper (picked at the first plan), after checking
        that `signature` is the one the first plan fixed."""
        if self.signature is None:
            self.signature = signature
            self.max_total_rows = total_rows
            if paged:
                assert self.kv_indices_buf is not None
                kv_len = max(kv_len, self.kv_indices_buf.numel() * signature.page_size)
            self.tactic = default_tactic_for(
                paged=paged,
                group=group,
                head_dim=signature.head_dim,
                kv_len=kv_len,
                can_stage=not paged,
                device=self.device,
            )
            tokens = self.tactic.tokens_per_tile(group)
            self.max_items = -(-total_rows // tokens) + self.batch
            # The layout of prefill/plan.py's packed arrays (qo_indptr | kv_indptr | kv_lens | work).
            _, n = packed_offsets([self.batch + 1, self.batch + 1, self.batch, 8 * self.max_items])
            self.ints = torch.zeros(n, dtype=torch.int32, device=self.device)
        elif signature != self.signature:
            changed = [
                f"{name}: {getattr(self.signature, name)!r} -> {getattr(signature, name)!r}"
                for name in LaunchSignature.__dataclass_fields__
                if getattr(signature, name) != getattr(self.signature, name)
            ]
            raise ValueError(
                "CUDA-graph prefill wrapper re-planned with different launch parameters ("
                + ", ".join(changed)
                + "): a captured graph would replay the old ones; build a new wrapper"
            )
        assert self.tactic is not None
        return self.tactic

    def store_mask(
        self, mask: torch.Tensor, mask_indptr: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy a plan's mask (uint8) and its offsets (int64) into the fixed buffers."""
        if self.mask_capacity is None or not self.has_mask_indptr_buf:
            raise ValueError(
                "custom_mask_buf and mask_indptr_buf must be given at construction to use a "
                "custom mask in cuda graph mode"
            )
        if mask.numel() > self.mask_capacity:
            raise ValueError(
                f"custom_mask has {mask.numel()} elements; custom_mask_buf holds "
                f"{self.mask_capacity} (8 per byte)"
            )
        if self.mask is None or self.mask_indptr is None:
            self.mask = torch.zeros(self.mask_capacity, dtype=torch.uint8, device=self.device)
            self.mask_indptr = torch.zeros(self.batch + 1, dtype=torch.int64, device=self.device)
        self.mask[: mask.numel()].copy_(mask)
        self.mask_indptr.copy_(mask_indptr)
        return self.mask, self.mask_indptr

    def store_indices(
        self, kv_indices: torch.Tensor, kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor
    ) -> torch.Tensor:
        """Copy the page table into the caller's buffers (where it is not already there)."""
        indices, last = self.kv_indices_buf, self.kv_last_page_len_buf
        assert indices is not None and last is not None  # paged
        _copy_into(indices, kv_indices)
        _copy_into(last, kv_last_page_len)
        _copy_into(self.kv_indptr_buf, kv_indptr)
        return indices

    def store_qo_indptr(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor | None) -> None:
        _copy_into(self.qo_indptr_buf, qo_indptr)
        if kv_indptr is not None:
            _copy_into(self.kv_indptr_buf, kv_indptr)


def _copy_into(buf: torch.Tensor, src: torch.Tensor) -> None:
    """buf[:len(src)] = src, skipped when src already is that memory (engines that write
    the buffers themselves pass them to plan)."""
    if src.device == buf.device and src.data_ptr() == buf.data_ptr():
        return
    buf[: src.numel()].copy_(src.reshape(-1), non_blocking=src.device.type == buf.device.type)

"""FlashInfer's multi-item scoring mask (prefill `plan(prefix_len_ptr=...,
token_pos_in_items_ptr=..., token_pos_in_items_len=..., max_item_len_ptr=...)`), served as a
custom mask built on the host at plan time: the kernels stay as they are.

A request's sequence is a shared prefix followed by items, each item opened by a delimiter
(position 0 in token_pos_in_items). With p = the query's position in the sequence
(kv_len - qo_len + its index), FlashInfer's kernel (prefill.cuh,
logits_mask_multi_item_scoring) lets the query see key j when j <= p (causal) and

- p < prefix_len (a prefix query: causal only), or
- j < prefix_len (every query sees the prefix), or
- j > p - token_pos_in_items[p - prefix_len] (its own item, delimiter excluded: a
  delimiter query, position 0, sees only the prefix).

max_item_len_ptr only lets FlashInfer's kernel skip tiles: it changes no result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["MultiItemScoring"]


def _host_ints(t: torch.Tensor | None, name: str) -> np.ndarray:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    # uint16 / uint32 (FlashInfer's types) have few torch ops: widen first.
    return t.detach().to("cpu").to(torch.int64).reshape(-1).numpy()


@dataclass(frozen=True)
class MultiItemScoring:
    """The multi-item arguments of one plan, on the host."""

    prefix_len: np.ndarray  # [B]: prefix tokens of each request
    token_pos: np.ndarray  # [B * token_pos_len]: position in its item (0: delimiter)
    token_pos_len: int  # entries of token_pos per request (zero padded)

    @classmethod
    def from_plan_args(
        cls,
        prefix_len_ptr: torch.Tensor | None,
        token_pos_in_items_ptr: torch.Tensor | None,
        token_pos_in_items_len: int | torch.Tensor,
        max_item_len_ptr: torch.Tensor | None = None,
    ) -> MultiItemScoring | None:
        """From a prefill plan's arguments; None without prefix_len_ptr (FlashInfer's
        switch to this mask mode). max_item_len_ptr is a tile-skipping hint: unused."""
        if prefix_len_ptr is None:
            return None
        prefix = _host_ints(prefix_len_ptr, "prefix_len_ptr")
        token_pos = _host_ints(token_pos_in_items_ptr, "token_pos_in_items_ptr")
        stride = int(token_pos_in_items_len)
        if stride <= 0:
            raise ValueError(
                f"token_pos_in_items_len must be > 0 with prefix_len_ptr, got {stride}"
            )
        return cls(prefix_len=prefix, token_pos=token_pos, token_pos_len=stride)

    def custom_mask(self, qo_lens: np.ndarray, kv_lens: np.ndarray) -> torch.Tensor:
        """The flat bool mask of the batch (request after request, [qo_len, kv_len] each),
        as the plan's custom_mask takes it."""
        batch = qo_lens.size
        if self.prefix_len.size != batch:
            raise ValueError(
                f"prefix_len_ptr must have batch_size={batch} entries, got {self.prefix_len.size}"
            )
        parts = []
        for b in range(batch):
            qo_len, kv_len, prefix = int(qo_lens[b]), int(kv_lens[b]), int(self.prefix_len[b])
            pos = np.arange(qo_len) + (kv_len - qo_len)
            key = np.arange(kv_len)
            in_items = pos >= prefix
            need = int(pos[in_items].max(initial=prefix - 1)) - prefix + 1
            if need > self.token_pos_len:
                raise ValueError(
                    f"request {b}: queries reach item position {need - 1} past the prefix, "
                    f"but token_pos_in_items_len is {self.token_pos_len}"
                )
            # Request b's row starts at b * token_pos_len; like FlashInfer's kernel, read only
            # the entries its queries use (the last row may be shorter than token_pos_len).
            row = self.token_pos[b * self.token_pos_len : (b + 1) * self.token_pos_len]
            if need > row.size:
                raise ValueError(
                    f"request {b}: queries reach item position {need - 1} past the prefix, "
                    f"but token_pos_in_items_ptr has {row.size} entries for it"
                )
            item_pos = np.zeros(qo_len, np.int64)
            item_pos[in_items] = row[pos[in_items] - prefix]
            causal = key[None, :] <= pos[:, None]
            own_item = key[None, :] > (pos - item_pos)[:, None]
            allowed = causal & (~in_items[:, None] | (key[None, :] < prefix) | own_item)
            parts.append(allowed.reshape(-1))
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
        return torch.from_numpy(flat)

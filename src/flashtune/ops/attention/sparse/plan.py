"""The host side of block-sparse attention's plan: a BSR (or variable-block) pattern turned
into the paged prefill's page table and custom mask (see the package docstring), and the
checks of the options the prefill does not take.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "bsr_mask_to_flat",
    "merge_identical_block_rows",
    "unpack_mask_bits",
    "variable_block_page_table",
]


def _dtype(value: str | torch.dtype | None, name: str) -> torch.dtype | None:
    """FlashInfer's dtype arguments: a torch.dtype or its name ("float16")."""
    if value is None or isinstance(value, torch.dtype):
        return value
    dtype = getattr(torch, str(value), None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype or its name, got {value!r}")
    return dtype


def _host_ints(t: torch.Tensor | Any, name: str) -> np.ndarray:
    """A 1-D integer tensor as int64 numpy (one device-to-host copy)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
    return t.detach().to("cpu", torch.int64).numpy()


def bsr_mask_to_flat(
    mask: torch.Tensor, indptr: np.ndarray, row_lens: np.ndarray, C: int
) -> torch.Tensor:
    """Block masks [nnz, R, C] -> the prefill's flat custom mask: block row after block
    row, each [row_lens[b], blocks_b * C] row-major with its blocks' columns side by side in
    `indices` order (rows of a block past row_lens[b] are dropped). One scatter, no loop."""
    nnz, R = mask.shape[0], mask.shape[1]
    blocks = indptr[1:] - indptr[:-1]
    row_of_block = np.repeat(np.arange(blocks.size), blocks)
    width = blocks * C  # keys of each block row
    seg_start = np.zeros(blocks.size, np.int64)
    np.cumsum((row_lens * width)[:-1], out=seg_start[1:])
    pos = np.arange(nnz) - indptr[row_of_block]
    # Flat position of element (block j, row r, column c).
    base = seg_start[row_of_block] + pos * C  # [nnz]
    r = np.arange(R)
    target = (
        base[:, None, None] + r[None, :, None] * width[row_of_block][:, None, None]
    ) + np.arange(C)[None, None, :]
    valid = np.broadcast_to(
        r[None, :, None] < row_lens[row_of_block][:, None, None], target.shape
    ).copy()
    total = int((row_lens * width).sum())
    flat = torch.zeros(total, dtype=torch.bool, device=mask.device)
    target_t = torch.from_numpy(np.ascontiguousarray(target[valid])).to(mask.device)
    valid_t = torch.from_numpy(np.ascontiguousarray(valid)).to(mask.device)
    flat[target_t] = mask.bool()[valid_t]
    return flat


def merge_identical_block_rows(
    qo_indptr: np.ndarray, indptr: np.ndarray, indices: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of consecutive block rows with the same column blocks (same count, same order)
    as one block row each: (qo_indptr, indptr, indices) of the merged rows (int64, int64,
    int32). Without
    a mask, causality or RoPE a query's result depends only on the keys it sees, so the
    merged rows compute what the rows did. Vectorized: row i repeats row i - 1 when their
    lengths agree and each element equals the one a row length before it."""
    lengths = np.diff(indptr)
    rows = lengths.size
    same = np.zeros(rows, dtype=bool)
    if rows > 1:
        same[1:] = lengths[1:] == lengths[:-1]
        row_of = np.repeat(np.arange(rows), lengths)
        element = np.arange(row_of.size)
        checked = same[row_of]
        previous = np.where(checked, element - lengths[row_of], element)
        differs = checked & (indices[element] != indices[previous])
        same &= np.bincount(row_of[differs], minlength=rows) == 0
        keep = ~same[row_of]
    else:
        keep = np.ones(indices.size, dtype=bool)
    first = np.flatnonzero(~same)  # row 0 always starts a run
    merged_qo = np.append(qo_indptr[first], qo_indptr[-1]).astype(np.int64)
    merged_ptr = np.zeros(first.size + 1, dtype=np.int64)
    np.cumsum(lengths[first], out=merged_ptr[1:])
    return merged_qo, merged_ptr, np.ascontiguousarray(indices[keep], dtype=np.int32)


def unpack_mask_bits(packed: torch.Tensor, num_bits: int) -> torch.Tensor:
    """The first `num_bits` bits of a uint8 tensor packed in little bit order
    (flashinfer.quantization.packbits(..., bitorder="little")), as booleans."""
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise TypeError(f"packed_mask must be 1-D uint8, got {packed.dtype} {list(packed.shape)}")
    if packed.numel() * 8 < num_bits:
        raise ValueError(f"packed_mask holds {packed.numel() * 8} bits, the blocks need {num_bits}")
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bits = (packed[:, None] >> shifts[None, :]) & 1
    return bits.reshape(-1)[:num_bits].bool()


def variable_block_page_table(
    block_mask_map: torch.Tensor, block_row_sz: torch.Tensor, block_col_sz: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Variable blocks -> a token-level page table over HND K/V flattened to
    [(Hkv * kv_len)] tokens: (qo_indptr [Hkv * MB + 1], kv_indptr [Hkv * MB + 1],
    kv_indices [nnz tokens]), request (h, i) being block row i of KV head h; its keys are
    the tokens of the selected column blocks of head h, in column order. CPU, vectorized."""
    mask_map = block_mask_map.detach().cpu().bool()
    rows = block_row_sz.detach().cpu().long()
    cols = block_col_sz.detach().cpu().long()
    num_kv_heads = mask_map.shape[0]
    qo_indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    torch.cumsum(rows.reshape(-1), 0, out=qo_indptr[1:])
    row_keys = (mask_map * cols[:, None, :]).sum(-1)  # [Hkv, MB]
    kv_indptr = torch.zeros(row_keys.numel() + 1, dtype=torch.int64)
    torch.cumsum(row_keys.reshape(-1), 0, out=kv_indptr[1:])
    col_start = torch.cumsum(cols, 1) - cols  # [Hkv, NB], within the head
    kv_len = int(cols[0].sum()) if num_kv_heads else 0
    h, _, c = mask_map.nonzero(as_tuple=True)  # row-major: request after request
    lengths = cols[h, c]
    first_token = h * kv_len + col_start[h, c]
    ends = torch.cumsum(lengths, 0)
    within = torch.arange(int(ends[-1]) if ends.numel() else 0) - torch.repeat_interleave(
        ends - lengths, lengths
    )
    kv_indices = torch.repeat_interleave(first_token, lengths) + within
    return qo_indptr, kv_indptr, kv_indices


def _no_alibi(pos_encoding_mode: str) -> None:
    # The prefill kernel has ALiBi, but its positions would be those of the gathered blocks
    # (not the matrix's rows and columns): not checked against FlashInfer, so refused.
    if pos_encoding_mode == "ALIBI":
        raise NotImplementedError(
            "pos_encoding_mode='ALIBI' is not supported by the block-sparse wrappers"
        )

"""Split-KV for the Gluon MLA kernel (mla/hopper.py, its SPLIT build): a tile's key blocks cut
into chunks that run as separate work items, each writing its rows' o / l and lse to partial
rows, merged afterwards by `attention.merge.merge_partials` (the Triton MLA path's merge).

Without a split, a work item is one 64-row tile over all of its keys; with fewer tiles than
SMs (decode, MTP, a short prefill) most SMs idle while each tile walks its whole prefix
(0.1-0.2x at MTP shapes). Chunks give every SM work.

The partial rows' layout must suit the merge, which reads token t's partials at rows
(first + i * stride) * H + head, i < count (`merge_partials`). A chunk c of a tile writes its
row r (token t, head h) at a flat row prow + r where:
- H divides 64 (a tile is 64 / H whole tokens; a request's last tile may be partial): the
  tile takes C * (64 / H) token slots from `base`, prow = (base + c * 64 / H) * H, and token
  t's merge row is (base + t - t0, C, 64 / H);
- 64 divides H (a tile is 64 heads of one token, H / 64 tiles a token, all with the same
  key blocks): the token takes C slots from `base`, a tile of heads h0.. has
  prow = (base + c) * H + h0, and the merge row is (base, C, 1).
Other head counts are not split.
"""

from __future__ import annotations

import numpy as np

from flashtune.ops.mla.hopper import BLOCK_M

__all__ = ["MIN_CHUNK_BLOCKS", "can_split", "chunk_blocks_for", "split_work"]

# The fewest 64-key blocks a chunk holds: below it the partial rows' writes and the merge
# (a second launch) outweigh the SMs gained (the Triton MLA path found 128-token chunks the
# best at batch 16 x 1k on an H200, 64-token ones slower).
MIN_CHUNK_BLOCKS = 2


def can_split(num_heads: int) -> bool:
    """Whether tiles of `num_heads` heads have a partial-row layout the merge can read."""
    return num_heads > 0 and (BLOCK_M % num_heads == 0 or num_heads % BLOCK_M == 0)


def chunk_blocks_for(work: np.ndarray, num_sms: int, waves: int = 2) -> int:
    """Key blocks a chunk, so that the chunks of `work` (from `hopper.work_items`) number
    about `waves` items an SM: the blocks in all / (waves * SMs), at least
    MIN_CHUNK_BLOCKS. A work list already that long gets its largest tile (no split)."""
    blocks = work[:, 5].astype(np.int64)
    if blocks.size == 0:
        return MIN_CHUNK_BLOCKS
    if blocks.size >= waves * num_sms:
        return int(blocks.max())
    return max(MIN_CHUNK_BLOCKS, -(-int(blocks.sum()) // (waves * num_sms)))


def split_work(work: np.ndarray, qo_indptr: np.ndarray, num_heads: int,
               chunk_blocks: int) -> tuple[np.ndarray, np.ndarray, int]:  # fmt: skip
    """Cut each tile of `work` (from `hopper.work_items`) with more than `chunk_blocks` key
    blocks into chunks of that many. Returns (the work list, heaviest first, fields 6 and 7
    the chunk's first key block and partial row, -1 for a whole tile; merge_info [tokens, 3]
    int32 for `merge_partials`, zeros for tokens of whole tiles; partial token slots used)."""
    if chunk_blocks < 1:
        raise ValueError(f"chunk_blocks must be >= 1, got {chunk_blocks}")
    h = num_heads
    total_tokens = int(qo_indptr[-1])
    merge = np.zeros((total_tokens, 3), dtype=np.int32)
    out = work.astype(np.int64).copy()
    out[:, 6], out[:, 7] = 0, -1
    if not can_split(h):
        return out.astype(np.int32), merge, 0
    items: list[np.ndarray] = []
    slot = 0
    token_base: dict[int, int] = {}  # H > 64: a token's first slot, shared by its tiles
    for i in range(out.shape[0]):
        tile: np.ndarray = out[i]
        q_row0, m0, qo_len, _, _, n_blocks = (int(x) for x in tile[:6])
        if n_blocks <= chunk_blocks:
            items.append(tile)
            continue
        chunks = -(-n_blocks // chunk_blocks)
        t0 = (q_row0 + m0) // h  # the tile's first token, of all requests
        if BLOCK_M % h == 0:
            per_tile = BLOCK_M // h
            base, slot = slot, slot + chunks * per_tile
            n_tok = min(per_tile, qo_len - m0 // h)
            merge[t0 : t0 + n_tok] = [(base + i, chunks, per_tile) for i in range(n_tok)]
            prows = [(base + c * per_tile) * h for c in range(chunks)]
        else:
            if t0 not in token_base:
                token_base[t0], slot = slot, slot + chunks
                merge[t0] = (token_base[t0], chunks, 1)
            h0 = m0 % h
            prows = [(token_base[t0] + c) * h + h0 for c in range(chunks)]
        for c, prow in enumerate(prows):
            item = tile.copy()
            item[5] = min(chunk_blocks, n_blocks - c * chunk_blocks)
            item[6], item[7] = c * chunk_blocks, prow
            items.append(item)
    result = np.stack(items) if items else out[:0]
    order = np.argsort(-result[:, 5], kind="stable")
    return result[order].astype(np.int32), merge, slot

"""The indexer's top-k select as a multi-program radix select in Triton (launch.select_topk).

Why not torch.topk: at decode (a batch of a few rows of up to 128k scores, k 2048) it runs
one or a few CTAs per row and costs far more than the score pass before it (measured on an
H200: 1.17x a plain torch indexer at batch 1 x 65536, where the scores read 8.6 MB). Here
every pass over a row is spread over many programs, and the one per-row pass touches only
the scores that tie the k-th best in their top 12 bits (typically a few hundred).

Keys: an fp32 score's bits as an int32 that orders like the float under a signed compare
(negatives get their low 31 bits flipped); -inf stays below every finite score. Passes:

1. `_histogram_kernel` (rows x chunks): each valid score's top 12 key bits counted into the
   row's 4096-bin histogram with global atomics (REPS copies, one per group of chunks,
   summed by the readers: a long row's scores crowd a few bins, and one copy would
   serialize their atomics). Not tl.histogram: its warp ballots cost each thread
   bins / 32 popcounts per score, 128 at 4096 bins; it serves the 256-bin levels below.
2. `_scatter_kernel` (rows x chunks): each program finds the row's threshold bin (the bin
   where the count from the top reaches k) from the histogram, writes its scores above that
   bin to the output as cache slots, behind an atomic cursor, and those in the bin to a
   candidate buffer (position and key).
3. `_resolve_kernel` (one program per row): three more radix levels (8, 8, 4 bits) over the
   candidates find the exact k-th key; candidates above it go out, and the ones equal to it
   (ties) by lowest position, so the chosen set is deterministic (the order is not: the
   cursors hand out places as programs arrive). Then -1 up to topk. Only where more
   scores tie the k-th exactly than there are places does the program rescan its row (in
   position order, for the lowest ones): slow, and rare for fp32 sums over 64 heads.

Rows of at most topk valid scores skip the histogram: every valid position goes out.
Positions past seq_len are never read. No host syncs: the buffers are sized from shapes and
every data-dependent count stays on the device (CUDA-graph capturable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import triton
import triton.language as tl

__all__ = ["DEFAULT_SELECT", "SelectTactic", "radix_topk_slots"]

BINS = 4096  # the first level: the top 12 key bits (sign, exponent, 3 mantissa bits)
FINE_BINS = 256  # the later levels: 8, 8 and 4 bits, counted in one program by tl.histogram
_CURSORS = 32  # ints after a row's histograms: its two cursors, padded to 128 bytes


@dataclass(frozen=True)
class SelectTactic:
    """The indexer's select: "radix" (this module: unordered slots, then -1) or "torch"
    (torch.topk: best first). chunk: scores per program of the row-wide passes; tile: scores
    per step; reps: histogram copies per row (None: one per 8192 scores of the row, at most
    8 and at most one per chunk). resolve_tile / resolve_warps: the per-row resolve pass's
    step (None: tile) and warps. That pass walks the candidates (the scores in the k-th
    score's top-12-bit bin) in one program: a few hundred typically, the whole row when the
    scores crowd one bin. 8 warps: on an H200 (session 20's sweep, .gpujobs/dsa_topk_check)
    they beat 4 on crowded rows (1x65536 within 1e-3: 448 -> 364 us; 8x32768: 243 -> 199)
    and match them on random rows (19-30 us either way). Longer steps help crowded rows
    further (8192 x 16 warps: 254 us) but cost random rows 1.5-2x, so they stay a tactic;
    torch.topk takes 85-100 us on all of them."""

    method: Literal["radix", "torch"] = "radix"
    chunk: int = 2048
    tile: int = 1024
    reps: int | None = None
    num_warps: int = 4
    resolve_tile: int | None = None
    resolve_warps: int = 8


DEFAULT_SELECT = SelectTactic()


@triton.jit
def _ordered(x):
    """fp32 -> int32 key with the float's order under a signed compare."""
    i = x.to(tl.int32, bitcast=True)
    return i ^ ((i >> 31) & 0x7FFFFFFF)


@triton.jit
def _valid_len(seq_lens_ptr, b, n_cols):
    # A seq_len past the scores' width selects among the columns there are (as torch's path).
    return tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), n_cols)


@triton.jit
def _slots(bt_ptr, b, stride_btb, pos, mask, PAGE_SIZE: tl.constexpr):
    page = tl.load(bt_ptr + b * stride_btb + pos // PAGE_SIZE, mask=mask, other=0)
    return page * PAGE_SIZE + pos % PAGE_SIZE


@triton.jit
def _histogram_kernel(
    logits_ptr,  # [B, n_cols] fp32
    seq_lens_ptr,  # [B] int32
    ws_ptr,  # [B, REPS * BINS + _CURSORS] int32, zeroed
    n_cols,
    topk,
    stride_lb,
    stride_wb,
    CHUNK: tl.constexpr,
    TILE: tl.constexpr,
    REPS: tl.constexpr,
    NUM_BINS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    n_valid = _valid_len(seq_lens_ptr, b, n_cols)
    start = chunk * CHUNK
    end = tl.minimum(start + CHUNK, n_valid)
    # A row of at most topk scores needs no threshold (all of it goes out).
    if n_valid > topk:
        hist = ws_ptr + b * stride_wb + (chunk % REPS) * NUM_BINS
        for tile_start in range(start, end, TILE):
            pos = tile_start + tl.arange(0, TILE)
            ok = pos < end
            key = _ordered(tl.load(logits_ptr + b * stride_lb + pos, mask=ok, other=0.0))
            # Relaxed: only the counts matter, and the next kernel reads them.
            tl.atomic_add(hist + (key >> 20) + NUM_BINS // 2, 1, mask=ok, sem="relaxed")


@triton.jit
def _scatter_kernel(
    logits_ptr,
    seq_lens_ptr,
    bt_ptr,  # [B, max_num_pages] int32
    ws_ptr,
    out_ptr,  # [B, topk] int32
    cand_pos_ptr,  # [B, n_cols] int32
    cand_key_ptr,  # [B, n_cols] int32
    n_cols,
    topk,
    stride_lb,
    stride_btb,
    stride_wb,
    stride_ob,
    stride_cb,
    PAGE_SIZE: tl.constexpr,
    CHUNK: tl.constexpr,
    TILE: tl.constexpr,
    REPS: tl.constexpr,
    NUM_BINS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    n_valid = _valid_len(seq_lens_ptr, b, n_cols)
    start = chunk * CHUNK
    end = tl.minimum(start + CHUNK, n_valid)
    if start < end:
        ws = ws_ptr + b * stride_wb
        # Every program finds the threshold bin itself: a 16 KB read per copy, against a
        # launch (or a grid-wide handshake) to find it once per row.
        bins = tl.arange(0, NUM_BINS)
        hist = tl.load(ws + bins)
        for r in tl.static_range(1, REPS):
            hist += tl.load(ws + r * NUM_BINS + bins)
        from_top = tl.cumsum(hist, 0, reverse=True)  # scores in this bin or above
        # -1 (every valid score goes out) when the row has at most topk: its histogram is 0.
        thresh = tl.max(tl.where(from_top >= topk, bins, -1), 0) - NUM_BINS // 2
        cursor = ws + REPS * NUM_BINS
        for tile_start in range(start, end, TILE):
            pos = tile_start + tl.arange(0, TILE)
            ok = pos < end
            key = _ordered(tl.load(logits_ptr + b * stride_lb + pos, mask=ok, other=0.0))
            hi = key >> 20
            take = ok & (hi > thresh)
            cand = ok & (hi == thresh)
            n_take = tl.sum(take.to(tl.int32), 0)
            n_cand = tl.sum(cand.to(tl.int32), 0)
            base = tl.atomic_add(cursor, n_take, sem="relaxed")
            at = base + tl.cumsum(take.to(tl.int32), 0) - 1
            slot = _slots(bt_ptr, b, stride_btb, pos, take, PAGE_SIZE)
            tl.store(out_ptr + b * stride_ob + at, slot, mask=take)
            cbase = tl.atomic_add(cursor + 1, n_cand, sem="relaxed")
            cat = b * stride_cb + cbase + tl.cumsum(cand.to(tl.int32), 0) - 1
            tl.store(cand_pos_ptr + cat, pos, mask=cand)
            tl.store(cand_key_ptr + cat, key, mask=cand)


@triton.jit
def _digit_hist(key, ok, prefix, SHIFT: tl.constexpr, BITS: tl.constexpr, FINE: tl.constexpr):
    """Counts of bits [SHIFT, SHIFT + BITS) of the keys that share `prefix` above them."""
    match = ok & ((key >> (SHIFT + BITS)) == (prefix >> (SHIFT + BITS)))
    return tl.histogram((key >> SHIFT) & ((1 << BITS) - 1), FINE, mask=match)


@triton.jit
def _refine(keys_ptr, n_cand, first, prefix, need, SHIFT: tl.constexpr, BITS: tl.constexpr,
            TILE: tl.constexpr, FINE: tl.constexpr):  # fmt: skip
    """One radix level over the candidates: the digit of bits [SHIFT, SHIFT + BITS) holding
    the need-th best of those sharing `prefix`. `first`: the first TILE candidates' keys, kept
    in registers (all of them, typically). Returns the prefix with that digit, how many of
    the digit's candidates are still needed, and how many it has."""
    hist = _digit_hist(first, tl.arange(0, TILE) < n_cand, prefix, SHIFT, BITS, FINE)
    for start in range(TILE, n_cand, TILE):
        i = start + tl.arange(0, TILE)
        key = tl.load(keys_ptr + i, mask=i < n_cand, other=0)
        hist += _digit_hist(key, i < n_cand, prefix, SHIFT, BITS, FINE)
    digits = tl.arange(0, FINE)
    from_top = tl.cumsum(hist, 0, reverse=True)
    digit = tl.max(tl.where(from_top >= need, digits, -1), 0)
    above = tl.sum(tl.where(digits > digit, hist, 0), 0)
    count = tl.sum(tl.where(digits == digit, hist, 0), 0)
    return prefix | (digit << SHIFT), need - above, count


@triton.jit
def _emit(out, written, slot, take):
    """Store `slot` where `take`, packed from out[written]; returns the new `written`."""
    take = take.to(tl.int32)
    tl.store(out + written + tl.cumsum(take, 0) - 1, slot, mask=take != 0)
    return written + tl.sum(take, 0)


@triton.jit
def _resolve_kernel(
    logits_ptr,
    seq_lens_ptr,
    bt_ptr,
    ws_ptr,
    out_ptr,
    cand_pos_ptr,
    cand_key_ptr,
    n_cols,
    topk,
    stride_lb,
    stride_btb,
    stride_wb,
    stride_ob,
    stride_cb,
    PAGE_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    REPS: tl.constexpr,
    NUM_BINS: tl.constexpr,
    FINE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n_valid = _valid_len(seq_lens_ptr, b, n_cols)
    kk = tl.minimum(topk, n_valid)
    cursor = ws_ptr + b * stride_wb + REPS * NUM_BINS
    written = tl.load(cursor)  # the scores above the threshold bin, out already
    n_cand = tl.load(cursor + 1)
    need = kk - written
    out = out_ptr + b * stride_ob
    if need > 0:
        keys = cand_key_ptr + b * stride_cb
        positions = cand_pos_ptr + b * stride_cb
        first = tl.load(keys + tl.arange(0, TILE), mask=tl.arange(0, TILE) < n_cand, other=0)
        prefix = (tl.load(keys) >> 20) << 20  # every candidate has the threshold bin's bits
        prefix, need, count = _refine(keys, n_cand, first, prefix, need, 12, 8, TILE, FINE)
        prefix, need, count = _refine(keys, n_cand, first, prefix, need, 4, 8, TILE, FINE)
        prefix, need, count = _refine(keys, n_cand, first, prefix, need, 0, 4, TILE, FINE)
        # prefix is now the k-th best key; `need` of its `count` ties make up k.
        all_ties = count == need
        i = tl.arange(0, TILE)
        take = (i < n_cand) & ((first > prefix) | ((first == prefix) & all_ties))
        pos = tl.load(positions + i, mask=take, other=0)
        written = _emit(out, written, _slots(bt_ptr, b, stride_btb, pos, take, PAGE_SIZE), take)
        for start in range(TILE, n_cand, TILE):
            i = start + tl.arange(0, TILE)
            ok = i < n_cand
            key = tl.load(keys + i, mask=ok, other=0)
            take = ok & ((key > prefix) | ((key == prefix) & all_ties))
            pos = tl.load(positions + i, mask=take, other=0)
            slot = _slots(bt_ptr, b, stride_btb, pos, take, PAGE_SIZE)
            written = _emit(out, written, slot, take)
        if count > need:
            # More ties than places: the lowest positions, from the row in order (the
            # candidates' order is the atomics'), so the set does not depend on timing.
            # Only exact fp32 ties at the k-th score pay for this pass over the row.
            taken = 0
            for start in range(0, n_valid, TILE):
                pos = start + tl.arange(0, TILE)
                ok = pos < n_valid
                key = _ordered(tl.load(logits_ptr + b * stride_lb + pos, mask=ok, other=0.0))
                tie = ok & (key == prefix)
                rank = taken + tl.cumsum(tie.to(tl.int32), 0) - 1
                take = tie & (rank < need)
                slot = _slots(bt_ptr, b, stride_btb, pos, take, PAGE_SIZE)
                tl.store(out + written + rank, slot, mask=take)
                taken += tl.sum(tie.to(tl.int32), 0)
    for start in range(kk, topk, TILE):
        i = start + tl.arange(0, TILE)
        tl.store(out + i, tl.full([TILE], -1, dtype=tl.int32), mask=i < topk)


def _reps(tactic: SelectTactic, n_cols: int, chunks: int) -> int:
    if tactic.reps is not None:
        return max(1, min(tactic.reps, chunks))
    reps = 1
    while reps < 8 and reps * 2 <= chunks and reps * 2 * 8192 <= n_cols:
        reps *= 2
    return reps


def radix_topk_slots(
    logits: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    topk: int,
    tactic: SelectTactic = DEFAULT_SELECT,
) -> torch.Tensor:
    """Each row's min(topk, seq_len) best positions of `logits` [B, n_cols] fp32 as cache
    slots (block_table[b, pos // page_size] * page_size + pos % page_size), in no particular
    order, then -1: [B, topk] int32. Positions at or past seq_len are never chosen. Ties at
    the k-th score go to the lowest positions."""
    batch, n_cols = logits.shape
    dev = logits.device
    out = torch.empty(batch, topk, dtype=torch.int32, device=dev)
    if batch == 0 or topk == 0:
        return out
    if logits.dtype != torch.float32:
        raise TypeError(f"logits must be float32 (its bits are the keys), got {logits.dtype}")
    if logits.stride(1) != 1 or block_table.stride(1) != 1:
        raise ValueError("logits and block_table must be contiguous in their last dimension")
    tile = tactic.tile
    resolve_tile = tactic.resolve_tile or tile
    for name, value in (("tile", tile), ("resolve_tile", resolve_tile)):
        if value < FINE_BINS or value & (value - 1):
            # tl.histogram's tile holds at least its FINE_BINS bins.
            raise ValueError(
                f"SelectTactic.{name} must be a power of two >= {FINE_BINS}, got {value}"
            )
    chunk = max(tactic.chunk, tile)
    chunks = max(1, triton.cdiv(n_cols, chunk))
    reps = _reps(tactic, n_cols, chunks)
    ws = torch.zeros(batch, reps * BINS + _CURSORS, dtype=torch.int32, device=dev)
    cand = torch.empty(2, batch, max(n_cols, 1), dtype=torch.int32, device=dev)
    cand_pos, cand_key = cand[0], cand[1]
    common = dict(PAGE_SIZE=page_size, REPS=reps, NUM_BINS=BINS, num_warps=tactic.num_warps)
    if n_cols > 0:
        _histogram_kernel[(batch, chunks)](
            logits, seq_lens, ws, n_cols, topk, logits.stride(0), ws.stride(0),
            CHUNK=chunk, TILE=tactic.tile, REPS=reps, NUM_BINS=BINS,
            num_warps=tactic.num_warps,
        )  # fmt: skip
        _scatter_kernel[(batch, chunks)](
            logits, seq_lens, block_table, ws, out, cand_pos, cand_key, n_cols, topk,
            logits.stride(0), block_table.stride(0), ws.stride(0), out.stride(0),
            cand_pos.stride(0), CHUNK=chunk, TILE=tactic.tile, **common,
        )  # fmt: skip
    common["num_warps"] = tactic.resolve_warps
    _resolve_kernel[(batch,)](
        logits, seq_lens, block_table, ws, out, cand_pos, cand_key, n_cols, topk,
        logits.stride(0), block_table.stride(0), ws.stride(0), out.stride(0),
        cand_pos.stride(0), TILE=resolve_tile, FINE=FINE_BINS, **common,
    )  # fmt: skip
    return out

"""Launch policy of batch prefill attention, in one place: the kernel's tactic, its search
space, the default tactic (tactic -1) and the limits the planned and plan-free paths share.

Tuning notes (H200, FlashInfer 0.2.14 = its FA3 backend in the same run; causal, bf16,
32/8 heads, d128, qo = kv = L, page size 16; benchmarks/bench_prefill.py, 2026-11-21):
- Before this round (tile-global work order, pointer loads, per-shape rules): geomean 0.73x
  FlashInfer over 12 shapes (L 512/2048/8192 x batch 1/16 x paged/ragged), min 0.59.
- Paged through staging + TMA vs the in-loop page-table gather (same 128x128 tile): L8192 b1
  1.15 vs 1.44 ms, b16 20.2 vs 25.3 ms, L2048 b16 1.52 vs 1.77 ms. Staged paged then costs
  1-10% more than ragged at L >= 2048 (the copy), 8-35% at L <= 1024, where the in-loop
  gather is no faster (paged b1 L512: 0.018 ms either way).
- Work order, default tactic, request-major vs tile-global: ragged b16 L1024 0.40 vs 0.45
  ms, b16 L4096 5.0 vs 5.4, b16 L8192 19.1 vs 20.3; paged b4 L8192 4.7 vs 5.2 (batch 1 is the
  same order either way).
- Tile (10 candidates per shape, 30 shapes L 512..8192 x b 1/4/16 x paged/ragged): 64x64,
  4 warps, 3 stages, TMA is the best on 25 of 30 shapes and within 5% on 29 (2 CTAs per SM:
  one's prologue/epilogue overlaps the other's loop); its geomean vs FlashInfer is 0.89x
  (paged 0.95x, min 0.88; ragged 0.84x, min 0.69 at b4 L8192, where 128x128/8 warps/TMA is
  4% faster). 128x128/8 warps/TMA everywhere: 0.79x. 64x64 with 2 stages: 0-10% slower.
  Hence tactic -1 on Hopper.
- Ragged stays at 0.69-0.81x of FlashInfer's TMA, warp-specialized FA3 kernel for L >= 2048
  at batch >= 4: what remains is FA3's pipeline (a producer warp, two consumer warp groups
  in ping-pong) that Triton 3.6 does not generate on Hopper. (Compiled for sm_90 without a
  GPU, session 20: `tl.range(..., warp_specialize=True)` on the unmasked KV loop stops Triton
  3.6's Hopper warp-specialization pass with an assertion at 4 warps, as it does on a plain
  matmul loop, and leaves the SASS unchanged at 8 warps: no producer warp, no register
  reallocation.) Session 28 wrote that pipeline in Gluon for sm_90 (prefill/hopper.py, the
  default there where it applies): ragged 0.978x FA3 over 12 shapes, paged 1.149x. Paged is
  faster than
  FlashInfer's paged kernel (which gathers pages with cp.async) at b1 L1024/L2048, b4 L8192.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashtune import platform

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "WORK_ORDERS",
    "PrefillTactic",
    "PREFILL_TACTICS",
    "MAX_STAGING_BYTES",
    "default_tactic_for",
]

SUPPORTED_HEAD_DIMS = (64, 128, 256)
# Orders of the planned work list: "request" (heaviest request first, then its heaviest
# tiles; the default) or "tile" (heaviest tile first across the batch). A plan's
# `work_order` picks one, so the benchmark can measure both; see the notes above.
WORK_ORDERS = ("request", "tile")
# Staging the pages of a paged batch (tma tactics) allocates a copy of the planned KV when the
# workspace is too small; above this size the default keeps the in-loop page gather instead.
MAX_STAGING_BYTES = 1 << 30


@dataclass(frozen=True)
class PrefillTactic:
    """Tile configuration of the prefill kernel.

    pack_heads: put the GQA group's query heads into the rows of one tile (K/V loaded once
    per group) instead of one query head per program.
    """

    block_m: int
    block_n: int
    pack_heads: bool
    num_warps: int
    num_stages: int
    # K/V tiles through TMA tensor descriptors (Hopper+). Paged: the planned pages are first
    # copied page after page into the workspace (two index_select launches, ~2-5% of the
    # attention time at 2k+ tokens) and read as ragged KV, trading a copy for the per-token
    # page-table gather in the inner loop.
    tma: bool = False

    def tokens_per_tile(self, group_size: int) -> int:
        return self.block_m // (group_size if self.pack_heads else 1)

    def fits(self, head_dim: int, group: int) -> bool:
        """Whether this tactic can run at head_dim with GQA groups of `group` heads."""
        if self.pack_heads and self.block_m < group:
            return False
        if head_dim >= 256:
            # Shared memory: Q tile + stages x (K + V tiles) in 16-bit must stay under ~227 KB
            # (H100/H200 per CTA), with room for Triton's own buffers.
            smem = 2 * head_dim * (self.block_m + self.num_stages * 2 * self.block_n)
            return smem <= 200 * 1024 and self.block_m * self.block_n <= 64 * 64
        return True


# The search space the autotuner explores (tactic i is PREFILL_TACTICS[i]).
PREFILL_TACTICS: tuple[PrefillTactic, ...] = tuple(
    PrefillTactic(bm, bn, pack, w, s, tma)
    for bm in (64, 128)
    for bn in (32, 64, 128)
    for pack in (True, False)
    for w in (4, 8)
    for s in (2, 3, 4)
    for tma in (False, True)
)


def default_tactic_for(
    *, paged: bool, group: int, head_dim: int, kv_len: int, can_stage: bool, device: torch.device
) -> PrefillTactic:
    """Tactic -1 from what a shape and the KV length (the longest, or a bound of it) tell.

    can_stage: a paged batch's pages may be copied contiguously for TMA (prefill/launch.py).
    """
    if device.type != "cuda":
        # Interpreter: small tiles so that small test inputs still cross tile boundaries.
        return PrefillTactic(32, 16, 32 >= group, 4, 1)
    pack = group <= 8 and 64 % group == 0
    if head_dim >= 256:
        return PrefillTactic(64, 32, pack, 4, 2)
    hopper = (platform.compute_capability(device) or (0, 0)) >= (9, 0)
    if hopper and can_stage:
        # 64x64 tiles on 4 warps, K/V through TMA (paged: pages staged first). Best or within
        # 5% of the best of 10 tactics on 24 of the 30 shapes of the H200 grid (notes above).
        return PrefillTactic(64, 64, pack, 4, 3, tma=True)
    # No TMA (before Hopper, or a paged batch too large to stage): pointer loads, the first
    # H200 sweep's choices.
    if kv_len <= 1024:
        return PrefillTactic(128 if paged else 64, 32, pack, 4, 3)
    if paged:
        return PrefillTactic(128, 64, pack, 4, 3)
    if kv_len >= 4096:
        return PrefillTactic(128, 128, pack, 8, 3)
    return PrefillTactic(128, 32, pack, 4, 3)

"""Host-side choices of the Gluon Hopper prefill (`hopper.py`): its tile shapes, its tactics,
tactic -1 (from measured tables), and the persistent grid's host schedule. Plain Python and
NumPy, so that the choices are testable without a GPU."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = [
    "BLOCK_M",
    "GLUON_D64_FROM_KV",
    "HEAD_DIMS",
    "HOPPER_TACTICS",
    "KERNEL_HEAD_DIMS",
    "HopperTactic",
    "block_n",
    "default_prefers_triton",
    "default_tactic",
    "item_blocks",
    "pick_tactic",
    "q_stages",
    "snake_schedule",
]

BLOCK_M = 128  # query rows a work item (two warpgroups of 64)
# The head dims the kernel compiles for, and those `supported` admits: a head dim joins the
# second once a GPU has run its tests and timed it against the Triton kernel (all three ran
# and passed on an H200 in session 29).
KERNEL_HEAD_DIMS = (64, 128, 256)
HEAD_DIMS = KERNEL_HEAD_DIMS


def block_n(head_dim: int) -> int:
    """Keys a block: 64 at head_dim 256 (the output accumulator takes 128 registers a
    thread there), else 128."""
    return 64 if head_dim == 256 else 128


def q_stages(head_dim: int, tactic: HopperTactic) -> int:
    """Q buffers a consumer: two where the items are chained (the next item's Q loads
    during this one), but at head_dim 256 (2 x 32 KB more would not fit beside the K / V
    ring)."""
    return 2 if tactic.chained and head_dim <= 128 else 1


class HopperTactic(NamedTuple):
    """A persistent grid of one program an SM, or one program an item; the K / V ring's
    stages; the consumers taking turns at the tensor cores (FA3's inter-warpgroup
    schedule); the output rescaled between the score and output MMAs' issue (FA3's order)
    instead of after the output MMA's wait; persistent programs walking a host schedule
    (`snake_schedule`) instead of every num_programs-th item (`walks_schedule`)."""

    persistent: bool
    stages: int
    pingpong: bool = False
    rescale_early: bool = False
    scheduled: bool = False
    chained: bool = False

    @property
    def walks_schedule(self) -> bool:
        """A schedule is a persistent grid's: one program an item has nothing to walk."""
        return self.scheduled and self.persistent


# The tuner's candidates (the order is what tuned caches store: new ones go at the end).
# Session 28, H200, ragged causal, 32/8 heads, bf16, 1k-8k tokens a request: FA3's rescale
# order 0-1% faster than the rescale after the wait; one program an item is faster at one 8k
# request (947 against 959 us), slower at 16 x 1k (411 against 343); the turns of PINGPONG
# lost 1-4% (a manual tactic). A host schedule (`snake_schedule`) helped where programs get
# few items (4 x 1k: 101 -> 92 us, 1 x 1k: 29.6 -> 27.1) and cost 4-14% where they get many
# (16 x 1k: 333 -> 381).
_ROUND_ROBIN = HopperTactic(True, 2, rescale_early=True)
_SCHEDULED = HopperTactic(True, 2, rescale_early=True, scheduled=True)
_SCHEDULED_CHAINED = HopperTactic(True, 2, rescale_early=True, scheduled=True, chained=True)
HOPPER_TACTICS = (
    _ROUND_ROBIN,
    HopperTactic(True, 2),
    HopperTactic(False, 2, rescale_early=True),
    _SCHEDULED,
    _SCHEDULED_CHAINED,
    HopperTactic(True, 2, rescale_early=True, chained=True),
)
# head_dim 64 where requests are short: the Triton kernel is faster (session 29, H200, ragged
# causal 32/8 heads: Gluon 0.88-0.94x Triton at 1k-2k tokens a request, 1.01-1.09x at
# 4k-8k; the score MMA is half as long as at 128 and the softmax, which is not, dominates).
# Tactic -1 keeps the Triton kernel below this many keys in the longest request.
GLUON_D64_FROM_KV = 4096


def default_prefers_triton(plan: Any) -> bool:
    """Whether tactic -1 runs the Triton kernel on a plan the Gluon kernel supports."""
    return plan.head_dim == 64 and int(np.max(plan.kv_lens, initial=0)) < GLUON_D64_FROM_KV


# Tactic -1 (session 29, H200, ragged causal d128, one process, us; rr / sn: round-robin
# walk / host schedule, C: chained items):
#   shape      items/program  blocks/item   rr    sn    snC   rrC
#   1 x 1k          1.9           4.5      29.3  27.3  27.4  30.8
#   4 x 1k          7.8           4.5     101.1  92.4  88.9 104.8
#   4 x 2k         15.5           8.5     301.3 307.5 284.3 311.4
#   16 x 1k        31.0           4.5     321.2 374.1 359.4 326.6
#   1 x 8k         15.5          32.5     971.5  1009  1058  1056
#   4 x 8k         62.1          32.5      3890  4168  4240  4175
# Chaining saves the score MMA's latency at each item boundary and costs 5-9% a key block
# (spills at the boundary, a longer loop), so it pays where items are short; the schedule
# pays where programs get few items.
SCHEDULE_BELOW_ITEMS_PER_PROGRAM = 10
CHAIN_BELOW_ITEMS_PER_PROGRAM = 20
CHAIN_BELOW_BLOCKS_PER_ITEM = 16


def pick_tactic(
    items_per_program: float, blocks_per_item: float, head_dim: int = 128
) -> HopperTactic:
    """Tactic -1 for a plan whose persistent programs get `items_per_program` work items of
    `blocks_per_item` key blocks on average (the table above). Chained items only at
    head_dim 128, the one measured (the tuner times them at 64 and 256)."""
    short = blocks_per_item < CHAIN_BELOW_BLOCKS_PER_ITEM and head_dim == 128
    if items_per_program < SCHEDULE_BELOW_ITEMS_PER_PROGRAM:
        return _SCHEDULED_CHAINED if short else _SCHEDULED
    if items_per_program < CHAIN_BELOW_ITEMS_PER_PROGRAM and short:
        return _SCHEDULED_CHAINED
    return _ROUND_ROBIN


def item_blocks(rows: np.ndarray, causal: bool, block_n: int) -> np.ndarray:
    """Key blocks of each work row (plan.work_rows(BLOCK_M, block_n)): what a tile reads."""
    t0, qo_len, kv_len = rows[:, 1].astype(np.int64), rows[:, 3], rows[:, 4]
    hi = np.minimum(kv_len, t0 + BLOCK_M + kv_len - qo_len) if causal else kv_len
    return -(-hi // block_n)


def default_tactic(plan: Any, device: torch.device) -> int:
    """Tactic -1's index in HOPPER_TACTICS for `plan`, picked once a plan."""
    if plan.hopper_tactic is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        bn = block_n(plan.head_dim)
        blocks = item_blocks(plan.work_rows(BLOCK_M, bn), plan.causal, bn)
        mean = float(blocks.mean()) if blocks.size else 0.0
        tactic = pick_tactic(blocks.size * plan.num_qo_heads / sms, mean, plan.head_dim)
        plan.hopper_tactic = HOPPER_TACTICS.index(tactic)
    return plan.hopper_tactic


def snake_schedule(
    rows: np.ndarray, heads: int, programs: int, causal: bool, block_n: int = 128
) -> np.ndarray:
    """A persistent grid's walk: [programs + 1 offsets, then the item ids] int32, item =
    tile * heads + head over the work rows (plan.work_rows(BLOCK_M, block_n)). Items are
    dealt heaviest first (cost: key blocks + 1) in rounds of `programs`, the direction
    alternating each round (a snake), so each program's total stays near the mean where a
    round-robin deal gives the first programs the heaviest item of every round; a round
    hands one tile's heads to neighbouring programs, which share its K / V in L2."""
    cost = item_blocks(rows, causal, block_n) + 1
    tiles = np.argsort(-cost, kind="stable")
    items = (tiles[:, None] * heads + np.arange(heads)[None, :]).reshape(-1)
    i = np.arange(items.size)
    rnd, pos = i // programs, i % programs
    prog = np.where(rnd % 2 == 0, pos, programs - 1 - pos)
    mine = np.argsort(prog, kind="stable")  # a program's items in round order
    offsets = np.concatenate([[0], np.cumsum(np.bincount(prog, minlength=programs))])
    return np.concatenate([offsets, items[mine]]).astype(np.int32)

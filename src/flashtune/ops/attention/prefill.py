"""Batch prefill attention over a paged or ragged KV cache (FlashInfer-compatible API).

- `BatchPrefillWithPagedKVCacheWrapper`: plan(qo_indptr, paged_kv_indptr, ...) / run(q, cache).
- `BatchPrefillWithRaggedKVCacheWrapper`: plan(qo_indptr, kv_indptr, ...) / run(q, k, v).
- `single_prefill_with_kv_cache(q, k, v, ...)`: one request, no plan.

plan runs on the CPU from the lengths alone: it validates the batch and builds the flat work
list of (request, query tile) items, heaviest request first and, within it, heaviest tile
first (the number of KV tiles a tile visits), so long causal tiles start early, short ones
fill the tail, and the programs in flight share one request's K/V in L2. run validates the
tensors against the plan and launches one Triton program per (work item, head group); the
kernel is in prefill_kernels.py. With a TMA tactic on a paged cache, run first copies the
planned pages contiguously into the workspace (two index_select launches) and reads them as
ragged KV.

Semantics follow FlashInfer: causal masks align bottom-right (query i of a request with
qo_len queries and kv_len keys sees keys j <= i + kv_len - qo_len); `window_left` keeps keys
j >= i + kv_len - qo_len - window_left; `logits_soft_cap` c maps a logit x to c*tanh(x/c);
a custom mask (flattened booleans, request after request, each [qo_len, kv_len] row-major)
replaces the causal mask; the LSE is base 2.

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
  in ping-pong) that Triton 3.6 does not generate on Hopper. Paged is faster than
  FlashInfer's paged kernel (which gathers pages with cp.async) at b1 L1024/L2048, b4 L8192.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from flashtune import env, platform
from flashtune.ops.attention.decode import _host_int64, _staging
from flashtune.ops.attention.page import KV_LAYOUTS, split_kv_cache
from flashtune.schema import Const, OpSchema, Scalar, Tensor, Var, api
from flashtune.tune import TunableRunner, TuningConfig, choose_one
from flashtune.tune.runner import DEFAULT_TACTIC, Tactic

__all__ = [
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "single_prefill_with_kv_cache",
    "batch_prefill_ragged_ref",
    "batch_prefill_paged_ref",
    "single_prefill_ref",
    "PrefillTactic",
    "TritonPrefillRunner",
    "PREFILL_TACTICS",
    "GQA_PAGED_PREFILL",
    "GQA_RAGGED_PREFILL",
    "gqa_paged_prefill",
    "gqa_ragged_prefill",
    "gqa_paged_prefill_ref",
    "gqa_ragged_prefill_ref",
]

SUPPORTED_HEAD_DIMS = (64, 128, 256)
# Order of the work list: "request" (heaviest request first, then its heaviest tiles) or
# "tile" (heaviest tile first across the batch). A module switch so the benchmark can
# measure both; see the notes in the docstring.
_WORK_ORDER = "request"
_LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------------------------
# Reference (plain PyTorch)
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def batch_prefill_ragged_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    sm_scale: float,
    causal: bool = False,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    custom_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch prefill over ragged KV: q [total_q, Hq, D], k/v [total_kv, Hkv, D].

    Returns (output [total_q, Hq, D] in q's dtype, lse [total_q, Hq] float32, base 2).
    Rows that see no key give output 0 and lse -inf. `custom_mask` is FlashInfer's flattened
    boolean mask (request after request, [qo_len, kv_len] row-major); it replaces `causal`.
    """
    total_q, num_qo_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_qo_heads // num_kv_heads
    out = torch.zeros(total_q, num_qo_heads, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((total_q, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)
    qo = [int(x) for x in qo_indptr.tolist()]
    kv = [int(x) for x in kv_indptr.tolist()]
    mask_off = 0
    for b in range(len(qo) - 1):
        qs, qe, ks, ke = qo[b], qo[b + 1], kv[b], kv[b + 1]
        qo_len, kv_len = qe - qs, ke - ks
        if qo_len == 0:
            continue
        qb = q[qs:qe].to(compute_dtype).transpose(0, 1)  # [Hq, qo, D]
        kb = k[ks:ke].to(compute_dtype).transpose(0, 1).repeat_interleave(group, 0)
        vb = v[ks:ke].to(compute_dtype).transpose(0, 1).repeat_interleave(group, 0)
        logits = torch.matmul(qb, kb.transpose(1, 2)) * sm_scale  # [Hq, qo, kv]
        if logits_soft_cap is not None and logits_soft_cap > 0:
            logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
        i = torch.arange(qo_len, device=q.device)[:, None] + (kv_len - qo_len)
        j = torch.arange(kv_len, device=q.device)[None, :]
        keep = torch.ones(qo_len, kv_len, dtype=torch.bool, device=q.device)
        if custom_mask is not None:
            n = qo_len * kv_len
            keep = custom_mask[mask_off : mask_off + n].reshape(qo_len, kv_len).to(q.device)
            mask_off += n
        elif causal:
            keep = keep & (j <= i)
        if window_left >= 0:
            keep = keep & (j >= i - window_left)
        logits = logits.masked_fill(~keep, -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)  # [Hq, qo], -inf on empty rows
        probs = torch.exp(logits - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
        out[qs:qe] = torch.matmul(probs, vb).transpose(0, 1).to(q.dtype)
        lse[qs:qe] = (row_lse * _LOG2E).transpose(0, 1).float()
    return out, lse


def _gather_pages(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pages [P, page_size, H, D] -> ragged (k, v) [total_kv, H, D] and token kv_indptr."""
    page_size = k_cache.shape[1]
    ptr = [int(x) for x in kv_indptr.tolist()]
    last = [int(x) for x in kv_last_page_len.tolist()]
    ks, vs, tok_ptr = [], [], [0]
    for b in range(len(ptr) - 1):
        pages = kv_indices[ptr[b] : ptr[b + 1]].long().to(k_cache.device)
        n = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + last[b]
        ks.append(k_cache[pages].flatten(0, 1)[:n])
        vs.append(v_cache[pages].flatten(0, 1)[:n])
        tok_ptr.append(tok_ptr[-1] + n)
    shape = (0, *k_cache.shape[2:])
    k = torch.cat(ks) if ks else k_cache.new_empty(shape)
    v = torch.cat(vs) if vs else v_cache.new_empty(shape)
    return k, v, torch.tensor(tok_ptr, dtype=torch.int32)


@torch.no_grad()
def batch_prefill_paged_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    sm_scale: float,
    causal: bool = False,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    custom_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch prefill over a paged KV cache given as NHD pages [P, page_size, Hkv, D]
    (pass split_kv_cache(...) views for HND). Same outputs as batch_prefill_ragged_ref."""
    k, v, tok_ptr = _gather_pages(k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len)
    return batch_prefill_ragged_ref(
        q, k, v, qo_indptr, tok_ptr, sm_scale, causal, window_left, logits_soft_cap,
        custom_mask, compute_dtype,
    )  # fmt: skip


def single_prefill_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    causal: bool = False,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    custom_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request: q [qo_len, Hq, D], k/v [kv_len, Hkv, D] (NHD); custom_mask [qo, kv]."""
    qo_indptr = torch.tensor([0, q.shape[0]], dtype=torch.int32)
    kv_indptr = torch.tensor([0, k.shape[0]], dtype=torch.int32)
    mask = None if custom_mask is None else custom_mask.reshape(-1)
    return batch_prefill_ragged_ref(
        q, k, v, qo_indptr, kv_indptr, sm_scale, causal, window_left, logits_soft_cap, mask,
        compute_dtype,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Plan
# --------------------------------------------------------------------------------------------


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


def _default_tactic(plan: _PrefillPlan, device: torch.device) -> PrefillTactic:
    """Tactic -1, cached on the plan (run stays cheap). Numbers: module notes, "Tuning"."""
    if plan.default_tactic is None:
        plan.default_tactic = _pick_default(plan, device)
    return plan.default_tactic


# Staging the pages of a paged batch (tma tactics) allocates a copy of the planned KV when the
# workspace is too small; above this size the default keeps the in-loop page gather instead.
_MAX_STAGING_BYTES = 1 << 30


def _staging_bytes(plan: _PrefillPlan) -> int:
    elem = plan.kv_dtype.itemsize if plan.kv_dtype is not None else 2
    return 2 * int(plan.kv_indptr[-1]) * plan.page_size * plan.num_kv_heads * plan.head_dim * elem


def _pick_default(plan: _PrefillPlan, device: torch.device) -> PrefillTactic:
    ws = plan.workspace
    ws_bytes = 0 if ws is None else ws.numel() * ws.element_size()
    return default_tactic_for(
        paged=plan.paged,
        group=plan.group_size,
        head_dim=plan.head_dim,
        kv_len=int(plan.kv_lens.max(initial=0)),
        can_stage=not plan.paged or _staging_bytes(plan) <= max(ws_bytes, _MAX_STAGING_BYTES),
        device=device,
    )


def default_tactic_for(
    *, paged: bool, group: int, head_dim: int, kv_len: int, can_stage: bool, device: torch.device
) -> PrefillTactic:
    """Tactic -1 from what a shape and the KV length (the longest, or a bound of it) tell.

    can_stage: a paged batch's pages may be copied contiguously for TMA (see _stage_pages).
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


def _check_indptr(ptr: np.ndarray, name: str) -> None:
    if len(ptr) < 1:
        raise ValueError(f"{name} must have batch_size + 1 >= 1 entries, got {len(ptr)}")
    if ptr[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {ptr[0]}")
    down = ptr[1:] < ptr[:-1]
    if down.any():
        i = int(down.argmax())
        raise ValueError(
            f"{name} must be non-decreasing, got {name}[{i}]={ptr[i]} > "
            f"{name}[{i + 1}]={ptr[i + 1]}"
        )


def _canon_dtype(dt: str | torch.dtype | None, name: str) -> torch.dtype | None:
    if dt is None or isinstance(dt, torch.dtype):
        return dt
    try:
        out = getattr(torch, dt)
    except AttributeError:
        raise TypeError(f"{name} must be a torch dtype or its name, got {dt!r}") from None
    if not isinstance(out, torch.dtype):
        raise TypeError(f"{name} must be a torch dtype or its name, got {dt!r}")
    return out


@dataclass
class _PrefillPlan:
    """Everything run needs, computed once per batch on the CPU."""

    paged: bool
    qo_indptr: np.ndarray  # [B+1] int64 (host)
    kv_lens: np.ndarray  # [B] int64: KV tokens per request
    kv_indptr: np.ndarray  # [B+1] int64: pages (paged) or tokens (ragged)
    page_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool
    window_left: int
    logits_soft_cap: float
    sm_scale: float
    q_dtype: torch.dtype | None
    kv_dtype: torch.dtype | None
    device: torch.device
    num_pages_needed: int = 0  # 1 + the largest page index (paged), once checked
    page_ids_checked: bool = False  # num_pages_needed is known (see _check_page_ids)
    # Device tensors.
    qo_indptr_d: torch.Tensor | None = None
    kv_indptr_d: torch.Tensor | None = None
    kv_indices_d: torch.Tensor | None = None
    kv_lens_d: torch.Tensor | None = None
    kv_last_page_len_d: torch.Tensor | None = None
    mask_d: torch.Tensor | None = None  # uint8, flattened
    mask_indptr_d: torch.Tensor | None = None  # int64
    works: dict[tuple[int, int, str], torch.Tensor] = field(default_factory=dict)
    # Paged + TMA tactic: the planned pages are staged contiguously (page after page) and read
    # as ragged KV; request b's tokens start at kv_indptr[b] * page_size there (work list).
    workspace: torch.Tensor | None = None
    default_tactic: PrefillTactic | None = None  # tactic -1 for this plan, picked once
    tactic: Tactic = DEFAULT_TACTIC

    @property
    def group_size(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def total_q(self) -> int:
        return int(self.qo_indptr[-1])

    def work_list(self, tokens_per_tile: int, block_n: int) -> torch.Tensor:
        """[num_items, 8] int32, heaviest first, cached per tile shape: (request, first
        token, qo_start, qo_len, kv_len, KV offset in pages, KV offset in tokens, 0)."""
        key = (tokens_per_tile, block_n, _WORK_ORDER)
        if key not in self.works:
            work = _work_rows(self, tokens_per_tile, block_n)
            self.works[key] = torch.from_numpy(work).to(self.device, non_blocking=True)
        return self.works[key]


def _work_rows(plan: _PrefillPlan, tokens_per_tile: int, block_n: int) -> np.ndarray:
    """The work list of `plan` on the host (see _PrefillPlan.work_list), vectorized."""
    qo = plan.qo_indptr
    qo_lens = qo[1:] - qo[:-1]
    kv_lens = plan.kv_lens
    batch = kv_lens.size
    ntiles = -(-qo_lens // tokens_per_tile)
    req = np.repeat(np.arange(batch), ntiles)
    t0 = (np.arange(req.size) - (np.cumsum(ntiles) - ntiles)[req]) * tokens_per_tile
    q_len, kv_len = qo_lens[req], kv_lens[req]
    delta = kv_len - q_len
    last = np.minimum(t0 + tokens_per_tile, q_len) - 1
    hi = np.minimum(kv_len, last + delta + 1) if plan.causal else kv_len
    lo = np.maximum(0, t0 + delta - plan.window_left) if plan.window_left >= 0 else 0
    cost = np.maximum(0, hi - lo) // block_n + 1
    if req.size <= 512:
        # Few tiles: the plain lexsort and per-column gathers are cheapest.
        if _WORK_ORDER == "request":
            req_cost = np.bincount(req, weights=cost, minlength=batch)[req]
            order = np.lexsort((t0, -cost, req, -req_cost))
        else:
            order = np.lexsort((t0, req, -cost))
        r = req[order]
        kvp = plan.kv_indptr
        work = np.zeros((r.size, 8), dtype=np.int32)
        work[:, 0] = r
        work[:, 1] = t0[order]
        work[:, 2] = qo[r]
        work[:, 3] = qo_lens[r]
        work[:, 4] = kv_lens[r]
        work[:, 5] = kvp[r]
        work[:, 6] = kvp[r] * plan.page_size
        return work
    order = _work_order(req, cost, ntiles)
    # The per-request fields, gathered once per tile (one fancy index instead of seven).
    kvp = plan.kv_indptr[:-1]
    per_req = np.zeros((batch, 8), dtype=np.int32)
    per_req[:, 0] = np.arange(batch)
    per_req[:, 2] = qo[:-1]
    per_req[:, 3] = qo_lens
    per_req[:, 4] = kv_lens
    per_req[:, 5] = kvp
    per_req[:, 6] = kvp * plan.page_size
    work = per_req[req[order]]
    work[:, 1] = t0[order]
    return work


def _work_order(req: np.ndarray, cost: np.ndarray, ntiles: np.ndarray) -> np.ndarray:
    """The launch order of the tiles (generated request by request, first token ascending).

    "request": heaviest request first (ties: lower index), then its heaviest tiles first
    (ties: lower first token). "tile": heaviest tile first (ties: request, first token).
    Both are one stable argsort of a combined key, as the tiles come in (request, first
    token) order; the key fits in 16 bits for any batch a prefill plan sees in practice,
    where numpy's stable sort is a radix sort (a 4-key lexsort over ~6k tiles costs ~150 us).
    """
    batch = ntiles.size
    max_cost = int(cost.max(initial=0))
    if _WORK_ORDER == "request":
        # Heaviest request first, its heaviest tiles first: the CTAs in flight share one or
        # two requests' K/V, which stays in L2 (a tile-global order interleaves every
        # request and streams all K/V from HBM at batch 16).
        req_cost = np.bincount(req, weights=cost, minlength=batch)
        rank = np.empty(batch, np.int64)
        rank[np.argsort(-req_cost, kind="stable")] = np.arange(batch)
        key = rank[req] * (max_cost + 1) + (max_cost - cost)
        key_max = batch * (max_cost + 1)
    else:
        key = max_cost - cost
        key_max = max_cost + 1
    if key_max <= 1 << 16:
        key = key.astype(np.uint16)
    return np.argsort(key, kind="stable")


def _plan(
    *,
    paged: bool,
    device: torch.device,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor | None,
    kv_last_page_len: torch.Tensor | None,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim_qk: int,
    head_dim_vo: int | None,
    page_size: int,
    custom_mask: torch.Tensor | None,
    packed_custom_mask: torch.Tensor | None,
    causal: bool,
    pos_encoding_mode: str,
    sm_scale: float | None,
    window_left: int,
    logits_soft_cap: float | None,
    q_data_type: str | torch.dtype | None,
    kv_data_type: str | torch.dtype | None,
    workspace: torch.Tensor | None = None,
) -> _PrefillPlan:
    if packed_custom_mask is not None:
        raise NotImplementedError("packed_custom_mask is not supported; pass custom_mask (bool)")
    if pos_encoding_mode != "NONE":
        raise NotImplementedError(f"pos_encoding_mode must be 'NONE', got {pos_encoding_mode!r}")
    if head_dim_vo is not None and head_dim_vo != head_dim_qk:
        raise NotImplementedError(
            f"head_dim_vo ({head_dim_vo}) != head_dim_qk ({head_dim_qk}) is not supported"
        )
    if num_qo_heads <= 0 or num_kv_heads <= 0 or num_qo_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_qo_heads ({num_qo_heads}) must be a positive multiple of num_kv_heads "
            f"({num_kv_heads})"
        )
    if head_dim_qk not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim_qk must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim_qk}")
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    if logits_soft_cap is not None and logits_soft_cap < 0:
        raise ValueError(f"logits_soft_cap must be >= 0 or None, got {logits_soft_cap}")
    kv_name = "paged_kv_indptr" if paged else "kv_indptr"
    host_in = [_int_vector(qo_indptr, "qo_indptr"), _int_vector(kv_indptr, kv_name)]
    if paged:
        assert kv_indices is not None and kv_last_page_len is not None
        host_in.append(_int_vector(kv_last_page_len, "paged_kv_last_page_len"))
    # One device-to-host transfer (one sync) for all index arrays, none on the CPU.
    host = _host_int64(*host_in)
    qo, kvp = host[0], host[1]
    _check_indptr(qo, "qo_indptr")
    _check_indptr(kvp, kv_name)
    if len(kvp) != len(qo):
        raise ValueError(
            f"qo_indptr and kv_indptr must both have batch_size + 1 entries, got {len(qo)} "
            f"and {len(kvp)}"
        )
    batch = len(qo) - 1
    kv_steps = kvp[1:] - kvp[:-1]
    if paged:
        assert kv_indices is not None
        last = host[2]
        if len(last) != batch:
            raise ValueError(
                f"paged_kv_last_page_len must have batch_size={batch} entries, got {len(last)}"
            )
        if kv_indices.dim() != 1 or kv_indices.shape[0] < kvp[-1]:
            raise ValueError(
                f"paged_kv_indices must be 1-D with >= paged_kv_indptr[-1]={kvp[-1]} entries, "
                f"got shape {tuple(kv_indices.shape)}"
            )
        bad = (kv_steps > 0) & ((last < 1) | (last > page_size))
        if bad.any():
            b = int(bad.argmax())
            raise ValueError(
                f"paged_kv_last_page_len[{b}]={last[b]} must be in 1..page_size={page_size}"
            )
        kv_lens = np.where(kv_steps > 0, (kv_steps - 1) * page_size + last, 0)
    else:
        kv_lens = kv_steps
    qo_lens = qo[1:] - qo[:-1]
    if causal and custom_mask is None and (qo_lens > kv_lens).any():
        b = int((qo_lens > kv_lens).argmax())
        raise ValueError(
            f"causal prefill needs qo_len <= kv_len for every request; request {b} has "
            f"qo_len={qo_lens[b]} > kv_len={kv_lens[b]}"
        )
    plan = _PrefillPlan(
        paged=paged,
        qo_indptr=qo,
        kv_lens=kv_lens,
        kv_indptr=kvp,
        page_size=page_size if paged else 1,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim_qk,
        causal=bool(causal) and custom_mask is None,
        window_left=int(window_left) if window_left is not None and window_left >= 0 else -1,
        logits_soft_cap=float(logits_soft_cap or 0.0),
        sm_scale=float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(head_dim_qk),
        q_dtype=_canon_dtype(q_data_type, "q_data_type"),
        kv_dtype=_canon_dtype(kv_data_type, "kv_data_type"),
        device=device,
        workspace=workspace,
    )
    if custom_mask is not None:
        expected = int((qo_lens * kv_lens).sum())
        if custom_mask.dim() != 1 or custom_mask.numel() != expected:
            raise ValueError(
                f"custom_mask must be flat with sum(qo_len * kv_len) = {expected} elements, got "
                f"shape {tuple(custom_mask.shape)}"
            )
        if custom_mask.dtype != torch.bool:
            raise TypeError(f"custom_mask must be torch.bool, got {custom_mask.dtype}")
        offs = np.zeros(batch + 1, np.int64)
        np.cumsum(qo_lens * kv_lens, out=offs[1:])
        plan.mask_d = custom_mask.to(device).view(torch.uint8).contiguous()
        plan.mask_indptr_d = torch.from_numpy(offs).to(device)
    if paged:
        assert kv_indices is not None and kv_last_page_len is not None
        plan.kv_indices_d = kv_indices.to(device=device, dtype=torch.int32)
        plan.kv_last_page_len_d = kv_last_page_len.to(device=device, dtype=torch.int32)
        if kv_indices.device.type != "cpu" and env.DEBUG_CHECKS.get():
            # On a GPU the page-id bounds cost a pass and a sync: only as a debug check (on
            # the CPU, run checks them on first use).
            _check_page_ids(plan, kv_indices)
    # The index arrays run reads, and the work list of the default tactic (run would build
    # it on first use), in one host-to-device copy.
    tactic = _default_tactic(plan, device)
    tpt = tactic.tokens_per_tile(plan.group_size)
    work = _work_rows(plan, tpt, tactic.block_n)
    ints = _pack_ints(device, [qo, kvp, kv_lens, work.reshape(-1)])
    plan.qo_indptr_d, plan.kv_indptr_d, plan.kv_lens_d, work_d = ints
    plan.works[(tpt, tactic.block_n, _WORK_ORDER)] = work_d.view(-1, 8)
    return plan


def _int_vector(t: torch.Tensor | Sequence[int], name: str) -> torch.Tensor:
    if isinstance(t, torch.Tensor):
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
        return t
    return torch.as_tensor(np.asarray(t, dtype=np.int64).reshape(-1))


def _pack_ints(device: torch.device, arrays: list[np.ndarray]) -> list[torch.Tensor]:
    """int32 device copies of `arrays`: one buffer, one (async, pinned) host-to-device copy."""
    sizes = [a.size for a in arrays]
    total = sum(sizes)
    if device.type == "cuda":
        staging = _staging(device)
        buf = staging.host_buffer(total)
    else:
        buf = np.empty(total, np.int32)
    off = 0
    for a, n in zip(arrays, sizes, strict=True):
        buf[off : off + n] = a
        off += n
    if device.type == "cuda":
        dev = torch.empty(total, dtype=torch.int32, device=device)
        staging.upload(dev, total)
    else:
        dev = torch.from_numpy(buf)
    out, off = [], 0
    for n in sizes:
        out.append(dev[off : off + n])
        off += n
    return out


def _check_page_ids(plan: _PrefillPlan, kv_indices: torch.Tensor) -> None:
    """Sets plan.num_pages_needed from the planned page ids (raises on a negative one)."""
    nnz = int(plan.kv_indptr[-1])
    if nnz:
        head = kv_indices[:nnz]
        lo, hi = int(head.min()), int(head.max())
        if lo < 0:
            raise ValueError(f"paged_kv_indices must be >= 0, got {lo}")
        plan.num_pages_needed = hi + 1
    plan.page_ids_checked = True


# --------------------------------------------------------------------------------------------
# Schemas (the Definitions of the FlashInfer-Trace gqa_paged / gqa_ragged prefill ops)
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def gqa_paged_prefill_ref(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, kv_last_page_len=None,
    causal=True, window_left=None, logits_soft_cap=None,
):  # fmt: skip
    """Self-contained reference of a gqa_paged prefill Definition (emitted into the JSON).
    k_cache/v_cache [num_pages, page_size, Hkv, D]; kv_last_page_len None means full pages."""
    out = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float32, device=q.device)
    group = q.shape[1] // k_cache.shape[2]
    page_size = k_cache.shape[1]
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        if qe == qs or pages.numel() == 0:
            continue
        last = page_size if kv_last_page_len is None else int(kv_last_page_len[b])
        n = (pages.numel() - 1) * page_size + last
        k = k_cache[pages].flatten(0, 1)[:n].float().transpose(0, 1).repeat_interleave(group, 0)
        v = v_cache[pages].flatten(0, 1)[:n].float().transpose(0, 1).repeat_interleave(group, 0)
        logits = torch.matmul(q[qs:qe].float().transpose(0, 1), k.transpose(1, 2)) * sm_scale
        if logits_soft_cap:
            logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
        i = torch.arange(qe - qs, device=q.device)[:, None] + (n - (qe - qs))
        j = torch.arange(n, device=q.device)[None, :]
        keep = (j <= i) if causal else torch.ones_like(j <= i)
        if window_left is not None and window_left >= 0:
            keep = keep & (j >= i - window_left)
        logits = logits.masked_fill(~keep, -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)
        p = torch.exp(logits - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
        out[qs:qe] = torch.matmul(p, v).transpose(0, 1).to(q.dtype)
        lse[qs:qe] = (row_lse / math.log(2.0)).transpose(0, 1)
    return out, lse


@torch.no_grad()
def gqa_ragged_prefill_ref(
    q, k, v, qo_indptr, kv_indptr, sm_scale, causal=True, window_left=None, logits_soft_cap=None
):
    """Self-contained reference of a gqa_ragged prefill Definition (emitted into the JSON)."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float32, device=q.device)
    group = q.shape[1] // k.shape[1]
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        ks, ke = int(kv_indptr[b]), int(kv_indptr[b + 1])
        if qe == qs or ke == ks:
            continue
        kb = k[ks:ke].float().transpose(0, 1).repeat_interleave(group, 0)
        vb = v[ks:ke].float().transpose(0, 1).repeat_interleave(group, 0)
        logits = torch.matmul(q[qs:qe].float().transpose(0, 1), kb.transpose(1, 2)) * sm_scale
        if logits_soft_cap:
            logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
        i = torch.arange(qe - qs, device=q.device)[:, None] + ((ke - ks) - (qe - qs))
        j = torch.arange(ke - ks, device=q.device)[None, :]
        keep = (j <= i) if causal else torch.ones_like(j <= i)
        if window_left is not None and window_left >= 0:
            keep = keep & (j >= i - window_left)
        logits = logits.masked_fill(~keep, -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)
        p = torch.exp(logits - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
        out[qs:qe] = torch.matmul(p, vb).transpose(0, 1).to(q.dtype)
        lse[qs:qe] = (row_lse / math.log(2.0)).transpose(0, 1)
    return out, lse


def _heads_axes() -> dict[str, Var | Const]:
    return {
        "num_qo_heads": Const("Number of query/output attention heads.", abbrev="h"),
        "num_kv_heads": Const("Number of key-value attention heads.", abbrev="kv"),
        "head_dim": Const("Dimension of each attention head.", abbrev="d"),
    }


_LEN_INDPTR = Var(
    "Length of indptr arrays. Should be the same for qo_indptr and kv_indptr (batch_size + 1)."
)
_TOTAL_Q = Var("Total number of query tokens.")
_QO = ["total_q", "num_qo_heads", "head_dim"]
_OUTPUTS = {
    "output": Tensor(_QO, dtype_from="q"),
    "lse": Tensor(
        ["total_q", "num_qo_heads"], dtype="float32",
        description="The 2-based log-sum-exp of attention logits.",
    ),
}  # fmt: skip
_SM_SCALE = Scalar("float32", description="Softmax scale. Default is (1/sqrt(head_dim)).")
_BOUND = ("window_left", "logits_soft_cap")


def _paged_schema(causal: bool, last_page_len: bool) -> OpSchema:
    kv = ["num_pages", "page_size", "num_kv_heads", "head_dim"]
    axes: dict[str, Var | Const] = {
        **_heads_axes(),
        "page_size": Const("Number of tokens stored per page.", abbrev="ps"),
        "len_indptr": _LEN_INDPTR,
        "total_q": _TOTAL_Q,
        "num_kv_indices": Var("Total number of KV page indices."),
        "num_pages": Var("Total number of allocated pages in the KV cache."),
    }
    inputs: dict[str, Tensor | Scalar] = {
        "q": Tensor(_QO, dtype_from="q"),
        "k_cache": Tensor(kv, dtype_from="k_cache"),
        "v_cache": Tensor(kv, dtype_from="k_cache"),
        "qo_indptr": Tensor(["len_indptr"], dtype="int32",
                            description="Query offsets for each sequence."),
        "kv_indptr": Tensor(["len_indptr"], dtype="int32",
                            description="KV page offsets for each sequence."),
        "kv_indices": Tensor(["num_kv_indices"], dtype="int32",
                             description="Page IDs for KV cache lookups."),
    }  # fmt: skip
    if last_page_len:
        axes["batch_size"] = Var("Number of sequences in the batch.")
        inputs["kv_last_page_len"] = Tensor(
            ["batch_size"], dtype="int32", description="Number of valid tokens in the last page."
        )
    inputs["sm_scale"] = _SM_SCALE
    mask = "causal" if causal else "noncausal"
    return OpSchema(
        op_type="gqa_paged",
        name_prefix=f"gqa_paged_prefill_{mask}",
        axes=axes,
        inputs=inputs,
        outputs=_OUTPUTS,
        reference=gqa_paged_prefill_ref,
        bound=("causal", *_BOUND),
        constraints=[
            "total_q == qo_indptr[-1].item()",
            "num_kv_indices == kv_indptr[-1].item()",
        ],
        tags=["stage:prefill", "fi_api:flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper"],
        description=f"Batched Grouped Query Attention prefill with a paged KV cache ({mask}).",
    )


def _ragged_schema(causal: bool) -> OpSchema:
    kv = ["total_kv", "num_kv_heads", "head_dim"]
    mask = "causal" if causal else "noncausal"
    return OpSchema(
        op_type="gqa_ragged",
        name_prefix=f"gqa_ragged_prefill_{mask}",
        axes={
            **_heads_axes(),
            "len_indptr": _LEN_INDPTR,
            "total_q": _TOTAL_Q,
            "total_kv": Var("Total key-value tokens across all sequences."),
        },
        inputs={
            "q": Tensor(_QO, dtype_from="q"),
            "k": Tensor(kv, dtype_from="k"),
            "v": Tensor(kv, dtype_from="k"),
            "qo_indptr": Tensor(
                ["len_indptr"], dtype="int32", description="Query offsets for each sequence."
            ),
            "kv_indptr": Tensor(
                ["len_indptr"], dtype="int32", description="Key-value offsets for each sequence."
            ),
            "sm_scale": _SM_SCALE,
        },  # fmt: skip
        outputs=_OUTPUTS,
        reference=gqa_ragged_prefill_ref,
        bound=("causal", *_BOUND),
        constraints=["total_q == qo_indptr[-1].item()", "total_kv == kv_indptr[-1].item()"],
        tags=["stage:prefill", "fi_api:flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper"],
        description=f"Batched Grouped Query Attention prefill with ragged KV ({mask}).",
    )


# Page size 1 has no kv_last_page_len input (every page is full), as in the corpus.
GQA_PAGED_PREFILL = {
    (causal, ps1): _paged_schema(causal, not ps1)
    for causal in (True, False)
    for ps1 in (True, False)
}
GQA_RAGGED_PREFILL = {causal: _ragged_schema(causal) for causal in (True, False)}


def _paged_schema_for(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale,
                      kv_last_page_len=None, causal=True, **_: Any) -> OpSchema:  # fmt: skip
    return GQA_PAGED_PREFILL[(bool(causal), k_cache.shape[1] == 1)]


def _ragged_schema_for(*args: Any, causal: bool = True, **_: Any) -> OpSchema:
    return GQA_RAGGED_PREFILL[bool(causal)]


@api(schema=_paged_schema_for, schemas=list(GQA_PAGED_PREFILL.values()))
def gqa_paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    kv_last_page_len: torch.Tensor | None = None,
    causal: bool = True,
    window_left: int | None = None,
    logits_soft_cap: float | None = None,
    *,
    plan: _PrefillPlan,
    out: torch.Tensor,
    lse: torch.Tensor | None,
) -> None:
    """The schema'd op behind BatchPrefillWithPagedKVCacheWrapper.run (arguments named as
    the Definition's inputs; `plan` carries the device copies and the work list)."""
    _execute(plan, q, k_cache, v_cache, out, lse)


@api(schema=_ragged_schema_for, schemas=list(GQA_RAGGED_PREFILL.values()))
def gqa_ragged_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    sm_scale: float,
    causal: bool = True,
    window_left: int | None = None,
    logits_soft_cap: float | None = None,
    *,
    plan: _PrefillPlan,
    out: torch.Tensor,
    lse: torch.Tensor | None,
) -> None:
    """The schema'd op behind BatchPrefillWithRaggedKVCacheWrapper.run."""
    _execute(plan, q, k, v, out, lse)


# --------------------------------------------------------------------------------------------
# Runners and launch
# --------------------------------------------------------------------------------------------


def _launch(
    plan: _PrefillPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    tactic: PrefillTactic,
) -> None:
    """Launch the Triton kernel. k/v: paged [P, page_size, Hkv, D] views or ragged [T, Hkv, D]."""
    group = plan.group_size
    pack = _pack(tactic, group)
    work = plan.work_list(tactic.tokens_per_tile(group), tactic.block_n)
    if work.shape[0] == 0:
        return
    paged = plan.paged
    if paged and tactic.tma:
        k, v = _stage_pages(plan, k, v)
        paged = False
    _launch_kernel(
        q, k, v, out, lse, plan.qo_indptr_d, tactic=tactic, paged=paged,
        page_size=plan.page_size, group=group, pack=pack, num_qo_heads=plan.num_qo_heads,
        head_dim=plan.head_dim, causal=plan.causal, window_left=plan.window_left,
        sm_scale=plan.sm_scale, logits_soft_cap=plan.logits_soft_cap, num_items=work.shape[0],
        work=work, kv_indices=plan.kv_indices_d, mask=plan.mask_d,
        mask_indptr=plan.mask_indptr_d,
    )  # fmt: skip


def _pack(tactic: PrefillTactic, group: int) -> int:
    """Query heads per program under `tactic` (the whole GQA group, or 1)."""
    pack = group if tactic.pack_heads else 1
    if tactic.block_m < pack:
        raise ValueError(f"tactic {tactic} cannot hold a group of {group} heads")
    return pack


def _launch_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    qo_indptr: torch.Tensor,
    *,
    tactic: PrefillTactic,
    paged: bool,
    page_size: int,
    group: int,
    pack: int,
    num_qo_heads: int,
    head_dim: int,
    causal: bool,
    window_left: int,
    sm_scale: float,
    logits_soft_cap: float,
    num_items: int,
    work: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    device_work: dict[str, Any] | None = None,
) -> None:
    """Launch _prefill_kernel, one program per (work item, head group), for both paths.

    k/v: paged [P, page_size, Hkv, D] views (paged) or ragged/staged [T, Hkv, D]; qo_indptr
    [batch + 1] int32 on q's device; logits_soft_cap 0 for none; pack from _pack. The planned
    path gives `work` (its [num_items, 8] list) and, where planned, the custom mask; the
    plan-free path gives `device_work`, the kernel's DEVICE_WORK arguments other than
    QO_INDPTR (KV_INDPTR, KV_LAST_PAGE_LEN, batch, INDPTR_PAGE_SIZE, BLOCK_B), and
    num_items is then an upper bound (programs past the real items do nothing).
    """
    from flashtune.ops.attention.prefill_kernels import _prefill_kernel

    dummy = qo_indptr  # int32 stand-in for the tensors this launch never reads
    if paged:
        stride_kp, stride_ks, stride_kh = k.stride(0), k.stride(1), k.stride(2)
        stride_vp, stride_vs, stride_vh = v.stride(0), v.stride(1), v.stride(2)
    else:
        stride_kp, stride_ks, stride_kh = k.stride(0), 0, k.stride(1)
        stride_vp, stride_vs, stride_vh = v.stride(0), 0, v.stride(1)
    soft_cap = logits_soft_cap > 0
    if soft_cap:
        qk_scale = sm_scale / logits_soft_cap
        soft_cap_log2 = logits_soft_cap * _LOG2E
    else:
        qk_scale = sm_scale * _LOG2E
        soft_cap_log2 = 0.0
    lse_t = lse if lse is not None else out
    use_tma = tactic.tma and not paged and _tma_ok(k) and _tma_ok(v)
    k_arg: Any = k
    v_arg: Any = v
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        # 2-D view [total_kv, H * D] (heads adjacent, as NHD storage has them): one TMA box
        # [BLOCK_N, D] per tile at column kv_head * D, the layout TMA and wgmma like best.
        block = [tactic.block_n, head_dim]
        k_arg = TensorDescriptor(k, [k.shape[0], k.shape[1] * k.shape[2]], [k.stride(0), 1], block)
        v_arg = TensorDescriptor(v, [v.shape[0], v.shape[1] * v.shape[2]], [v.stride(0), 1], block)
    # Only the plan-free launch names the DEVICE_WORK arguments; the planned one leaves them
    # at the kernel's defaults (DEVICE_WORK=False: WORK is read, the indptr arrays are not).
    extra = (
        {} if device_work is None else dict(DEVICE_WORK=True, QO_INDPTR=qo_indptr, **device_work)
    )
    num_head_groups = num_qo_heads // pack
    _prefill_kernel[(num_items * num_head_groups,)](
        q, k_arg, v_arg, out, lse_t,
        work if work is not None else dummy,
        kv_indices if paged else dummy,
        mask if mask is not None else dummy,
        mask_indptr if mask_indptr is not None else dummy,
        qk_scale, soft_cap_log2, window_left,
        q.stride(0), q.stride(1),
        stride_kp, stride_ks, stride_kh,
        stride_vp, stride_vs, stride_vh,
        out.stride(0), out.stride(1),
        lse_t.stride(0) if lse is not None else 0, lse_t.stride(1) if lse is not None else 0,
        NUM_HEAD_GROUPS=num_head_groups,
        GROUP_SIZE=group,
        PACK=pack,
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size if paged else 1,
        PAGED=paged,
        USE_TMA=use_tma,
        CAUSAL=causal,
        WINDOW=window_left >= 0,
        CUSTOM_MASK=mask is not None,
        SOFT_CAP=soft_cap,
        RETURN_LSE=lse is not None,
        BLOCK_M=tactic.block_m,
        BLOCK_N=tactic.block_n,
        num_warps=tactic.num_warps,
        num_stages=tactic.num_stages,
        **extra,
    )  # fmt: skip


def _stage_pages(
    plan: _PrefillPlan, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy the planned pages of k/v [P, page_size, H, D] (any layout) page after page into
    [nnz_pages * page_size, H, D] NHD tensors, in the workspace when it is large enough."""
    assert plan.kv_indices_d is not None
    pages = plan.kv_indices_d[: int(plan.kv_indptr[-1])]  # int32 ids: index_select takes them
    n, ps, h, d = pages.numel(), k.shape[1], k.shape[2], k.shape[3]
    elems = n * ps * h * d
    ws = plan.workspace
    nbytes = 2 * elems * k.element_size()
    if (
        ws is not None
        and ws.device == k.device
        and ws.is_contiguous()
        and ws.numel() * ws.element_size() >= nbytes
    ):
        buf = ws.view(-1).view(torch.uint8)[:nbytes].view(k.dtype)
    else:
        buf = torch.empty(2 * elems, dtype=k.dtype, device=k.device)
    ks = buf[:elems].view(n, ps, h, d)
    vs = buf[elems:].view(n, ps, h, d)
    torch.index_select(k, 0, pages, out=ks)
    torch.index_select(v, 0, pages, out=vs)
    return ks.view(n * ps, h, d), vs.view(n * ps, h, d)


def _tma_ok(t: torch.Tensor) -> bool:
    """A ragged [T, H, D] K/V the 2-D TMA view [T, H * D] can describe: heads adjacent, rows
    16-byte aligned (TMA's rule for the base address and the row stride)."""
    es = t.element_size()
    return (
        t.shape[0] > 0
        and t.stride(2) == 1
        and t.stride(1) == t.shape[2]
        and (t.stride(0) * es) % 16 == 0
        and t.data_ptr() % 16 == 0
    )


def _tactic_fits(t: PrefillTactic, head_dim: int, group: int) -> bool:
    if t.pack_heads and t.block_m < group:
        return False
    if head_dim >= 256:
        # Shared memory: Q tile + stages x (K + V tiles) in 16-bit must stay under ~227 KB.
        smem = 2 * head_dim * (t.block_m + t.num_stages * 2 * t.block_n)
        return smem <= 200 * 1024 and t.block_m * t.block_n <= 64 * 64
    return True


class TritonPrefillRunner(TunableRunner):
    """The Triton FlashAttention-2 prefill kernel; tactics index PREFILL_TACTICS.

    inputs: (q, k, v, out, lse_or_None, plan) with k/v as the kernel reads them.
    """

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        q, plan = inputs[0], inputs[5]
        cap = platform.compute_capability(q.device) or (0, 0)
        return [
            i
            for i, t in enumerate(PREFILL_TACTICS)
            if _tactic_fits(t, plan.head_dim, plan.group_size) and not (t.tma and cap < (9, 0))
        ]

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        q, k, v, out, lse, plan = inputs
        if tactic == DEFAULT_TACTIC:
            t = _default_tactic(plan, q.device)
        elif isinstance(tactic, PrefillTactic):
            t = tactic
        else:
            t = PREFILL_TACTICS[int(tactic)]  # type: ignore[call-overload]
        _launch(plan, q, k, v, out, lse, t)
        return out


_RUNNERS: tuple[TunableRunner, ...] = (TritonPrefillRunner(),)
_TUNING = TuningConfig(make_inputs=lambda inputs, profile: inputs)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def _check_tensor(t: Any, name: str, dim: int, device: torch.device | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the device of q)")


def _check_q(q: torch.Tensor, plan: _PrefillPlan) -> None:
    _check_tensor(q, "q", 3)
    expected = (plan.total_q, plan.num_qo_heads, plan.head_dim)
    if tuple(q.shape) != expected:
        raise ValueError(
            f"q must have shape [qo_indptr[-1], num_qo_heads, head_dim] = {list(expected)} as "
            f"planned, got {list(q.shape)}"
        )
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    if plan.q_dtype is not None and q.dtype != plan.q_dtype:
        raise TypeError(f"q has dtype {q.dtype}, planned q_data_type is {plan.q_dtype}")
    if q.device != plan.device and not (q.device.type == plan.device.type == "cuda"):
        raise ValueError(
            f"q is on device {q.device}, the wrapper's workspace is on device {plan.device}"
        )
    if q.stride(-1) != 1:
        raise ValueError("q must be contiguous in its last dimension")


def _check_kv(k: torch.Tensor, v: torch.Tensor, q: torch.Tensor, plan: _PrefillPlan) -> None:
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, expected {q.device} (the device of q)")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, expected {q.dtype} (the dtype of q)")
        if plan.kv_dtype is not None and t.dtype != plan.kv_dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, planned kv_data_type {plan.kv_dtype}")
        if t.shape[-2] != plan.num_kv_heads or t.shape[-1] != plan.head_dim:
            raise ValueError(
                f"{name} must have num_kv_heads={plan.num_kv_heads}, head_dim={plan.head_dim} "
                f"as planned, got shape {list(t.shape)}"
            )
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")


def _prepare_out(
    q: torch.Tensor,
    plan: _PrefillPlan,
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if out is None:
        out = torch.empty_like(q)
    else:
        if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.device != q.device:
            raise ValueError(
                f"out must be {list(q.shape)} {q.dtype} on {q.device}, got "
                f"{list(out.shape)} {out.dtype} on {out.device}"
            )
    if return_lse:
        shape = (plan.total_q, plan.num_qo_heads)
        if lse is None:
            lse = torch.empty(shape, dtype=torch.float32, device=q.device)
        elif tuple(lse.shape) != shape or lse.dtype != torch.float32 or lse.device != q.device:
            raise ValueError(
                f"lse must be {list(shape)} float32 on {q.device}, got {list(lse.shape)} "
                f"{lse.dtype} on {lse.device}"
            )
    else:
        lse = None
    return out, lse


def _run(
    plan: _PrefillPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
    return_lse: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    out, lse = _prepare_out(q, plan, out, lse, return_lse)
    variant = dict(
        causal=plan.causal,
        window_left=plan.window_left if plan.window_left >= 0 else None,
        logits_soft_cap=plan.logits_soft_cap or None,
        plan=plan,
        out=out,
        lse=lse,
    )
    if plan.paged:
        gqa_paged_prefill(
            q, k, v, plan.qo_indptr_d, plan.kv_indptr_d, plan.kv_indices_d, plan.sm_scale,
            None if plan.page_size == 1 else plan.kv_last_page_len_d, **variant,
        )  # fmt: skip
    else:
        gqa_ragged_prefill(q, k, v, plan.qo_indptr_d, plan.kv_indptr_d, plan.sm_scale, **variant)
    return (out, lse) if return_lse else out  # type: ignore[return-value]


def _execute(
    plan: _PrefillPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
) -> None:
    """Kernel when one can run on q's device, else the reference (CPU without interpreter)."""
    if platform.kernels_available(q.device):
        inputs = (q, k, v, out, lse, plan)
        runner, tactic = choose_one("attention.prefill", _RUNNERS, _TUNING, inputs)
        runner.forward(inputs, tactic)
        return
    mask = plan.mask_d.view(torch.bool) if plan.mask_d is not None else None
    common = dict(
        sm_scale=plan.sm_scale,
        causal=plan.causal,
        window_left=plan.window_left,
        logits_soft_cap=plan.logits_soft_cap or None,
        custom_mask=mask,
    )
    if plan.paged:
        assert plan.kv_indices_d is not None and plan.kv_last_page_len_d is not None
        o, s = batch_prefill_paged_ref(
            q, k, v, plan.qo_indptr_d, plan.kv_indptr_d, plan.kv_indices_d,
            plan.kv_last_page_len_d, **common,
        )  # fmt: skip
    else:
        o, s = batch_prefill_ragged_ref(q, k, v, plan.qo_indptr_d, plan.kv_indptr_d, **common)
    out.copy_(o)
    if lse is not None:
        lse.copy_(s)


class _PrefillWrapperBase:
    def __init__(self, workspace_buffer: torch.Tensor, kv_layout: str, use_cuda_graph: bool):
        if not isinstance(workspace_buffer, torch.Tensor):
            raise TypeError(
                f"workspace_buffer must be a torch.Tensor, got {type(workspace_buffer).__name__}"
            )
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
        self._workspace = workspace_buffer
        self._kv_layout = kv_layout
        self._use_cuda_graph = use_cuda_graph
        self._plan: _PrefillPlan | None = None

    @property
    def device(self) -> torch.device:
        return self._workspace.device

    def _require_plan(self) -> _PrefillPlan:
        if self._plan is None:
            raise RuntimeError(f"{type(self).__name__}.run called before plan()")
        return self._plan

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor, *args: Any) -> None:
        self._workspace = float_workspace_buffer
        if self._plan is not None:
            self._plan.workspace = float_workspace_buffer
            self._plan.default_tactic = None  # staging may (no longer) fit: pick again


class BatchPrefillWithPagedKVCacheWrapper(_PrefillWrapperBase):
    """Batch prefill/append attention over a paged KV cache (FlashInfer-compatible)."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        paged_kv_indptr_buf: torch.Tensor | None = None,
        paged_kv_indices_buf: torch.Tensor | None = None,
        paged_kv_last_page_len_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph)

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: str | torch.dtype | None = None,
        kv_data_type: str | torch.dtype | None = None,
        non_blocking: bool = True,
    ) -> None:
        """Validate the batch and build the work list (CPU, from the lengths alone).

        q_data_type / kv_data_type: when given, run checks q / the cache against them.
        """
        for name, t in (
            ("paged_kv_indices", paged_kv_indices),
            ("paged_kv_last_page_len", paged_kv_last_page_len),
        ):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        self._plan = _plan(
            paged=True, device=self.device, qo_indptr=qo_indptr, kv_indptr=paged_kv_indptr,
            kv_indices=paged_kv_indices, kv_last_page_len=paged_kv_last_page_len,
            num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk,
            head_dim_vo=head_dim_vo, page_size=page_size, custom_mask=custom_mask,
            packed_custom_mask=packed_custom_mask, causal=causal,
            pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale, window_left=window_left,
            logits_soft_cap=logits_soft_cap, q_data_type=q_data_type, kv_data_type=kv_data_type,
            workspace=self._workspace,
        )  # fmt: skip

    begin_forward = plan

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        *args: Any,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention of q [qo_indptr[-1], Hq, D] over the planned pages of `paged_kv_cache`.

        Returns out [qo_indptr[-1], Hq, D], and the base-2 LSE [qo_indptr[-1], Hq] float32
        when return_lse.
        """
        plan = self._require_plan()
        _check_q(q, plan)
        k, v = split_kv_cache(paged_kv_cache, self._kv_layout)
        _check_kv(k, v, q, plan)
        if k.shape[1] != plan.page_size:
            raise ValueError(
                f"paged_kv_cache has page_size {k.shape[1]} ({self._kv_layout}), planned "
                f"{plan.page_size}"
            )
        if not plan.page_ids_checked and plan.kv_indices_d.device.type == "cpu":
            _check_page_ids(plan, plan.kv_indices_d)  # on the CPU: free of syncs
        if plan.num_pages_needed > k.shape[0]:
            raise ValueError(
                f"paged_kv_indices reference page {plan.num_pages_needed - 1} but the cache "
                f"holds {k.shape[0]} pages"
            )
        return _run(plan, q, k, v, out, lse, return_lse)

    def run_return_lse(
        self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.run(q, paged_kv_cache, *args, return_lse=True, **kwargs)  # type: ignore


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillWrapperBase):
    """Batch prefill attention over ragged (concatenated) K/V tensors (FlashInfer-compatible)."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        kv_indptr_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph)

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: str | torch.dtype | None = None,
        kv_data_type: str | torch.dtype | None = None,
        non_blocking: bool = True,
    ) -> None:
        """Validate the batch and build the work list (CPU, from the lengths alone)."""
        self._plan = _plan(
            paged=False, device=self.device, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
            kv_indices=None, kv_last_page_len=None, num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk, head_dim_vo=head_dim_vo,
            page_size=1, custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
            causal=causal, pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale,
            window_left=window_left, logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
            kv_data_type=kv_data_type,
        )  # fmt: skip

    begin_forward = plan

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *args: Any,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention of q [qo_indptr[-1], Hq, D] over k/v [kv_indptr[-1], Hkv, D] (NHD) or
        [Hkv, kv_indptr[-1], D] (HND)."""
        plan = self._require_plan()
        _check_q(q, plan)
        _check_tensor(k, "k", 3)
        _check_tensor(v, "v", 3)
        if self._kv_layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        if k.shape != v.shape:
            raise ValueError(f"k shape {list(k.shape)} != v shape {list(v.shape)}")
        _check_kv(k, v, q, plan)
        if k.shape[0] != int(plan.kv_indptr[-1]):
            raise ValueError(
                f"k/v must hold kv_indptr[-1]={plan.kv_indptr[-1]} tokens as planned, got "
                f"{k.shape[0]}"
            )
        return _run(plan, q, k, v, out, lse, return_lse)

    def run_return_lse(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.run(q, k, v, *args, return_lse=True, **kwargs)  # type: ignore


def single_prefill_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    custom_mask: torch.Tensor | None = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    sm_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    return_lse: bool = False,
    **kwargs: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Prefill attention of one request: q [qo_len, Hq, D], k/v [kv_len, Hkv, D] (NHD) or
    [Hkv, kv_len, D] (HND); custom_mask [qo_len, kv_len] bool (replaces causal)."""
    unsupported = {
        k_: v_ for k_, v_ in kwargs.items() if v_ is not None and k_ != "pos_encoding_mode"
    }
    if unsupported or kwargs.get("pos_encoding_mode", "NONE") != "NONE":
        raise NotImplementedError(f"unsupported arguments: {sorted(kwargs)}")
    _check_tensor(q, "q", 3)
    _check_tensor(k, "k", 3, q.device)
    _check_tensor(v, "v", 3, q.device)
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    qo_len, kv_len = q.shape[0], k.shape[0]
    mask = None
    if custom_mask is not None:
        if tuple(custom_mask.shape) != (qo_len, kv_len):
            raise ValueError(
                f"custom_mask must have shape [qo_len, kv_len] = [{qo_len}, {kv_len}], got "
                f"{list(custom_mask.shape)}"
            )
        mask = custom_mask.reshape(-1)
    wrapper = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(0, device=q.device))
    wrapper.plan(
        torch.tensor([0, qo_len], dtype=torch.int32),
        torch.tensor([0, kv_len], dtype=torch.int32),
        q.shape[1], k.shape[1], q.shape[2], custom_mask=mask, causal=causal,
        window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
    )  # fmt: skip
    return wrapper.run(q, k, v, return_lse=return_lse)

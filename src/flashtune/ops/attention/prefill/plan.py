"""The host plan of batch prefill: validate the batch and build the flat work list of
(request, query tile) items for `BatchPrefillWith{Paged,Ragged}KVCacheWrapper`.

`make_plan` runs on the CPU from the lengths alone (one device-to-host copy of the indptr
arrays) and uploads the index arrays and the work list of the default tactic in one
host-to-device copy. The list is ordered heaviest request first and, within it, heaviest
tile first (the number of KV tiles a tile visits), so long causal tiles start early, short
ones fill the tail, and the programs in flight share one request's K/V in L2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from flashtune import env
from flashtune.ops.attention.prefill.config import (
    MAX_STAGING_BYTES,
    SUPPORTED_HEAD_DIMS,
    PrefillTactic,
    default_tactic_for,
)
from flashtune.ops.attention.prefill.graph import LaunchSignature, PrefillGraph
from flashtune.ops.attention.prefill.multi_item import MultiItemScoring
from flashtune.ops.attention.rotary import rope_for
from flashtune.ops.attention.staging import host_int64, host_staging, packed_offsets
from flashtune.ops.attention.variant import AttentionVariant
from flashtune.tune import DEFAULT_TACTIC, Tactic

__all__ = [
    "PrefillPlan",
    "PrefillSpec",
    "PrefillBatch",
    "make_plan",
    "check_indptr",
    "check_page_ids",
    "launch_order",
    "default_tactic",
    "pick_default",
]


def check_indptr(ptr: np.ndarray, name: str) -> None:
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
class PrefillPlan:
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
    page_ids_checked: bool = False  # num_pages_needed is known (see check_page_ids)
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
    hopper_tactic: int | None = None  # the Gluon kernel's tactic -1 (hopper.default_tactic)
    # CUDA-graph mode (prefill/graph.py): the one tactic run launches, the autotuner skipped;
    # its work list lives in the wrapper's fixed buffer, padded to a fixed number of items.
    graph_tactic: PrefillTactic | None = None
    tactic: Tactic = DEFAULT_TACTIC
    work_order: str = "request"  # one of prefill.config.WORK_ORDERS
    rope: tuple[float, float] | None = None  # ROPE_LLAMA's (rope_scale, rope_theta)
    alibi: bool = False  # ALIBI: FlashInfer's ALiBi bias (prefill_kernel)

    @property
    def group_size(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def variant(self) -> AttentionVariant:
        """The attention variant the plan fixed, as the launch takes it."""
        return AttentionVariant(
            sm_scale=self.sm_scale,
            causal=self.causal,
            window_left=self.window_left,
            logits_soft_cap=self.logits_soft_cap,
            rope=self.rope,
            alibi=self.alibi,
        )

    @property
    def total_q(self) -> int:
        return int(self.qo_indptr[-1])

    def work_rows(self, tokens_per_tile: int, block_n: int) -> np.ndarray:
        """The rows of `work_list` on the host (computed again, not cached)."""
        return _work_rows(self, tokens_per_tile, block_n)

    def work_list(self, tokens_per_tile: int, block_n: int) -> torch.Tensor:
        """[num_items, 8] int32, heaviest first, cached per tile shape: (request, first
        token, qo_start, qo_len, kv_len, KV offset in pages, KV offset in tokens, 0)."""
        key = (tokens_per_tile, block_n, self.work_order)
        if key not in self.works:
            work = _work_rows(self, tokens_per_tile, block_n)
            self.works[key] = torch.from_numpy(work).to(self.device, non_blocking=True)
        return self.works[key]


def _work_rows(plan: PrefillPlan, tokens_per_tile: int, block_n: int) -> np.ndarray:
    """The work list of `plan` on the host (see PrefillPlan.work_list), vectorized."""
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
        if plan.work_order == "request":
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
    order = launch_order(req, cost, ntiles, plan.work_order)
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


def launch_order(
    req: np.ndarray, cost: np.ndarray, ntiles: np.ndarray, order: str = "request"
) -> np.ndarray:
    """The launch order of the tiles (generated request by request, first token ascending).

    "request": heaviest request first (ties: lower index), then its heaviest tiles first
    (ties: lower first token). "tile": heaviest tile first (ties: request, first token).
    Both are one stable argsort of a combined key, as the tiles come in (request, first
    token) order; the key fits in 16 bits for any batch a prefill plan sees in practice,
    where numpy's stable sort is a radix sort (a 4-key lexsort over ~6k tiles costs ~150 us).
    """
    batch = ntiles.size
    max_cost = int(cost.max(initial=0))
    if order == "request":
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


@dataclass(frozen=True)
class PrefillSpec:
    """The attention a prefill plan() fixes, as FlashInfer's plan takes it (make_plan
    validates and resolves it): heads, head dims and page size (1 for ragged KV), the mask
    (causal, window_left), scale and soft-cap, position encoding (pos_encoding_mode,
    rope_scale, rope_theta) and the dtypes q and the cache will have."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_vo: int | None = None
    page_size: int = 1
    causal: bool = False
    pos_encoding_mode: str = "NONE"
    sm_scale: float | None = None
    window_left: int = -1
    logits_soft_cap: float | None = None
    q_data_type: str | torch.dtype | None = None
    kv_data_type: str | torch.dtype | None = None
    rope_scale: float | None = None
    rope_theta: float | None = None


@dataclass(frozen=True)
class PrefillBatch:
    """The batch a prefill plan() reads: its index arrays (kv_indptr counts pages for a
    paged cache, tokens for ragged KV; kv_indices and kv_last_page_len: paged only) and its
    mask: a flat bool custom_mask, or FlashInfer's multi-item scoring, which becomes one."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor | None = None
    kv_last_page_len: torch.Tensor | None = None
    custom_mask: torch.Tensor | None = None
    packed_custom_mask: torch.Tensor | None = None
    multi_item: MultiItemScoring | None = None


@dataclass(frozen=True)
class _Lengths:
    """The batch's lengths on the host (int64): qo_indptr [B+1], kv_indptr [B+1] (pages or
    tokens), KV tokens and query tokens per request [B]."""

    qo: np.ndarray
    kvp: np.ndarray
    kv_lens: np.ndarray
    qo_lens: np.ndarray

    @property
    def batch(self) -> int:
        return len(self.qo) - 1


def make_plan(
    *,
    paged: bool,
    device: torch.device,
    batch: PrefillBatch,
    spec: PrefillSpec,
    workspace: torch.Tensor | None = None,
    graph: PrefillGraph | None = None,
) -> PrefillPlan:
    """The plan of one batch (see the module docstring); with `graph`, every array run reads
    is written into the graph's fixed buffers and the launch is the one the first plan fixed.
    `batch.multi_item` (FlashInfer's multi-item scoring) becomes the batch's custom mask.

    In steps: validate the spec, read the lengths (one device-to-host copy), build the plan,
    fix the graph's launch, store the mask and the page table, upload (one host-to-device
    copy)."""
    if batch.packed_custom_mask is not None:
        raise NotImplementedError("packed_custom_mask is not supported; pass custom_mask (bool)")
    rope, alibi = _validate(spec)
    lengths = _read_lengths(paged, batch, spec.page_size)
    custom_mask = batch.custom_mask
    if batch.multi_item is not None:
        if custom_mask is not None:
            raise ValueError("pass either custom_mask or prefix_len_ptr (multi-item scoring)")
        custom_mask = batch.multi_item.custom_mask(lengths.qo_lens, lengths.kv_lens)
    plan = PrefillPlan(
        paged=paged,
        qo_indptr=lengths.qo,
        kv_lens=lengths.kv_lens,
        kv_indptr=lengths.kvp,
        page_size=spec.page_size if paged else 1,
        num_qo_heads=spec.num_qo_heads,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim_qk,
        causal=bool(spec.causal) and custom_mask is None,
        window_left=_window(spec.window_left),
        logits_soft_cap=float(spec.logits_soft_cap or 0.0),
        sm_scale=_scale(spec.sm_scale, spec.head_dim_qk),
        q_dtype=_canon_dtype(spec.q_data_type, "q_data_type"),
        kv_dtype=_canon_dtype(spec.kv_data_type, "kv_data_type"),
        device=device,
        workspace=workspace,
        rope=rope,
        alibi=alibi,
    )
    if graph is not None:
        _fix_graph_launch(plan, graph, lengths, custom_mask is not None)
    if custom_mask is not None:
        _store_mask(plan, custom_mask, lengths, graph)
    if paged:
        _store_pages(plan, batch, graph)
    elif graph is not None:
        graph.store_qo_indptr(batch.qo_indptr, batch.kv_indptr)
    _upload(plan, lengths, graph)
    return plan


def _window(window_left: int | None) -> int:
    return int(window_left) if window_left is not None and window_left >= 0 else -1


def _scale(sm_scale: float | None, head_dim: int) -> float:
    return float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(head_dim)


def _validate(spec: PrefillSpec) -> tuple[tuple[float, float] | None, bool]:
    """Checks what the kernels support; returns (rope, alibi) from the position encoding."""
    alibi = spec.pos_encoding_mode == "ALIBI"  # the prefill kernel's bias; rope_for checks the rest
    rope = rope_for("NONE" if alibi else spec.pos_encoding_mode, spec.rope_scale, spec.rope_theta)
    num_qo_heads, num_kv_heads, head_dim_qk = spec.num_qo_heads, spec.num_kv_heads, spec.head_dim_qk
    if spec.head_dim_vo is not None and spec.head_dim_vo != head_dim_qk:
        raise NotImplementedError(
            f"head_dim_vo ({spec.head_dim_vo}) != head_dim_qk ({head_dim_qk}) is not supported"
        )
    if num_qo_heads <= 0 or num_kv_heads <= 0 or num_qo_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_qo_heads ({num_qo_heads}) must be a positive multiple of num_kv_heads "
            f"({num_kv_heads})"
        )
    if head_dim_qk not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim_qk must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim_qk}")
    if spec.page_size <= 0:
        raise ValueError(f"page_size must be positive, got {spec.page_size}")
    if spec.logits_soft_cap is not None and spec.logits_soft_cap < 0:
        raise ValueError(f"logits_soft_cap must be >= 0 or None, got {spec.logits_soft_cap}")
    return rope, alibi


def _read_lengths(paged: bool, batch: PrefillBatch, page_size: int) -> _Lengths:
    """The batch's lengths, checked, from one device-to-host transfer (one sync) of all index
    arrays (none on the CPU)."""
    kv_name = "paged_kv_indptr" if paged else "kv_indptr"
    host_in = [_int_vector(batch.qo_indptr, "qo_indptr"), _int_vector(batch.kv_indptr, kv_name)]
    if paged:
        assert batch.kv_indices is not None and batch.kv_last_page_len is not None
        host_in.append(_int_vector(batch.kv_last_page_len, "paged_kv_last_page_len"))
    host = host_int64(*host_in)
    qo, kvp = host[0], host[1]
    check_indptr(qo, "qo_indptr")
    check_indptr(kvp, kv_name)
    if len(kvp) != len(qo):
        raise ValueError(
            f"qo_indptr and kv_indptr must both have batch_size + 1 entries, got {len(qo)} "
            f"and {len(kvp)}"
        )
    num_requests = len(qo) - 1
    kv_steps = kvp[1:] - kvp[:-1]
    if paged:
        kv_indices = batch.kv_indices
        assert kv_indices is not None
        last = host[2]
        if len(last) != num_requests:
            raise ValueError(
                f"paged_kv_last_page_len must have batch_size={num_requests} entries, got "
                f"{len(last)}"
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
    # Causal with qo_len > kv_len is FlashInfer's too: query i sees keys j <= i + kv_len -
    # qo_len, so its first qo_len - kv_len rows see none (output 0, LSE -inf).
    return _Lengths(qo=qo, kvp=kvp, kv_lens=kv_lens, qo_lens=qo[1:] - qo[:-1])


def _fix_graph_launch(
    plan: PrefillPlan, graph: PrefillGraph, lengths: _Lengths, custom_mask: bool
) -> None:
    """Graph mode: the batch must fit the fixed buffers, and the launch is the one the first
    plan fixed (a plan that would change it raises)."""
    qo, kvp = lengths.qo, lengths.kvp
    graph.check_batch(lengths.batch, int(qo[-1]), int(kvp[-1]) if plan.paged else 0)
    signature = LaunchSignature(
        num_qo_heads=plan.num_qo_heads,
        num_kv_heads=plan.num_kv_heads,
        head_dim=plan.head_dim,
        page_size=plan.page_size,
        causal=plan.causal,
        window_left=plan.window_left,
        logits_soft_cap=plan.logits_soft_cap,
        sm_scale=plan.sm_scale,
        custom_mask=custom_mask,
        q_dtype=plan.q_dtype,
        kv_dtype=plan.kv_dtype,
        rope=plan.rope,
        alibi=plan.alibi,
    )
    kv_max = int(lengths.kv_lens.max(initial=0))
    tactic = graph.fix_launch(signature, int(qo[-1]), plan.group_size, plan.paged, kv_max)
    plan.graph_tactic = plan.default_tactic = tactic


def _store_mask(
    plan: PrefillPlan, custom_mask: torch.Tensor, lengths: _Lengths, graph: PrefillGraph | None
) -> None:
    """The custom mask on the device as uint8, with its per-request offsets."""
    qo_lens, kv_lens = lengths.qo_lens, lengths.kv_lens
    expected = int((qo_lens * kv_lens).sum())
    if custom_mask.dim() != 1 or custom_mask.numel() != expected:
        raise ValueError(
            f"custom_mask must be flat with sum(qo_len * kv_len) = {expected} elements, got "
            f"shape {tuple(custom_mask.shape)}"
        )
    if custom_mask.dtype != torch.bool:
        raise TypeError(f"custom_mask must be torch.bool, got {custom_mask.dtype}")
    offs = np.zeros(lengths.batch + 1, np.int64)
    np.cumsum(qo_lens * kv_lens, out=offs[1:])
    plan.mask_d = custom_mask.to(plan.device).view(torch.uint8).contiguous()
    plan.mask_indptr_d = torch.from_numpy(offs).to(plan.device)
    if graph is not None:
        plan.mask_d, plan.mask_indptr_d = graph.store_mask(plan.mask_d, plan.mask_indptr_d)


def _store_pages(plan: PrefillPlan, batch: PrefillBatch, graph: PrefillGraph | None) -> None:
    """The page table on the device (in the graph's buffers in graph mode)."""
    kv_indices, kv_last_page_len = batch.kv_indices, batch.kv_last_page_len
    assert kv_indices is not None and kv_last_page_len is not None
    device = plan.device
    if graph is not None:
        graph.store_qo_indptr(batch.qo_indptr, None)
        nnz = int(plan.kv_indptr[-1])
        plan.kv_indices_d = graph.store_indices(kv_indices[:nnz], batch.kv_indptr, kv_last_page_len)
        plan.kv_last_page_len_d = graph.kv_last_page_len_buf
    else:
        plan.kv_indices_d = kv_indices.to(device=device, dtype=torch.int32)
        plan.kv_last_page_len_d = kv_last_page_len.to(device=device, dtype=torch.int32)
    if kv_indices.device.type != "cpu" and env.DEBUG_CHECKS.get():
        # On a GPU the page-id bounds cost a pass and a sync: only as a debug check (on
        # the CPU, run checks them on first use).
        check_page_ids(plan, kv_indices)


def _upload(plan: PrefillPlan, lengths: _Lengths, graph: PrefillGraph | None) -> None:
    """The index arrays run reads, and the work list of the default tactic (run would build
    it on first use), in one host-to-device copy."""
    device = plan.device
    tactic = default_tactic(plan, device)
    tpt = tactic.tokens_per_tile(plan.group_size)
    work = _work_rows(plan, tpt, tactic.block_n)
    dst = None
    if graph is not None:
        # A fixed grid: rows past the plan's items stay zeros (empty requests, no stores).
        padded = np.zeros((graph.max_items, 8), dtype=np.int32)
        padded[: work.shape[0]] = work
        work, dst = padded, graph.ints
    ints = _pack_ints(device, [lengths.qo, lengths.kvp, lengths.kv_lens, work.reshape(-1)], dst)
    plan.qo_indptr_d, plan.kv_indptr_d, plan.kv_lens_d, work_d = ints
    plan.works[(tpt, tactic.block_n, plan.work_order)] = work_d.view(-1, 8)


def _int_vector(t: torch.Tensor | Sequence[int], name: str) -> torch.Tensor:
    if isinstance(t, torch.Tensor):
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
        return t
    return torch.as_tensor(np.asarray(t, dtype=np.int64).reshape(-1))


def _pack_ints(
    device: torch.device, arrays: list[np.ndarray], dst: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """int32 device copies of `arrays`: one buffer (`dst` when given, written in place), one
    (async, pinned) host-to-device copy; each array starts 16-byte aligned (packed_offsets)."""
    sizes = [a.size for a in arrays]
    offsets, total = packed_offsets(sizes)
    if device.type == "cuda":
        staging = host_staging(device)
        buf = staging.host_buffer(total)
    else:
        buf = np.empty(total, np.int32)
    for a, off in zip(arrays, offsets, strict=True):
        buf[off : off + a.size] = a
    if dst is not None:
        assert dst.numel() == total and dst.dtype == torch.int32
    if device.type == "cuda":
        dev = dst if dst is not None else torch.empty(total, dtype=torch.int32, device=device)
        staging.upload(dev, total)
    elif dst is not None:
        dev = dst
        dev.copy_(torch.from_numpy(buf))
    else:
        dev = torch.from_numpy(buf)
    return [dev[off : off + n] for off, n in zip(offsets, sizes, strict=True)]


def check_page_ids(plan: PrefillPlan, kv_indices: torch.Tensor) -> None:
    """Sets plan.num_pages_needed from the planned page ids (raises on a negative one)."""
    nnz = int(plan.kv_indptr[-1])
    if nnz:
        head = kv_indices[:nnz]
        lo, hi = int(head.min()), int(head.max())
        if lo < 0:
            raise ValueError(f"paged_kv_indices must be >= 0, got {lo}")
        plan.num_pages_needed = hi + 1
    plan.page_ids_checked = True


def default_tactic(plan: PrefillPlan, device: torch.device) -> PrefillTactic:
    """Tactic -1, cached on the plan (run stays cheap). Numbers: prefill/config.py's notes."""
    if plan.default_tactic is None:
        plan.default_tactic = pick_default(plan, device)
    return plan.default_tactic


def _staging_bytes(plan: PrefillPlan) -> int:
    elem = plan.kv_dtype.itemsize if plan.kv_dtype is not None else 2
    return 2 * int(plan.kv_indptr[-1]) * plan.page_size * plan.num_kv_heads * plan.head_dim * elem


def pick_default(
    plan: PrefillPlan, device: torch.device, max_staging_bytes: int = MAX_STAGING_BYTES
) -> PrefillTactic:
    """Tactic -1 for `plan` on `device`: `default_tactic_for` at the plan's longest KV; a
    paged batch is staged for TMA when its pages fit the workspace or `max_staging_bytes`."""
    ws = plan.workspace
    ws_bytes = 0 if ws is None else ws.numel() * ws.element_size()
    return default_tactic_for(
        paged=plan.paged,
        group=plan.group_size,
        head_dim=plan.head_dim,
        kv_len=int(plan.kv_lens.max(initial=0)),
        can_stage=not plan.paged or _staging_bytes(plan) <= max(ws_bytes, max_staging_bytes),
        device=device,
    )

"""Batch prefill without a host-side plan: work items are found on the device.

The prefill wrappers (prefill/__init__.py) follow FlashInfer's plan/run split: `plan` copies the
indptr arrays to the host, builds the list of (request, query tile) work items there and
uploads it. That suits a serving loop that plans once per step for every layer, but a caller
with only tensors in hand pays the sync and the Python planner (~250 us) on every call, and
cannot capture the call at all: a Definition's function (the benchmark calls it as one
function of tensors), or a whole model step captured in a CUDA graph.

`paged_prefill` and `ragged_prefill` launch the same Triton kernel (prefill/kernels.py) with
DEVICE_WORK: the grid is an upper bound computed on the host from shapes alone, one program
per (item, head group) for cdiv(total_q, tokens per tile) + batch items (every request
rounds its last tile up at most once). Each program derives its own item from qo_indptr and
kv_indptr: the tile count of every request, prefix summed in registers over blocks of
requests, names the request that owns the item (masked sums pick its offsets and lengths);
within a request the heaviest tiles (the last query tiles under a causal mask) take the
lowest items, as in the host plan. Programs past the real item count do nothing. So a call
launches one kernel (plus, for a staged paged cache, two index_selects), never syncs, and
can be captured in a CUDA graph and replayed with new indptr contents as long as the shapes
stay the same.

The tile configuration is chosen from shapes only (Hopper: 64x64, 4 warps, 3 stages, K/V
through TMA, as the planned path's default). The autotuner is not consulted: tuning the
plan-free calls is not implemented, so their tactic is that default wherever they run. With TMA on a paged cache, every page listed in
kv_indices is first copied contiguously (index_select over all of kv_indices, whose length
is a shape) and request b's tokens start at kv_indptr[b] * page_size there.

Differences from the planned path: requests run in batch order (the plan puts the heaviest
request first); custom masks are not supported (use BatchPrefillWith*KVCacheWrapper); the
indptr contents are checked only on the CPU or with FLASHTUNE_DEBUG_CHECKS (a sync on a
GPU). Query rows past qo_indptr[-1] (a q padded to a fixed size for a graph) are not written.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from flashtune import env, platform
from flashtune.model_shapes import ModelConfig
from flashtune.ops.attention.decode.plan_free import plan_free_api, search_block
from flashtune.ops.attention.page import KV_LAYOUTS, build_page_table, split_kv_cache
from flashtune.ops.attention.prefill.config import (
    MAX_STAGING_BYTES,
    SUPPORTED_HEAD_DIMS,
    PrefillTactic,
    default_tactic_for,
)
from flashtune.ops.attention.prefill.launch import (
    KernelSpec,
    WorkItems,
    heads_per_program,
    launch_kernel,
)
from flashtune.ops.attention.prefill.plan import check_indptr
from flashtune.ops.attention.prefill.schema import (
    EXAMPLE_KV_LENS,
    EXAMPLE_PAGE_SIZES,
    EXAMPLE_QO_INDPTR,
    GQA_PAGED_PREFILL,
    GQA_RAGGED_PREFILL,
)
from flashtune.ops.attention.reference import batch_prefill_paged_ref, batch_prefill_ragged_ref
from flashtune.ops.attention.staging import host_int64
from flashtune.ops.attention.variant import AttentionVariant
from flashtune.schema import OpSchema
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = ["paged_prefill", "ragged_prefill", "plan_free_prefill_examples"]

_Q_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# --------------------------------------------------------------------------------------------
# Tactic (from shapes only)
# --------------------------------------------------------------------------------------------


def _pick_tactic(
    *, paged: bool, group: int, head_dim: int, mean_kv: int, stage_bytes: int, device: torch.device
) -> PrefillTactic:
    """The planned path's default tactic with the batch's lengths replaced by bounds a shape
    gives: the mean KV length per request (KV tokens the tensors can hold / batch) and the
    staging copy of every listed page."""
    return default_tactic_for(
        paged=paged,
        group=group,
        head_dim=head_dim,
        kv_len=mean_kv,
        can_stage=not paged or stage_bytes <= MAX_STAGING_BYTES,
        device=device,
    )


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _check_q(q: Any) -> None:
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 3:
        raise ValueError(
            f"q must be [total_q, num_qo_heads, head_dim] (3-D), got shape {tuple(q.shape)}"
        )
    if q.dtype not in _Q_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    if q.shape[2] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {q.shape[2]}")
    if q.stride(-1) != 1:
        raise ValueError("q must be contiguous in its last dimension (head_dim)")


def _check_kv(name: str, t: torch.Tensor, q: torch.Tensor) -> None:
    if t.dtype != q.dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, expected {q.dtype} (the dtype of q)")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device}, expected {q.device} (the device of q)")
    if t.shape[-1] != q.shape[2]:
        raise ValueError(f"{name} has head_dim {t.shape[-1]}, q has {q.shape[2]}")
    if q.shape[1] % t.shape[-2]:
        raise ValueError(
            f"num_qo_heads ({q.shape[1]}) must be a multiple of {name}'s num_kv_heads "
            f"({t.shape[-2]})"
        )
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (head_dim)")


def _index(name: str, t: Any, device: torch.device, numel: int | None = None) -> torch.Tensor:
    """A 1-D int32 index tensor on q's device (int64 is converted on the device, no sync)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 (or int64), got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the device of q)")
    if numel is not None and t.numel() != numel:
        raise ValueError(f"{name} must have {numel} entries (batch_size + 1), got {t.numel()}")
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def _indptrs(
    qo_indptr: Any, kv_indptr: Any, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(qo_indptr, kv_indptr) as int32 on q's device, and the batch size they give."""
    qo_ptr = _index("qo_indptr", qo_indptr, device)
    batch = qo_ptr.numel() - 1
    if batch < 0:
        raise ValueError("qo_indptr must have batch_size + 1 >= 1 entries, got 0")
    return qo_ptr, _index("kv_indptr", kv_indptr, device, batch + 1), batch


def _check_out(out: Any, q: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty_like(q)
    if (
        not isinstance(out, torch.Tensor)
        or out.shape != q.shape
        or out.dtype != q.dtype
        or out.device != q.device
        or out.stride(-1) != 1
    ):
        got = (
            f"{out.dtype} {tuple(out.shape)} on {out.device}"
            if isinstance(out, torch.Tensor)
            else type(out).__name__
        )
        raise ValueError(
            f"out must be a {q.dtype} tensor of shape {tuple(q.shape)} on {q.device}, "
            f"contiguous in its last dimension; got {got}"
        )
    return out


def _check_options(
    sm_scale: float | None, logits_soft_cap: float | None, window_left: int, custom_mask: Any
) -> None:
    if custom_mask is not None:
        raise NotImplementedError(
            "custom_mask is not supported without a plan; use "
            "BatchPrefillWithPagedKVCacheWrapper / BatchPrefillWithRaggedKVCacheWrapper"
        )
    if not isinstance(window_left, int) or isinstance(window_left, bool):
        raise TypeError(f"window_left must be an int, got {type(window_left).__name__}")
    if logits_soft_cap is not None and logits_soft_cap < 0:
        raise ValueError(f"logits_soft_cap must be >= 0 or None, got {logits_soft_cap}")
    if sm_scale is not None and not sm_scale > 0:
        raise ValueError(f"sm_scale must be > 0 or None, got {sm_scale}")


def _check_lengths(qo: np.ndarray, total_q: int) -> None:
    """Host checks of the contents (the caller decides when they are free or asked for)."""
    check_indptr(qo, "qo_indptr")
    if qo[-1] > total_q:
        raise ValueError(f"qo_indptr[-1]={qo[-1]} exceeds q's {total_q} tokens")
    # Causal with qo_len > kv_len is allowed (FlashInfer's semantics): the first
    # qo_len - kv_len queries of such a request see no key (output 0, LSE -inf).


def _check_paged_contents(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    last: torch.Tensor,
    page_size: int,
    num_pages: int,
    total_q: int,
    all_ids: bool,
) -> None:
    qo, kvp, lp = host_int64(qo_indptr, kv_indptr, last)
    check_indptr(kvp, "kv_indptr")
    if kvp[-1] > kv_indices.numel():
        raise ValueError(
            f"kv_indptr[-1]={kvp[-1]} pages but kv_indices has {kv_indices.numel()} entries"
        )
    steps = kvp[1:] - kvp[:-1]
    bad = (steps > 0) & ((lp < 1) | (lp > page_size))
    if bad.any():
        b = int(bad.argmax())
        raise ValueError(
            f"kv_last_page_len[{b}]={lp[b]} must be in 1..page_size={page_size} for a request "
            "with pages"
        )
    _check_lengths(qo, total_q)
    # The staged path copies every listed page, so then every entry must be a valid id.
    ids = kv_indices if all_ids else kv_indices[: int(kvp[-1])]
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= num_pages:
            raise ValueError(
                f"kv_indices hold page ids in {lo}..{hi}, outside the cache's {num_pages} pages"
                + (
                    " (with TMA every entry is staged, not only the first kv_indptr[-1])"
                    if all_ids
                    else ""
                )
            )


# --------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------


def _stage_all_pages(
    k: torch.Tensor, v: torch.Tensor, kv_indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy the pages listed in kv_indices (all of them: how many are used needs a sync) of
    k/v [P, page_size, H, D] (any layout) into contiguous NHD [n * page_size, H, D]."""
    n, ps, h, d = kv_indices.numel(), k.shape[1], k.shape[2], k.shape[3]
    elems = n * ps * h * d
    buf = torch.empty(2 * elems, dtype=k.dtype, device=k.device)  # one allocation for both
    ks, vs = buf[:elems].view(n, ps, h, d), buf[elems:].view(n, ps, h, d)
    torch.index_select(k, 0, kv_indices, out=ks)
    torch.index_select(v, 0, kv_indices, out=vs)
    return ks.view(n * ps, h, d), vs.view(n * ps, h, d)


def _run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor | None,
    last: torch.Tensor | None,
    *,
    page_size: int,  # 0: ragged k/v [total_kv, H, D]; else pages [P, page_size, H, D]
    tactic: PrefillTactic,
    variant: AttentionVariant,
    out: torch.Tensor | None,
    return_lse: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """What paged_prefill and ragged_prefill share once their inputs are checked: the output
    buffers, then the reference where no kernel can run (or it is forced), else one launch
    of the kernel with DEVICE_WORK."""
    total_q, num_qo_heads, head_dim = q.shape
    batch = qo_indptr.numel() - 1
    out = _check_out(out, q)
    lse = (
        torch.empty(total_q, num_qo_heads, dtype=torch.float32, device=q.device)
        if return_lse
        else None
    )
    if total_q == 0 or batch == 0:
        return _finish(out, lse)
    if not platform.kernels_available(q.device) or env.FORCE_REFERENCE.get():
        ref_variant = dataclasses.replace(variant, logits_soft_cap=variant.logits_soft_cap or None)
        if page_size:
            assert kv_indices is not None and last is not None
            o, s = batch_prefill_paged_ref(
                q, k, v, qo_indptr, kv_indptr, kv_indices, last, ref_variant
            )
        else:
            o, s = batch_prefill_ragged_ref(q, k, v, qo_indptr, kv_indptr, ref_variant)
        out.copy_(o)
        if lse is not None:
            lse.copy_(s)
        return _finish(out, lse)
    group = num_qo_heads // k.shape[-2]
    pack = heads_per_program(tactic, group)
    tokens = tactic.tokens_per_tile(group)
    # Every request's tiles but its last are full: sum cdiv(qo_len, T) < total_q / T + batch.
    items = -(-total_q // tokens) + batch
    paged = page_size > 0
    if paged and tactic.tma and kv_indices is not None and kv_indices.numel():
        k, v = _stage_all_pages(k, v, kv_indices)
        paged = False  # read as ragged; offsets in tokens (kv_indptr[b] * page_size)
    device_work = dict(
        KV_INDPTR=kv_indptr,
        KV_LAST_PAGE_LEN=last if last is not None else qo_indptr,  # qo_indptr: never read
        batch=batch,
        INDPTR_PAGE_SIZE=page_size,
        BLOCK_B=search_block(batch),
    )
    spec = KernelSpec(
        tactic=tactic,
        paged=paged,
        page_size=page_size,
        group=group,
        pack=pack,
        num_qo_heads=num_qo_heads,
        head_dim=head_dim,
        variant=variant,
    )
    launch_kernel(
        q,
        k,
        v,
        out,
        lse,
        qo_indptr,
        spec=spec,
        items=WorkItems(num_items=items, device_work=device_work),
        kv_indices=kv_indices,
    )
    return _finish(out, lse)


def _variant(
    q: torch.Tensor,
    causal: bool,
    sm_scale: float | None,
    logits_soft_cap: float | None,
    window_left: int,
) -> AttentionVariant:
    """The call's variant: the default scale resolved, no soft-cap as 0."""
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return AttentionVariant(
        sm_scale=scale,
        causal=causal,
        window_left=window_left,
        logits_soft_cap=float(logits_soft_cap or 0),
    )


def _finish(
    out: torch.Tensor, lse: torch.Tensor | None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    return (out, lse) if lse is not None else out


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Schemas: the prefill Definitions (gqa_paged_prefill_*, gqa_ragged_prefill_*) read from these
# functions' arguments, so the calls are dumped, captured and applied like the wrappers' runs.
# --------------------------------------------------------------------------------------------


def _cache_params(schema: OpSchema) -> OpSchema:
    params = {"k_cache": "paged_kv_cache.k", "v_cache": "paged_kv_cache.v"}
    inputs = {
        n: dataclasses.replace(s, param=params[n]) if n in params else s
        for n, s in schema.inputs.items()
    }
    return dataclasses.replace(schema, inputs=inputs)


PLAN_FREE_PAGED_PREFILL = {key: _cache_params(s) for key, s in GQA_PAGED_PREFILL.items()}


def _paged_schema_for(
    q: Any, paged_kv_cache: Any, *args: Any, kv_layout: str = "NHD", causal: bool = False, **_: Any
) -> OpSchema:
    page_size = split_kv_cache(paged_kv_cache, kv_layout)[0].shape[1]
    return PLAN_FREE_PAGED_PREFILL[(bool(causal), page_size == 1)]


def _ragged_schema_for(*args: Any, causal: bool = False, **_: Any) -> OpSchema:
    return GQA_RAGGED_PREFILL[bool(causal)]


@plan_free_api(_paged_schema_for, PLAN_FREE_PAGED_PREFILL.values())
def paged_prefill(
    q: torch.Tensor,
    paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    *,
    kv_layout: str = "NHD",
    causal: bool = False,
    sm_scale: float | None = None,
    logits_soft_cap: float | None = None,
    window_left: int = -1,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    custom_mask: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Batch prefill attention over a paged KV cache in one call, with no host sync.

    q: [total_q, num_qo_heads, head_dim] (rows qo_indptr[b]..qo_indptr[b+1] are request
    b's); paged_kv_cache: a 5-D tensor or a (k, v) pair, NHD [num_pages, page_size, H, D] or
    HND [num_pages, H, page_size, D] pages; qo_indptr and kv_indptr [batch + 1] (kv_indptr
    counts pages), kv_indices [nnz] page ids, kv_last_page_len [batch], int32 (or int64) on
    q's device. Masks align bottom-right as in FlashInfer (with qo_len > kv_len, causal rows
    that see no key give 0 and LSE -inf).
    Returns out [total_q, num_qo_heads, head_dim] and, with return_lse, the base-2 LSE
    [total_q, num_qo_heads] float32. Shapes, dtypes and devices are always checked; indptr
    and page-id contents only on the CPU or with FLASHTUNE_DEBUG_CHECKS (a sync on a GPU).
    """
    _check_options(sm_scale, logits_soft_cap, window_left, custom_mask)
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    _check_q(q)
    k, v = split_kv_cache(paged_kv_cache, kv_layout)
    _check_kv("paged_kv_cache", k, q)
    _check_kv("paged_kv_cache", v, q)
    dev = q.device
    qo_ptr, kv_ptr, batch = _indptrs(qo_indptr, kv_indptr, dev)
    indices = _index("kv_indices", kv_indices, dev)
    last = _index("kv_last_page_len", kv_last_page_len, dev, None)
    if last.numel() != batch:
        raise ValueError(
            f"kv_last_page_len must have batch_size={batch} entries (from qo_indptr), got "
            f"{last.numel()}"
        )
    num_pages, page_size, num_kv_heads, head_dim = k.shape
    total_q, num_qo_heads = q.shape[0], q.shape[1]
    group = num_qo_heads // num_kv_heads
    elem = k.element_size()
    tactic = _pick_tactic(
        paged=True,
        group=group,
        head_dim=head_dim,
        mean_kv=indices.numel() * page_size // max(batch, 1),
        stage_bytes=2 * indices.numel() * page_size * num_kv_heads * head_dim * elem,
        device=dev,
    )
    window = window_left if window_left >= 0 else -1
    if env.DEBUG_CHECKS.get() or dev.type == "cpu":
        # Contents: a sync on a GPU (debug only); on the CPU they are host memory already.
        _check_paged_contents(
            qo_ptr,
            kv_ptr,
            indices,
            last,
            page_size,
            num_pages,
            total_q,
            all_ids=tactic.tma,
        )
    return _run(
        q,
        k,
        v,
        qo_ptr,
        kv_ptr,
        indices,
        last,
        page_size=page_size,
        tactic=tactic,
        variant=_variant(q, causal, sm_scale, logits_soft_cap, window),
        out=out,
        return_lse=return_lse,
    )


@plan_free_api(_ragged_schema_for, GQA_RAGGED_PREFILL.values())
def ragged_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    logits_soft_cap: float | None = None,
    window_left: int = -1,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    custom_mask: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Batch prefill attention over ragged K/V in one call, with no host sync.

    q: [total_q, num_qo_heads, head_dim]; k, v: [total_kv, num_kv_heads, head_dim] (NHD);
    qo_indptr and kv_indptr [batch + 1] int32 (or int64) on q's device, kv_indptr in tokens.
    Returns out [total_q, num_qo_heads, head_dim] and, with return_lse, the base-2 LSE
    [total_q, num_qo_heads] float32. Indptr contents are checked only on the CPU or with
    FLASHTUNE_DEBUG_CHECKS.
    """
    _check_options(sm_scale, logits_soft_cap, window_left, custom_mask)
    _check_q(q)
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(
                f"{name} must be [total_kv, num_kv_heads, head_dim] (3-D), got shape "
                f"{tuple(t.shape)}"
            )
        _check_kv(name, t, q)
    if k.shape != v.shape:
        raise ValueError(f"k shape {tuple(k.shape)} != v shape {tuple(v.shape)}")
    dev = q.device
    qo_ptr, kv_ptr, batch = _indptrs(qo_indptr, kv_indptr, dev)
    total_q, num_qo_heads, head_dim = q.shape
    total_kv, num_kv_heads = k.shape[0], k.shape[1]
    window = window_left if window_left >= 0 else -1
    if env.DEBUG_CHECKS.get() or dev.type == "cpu":
        qo, kvp = host_int64(qo_ptr, kv_ptr)
        check_indptr(kvp, "kv_indptr")
        if kvp[-1] > total_kv:
            raise ValueError(f"kv_indptr[-1]={kvp[-1]} exceeds k/v's {total_kv} tokens")
        _check_lengths(qo, total_q)
    tactic = _pick_tactic(
        paged=False,
        group=num_qo_heads // num_kv_heads,
        head_dim=head_dim,
        mean_kv=total_kv // max(batch, 1),
        stage_bytes=0,
        device=dev,
    )
    return _run(
        q,
        k,
        v,
        qo_ptr,
        kv_ptr,
        None,
        None,
        page_size=0,
        tactic=tactic,
        variant=_variant(q, causal, sm_scale, logits_soft_cap, window),
        out=out,
        return_lse=return_lse,
    )


@register_examples(attention="gqa")
def plan_free_prefill_examples(model: ModelConfig) -> list[Example]:
    """The plan-free paged and ragged prefill, causal and not, on the wrappers' example page
    tables and lengths (prefill/__init__.py): the same Definitions."""
    hq, hk, d = model.num_qo_heads, model.num_kv_heads, model.head_dim
    kv_lens = list(EXAMPLE_KV_LENS)
    qo_indptr = torch.tensor(EXAMPLE_QO_INDPTR, dtype=torch.int32)
    q = meta_tensor(EXAMPLE_QO_INDPTR[-1], hq, d)
    examples: list[Example] = []
    kv_indptr = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    kv = meta_tensor(sum(kv_lens), hk, d)
    for causal in (True, False):
        for page_size in EXAMPLE_PAGE_SIZES:
            indptr, indices, last, num_pages = build_page_table(kv_lens, page_size, shuffle=False)
            cache = meta_tensor(num_pages, page_size, hk, d)
            paged_args = (q, (cache, cache), qo_indptr, indptr, indices, last)
            examples.append((paged_prefill, paged_args, {"causal": causal}))
        examples.append((ragged_prefill, (q, kv, kv, qo_indptr, kv_indptr), {"causal": causal}))
    return examples

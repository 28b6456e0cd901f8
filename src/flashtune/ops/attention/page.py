"""The paged KV cache layout.

A paged KV cache is a block-sparse row matrix: `kv_indptr` [B+1] and `kv_indices` (the CSR
index) list each request's pages, `kv_last_page_len` [B] says how many tokens its last page
holds. Pages are stored in one of two layouts:
- NHD: [num_pages, page_size, num_kv_heads, head_dim]
- HND: [num_pages, num_kv_heads, page_size, head_dim]
either as one 5-D tensor [num_pages, 2, ...] (k at index 0, v at 1) or as a (k, v) pair.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from flashtune import env, platform
from flashtune.ops.attention.staging import host_int64

__all__ = [
    "KV_LAYOUTS",
    "FP8_KV_DTYPES",
    "check_kv_dtype",
    "split_kv_cache",
    "get_seq_lens",
    "get_batch_indices_positions",
    "get_batch_indices_positions_ref",
    "append_paged_kv_cache",
    "append_paged_kv_cache_ref",
    "build_page_table",
    "validate_page_table",
    "validate_host_page_table",
    "explain_page_table",
]

KV_LAYOUTS = ("NHD", "HND")
# An fp8 KV cache is read by the attention kernels with fp16/bf16 queries: each K/V tile is
# converted to q's dtype as it is loaded (half the bytes of a 16-bit cache), scaled by the
# run's k_scale (logits) and v_scale (output).
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def check_kv_dtype(q_dtype: torch.dtype, kv_dtype: torch.dtype) -> None:
    """KV as q's dtype, or fp8 (e4m3/e5m2) under fp16/bf16 queries; else TypeError."""
    if kv_dtype == q_dtype:
        return
    if kv_dtype in FP8_KV_DTYPES and q_dtype in (torch.float16, torch.bfloat16):
        return
    raise TypeError(
        f"kv dtype {kv_dtype} with q dtype {q_dtype}: the KV cache must have q's dtype, or be "
        "float8_e4m3fn / float8_e5m2 under float16 / bfloat16 queries"
    )


def split_kv_cache(
    paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor], kv_layout: str = "NHD"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (k, v) as views of logical shape [num_pages, page_size, num_kv_heads, head_dim].

    HND storage is returned permuted (a view, no copy), so kernels that take strides read
    either layout through the same code path.
    """
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(
                f"paged_kv_cache as a tuple must be (k, v), got {len(paged_kv_cache)} tensors"
            )
        k, v = paged_kv_cache
        if k.shape != v.shape:
            raise ValueError(
                f"paged_kv_cache: k shape {tuple(k.shape)} != v shape {tuple(v.shape)}"
            )
    elif isinstance(paged_kv_cache, torch.Tensor):
        if paged_kv_cache.dim() != 5 or paged_kv_cache.shape[1] != 2:
            raise ValueError(
                "paged_kv_cache as one tensor must be 5-D [num_pages, 2, ...], got shape "
                f"{tuple(paged_kv_cache.shape)}"
            )
        k, v = paged_kv_cache[:, 0], paged_kv_cache[:, 1]
    else:
        raise TypeError(
            f"paged_kv_cache must be a tensor or a (k, v) tuple, got {type(paged_kv_cache).__name__}"
        )
    if k.dim() != 4:
        raise ValueError(
            f"paged_kv_cache: k and v must be 4-D per page table entry, got shape {tuple(k.shape)}"
        )
    if kv_layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return k, v


def build_page_table(
    kv_lens: list[int],
    page_size: int,
    *,
    shuffle: bool = True,
    extra_pages: int = 0,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """A page table for requests of the given KV lengths (tests, benchmarks, examples).

    Returns (kv_indptr [B+1], kv_indices [nnz], kv_last_page_len [B], num_pages), int32 on
    `device`; pages are a random permutation of the cache when `shuffle` (so neighbours in
    a sequence are not neighbours in memory) and `extra_pages` unused pages are added.
    Empty requests get no pages and last_page_len 0.
    """
    counts = [-(-int(n) // page_size) for n in kv_lens]
    nnz = sum(counts)
    num_pages = nnz + extra_pages
    order = torch.randperm(num_pages, generator=generator) if shuffle else torch.arange(num_pages)
    indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int64), 0).to(torch.int32)
    last = torch.tensor(
        [(int(n) - 1) % page_size + 1 if n else 0 for n in kv_lens], dtype=torch.int32
    )
    indices = order[:nnz].to(torch.int32)
    return indptr.to(device), indices.to(device), last.to(device), num_pages


# --------------------------------------------------------------------------- validation


def validate_page_table(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    page_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check a CSR page table on the host; return (indptr, last_page_len, kv_lens) as int64.

    Errors name the argument: indptr must be 1-D, non-decreasing, start >= 0 and end within
    `indices`; last_page_len must be in 1..page_size for requests with pages (0..page_size
    for requests without).
    """
    if indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError(
            f"indptr must be 1-D with batch_size + 1 entries, got {tuple(indptr.shape)}"
        )
    batch = indptr.numel() - 1
    if last_page_len.shape != (batch,):
        raise ValueError(
            f"last_page_len must have shape ({batch},) (batch_size from indptr), got "
            f"{tuple(last_page_len.shape)}"
        )
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
    ip, lp = host_int64(indptr, last_page_len)
    return validate_host_page_table(ip, lp, indices.numel(), page_size)


# Up to this many requests, the page table is checked in plain Python: ~10 numpy calls of
# ~1 us each on tiny arrays cost more than a loop over lists.
_PY_BATCH = 32


def validate_host_page_table(
    ip: np.ndarray, lp: np.ndarray, num_indices: int, page_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if 0 < ip.size <= _PY_BATCH + 1:
        ipl = ip.tolist()
        if ipl[0] >= 0 and ipl[-1] <= num_indices:
            kv: list[int] = []
            # The same conditions as the numpy check below, request by request.
            for a, b, last in zip(ipl[:-1], ipl[1:], lp.tolist(), strict=True):
                s = b - a
                if s < 0 or last > page_size or last < (1 if s > 0 else 0):
                    break
                kv.append((s - 1) * page_size + last if s > 0 else 0)
            else:
                return ip, lp, np.array(kv, dtype=np.int64)
        return explain_page_table(ip, lp, num_indices, page_size)
    steps = ip[1:] - ip[:-1]
    # The common case in a few numpy calls (each ~1 us, and plan() is timed per call): every
    # step >= 0, every last_page_len in 0..page_size, and 0 only for requests without pages
    # (lp >= min(step, 1)); the detailed pass below only runs to name what is wrong.
    if (
        ip.size
        and ip[0] >= 0
        and ip[-1] <= num_indices
        and (steps.size == 0 or (steps.min() >= 0 and lp.max() <= page_size))
        and (lp >= np.minimum(steps, 1)).all()
    ):
        # Requests without pages have lp <= page_size, so their (steps - 1) * ps + lp <= 0.
        return ip, lp, np.maximum((steps - 1) * page_size + lp, 0)
    return explain_page_table(ip, lp, num_indices, page_size)


def explain_page_table(
    ip: np.ndarray, lp: np.ndarray, num_indices: int, page_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if ip[0] < 0:
        raise ValueError(f"indptr[0] must be >= 0, got {ip[0]}")
    steps = np.diff(ip)
    if (steps < 0).any():
        b = int(np.argmax(steps < 0))
        raise ValueError(f"indptr must be non-decreasing, but indptr[{b + 1}] < indptr[{b}]")
    if ip[-1] > num_indices:
        raise ValueError(f"indptr[-1] = {ip[-1]} pages but indices has only {num_indices} entries")
    has_pages = steps > 0
    bad = has_pages & ((lp < 1) | (lp > page_size)) | ~has_pages & ((lp < 0) | (lp > page_size))
    if bad.any():
        b = int(np.argmax(bad))
        raise ValueError(
            f"last_page_len[{b}] = {lp[b]} is outside 1..page_size ({page_size}) for a request "
            "with pages"
            if has_pages[b]
            else f"last_page_len[{b}] = {lp[b]} is outside 0..page_size for an empty request"
        )
    kv_lens = np.where(has_pages, (steps - 1) * page_size + lp, 0)
    return ip, lp, kv_lens


# --------------------------------------------------------------------------- kernels


@triton.jit
def _batch_indices_positions_kernel(
    append_indptr_ptr,  # [B+1] int32/int64
    seq_lens_ptr,  # [B] int32/int64
    batch_indices_ptr,  # [nnz] int32
    positions_ptr,  # [nnz] int32
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    start = tl.load(append_indptr_ptr + b).to(tl.int32)
    end = tl.load(append_indptr_ptr + b + 1).to(tl.int32)
    first_pos = tl.load(seq_lens_ptr + b).to(tl.int32) - (end - start)
    for off in range(0, end - start, BLOCK):
        j = off + tl.arange(0, BLOCK)
        ok = j < end - start
        tl.store(batch_indices_ptr + start + j, tl.zeros([BLOCK], tl.int32) + b, mask=ok)
        tl.store(positions_ptr + start + j, first_pos + j, mask=ok)


@triton.jit
def _append_paged_kv_kernel(
    key_ptr,  # [nnz, H, D]
    value_ptr,  # [nnz, H, D]
    batch_indices_ptr,  # [nnz] int32
    positions_ptr,  # [nnz] int32
    k_ptr,  # [num_pages, page_size, H, D] logical (NHD or HND storage)
    v_ptr,  # [num_pages, page_size, H, D] logical
    kv_indices_ptr,  # [nnz_pages] int32
    kv_indptr_ptr,  # [B+1] int32
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_cp,
    stride_ct,
    stride_ch,
    stride_dp,
    stride_dt,
    stride_dh,
    num_heads,
    PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    b = tl.load(batch_indices_ptr + i)
    pos = tl.load(positions_ptr + i)
    page = tl.load(kv_indices_ptr + tl.load(kv_indptr_ptr + b) + pos // PAGE_SIZE).to(tl.int64)
    slot = pos % PAGE_SIZE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < num_heads) & (d[None, :] < HEAD_DIM)
    key = tl.load(key_ptr + i * stride_kn + h[:, None] * stride_kh + d[None, :], mask=mask)
    val = tl.load(value_ptr + i * stride_vn + h[:, None] * stride_vh + d[None, :], mask=mask)
    k_dst = k_ptr + page * stride_cp + slot * stride_ct + h[:, None] * stride_ch + d[None, :]
    v_dst = v_ptr + page * stride_dp + slot * stride_dt + h[:, None] * stride_dh + d[None, :]
    tl.store(k_dst, key.to(k_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, val.to(v_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- references


def get_seq_lens(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> torch.Tensor:
    """KV length of each request [B] (int64) from its page count and last page's fill."""
    num_pages = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)
    lens = (num_pages - 1).clamp(min=0) * page_size + kv_last_page_len.to(torch.int64)
    return torch.where(num_pages > 0, lens, torch.zeros_like(lens))


def get_batch_indices_positions_ref(
    append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each appended token, its request and its position in that request's KV."""
    counts = (append_indptr[1:] - append_indptr[:-1]).to(torch.int64)
    batch = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    within = torch.arange(batch.numel(), device=counts.device) - append_indptr[:-1].to(
        torch.int64
    ).repeat_interleave(counts)
    pos = seq_lens.to(torch.int64)[batch] - counts[batch] + within
    out_b = torch.zeros(nnz, dtype=torch.int32, device=counts.device)
    out_p = torch.zeros(nnz, dtype=torch.int32, device=counts.device)
    out_b[: batch.numel()] = batch.to(torch.int32)
    out_p[: batch.numel()] = pos.to(torch.int32)
    return out_b, out_p


def append_paged_kv_cache_ref(
    append_key: torch.Tensor,
    append_value: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    kv_layout: str = "NHD",
) -> None:
    """Write each appended token's K/V into its page and slot (in place)."""
    k, v = split_kv_cache(paged_kv_cache, kv_layout)
    page_size = k.shape[1]
    bi = batch_indices.to(torch.long)
    pos = positions.to(torch.long)
    pages = kv_indices.to(torch.long)[kv_indptr.to(torch.long)[bi] + pos // page_size]
    slots = pos % page_size
    k[pages, slots] = append_key.to(k.dtype)
    v[pages, slots] = append_value.to(v.dtype)


# --------------------------------------------------------------------------- public API


def _int_1d(name: str, t: torch.Tensor, length: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != 1 or (length is not None and t.numel() != length):
        want = f"({length},)" if length is not None else "1-D"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")


def _kernels(device: torch.device) -> bool:
    return platform.kernels_available(device) and not env.FORCE_REFERENCE.get()


def get_batch_indices_positions(
    append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Request index and KV position of each of `nnz` appended tokens (FlashInfer API).

    append_indptr: [B+1] offsets of each request's new tokens; seq_lens: [B] KV lengths
    after the append (`get_seq_lens`). Returns (batch_indices, positions), int32 [nnz].
    """
    _int_1d("append_indptr", append_indptr)
    batch = append_indptr.numel() - 1
    _int_1d("seq_lens", seq_lens, batch)
    if seq_lens.device != append_indptr.device:
        raise ValueError(
            f"seq_lens is on {seq_lens.device} but append_indptr is on {append_indptr.device}"
        )
    if env.DEBUG_CHECKS.get() or append_indptr.device.type == "cpu":
        counts = append_indptr[1:] - append_indptr[:-1]
        if (counts < 0).any():
            raise ValueError("append_indptr must be non-decreasing")
        if int(append_indptr[-1]) > nnz:
            raise ValueError(f"append_indptr[-1] = {int(append_indptr[-1])} > nnz = {nnz}")
        if (counts > seq_lens).any():
            raise ValueError("seq_lens must count the appended tokens (seq_lens >= appended)")
    if not _kernels(append_indptr.device):
        return get_batch_indices_positions_ref(append_indptr, seq_lens, nnz)
    batch_indices = torch.zeros(nnz, dtype=torch.int32, device=append_indptr.device)
    positions = torch.zeros(nnz, dtype=torch.int32, device=append_indptr.device)
    if batch > 0 and nnz > 0:
        _batch_indices_positions_kernel[(batch,)](
            append_indptr, seq_lens, batch_indices, positions, BLOCK=128
        )
    return batch_indices, positions


def append_paged_kv_cache(
    append_key: torch.Tensor,
    append_value: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    kv_layout: str = "NHD",
) -> None:
    """Write new tokens' K/V into the paged cache in place (FlashInfer API).

    append_key, append_value: [nnz, num_kv_heads, head_dim]; batch_indices, positions:
    [nnz] (from `get_batch_indices_positions`); the page table must already include the
    pages the new tokens land in.
    """
    k, v = split_kv_cache(paged_kv_cache, kv_layout)
    for name, t in (("append_key", append_key), ("append_value", append_value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 3 or tuple(t.shape[1:]) != tuple(k.shape[2:]):
            raise ValueError(
                f"{name} must be [nnz, num_kv_heads, head_dim] = [nnz, {k.shape[2]}, "
                f"{k.shape[3]}], got {tuple(t.shape)}"
            )
        if t.device != k.device:
            raise ValueError(f"{name} is on {t.device} but paged_kv_cache is on {k.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim")
    nnz = append_key.shape[0]
    if append_value.shape[0] != nnz:
        raise ValueError(f"append_value has {append_value.shape[0]} tokens, append_key {nnz}")
    _int_1d("batch_indices", batch_indices, nnz)
    _int_1d("positions", positions, nnz)
    _int_1d("kv_indices", kv_indices)
    _int_1d("kv_indptr", kv_indptr)
    _int_1d("kv_last_page_len", kv_last_page_len, kv_indptr.numel() - 1)
    for name, t in (
        ("batch_indices", batch_indices),
        ("positions", positions),
        ("kv_indices", kv_indices),
        ("kv_indptr", kv_indptr),
    ):
        if t.device != k.device:
            raise ValueError(f"{name} is on {t.device} but paged_kv_cache is on {k.device}")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("paged_kv_cache must be contiguous in head_dim")
    page_size = k.shape[1]
    if env.DEBUG_CHECKS.get() or k.device.type == "cpu":
        if nnz:
            b_max, p_min = int(batch_indices.max()), int(positions.min())
            if int(batch_indices.min()) < 0 or b_max >= kv_indptr.numel() - 1 or p_min < 0:
                raise ValueError("batch_indices/positions out of range for the page table")
            lens = get_seq_lens(kv_indptr, kv_last_page_len, page_size)
            if (positions.to(torch.int64) >= lens[batch_indices.to(torch.long)]).any():
                raise ValueError("a position lies beyond its request's KV length")
        if kv_indices.numel() and (
            int(kv_indices.min()) < 0 or int(kv_indices.max()) >= k.shape[0]
        ):
            raise ValueError(f"kv_indices hold page ids outside 0..{k.shape[0] - 1}")
    if not _kernels(k.device):
        append_paged_kv_cache_ref(
            append_key,
            append_value,
            batch_indices,
            positions,
            (k, v),
            kv_indices,
            kv_indptr,
            kv_last_page_len,
            "NHD",
        )
        return
    if nnz == 0:
        return
    heads, head_dim = k.shape[2], k.shape[3]
    _append_paged_kv_kernel[(nnz,)](
        append_key,
        append_value,
        batch_indices,
        positions,
        k,
        v,
        kv_indices,
        kv_indptr,
        append_key.stride(0),
        append_key.stride(1),
        append_value.stride(0),
        append_value.stride(1),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        heads,
        PAGE_SIZE=page_size,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )

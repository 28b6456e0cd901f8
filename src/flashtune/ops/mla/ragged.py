"""MLA prefill in its non-absorbed form over ragged sequences: what DeepSeek-V2/V3/R1 and
Kimi K2 run for long prompts without a cached prefix (FlashInfer serves it with
`BatchPrefillWithRaggedKVCacheWrapper`, head_dim_qk 192, head_dim_vo 128).

The prompt's keys and values are decompressed per head, so this is ordinary multi-head
attention whose QK head dim (128 nope + 64 rope = 192) differs from the V/output head dim
(128), over packed variable-length requests (qo_indptr, kv_indptr), no KV pages.
`reference.mla_ragged_prefill_ref` is the contract: output [total_q, H, 128] in q's dtype,
LSE [total_q, H] float32 in base 2, causal mask aligned to the bottom right (a request's
queries are its last qo_len tokens), a query that sees no key gets output 0 and LSE -inf.

The kernel is a flash-attention forward: a program owns BLOCK_M query tokens of one request
and one head, and streams that request's (causally trimmed) keys and values in BLOCK_N tiles
with an online softmax in fp32 (base 2). The 192-wide QK dot is two MMAs of 128 and 64
columns (no padding to 256). Programs find their request on the device (a binary search of
qo_indptr), so a call needs no plan and no host sync.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flashtune import env, platform
from flashtune.ops.mla.config import RaggedTactic, default_ragged_tactic
from flashtune.ops.mla.kernels import LOG2E
from flashtune.ops.mla.launch import use_kernels
from flashtune.ops.mla.reference import mla_ragged_prefill_ref
from flashtune.ops.mla.softmax import softmax_step

__all__ = ["mla_ragged_kernel", "mla_ragged_prefill", "split_head_dim"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _find_request(qo_indptr_ptr, batch, pid, BLOCK_M: tl.constexpr):
    """The request whose query tiles hold program `pid`: request b's tiles are numbered from
    qo_indptr[b] // BLOCK_M + b (increasing in b, and far enough apart for its
    cdiv(qo_len, BLOCK_M) tiles); the last b whose first tile is <= pid."""
    lo = pid * 0  # tensors, not constants: both are loop-carried
    hi = lo + batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        first = tl.load(qo_indptr_ptr + mid) // BLOCK_M + mid
        if first <= pid:
            lo = mid
        else:
            hi = mid
    return lo


@triton.jit
def mla_ragged_kernel(
    q_ptr,  # [total_q, H, D_A + D_B]
    k_ptr,  # [total_kv, H_KV, D_A + D_B]
    v_ptr,  # [total_kv, H_KV, D_V]
    qo_indptr_ptr,  # [batch + 1] int32
    kv_indptr_ptr,  # [batch + 1] int32
    o_ptr,  # [total_q, H, D_V]
    lse_ptr,  # [total_q, H] fp32 (written with STORE_LSE)
    batch,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_lt,
    group,  # query heads per KV head
    qk_scale,  # sm_scale * log2(e)
    D_A: tl.constexpr,  # the QK head dim's first part (a power of two: 128 of 192)
    D_B: tl.constexpr,  # its rest (a power of two, or 0: 64 of 192)
    D_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    STORE_LSE: tl.constexpr,
    PRECISION: tl.constexpr,  # tl.dot's input precision: "ieee" for fp32 inputs
):
    pid = tl.program_id(0)
    head = tl.program_id(1)
    b = _find_request(qo_indptr_ptr, batch, pid, BLOCK_M)
    qo_start = tl.load(qo_indptr_ptr + b)
    qo_len = tl.load(qo_indptr_ptr + b + 1) - qo_start
    m_start = (pid - (qo_start // BLOCK_M + b)) * BLOCK_M
    if m_start >= qo_len:  # past the request's last tile (or an empty request)
        return
    kv_start = tl.load(kv_indptr_ptr + b)
    kv_len = tl.load(kv_indptr_ptr + b + 1) - kv_start
    kv_head = head // group

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_a = tl.arange(0, D_A)
    offs_v = tl.arange(0, D_V)
    row_ok = offs_m < qo_len
    tok = (qo_start + offs_m).to(tl.int64)
    q_pos = kv_len - qo_len + offs_m  # the query's position among the request's keys
    q_row = q_ptr + tok[:, None] * stride_qt + head * stride_qh
    qa = tl.load(q_row + offs_a[None, :], mask=row_ok[:, None], other=0.0)
    if D_B > 0:
        offs_b = D_A + tl.arange(0, D_B)
        qb = tl.load(q_row + offs_b[None, :], mask=row_ok[:, None], other=0.0)

    kv_hi = kv_len
    if CAUSAL:
        # Keys past the tile's last query are masked for every row: not read at all.
        kv_hi = tl.minimum(kv_len, kv_len - qo_len + tl.minimum(m_start + BLOCK_M, qo_len))
    k_base = k_ptr + kv_start.to(tl.int64) * stride_kt + kv_head * stride_kh
    v_base = v_ptr + kv_start.to(tl.int64) * stride_vt + kv_head * stride_vh

    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_V], dtype=tl.float32)
    for start in range(0, kv_hi, BLOCK_N):
        t = start + offs_n
        t_ok = t < kv_hi
        k_row = k_base + t.to(tl.int64)[:, None] * stride_kt
        ka = tl.load(k_row + offs_a[None, :], mask=t_ok[:, None], other=0.0)
        s = tl.dot(qa, tl.trans(ka), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N] fp32
        if D_B > 0:
            kb = tl.load(k_row + offs_b[None, :], mask=t_ok[:, None], other=0.0)
            s = tl.dot(qb, tl.trans(kb), s, input_precision=PRECISION)
        s = s * qk_scale
        valid = t_ok[None, :]
        if CAUSAL:
            valid = valid & (t[None, :] <= q_pos[:, None])
        p, alpha, m_i, l_i = softmax_step(s, valid, m_i, l_i)
        vt = tl.load(
            v_base + t.to(tl.int64)[:, None] * stride_vt + offs_v[None, :],
            mask=t_ok[:, None],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)

    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    tl.store(
        o_ptr + tok[:, None] * stride_ot + head * stride_oh + offs_v[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )
    if STORE_LSE:
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), -float("inf"))
        tl.store(lse_ptr + tok * stride_lt + head, lse, mask=row_ok)


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def split_head_dim(head_dim_qk: int) -> tuple[int, int]:
    """(D_A, D_B): the QK head dim as a power of two plus a smaller power of two or 0, each
    at least 16 (an MMA's K): 192 -> (128, 64), 128 -> (128, 0). ValueError otherwise."""
    a = 1 << (head_dim_qk.bit_length() - 1) if head_dim_qk > 0 else 0
    b = head_dim_qk - a
    if a < 16 or (b and (b < 16 or not _is_pow2(b))):
        raise ValueError(
            f"head_dim_qk must be a power of two, or one plus a smaller one, each at least 16 "
            f"(192 = 128 + 64), got {head_dim_qk}"
        )
    return a, b


def _check_qkv(q: object, k: object, v: object) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [tokens, heads, head_dim], got {tuple(t.shape)}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
    assert isinstance(v, torch.Tensor)
    if q.dtype not in _DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k's head_dim {k.shape[2]} != q's {q.shape[2]} (head_dim_qk)")
    if tuple(v.shape[:2]) != tuple(k.shape[:2]):
        raise ValueError(
            f"v must have k's [total_kv, num_kv_heads] = {tuple(k.shape[:2])}, got "
            f"{tuple(v.shape[:2])}"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"num_qo_heads ({q.shape[1]}) must be a multiple of num_kv_heads ({k.shape[1]})"
        )
    split_head_dim(q.shape[2])
    if not _is_pow2(v.shape[2]) or v.shape[2] < 16:
        raise ValueError(f"head_dim_vo must be a power of two >= 16, got {v.shape[2]}")


def _check_indptr(
    qo_indptr: object, kv_indptr: object, q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 1 or t.numel() < 1:
            raise ValueError(f"{name} must be 1-D [batch_size + 1], got {tuple(t.shape)}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, expected q's device {q.device}")
    assert isinstance(qo_indptr, torch.Tensor) and isinstance(kv_indptr, torch.Tensor)
    if qo_indptr.numel() != kv_indptr.numel():
        raise ValueError(
            f"qo_indptr has {qo_indptr.numel()} entries, kv_indptr {kv_indptr.numel()}: "
            "both are [batch_size + 1]"
        )
    if env.DEBUG_CHECKS.get() or q.device.type == "cpu":
        # Contents: a sync on a GPU (debug only); on the CPU they are host memory already.
        for name, t, rows, of in (
            ("qo_indptr", qo_indptr, q.shape[0], "q"),
            ("kv_indptr", kv_indptr, k.shape[0], "k"),
        ):
            h = t.cpu().to(torch.int64)
            if int(h[0]) != 0 or bool((h[1:] < h[:-1]).any()):
                raise ValueError(f"{name} must start at 0 and never decrease, got {h.tolist()}")
            if int(h[-1]) != rows:
                raise ValueError(f"{name}[-1] = {int(h[-1])} but {of} has {rows} rows")
    return qo_indptr.contiguous(), kv_indptr.contiguous()


def _buffer(
    name: str,
    given: torch.Tensor | None,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    q: torch.Tensor,
) -> torch.Tensor:
    if given is None:
        return torch.empty(shape, dtype=dtype, device=q.device)
    if not isinstance(given, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(given).__name__}")
    if tuple(given.shape) != shape or given.dtype != dtype or given.device != q.device:
        raise ValueError(
            f"{name} must be {shape} {dtype} on {q.device}, got {tuple(given.shape)} "
            f"{given.dtype} on {given.device}"
        )
    if given.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")
    return given


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def mla_ragged_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    causal: bool = True,
    sm_scale: float | None = None,
    return_lse: bool = False,
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    tactic: RaggedTactic | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over ragged (packed) requests with separate QK and VO head dims: MLA's
    non-absorbed prefill, as FlashInfer's BatchPrefillWithRaggedKVCacheWrapper
    plan(qo_indptr, kv_indptr, H, H_kv, head_dim_qk, head_dim_vo, causal=..., sm_scale=...)
    then run(q, k, v, out=, lse=, return_lse=).

    q [total_q, H, Dqk], k [total_kv, H_kv, Dqk], v [total_kv, H_kv, Dvo], one dtype (float16,
    bfloat16; float32 too); H a multiple of H_kv (MLA: equal). qo_indptr, kv_indptr [B + 1]
    int32 on q's device: request b's query rows qo_indptr[b]:qo_indptr[b+1], its key/value
    rows kv_indptr[b]:kv_indptr[b+1]. sm_scale None: 1/sqrt(Dqk). Causal: the queries are
    the request's last qo_len tokens (query i sees keys t <= kv_len - qo_len + i).
    Returns out [total_q, H, Dvo] in q's dtype and, with return_lse, the base-2 LSE
    [total_q, H] float32; a query that sees no key gets 0 and -inf. A given `out` / `lse`
    is written (`lse` even without return_lse, as FlashInfer). tactic: fixes the kernel's
    tiles (default: `config.default_ragged_tactic`). No host sync (index contents are
    checked on CPU tensors, or on a GPU with FLASHTUNE_DEBUG_CHECKS).
    """
    _check_qkv(q, k, v)
    qo_indptr, kv_indptr = _check_indptr(qo_indptr, kv_indptr, q, k)
    total_q, num_heads, head_dim_qk = q.shape
    head_dim_vo = v.shape[2]
    scale = 1.0 / math.sqrt(head_dim_qk) if sm_scale is None else float(sm_scale)
    out = _buffer("out", out, (total_q, num_heads, head_dim_vo), q.dtype, q)
    if return_lse or lse is not None:
        lse = _buffer("lse", lse, (total_q, num_heads), torch.float32, q)
    batch = qo_indptr.numel() - 1
    if not use_kernels(q.device):
        ref_out, ref_lse = mla_ragged_prefill_ref(q, k, v, qo_indptr, kv_indptr, scale, causal)
        out.copy_(ref_out)
        if lse is not None:
            lse.copy_(ref_lse)
    elif total_q and batch:
        on_gpu = q.device.type == "cuda"
        chosen = tactic or default_ragged_tactic(
            on_gpu,
            head_dim_qk,
            head_dim_vo,
            q.element_size(),
            platform.device_limits(q.device).shared_memory_per_block if on_gpu else 0,
        )
        _launch(q, k, v, qo_indptr, kv_indptr, out, lse, scale, causal, chosen)
    if return_lse:
        assert lse is not None
        return out, lse
    return out


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    sm_scale: float,
    causal: bool,
    tactic: RaggedTactic,
) -> None:
    for name, n in (("block_m", tactic.block_m), ("block_n", tactic.block_n)):
        if not _is_pow2(n) or n < 16:
            raise ValueError(f"tactic.{name} must be a power of two >= 16, got {n}")
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    total_q, num_heads, head_dim_qk = q.shape
    d_a, d_b = split_head_dim(head_dim_qk)
    batch = qo_indptr.numel() - 1
    # Request b's tiles start at qo_indptr[b] // BLOCK_M + b (see _find_request): the last
    # one ends by total_q // BLOCK_M + batch; programs past a request's tiles exit at once.
    grid = (total_q // tactic.block_m + batch, num_heads)
    mla_ragged_kernel[grid](
        q,
        k,
        v,
        qo_indptr,
        kv_indptr,
        out,
        lse if lse is not None else out,  # not written without STORE_LSE
        batch,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        lse.stride(0) if lse is not None else 0,
        num_heads // k.shape[1],
        sm_scale * LOG2E,
        D_A=d_a,
        D_B=d_b,
        D_V=v.shape[2],
        BLOCK_M=tactic.block_m,
        BLOCK_N=tactic.block_n,
        CAUSAL=bool(causal),
        STORE_LSE=lse is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=tactic.num_warps,
        num_stages=tactic.num_stages,
    )

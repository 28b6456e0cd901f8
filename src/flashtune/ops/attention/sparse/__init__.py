"""Block-sparse attention (FlashInfer's `flashinfer.sparse`) as a configuration of the paged
prefill: no kernel of its own.

The FlashInfer paper's observation: a block-sparse (BSR) matrix with R x C blocks over M
query rows and N keys *is* a paged prefill. Block row b is one request of R query rows
(the last one cut at M); its KV pages are the block row's column indices, with page_size C
and every page full; K/V [N, H, D] viewed as pages [N / C, C, H, D]. A mask inside the
blocks becomes the prefill's custom mask, in the prefill's layout (request after request,
[qo_len, kv_len] row-major, keys in `indices` order). Everything else (causal,
pos_encoding_mode, logits_soft_cap, sm_scale, RoPE parameters, dtypes, return_lse) is the
prefill's, so it means what it means there: `causal` aligns a block row's queries
bottom-right against the concatenation of its blocks' keys, and ROPE_LLAMA places a key at
its index in that concatenation, exactly as FlashInfer 0.2.14 does. Without a mask, causality
or RoPE, consecutive block rows with the same blocks are planned as one request
(`merge_identical_block_rows`): density 1.0 is then the dense prefill.

`VariableBlockSparseAttentionWrapper` (per-row / per-column block sizes, a pattern per KV
head) expands its blocks to a token-level page table (page_size 1): request (KV head h,
block row i) holds the rows of block row i of head h, its pages are the tokens of the
selected column blocks of head h; q, k, v are HND and each KV head becomes a "sequence"
of its own (FlashInfer's layout: [(Hkv * qo_len), group, D] queries over a one-head cache).

What the prefill does not do raises NotImplementedError naming it (fp8 per-head scales);
references: reference.py; the schema: schema.py; the page table and mask built from a
pattern: plan.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from flashtune.model_shapes import ModelConfig
from flashtune.ops.attention.aliases import WrapperAliases
from flashtune.ops.attention.prefill import BatchPrefillWithPagedKVCacheWrapper
from flashtune.ops.attention.sparse.plan import (
    _dtype,
    _host_ints,
    _no_alibi,
    bsr_mask_to_flat,
    merge_identical_block_rows,
    unpack_mask_bits,
    variable_block_page_table,
)
from flashtune.ops.attention.sparse.schema import BLOCK_SPARSE_ATTENTION
from flashtune.schema import api
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = [
    "BlockSparseAttentionWrapper",
    "VariableBlockSparseAttentionWrapper",
    "block_sparse_attention",
    "convert_bsr_mask_layout",
    "bsr_mask_to_flat",
    "unpack_mask_bits",
    "bsr_pattern",
    "merge_identical_block_rows",
]


@api(schema=BLOCK_SPARSE_ATTENTION)
def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    block_rows: int,
    logits_soft_cap: float | None = None,
    *,
    prefill: BatchPrefillWithPagedKVCacheWrapper,
    out: torch.Tensor,
    lse: torch.Tensor | None,
) -> None:
    """The schema'd op behind BlockSparseAttentionWrapper.run in its plain configuration
    (arguments named as the Definition's inputs; k/v as column blocks [N / C, C, Hkv, D];
    `prefill` is the planned paged prefill that computes it)."""
    prefill.run(q, (k, v), out=out, lse=lse, return_lse=lse is not None)


def convert_bsr_mask_layout(mask: torch.Tensor, indptr: torch.Tensor) -> torch.Tensor:
    """FlashInfer's `convert_bsr_mask_layout`: block masks [nnz, R, C] -> the flattened
    layout [nnz * R * C] (per block row: [R, its blocks * C] row-major)."""
    if mask.dim() != 3:
        raise ValueError(f"mask must be [nnz, R, C], got shape {tuple(mask.shape)}")
    ptr = _host_ints(indptr, "indptr")
    rows = np.full(len(ptr) - 1, mask.shape[1], np.int64)
    return bsr_mask_to_flat(mask, ptr, rows, mask.shape[2]).to(mask.dtype)


class _SparseWrapper(WrapperAliases):
    """What both block-sparse wrappers share: the workspace, the paged prefill wrapper they
    configure, and FlashInfer's workspace / alias methods."""

    def __init__(self, float_workspace_buffer: torch.Tensor, backend: str = "auto") -> None:
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise TypeError(
                "float_workspace_buffer must be a torch.Tensor, got "
                f"{type(float_workspace_buffer).__name__}"
            )
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._backend = backend  # a hint: one Triton prefill serves every backend
        self._prefill = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, "NHD")
        self._plan_args: dict[str, Any] | None = None

    def reset_workspace_buffer(
        self,
        float_workspace_buffer: torch.Tensor,
        int_workspace_buffer: torch.Tensor | None = None,
        vector_sparse_indices_buffer: torch.Tensor | None = None,
        vector_sparse_indptr_buffer: torch.Tensor | None = None,
    ) -> None:
        """The int and vector-sparse buffers are FlashInfer's FA3 scratch: not needed here."""
        self._float_workspace_buffer = float_workspace_buffer
        self._prefill.reset_workspace_buffer(float_workspace_buffer)


class BlockSparseAttentionWrapper(_SparseWrapper):
    """Attention under a block-sparse (BSR) mask with R x C blocks (FlashInfer-compatible):
    plan(indptr, indices, M, N, R, C, ...) then run(q [M, Hq, D], k/v [N, Hkv, D])."""

    def __init__(self, float_workspace_buffer: torch.Tensor, backend: str = "auto") -> None:
        super().__init__(float_workspace_buffer, backend)
        self._o_dtype: torch.dtype | None = None
        # (indptr, indices, sm_scale or None, logits_soft_cap) when the plan is the plain
        # configuration the Definition describes (run goes through block_sparse_attention).
        self._plain: tuple[torch.Tensor, torch.Tensor, float | None, float | None] | None = None
        self.M: int | None = None
        self.N: int | None = None
        self.R: int | None = None
        self.C: int | None = None

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        M: int,
        N: int,
        R: int,
        C: int,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        mask: torch.Tensor | None = None,
        packed_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: str | torch.dtype = "float16",
        kv_data_type: str | torch.dtype | None = None,
        o_data_type: str | torch.dtype = "float16",
        non_blocking: bool = True,
    ) -> None:
        """Plan block-sparse attention over the BSR matrix (indptr [MB + 1], indices [nnz]).

        MB must be ceil(M / R) (the last block row holds the remaining M - (MB - 1) * R
        rows); N must be a multiple of C and indices < N / C. mask [nnz, R, C] (bool) or
        packed_mask (uint8: flashinfer.quantization.packbits of convert_bsr_mask_layout(mask,
        indptr), little bit order; it wins over mask) selects keys inside the blocks and
        replaces `causal`. use_fp16_qk_reduction is accepted (logits are reduced in fp32).
        The output has o_data_type: computed in q's dtype, then cast when they differ."""
        args = {name: value for name, value in locals().items() if name != "self"}
        for name, value in (("M", M), ("N", N), ("R", R), ("C", C)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if N % C != 0:
            raise ValueError(f"N ({N}) must be a multiple of C ({C}): K/V are viewed as N/C pages")
        ptr = _host_ints(indptr, "indptr")
        _no_alibi(pos_encoding_mode)
        num_block_rows = len(ptr) - 1
        if num_block_rows != -(-M // R):
            raise ValueError(
                f"indptr must have ceil(M / R) + 1 = {-(-M // R) + 1} entries (M={M}, R={R}), "
                f"got {len(ptr)}"
            )
        cols = _host_ints(indices, "indices")
        nnz = int(ptr[-1])
        if cols.size < nnz:
            raise ValueError(f"indices must have indptr[-1] = {nnz} entries, got {cols.size}")
        if nnz and (cols[:nnz].min() < 0 or cols[:nnz].max() >= N // C):
            raise ValueError(
                f"indices must be in [0, N / C = {N // C}), got values in "
                f"[{cols[:nnz].min()}, {cols[:nnz].max()}]"
            )
        qo_indptr = np.minimum(R * np.arange(num_block_rows + 1, dtype=np.int64), M)
        qo_indptr[-1] = M
        row_lens = qo_indptr[1:] - qo_indptr[:-1]
        custom_mask = None
        if packed_mask is not None:
            blocks = ptr[1:] - ptr[:-1]
            custom_mask = unpack_mask_bits(packed_mask, int((row_lens * blocks * C).sum()))
        elif mask is not None:
            if tuple(mask.shape) != (nnz, R, C):
                raise ValueError(
                    f"mask must have shape [nnz, R, C] = {[nnz, R, C]}, got {list(mask.shape)}"
                )
            custom_mask = bsr_mask_to_flat(mask, ptr, row_lens, C)
        q_dtype = _dtype(q_data_type, "q_data_type")
        self._o_dtype = _dtype(o_data_type, "o_data_type")
        kv_ptr, kv_indices = ptr, indices
        if custom_mask is None and not causal and pos_encoding_mode == "NONE":
            # Where nothing depends on a query's place in its block row, block rows with the
            # same blocks are one request: K/V read once for all of them, and query tiles
            # filled (density 1.0 is then the dense prefill: the format costs nothing).
            qo_indptr, kv_ptr, merged = merge_identical_block_rows(qo_indptr, ptr, cols[:nnz])
            kv_indices = torch.from_numpy(merged)
        # Host index arrays (already copied above): the prefill plan reads them sync-free.
        self._prefill.plan(
            torch.from_numpy(qo_indptr),
            torch.from_numpy(kv_ptr),
            kv_indices,
            torch.full((len(qo_indptr) - 1,), C, dtype=torch.int32),
            num_qo_heads,
            num_kv_heads,
            head_dim,
            C,
            custom_mask=custom_mask,
            causal=causal,
            pos_encoding_mode=pos_encoding_mode,
            use_fp16_qk_reduction=use_fp16_qk_reduction,
            sm_scale=sm_scale,
            logits_soft_cap=logits_soft_cap,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            q_data_type=q_dtype,
            kv_data_type=_dtype(kv_data_type, "kv_data_type") or q_dtype,
        )
        self.M, self.N, self.R, self.C = M, N, R, C
        plain = custom_mask is None and not causal and pos_encoding_mode == "NONE" and M % R == 0
        self._plain = (indptr, indices, sm_scale, logits_soft_cap) if plain else None
        self._plan_args = args  # set last: a plan that raised leaves the previous one whole

    begin_forward = plan

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale_q: torch.Tensor | None = None,
        scale_k: torch.Tensor | None = None,
        scale_v: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention of q [M, Hq, D] over k/v [N, Hkv, D] under the planned blocks: out
        [M, Hq, D] (o_data_type), and the base-2 LSE [M, Hq] float32 when return_lse.
        enable_pdl is accepted and ignored."""
        if self._plan_args is None or self.N is None or self.C is None:
            raise RuntimeError("BlockSparseAttentionWrapper.run called before plan()")
        for name, value in (("scale_q", scale_q), ("scale_k", scale_k), ("scale_v", scale_v)):
            if value is not None:
                raise NotImplementedError(
                    f"{name}: fp8 block-sparse attention with per-head scales is not supported"
                )
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[0] != self.N:
                shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"{name} must be [N={self.N}, num_kv_heads, head_dim], got {shape}"
                )
        pages = (k.reshape(-1, self.C, *k.shape[1:]), v.reshape(-1, self.C, *v.shape[1:]))
        o_dtype = self._o_dtype or q.dtype
        if out is not None and (
            tuple(out.shape) != tuple(q.shape) or out.dtype != o_dtype or out.device != q.device
        ):
            raise ValueError(
                f"out must be {list(q.shape)} {o_dtype} on {q.device}, got "
                f"{list(out.shape)} {out.dtype} on {out.device}"
            )
        direct = out if o_dtype == q.dtype else None
        if self._plain is not None:
            o, lse_out = self._run_plain(q, pages, direct, lse, return_lse)
        else:
            result = self._prefill.run(q, pages, out=direct, lse=lse, return_lse=return_lse)
            o, lse_out = result if isinstance(result, tuple) else (result, None)
        if o_dtype != q.dtype:
            o = o.to(o_dtype) if out is None else out.copy_(o)
        return (o, lse_out) if return_lse else o  # type: ignore[return-value]

    def _run_plain(
        self,
        q: torch.Tensor,
        pages: tuple[torch.Tensor, torch.Tensor],
        out: torch.Tensor | None,
        lse: torch.Tensor | None,
        return_lse: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """run through the schema'd op (capture and apply see the block-sparse call)."""
        assert self._plain is not None and self.R is not None
        indptr, indices, sm_scale, soft_cap = self._plain
        lse = lse if return_lse else None
        out = torch.empty_like(q) if out is None else out
        if return_lse and lse is None:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        block_sparse_attention(
            q,
            *pages,
            indptr,
            indices,
            q.shape[-1] ** -0.5 if sm_scale is None else float(sm_scale),
            self.R,
            soft_cap,
            prefill=self._prefill,
            out=out,
            lse=lse,
        )
        return out, lse

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale_q: torch.Tensor | None = None,
        scale_k: torch.Tensor | None = None,
        scale_v: torch.Tensor | None = None,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
    ) -> torch.Tensor:
        """Deprecated FlashInfer API: run with the variant given here (planned again where
        it differs from the plan's)."""
        _replan(
            self,
            pos_encoding_mode=pos_encoding_mode,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
        )
        return self.run(q, k, v, scale_q, scale_k, scale_v)  # type: ignore[return-value]


def _replan(wrapper: Any, **variant: Any) -> None:
    """Plan `wrapper` again with `variant` where it differs from its last plan's arguments."""
    args = wrapper._plan_args
    if args is None:
        raise RuntimeError(f"{type(wrapper).__name__}.forward called before plan()")
    if any(args[name] != value for name, value in variant.items()):
        wrapper.plan(**{**args, **variant})


class VariableBlockSparseAttentionWrapper(_SparseWrapper):
    """Block-sparse attention with variable block sizes and a pattern per KV head
    (FlashInfer-compatible): plan(block_mask_map [Hkv, MB, NB], block_row_sz [Hkv, MB],
    block_col_sz [Hkv, NB], ...) then run(q [Hq, qo_len, D], k/v [Hkv, kv_len, D])."""

    def __init__(self, float_workspace_buffer: torch.Tensor, backend: str = "auto") -> None:
        super().__init__(float_workspace_buffer, backend)
        self._num_kv_heads = 0
        self._qo_len = 0
        self._kv_len = 0

    def plan(
        self,
        block_mask_map: torch.Tensor,
        block_row_sz: torch.Tensor,
        block_col_sz: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        non_blocking: bool = True,
        q_data_type: str | torch.dtype = "float16",
        kv_data_type: str | torch.dtype | None = None,
    ) -> None:
        """Plan over the blocks of each KV head: block (i, j) of head h spans
        block_row_sz[h, i] queries and block_col_sz[h, j] keys, attended where
        block_mask_map[h, i, j]. Every head's rows sum to the same qo_len and its columns to
        the same kv_len. The query heads of a group share their KV head's pattern."""
        args = {name: value for name, value in locals().items() if name != "self"}
        if num_kv_heads <= 0 or num_qo_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        if block_mask_map.dim() != 3 or block_mask_map.shape[0] != num_kv_heads:
            raise ValueError(
                f"block_mask_map must be [num_kv_heads={num_kv_heads}, MB, NB], got "
                f"{list(block_mask_map.shape)}"
            )
        _, mb, nb = block_mask_map.shape
        for name, t, n in (("block_row_sz", block_row_sz, mb), ("block_col_sz", block_col_sz, nb)):
            if tuple(t.shape) != (num_kv_heads, n):
                raise ValueError(f"{name} must be [{num_kv_heads}, {n}], got {list(t.shape)}")
            if t.dtype.is_floating_point or t.dtype == torch.bool:
                raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
            sizes = t.detach().cpu().long()
            if (sizes < 0).any():
                raise ValueError(f"{name} must be >= 0, got {sizes.min().item()}")
            totals = sizes.sum(1)
            if (totals != totals[0]).any():
                raise ValueError(f"{name} must sum to the same length for every KV head")
        qo_indptr, kv_indptr, kv_indices = variable_block_page_table(
            block_mask_map, block_row_sz, block_col_sz
        )
        _no_alibi(pos_encoding_mode)
        q_dtype = _dtype(q_data_type, "q_data_type")
        self._prefill.plan(
            qo_indptr,
            kv_indptr,
            kv_indices,
            torch.ones(num_kv_heads * mb, dtype=torch.int32),
            num_qo_heads // num_kv_heads,
            1,
            head_dim,
            1,
            causal=causal,
            pos_encoding_mode=pos_encoding_mode,
            use_fp16_qk_reduction=use_fp16_qk_reduction,
            sm_scale=sm_scale,
            logits_soft_cap=logits_soft_cap,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            q_data_type=q_dtype,
            kv_data_type=_dtype(kv_data_type, "kv_data_type") or q_dtype,
        )
        self._num_kv_heads = num_kv_heads
        self._qo_len = int(block_row_sz[0].sum())
        self._kv_len = int(block_col_sz[0].sum())
        self._plan_args = args

    begin_forward = plan

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention of q [Hq, qo_len, D] over k/v [Hkv, kv_len, D] (HND): out [Hq, qo_len,
        D] in q's dtype, and the base-2 LSE [Hq, qo_len] float32 when return_lse."""
        if self._plan_args is None:
            raise RuntimeError("VariableBlockSparseAttentionWrapper.run called before plan()")
        hk, qo_len, kv_len = self._num_kv_heads, self._qo_len, self._kv_len
        if q.dim() != 3 or q.shape[1] != qo_len or q.shape[0] % hk != 0:
            raise ValueError(
                f"q must be [num_qo_heads, qo_len={qo_len}, head_dim], got {list(q.shape)}"
            )
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 3 or tuple(t.shape[:2]) != (hk, kv_len):
                raise ValueError(
                    f"{name} must be [num_kv_heads={hk}, kv_len={kv_len}, head_dim], got "
                    f"{list(t.shape)}"
                )
        num_qo_heads, _, head_dim = q.shape
        group = num_qo_heads // hk
        # [(Hkv group), qo, D] -> [(Hkv qo), group, D]: each KV head's queries a sequence.
        q_rows = q.reshape(hk, group, qo_len, head_dim).transpose(1, 2).reshape(-1, group, head_dim)
        pages = (k.reshape(-1, 1, 1, k.shape[-1]), v.reshape(-1, 1, 1, v.shape[-1]))
        result = self._prefill.run(q_rows, pages, return_lse=return_lse)
        o_rows, lse_rows = result if isinstance(result, tuple) else (result, None)
        o = o_rows.reshape(hk, qo_len, group, head_dim).transpose(1, 2).reshape(q.shape)
        if out is not None:
            o = out.copy_(o)
        if not return_lse:
            return o
        assert lse_rows is not None
        lse_heads = lse_rows.reshape(hk, qo_len, group).transpose(1, 2).reshape(q.shape[:2])
        if lse is not None:
            lse_heads = lse.copy_(lse_heads)
        return o, lse_heads

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
    ) -> torch.Tensor:
        """Deprecated FlashInfer API: run with the variant given here."""
        _replan(
            self,
            pos_encoding_mode=pos_encoding_mode,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
        )
        return self.run(q, k, v)  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# Model examples
# --------------------------------------------------------------------------------------------

# A 4 x 8 block grid at 40% density: block rows of 0..4 blocks, one of them empty.
EXAMPLE_BSR_INDPTR = (0, 3, 3, 7, 13)
EXAMPLE_BSR_INDICES = (0, 5, 2, 1, 7, 3, 4, 0, 1, 2, 4, 6, 7)
EXAMPLE_BLOCK_SIZES = ((64, 64), (16, 16), (4, 4), (1, 16))


@register_examples(attention="gqa")
def block_sparse_examples(model: ModelConfig) -> list[Example]:
    """Block-sparse attention at `model`'s heads (bf16), for each of EXAMPLE_BLOCK_SIZES
    (R, C), through the schema'd op behind BlockSparseAttentionWrapper.run."""
    hq, hk, d = model.num_qo_heads, model.num_kv_heads, model.head_dim
    indptr = torch.tensor(EXAMPLE_BSR_INDPTR, dtype=torch.int32)
    indices = torch.tensor(EXAMPLE_BSR_INDICES, dtype=torch.int32)
    unused = {"prefill": None, "out": None, "lse": None}
    examples: list[Example] = []
    for rows, cols in EXAMPLE_BLOCK_SIZES:
        q = meta_tensor((len(EXAMPLE_BSR_INDPTR) - 1) * rows, hq, d)
        kv = meta_tensor(8, cols, hk, d)
        args = (q, kv, kv, indptr, indices, d**-0.5, rows)
        examples.append((block_sparse_attention, args, dict(unused)))
    return examples


def bsr_pattern(
    block_rows: int,
    col_blocks: int,
    R: int,
    C: int,
    density: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A BSR pattern (indptr [block_rows + 1], indices, int32 on the CPU, each row's columns
    ascending) of about `density`, as long-context sparse attention selects blocks: every
    block row keeps the first column block (the attention sink) and its diagonal block
    (local context), plus each other block with probability `density`, so rows differ in
    length (tests, benchmarks and the bundled dataset's workloads)."""
    keep = torch.rand(block_rows, col_blocks, generator=generator) < density
    rows = torch.arange(block_rows)
    keep[:, 0] = True
    keep[rows, (rows * R // C).clamp(max=col_blocks - 1)] = True
    counts = keep.sum(1)
    indptr = torch.zeros(block_rows + 1, dtype=torch.int32)
    indptr[1:] = counts.cumsum(0)
    return indptr, keep.nonzero()[:, 1].to(torch.int32)

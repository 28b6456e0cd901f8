"""`flashinfer.sparse` under flashtune's name: `import flashtune as flashinfer` then
`flashinfer.sparse.BlockSparseAttentionWrapper` works as it does with FlashInfer.

The wrappers are configurations of the paged prefill (flashtune.ops.attention.sparse)."""

from __future__ import annotations

from flashtune.ops.attention.sparse import (
    BlockSparseAttentionWrapper,
    VariableBlockSparseAttentionWrapper,
    convert_bsr_mask_layout,
)

__all__ = [
    "BlockSparseAttentionWrapper",
    "VariableBlockSparseAttentionWrapper",
    "convert_bsr_mask_layout",
]

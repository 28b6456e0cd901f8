"""Model examples of the attention ops for `flashtune definitions dump --model`.

Each example is a planned wrapper's run with meta tensors at the model's head counts and
head_dim: the plan runs on small CPU page tables (nothing is allocated on a GPU, no kernel
runs), and the Definition only needs shapes and dtypes.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtune.models import ModelConfig
from flashtune.ops.attention.decode import BatchDecodeWithPagedKVCacheWrapper
from flashtune.ops.attention.page import build_page_table
from flashtune.schema.dump import register_examples

__all__ = ["decode_examples"]

# Page size 16: the common serving default (vLLM, SGLang); the corpus also has 1 and 64.
_PAGE_SIZE = 16
_DTYPE = torch.bfloat16


@register_examples
def decode_examples(model: ModelConfig) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """One batch-decode call at `model`'s shapes (paged NHD cache, bf16)."""
    hq, hk, d = model.num_qo_heads, model.num_kv_heads, model.head_dim
    lens = [37, 100, 16]
    indptr, indices, last, num_pages = build_page_table(lens, _PAGE_SIZE, shuffle=False)
    # A small CPU workspace: this plan needs a few KB (a handful of work items).
    wrapper = BatchDecodeWithPagedKVCacheWrapper(torch.empty(2**20, dtype=torch.uint8), "NHD")
    wrapper.plan(indptr, indices, last, hq, hk, d, _PAGE_SIZE, q_data_type=_DTYPE)
    q = torch.empty(len(lens), hq, d, dtype=_DTYPE, device="meta")
    kv_cache = torch.empty(num_pages, 2, _PAGE_SIZE, hk, d, dtype=_DTYPE, device="meta")
    return [(wrapper.run, (q, kv_cache), {})]

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

__all__ = ["decode_examples", "prefill_examples"]

# Page size 16: the common serving default (vLLM, SGLang); the corpus also has 1 and 64.
_PAGE_SIZE = 16
_DTYPE = torch.bfloat16


@register_examples
def decode_examples(model: ModelConfig) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """One batch-decode call at `model`'s shapes (paged NHD cache, bf16): the planned wrapper's
    run and the plan-free call (both emit the same Definition)."""
    from flashtune.ops.attention.planless import paged_decode

    hq, hk, d = model.num_qo_heads, model.num_kv_heads, model.head_dim
    lens = [37, 100, 16]
    indptr, indices, last, num_pages = build_page_table(lens, _PAGE_SIZE, shuffle=False)
    # A small CPU workspace: this plan needs a few KB (a handful of work items).
    wrapper = BatchDecodeWithPagedKVCacheWrapper(torch.empty(2**20, dtype=torch.uint8), "NHD")
    wrapper.plan(indptr, indices, last, hq, hk, d, _PAGE_SIZE, q_data_type=_DTYPE)
    q = torch.empty(len(lens), hq, d, dtype=_DTYPE, device="meta")
    kv_cache = torch.empty(num_pages, 2, _PAGE_SIZE, hk, d, dtype=_DTYPE, device="meta")
    return [
        (wrapper.run, (q, kv_cache), {}),
        (paged_decode, (q, kv_cache, indptr, indices, last), {}),
    ]


@register_examples
def prefill_examples(model: ModelConfig) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """Paged (page size 16 and 1) and ragged prefill, causal and not, at `model`'s shapes (bf16),
    through the wrappers' schema'd ops and the plan-free calls.

    The schema'd ops behind the prefill wrappers take the Definition's inputs directly; their
    `plan`/`out`/`lse` keywords are not part of the Definition, so None stands in for them."""
    from flashtune.ops.attention.planless_prefill import paged_prefill, ragged_prefill
    from flashtune.ops.attention.prefill import gqa_paged_prefill, gqa_ragged_prefill

    hq, hk, d = model.num_qo_heads, model.num_kv_heads, model.head_dim
    kv_lens = [37, 100, 16]  # queries 5, 17, 3: each no longer than its KV
    qo_indptr = torch.tensor([0, 5, 22, 25], dtype=torch.int32)
    q = torch.empty(25, hq, d, dtype=_DTYPE, device="meta")
    unused = {"plan": None, "out": None, "lse": None}
    examples: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    kv_indptr = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    kv = torch.empty(sum(kv_lens), hk, d, dtype=_DTYPE, device="meta")
    for causal in (True, False):
        for page_size in (_PAGE_SIZE, 1):
            indptr, indices, last, num_pages = build_page_table(kv_lens, page_size, shuffle=False)
            cache = torch.empty(num_pages, page_size, hk, d, dtype=_DTYPE, device="meta")
            args = (q, cache, cache, qo_indptr, indptr, indices, d**-0.5)
            kwargs = {"kv_last_page_len": last, "causal": causal, **unused}
            examples.append((gqa_paged_prefill, args, kwargs))
            # The plan-free call: the same Definition.
            args = (q, (cache, cache), qo_indptr, indptr, indices, last)
            examples.append((paged_prefill, args, {"causal": causal}))
        args = (q, kv, kv, qo_indptr, kv_indptr, d**-0.5)
        examples.append((gqa_ragged_prefill, args, {"causal": causal, **unused}))
        examples.append((ragged_prefill, (q, kv, kv, qo_indptr, kv_indptr), {"causal": causal}))
    return examples

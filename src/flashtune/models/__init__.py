"""Models built from flashtune's ops: a compact Llama-architecture decoder with a paged KV
cache (llama.py), its ops per backend (backends.py: torch, flashtune, flashinfer), its paged
attention per backend (attention.py) and its page table (paging.py)."""

from __future__ import annotations

from flashtune.models.backends import BACKENDS, make_ops
from flashtune.models.llama import (
    CONFIGS,
    LLAMA_3_1_8B,
    QWEN3_8B,
    TINY,
    DecodeGraph,
    Llama,
    LlamaConfig,
    LlamaWeights,
)
from flashtune.models.paging import PagedKVCache, PageTable, StepBatch

__all__ = [
    "BACKENDS",
    "CONFIGS",
    "LLAMA_3_1_8B",
    "QWEN3_8B",
    "TINY",
    "DecodeGraph",
    "Llama",
    "LlamaConfig",
    "LlamaWeights",
    "PagedKVCache",
    "PageTable",
    "StepBatch",
    "make_ops",
]

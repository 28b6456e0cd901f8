"""Models built from flashtune's ops: a compact Llama-architecture decoder with a paged KV
cache (llama.py), a DeepSeek-V3-shaped MLA decoder over a paged latent cache (deepseek.py,
its attention per backend in latent.py, its mixture-of-experts layers in moe.py), their ops per backend (backends.py: torch,
flashtune, flashinfer), the paged attention per backend (attention.py) and the page table
(paging.py)."""

from __future__ import annotations

from flashtune.models.backends import BACKENDS, make_ops
from flashtune.models.deepseek import (
    DEEPSEEK_CONFIGS,
    DEEPSEEK_TINY,
    DEEPSEEK_TINY_MOE,
    DEEPSEEK_V3,
    DEEPSEEK_V3_MOE_TP8,
    DEEPSEEK_V3_TP8,
    DeepseekV3,
    DeepseekV3Config,
    DeepseekV3Weights,
)
from flashtune.models.latent import PagedLatentCache
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
from flashtune.models.moe import MoEWeights
from flashtune.models.paging import PagedKVCache, PageTable, StepBatch

__all__ = [
    "BACKENDS",
    "CONFIGS",
    "DEEPSEEK_CONFIGS",
    "DEEPSEEK_TINY",
    "DEEPSEEK_TINY_MOE",
    "DEEPSEEK_V3",
    "DEEPSEEK_V3_MOE_TP8",
    "DEEPSEEK_V3_TP8",
    "DeepseekV3",
    "DeepseekV3Config",
    "DeepseekV3Weights",
    "LLAMA_3_1_8B",
    "QWEN3_8B",
    "TINY",
    "DecodeGraph",
    "Llama",
    "LlamaConfig",
    "LlamaWeights",
    "MoEWeights",
    "PagedKVCache",
    "PagedLatentCache",
    "PageTable",
    "StepBatch",
    "make_ops",
]

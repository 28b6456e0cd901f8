"""A compact Llama-architecture decoder over a paged KV cache, one backend switch for its ops.

    model = Llama(LLAMA_3_1_8B.with_layers(4), backend="flashtune", device="cuda")
    batch = model.page_table.step(requests, prompt_lens)       # a ragged batch of prompts
    logits = model.forward(prompt_tokens, batch)               # [B, vocab]: last tokens
    decode = model.decode_graph(batch_size=B, max_kv_len=...)  # CUDA graph of one step
    logits = decode.step(next_tokens, model.page_table.step(requests, [1] * B))
    tokens = model.sample(logits)                              # greedy, or top_k / top_p

The layer (Llama 3 / Qwen3): x -> RMSNorm -> fused QKV GEMM -> [Qwen3: per-head q/k RMSNorm]
-> RoPE -> append K/V to the paged cache -> paged attention -> O GEMM -> + residual ->
RMSNorm -> fused gate/up GEMM -> SiLU-and-mul -> down GEMM -> + residual. Residual adds are
fused into the next RMSNorm (FlashInfer's fused_add_rmsnorm). Weights are random (seeded,
nothing is downloaded) and shared between models of different backends by passing
`weights=`, so backends can be compared on the same model and inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from flashtune.models.attention import AttentionShape, GraphShape, PagedAttention
from flashtune.models.backends import Ops
from flashtune.models.decoder import DecodeGraph, PagedDecoder, RandomInit
from flashtune.models.paging import PagedKVCache, StepBatch

__all__ = [
    "LlamaConfig",
    "LLAMA_3_1_8B",
    "QWEN3_8B",
    "TINY",
    "CONFIGS",
    "Llama31RopeScaling",
    "LlamaWeights",
    "Llama",
    "DecodeGraph",
    "rope_cos_sin",
]


@dataclass(frozen=True)
class Llama31RopeScaling:
    """Llama 3.1's RoPE frequency scaling (its config.json's rope_scaling)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class LlamaConfig:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_eps: float
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    rope_scaling: Llama31RopeScaling | None = None
    max_position: int = 32768 + 1024  # rows of the RoPE table (the benchmark's longest KV)

    def with_layers(self, num_layers: int) -> LlamaConfig:
        """The same shapes with fewer layers (a benchmark that fits in time and memory)."""
        return replace(self, num_layers=num_layers, name=f"{self.name}-{num_layers}l")


LLAMA_3_1_8B = LlamaConfig(
    name="llama-3.1-8b",
    num_layers=32,
    hidden_size=4096,
    intermediate_size=14336,
    num_qo_heads=32,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
    rope_theta=5e5,
    rms_eps=1e-5,
    rope_scaling=Llama31RopeScaling(),
)
QWEN3_8B = LlamaConfig(
    name="qwen3-8b",
    num_layers=36,
    hidden_size=4096,
    intermediate_size=12288,
    num_qo_heads=32,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=151936,
    rope_theta=1e6,
    rms_eps=1e-6,
    qk_norm=True,
)
# For tests: every shape small, GQA (2 query heads per KV head); head_dim 64, the smallest the
# paged prefill kernel takes (64, 128 or 256). q/k norm and Llama 3.1 RoPE through `replace`.
TINY = LlamaConfig(
    name="tiny",
    num_layers=2,
    hidden_size=64,
    intermediate_size=128,
    num_qo_heads=4,
    num_kv_heads=2,
    head_dim=64,
    vocab_size=128,
    rope_theta=1e4,
    rms_eps=1e-6,
    max_position=256,
)
CONFIGS = {c.name: c for c in (LLAMA_3_1_8B, QWEN3_8B, TINY)}


def rope_cos_sin(config: LlamaConfig, device: torch.device | str) -> torch.Tensor:
    """[max_position, head_dim] float32: cos of every position x frequency, then sin (the
    cos_sin_cache of FlashInfer's apply_rope_with_cos_sin_cache)."""
    d = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    scaling = config.rope_scaling
    if scaling is not None:  # Meta's definition (as flashtune.ops.rope.reference.llama31_inv_freq)
        wavelen = 2 * math.pi / inv_freq
        long_wave = scaling.original_max_position / scaling.low_freq_factor
        short_wave = scaling.original_max_position / scaling.high_freq_factor
        smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
        inv_freq = torch.where(
            wavelen < short_wave,
            inv_freq,
            torch.where(wavelen > long_wave, inv_freq / scaling.factor, blended),
        )
    angles = torch.arange(config.max_position, dtype=torch.float64)[:, None] * inv_freq
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float().to(device)


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2 Hk) D, H]: q, k, v projections stacked
    o: torch.Tensor  # [H, Hq D]
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 I, H]: gate, up stacked
    down: torch.Tensor  # [H, I]
    q_norm: torch.Tensor | None = None  # [D] (Qwen3)
    k_norm: torch.Tensor | None = None  # [D]


@dataclass
class LlamaWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights] = field(default_factory=list)
    final_norm: torch.Tensor | None = None  # [H]
    lm_head: torch.Tensor | None = None  # [V, H]

    @classmethod
    def random(
        cls,
        config: LlamaConfig,
        dtype: torch.dtype,
        device: torch.device | str,
        seed: int = 0,
    ) -> LlamaWeights:
        """Seeded random weights, scaled 1/sqrt(fan_in) so activations stay O(1) through
        the layers and logits spread over a few units (greedy tokens are well separated)."""
        init = RandomInit(dtype, device, seed)
        linear, norm = init.linear, init.norm
        c = config
        h, d = c.hidden_size, c.head_dim
        layers = [
            LayerWeights(
                input_norm=norm(h),
                qkv=linear((c.num_qo_heads + 2 * c.num_kv_heads) * d, h),
                o=linear(h, c.num_qo_heads * d),
                post_norm=norm(h),
                gate_up=linear(2 * c.intermediate_size, h),
                down=linear(h, c.intermediate_size),
                q_norm=norm(d) if c.qk_norm else None,
                k_norm=norm(d) if c.qk_norm else None,
            )
            for _ in range(c.num_layers)
        ]
        return cls(init.embedding(c.vocab_size, h), layers, norm(h), linear(c.vocab_size, h))


class Llama(PagedDecoder):
    """The decoder, its paged KV cache and page table, running its hot ops on `backend`
    (the step, the layer stack, compile, sampling and decode graphs: decoder.py)."""

    config: LlamaConfig
    weights: LlamaWeights
    cache: PagedKVCache

    def __init__(
        self,
        config: LlamaConfig,
        backend: str | Ops = "flashtune",
        *,
        device: torch.device | str = "cuda",
        dtype: torch.dtype = torch.bfloat16,
        page_size: int = 16,
        num_pages: int = 1024,
        weights: LlamaWeights | None = None,
        cache: PagedKVCache | None = None,
        seed: int = 0,
    ) -> None:
        """weights / cache: another model's, to run the same model (and KV) on another
        backend; by default random weights from `seed` and an empty cache."""
        dev = torch.device(device)
        super().__init__(
            config,
            backend,
            dev,
            dtype,
            weights or LlamaWeights.random(config, dtype, dev, seed),
            cache
            or PagedKVCache(
                config.num_layers,
                num_pages,
                page_size,
                config.num_kv_heads,
                config.head_dim,
                dtype,
                dev,
            ),
        )
        self.cos_sin = rope_cos_sin(config, self.device)
        self.attention_shape = AttentionShape(
            config.num_qo_heads,
            config.num_kv_heads,
            config.head_dim,
            self.cache.page_size,
            dtype,
            self.device,
        )
        self._attention: dict[bool, PagedAttention] = {}  # eager, by is_decode

    def step_attention(self, batch: StepBatch) -> PagedAttention:
        """The eager decode or prefill attention (built once each)."""
        decode = batch.is_decode
        if decode not in self._attention:
            make = self.ops.decode_attention if decode else self.ops.prefill_attention
            self._attention[decode] = make(self.attention_shape)
        return self._attention[decode]

    def graph_attention(self, graph: GraphShape) -> PagedAttention:
        """The decode attention of a CUDA-graph step of `graph`'s sizes (DecodeGraph's)."""
        return self.ops.decode_attention(self.attention_shape, graph)

    def attention_block(
        self,
        index: int,
        layer: LayerWeights,
        x: torch.Tensor,
        positions: torch.Tensor,
        attention: PagedAttention,
    ) -> torch.Tensor:
        c, ops = self.config, self.ops
        n, hq, hk, d = x.shape[0], c.num_qo_heads, c.num_kv_heads, c.head_dim
        qkv = ops.linear(x, layer.qkv)  # [nnz, (Hq + 2 Hk) D]
        q, k, v = (t.view(n, -1, d) for t in qkv.split([hq * d, hk * d, hk * d], dim=-1))
        if layer.q_norm is not None and layer.k_norm is not None:
            # Per head: rows of D (reshape copies the strided views into [nnz * H, D]).
            q = ops.rmsnorm(q.reshape(-1, d), layer.q_norm, c.rms_eps).view(n, hq, d)
            k = ops.rmsnorm(k.reshape(-1, d), layer.k_norm, c.rms_eps).view(n, hk, d)
        ops.rope(positions, q, k, self.cos_sin)
        cache = self.cache.layer(index)
        attention.append_kv(k, v, cache)
        out = attention.run(q, cache)  # [nnz, Hq, D]
        return ops.linear(out.reshape(n, hq * d), layer.o)

"""Shapes of known model configurations, for `flashtune tune --model` and
`flashtune definitions dump --model`: the per-layer dimensions that fix an op's const axes.

The one place model shapes live: op modules hold none (each op module's example calls,
registered with `flashtune.schema.dump.register_examples`, take a ModelConfig and read the
shapes from it). Not to be confused with `flashtune.data.models`, the Trace format's records.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MLAConfig", "ModelConfig", "MODELS", "get_model"]


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head Latent Attention's dimensions (DeepSeek-V2/V3, Kimi-K2): queries through a
    low-rank projection (q_lora_rank), keys and values compressed to one shared latent of
    kv_lora_rank per token plus a decoupled RoPE part of qk_rope_head_dim; per head, the
    non-absorbed QK dimension is qk_nope_head_dim + qk_rope_head_dim and V's v_head_dim."""

    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    q_lora_rank: int = 1536


@dataclass(frozen=True)
class ModelConfig:
    """Per-GPU shapes of one transformer layer (after tensor parallelism)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tensor_parallel: int = 1
    rope_theta: float = 1e4
    mla: MLAConfig | None = None  # MLA attention's dimensions; None: grouped-query attention

    @property
    def attention(self) -> str:
        """The attention family the model uses: "mla" or "gqa" (MHA and MQA included)."""
        return "gqa" if self.mla is None else "mla"

    @property
    def qkv_out(self) -> int:
        return (self.num_qo_heads + 2 * self.num_kv_heads) * self.head_dim

    def gemm_nk(self) -> list[tuple[int, int]]:
        """(N, K) of the layer's linear layers, weight stored [N, K]."""
        h, i = self.hidden_size, self.intermediate_size
        if self.mla is not None:
            m, heads = self.mla, self.num_qo_heads
            return [
                (m.q_lora_rank, h),  # query down-projection (replicated)
                (heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), m.q_lora_rank),  # q up
                (m.kv_lora_rank + m.qk_rope_head_dim, h),  # latent KV + RoPE key (replicated)
                (h, heads * m.v_head_dim),  # output projection
                (2 * i, h),  # fused gate/up projection (a dense layer's MLP)
                (h, i),  # down projection
            ]
        return [
            (self.qkv_out, h),  # fused QKV projection
            (h, self.num_qo_heads * self.head_dim),  # output projection
            (2 * i, h),  # fused gate/up projection
            (h, i),  # down projection
        ]


def _tp(cfg: ModelConfig, tp: int) -> ModelConfig:
    return ModelConfig(
        name=f"{cfg.name}-tp{tp}",
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size // tp,
        num_qo_heads=cfg.num_qo_heads // tp,
        num_kv_heads=max(1, cfg.num_kv_heads // tp),
        head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size,
        tensor_parallel=tp,
        rope_theta=cfg.rope_theta,
        mla=cfg.mla,
    )


_LLAMA_8B = ModelConfig("llama-3.1-8b", 4096, 14336, 32, 8, 128, 128256, rope_theta=5e5)
_LLAMA_70B = ModelConfig("llama-3.1-70b", 8192, 28672, 64, 8, 128, 128256, rope_theta=5e5)
_QWEN3_8B = ModelConfig("qwen3-8b", 4096, 12288, 32, 8, 128, 151936, rope_theta=1e6)

# MLA models: heads (all query heads; at decode every one reads the one shared latent),
# head_dim the non-absorbed QK dimension (128 + 64), intermediate_size a dense layer's MLP
# (their first layers; the rest are mixture-of-experts layers).
_DEEPSEEK_V3 = ModelConfig(
    "deepseek-v3", 7168, 18432, 128, 128, 192, 129280, rope_theta=1e4, mla=MLAConfig()
)
_KIMI_K2 = ModelConfig("kimi-k2", 7168, 18432, 64, 64, 192, 163840, rope_theta=5e4, mla=MLAConfig())

MODELS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        _LLAMA_8B,
        _LLAMA_70B,
        _tp(_LLAMA_70B, 8),
        _QWEN3_8B,
        _DEEPSEEK_V3,
        _tp(_DEEPSEEK_V3, 8),
        _KIMI_K2,
        _tp(_KIMI_K2, 8),
    )
}


def get_model(name: str) -> ModelConfig:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}"
        ) from None

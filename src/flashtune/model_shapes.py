"""Shapes of known model configurations, for `flashtune tune --model` and
`flashtune definitions dump --model`: the per-layer dimensions that fix an op's const axes.

The one place model shapes live: op modules hold none (each op module's example calls,
registered with `flashtune.schema.dump.register_examples`, take a ModelConfig and read the
shapes from it). Not to be confused with `flashtune.data.models`, the Trace format's records.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelConfig", "MODELS", "get_model"]


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

    @property
    def qkv_out(self) -> int:
        return (self.num_qo_heads + 2 * self.num_kv_heads) * self.head_dim

    def gemm_nk(self) -> list[tuple[int, int]]:
        """(N, K) of the layer's linear layers, weight stored [N, K]."""
        h, i = self.hidden_size, self.intermediate_size
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
    )


_LLAMA_8B = ModelConfig("llama-3.1-8b", 4096, 14336, 32, 8, 128, 128256, rope_theta=5e5)
_LLAMA_70B = ModelConfig("llama-3.1-70b", 8192, 28672, 64, 8, 128, 128256, rope_theta=5e5)
_QWEN3_8B = ModelConfig("qwen3-8b", 4096, 12288, 32, 8, 128, 151936, rope_theta=1e6)

MODELS: dict[str, ModelConfig] = {
    cfg.name: cfg for cfg in (_LLAMA_8B, _LLAMA_70B, _tp(_LLAMA_70B, 8), _QWEN3_8B)
}


def get_model(name: str) -> ModelConfig:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}"
        ) from None

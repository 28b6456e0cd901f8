"""Shapes of known model configurations, for `flashtune tune --model` and
`flashtune definitions dump --model`: the per-layer dimensions that fix an op's const axes.

The one place model shapes live: op modules hold none (each op module's example calls,
registered with `flashtune.schema.dump.register_examples`, take a ModelConfig and read the
shapes from it). Not to be confused with `flashtune.data.models`, the Trace format's records.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = [
    "DSAConfig",
    "GDNConfig",
    "MLAConfig",
    "MambaConfig",
    "MoEConfig",
    "ModelConfig",
    "MODELS",
    "get_model",
]


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
class DSAConfig:
    """DeepSeek Sparse Attention (DeepSeek-V3.2): a lightning indexer of index_n_heads heads of
    index_head_dim scores every cached token per query (fp8 keys in pages of page_size), and
    MLA attends to its index_topk best only (the latent cache in pages of 1 or 64 tokens)."""

    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 2048
    page_size: int = 64


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts layer's dimensions: num_experts routed experts (all ranks), each
    a SwiGLU MLP of intermediate_size, top_k of them per token, picked by `routing` (a
    flashtune.ops.moe RoutingMethodType name: "DeepSeekV3", "Renormalize", "Llama4", ...;
    DeepSeekV3 reads n_group, topk_group and routed_scaling_factor), spread over
    expert_parallel ranks (num_experts / expert_parallel local experts each)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    routing: str
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    expert_parallel: int = 1

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.expert_parallel


@dataclass(frozen=True)
class MambaConfig:
    """A hybrid model's Mamba-2 layers (per GPU): nheads SSM heads of head_dim channels, each
    channel a state of dstate values; B and C shared by the heads of each of ngroups groups."""

    nheads: int
    head_dim: int
    dstate: int
    ngroups: int


@dataclass(frozen=True)
class GDNConfig:
    """Gated Delta Net linear attention's dimensions (Qwen3-Next's linear layers), per GPU:
    num_k_heads query/key heads and num_v_heads value heads (GVA: a multiple of them), each
    of head_dim; the recurrent state is [num_v_heads, head_dim, head_dim] float32."""

    num_k_heads: int
    num_v_heads: int
    head_dim: int = 128


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
    moe: MoEConfig | None = None  # its MoE layers' dimensions; None: dense MLPs only
    dsa: DSAConfig | None = None  # sparse attention's indexer (MLA models); None: dense
    gdn: GDNConfig | None = None  # its Gated Delta Net (linear attention) layers; None: none
    mamba: MambaConfig | None = None  # its Mamba-2 layers' dimensions (hybrid models)

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
        dsa=cfg.dsa,  # the indexer's heads are not split by tensor parallelism
        # MoE models split their experts over the ranks (expert parallel), as served
        moe=None if cfg.moe is None else dataclasses.replace(cfg.moe, expert_parallel=tp),
        # Mamba heads and groups split over the ranks (head_dim and dstate stay whole)
        mamba=None
        if cfg.mamba is None
        else dataclasses.replace(
            cfg.mamba, nheads=cfg.mamba.nheads // tp, ngroups=max(1, cfg.mamba.ngroups // tp)
        ),
    )


_LLAMA_8B = ModelConfig("llama-3.1-8b", 4096, 14336, 32, 8, 128, 128256, rope_theta=5e5)
_LLAMA_70B = ModelConfig("llama-3.1-70b", 8192, 28672, 64, 8, 128, 128256, rope_theta=5e5)
_QWEN3_8B = ModelConfig("qwen3-8b", 4096, 12288, 32, 8, 128, 151936, rope_theta=1e6)

# MLA models: heads (all query heads; at decode every one reads the one shared latent),
# head_dim the non-absorbed QK dimension (128 + 64), intermediate_size a dense layer's MLP
# (their first layers; the rest are mixture-of-experts layers).
# (their first layers; the rest are mixture-of-experts layers: `moe`).
_DEEPSEEK_V3 = ModelConfig(
    "deepseek-v3", 7168, 18432, 128, 128, 192, 129280, rope_theta=1e4, mla=MLAConfig(),
    moe=MoEConfig(256, 8, 2048, "DeepSeekV3", n_group=8, topk_group=4, routed_scaling_factor=2.5),
)  # fmt: skip
# DeepSeek-V3.2: DeepSeek-V3's shapes with DeepSeek Sparse Attention.
_DEEPSEEK_V32 = dataclasses.replace(_DEEPSEEK_V3, name="deepseek-v3.2", dsa=DSAConfig())
_KIMI_K2 = ModelConfig(
    "kimi-k2", 7168, 18432, 64, 64, 192, 163840, rope_theta=5e4, mla=MLAConfig(),
    moe=MoEConfig(384, 8, 2048, "DeepSeekV3", routed_scaling_factor=2.827),
)  # fmt: skip
# Mixture-of-experts models with grouped-query attention (intermediate_size: a dense MLP's,
# which these models do not use; their MLPs are `moe`'s experts).
_QWEN3_30B_A3B = ModelConfig(
    "qwen3-30b-a3b", 2048, 6144, 32, 4, 128, 151936, rope_theta=1e6,
    moe=MoEConfig(128, 8, 768, "Renormalize"),
)  # fmt: skip
_LLAMA4_SCOUT = ModelConfig(
    "llama-4-scout", 5120, 16384, 40, 8, 128, 202048, rope_theta=5e5,
    moe=MoEConfig(16, 1, 8192, "Llama4"),
)  # fmt: skip
# Reduced MoE shapes (not real models) for the bundled dataset and CPU tests: the expert
# layouts of DeepSeek-V3 at EP 8 (64 experts in 8 groups, 8 local) and of Qwen3-MoE, small
# enough for a 2-core CPU to run the references (hidden 256, experts of 128: one fp8 block).
_MINI_MOE_DS = ModelConfig(
    "mini-moe-ds", 256, 512, 4, 1, 64, 32000,
    moe=MoEConfig(64, 8, 128, "DeepSeekV3", n_group=8, topk_group=4, routed_scaling_factor=2.5,
                  expert_parallel=8),
)  # fmt: skip
_MINI_MOE = ModelConfig(
    "mini-moe", 256, 512, 4, 1, 64, 32000, moe=MoEConfig(32, 4, 128, "Renormalize")
)
# Reduced DSA shapes (not a real model) for the bundled dataset: 4 query heads over a 64-wide
# latent and a 16-wide RoPE key, an indexer of 8 heads of 32 in pages of 16, DeepSeek-V3.2's
# topk (2048: the CPU references gather 2048 small rows a token).
_MINI_DSA = ModelConfig(
    "mini-dsa", 256, 512, 4, 4, 80, 32000,
    mla=MLAConfig(kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=64, v_head_dim=64,
                  q_lora_rank=128),
    dsa=DSAConfig(index_n_heads=8, index_head_dim=32, index_topk=2048, page_size=16),
)  # fmt: skip
# Hybrid Mamba-2 / attention models: NemotronH-8B (the FlashInfer-Trace mamba_ssu Definitions
# are its layers at TP 1 and 2), and a reduced one (not a real model) for the bundled dataset
# and CPU tests: 8 heads in 2 groups, small enough for a 2-core CPU's reference runs.
_NEMOTRON_H_8B = ModelConfig(
    "nemotron-h-8b", 4096, 21504, 32, 8, 128, 131072, rope_theta=1e4,
    mamba=MambaConfig(128, 64, 128, 8),
)  # fmt: skip
_MINI_MAMBA = ModelConfig("mini-mamba", 256, 512, 4, 1, 64, 32000, mamba=MambaConfig(8, 32, 64, 2))

# Reduced Gated Delta Net shapes (not a real model) for the bundled dataset and CPU tests:
# Qwen3-Next's head size (128) and GVA ratio (two value heads per query/key head) at one
# query head, small enough for a 2-core CPU to run the token-by-token references.
_MINI_GDN = ModelConfig("mini-gdn", 256, 512, 4, 1, 64, 32000, gdn=GDNConfig(1, 2))

MODELS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        _LLAMA_8B,
        _LLAMA_70B,
        _tp(_LLAMA_70B, 8),
        _QWEN3_8B,
        _DEEPSEEK_V3,
        _tp(_DEEPSEEK_V3, 8),
        _DEEPSEEK_V32,
        _tp(_DEEPSEEK_V32, 8),
        _KIMI_K2,
        _tp(_KIMI_K2, 8),
        _QWEN3_30B_A3B,
        _LLAMA4_SCOUT,
        _MINI_MOE_DS,
        _MINI_MOE,
        _MINI_DSA,
        _NEMOTRON_H_8B,
        _tp(_NEMOTRON_H_8B, 2),
        _MINI_MAMBA,
        _MINI_GDN,
    )
}


def get_model(name: str) -> ModelConfig:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}"
        ) from None

"""A DeepSeek-V3-shaped decoder over a paged latent cache (Multi-head Latent Attention), one
backend switch for its ops, as llama.py's Llama.

    model = DeepseekV3(DEEPSEEK_V3_TP8.with_layers(4), backend="flashtune", device="cuda")
    batch = model.page_table.step(requests, prompt_lens)       # fresh prompts: ragged prefill
    logits = model.forward(prompt_tokens, batch)               # [B, vocab]: last tokens
    decode = model.decode_graph(batch_size=B, max_kv_len=...)  # CUDA graph of one step
    logits = decode.step(next_tokens, model.page_table.step(requests, [1] * B))

The layer (DeepSeek-V3's attention, a dense SwiGLU MLP as its first three layers have):

    x -> RMSNorm -> q_a_proj [q_lora, hidden] -> RMSNorm -> q_b_proj [H (128 + 64), q_lora]
                                                            -> q_nope [H, 128], q_pe [H, 64]
      -> kv_a_proj_with_mqa [512 + 64, hidden] -> c_kv [512] (RMSNorm), k_pe [64]
    RoPE (GPT-J pairs, is_neox=False) on q_pe and k_pe (one k_pe for all heads);
    c_kv and k_pe appended to the paged latent cache;
    kv_b_proj [H (128 + 128), 512] holds W_UK (k_nope = W_UK c_kv) and W_UV (v = W_UV c_kv);
    absorbed (decode; prefill over a cached prefix):
        q_lat = q_nope W_UK [H, 512]; o_lat = MLA(q_lat, q_pe; ckv, kpe) [H, 512];
        o = o_lat W_UV^T [H, 128]
    non-absorbed (a prefill of fresh prompts, `prefill="ragged"`, as DeepSeek runs long
    prompts): k_nope, v = kv_b_proj(c_kv); attention with QK [q_nope | q_pe] . [k_nope | k_pe]
    (192) and V 128, causal per prompt;
    o_proj [hidden, H 128] -> + residual -> RMSNorm -> gate/up [2 I, hidden] -> SiLU-and-mul
    -> down [hidden, I] -> + residual.

Softmax scale 1/sqrt(128 + 64). DeepSeek-V3's YaRN RoPE scaling (factor 40 over 4k
positions) is left out: plain RoPE at theta 1e4, and no YaRN mscale, which would multiply
the softmax scale by (0.1 ln 40 + 1)^2 ~ 1.87; with random weights neither changes the work.
Mixture of experts: a config with `moe` (deepseek-v3-moe-tp8, deepseek-tiny-moe) makes every
layer from `first_k_dense` on an MoE layer (models/moe.py: DeepSeek-V3's grouped sigmoid
routing over all routed experts, the rank's local experts under expert parallelism, plus
`n_shared_experts` shared experts as one dense MLP of their summed width); its first
`first_k_dense` layers keep the dense MLP of intermediate_size, as DeepSeek-V3's first three.
A config without `moe` has dense MLPs in every layer. Weights are random (seeded), shared
across backends with `weights=`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from flashtune.model_shapes import ModelConfig, MoEConfig, get_model
from flashtune.models.attention import GraphShape
from flashtune.models.backends import Ops
from flashtune.models.decoder import PagedDecoder, RandomInit
from flashtune.models.latent import (
    LatentAttention,
    MLAShape,
    MLAStep,
    PagedLatentCache,
    RaggedAttention,
)
from flashtune.models.moe import MoEWeights, route
from flashtune.models.paging import StepBatch

__all__ = [
    "DeepseekV3Config",
    "DEEPSEEK_V3",
    "DEEPSEEK_V3_TP8",
    "KIMI_K2_TP8",
    "DEEPSEEK_TINY",
    "DEEPSEEK_V3_MOE_TP8",
    "DEEPSEEK_TINY_MOE",
    "DEEPSEEK_CONFIGS",
    "MLALayerWeights",
    "DeepseekV3Weights",
    "DeepseekV3",
    "PREFILL_FORMS",
]

PREFILL_FORMS = ("ragged", "absorbed")


@dataclass(frozen=True)
class DeepseekV3Config:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int  # the dense MLP's (DeepSeek-V3's first three layers)
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    vocab_size: int
    rope_theta: float = 1e4
    rms_eps: float = 1e-6
    max_position: int = 32768 + 1024  # rows of the RoPE table (the benchmark's longest KV)
    moe: MoEConfig | None = None  # None: a dense MLP in every layer
    first_k_dense: int = 0  # with moe: the first layers keep the dense MLP
    n_shared_experts: int = 1  # with moe: shared experts (one MLP of their summed width)

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and index >= self.first_k_dense

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def sm_scale(self) -> float:
        """1/sqrt(QK head dim), the same in both forms (the absorbed dot product equals the
        non-absorbed one); YaRN's mscale left out (module docstring)."""
        return 1.0 / math.sqrt(self.qk_head_dim)

    def with_layers(self, num_layers: int) -> DeepseekV3Config:
        """The same shapes with fewer layers."""
        return replace(self, num_layers=num_layers, name=f"{self.name}-{num_layers}l")

    @classmethod
    def from_shapes(
        cls, model: ModelConfig, num_layers: int, moe: bool = False, first_k_dense: int = 1
    ) -> DeepseekV3Config:
        """The decoder of a model_shapes MLA model (its per-GPU heads: tensor parallelism
        splits the heads; the latent projections, as in serving, are replicated). moe: its
        MoE layers from `first_k_dense` on (experts split by its expert parallelism), named
        "<model>" with "-moe" before a "-tp" suffix."""
        if model.mla is None:
            raise ValueError(f"{model.name} is not an MLA model")
        if moe and model.moe is None:
            raise ValueError(f"{model.name} has no mixture-of-experts layers")
        m = model.mla
        name = model.name
        if moe:
            base, tp, suffix = name.partition("-tp")
            name = f"{base}-moe{tp}{suffix}"
        return cls(
            name=name,
            num_layers=num_layers,
            hidden_size=model.hidden_size,
            intermediate_size=model.intermediate_size,
            num_heads=model.num_qo_heads,
            q_lora_rank=m.q_lora_rank,
            kv_lora_rank=m.kv_lora_rank,
            qk_nope_head_dim=m.qk_nope_head_dim,
            qk_rope_head_dim=m.qk_rope_head_dim,
            v_head_dim=m.v_head_dim,
            vocab_size=model.vocab_size,
            rope_theta=model.rope_theta,
            moe=model.moe if moe else None,
            first_k_dense=first_k_dense if moe else 0,
        )


DEEPSEEK_V3 = DeepseekV3Config.from_shapes(get_model("deepseek-v3"), 61)
DEEPSEEK_V3_TP8 = DeepseekV3Config.from_shapes(get_model("deepseek-v3-tp8"), 61)  # 16 heads
KIMI_K2_TP8 = DeepseekV3Config.from_shapes(get_model("kimi-k2-tp8"), 61)  # 8 heads
# For tests: every dimension small, the kernels' constraints kept (latent and RoPE widths
# powers of two; the ragged prefill's QK head dim 32 + 16).
DEEPSEEK_TINY = DeepseekV3Config(
    name="deepseek-tiny",
    num_layers=2,
    hidden_size=256,
    intermediate_size=256,
    num_heads=4,
    q_lora_rank=64,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    vocab_size=256,
    max_position=256,
)
# DeepSeek-V3 at TP 8 with its MoE layers at EP 8 (32 of 256 experts a GPU, top 8 of 8
# groups, 4 groups kept), one dense layer first: with_layers(4) runs 1 dense and 3 MoE layers.
DEEPSEEK_V3_MOE_TP8 = DeepseekV3Config.from_shapes(get_model("deepseek-v3-tp8"), 61, moe=True)
# The tiny config with MoE layers: 16 experts of 64, top 4 of 4 groups (2 kept), EP 2 (the
# rank holds experts 8..15: routes to the others are dropped, as on a real rank).
DEEPSEEK_TINY_MOE = replace(
    DEEPSEEK_TINY,
    name="deepseek-tiny-moe",
    moe=MoEConfig(
        16,
        4,
        64,
        "DeepSeekV3",
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        expert_parallel=2,
    ),  # fmt: skip
    first_k_dense=1,
)
DEEPSEEK_CONFIGS = {
    c.name: c
    for c in (
        DEEPSEEK_V3,
        DEEPSEEK_V3_TP8,
        KIMI_K2_TP8,
        DEEPSEEK_TINY,
        DEEPSEEK_V3_MOE_TP8,
        DEEPSEEK_TINY_MOE,
    )
}


def rope_cos_sin(config: DeepseekV3Config, device: torch.device | str) -> torch.Tensor:
    """[max_position, qk_rope_head_dim] float32: cos of every position x frequency, then sin."""
    d = config.qk_rope_head_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(config.max_position, dtype=torch.float64)[:, None] * inv_freq
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float().to(device)


@dataclass
class MLALayerWeights:
    input_norm: torch.Tensor  # [hidden]
    q_a: torch.Tensor  # [q_lora, hidden]
    q_a_norm: torch.Tensor  # [q_lora]
    q_b: torch.Tensor  # [H (nope + rope), q_lora]
    kv_a: torch.Tensor  # [kv_lora + rope, hidden] (kv_a_proj_with_mqa)
    kv_a_norm: torch.Tensor  # [kv_lora]
    kv_b: torch.Tensor  # [H (nope + v), kv_lora]: per head W_UK [nope, kv_lora], W_UV [v, ..]
    o: torch.Tensor  # [hidden, H v]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor | None  # [2 I, hidden] (a dense layer; None in an MoE layer)
    down: torch.Tensor | None  # [hidden, I]
    moe: MoEWeights | None = None  # an MoE layer's router, experts and shared expert

    def absorbed(self, config: DeepseekV3Config) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, nope, kv_lora], W_UV^T [H, kv_lora, v]): views of kv_b for the bmm."""
        c = config
        per_head = self.kv_b.view(c.num_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
        w_uk = per_head[:, : c.qk_nope_head_dim]
        w_uv_t = per_head[:, c.qk_nope_head_dim :].transpose(1, 2)
        return w_uk, w_uv_t


@dataclass
class DeepseekV3Weights:
    embed: torch.Tensor  # [V, hidden]
    layers: list[MLALayerWeights] = field(default_factory=list)
    final_norm: torch.Tensor | None = None
    lm_head: torch.Tensor | None = None  # [V, hidden]

    @classmethod
    def random(
        cls,
        config: DeepseekV3Config,
        dtype: torch.dtype,
        device: torch.device | str,
        seed: int = 0,
    ) -> DeepseekV3Weights:
        """Seeded random weights (decoder.RandomInit: std 1/sqrt(fan_in), norms near 1)."""
        init = RandomInit(dtype, device, seed)
        linear, norm = init.linear, init.norm

        c, hid, h = config, config.hidden_size, config.num_heads

        def moe_weights() -> MoEWeights:
            m = c.moe
            assert m is not None
            shared = c.n_shared_experts * m.intermediate_size
            local, inter = m.local_experts, m.intermediate_size
            return MoEWeights(
                router=linear(m.num_experts, hid),
                router_bias=init.bias(m.num_experts),
                gemm1=init.stacked(local, 2 * inter, hid),
                gemm2=init.stacked(local, hid, inter),
                shared_gate_up=linear(2 * shared, hid),
                shared_down=linear(hid, shared),
                # the last rank's experts: rank 0's would favour no id range either
                local_offset=m.num_experts - local,
            )

        layers = []
        for index in range(c.num_layers):
            moe = c.is_moe_layer(index)
            layers.append(
                MLALayerWeights(
                    input_norm=norm(hid),
                    q_a=linear(c.q_lora_rank, hid),
                    q_a_norm=norm(c.q_lora_rank),
                    q_b=linear(h * c.qk_head_dim, c.q_lora_rank),
                    kv_a=linear(c.kv_lora_rank + c.qk_rope_head_dim, hid),
                    kv_a_norm=norm(c.kv_lora_rank),
                    kv_b=linear(h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
                    o=linear(hid, h * c.v_head_dim),
                    post_norm=norm(hid),
                    gate_up=None if moe else linear(2 * c.intermediate_size, hid),
                    down=None if moe else linear(hid, c.intermediate_size),
                    moe=moe_weights() if moe else None,
                )
            )
        return cls(init.embedding(c.vocab_size, hid), layers, norm(hid), linear(c.vocab_size, hid))


class DeepseekV3(PagedDecoder):
    """The decoder, its paged latent cache and page table, running its hot ops on `backend`
    (the step, the layer stack, compile, sampling and decode graphs: decoder.py).

    prefill: "ragged" (a prefill of fresh prompts in the non-absorbed form, as DeepSeek
    serves long prompts; prefill over a cached prefix is absorbed either way) or "absorbed"
    (every step in the absorbed form)."""

    config: DeepseekV3Config
    weights: DeepseekV3Weights
    cache: PagedLatentCache

    def __init__(
        self,
        config: DeepseekV3Config,
        backend: str | Ops = "flashtune",
        *,
        device: torch.device | str = "cuda",
        dtype: torch.dtype = torch.bfloat16,
        page_size: int = 16,
        num_pages: int = 1024,
        weights: DeepseekV3Weights | None = None,
        cache: PagedLatentCache | None = None,
        seed: int = 0,
        prefill: str = "ragged",
    ) -> None:
        if prefill not in PREFILL_FORMS:
            raise ValueError(f"prefill must be one of {PREFILL_FORMS}, got {prefill!r}")
        dev = torch.device(device)
        super().__init__(
            config,
            backend,
            dev,
            dtype,
            weights or DeepseekV3Weights.random(config, dtype, dev, seed),
            cache
            or PagedLatentCache(
                config.num_layers,
                num_pages,
                page_size,
                config.kv_lora_rank,
                config.qk_rope_head_dim,
                dtype,
                dev,
            ),
        )
        self.prefill = prefill
        self.cos_sin = rope_cos_sin(config, self.device)
        self.mla_shape = MLAShape(
            num_heads=config.num_heads,
            kv_lora_rank=config.kv_lora_rank,
            rope_dim=config.qk_rope_head_dim,
            qk_nope_dim=config.qk_nope_head_dim,
            v_head_dim=config.v_head_dim,
            page_size=self.cache.page_size,
            sm_scale=config.sm_scale,
            dtype=dtype,
            device=self.device,
        )
        self.absorbed = [layer.absorbed(config) for layer in self.weights.layers]
        self._attention: dict[str, MLAStep] = {}

    def step_attention(self, batch: StepBatch) -> MLAStep:
        """The eager attention for this step's kind (built once per kind), not yet planned:
        decode, a prefill of fresh prompts (ragged unless prefill="absorbed"), or a prefill
        over a cached prefix (absorbed, causal)."""
        fresh = all(q == kv for q, kv in zip(batch.q_lens, batch.kv_lens, strict=True))
        if batch.is_decode:
            kind = "decode"
        elif fresh and self.prefill == "ragged":
            kind = "ragged"
        else:
            kind = "prefill"
        if kind not in self._attention:
            s = self.mla_shape
            if kind == "ragged":
                self._attention[kind] = self.ops.ragged_attention(s)
            else:
                self._attention[kind] = self.ops.latent_attention(s, causal=kind == "prefill")
        return self._attention[kind]

    def attention_block(
        self,
        index: int,
        layer: MLALayerWeights,
        x: torch.Tensor,
        positions: torch.Tensor,
        attention: MLAStep,
    ) -> torch.Tensor:
        c, ops, eps = self.config, self.ops, self.config.rms_eps
        n, h = x.shape[0], c.num_heads
        nope, rope, lora = c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank
        q = ops.linear(ops.rmsnorm(ops.linear(x, layer.q_a), layer.q_a_norm, eps), layer.q_b)
        q = q.view(n, h, c.qk_head_dim)
        q_nope, q_pe = q[..., :nope], q[..., nope:].contiguous()
        kv_a = ops.linear(x, layer.kv_a)  # [nnz, kv_lora + rope]
        c_kv = ops.rmsnorm(kv_a[:, :lora].contiguous(), layer.kv_a_norm, eps)
        k_pe = kv_a[:, lora:].contiguous().view(n, 1, rope)  # one RoPE key for all heads
        ops.rope(positions, q_pe, k_pe, self.cos_sin, is_neox=False)
        cache = self.cache.layer(index)
        attention.append(c_kv, k_pe.view(n, rope), cache)
        if isinstance(attention, LatentAttention):
            w_uk, w_uv_t = self.absorbed[index]
            q_lat = ops.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [nnz, H, lora]
            o_lat = attention.run(q_lat, q_pe, cache)  # [nnz, H, lora]
            o = ops.bmm(o_lat.transpose(0, 1), w_uv_t).transpose(0, 1)  # [nnz, H, v]
        else:
            assert isinstance(attention, RaggedAttention)
            kv = ops.linear(c_kv, layer.kv_b).view(n, h, nope + c.v_head_dim)
            k_nope, v = kv.split([nope, c.v_head_dim], dim=-1)
            k = torch.cat((k_nope, k_pe.expand(n, h, rope)), dim=-1)  # [nnz, H, 192]
            o = attention.run(torch.cat((q_nope, q_pe), dim=-1), k, v.contiguous())
        return ops.linear(o.reshape(n, h * c.v_head_dim), layer.o)

    def mlp_block(self, index: int, layer: MLALayerWeights, x: torch.Tensor) -> torch.Tensor:
        """A dense layer's MLP, or an MoE layer's routed experts plus its shared expert."""
        moe = layer.moe
        if moe is None:
            return super().mlp_block(index, layer, x)
        assert self.config.moe is not None
        ops = self.ops
        logits = ops.linear(x, moe.router).float()  # [nnz, E]: routed in float32
        ids, topk_weights = route(logits, moe, self.config.moe)
        routed = ops.experts(x, ids, topk_weights, moe)
        shared = ops.linear(ops.silu_and_mul(ops.linear(x, moe.shared_gate_up)), moe.shared_down)
        return routed.add_(shared)

    def graph_attention(self, graph: GraphShape) -> LatentAttention:
        """The decode attention of a CUDA-graph step (DecodeGraph's)."""
        return self.ops.latent_attention(self.mla_shape, graph)

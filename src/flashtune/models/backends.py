"""The model's hot ops, one class per backend: the switch `Llama(backend=...)` turns.

- "torch": eager PyTorch (F.linear, F.rms_norm, SDPA over the gathered cache, sort-based
  sampling): the baseline, and what torch.compile compiles;
- "flashtune": flashtune's ops (gemm.mm, norm, rope, activation, the paged attention
  wrappers, sampling), dispatched through its autotuner and apply table like any caller's;
- "flashinfer": FlashInfer's kernels where it has them (norms, RoPE, SiLU-and-mul,
  attention, sampling), imported when the backend is built; GEMM stays torch's (cuBLAS), as
  FlashInfer has no general bf16 GEMM a model would call.

MLA (the DeepSeek-V3 decoder, latent.py): `latent_attention` (the absorbed form:
`BatchMLAPagedAttentionWrapper` of flashtune.ops.mla / flashinfer.mla, SDPA for torch) and
`ragged_attention` (the non-absorbed prefill); `bmm` (the per-head absorption) is torch's.

MoE (the DeepSeek-V3 decoder's expert layers, models/moe.py): `experts`, the routed experts
of one layer (routing is PyTorch in every backend, as flashtune.fused_moe's): torch's grouped
GEMM, flashtune's fused experts; FlashInfer has no Hopper MoE, so its backend runs torch's.

Greedy decoding is an argmax in every backend (no library ships a faster one).
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F

from flashtune.models.attention import (
    AttentionShape,
    GraphShape,
    PagedAttention,
    TorchDecodeAttention,
    TorchPrefillAttention,
    WrapperDecodeAttention,
    WrapperPrefillAttention,
)
from flashtune.models.latent import (
    FlashinferRaggedPrefill,
    FlashtuneRaggedPrefill,
    LatentAttention,
    MLAShape,
    RaggedAttention,
    TorchLatentDecode,
    TorchLatentPrefill,
    TorchRaggedPrefill,
    WrapperLatentAttention,
)
from flashtune.models.moe import MoEWeights, experts_torch

__all__ = ["BACKENDS", "Ops", "FlashtuneOps", "FlashinferOps", "make_ops"]

BACKENDS = ("torch", "flashtune", "flashinfer")


class Ops:
    """Eager PyTorch. Methods that say "in place" overwrite their arguments, as the
    FlashInfer ops of the same name do."""

    name = "torch"

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x [M, K] @ weight [N, K].T -> [M, N]."""
        return F.linear(x, weight)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm over the last dimension of x [..., H] (x may be a strided view)."""
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    def fused_add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> None:
        """In place: residual += x; x = rmsnorm(residual)."""
        residual.add_(x)
        x.copy_(F.rms_norm(residual, (residual.shape[-1],), weight, eps))

    def rope(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        cos_sin: torch.Tensor,
        is_neox: bool = True,
    ) -> None:
        """In place: rotate q [nnz, Hq, D] and k [nnz, Hk, D] by the rows of cos_sin
        [max_position, D] (float32, cos then sin) at `positions` [nnz]; pairs (x[j],
        x[j + D/2]) (NeoX) or, with is_neox=False, (x[2j], x[2j + 1]) (GPT-J: DeepSeek)."""
        cos, sin = cos_sin[positions].chunk(2, dim=-1)  # [nnz, D / 2] each
        cos, sin = cos[:, None, :], sin[:, None, :]
        for x in (q, k):
            if is_neox:
                x1, x2 = x.float().chunk(2, dim=-1)
                x.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
            else:
                x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
                pairs = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
                x.copy_(pairs.flatten(-2))

    def bmm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a [H, M, K] @ b [H, K, N] -> [H, M, N] (MLA's per-head absorption of W_UK and
        W_UV; cuBLAS in every backend: neither library has a batched bf16 GEMM op)."""
        return torch.bmm(a, b)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(x[..., :d]) * x[..., d:] for x [..., 2d]."""
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def top_k_top_p(
        self,
        logits: torch.Tensor,
        top_k: int,
        top_p: float,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """One token per row of logits [B, V], drawn from the top_k most likely tokens
        renormalized, then the smallest set of those holding top_p of their mass."""
        probs = torch.softmax(logits.float(), dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        sorted_probs[:, top_k:] = 0
        sorted_probs /= sorted_probs.sum(dim=-1, keepdim=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs[mass_before > top_p] = 0  # the first token is always kept
        drawn = torch.multinomial(sorted_probs, 1, generator=generator)
        return order.gather(-1, drawn).squeeze(-1).to(torch.int32)

    def experts(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        weights: MoEWeights,
    ) -> torch.Tensor:
        """A MoE layer's routed experts (models/moe.py): x [T, hidden], each token's top-k
        global expert ids and weights [T, K]; the weighted sum of its local experts [T,
        hidden]. torch's grouped GEMM where it runs (models/moe.py says where)."""
        return experts_torch(x, topk_ids, topk_weights, weights)

    def decode_attention(
        self, shape: AttentionShape, graph: GraphShape | None = None
    ) -> PagedAttention:
        return TorchDecodeAttention(shape, graph)

    def prefill_attention(self, shape: AttentionShape) -> PagedAttention:
        return TorchPrefillAttention(shape)

    def latent_attention(
        self, shape: MLAShape, graph: GraphShape | None = None, causal: bool = False
    ) -> LatentAttention:
        """MLA's absorbed form: decode (causal=False), or prefill over a cached prefix."""
        return TorchLatentPrefill(shape) if causal else TorchLatentDecode(shape, graph)

    def ragged_attention(self, shape: MLAShape) -> RaggedAttention:
        """MLA's non-absorbed form: a prefill of fresh prompts."""
        return TorchRaggedPrefill(shape)


class FlashtuneOps(Ops):
    """flashtune's ops for every hot op."""

    name = "flashtune"

    def __init__(self) -> None:
        from flashtune.ops import activation, attention, gemm, norm, rope, sampling

        self._activation, self._attention, self._gemm = activation, attention, gemm
        self._norm, self._rope, self._sampling = norm, rope, sampling

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._gemm.mm(x, weight)
        return out

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out: torch.Tensor = self._norm.rmsnorm(x, weight, eps)
        return out

    def fused_add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> None:
        self._norm.fused_add_rmsnorm(x, residual, weight, eps)

    def rope(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        cos_sin: torch.Tensor,
        is_neox: bool = True,
    ) -> None:
        self._rope.apply_rope_with_cos_sin_cache_inplace(
            positions, q, k, q.shape[-1], cos_sin, is_neox=is_neox
        )

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._activation.silu_and_mul(x)
        return out

    def top_k_top_p(
        self,
        logits: torch.Tensor,
        top_k: int,
        top_p: float,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        out: torch.Tensor = self._sampling.top_k_top_p_sampling_from_logits(
            logits, top_k, top_p, generator=generator
        )
        return out

    def experts(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        weights: MoEWeights,
    ) -> torch.Tensor:
        """flashtune's fused experts (flashtune.ops.moe: the Triton grouped GEMMs with the
        SwiGLU and the weighted combine fused, tuned per token bucket)."""
        from flashtune.ops.moe import fused_experts

        out: torch.Tensor = fused_experts(
            x,
            weights.gemm1,
            weights.gemm2,
            topk_ids,
            topk_weights,
            local_expert_offset=weights.local_offset,
        )
        return out.to(x.dtype)

    def decode_attention(
        self, shape: AttentionShape, graph: GraphShape | None = None
    ) -> PagedAttention:
        return WrapperDecodeAttention(self._attention, shape, graph)

    def prefill_attention(self, shape: AttentionShape) -> PagedAttention:
        return WrapperPrefillAttention(self._attention, shape)

    def mla_library(self) -> ModuleType:
        """The module holding BatchMLAPagedAttentionWrapper (imported on first use)."""
        from flashtune.ops import mla

        return mla

    def latent_attention(
        self, shape: MLAShape, graph: GraphShape | None = None, causal: bool = False
    ) -> LatentAttention:
        return WrapperLatentAttention(self.mla_library(), shape, graph, causal)

    def ragged_attention(self, shape: MLAShape) -> RaggedAttention:
        return FlashtuneRaggedPrefill(self.mla_library(), shape)


class FlashinferOps(FlashtuneOps):
    """FlashInfer's kernels through the same calls (its names and signatures are the ones
    flashtune follows); GEMM is torch's (cuBLAS)."""

    name = "flashinfer"

    def __init__(self) -> None:
        try:
            import flashinfer
        except ImportError as exc:
            raise RuntimeError(
                "the flashinfer backend needs FlashInfer (pip install flashinfer-python)"
            ) from exc
        lib: ModuleType = flashinfer
        self._activation = self._attention = self._norm = self._rope = self._sampling = lib

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)

    # torch's grouped GEMM, as the torch backend: FlashInfer's fused MoE (trtllm_*_moe) runs on
    # SM100 only, and 0.2.14 has no bf16 MoE for Hopper.
    experts = Ops.experts

    def mla_library(self) -> ModuleType:
        """FlashInfer's top level (its BatchMLAPagedAttentionWrapper is flashinfer.mla's)."""
        return self._attention

    def latent_attention(
        self, shape: MLAShape, graph: GraphShape | None = None, causal: bool = False
    ) -> LatentAttention:
        return WrapperLatentAttention(self.mla_library(), shape, graph, causal, contiguous_q=True)

    def ragged_attention(self, shape: MLAShape) -> RaggedAttention:
        return FlashinferRaggedPrefill(self._attention, shape)


def make_ops(backend: str) -> Ops:
    """The ops of `backend` (one of BACKENDS)."""
    if backend == "torch":
        return Ops()
    if backend == "flashtune":
        return FlashtuneOps()
    if backend == "flashinfer":
        return FlashinferOps()
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")

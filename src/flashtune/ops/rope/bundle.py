"""The bundled dataset's RoPE: NeoX-style rotation from a cos/sin cache (Llama-3, Qwen3)."""

from __future__ import annotations

import torch

from flashtune.data import Definition, Workload
from flashtune.ops.bundle import (
    TORCH_EAGER,
    BundledOp,
    Entry,
    WorkloadContext,
    flashinfer_direct,
    runs_the_op,
    tuned_api,
)
from flashtune.ops.bundle.workloads import stable_uuid

SHAPES = [(1, 32, 8), (64, 32, 8), (256, 32, 8), (2048, 32, 8), (256, 8, 1)]  # tokens, Hq, Hk
MAX_SEQ = 8192


@runs_the_op
def flashtune_rope(
    q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    from flashtune.ops.rope import apply_rope_with_cos_sin_cache

    q_out, k_out = apply_rope_with_cos_sin_cache(
        positions, q, k, q.shape[-1], cos_sin_cache, is_neox=True
    )
    return q_out.view(q.shape), k_out.view(k.shape)


def flashinfer_rope(
    q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    import flashinfer

    q_out, k_out = flashinfer.rope.apply_rope_with_cos_sin_cache(
        positions,
        q.reshape(q.shape[0], -1),
        k.reshape(k.shape[0], -1),
        q.shape[-1],
        cos_sin_cache,
        is_neox=True,
    )
    return q_out.view(q.shape), k_out.view(k.shape)


def torch_rope(
    q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)  # [T, rd/2] each
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rd = cos_sin_cache.shape[-1]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        x1, x2 = xf[..., : rd // 2], xf[..., rd // 2 : rd]
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return torch.cat((rotated, xf[..., rd:]), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def _workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
    return [
        Workload(
            uuid=stable_uuid(definition.name, t, hq, hk),
            axes={"num_tokens": t, "num_qo_heads": hq, "num_kv_heads": hk, "max_seq_len": MAX_SEQ},
            inputs={},
        )
        for t, hq, hk in SHAPES
    ]


BUNDLED = (
    BundledOp(
        prefix="rope_with_cos_sin_cache_neox_style",
        workloads=_workloads,
        entries=(
            Entry("flashtune", flashtune_rope, tuned_api("ops.rope.apply_rope_with_cos_sin_cache")),
            Entry("torch", torch_rope, TORCH_EAGER),
            Entry(
                "flashinfer",
                flashinfer_rope,
                flashinfer_direct("flashinfer.rope.apply_rope_with_cos_sin_cache"),
            ),
        ),
    ),
)

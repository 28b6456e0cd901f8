"""Inputs and checks shared by the fused-MoE expert tests (test_moe_experts, test_moe_direct)."""

from __future__ import annotations

import pytest
import torch

from flashtune import platform
from flashtune.ops.moe import config as cfg
from flashtune.ops.moe.experts import ExpertQuant

FP8 = torch.float8_e4m3fn
REL_NORM = 1e-2
ROW_REL_NORM = 2.5e-2


def need_kernels(device: torch.device) -> None:
    if device.type == "cpu" and not platform.kernels_available(device):
        pytest.skip("Triton interpreter not available")


def draw_routes(T: int, K: int, num_ids: int, device, *, local: tuple[int, int] | None = None):
    """topk_ids [T, K] int32, distinct ids per token drawn from [0, num_ids); with
    local=(offset, E) every token gets at least one local expert (its first)."""
    scores = torch.rand(T, num_ids, device=device)
    if local is not None:
        off, E = local
        pick = off + torch.randint(0, E, (T,), device=device)
        scores[torch.arange(T, device=device), pick] = 2.0  # wins the top-k
    ids = scores.topk(K, dim=1).indices.to(torch.int32)
    weights = torch.rand(T, K, device=device) + 0.1
    return ids, weights / weights.sum(1, keepdim=True)


def make_inputs(
    mode: str,
    T: int,
    H: int,
    I: int,  # noqa: E741
    E: int,
    device,
    dtype=torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, ExpertQuant]:
    """Random inputs of unit-scale outputs (weights scaled by 1/sqrt(fan-in))."""
    x = torch.randn(T, H, device=device)
    w1 = torch.randn(E, 2 * I, H, device=device) / H**0.5
    w2 = torch.randn(E, H, I, device=device) / I**0.5
    if mode == "bf16":
        return x.to(dtype), w1.to(dtype), w2.to(dtype), ExpertQuant()
    if mode == "fp8_block":
        b = cfg.QUANT_BLOCK
        a_s = torch.rand(H // b, T, device=device) + 0.5
        w1_s = (torch.rand(E, 2 * I // b, H // b, device=device) + 0.5) / 64
        w2_s = (torch.rand(E, H // b, I // b, device=device) + 0.5) / 64
        # Store values that the scales bring back to the unit-scale weights.
        w1_q = (w1 / w1_s.repeat_interleave(b, 1).repeat_interleave(b, 2)).to(FP8)
        w2_q = (w2 / w2_s.repeat_interleave(b, 1).repeat_interleave(b, 2)).to(FP8)
        x_q = (x / a_s.t().repeat_interleave(b, 1)).to(FP8)
        return x_q, w1_q, w2_q, ExpertQuant("fp8_block", a_s, w1_s, w2_s)
    assert mode == "fp8_per_tensor"
    s1 = (torch.rand(E, device=device) + 0.5) / 64
    s1g = (torch.rand(E, device=device) + 0.5) / 64
    s2 = (torch.rand(E, device=device) + 0.5) / 64
    q = ExpertQuant(
        "fp8_per_tensor",
        output1_scales_scalar=s1,
        output1_scales_gate_scalar=s1g,
        output2_scales_scalar=s2,
    )
    # Up rows with the up scale, gate rows with the gate scale (as the Definition applies).
    w1_q = torch.cat([w1[:, :I] / s1[:, None, None], w1[:, I:] / s1g[:, None, None]], dim=1).to(FP8)
    w2_q = (w2 / s2[:, None, None]).to(FP8)
    return x.to(FP8), w1_q, w2_q, q


def assert_close_to_ref(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    diff = out.float() - ref
    assert torch.isfinite(out.float()).all()
    rel = (diff.norm() / ref.norm().clamp_min(1e-12)).item()
    assert rel < REL_NORM, f"relative norm error {rel:.2e}"
    # Per row, rows with no local route must be exact zeros.
    # (an all-zero reference, no local route anywhere, still compares: floor above 0)
    floor = max(1e-3 * ref.norm().item() / max(ref.shape[0], 1) ** 0.5, 1e-12)
    row = diff.norm(dim=1) / ref.norm(dim=1).clamp_min(floor)
    assert row.max().item() < ROW_REL_NORM, f"worst row error {row.max().item():.2e}"
    empty = ref.abs().sum(1) == 0
    assert (out[empty] == 0).all()


# name: (mode, H, I, local experts E, global experts, top_k)
MODELS = {
    "deepseek-v3": ("fp8_block", 7168, 2048, 32, 256, 8),
    "qwen3-30b-a3b": ("fp8_per_tensor", 2048, 768, 128, 128, 8),
    "qwen3-30b-a3b-bf16": ("bf16", 2048, 768, 128, 128, 8),
    "gpt-oss-like": ("bf16", 2880, 2880, 32, 128, 4),
}

"""The fused-MoE expert computation: routed tokens through their experts' SwiGLU MLPs.

`fused_experts` is the part of a MoE layer after routing: given each token's top-k GLOBAL
expert ids and weights, it runs every (token, k) pair whose expert is local to this rank
through GEMM1 (W13, gate/up) -> SwiGLU -> GEMM2 (W2, down) and sums the weighted results
per token. Semantics follow FlashInfer-Trace's MoE Definitions (`moe_fp8_block_scale_*`,
`trtllm_fp8_per_tensor_scale_moe_*`), whose references dequantize everything to fp32:

    G1 = A @ W13_e^T            [2I]
    X1, X2 = G1[:I], G1[I:]
    C = silu(X2) * X1           (silu on the SECOND half, as the Definitions do)
    O = C @ W2_e^T              [H]
    out[t] += w[t, k] * O       (fp32 accumulation, bf16 result)

`fused_experts_torch` is that loop in plain PyTorch: the fallback where no kernel runs and
the reference the tests compare the Triton path with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch

from flashtune import env, platform
from flashtune.ops.call import field_index
from flashtune.ops.gemm.launch import split_k_counters
from flashtune.ops.moe import grid
from flashtune.ops.moe.align import align_routes
from flashtune.ops.moe.config import (
    DIRECT_MAX_ROUTES,
    QUANT_BLOCK,
    MoETactic,
    candidates,
    default_tactic,
    tactic_ok,
)
from flashtune.ops.moe.direct import launch_direct, within_direct_limit
from flashtune.ops.moe.kernels import (
    _moe_combine_kernel,
    _moe_gemm1_swiglu_kernel,
    _moe_gemm2_kernel,
)
from flashtune.ops.pdl import launch_options, use_pdl
from flashtune.tune import (
    DEFAULT_TACTIC,
    DynamicDim,
    Tactic,
    TunableRunner,
    TuningConfig,
    choose_one,
)

__all__ = [
    "QUANT_BLOCK",
    "ExpertQuant",
    "fused_experts",
    "fused_experts_torch",
    "fused_experts_triton",
    "triton_supported",
    "resolve_tactic",
    "ExpertsInputs",
    "FusedExpertsRunner",
    "EXPERTS_RUNNERS",
    "EXPERTS_TUNING",
    "EXPERTS_OP",
]

QuantMode = Literal["bf16", "fp8_block", "fp8_per_tensor"]
_FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class ExpertQuant:
    """How the expert inputs are quantized, and their scales.

    mode "bf16": hidden_states and weights are bf16 (or fp16/fp32); no scales.
    mode "fp8_block": hidden_states, gemm1_weights, gemm2_weights are fp8 e4m3 with
        hidden_states_scale [H/128, T] (transposed, as FlashInfer's), gemm1_weights_scale
        [E_local, 2I/128, H/128], gemm2_weights_scale [E_local, H/128, I/128], all float32.
    mode "fp8_per_tensor": fp8 e4m3 hidden_states and weights with per-expert scales
        output1_scales_scalar [E_local] (applied to the up half X1 of GEMM1's output),
        output1_scales_gate_scalar [E_local] (to the gate half X2), output2_scales_scalar
        [E_local] (to GEMM2's output), as in `trtllm_fp8_per_tensor_scale_moe`; the
        activation's own per-tensor scale is folded into those. An optional
        hidden_states_scale (a scalar tensor) multiplies all of GEMM1's output for callers
        that keep it separate.
    """

    mode: QuantMode = "bf16"
    hidden_states_scale: torch.Tensor | None = None
    gemm1_weights_scale: torch.Tensor | None = None
    gemm2_weights_scale: torch.Tensor | None = None
    output1_scales_scalar: torch.Tensor | None = None
    output1_scales_gate_scalar: torch.Tensor | None = None
    output2_scales_scalar: torch.Tensor | None = None

    def scale(self, name: str) -> torch.Tensor:
        """The scale tensor `name`, which the mode needs (`_check` has made sure it is set)."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f'quant mode "{self.mode}" needs quant.{name}')
        return value


BF16 = ExpertQuant()


def _dequant_blocks(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., R, C] * scale [..., R/128, C/128] expanded to 128x128 blocks, in fp32."""
    s = scale.float().repeat_interleave(QUANT_BLOCK, dim=-2).repeat_interleave(QUANT_BLOCK, dim=-1)
    return x.float() * s[..., : x.shape[-2], : x.shape[-1]]


def _check(
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm2_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    quant: ExpertQuant,
    out: torch.Tensor | None,
) -> None:
    """Shape, dtype and device checks; raises ValueError/TypeError naming the argument."""
    if quant.mode not in ("bf16", "fp8_block", "fp8_per_tensor"):
        raise ValueError(
            f'quant.mode must be "bf16", "fp8_block" or "fp8_per_tensor", got {quant.mode!r}'
        )
    if hidden_states.dim() != 2:
        raise ValueError(f"hidden_states must be [T, H], got shape {tuple(hidden_states.shape)}")
    T, H = hidden_states.shape
    if gemm1_weights.dim() != 3:
        raise ValueError(
            f"gemm1_weights must be [E_local, 2I, H], got {tuple(gemm1_weights.shape)}"
        )
    E, two_i, h1 = gemm1_weights.shape
    if h1 != H or two_i % 2:
        raise ValueError(
            f"gemm1_weights must be [E_local, 2I, H={H}] with an even 2I, "
            f"got {tuple(gemm1_weights.shape)}"
        )
    inter = two_i // 2
    if E == 0 or inter == 0:
        raise ValueError(
            f"gemm1_weights must hold at least one expert (E_local) of I >= 1, "
            f"got {tuple(gemm1_weights.shape)}"
        )
    if tuple(gemm2_weights.shape) != (E, H, inter):
        raise ValueError(
            f"gemm2_weights must be [E_local={E}, H={H}, I={inter}], "
            f"got {tuple(gemm2_weights.shape)}"
        )
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T:
        raise ValueError(f"topk_ids must be [T={T}, K], got {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids must be int32 (or int64), got {topk_ids.dtype}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(
            f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, "
            f"got {tuple(topk_weights.shape)}"
        )
    if not topk_weights.is_floating_point():
        raise TypeError(f"topk_weights must be float32, got {topk_weights.dtype}")
    for name, t in (
        ("gemm1_weights", gemm1_weights),
        ("gemm2_weights", gemm2_weights),
        ("topk_ids", topk_ids),
        ("topk_weights", topk_weights),
    ):
        if t.device != hidden_states.device:
            raise ValueError(f"{name} is on {t.device}, hidden_states on {hidden_states.device}")
    if out is not None:
        if tuple(out.shape) != (T, H) or out.dtype != torch.bfloat16:
            raise ValueError(
                f"out must be a [T={T}, H={H}] bfloat16 tensor, got {tuple(out.shape)} {out.dtype}"
            )
        if out.device != hidden_states.device:
            raise ValueError(f"out is on {out.device}, hidden_states on {hidden_states.device}")
        if H > 1 and out.stride(1) != 1:
            raise ValueError(
                f"out's rows must be contiguous (stride 1), got strides {out.stride()}"
            )

    mode = quant.mode
    operands = (
        ("hidden_states", hidden_states),
        ("gemm1_weights", gemm1_weights),
        ("gemm2_weights", gemm2_weights),
    )
    if mode == "bf16":
        for name, t in operands:
            if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                raise TypeError(f'{name} must be bfloat16 for quant mode "bf16", got {t.dtype}')
        return
    for name, t in operands:
        # fp8_per_tensor also takes 16-bit activations without an activation scale (already
        # dequantized: Llama 4's routing weight applied on the input), upcasting the fp8
        # weight tiles in registers.
        dequantized = (
            name == "hidden_states"
            and mode == "fp8_per_tensor"
            and t.dtype in (torch.bfloat16, torch.float16)
            and quant.hidden_states_scale is None
        )
        if t.dtype != _FP8 and not dequantized:
            raise TypeError(f'{name} must be float8_e4m3fn for quant mode "{mode}", got {t.dtype}')
    if mode == "fp8_block":
        b = QUANT_BLOCK
        if H % b or inter % b:
            raise ValueError(f"fp8_block needs H and I multiples of {b}, got H={H}, I={inter}")
        want = {
            "hidden_states_scale": (quant.hidden_states_scale, (H // b, T)),
            "gemm1_weights_scale": (quant.gemm1_weights_scale, (E, two_i // b, H // b)),
            "gemm2_weights_scale": (quant.gemm2_weights_scale, (E, H // b, inter // b)),
        }
    elif mode == "fp8_per_tensor":
        want = {
            "output1_scales_scalar": (quant.output1_scales_scalar, (E,)),
            "output1_scales_gate_scalar": (quant.output1_scales_gate_scalar, (E,)),
            "output2_scales_scalar": (quant.output2_scales_scalar, (E,)),
        }
        s = quant.hidden_states_scale
        if s is not None and (s.numel() != 1 or not s.is_floating_point()):
            raise ValueError(
                "fp8_per_tensor's hidden_states_scale must be one float value, got "
                f"shape {tuple(s.shape)} {s.dtype}"
            )
        if s is not None and s.device != hidden_states.device:
            raise ValueError(
                f"quant.hidden_states_scale is on {s.device}, hidden_states on "
                f"{hidden_states.device}"
            )
    else:
        raise ValueError(
            f'quant.mode must be "bf16", "fp8_block" or "fp8_per_tensor", got {mode!r}'
        )
    for name, (given, shape) in want.items():
        if given is None:
            raise ValueError(f'quant mode "{mode}" needs quant.{name} of shape {shape}')
        if tuple(given.shape) != shape:
            raise ValueError(f"quant.{name} must have shape {shape}, got {tuple(given.shape)}")
        if given.dtype != torch.float32:
            raise TypeError(f"quant.{name} must be float32, got {given.dtype}")
        if given.device != hidden_states.device:
            raise ValueError(
                f"quant.{name} is on {given.device}, hidden_states on {hidden_states.device}"
            )


@torch.no_grad()
def fused_experts_torch(
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm2_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    quant: ExpertQuant = BF16,
    local_expert_offset: int = 0,
) -> torch.Tensor:
    """The expert computation in plain PyTorch, fp32 throughout (the Definitions' math).

    A loop over the local experts that have tokens; each (token, k) pair counts once, so a
    token listing one expert twice gets both weights (the Definitions' routings never do).
    Returns [T, H] float32 (callers cast).
    """
    T, H = hidden_states.shape
    E, two_i, _ = gemm1_weights.shape
    inter = two_i // 2
    mode = quant.mode
    if mode == "fp8_block":
        # hidden_states_scale is [H/128, T]: one scale per token and 128-wide group
        a_scale = (
            quant.scale("hidden_states_scale").t().float().repeat_interleave(QUANT_BLOCK, dim=1)
        )
        a = hidden_states.float() * a_scale
    else:
        a = hidden_states.float()
    if mode == "fp8_per_tensor" and quant.hidden_states_scale is not None:
        a = a * quant.hidden_states_scale.float().reshape(())
    output = torch.zeros(T, H, dtype=torch.float32, device=hidden_states.device)
    local = topk_ids.long() - int(local_expert_offset)  # [T, K] local ids, others out of range
    for e in torch.unique(local[(local >= 0) & (local < E)]).tolist():
        tok, kk = torch.nonzero(local == e, as_tuple=True)
        w13 = gemm1_weights[e]
        w2 = gemm2_weights[e]
        if mode == "fp8_block":
            w13 = _dequant_blocks(w13, quant.scale("gemm1_weights_scale")[e])
            w2 = _dequant_blocks(w2, quant.scale("gemm2_weights_scale")[e])
        g1 = a[tok] @ w13.float().t()  # [n, 2I]
        x1, x2 = g1[:, :inter], g1[:, inter:]
        if mode == "fp8_per_tensor":
            x1 = x1 * quant.scale("output1_scales_scalar")[e]
            x2 = x2 * quant.scale("output1_scales_gate_scalar")[e]
        c = torch.nn.functional.silu(x2) * x1
        o = c @ w2.float().t()  # [n, H]
        if mode == "fp8_per_tensor":
            o = o * quant.scale("output2_scales_scalar")[e]
        output.index_add_(0, tok, o * topk_weights[tok, kk].float().unsqueeze(1))
    return output


_QUANT_CODE = {"bf16": 0, "fp8_block": 1, "fp8_per_tensor": 2}
_COMBINE_BLOCK_H = 1024


def triton_supported(
    hidden_states: torch.Tensor, gemm1_weights: torch.Tensor, quant: ExpertQuant
) -> bool:
    """Whether the Triton path runs this call: a device Triton can launch on, and 16-bit
    or fp8 operands, or 16-bit activations with float32 weights (cast to the activations'
    type in registers: the fp4 Definitions' float32-weight contract reads each weight once,
    where a converted copy read 4 bytes, wrote 2 and read 2 again). fp32 activations, or
    16-bit weights of the other 16-bit type, take the PyTorch path."""
    if not platform.kernels_available(hidden_states.device):
        return False
    if quant.mode == "bf16":
        return hidden_states.dtype in (torch.bfloat16, torch.float16) and (
            gemm1_weights.dtype in (hidden_states.dtype, torch.float32)
        )
    return True


def resolve_tactic(
    tactic: Tactic | MoETactic | None,
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    top_k: int,
    quant: ExpertQuant,
) -> MoETactic:
    """The MoETactic of a call: `tactic` itself (a MoETactic or its 14-int tuple), or the
    default of the call's regime for None / -1; ValueError for a tactic that cannot run."""
    fp8_block = quant.mode == "fp8_block"
    a_size, w_size = hidden_states.element_size(), gemm1_weights.element_size()
    if tactic is None or tactic == DEFAULT_TACTIC:
        return default_tactic(
            hidden_states.shape[0],
            top_k,
            gemm1_weights.shape[0],
            fp8_block=fp8_block,
            a_itemsize=a_size,
            w_itemsize=w_size,
            inter=gemm1_weights.shape[1] // 2,
            hidden=hidden_states.shape[1],
            sm_count=platform.device_limits(hidden_states.device).sm_count,
        )
    t = MoETactic.from_tactic(tactic)
    if not tactic_ok(t, fp8_block=fp8_block, a_itemsize=a_size, w_itemsize=w_size):
        raise ValueError(
            f"tactic {t} cannot run here (tiles >= 16, BLOCK_K dividing 128 for fp8_block, "
            "shared memory within 227 KB)"
        )
    routes = hidden_states.shape[0] * top_k
    if t.direct and routes > DIRECT_MAX_ROUTES:
        raise ValueError(
            f"tactic {t} takes the direct decode path, which runs at most "
            f"{DIRECT_MAX_ROUTES} routes (T * top_k); this call has {routes}"
        )
    return t


def fused_experts_triton(
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm2_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    quant: ExpertQuant = BF16,
    local_expert_offset: int = 0,
    out: torch.Tensor | None = None,
    tactic: Tactic | MoETactic | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """The Triton path (inputs already checked): align, GEMM1 + SwiGLU, GEMM2, combine.

    No host sync (the grids are sized from shapes; the persistent GEMM programs read how
    many M-blocks hold routes on the device), so the call can be captured in a CUDA graph."""
    T, H = hidden_states.shape
    E, two_i, _ = gemm1_weights.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    device = hidden_states.device
    if out is None:
        out = torch.empty(T, H, dtype=torch.bfloat16, device=device)
    if T == 0:
        return out
    t = resolve_tactic(tactic, hidden_states, gemm1_weights, top_k, quant)
    # The launches (alignment, GEMM1, GEMM2, combine; the direct path's two) chain with PDL
    # where it is on.
    pdl = use_pdl(device, enable_pdl)
    mode = quant.mode
    qcode = _QUANT_CODE[mode]
    # The interpreter's tl.dot is wrong on bf16 operands: upcast there (kernels.py).
    dot_f32 = device.type == "cpu"
    dummy = topk_weights  # any fp32 tensor: never read where a scale is absent

    if mode == "fp8_block":
        a_scale = quant.scale("hidden_states_scale")
        w1_scale = quant.scale("gemm1_weights_scale")
        w2_scale = quant.scale("gemm2_weights_scale")
        up_s = gate_s = out_s = dummy
        has_a_scale = True
    elif mode == "fp8_per_tensor":
        has_a_scale = quant.hidden_states_scale is not None
        a_scale = (
            quant.hidden_states_scale.reshape(1) if quant.hidden_states_scale is not None else dummy
        )
        w1_scale = w2_scale = dummy
        up_s = quant.scale("output1_scales_scalar")
        gate_s = quant.scale("output1_scales_gate_scalar")
        out_s = quant.scale("output2_scales_scalar")
    else:
        a_scale = w1_scale = w2_scale = up_s = gate_s = out_s = dummy
        has_a_scale = False

    def strides3(x: torch.Tensor) -> tuple[int, int, int]:
        return tuple(x.stride()) if x.dim() == 3 else (0, 0, 0)  # type: ignore[return-value]

    def strides2(x: torch.Tensor) -> tuple[int, int]:
        return tuple(x.stride()) if x.dim() == 2 else (0, 0)  # type: ignore[return-value]

    a_scale_strides = strides2(a_scale) if mode == "fp8_block" else (0, 0)
    # C in 16 bits: fp16 for fp16 inputs, else bf16 (bf16's range), fp16 with fp8 weights on
    # request (kernels.py says why C is not re-quantized to fp8).
    c_dtype = torch.float16 if hidden_states.dtype == torch.float16 else torch.bfloat16
    if gemm2_weights.element_size() == 1 and env.MOE_FP8_C_FP16.get():
        c_dtype = torch.float16  # docs/moe-kernels: faster, saturates at 65504
    if t.direct:
        return launch_direct(
            hidden_states,
            gemm1_weights,
            gemm2_weights,
            topk_ids,
            topk_weights,
            out,
            t,
            qcode=qcode,
            local_expert_offset=local_expert_offset,
            a_scale=a_scale,
            a_scale_strides=a_scale_strides,
            has_a_scale=has_a_scale,
            w1_scale=w1_scale,
            w1_scale_strides=strides3(w1_scale),
            w2_scale=w2_scale,
            w2_scale_strides=strides3(w2_scale),
            up_scale=up_s,
            gate_scale=gate_s,
            out_scale=out_s,
            c_dtype=c_dtype,
            pdl=pdl,
        )
    al = align_routes(topk_ids, E, local_expert_offset, t.block_m, pdl=pdl)
    num_routes = topk_ids.numel()
    P = al.num_blocks * t.block_m
    c = torch.empty(P, inter, dtype=c_dtype, device=device)
    # GEMM2's per-route rows in bf16, summed in fp32 by the combine: fp32 rows were the most
    # traffic at many tokens (H200, DeepSeek-V3 EP8 T=4096 all local: 940 MB, 233 us of
    # combine; error 2.9e-3 -> 3.3e-3). fp32 in the interpreter (its bf16 stores truncate).
    o_dtype = torch.float32 if dot_f32 else torch.bfloat16
    o = torch.empty(P, H, dtype=o_dtype, device=device)

    g1, g2 = t.gemm1, t.gemm2
    a_size, w_size = hidden_states.element_size(), gemm1_weights.element_size()
    # Split tiles (max_split > 1): the grid is the host's bound on the tiles as without
    # splits, but at least two programs an SM (and at most max_split a tile), so that when
    # fewer tiles are in use than fill the SMs (an EP rank's decode touches one expert of
    # the eight routed; wide tiles over few experts) the idle programs take K parts. One
    # fp32 partial a program in the workspace; counters shared with the GEMM family's
    # split-K (left zero by every launch).
    floor = 0
    if t.max_split > 1:
        floor = (
            grid.INTERPRETER_PROGRAMS
            if device.type == "cpu"
            else _SPLIT_PROGRAMS_PER_SM * platform.device_limits(device).sm_count
        )
    host1 = al.num_blocks * t.gemm1_sub * _cdiv(inter, g1.block_n)
    host2 = al.num_blocks * _cdiv(H, g2.block_n)
    tiles1 = max(host1, min(floor, host1 * t.max_split))
    tiles2 = max(host2, min(floor, host2 * t.max_split))
    smem = t.smem_bytes(a_size, w_size)
    grid1 = (grid.persistent_programs(device, tiles1, smem),)
    grid2 = (grid.persistent_programs(device, tiles2, smem),)
    if t.max_split > 1:
        ws1 = torch.empty(
            grid1[0] * 2 * t.gemm1_rows * g1.block_n, dtype=torch.float32, device=device
        )
        ws2 = torch.empty(grid2[0] * t.block_m * g2.block_n, dtype=torch.float32, device=device)
        locks = split_k_counters(device, max(grid1[0], grid2[0]))
    else:
        ws1 = ws2 = locks = dummy
    _moe_gemm1_swiglu_kernel[grid1](
        hidden_states,
        gemm1_weights,
        c,
        al.sorted_ids,
        al.block_expert,
        al.used_blocks,
        a_scale,
        w1_scale,
        up_s,
        gate_s,
        ws1,
        locks,
        num_routes,
        H,
        inter,
        top_k,
        *hidden_states.stride(),
        *gemm1_weights.stride(),
        *c.stride(),
        *a_scale_strides,
        *strides3(w1_scale),
        QUANT=qcode,
        HAS_A_SCALE=has_a_scale,
        DOT_F32=dot_f32,
        EVEN_K=H % g1.block_k == 0,
        BLOCK_M=t.gemm1_rows,
        BLOCK_N=g1.block_n,
        BLOCK_K=g1.block_k,
        GROUP_M=g1.group_m,
        SWAP_AB=t.swap1,
        MAX_SPLIT=t.max_split,
        SUB=t.gemm1_sub,
        USE_PDL=pdl,
        num_warps=g1.num_warps,
        num_stages=g1.num_stages,
        **launch_options(pdl),
    )
    _moe_gemm2_kernel[grid2](
        c,
        gemm2_weights,
        o,
        al.sorted_ids,
        al.block_expert,
        al.used_blocks,
        w2_scale,
        out_s,
        ws2,
        locks,
        num_routes,
        H,
        inter,
        *c.stride(),
        *gemm2_weights.stride(),
        *o.stride(),
        *strides3(w2_scale),
        QUANT=qcode,
        DOT_F32=dot_f32,
        EVEN_K=inter % g2.block_k == 0,
        BLOCK_M=t.block_m,
        BLOCK_N=g2.block_n,
        BLOCK_K=g2.block_k,
        GROUP_M=g2.group_m,
        SWAP_AB=t.swap2,
        MAX_SPLIT=t.max_split,
        USE_PDL=pdl,
        num_warps=g2.num_warps,
        num_stages=g2.num_stages,
        **launch_options(pdl),
    )
    block_h = min(_COMBINE_BLOCK_H, _next_pow2(H))
    _moe_combine_kernel[(T, _cdiv(H, block_h))](
        o,
        al.route_pos,
        topk_weights,
        out,
        H,
        top_k,
        o.stride(0),
        *topk_weights.stride(),
        out.stride(0),
        BLOCK_H=block_h,
        USE_PDL=pdl,
        num_warps=4,
        **launch_options(pdl),
    )
    return out


# Programs an SM a split launch's grid has at least (when the tiles allow that many parts).
_SPLIT_PROGRAMS_PER_SM = 2


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def fused_experts(
    hidden_states: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm2_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    quant: ExpertQuant = BF16,
    local_expert_offset: int = 0,
    out: torch.Tensor | None = None,
    tactic: Tactic | MoETactic | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Run each token's local top-k experts (SwiGLU MLPs) and sum them, weighted.

    hidden_states [T, H] bf16 or fp8 e4m3 (see `ExpertQuant`); gemm1_weights [E_local, 2I, H]
    (up rows first, then gate rows); gemm2_weights [E_local, H, I]; topk_ids [T, K] int32
    GLOBAL expert ids, of which only [local_expert_offset, local_expert_offset + E_local) are
    computed here; topk_weights [T, K] float32. Returns out ([T, H] bfloat16, allocated if
    not given). `tactic` picks the kernels' tile configs (None / -1: the default of the
    call's regime; a `config.MoETactic` or its 14-int tuple otherwise). `enable_pdl`: the
    kernels chain with programmatic dependent launch (None: `ops.pdl.PDL_BY_DEFAULT`, on
    Hopper and later).

    The Triton kernels run where Triton can launch (a GPU, or the interpreter on CPU) for
    16-bit or fp8 operands; anything else takes `fused_experts_torch`.
    """
    _check(hidden_states, gemm1_weights, gemm2_weights, topk_ids, topk_weights, quant, out)
    if triton_supported(hidden_states, gemm1_weights, quant) and gemm2_weights.dtype == (
        gemm1_weights.dtype
    ):
        topk_weights = topk_weights.float()
        if tactic is None:
            # The tuner's pick for this shape bucket (inside autotune(): profiled first),
            # else -1, the regime's default.
            inputs = ExpertsInputs.of(
                hidden_states,
                gemm1_weights,
                gemm2_weights,
                topk_ids,
                topk_weights,
                quant,
                local_expert_offset,
            )
            _, tactic = choose_one(EXPERTS_OP, EXPERTS_RUNNERS, EXPERTS_TUNING, inputs)
            tactic = within_direct_limit(tactic, topk_ids.numel())
        return fused_experts_triton(
            hidden_states,
            gemm1_weights,
            gemm2_weights,
            topk_ids,
            topk_weights,
            quant=quant,
            local_expert_offset=local_expert_offset,
            out=out,
            tactic=tactic,
            enable_pdl=enable_pdl,
        )
    result = fused_experts_torch(
        hidden_states,
        gemm1_weights,
        gemm2_weights,
        topk_ids,
        topk_weights,
        quant=quant,
        local_expert_offset=local_expert_offset,
    )
    if out is None:
        return result.to(torch.bfloat16)
    out.copy_(result)
    return out


class ExpertsInputs(NamedTuple):
    """FusedExpertsRunner's inputs: the call's tensors, each scale of ExpertQuant as its own
    input (so the tuner's key, made of shapes and dtypes, tells the modes apart: only
    fp8_block has gemm1_weights_scale, only fp8_per_tensor output1_scales_scalar)."""

    hidden_states: torch.Tensor  # [T, H]
    gemm1_weights: torch.Tensor  # [E, 2I, H]
    gemm2_weights: torch.Tensor  # [E, H, I]
    topk_ids: torch.Tensor  # [T, K] int32
    topk_weights: torch.Tensor  # [T, K] float32
    hidden_states_scale: torch.Tensor | None  # fp8_block [H/128, T]; fp8_per_tensor [1]
    gemm1_weights_scale: torch.Tensor | None
    gemm2_weights_scale: torch.Tensor | None
    output1_scales_scalar: torch.Tensor | None
    output1_scales_gate_scalar: torch.Tensor | None
    output2_scales_scalar: torch.Tensor | None
    local_expert_offset: int

    @classmethod
    def of(
        cls,
        hidden_states: torch.Tensor,
        gemm1_weights: torch.Tensor,
        gemm2_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        quant: ExpertQuant,
        local_expert_offset: int,
    ) -> ExpertsInputs:
        return cls(
            hidden_states,
            gemm1_weights,
            gemm2_weights,
            topk_ids,
            topk_weights,
            quant.hidden_states_scale,
            quant.gemm1_weights_scale,
            quant.gemm2_weights_scale,
            quant.output1_scales_scalar,
            quant.output1_scales_gate_scalar,
            quant.output2_scales_scalar,
            int(local_expert_offset),
        )

    @property
    def quant(self) -> ExpertQuant:
        if self.gemm1_weights_scale is not None:
            mode: QuantMode = "fp8_block"
        elif self.output1_scales_scalar is not None:
            mode = "fp8_per_tensor"
        else:
            mode = "bf16"
        return ExpertQuant(mode, *self[5:11])


class FusedExpertsRunner(TunableRunner):
    """The Triton path as an autotuner runner over `ExpertsInputs` (a plain sequence of
    the same fields works too); tactics: `MoETactic.as_tactic()` tuples of
    config.candidates for the call's regime."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        a = ExpertsInputs(*inputs)
        return [
            t.as_tactic()
            for t in candidates(
                a.hidden_states.shape[0],
                a.topk_ids.shape[1],
                a.gemm1_weights.shape[0],
                fp8_block=a.gemm1_weights_scale is not None,
                a_itemsize=a.hidden_states.element_size(),
                w_itemsize=a.gemm1_weights.element_size(),
            )
        ]

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> torch.Tensor:
        a = ExpertsInputs(*inputs)
        return fused_experts_triton(
            a.hidden_states,
            a.gemm1_weights,
            a.gemm2_weights,
            a.topk_ids,
            a.topk_weights,
            quant=a.quant,
            local_expert_offset=a.local_expert_offset,
            tactic=tactic,
        )


def _tuning_inputs(inputs: Sequence[Any], profile: Any) -> list[Any]:
    """Random valid inputs at the profile's token count: fresh activations (and their
    block scales), routes spread over the local experts (every route computed: the busiest
    rank), the caller's weights and weight scales (read only; too large to copy)."""
    a = ExpertsInputs(*inputs)
    T = int(profile[0][0])
    H = a.hidden_states.shape[1]
    E, K = a.gemm1_weights.shape[0], a.topk_ids.shape[1]
    dev = a.hidden_states.device
    x = torch.randn(T, H, device=dev).to(a.hidden_states.dtype)
    scores = torch.rand(T, max(E, K), device=dev)
    ids = (scores.topk(K, dim=1).indices % E + a.local_expert_offset).to(a.topk_ids.dtype)
    weights = torch.rand(T, K, device=dev, dtype=a.topk_weights.dtype) + 0.1
    hs_scale = a.hidden_states_scale
    if hs_scale is not None and hs_scale.dim() == 2:  # fp8_block: [H/128, T]
        hs_scale = torch.rand(hs_scale.shape[0], T, device=dev) + 0.5
    return list(
        a._replace(
            hidden_states=x, topk_ids=ids, topk_weights=weights, hidden_states_scale=hs_scale
        )
    )


def _token_bucket(shapes: Sequence[torch.Size]) -> int:
    return int(shapes[0][0])


EXPERTS_RUNNERS: tuple[TunableRunner, ...] = (FusedExpertsRunner(),)
# Tuned per power-of-two bucket of T; topk_ids, topk_weights and the fp8_block activation
# scales follow T. key_dtypes: bf16 and fp8 weights of one shape want different tiles.
EXPERTS_TUNING = TuningConfig(
    dynamic_dims=(DynamicDim(field_index(ExpertsInputs, "hidden_states"), 0),),
    constraints=(
        (field_index(ExpertsInputs, "topk_ids"), 0, _token_bucket),
        (field_index(ExpertsInputs, "topk_weights"), 0, _token_bucket),
        (field_index(ExpertsInputs, "hidden_states_scale"), -1, _token_bucket),
    ),
    make_inputs=_tuning_inputs,
    key_dtypes=True,
    use_cuda_graph=True,
)
EXPERTS_OP = "flashtune::fused_moe_experts"

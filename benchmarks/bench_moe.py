"""Fused-MoE expert computation benchmark (issue 35): flashtune's Triton fused_experts against
a torch baseline of per-expert matmuls.

Cases (--models):
- deepseek-v3: fp8 block scales, H 7168, I 2048, 32 local experts of 256 (EP 8), top-8.
  Two routings: "uniform" (top-8 of all 256: about one route in eight is local, as on a
  real EP-8 rank) and "local" (every route to this rank's 32: the busiest rank).
- qwen3-30b-a3b: H 2048, I 768, 128 experts (EP 1), top-8, fp8 per-tensor and bf16.
At T in 1, 2, 4, ..., 4096 (--tokens).

Solutions:
- flashtune: `fused_experts` with its default tactic (tactic -1 of config.py's regime);
- flashtune_no_pdl (--pdl-ab): the default without programmatic dependent launch between
  the four kernels (flashtune's default chains them with it on Hopper);
- flashtune_direct (--direct): each of the tuner's direct-path candidates (config.py's
  MoETactic.direct: no alignment or combine launch) at decode sizes, one row per tactic
  (a comparison of tactics, not a selection);
- flashtune_tuned (--sweep): the fastest of config.candidates, selected in one process and
  re-timed on fresh inputs in a second one (common.Selection: selection is not measurement);
- torch: per-expert bf16 matmuls (gate/up GEMM, SwiGLU, down GEMM, index_add_) over the
  touched experts, with the weights dequantized to bf16 ahead of time and the routes sorted
  per expert outside the timed region (the baseline is given its routing for free; its
  weights are twice the bytes of fp8).
- torch_grouped: torch's grouped GEMM (`torch._grouped_mm`, CUTLASS on Hopper) for both
  projections over the routes sorted by expert, SwiGLU between them and a weighted
  index_add_ combine; bf16 weights (torch has no grouped GEMM for DeepSeek's block-scaled
  fp8), the same free routing as `torch`. The stronger of the two torch peers is the bar.

Timing: flashtune.timing.measure in CUDA graphs (each graph replays one call per input
set). Input sets rotate routings and activations over shared weights, so the experts a
decode call touches change from call to call and their weights come from HBM, not L2.

Columns: latency_ms; bandwidth_gbs = bytes of the touched experts' weights in the
solution's storage format / latency (the decode figure of merit: the weights of touched
experts are the traffic that cannot be avoided); tflops over the local routes;
touched_experts and weight_bytes (mean over the input sets); rel_err of the output against
the torch path of flashtune (fp32 dequantized reference).

Writes benchmarks/results/moe.jsonl (and $OUT/moe.jsonl).
Usage: python benchmarks/bench_moe.py [--models deepseek-v3,qwen3-30b-a3b] [--tokens 1,16,512]
       [--sweep] [--quick] [--budget-s 480] [--profile] [--pdl-ab] [--direct]
--profile prints each kernel's GPU time of the default tactic (torch.profiler, eager) beside
the rows: how a call splits between alignment, the two GEMMs and the combine.
Each process stops starting new cases after --budget-s seconds (rows already written stay):
480 fits one 10-minute device call; with --sweep two processes run (selection, then
measurement), so give each about half, or sweep a few models/tokens at a time.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    RowWriter,
    Selection,
    copy_bandwidth_gbs,
    profile_kernels,
    try_peer,
)

from flashtune.ops.moe import config as cfg  # noqa: E402
from flashtune.ops.moe.experts import (  # noqa: E402
    ExpertQuant,
    ExpertsInputs,
    FusedExpertsRunner,
    fused_experts,
    fused_experts_torch,
)
from flashtune.timing import l2_bytes, measure  # noqa: E402

FP8 = torch.float8_e4m3fn
OP = "fused_moe_experts"
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
QUICK_TOKENS = [1, 16, 512]
MAX_SETS = 16


@dataclass(frozen=True)
class Case:
    model: str
    mode: str  # ExpertQuant.mode
    H: int
    I: int  # noqa: E741
    E: int  # local experts
    E_global: int
    K: int
    offset: int
    routing: str  # "uniform" over E_global, or "local": every route to this rank

    def shape(self, T: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "mode": self.mode,
            "T": T,
            "H": self.H,
            "I": self.I,
            "E_local": self.E,
            "E_global": self.E_global,
            "top_k": self.K,
            "local_expert_offset": self.offset,
            "routing": self.routing,
        }

    def key(self, T: int) -> str:
        return f"{self.model},{self.mode},{self.routing},{T}"


CASES = {
    "deepseek-v3": [
        Case("deepseek-v3", "fp8_block", 7168, 2048, 32, 256, 8, 0, "uniform"),
        Case("deepseek-v3", "fp8_block", 7168, 2048, 32, 256, 8, 0, "local"),
    ],
    "qwen3-30b-a3b": [
        Case("qwen3-30b-a3b", "fp8_per_tensor", 2048, 768, 128, 128, 8, 0, "uniform"),
        Case("qwen3-30b-a3b", "bf16", 2048, 768, 128, 128, 8, 0, "uniform"),
    ],
}


def make_weights(case: Case, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, dict, tuple]:
    """Quantized weights (the solution's), the quant scales, and bf16 dequantized copies
    with every scale folded in (the torch baseline's)."""
    E, H, I = case.E, case.H, case.I  # noqa: E741
    w1 = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) / H**0.5
    w2 = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) / I**0.5
    if case.mode == "bf16":
        return w1, w2, {}, (w1, w2)
    if case.mode == "fp8_block":
        b = cfg.QUANT_BLOCK
        s1 = (torch.rand(E, 2 * I // b, H // b, device=dev) + 0.5) / 64
        s2 = (torch.rand(E, H // b, I // b, device=dev) + 0.5) / 64

        def expand(s: torch.Tensor) -> torch.Tensor:
            return s.repeat_interleave(b, 1).repeat_interleave(b, 2)

        q1 = (w1.float() / expand(s1)).to(FP8)
        q2 = (w2.float() / expand(s2)).to(FP8)
        deq = ((q1.float() * expand(s1)).bfloat16(), (q2.float() * expand(s2)).bfloat16())
        return q1, q2, {"gemm1_weights_scale": s1, "gemm2_weights_scale": s2}, deq
    s1 = (torch.rand(E, device=dev) + 0.5) / 64
    s1g = (torch.rand(E, device=dev) + 0.5) / 64
    s2 = (torch.rand(E, device=dev) + 0.5) / 64
    q1 = torch.cat(
        [w1[:, :I].float() / s1[:, None, None], w1[:, I:].float() / s1g[:, None, None]], 1
    )
    q1 = q1.to(FP8)
    q2 = (w2.float() / s2[:, None, None]).to(FP8)
    d1 = torch.cat(
        [q1[:, :I].float() * s1[:, None, None], q1[:, I:].float() * s1g[:, None, None]], 1
    )
    deq = (d1.bfloat16(), (q2.float() * s2[:, None, None]).bfloat16())
    scales = {
        "output1_scales_scalar": s1,
        "output1_scales_gate_scalar": s1g,
        "output2_scales_scalar": s2,
    }
    return q1, q2, scales, deq


def make_set(case: Case, T: int, dev: torch.device, scales: dict) -> dict[str, Any]:
    """One input set: activations, a routing, and the baseline's per-expert route lists."""
    H = case.H
    if case.routing == "local":
        scores = torch.rand(T, case.E, device=dev)
        ids = (scores.topk(case.K, 1).indices + case.offset).to(torch.int32)
    else:
        ids = torch.rand(T, case.E_global, device=dev).topk(case.K, 1).indices.to(torch.int32)
    w = torch.rand(T, case.K, device=dev) + 0.1
    w = w / w.sum(1, keepdim=True)
    x = torch.randn(T, H, device=dev)
    if case.mode == "fp8_block":
        a_s = torch.rand(H // cfg.QUANT_BLOCK, T, device=dev) + 0.5
        xq = (x / a_s.t().repeat_interleave(cfg.QUANT_BLOCK, 1)).to(FP8)
        quant = ExpertQuant("fp8_block", a_s, **scales)
        x_deq = (xq.float() * a_s.t().repeat_interleave(cfg.QUANT_BLOCK, 1)).bfloat16()
    elif case.mode == "fp8_per_tensor":
        xq = x.to(FP8)
        quant = ExpertQuant("fp8_per_tensor", **scales)
        x_deq = xq.bfloat16()
    else:
        xq = x.bfloat16()
        quant = ExpertQuant()
        x_deq = xq
    # The baseline's routing, computed here (outside the timed region): per touched expert,
    # its tokens and their weights.
    local = ids.long() - case.offset
    plan = []
    for e in torch.unique(local[(local >= 0) & (local < case.E)]).tolist():
        tok, kk = torch.nonzero(local == e, as_tuple=True)
        plan.append((e, tok, w[tok, kk].unsqueeze(1)))
    # The grouped peer's routing: every local route sorted by expert, with the group ends
    # (`offs`, one per local expert, empty groups allowed) that torch._grouped_mm takes.
    tok_sorted = torch.cat([tok for _, tok, _ in plan]) if plan else ids.new_zeros(0).long()
    w_sorted = torch.cat([wt for _, _, wt in plan]) if plan else w.new_zeros(0, 1)
    counts = torch.zeros(case.E, dtype=torch.int32, device=dev)
    for e, tok, _ in plan:
        counts[e] = tok.numel()
    grouped = (tok_sorted, w_sorted, counts.cumsum(0, dtype=torch.int32))
    return {
        "x": xq,
        "ids": ids,
        "w": w,
        "quant": quant,
        "x_deq": x_deq,
        "plan": plan,
        "grouped": grouped,
    }


def torch_baseline(x_deq, plan, w13, w2, out32, I):  # noqa: E741
    """Per-expert bf16 matmuls over the touched experts (the routing precomputed)."""
    out32.zero_()
    for e, tok, wt in plan:
        g = x_deq[tok] @ w13[e].t()
        c = torch.nn.functional.silu(g[:, I:]) * g[:, :I]
        out32.index_add_(0, tok, (c @ w2[e].t()).float() * wt)
    return out32.to(torch.bfloat16)


def torch_grouped(x_deq, grouped, w13t, w2t, out32, I):  # noqa: E741
    """torch._grouped_mm over the routes sorted by expert (weights [E, K, N] column-major,
    the layout its Hopper kernel takes: a transposed view of the stored [E, N, K])."""
    tok, wt, offs = grouped
    g = torch._grouped_mm(x_deq[tok], w13t, offs=offs)
    c = torch.nn.functional.silu(g[:, I:]) * g[:, :I]
    o = torch._grouped_mm(c, w2t, offs=offs)
    out32.zero_()
    out32.index_add_(0, tok, o.float() * wt)
    return out32.to(torch.bfloat16)


def timed(fn, sets: list[list[Any]], calls: int) -> float:
    return measure(
        fn,
        sets[0],
        input_sets=sets,
        warmup=2,
        repetitions=10,
        use_cuda_graph=True,
        calls_per_graph=calls,
        max_seconds=5.0,
    ).median_ms


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def run_case(
    case,
    T,
    dev,
    weights,
    sel: Selection,
    writer: RowWriter | None,
    tactic_sweep,
    profile=False,
    pdl_ab=False,
    direct=False,
):
    q1, q2, scales, (d1, d2) = weights
    elem = q1.element_size()
    expert_bytes = 3 * case.H * case.I * elem
    set_bytes = max(1, min(case.E, T * case.K)) * expert_bytes
    n_sets = max(2, min(MAX_SETS, -(-2 * l2_bytes(dev) // set_bytes)))
    sets = [make_set(case, T, dev, scales) for _ in range(n_sets)]
    touched = sum(len(s["plan"]) for s in sets) / n_sets
    routes = sum(sum(len(p[1]) for p in s["plan"]) for s in sets) / n_sets
    flops = routes * 2 * 3 * case.H * case.I
    ours_sets = [[s["x"], s["ids"], s["w"], s["quant"]] for s in sets]

    def ours(tactic, enable_pdl=None):
        def fn(x, ids, w, quant):
            return fused_experts(
                x,
                q1,
                q2,
                ids,
                w,
                quant=quant,
                local_expert_offset=case.offset,
                tactic=tactic,
                enable_pdl=enable_pdl,
            )

        return fn

    s0 = sets[0]
    ref = fused_experts_torch(
        s0["x"], q1, q2, s0["ids"], s0["w"], quant=s0["quant"], local_expert_offset=case.offset
    )

    def tactics_of() -> list[Any]:
        inputs = ExpertsInputs.of(s0["x"], q1, q2, s0["ids"], s0["w"], s0["quant"], case.offset)
        return FusedExpertsRunner().get_valid_tactics(inputs, None)

    calls = n_sets
    key = case.key(T)
    if sel.selecting:
        tactics = tactics_of()
        best = (-1, timed(ours(-1), ours_sets, calls))
        for t in tactics[:tactic_sweep]:
            try:
                if rel_err(ours(t)(*ours_sets[0]), ref) > 2e-2:
                    print(f"  tactic {t}: wrong output, skipped")
                    continue
                ms = timed(ours(t), ours_sets, calls)
            except Exception as exc:  # a tactic the compiler refuses (resources)
                print(f"  tactic {t}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            if ms < best[1]:
                best = (t, ms)
        sel.record(key, best[0], best[1])
        print(f"{key}: best {best[0]} {best[1] * 1e3:.1f} us (selection)", flush=True)
        return

    assert writer is not None
    out32 = torch.empty(T, case.H, device=dev)
    base_sets = [[s["x_deq"], s["plan"]] for s in sets]
    results: dict[str, tuple[float, float, Any, float | None]] = {}
    out = ours(-1)(*ours_sets[0])
    results["flashtune"] = (timed(ours(-1), ours_sets, calls), rel_err(out, ref), -1, None)
    if pdl_ab:  # the same default without PDL's chained launches (ops/pdl.py)
        out = ours(-1, False)(*ours_sets[0])
        results["flashtune_no_pdl"] = (
            timed(ours(-1, False), ours_sets, calls),
            rel_err(out, ref),
            -1,
            None,
        )
    if direct:  # the direct decode path's candidates (no alignment, no combine launch)
        for i, t in enumerate(t for t in tactics_of() if cfg.MoETactic.from_tactic(t).direct):
            out = ours(t)(*ours_sets[0])
            results[f"flashtune_direct#{i}"] = (
                timed(ours(t), ours_sets, calls),
                rel_err(out, ref),
                t,
                None,
            )
    if profile:  # where the default's time goes: alignment, the two GEMMs, the combine
        profile_kernels(f"T={T}", ours(-1), ours_sets[0])
    if key in sel.picks:
        t, sel_ms = sel.lookup(
            key,
            [-1, *tactics_of()],
        )
        out = ours(t)(*ours_sets[0])
        results["flashtune_tuned"] = (
            timed(ours(t), ours_sets, calls),
            rel_err(out, ref),
            t,
            sel_ms,
        )

    def base(x_deq, plan):
        return torch_baseline(x_deq, plan, d1, d2, out32, case.I)

    out = base(*base_sets[0])
    results["torch"] = (timed(base, base_sets, calls), rel_err(out, ref), None, None)

    d1t, d2t = d1.transpose(1, 2), d2.transpose(1, 2)

    def grouped(x_deq, routes):
        return torch_grouped(x_deq, routes, d1t, d2t, out32, case.I)

    grouped_sets = [[s["x_deq"], s["grouped"]] for s in sets]
    if hasattr(torch, "_grouped_mm") and try_peer(
        "torch_grouped", lambda: grouped(*grouped_sets[0])
    ):
        out = grouped(*grouped_sets[0])
        results["torch_grouped"] = (
            timed(grouped, grouped_sets, calls),
            rel_err(out, ref),
            None,
            None,
        )

    line = [f"{key:40s} touched {touched:5.1f}"]
    for name, (ms, err, tactic, sel_ms) in results.items():
        nbytes = touched * 3 * case.H * case.I * (2 if name.startswith("torch") else elem)
        writer.write(
            OP,
            case.shape(T),
            name.split("#")[0],
            ms,
            bandwidth_gbs=nbytes / (ms * 1e-3) / 1e9,
            tflops=flops / (ms * 1e-3) / 1e12,
            touched_experts=touched,
            weight_bytes=nbytes,
            local_routes=routes,
            rel_err=err,
            tactic=list(tactic) if isinstance(tactic, tuple) else tactic,
            selection_ms=sel_ms,
            input_sets=n_sets,
        )
        line.append(f"{name} {ms * 1e3:8.1f}us {nbytes / (ms * 1e-3) / 1e9:6.0f}GB/s err {err:.1e}")
    print("  ".join(line), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="deepseek-v3,qwen3-30b-a3b")
    ap.add_argument("--tokens", default=None, help="comma-separated T values")
    ap.add_argument("--quick", action="store_true", help=f"T in {QUICK_TOKENS}")
    ap.add_argument("--sweep", action="store_true", help="also select and re-time the best tactic")
    ap.add_argument("--max-tactics", type=int, default=64, help="tactics timed per case (sweep)")
    ap.add_argument("--budget-s", type=float, default=480.0)  # one 10-minute device call
    ap.add_argument("--profile", action="store_true", help="per-kernel GPU time of the default")
    ap.add_argument("--pdl-ab", action="store_true", help="also the default with enable_pdl=False")
    ap.add_argument("--direct", action="store_true", help="also the direct-path candidates")
    ap.add_argument("--picks", help=argparse.SUPPRESS)  # set by Selection's second process
    args = ap.parse_args()
    sel = Selection(args.picks, sweep=args.sweep)
    dev = torch.device("cuda")
    tokens = (
        [int(v) for v in args.tokens.split(",")]
        if args.tokens
        else (QUICK_TOKENS if args.quick else TOKENS)
    )
    cases = [c for m in args.models.split(",") for c in CASES[m]]
    writer = None
    if not sel.selecting:
        writer = RowWriter("moe")
        print(f"copy bandwidth {copy_bandwidth_gbs():.0f} GB/s on {torch.cuda.get_device_name()}")
    start = time.perf_counter()
    torch.manual_seed(0 if sel.selecting else 20261129)  # fresh inputs for the measurement
    weights_of: dict[tuple, Any] = {}
    for case in cases:
        wkey = (case.model, case.mode)
        if wkey not in weights_of:
            weights_of.clear()  # one model's weights at a time
            torch.cuda.empty_cache()
            weights_of[wkey] = make_weights(case, dev)
        for T in tokens:
            if time.perf_counter() - start > args.budget_s:
                print(f"budget reached: stopping before {case.key(T)}")
                break
            run_case(
                case,
                T,
                dev,
                weights_of[wkey],
                sel,
                writer,
                args.max_tactics,
                args.profile,
                args.pdl_ab,
                args.direct,
            )
    if sel.selecting:
        weights_of.clear()  # the measuring process needs the device memory
        sel.measure_in_fresh_process(__file__)


if __name__ == "__main__":
    main()

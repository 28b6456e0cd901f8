"""Gated Delta Net benchmark (issue 39): flashtune's Triton kernels against
flash-linear-attention's (fla-core, the Triton kernels Qwen3-Next's serving stacks started
from) and the torch reference, at Qwen3-Next's shapes (head size 128; TP 1: 16 query/key
heads, 32 value heads; TP 4: 4 and 8).

Cases:
- prefill: packed sequences by cu_seqlens, an initial state per sequence, the final state
  returned (gdn_prefill's contract): (sequences, tokens each) in --prefill;
- decode: one token per request, the state [B, HV, V, K] read and a new one written: batch
  sizes in --decode;
- mtp: T tokens per request from a pool (2B slots), intermediate states not cached:
  (requests, tokens) in --mtp.

Solutions:
- flashtune: the definition-shaped op (gdn_prefill / gdn_decode / gdn_mtp: raw gate inputs,
  the gates computed in the kernels; gdn_mtp also copies the pool, as its contract returns
  it); flashtune_inplace (decode, mtp): FlashInfer's API (gated_delta_rule_decode_pretranspose
  / gated_delta_rule_mtp) updating the state in place, no copy;
- fla: fla.ops.gated_delta_rule.chunk_gated_delta_rule (prefill) and
  fused_recurrent_gated_delta_rule (decode, mtp: the pool's rows gathered outside the timed
  region) with state_v_first=True (fla's [V, K] state: the same k-last layout) and the gates
  converted once outside the timed region: log g (float32) and beta = sigmoid(b), so both
  compute the same math; its chunk indices are prepared outside too;
- fla_gates_in_kernel (decode, mtp): the same fla call given the raw gate inputs, as
  flashtune is, its kernel computing the decay and beta (use_gate_in_kernel,
  use_beta_sigmoid_in_kernel);
- torch: the reference (reference.py), decode and mtp only, and prefill up to
  --torch-max-tokens tokens (a Python loop over tokens).

Timing: flashtune.timing.measure, CUDA graphs of several calls, input sets rotated (cold
L2); a solution that cannot be captured (a host sync) is timed without a graph and its row
says graph: false. Columns: latency_ms; bandwidth_gbs = the bytes a call must move (q, k,
v, gates, output, the state read and written) / latency, the decode figure of merit against
the copy bandwidth printed at the start; tflops (prefill: the chunked form's matmuls,
~T HV (6 K V + 2 C (K + V)) x 2); rel_err of the output and state_rel_err of the final
state against the torch reference where it ran, else against flashtune.

fla is imported from its wheels: scripts/fetch_gpu_deps.sh puts fla-core's into
.peer/wheels; on the GPU machine (no network) run first
`pip install --no-deps .peer/wheels/fla_core-*.whl` (einops is there too).

Writes benchmarks/results/gdn.jsonl (and $OUT/gdn.jsonl).
Usage: python benchmarks/bench_gdn.py [--tp 1,4] [--decode 1,64,256] [--mtp 64x4]
       [--prefill 1x8192,8x1024] [--quick] [--sweep] [--solve-sweep] [--profile]
       [--budget-s 480]
--sweep also times flashtune's tactic candidates (a few of the tuner's, launch.py) as
"flashtune_sweep" rows with their tactic: selection figures, not a tuned measurement.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter, copy_bandwidth_gbs, profile_kernels, try_peer  # noqa: E402

from flashtune.ops.gdn import (  # noqa: E402
    gated_delta_rule_decode_pretranspose,
    gated_delta_rule_mtp,
    gdn_decode,
    gdn_decode_ref,
    gdn_gates,
    gdn_mtp,
    gdn_mtp_ref,
    gdn_prefill,
    gdn_prefill_ref,
    launch,
)
from flashtune.timing import CaptureError, measure  # noqa: E402

HEADS = {1: (16, 32), 2: (8, 16), 4: (4, 8)}  # tp -> (query/key heads, value heads)
D = 128
CHUNK = 64
DECODE = [1, 8, 32, 64, 128, 256, 512, 1024]
MTP = [(1, 2), (8, 4), (64, 4), (256, 2), (256, 4)]
PREFILL = [(1, 512), (1, 4096), (1, 16384), (4, 2048), (16, 512), (64, 128)]
QUICK = {"decode": [1, 64, 512], "mtp": [(64, 4)], "prefill": [(1, 4096), (16, 512)]}
SETS = 4
# --solve-sweep: (blockwise, warps, column step, small products' precision) of the solve
SOLVE_SWEEP = [
    (False, 4, 64, "ieee"),
    (True, 2, 64, "tf32"),
    (True, 2, 64, "mixed"),
    (True, 2, 64, "ieee"),
]
# (block_v, num_warps) of the decode / MTP sweep
SWEEP_RECURRENT = [
    (4, 1),
    (8, 1),
    (8, 2),
    (16, 1),
    (16, 2),
    (16, 4),
    (32, 2),
    (32, 4),
    (32, 8),
    (64, 4),
    (64, 8),
]


def _unit(*shape: int) -> torch.Tensor:
    x = torch.randn(*shape, device="cuda")
    return (x / x.norm(dim=-1, keepdim=True)).to(torch.bfloat16)


def _gates(hv: int, *lead: int) -> dict[str, torch.Tensor]:
    """Qwen3-Next's ranges (data.families.gdn_values): per-token decays ~0.01 to ~0.999."""
    a_log = torch.rand(hv, device="cuda") * 2.7726  # exp(A_log) in [1, 16]
    dt = torch.pow(10.0, -3.0 + 2.0 * torch.rand(hv, device="cuda"))
    return {
        "A_log": a_log,
        "a": torch.randn(*lead, hv, device="cuda").to(torch.bfloat16),
        "dt_bias": torch.log(torch.expm1(dt)),
        "b": torch.randn(*lead, hv, device="cuda").to(torch.bfloat16),
    }


def timed(fn, sets: list[list[Any]], calls: int = 8) -> tuple[float, bool]:
    """Median ms per call, in a CUDA graph where it can be captured."""
    for graph in (True, False):
        try:
            t = measure(fn, sets[0], input_sets=sets, warmup=2, repetitions=10,
                        use_cuda_graph=graph, calls_per_graph=calls, max_seconds=5.0)  # fmt: skip
            return t.median_ms, graph
        except CaptureError as exc:
            print(f"  not capturable ({str(exc)[:120]}): timing without a graph", flush=True)
    raise AssertionError("unreachable")


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def fla_ops() -> Any:
    try:
        import fla.ops.gated_delta_rule as fla_gdn

        return fla_gdn
    except Exception as exc:  # noqa: BLE001 - the peer is optional
        print(f"fla unavailable ({type(exc).__name__}: {exc}): pip install --no-deps "
              ".peer/wheels/fla_core-*.whl", flush=True)  # fmt: skip
        return None


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.writer = RowWriter("gdn")
        self.fla = fla_ops()
        self.started = time.monotonic()

    def over_budget(self) -> bool:
        return time.monotonic() - self.started > self.args.budget_s

    def emit(self, op: str, shape: dict, results: dict, nbytes: int, flops: float) -> None:
        line = [f"{op:8s} {shape}"]
        for name, r in results.items():
            ms = r["ms"]
            self.writer.write(
                f"gdn_{op}", shape, name, ms, bandwidth_gbs=nbytes / (ms * 1e-3) / 1e9,
                tflops=flops / (ms * 1e-3) / 1e12, bytes=nbytes, graph=r["graph"],
                rel_err=r.get("err"), state_rel_err=r.get("state_err"), tactic=r.get("tactic"),
                input_sets=SETS,
            )  # fmt: skip
            line.append(f"{name} {ms * 1e3:9.1f}us {nbytes / (ms * 1e-3) / 1e9:6.0f}GB/s")
        print("  ".join(line), flush=True)

    # ------------------------------------------------------------------ decode / mtp
    def steps(self, tp: int, batch: int, steps: int) -> None:
        h, hv = HEADS[tp]
        op = "decode" if steps == 1 else "mtp"
        pool_size = batch if op == "decode" else 2 * batch
        sets = []
        for _ in range(SETS):
            s = {"q": _unit(batch, steps, h, D), "k": _unit(batch, steps, h, D),
                 "v": torch.randn(batch, steps, hv, D, device="cuda").to(torch.bfloat16),
                 **_gates(hv, batch, steps),
                 "state": torch.randn(pool_size, hv, D, D, device="cuda"),
                 "idx": torch.randperm(pool_size, device="cuda")[:batch].to(torch.int32)}  # fmt: skip
            sets.append(s)
        names = ["q", "k", "v", "state", "A_log", "a", "dt_bias", "b"]
        s0 = sets[0]
        results: dict[str, dict] = {}
        if op == "decode":
            ref = gdn_decode_ref(*[s0[n] for n in names])
            out, st = gdn_decode(*[s0[n] for n in names])
            ms, graph = timed(gdn_decode, [[s[n] for n in names] for s in sets])
            results["flashtune"] = {"ms": ms, "graph": graph, "err": rel(out, ref[0]),
                                    "state_err": rel(st, ref[1])}  # fmt: skip

            def inplace(q, k, v, state, A_log, a, dt_bias, b):  # noqa: N803
                return gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b,
                                                            use_qk_l2norm=False)  # fmt: skip
        else:
            args = lambda s: [s["q"], s["k"], s["v"], s["state"], s["idx"], s["A_log"], s["a"],  # noqa: E731
                              s["dt_bias"], s["b"]]  # fmt: skip
            ref = gdn_mtp_ref(*args(s0))
            out, _ = gdn_mtp(*args(s0))
            ms, graph = timed(gdn_mtp, [args(s) for s in sets])
            results["flashtune"] = {"ms": ms, "graph": graph, "err": rel(out, ref[0])}

            def inplace(q, k, v, state, idx, A_log, a, dt_bias, b):  # noqa: N803
                return gated_delta_rule_mtp(q, k, v, state, idx, A_log, a, dt_bias, b,
                                            disable_state_update=False, use_qk_l2norm=False)  # fmt: skip

        in_sets = (
            [[s[n] for n in names] for s in sets] if op == "decode" else [args(s) for s in sets]
        )
        ms, graph = timed(inplace, in_sets)
        results["flashtune_inplace"] = {"ms": ms, "graph": graph}
        if self.args.sweep:
            self.sweep_recurrent(results, sets, op)
        if self.fla is not None:
            # The in-place timings above rewrote the states: fla is checked against a
            # reference of the states it reads now (not `ref`, taken before them).
            now = (gdn_decode_ref(*[s0[n] for n in names]) if op == "decode"
                   else gdn_mtp_ref(*args(s0)))  # fmt: skip
            self.fla_steps(results, sets, op, now)
        torch_args = (
            [[s[n] for n in names] for s in sets] if op == "decode" else [args(s) for s in sets]
        )
        ms, graph = timed(gdn_decode_ref if op == "decode" else gdn_mtp_ref, torch_args, calls=2)
        results["torch"] = {"ms": ms, "graph": graph}
        # The bytes a call must move: the state read and written (the slots used), the rest.
        state = batch * hv * D * D * 4 * 2
        other = batch * steps * (2 * h * D + 2 * hv * D + 2 * hv) * 2
        flops = batch * steps * hv * D * D * 8.0
        shape = {"tp": tp, "batch_size": batch, "seq_len": steps, "num_q_heads": h,
                 "num_v_heads": hv, "head_size": D}  # fmt: skip
        self.emit(op, shape, results, state + other, flops)

    def sweep_recurrent(self, results: dict, sets: list[dict], op: str) -> None:
        # fla-core's fused_recurrent runs [8, K] tiles on one warp each (many small programs):
        # those corners beside the tuner's space.
        cases = [(bv, warps, launch.RECURRENT_STAGES) for bv, warps in SWEEP_RECURRENT]
        if op == "mtp":  # the token loop: its pipeline stages, and a narrower tile
            cases += [(8, 1, 1), (8, 1, 2), (8, 1, 4), (4, 1, 3), (4, 1, 1)]
        for bv, warps, stages in cases:
            tactic = launch.GDNTactic(block_v=bv, num_warps=warps, num_stages=stages)

            def run(q, k, v, state, A_log, a, dt_bias, b, tactic=tactic):  # noqa: N803
                out = torch.empty(*v.shape, dtype=q.dtype, device=q.device)
                launch.recurrent(q, k, v, A_log, a, dt_bias, b, state, state, out,
                                 D**-0.5, tactic=tactic)  # fmt: skip
                return out

            s_sets = [[s["q"], s["k"], s["v"], s["state"][: s["q"].shape[0]], s["A_log"],
                       s["a"], s["dt_bias"], s["b"]] for s in sets]  # fmt: skip
            ms, graph = timed(run, s_sets)
            results[f"flashtune_sweep_bv{bv}_w{warps}_s{stages}"] = {
                "ms": ms, "graph": graph, "tactic": [bv, warps, stages]}  # fmt: skip

    def fla_steps(self, results: dict, sets: list[dict], op: str, ref: Any) -> None:
        fused = self.fla.fused_recurrent_gated_delta_rule
        f_sets = []
        for s in sets:  # converted once, outside the timed region
            g, beta = gdn_gates(s["A_log"], s["a"], s["dt_bias"], s["b"])
            h0 = s["state"][s["idx"].long()] if op == "mtp" else s["state"]
            f_sets.append([s["q"], s["k"], s["v"], torch.log(g), beta, h0.contiguous()])

        def run(q, k, v, g, beta, h0):
            return fused(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                         state_v_first=True)  # fmt: skip

        if not try_peer("fla", lambda: run(*f_sets[0])):
            return
        out, st = run(*f_sets[0])
        ms, graph = timed(run, f_sets)
        results["fla"] = {"ms": ms, "graph": graph, "err": rel(out, ref[0])}
        if op == "decode":
            results["fla"]["state_err"] = rel(st, ref[1])
        # fla given what flashtune is given: the raw gate inputs, its kernel computing
        # the decay (use_gate_in_kernel) and beta's sigmoid (use_beta_sigmoid_in_kernel).
        r_sets = [[*f[:3], s["a"], s["b"], s["A_log"], s["dt_bias"], f[5]]
                  for f, s in zip(f_sets, sets, strict=True)]  # fmt: skip

        def raw(q, k, v, a, b, A_log, dt_bias, h0):  # noqa: N803
            return fused(q, k, v, g=a, beta=b, initial_state=h0, output_final_state=True,
                         state_v_first=True, use_gate_in_kernel=True, A_log=A_log,
                         dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)  # fmt: skip

        if try_peer("fla (gates in kernel)", lambda: raw(*r_sets[0])):
            out, st = raw(*r_sets[0])
            ms, graph = timed(raw, r_sets)
            results["fla_gates_in_kernel"] = {"ms": ms, "graph": graph, "err": rel(out, ref[0])}

    # ------------------------------------------------------------------ prefill
    def prefill(self, tp: int, seqs: int, tokens: int) -> None:
        h, hv = HEADS[tp]
        gen = torch.Generator().manual_seed(seqs * 7919 + tokens)
        lens = torch.randint(max(1, tokens // 2), tokens + tokens // 2 + 1, (seqs,),
                             generator=gen) if seqs > 1 else torch.tensor([tokens])  # fmt: skip
        cu = torch.tensor([0, *lens.cumsum(0).tolist()], dtype=torch.int64, device="cuda")
        total = int(cu[-1])
        sets = []
        for _ in range(SETS):
            s = {"q": _unit(total, h, D), "k": _unit(total, h, D),
                 "v": torch.randn(total, hv, D, device="cuda").to(torch.bfloat16),
                 "state": torch.randn(seqs, hv, D, D, device="cuda"), **_gates(hv, total)}  # fmt: skip
            sets.append(s)
        names = ["q", "k", "v", "state", "A_log", "a", "dt_bias", "b"]
        args = lambda s: [*(s[n] for n in names), cu]  # noqa: E731
        out, st = gdn_prefill(*args(sets[0]))
        if self.args.profile:
            print(f"prefill tp {tp}, {seqs} x {tokens} tokens:", flush=True)
            profile_kernels("flashtune", gdn_prefill, args(sets[0]))
        results: dict[str, dict] = {}
        ms, graph = timed(gdn_prefill, [args(s) for s in sets], calls=2)
        results["flashtune"] = {"ms": ms, "graph": graph}
        ref: tuple[torch.Tensor, torch.Tensor] | None = None
        if total <= self.args.torch_max_tokens:
            ref = gdn_prefill_ref(*args(sets[0]))
            results["flashtune"].update(err=rel(out, ref[0]), state_err=rel(st, ref[1]))
        base = ref if ref is not None else (out, st)
        if self.args.sweep:
            for bv in (32, 64, 128):
                for warps in (4, 8):
                    for precision in ("ieee", "tf32"):
                        tactic = launch.GDNTactic(bv, warps, precision)

                        def run(q, k, v, state, A_log, a, dt_bias, b, cu, tactic=tactic):  # noqa: N803
                            o = torch.empty(*v.shape, dtype=q.dtype, device=q.device)
                            ns = torch.empty_like(state)
                            launch.chunked(q, k, v, A_log, a, dt_bias, b, cu, state, ns, o,
                                           D**-0.5, tactic=tactic)  # fmt: skip
                            return o, ns

                        o, ns = run(*args(sets[0]))
                        ms, graph = timed(run, [args(s) for s in sets], calls=2)
                        results[f"flashtune_sweep_bv{bv}_w{warps}_{precision}"] = {
                            "ms": ms, "graph": graph, "tactic": [bv, warps, precision],
                            "err": rel(o, base[0]), "state_err": rel(ns, base[1])}  # fmt: skip
        if self.args.solve_sweep:
            self.sweep_solve(results, sets, args, base)
        if self.fla is not None:
            self.fla_prefill(results, sets, cu, base)
        if ref is not None:
            ms, graph = timed(gdn_prefill_ref, [args(sets[0])], calls=1)
            results["torch"] = {"ms": ms, "graph": graph}
        # Bytes: q, k, v, gates in; output out; states in and out.
        nbytes = total * (2 * h * D + 2 * hv * D + 2 * hv) * 2 + seqs * hv * D * D * 4 * 2
        flops = 2.0 * total * hv * (6 * D * D + 2 * CHUNK * 2 * D)
        shape = {"tp": tp, "num_seqs": seqs, "total_seq_len": total, "num_q_heads": h,
                 "num_v_heads": hv, "head_size": D}  # fmt: skip
        self.emit("prefill", shape, results, nbytes, flops)

    def sweep_solve(self, results: dict, sets: list[dict], args: Any, base: Any) -> None:
        # The solve kernel's forms (launch.SOLVE_*: A by one product or by blocks, its
        # warps and column step, the small products' precision), the whole prefill timed
        # with each; the module's settings restored after.
        saved = (launch.SOLVE_BLOCKWISE, launch.SOLVE_WARPS, launch.SOLVE_BK,
                 launch.SOLVE_HALF_PRECISION)  # fmt: skip
        try:
            for blockwise, warps, bk, precision in SOLVE_SWEEP:
                launch.SOLVE_BLOCKWISE, launch.SOLVE_WARPS = blockwise, warps
                launch.SOLVE_BK, launch.SOLVE_HALF_PRECISION = bk, precision
                o, ns = gdn_prefill(*args(sets[0]))
                ms, graph = timed(gdn_prefill, [args(s) for s in sets], calls=2)
                name = f"{'blocks' if blockwise else 'one'}_w{warps}_bk{bk}_{precision}"
                results[f"flashtune_solve_{name}"] = {
                    "ms": ms, "graph": graph, "tactic": [blockwise, warps, bk, precision],
                    "err": rel(o, base[0]), "state_err": rel(ns, base[1])}  # fmt: skip
        finally:
            (launch.SOLVE_BLOCKWISE, launch.SOLVE_WARPS, launch.SOLVE_BK,
             launch.SOLVE_HALF_PRECISION) = saved  # fmt: skip

    def fla_prefill(self, results: dict, sets: list[dict], cu: torch.Tensor, base: Any) -> None:
        chunk = self.fla.chunk_gated_delta_rule
        try:
            from fla.ops.utils.index import prepare_chunk_indices

            indices = prepare_chunk_indices(cu, CHUNK)
        except Exception as exc:  # noqa: BLE001
            print(f"  fla chunk indices: {exc}", flush=True)
            indices = None
        f_sets = []
        for s in sets:
            g, beta = gdn_gates(s["A_log"], s["a"], s["dt_bias"], s["b"])
            f_sets.append([s["q"][None], s["k"][None], s["v"][None], torch.log(g)[None],
                           beta[None], s["state"]])  # fmt: skip

        def run(q, k, v, g, beta, h0):
            return chunk(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                         state_v_first=True, cu_seqlens=cu, chunk_indices=indices)  # fmt: skip

        if not try_peer("fla", lambda: run(*f_sets[0])):
            return
        out, st = run(*f_sets[0])
        if self.args.profile:
            profile_kernels("fla", run, f_sets[0])
        ms, graph = timed(run, f_sets, calls=2)
        results["fla"] = {"ms": ms, "graph": graph, "err": rel(out[0], base[0]),
                          "state_err": rel(st, base[1])}  # fmt: skip


def _pairs(text: str) -> list[tuple[int, int]]:
    if text == "none":
        return []
    return [tuple(int(x) for x in p.split("x")) for p in text.split(",") if p]  # type: ignore[misc]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tp", default="1,4", help="tensor parallel degrees (1, 2, 4)")
    ap.add_argument("--decode", default=None, help="batch sizes, e.g. 1,64,256 (none: no decode)")
    ap.add_argument("--mtp", default=None, help="requests x tokens, e.g. 64x4,256x2 (or none)")
    ap.add_argument("--prefill", default=None, help="sequences x tokens, e.g. 1x8192 (or none)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--solve-sweep", action="store_true",
                    help="prefill: the whole call with each form of the solve kernel")  # fmt: skip
    ap.add_argument("--profile", action="store_true",
                    help="prefill: each kernel's GPU time, flashtune's and fla's")  # fmt: skip
    ap.add_argument("--torch-max-tokens", type=int, default=2048)
    ap.add_argument("--budget-s", type=float, default=480.0)
    args = ap.parse_args()
    decode = [int(x) for x in args.decode.split(",") if x != "none"] if args.decode else (
        QUICK["decode"] if args.quick else DECODE)  # fmt: skip
    mtp = _pairs(args.mtp) if args.mtp else (QUICK["mtp"] if args.quick else MTP)
    prefill = _pairs(args.prefill) if args.prefill else (
        QUICK["prefill"] if args.quick else PREFILL)  # fmt: skip
    bench = Bench(args)
    print(f"copy bandwidth {copy_bandwidth_gbs():.0f} GB/s on {torch.cuda.get_device_name()}")
    for tp in (int(x) for x in args.tp.split(",")):
        for batch in decode:
            if bench.over_budget():
                return
            bench.steps(tp, batch, 1)
        for batch, steps in mtp:
            if bench.over_budget():
                return
            bench.steps(tp, batch, steps)
        for seqs, tokens in prefill:
            if bench.over_budget():
                return
            bench.prefill(tp, seqs, tokens)


if __name__ == "__main__":
    main()

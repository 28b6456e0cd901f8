"""Mamba-2 selective state update benchmark (issue 39): flashtune's Triton kernel against
mamba-ssm's Triton `selective_state_update` (the kernel vLLM and SGLang started from),
FlashInfer's where the FlashInfer on the machine has one (`flashinfer.mamba`), and a torch
eager baseline, at the FlashInfer-Trace shapes (NemotronH-8B: head_dim 64, dstate 128; TP 1:
128 heads in 8 groups, TP 2: 64 in 4).

The call is the Definitions' form: bf16 state cache (--state-dtype), bf16 x / dt / B / C /
D / dt_bias, fp32 A with one value per head (strides (1, 0, 0)), dt / D / dt_bias per head
as stride-0 views, softplus(dt + dt_bias), int32 slots, no z (--z adds the gate), the state
updated in place (each solution's own in-place form: what a serving engine runs; the
Definitions' value-returning form adds a copy of the cache).

Solutions:
- flashtune: `flashtune.mamba.selective_state_update` with its default tactic;
- flashtune_tuned (--sweep): the fastest of config.SSUTactic.space, selected in one process
  and re-timed on fresh inputs in a second one (common.Selection: selection is not
  measurement);
- mamba_ssm: mamba-ssm 2.3.2.post1's `mamba_ssm/ops/triton/selective_state_update.py`,
  loaded by file path from its source archive (scripts/fetch_gpu_deps.sh puts it in
  .peer/wheels; its CUDA extension is not built: only this pure-Triton module is imported,
  with its softplus helper; it needs einops: `pip install --no-deps .peer/wheels/einops-*.whl`
  where missing);
- flashinfer: `flashinfer.mamba.selective_state_update`, where that module exists;
- torch: eager PyTorch, the slots gathered, the step in fp32, scattered back.

Timing: flashtune.timing.measure in CUDA graphs (each graph replays one call per input set).
Input sets use disjoint slots of one shared cache, as many as twice the L2 needs, so the
state a call reads comes from HBM. Every solution is checked once against the reference
(rel_err of the output, state_rel_err of the updated slots) before it is timed.

Columns: latency_ms; bytes = the state read and written (2 x batch x nheads x 64 x 128 x
element size) plus the per-row inputs, the output and the weights; bandwidth_gbs = bytes /
latency; floor_ms = bytes / the read bandwidth of a large reduction measured at the start
(common.copy_bandwidth_gbs): the memory-bound floor; floor_ratio = latency / floor.

Writes benchmarks/results/mamba.jsonl (and $OUT/mamba.jsonl).
Usage: python benchmarks/bench_mamba.py [--tp 1,2] [--batch 1,16,256] [--quick] [--z]
       [--state-dtype bfloat16|float32] [--sweep] [--budget-s 480]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
import tarfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter, Selection, copy_bandwidth_gbs, try_peer  # noqa: E402

from flashtune.ops.mamba import selective_state_update, selective_state_update_ref  # noqa: E402
from flashtune.ops.mamba.config import SSUTactic  # noqa: E402
from flashtune.ops.mamba.launch import SSUInputs, SSURunner, check_ssu  # noqa: E402
from flashtune.timing import l2_bytes, measure  # noqa: E402

OP = "mamba_selective_state_update"
HEAD_DIM, DSTATE = 64, 128
SHAPES = {1: (128, 8), 2: (64, 4)}  # NemotronH-8B: tensor parallel -> (nheads, ngroups)
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
QUICK_BATCHES = [1, 16, 256]
MAX_SETS = 64
ROOT = Path(__file__).resolve().parents[1]
MAMBA_SDIST = "mamba_ssm-2.3.2.post1"


# --------------------------------------------------------------------------- peers


def load_mamba_ssm() -> Callable[..., Any] | None:
    """mamba-ssm's Triton selective_state_update, imported by file path from the source
    archive in .peer/wheels (its package __init__ imports the CUDA extension, which is not
    built here): the module and its softplus helper under their own names."""
    archive = ROOT / ".peer" / "wheels" / f"{MAMBA_SDIST}.tar.gz"
    if not archive.exists():
        print(f"  peer mamba_ssm unavailable: {archive} missing (scripts/fetch_gpu_deps.sh)")
        return None
    folder = ROOT / ".peer" / "mamba_ssm_src"
    if not (folder / MAMBA_SDIST).exists():
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if "/mamba_ssm/ops/triton/" in m.name]
            tar.extractall(folder, members=members)  # noqa: S202 - our own fetched archive
    triton_dir = folder / MAMBA_SDIST / "mamba_ssm" / "ops" / "triton"
    try:
        for package in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"):
            sys.modules.setdefault(package, types.ModuleType(package))
        for name in ("softplus", "selective_state_update"):
            full = f"mamba_ssm.ops.triton.{name}"
            spec = importlib.util.spec_from_file_location(full, triton_dir / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[full] = module
            spec.loader.exec_module(module)
        return sys.modules["mamba_ssm.ops.triton.selective_state_update"].selective_state_update
    except Exception as exc:  # einops missing, a Triton it does not support
        print(f"  peer mamba_ssm unavailable: {type(exc).__name__}: {str(exc)[:200]}")
        return None


def load_flashinfer() -> Callable[..., Any] | None:
    """FlashInfer's selective_state_update where the installed FlashInfer has one (0.2.14 has
    no mamba module; later ones do), called with the keywords its signature takes (`out` and
    `pad_slot_id` came later than the rest)."""
    try:
        import flashinfer.mamba as fi_mamba  # type: ignore[import-not-found]

        fn = fi_mamba.selective_state_update
    except Exception as exc:
        print(f"  peer flashinfer unavailable: {type(exc).__name__}: {str(exc)[:160]}")
        return None
    accepted = set(inspect.signature(fn).parameters)

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{k: v for k, v in kwargs.items() if k in accepted})

    return call


def torch_step(state, x, dt, A, B, C, D, z, dt_bias, idx):
    """Eager PyTorch: gather the rows' slots, one fp32 step, scatter back."""
    rows = idx.long()
    s = state.index_select(0, rows).float()
    dtf = torch.nn.functional.softplus(dt.float() + dt_bias.float())
    ratio = x.shape[1] // B.shape[1]
    Bh = B.float().repeat_interleave(ratio, 1)
    Ch = C.float().repeat_interleave(ratio, 1)
    s = (
        s * torch.exp(A.float()[None] * dtf[..., None])
        + (dtf * x.float())[..., None] * Bh[:, :, None]
    )
    state.index_copy_(0, rows, s.to(state.dtype))
    y = (s * Ch[:, :, None]).sum(-1) + x.float() * D.float()
    if z is not None:
        y = y * torch.nn.functional.silu(z.float())
    return y.to(x.dtype)


# --------------------------------------------------------------------------- inputs


def make_inputs(tp: int, batch: int, dtype: torch.dtype, with_z: bool, dev: torch.device):
    """Weights, one state cache, and input sets on disjoint slots (cold L2)."""
    nheads, ngroups = SHAPES[tp]
    elem = torch.empty((), dtype=dtype).element_size()
    touched = batch * nheads * HEAD_DIM * DSTATE * elem
    n_sets = max(2, min(MAX_SETS, -(-2 * l2_bytes(dev) // touched)))
    slots = n_sets * batch + 7
    bf = torch.bfloat16
    A = (-torch.empty(nheads, device=dev).uniform_(1.0, 16.0)).view(nheads, 1, 1)
    A = A.expand(nheads, HEAD_DIM, DSTATE)
    dt_bias = torch.empty(nheads, device=dev).uniform_(-6.0, -1.0).to(bf)[:, None]
    D = torch.randn(nheads, device=dev).to(bf)[:, None]
    weights = {
        "A": A,
        "D": D.expand(nheads, HEAD_DIM),
        "dt_bias": dt_bias.expand(nheads, HEAD_DIM),
    }
    state = (torch.randn(slots, nheads, HEAD_DIM, DSTATE, device=dev) * 0.1).to(dtype)
    order = torch.randperm(slots, device=dev).to(torch.int32)
    sets = []
    for i in range(n_sets):
        dt = torch.randn(batch, nheads, device=dev).to(bf)[:, :, None]
        sets.append(
            {
                "x": torch.randn(batch, nheads, HEAD_DIM, device=dev).to(bf),
                "dt": dt.expand(batch, nheads, HEAD_DIM),
                "B": torch.randn(batch, ngroups, DSTATE, device=dev).to(bf),
                "C": torch.randn(batch, ngroups, DSTATE, device=dev).to(bf),
                "z": torch.randn(batch, nheads, HEAD_DIM, device=dev).to(bf) if with_z else None,
                "idx": order[i * batch : (i + 1) * batch].contiguous(),
                "out": torch.empty(batch, nheads, HEAD_DIM, device=dev, dtype=bf),
            }
        )
    row_bytes = (
        sum(
            t.numel() * t.element_size()
            for k, t in sets[0].items()
            if t is not None and k not in ("dt",)
        )
        + batch * nheads * 2
    )  # dt: one value per head
    nbytes = 2 * touched + row_bytes + nheads * (4 + 2 + 2)
    return weights, state, sets, nbytes


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12)).item()


# --------------------------------------------------------------------------- a case


def solutions(weights, state, mamba_ssm, flashinfer) -> dict[str, Callable[..., Any]]:
    """Each solution as fn(x, dt, B, C, z, idx, out) updating `state` in place."""
    A, D, dt_bias = weights["A"], weights["D"], weights["dt_bias"]

    def ours(tactic=None):
        if tactic is None:
            return lambda x, dt, B, C, z, idx, out: selective_state_update(
                state, x, dt, A, B, C, D, z=z, dt_bias=dt_bias, dt_softplus=True,
                state_batch_indices=idx, out=out,
            )  # fmt: skip
        runner = SSURunner()

        def run(x, dt, B, C, z, idx, out):
            st, x3, dt3, A3, B3, C3, D2, z3, b2 = check_ssu(
                state, x, dt, A, B, C, D, z, dt_bias, idx, None, out
            )
            inputs = SSUInputs(st, x3, dt3, A3, B3, C3, D2, z3, b2, idx, None, out, True, -1,
                               True)  # fmt: skip
            return runner.forward(inputs, tactic)

        return run

    found: dict[str, Callable[..., Any]] = {"flashtune": ours()}
    found["_tactic"] = ours  # type: ignore[assignment]
    if mamba_ssm is not None:
        found["mamba_ssm"] = lambda x, dt, B, C, z, idx, out: mamba_ssm(
            state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True,
            state_batch_indices=idx,
        )  # fmt: skip
    if flashinfer is not None:
        found["flashinfer"] = lambda x, dt, B, C, z, idx, out: flashinfer(
            state, x, dt, A, B, C, D, z=z, dt_bias=dt_bias, dt_softplus=True,
            state_batch_indices=idx, pad_slot_id=-1, out=out,
        )  # fmt: skip
    found["torch"] = lambda x, dt, B, C, z, idx, out: torch_step(
        state, x, dt, A, B, C, D, z, dt_bias, idx
    )
    return found


def check(fn, weights, state, s) -> tuple[float, float]:
    """(rel_err of the output, of the updated slots) of one call against the reference."""
    A, D, dt_bias = weights["A"], weights["D"], weights["dt_bias"]
    before = state.clone()
    want_y, want_state = selective_state_update_ref(
        before, s["x"], s["dt"], A, s["B"], s["C"], D, s["z"], dt_bias, True, s["idx"]
    )
    y = fn(s["x"], s["dt"], s["B"], s["C"], s["z"], s["idx"], s["out"])
    rows = s["idx"].long()
    errs = (rel_err(y, want_y), rel_err(state[rows], want_state[rows]))
    state.copy_(before)
    return errs


def run_case(tp, batch, args, peers, sel: Selection, writer: RowWriter | None, floor_gbs):
    dev = torch.device("cuda")
    dtype = getattr(torch, args.state_dtype)
    weights, state, sets, nbytes = make_inputs(tp, batch, dtype, args.z, dev)
    nheads, ngroups = SHAPES[tp]
    shape = {
        "tp": tp, "batch": batch, "nheads": nheads, "ngroups": ngroups, "head_dim": HEAD_DIM,
        "dstate": DSTATE, "state_dtype": args.state_dtype, "z": args.z,
        "state_cache_size": state.shape[0],
    }  # fmt: skip
    arg_sets = [[s["x"], s["dt"], s["B"], s["C"], s["z"], s["idx"], s["out"]] for s in sets]
    fns = solutions(weights, state, *peers)
    tactic_fn = fns.pop("_tactic")
    key = f"tp{tp},b{batch},{args.state_dtype},z{int(args.z)}"

    def timed(fn) -> float:
        return measure(
            fn, arg_sets[0], input_sets=arg_sets, warmup=3, repetitions=20, use_cuda_graph=True,
            calls_per_graph=len(arg_sets), max_seconds=5.0,
        ).median_ms  # fmt: skip

    if sel.selecting:
        best = (None, timed(fns["flashtune"]))
        for tactic in SSUTactic.space(HEAD_DIM, DSTATE):
            fn = tactic_fn(tactic)
            if max(check(fn, weights, state, sets[0])) > 2e-2:
                print(f"  tactic {tactic}: wrong output, skipped")
                continue
            ms = timed(fn)
            if ms < best[1]:
                best = (tactic, ms)
        sel.record(key, best[0], best[1])
        print(f"{key}: best {best[0]} {best[1] * 1e3:.1f} us (selection)", flush=True)
        return

    assert writer is not None
    runs: dict[str, tuple[Callable[..., Any], Any, float | None]] = {
        name: (fn, None, None) for name, fn in fns.items()
    }
    if key in sel.picks:
        tactic, sel_ms = sel.lookup(key, [None, *SSUTactic.space(HEAD_DIM, DSTATE)])
        runs["flashtune_tuned"] = (fns["flashtune"] if tactic is None else tactic_fn(tactic),
                                   tactic, sel_ms)  # fmt: skip
    floor_ms = nbytes / (floor_gbs * 1e9) * 1e3
    line = [f"{key:24s} floor {floor_ms * 1e3:7.1f}us"]
    for name, (fn, tactic, sel_ms) in runs.items():
        if name not in ("flashtune", "flashtune_tuned") and not try_peer(
            name, lambda fn=fn: fn(*arg_sets[0])
        ):
            continue
        err, state_err = check(fn, weights, state, sets[0])
        ms = timed(fn)
        writer.write(
            OP, shape, name, ms, bytes=nbytes, bandwidth_gbs=nbytes / (ms * 1e-3) / 1e9,
            floor_ms=floor_ms, floor_ratio=ms / floor_ms, rel_err=err, state_rel_err=state_err,
            tactic=None if tactic is None else str(tactic), selection_ms=sel_ms,
            input_sets=len(arg_sets),
        )  # fmt: skip
        line.append(f"{name} {ms * 1e3:7.1f}us {nbytes / (ms * 1e-3) / 1e9:5.0f}GB/s "
                    f"err {err:.1e}/{state_err:.1e}")  # fmt: skip
    print("  ".join(line), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", default="1,2", help="NemotronH-8B's tensor parallel sizes")
    ap.add_argument("--batch", default=None, help="comma-separated batch sizes")
    ap.add_argument("--quick", action="store_true", help=f"batch in {QUICK_BATCHES}")
    ap.add_argument("--z", action="store_true", help="with the z gate")
    ap.add_argument("--state-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--sweep", action="store_true", help="also select and re-time the best tactic")
    ap.add_argument("--budget-s", type=float, default=480.0)  # one 10-minute device call
    ap.add_argument("--picks", help=argparse.SUPPRESS)  # set by Selection's second process
    args = ap.parse_args()
    sel = Selection(args.picks, sweep=args.sweep)
    batches = (
        [int(v) for v in args.batch.split(",")]
        if args.batch
        else (QUICK_BATCHES if args.quick else BATCHES)
    )
    writer, floor_gbs, peers = None, 0.0, (None, None)
    if not sel.selecting:
        writer = RowWriter("mamba")
        floor_gbs = copy_bandwidth_gbs()
        print(f"read bandwidth {floor_gbs:.0f} GB/s on {torch.cuda.get_device_name()}")
        peers = (load_mamba_ssm(), load_flashinfer())
    torch.manual_seed(0 if sel.selecting else 20261129)  # fresh inputs for the measurement
    start = time.perf_counter()
    for tp in (int(v) for v in args.tp.split(",")):
        for batch in batches:
            if time.perf_counter() - start > args.budget_s:
                print(f"budget reached: stopping before tp{tp} b{batch}")
                break
            run_case(tp, batch, args, peers, sel, writer, floor_gbs)
            torch.cuda.empty_cache()
    if sel.selecting:
        sel.measure_in_fresh_process(__file__)


if __name__ == "__main__":
    main()

"""End to end (issue 19): a Llama decoder's decode step and prefill on four backends (GPU).

    python benchmarks/bench_e2e.py --layers 4             # Llama-3.1-8B shapes, 4 layers
    python benchmarks/bench_e2e.py --layers 4 --quick     # a smaller grid
    python benchmarks/bench_e2e.py --config tiny --device cpu --backends torch,flashtune
                                                          # the code path on CPU (interpreter)

The same model (flashtune.models.Llama: weights, KV cache pages and inputs shared) built on:
  torch          eager PyTorch: F.linear, F.rms_norm, SDPA over the gathered pages;
  torch_compile  the torch model's layers under torch.compile (--compile-mode, default
                 "max-autotune-no-cudagraphs": its own CUDA graph would nest in ours;
                 "reduce-overhead" runs without ours);
  flashinfer     FlashInfer's norm / RoPE / activation / attention / sampling, cuBLAS GEMM;
  flashtune      flashtune's ops, autotuned on first use (--no-tune: defaults only).

Decode: inter-token latency at batch x KV length (each request holds kv_len - 1 tokens of
random K/V, the step appends one): one step captured in a CUDA graph, then timed with
flashtune.timing.measure (CUDA events, median): `latency_ms` is plan + input copies + graph
replay (what a caller waits per token), `graph_ms` the replay alone. Prefill: a ragged batch
of fresh prompts, eager (plan + layers), tokens/s. Before timing, every backend's logits are
compared with torch eager's (relative L2 error, greedy tokens). Rows: results/e2e.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter  # noqa: E402

from flashtune.models import (  # noqa: E402
    CONFIGS,
    Llama,
    LlamaWeights,
    PagedKVCache,
    PageTable,
    StepBatch,
)
from flashtune.models.backends import FlashinferOps, FlashtuneOps, Ops  # noqa: E402
from flashtune.timing import measure  # noqa: E402
from flashtune.tune import autotune  # noqa: E402

BACKENDS = ("torch", "torch_compile", "flashinfer", "flashtune")
BATCHES = (1, 16, 64, 256)
KV_LENS = (1024, 4096, 16384, 32768)
QUICK_BATCHES = (1, 64)
QUICK_KV_LENS = (1024, 8192)
# Grid points holding more KV tokens are skipped: 2^21 tokens of Llama-3.1-8B KV are 4 GB a
# layer in bf16 (and torch's gather copies them once more).
MAX_KV_TOKENS = 2**21
PREFILL = ((1, 1024), (1, 4096), (1, 8192), (8, 1024), (16, 512))  # (prompts, prompt length)
QUICK_PREFILL = ((1, 2048), (8, 512))
PAGE_SIZE = 16
# bf16 logits through a few layers: the backends differ by rounding, ~1e-2 relative at most.
REL_TOLERANCE = 5e-2


# ----------------------------------------------------------------------- pure parts


def decode_grid(
    batches: Iterable[int], kv_lens: Iterable[int], max_tokens: int = MAX_KV_TOKENS
) -> list[tuple[int, int]]:
    """(batch, kv_len) points holding at most max_tokens KV tokens, in order."""
    return [(b, n) for b in batches for n in kv_lens if b * n <= max_tokens]


def pages_for(points: Iterable[tuple[int, int]], page_size: int) -> int:
    """Pages the largest point needs (every request's KV, rounded up to whole pages)."""
    return max(b * -(-n // page_size) for b, n in points)


def compare(logits: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    """How far logits [B, V] are from the reference's: relative L2 error, the largest
    absolute difference, the fraction of rows with the same greedy token, and the verdict."""
    a, b = logits.float(), reference.float()
    rel = float((a - b).norm() / b.norm().clamp_min(1e-30))
    greedy = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    return {
        "rel_err": rel,
        "max_abs_err": float((a - b).abs().max()),
        "greedy_match": greedy,
        "outputs_match": rel <= REL_TOLERANCE,
    }


def geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def speedups(rows: Iterable[dict[str, Any]], op: str, ours: str = "flashtune") -> dict[str, Any]:
    """Per other solution: the geomean of its latency / ours over the shapes both timed
    (> 1: ours is faster), and how many shapes that covers."""
    by_shape: dict[str, dict[str, float]] = {}
    for row in rows:
        if row["op"] == op and row.get("latency_ms"):
            key = repr(sorted(row["shape"].items()))
            by_shape.setdefault(key, {})[row["solution"]] = row["latency_ms"]
    out: dict[str, Any] = {}
    others = sorted({s for times in by_shape.values() for s in times} - {ours})
    for other in others:
        ratios = [t[other] / t[ours] for t in by_shape.values() if other in t and ours in t]
        out[other] = {"geomean_speedup": geomean(ratios), "shapes": len(ratios)}
    return out


# ----------------------------------------------------------------------- the models


def build_models(args: argparse.Namespace, num_pages: int) -> dict[str, Llama]:
    """One Llama per backend, all on the same weights and KV cache pages."""
    config = CONFIGS[args.config]
    if args.layers:
        config = config.with_layers(args.layers)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    weights = LlamaWeights.random(config, dtype, device, args.seed)
    cache = PagedKVCache(
        config.num_layers,
        num_pages,
        PAGE_SIZE,
        config.num_kv_heads,
        config.head_dim,
        dtype,
        device,
    )
    cache.fill_random(torch.Generator(device).manual_seed(args.seed))
    makers: dict[str, Callable[[], Ops]] = {
        "torch": Ops,
        "torch_compile": Ops,
        "flashinfer": FlashinferOps,
        "flashtune": FlashtuneOps,
    }
    models = {}
    for name in args.backends:
        try:
            model = Llama(
                config,
                makers[name](),
                device=device,
                dtype=dtype,
                weights=weights,
                cache=cache,
            )
        except Exception as exc:  # FlashInfer missing: its rows say so
            print(f"{name}: not built ({exc!r})")
            continue
        if name == "torch_compile":
            model.compile(mode=args.compile_mode, dynamic=False)  # a graph per shape
        models[name] = model
    return models


def _tuning(name: str, args: argparse.Namespace) -> Any:
    """flashtune tunes its ops on their first call (as max-autotune does torch's)."""
    if name == "flashtune" and args.tune:
        return autotune(True, cache=args.tune_cache)
    return contextlib.nullcontext()


class _NoRows:
    """RowWriter's interface without the file: a CPU check of the code path measures
    nothing worth keeping in results/."""

    def write(
        self, op: str, shape: dict[str, Any], solution: str, latency_ms: float | None, **extra: Any
    ) -> dict[str, Any]:
        return {"op": op, "shape": shape, "solution": solution, "latency_ms": latency_ms, **extra}


def _time_ms(fn: Callable[[], Any], device: torch.device, repetitions: int) -> float:
    """Median ms of fn() by the project's timer (CUDA events on a GPU, wall clock on CPU);
    fn's inputs live in static buffers, and its weights and KV are far more bytes than the
    L2 holds: every call reads them cold without input copies to rotate."""
    probe = torch.empty(1, device=device)
    return measure(
        lambda _: fn(), [probe], warmup=3, repetitions=repetitions, cold_l2=False
    ).median_ms


def _use_cuda_graph(name: str, args: argparse.Namespace) -> bool:
    if torch.device(args.device).type != "cuda":
        return False
    return not (name == "torch_compile" and args.compile_mode == "reduce-overhead")


def decode_once(
    name: str, model: Llama, tokens: torch.Tensor, step: StepBatch, args: argparse.Namespace
) -> tuple[torch.Tensor, float, dict[str, Any]]:
    """Capture one backend's decode step, time it; (logits, latency_ms, row extras)."""
    extra: dict[str, Any] = {"cuda_graph": _use_cuda_graph(name, args)}
    started = time.perf_counter()
    if name == "flashtune" and args.tune:
        with _tuning(name, args):  # tune on an eager step: never inside a graph capture
            model.forward(tokens, step)
    decode = model.decode_graph(step.batch_size, max(step.kv_lens), extra["cuda_graph"])
    logits = decode.step(tokens, step).clone()  # the first step captures the graph
    extra["setup_s"] = round(time.perf_counter() - started, 2)
    device = torch.device(args.device)
    latency = _time_ms(lambda: decode.step(tokens, step), device, args.repetitions)
    if decode.graph is not None:
        extra["graph_ms"] = _time_ms(decode.graph.replay, device, args.repetitions)
    return logits, latency, extra


def prefill_once(
    name: str, model: Llama, tokens: torch.Tensor, step: StepBatch, args: argparse.Namespace
) -> tuple[torch.Tensor, float, dict[str, Any]]:
    """One backend's prefill (plan + layers, eager), timed; (logits, latency_ms, extras)."""
    started = time.perf_counter()
    with _tuning(name, args):
        logits = model.forward(tokens, step).clone()
    extra: dict[str, Any] = {"setup_s": round(time.perf_counter() - started, 2)}
    latency = _time_ms(
        lambda: model.forward(tokens, step), torch.device(args.device), args.repetitions
    )
    extra["tokens_per_s"] = step.num_tokens / (latency * 1e-3)
    return logits, latency, extra


def run_grid(
    op: str,
    models: dict[str, Llama],
    points: Sequence[tuple[int, int]],
    args: argparse.Namespace,
    rows: Any,
) -> list[dict[str, Any]]:
    """Every backend at every point of `op` ("e2e_decode": (batch, kv_len); "e2e_prefill":
    (prompts, prompt_len)); a row per backend and point, failures included."""
    written = []
    first = next(iter(models.values()))
    config, device = first.config, torch.device(args.device)
    once = decode_once if op == "e2e_decode" else prefill_once
    for batch_size, length in points:
        table = PageTable(first.cache.num_pages, PAGE_SIZE, device)
        if op == "e2e_decode":  # requests of length - 1 random tokens; the step appends one
            requests = [table.add_request(length - 1) for _ in range(batch_size)]
            step = table.step(requests, [1] * batch_size)
            shape = dict(batch=batch_size, kv_len=length)
        else:
            requests = [table.add_request() for _ in range(batch_size)]
            step = table.step(requests, [length] * batch_size)
            shape = dict(batch=batch_size, prompt_len=length)
        shape.update(model=config.name, layers=config.num_layers, page_size=PAGE_SIZE)
        shape["dtype"] = args.dtype
        gen = torch.Generator().manual_seed(args.seed + 7919 * batch_size + length)
        tokens = torch.randint(0, config.vocab_size, (step.num_tokens,), generator=gen)
        tokens = tokens.to(device)
        reference = None
        for name, model in models.items():
            try:
                logits, latency, extra = once(name, model, tokens, step, args)
            except Exception as exc:
                traceback.print_exc()
                written.append(rows.write(op, shape, name, None, error=repr(exc)))
                continue
            if reference is None:  # torch eager when it runs: it comes first
                reference = logits
            extra.update(compare(logits, reference))
            if name == "torch_compile":
                extra["compile_mode"] = args.compile_mode
            print(
                f"{op} {batch_size:4d} x {length:6d} {name:14s} {latency:9.3f} ms  "
                f"rel_err={extra['rel_err']:.1e}  greedy={extra['greedy_match']:.2f}"
            )
            written.append(rows.write(op, shape, name, latency, **extra))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return written


# ----------------------------------------------------------------------- command line


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(part) for part in text.split(",") if part]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]) if __doc__ else None,
    )
    parser.add_argument("--config", default="llama-3.1-8b", choices=sorted(CONFIGS))
    parser.add_argument("--layers", type=int, default=0, help="keep this many layers (0: all)")
    parser.add_argument("--quick", action="store_true", help="the small grid")
    parser.add_argument(
        "--backends",
        type=_csv(str),
        default=list(BACKENDS),
        help=f"comma-separated, of {','.join(BACKENDS)}",
    )
    parser.add_argument("--batches", type=_csv(int), help="decode batch sizes (override)")
    parser.add_argument("--kv-lens", type=_csv(int), help="decode KV lengths (override)")
    parser.add_argument("--max-kv-tokens", type=int, default=MAX_KV_TOKENS)
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument(
        "--compile-mode",
        default="max-autotune-no-cudagraphs",
        help="torch.compile mode of the torch_compile backend",
    )
    parser.add_argument(
        "--no-tune",
        dest="tune",
        action="store_false",
        help="flashtune: default tactics, no autotuning",
    )
    parser.add_argument("--tune-cache", help="flashtune autotuner cache file (load and save)")
    parser.add_argument(
        "--device",
        default="cuda",
        help="cuda; cpu checks the code path (tiny config, Triton interpreter) and writes no rows",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--repetitions", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--loop",
        action="store_true",
        help="issue 19's loop instead of the grid: capture into --dataset, benchmark the "
        "captured workloads, enable_apply, run again (benchmarks/e2e_loop.py)",
    )
    parser.add_argument("--dataset", help="the loop's dataset directory (created)")
    args = parser.parse_args(argv)
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; choose from {', '.join(BACKENDS)}")
    if "torch" in args.backends:  # the reference every other backend is checked against
        args.backends = ["torch"] + [b for b in args.backends if b != "torch"]
    return args


def run_loop_mode(args: argparse.Namespace) -> int:
    """--loop: capture -> benchmark -> apply -> run again on the flashtune model."""
    from e2e_loop import format_report, run_loop

    if not args.dataset:
        print("--loop needs --dataset DIR")
        return 1
    config = CONFIGS[args.config]
    if args.layers:
        config = config.with_layers(args.layers)
    tiny = args.config == "tiny"
    prompt_lens = (5, 9, 3) if tiny else (512, 100, 37)
    model = Llama(
        config,
        "flashtune",
        device=args.device,
        dtype=getattr(torch, args.dtype),
        page_size=4 if tiny else PAGE_SIZE,
        num_pages=64 if tiny else 1024,
        seed=args.seed,
    )
    devices = ["cpu"] if args.device == "cpu" else [str(torch.device(args.device, 0))]
    report = run_loop(
        model, Path(args.dataset), devices, prompt_lens=prompt_lens, decode_steps=8, seed=args.seed
    )
    print(format_report(report))
    return 0 if report.same_tokens else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_e2e needs a GPU (or --device cpu --config tiny for the code path)")
        return 1
    if args.loop:
        return run_loop_mode(args)
    torch._dynamo.config.cache_size_limit = 256  # one graph per grid point, not 8
    points = decode_grid(
        args.batches or (QUICK_BATCHES if args.quick else BATCHES),
        args.kv_lens or (QUICK_KV_LENS if args.quick else KV_LENS),
        args.max_kv_tokens,
    )
    prefill = [] if args.skip_prefill else list(QUICK_PREFILL if args.quick else PREFILL)
    if args.config == "tiny":  # the CPU check: lengths within the tiny RoPE table
        points = [(b, min(n, 64)) for b, n in points]
        prefill = [(2, 16)] if prefill else []
    needed = max(
        pages_for(points, PAGE_SIZE) if points and not args.skip_decode else 1,
        pages_for(prefill, PAGE_SIZE) if prefill else 1,
    )
    models = build_models(args, needed)
    rows = RowWriter("e2e") if args.device == "cuda" else _NoRows()
    written: list[dict[str, Any]] = []
    if not args.skip_decode:
        written += run_grid("e2e_decode", models, points, args, rows)
    if prefill:
        written += run_grid("e2e_prefill", models, prefill, args, rows)
    for op in ("e2e_decode", "e2e_prefill"):
        summary = speedups(written, op)
        if summary:
            rows.write(
                f"{op}_summary",
                {"model": args.config, "layers": args.layers},
                "flashtune",
                None,
                vs=summary,
            )
            for other, s in summary.items():
                g = s["geomean_speedup"]
                print(
                    f"{op}: flashtune vs {other}: "
                    + (f"{g:.3f}x" if g else "-")
                    + f" geomean over {s['shapes']} shapes"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a decode step's time goes, per backend: the Llama model of `flashtune e2e` at one
(batch, KV length), each backend's step run eagerly under torch.profiler, kernels ranked by
their CUDA time (issue 19: which op makes flashtune's step slower or faster than a peer's).

    python benchmarks/profile_e2e.py --batch 1 --kv-len 1024 --backends flashinfer,flashtune
    python benchmarks/profile_e2e.py --config tiny --device cpu --dtype float16   # CPU check

Each backend first runs one eager step (flashtune autotunes there, as `flashtune e2e` does,
unless --no-tune), then `--steps` profiled steps; the table lists per step: the kernel's
time, its launches and its name, top `--top` kernels, then the total. The CUDA-graph replay
of the same step is timed too (the latency `flashtune e2e` reports, without plan and copies).
On CPU the profiler records CPU ops instead: a check of the code path, not a measurement.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flashtune.models.bench import (  # noqa: E402
    E2E_BACKENDS,
    PAGE_SIZE,
    E2EOptions,
    _tuning,
    build_models,
    pages_for,
)
from flashtune.models.paging import PageTable  # noqa: E402


def profile_step(options: E2EOptions, batch: int, kv_len: int, steps: int, top: int) -> None:
    device = torch.device(options.device)
    models = build_models(options, pages_for([(batch, kv_len)], PAGE_SIZE))
    first = next(iter(models.values()))
    table = PageTable(first.cache.num_pages, PAGE_SIZE, device)
    requests = [table.add_request(kv_len - 1) for _ in range(batch)]
    step = table.step(requests, [1] * batch)
    gen = torch.Generator().manual_seed(options.seed)
    tokens = torch.randint(0, first.config.vocab_size, (batch,), generator=gen).to(device)
    on_gpu = device.type == "cuda"
    for name, model in models.items():
        started = time.perf_counter()
        with _tuning(name, options):
            model.forward(tokens, step)
        graph = model.decode_graph(batch, kv_len, use_cuda_graph=on_gpu)
        graph.step(tokens, step)  # captures on a GPU
        replay = ""
        if graph.graph is not None:
            for _ in range(3):
                graph.graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                graph.graph.replay()
            end.record()
            torch.cuda.synchronize()
            replay = f", graph replay {start.elapsed_time(end) / 20:.3f} ms"
        setup = time.perf_counter() - started
        host = _host_times(graph, tokens, step, on_gpu)
        activities = [ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]
        with profile(activities=activities) as prof:
            for _ in range(steps):
                graph.run()
            if on_gpu:
                torch.cuda.synchronize()
        events = prof.key_averages()
        timed = (lambda e: e.device_time_total) if on_gpu else (lambda e: e.self_cpu_time_total)
        total = sum(timed(e) for e in events) / steps / 1e3
        print(f"## {name}: setup {setup:.1f} s{replay}; eager step kernels {total:.3f} ms")
        print(f"  host: {host}")
        for e in sorted(events, key=lambda e: -timed(e))[:top]:
            print(f"  {timed(e) / steps / 1e3:8.3f} ms  x{e.count // steps:3d}  {e.key[:100]}")
        sys.stdout.flush()


def _host_times(graph, tokens, step, on_gpu: bool, n: int = 20) -> str:
    """The host side of a step, which `flashtune e2e`'s latency_ms adds to the replay: the
    attention plan alone, and the whole step (plan, input copies, replay) with the device
    idle before each (medians of n, perf_counter)."""

    def median_ms(fn) -> float:
        times = []
        for _ in range(n):
            if on_gpu:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if on_gpu:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[n // 2]

    plan = median_ms(lambda: graph.attention.plan(step))
    whole = median_ms(lambda: graph.step(tokens, step))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        graph.attention.plan(step)
    prof.disable()
    report = io.StringIO()
    pstats.Stats(prof, stream=report).sort_stats("cumulative").print_stats(12)
    lines = [ln for ln in report.getvalue().splitlines() if ln.strip()][-13:]
    return f"plan {plan:.3f} ms, whole step {whole:.3f} ms; plan profile (x{n}):\n" + "\n".join(
        "    " + ln for ln in lines
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", default="llama-3.1-8b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kv-len", type=int, default=1024)
    ap.add_argument("--backends", default="flashinfer,flashtune", help=",".join(E2E_BACKENDS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-tune", action="store_true", help="flashtune's default tactics")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    opts = ap.parse_args()
    options = E2EOptions(
        config=opts.config,
        layers=opts.layers,
        backends=tuple(opts.backends.split(",")),
        batches=(opts.batch,),
        kv_lens=(opts.kv_len,),
        device=opts.device,
        dtype=opts.dtype,
        tune=not opts.no_tune,
    )
    profile_step(options, opts.batch, opts.kv_len, opts.steps, opts.top)


if __name__ == "__main__":
    main()

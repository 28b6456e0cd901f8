"""End to end (issue 19): a decoder's decode step and prefill on four backends: the Llama
decoder (llama.py) or, with a DeepSeek config (`config="deepseek-v3-tp8"`), the
DeepSeek-V3-shaped MLA decoder (deepseek.py).

    rows = run_e2e(E2EOptions(layers=4, quick=True), JsonlRows(Path("e2e.jsonl")))

The same model (Llama: weights, KV cache pages and inputs shared) built on:
  torch          eager PyTorch: F.linear, F.rms_norm, SDPA over the gathered pages;
  torch_compile  the torch model's layers under torch.compile (`compile_mode`, default
                 "max-autotune-no-cudagraphs": its own CUDA graph would nest in ours;
                 "reduce-overhead" runs without ours);
  flashinfer     FlashInfer's norm / RoPE / activation / attention / sampling, cuBLAS GEMM;
  flashtune      flashtune's ops, autotuned on first use (`tune=False`: defaults only).

Decode: inter-token latency at batch x KV length (each request holds kv_len - 1 tokens of
random K/V, the step appends one): one step captured in a CUDA graph, then timed with
flashtune.timing.measure (CUDA events, median): `latency_ms` is plan + input copies + graph
replay (what a caller waits per token), `graph_ms` the replay alone. Prefill: a ragged batch
of fresh prompts, eager (plan + layers), tokens/s. Before timing, every backend's logits are
compared with torch eager's (relative L2 error, greedy tokens). `flashtune e2e` and
benchmarks/bench_e2e.py are its command lines.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Union

import torch

from flashtune import platform
from flashtune.models.backends import FlashinferOps, FlashtuneOps, Ops
from flashtune.models.deepseek import (
    DEEPSEEK_CONFIGS,
    DeepseekV3,
    DeepseekV3Config,
)
from flashtune.models.llama import CONFIGS, Llama, LlamaConfig
from flashtune.models.paging import PageTable, StepBatch
from flashtune.timing import measure
from flashtune.tune import autotune

__all__ = [
    "E2E_BACKENDS",
    "E2E_CONFIGS",
    "TINY_CONFIGS",
    "Decoder",
    "BATCHES",
    "KV_LENS",
    "QUICK_BATCHES",
    "QUICK_KV_LENS",
    "MAX_KV_TOKENS",
    "PREFILL",
    "QUICK_PREFILL",
    "PAGE_SIZE",
    "DTYPES",
    "DEFAULT_COMPILE_MODE",
    "REL_TOLERANCE",
    "E2EOptions",
    "RowSink",
    "NoRows",
    "JsonlRows",
    "decode_grid",
    "pages_for",
    "compare",
    "geomean",
    "speedups",
    "model_config",
    "device_problem",
    "build_models",
    "time_ms",
    "run_grid",
    "run_e2e",
]

E2E_BACKENDS = ("torch", "torch_compile", "flashinfer", "flashtune")
# Every config `flashtune e2e --config` takes: the Llama-architecture ones (llama.py) and the
# DeepSeek-V3-shaped MLA ones (deepseek.py); the config names the architecture.
E2E_CONFIGS: dict[str, LlamaConfig | DeepseekV3Config] = {**CONFIGS, **DEEPSEEK_CONFIGS}
TINY_CONFIGS = ("tiny", "deepseek-tiny", "deepseek-tiny-moe")  # the CPU checks: small lengths
Decoder = Union[Llama, DeepseekV3]
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
DTYPES = ("bfloat16", "float16")
DEFAULT_COMPILE_MODE = "max-autotune-no-cudagraphs"
# bf16 logits through a few layers: the backends differ by rounding, ~1e-2 relative at most.
REL_TOLERANCE = 5e-2


@dataclass(frozen=True)
class E2EOptions:
    """One benchmark run. `backends` is put in order with torch first (the reference every
    other backend is checked against); batches / kv_lens None: the (quick) grid's."""

    config: str = "llama-3.1-8b"
    layers: int = 0  # keep this many layers (0: all)
    quick: bool = False
    backends: tuple[str, ...] = E2E_BACKENDS
    batches: tuple[int, ...] | None = None
    kv_lens: tuple[int, ...] | None = None
    max_kv_tokens: int = MAX_KV_TOKENS
    skip_decode: bool = False
    skip_prefill: bool = False
    compile_mode: str = DEFAULT_COMPILE_MODE
    tune: bool = True
    tune_cache: str | None = None
    tune_budget_s: float | None = None  # per tuned bucket (autotune(budget_s=...))
    device: str = "cuda"
    dtype: str = "bfloat16"
    repetitions: int = 30
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.backends) - set(E2E_BACKENDS))
        if unknown:
            raise ValueError(f"unknown backends {unknown}; choose from {', '.join(E2E_BACKENDS)}")
        if self.config not in E2E_CONFIGS:
            raise ValueError(f"unknown config {self.config!r}; choose from {sorted(E2E_CONFIGS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: choose from {', '.join(DTYPES)}")
        backends = tuple(self.backends)
        if "torch" in backends:
            backends = ("torch", *(b for b in backends if b != "torch"))
        object.__setattr__(self, "backends", backends)

    def decode_points(self) -> list[tuple[int, int]]:
        """The decode grid's (batch, kv_len) points ([] with skip_decode)."""
        if self.skip_decode:
            return []
        points = decode_grid(
            self.batches or (QUICK_BATCHES if self.quick else BATCHES),
            self.kv_lens or (QUICK_KV_LENS if self.quick else KV_LENS),
            self.max_kv_tokens,
        )
        if self.config in TINY_CONFIGS:  # the CPU check: lengths within the tiny RoPE table
            points = [(b, min(n, 64)) for b, n in points]
        return points

    def prefill_points(self) -> list[tuple[int, int]]:
        """The prefill runs' (prompts, prompt_len) ([] with skip_prefill)."""
        if self.skip_prefill:
            return []
        if self.config in TINY_CONFIGS:
            return [(2, 16)]
        return list(QUICK_PREFILL if self.quick else PREFILL)


# ----------------------------------------------------------------------- result rows


class RowSink(Protocol):
    """Where rows go: benchmarks/common.RowWriter, JsonlRows or NoRows."""

    def write(
        self, op: str, shape: dict[str, Any], solution: str, latency_ms: float | None, **extra: Any
    ) -> dict[str, Any]: ...


class NoRows:
    """A RowSink without a file: a CPU check of the code path measures nothing worth keeping."""

    def write(
        self, op: str, shape: dict[str, Any], solution: str, latency_ms: float | None, **extra: Any
    ) -> dict[str, Any]:
        return {"op": op, "shape": shape, "solution": solution, "latency_ms": latency_ms, **extra}


class JsonlRows:
    """Appends one JSON line per row to `path`, in benchmarks/results/ rows' form: the row,
    then the GPU, library versions, the measured code (platform.code_provenance) and times."""

    def __init__(self, path: Path, device: str | None = None, also: Sequence[Path] = ()) -> None:
        self.path = path
        # Copies (a lent machine's $OUT): a run killed midway still hands back its rows. A
        # copy that is the file itself (--out already under $OUT) is written once.
        self.paths: list[Path] = []
        for p in (path, *also):
            if all(p.resolve() != q.resolve() for q in self.paths):
                self.paths.append(p)
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        env = platform.snapshot(device, run_started=started)
        code = env["code"]
        keys = ("torch", "triton", "cuda", "driver", "flashtune", "flashinfer")
        self.common = {
            "gpu": env["hardware"],
            "versions": {k: env.get(k) for k in keys},
            "commit": code["commit"] or f"files:{code['files'][:12]}",
            "code": code,
            "run_started": started,
        }
        for p in self.paths:
            p.parent.mkdir(parents=True, exist_ok=True)

    def write(
        self, op: str, shape: dict[str, Any], solution: str, latency_ms: float | None, **extra: Any
    ) -> dict[str, Any]:
        row = {"op": op, "shape": shape, "solution": solution, "latency_ms": latency_ms, **extra}
        row.update(self.common, date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        line = json.dumps(row) + "\n"
        for path in self.paths:
            with open(path, "a") as f:  # one whole line per write
                f.write(line)
        return row


# ----------------------------------------------------------------------- pure parts


def decode_grid(
    batches: Iterable[int], kv_lens: Iterable[int], max_tokens: int = MAX_KV_TOKENS
) -> list[tuple[int, int]]:
    """(batch, kv_len) points holding at most max_tokens KV tokens, in order."""
    lengths = list(kv_lens)
    return [(b, n) for b in batches for n in lengths if b * n <= max_tokens]


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


def model_config(name: str, layers: int = 0) -> LlamaConfig | DeepseekV3Config:
    """The named config (either architecture), cut to `layers` layers when given."""
    config = E2E_CONFIGS[name]
    return config.with_layers(layers) if layers else config


def device_problem(device: str, loop: bool = False) -> str | None:
    """Why the run cannot go on this machine (None: it can)."""
    if torch.device(device).type != "cuda" or torch.cuda.is_available():
        return None
    what = "the capture -> run -> apply loop on a GPU" if loop else "the decode grid"
    return (
        f"{what} needs CUDA, and torch sees no GPU here; `--config tiny --device cpu` runs "
        "the same code path on CPU (Triton interpreter)"
        + ("" if loop else ", and `--loop --config tiny --device cpu` the loop")
    )


# ----------------------------------------------------------------------- the models


def build_model(
    config: LlamaConfig | DeepseekV3Config,
    backend: str | Ops,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    page_size: int = PAGE_SIZE,
    num_pages: int = 1024,
    seed: int = 0,
    like: Decoder | None = None,
) -> Decoder:
    """A model of the config's architecture: random weights from `seed` and an empty cache,
    or `like`'s weights and cache (the same model and KV on another backend)."""
    shared: dict[str, Any] = {"weights": None, "cache": None}
    if like is not None:
        shared = {"weights": like.weights, "cache": like.cache}
    options: dict[str, Any] = dict(
        device=device, dtype=dtype, page_size=page_size, num_pages=num_pages, seed=seed, **shared
    )
    if isinstance(config, DeepseekV3Config):
        return DeepseekV3(config, backend, **options)
    return Llama(config, backend, **options)


def build_models(
    options: E2EOptions, num_pages: int, log: Callable[[str], None] = print
) -> dict[str, Decoder]:
    """One model per backend, all on the same weights and KV cache pages (random K/V)."""
    config = model_config(options.config, options.layers)
    device, dtype = torch.device(options.device), getattr(torch, options.dtype)
    makers: dict[str, Callable[[], Ops]] = {
        "torch": Ops,
        "torch_compile": Ops,
        "flashinfer": FlashinferOps,
        "flashtune": FlashtuneOps,
    }
    models: dict[str, Decoder] = {}
    for name in options.backends:
        first = next(iter(models.values()), None)
        try:
            model = build_model(
                config,
                makers[name](),
                device=device,
                dtype=dtype,
                num_pages=num_pages,
                seed=options.seed,
                like=first,
            )
        except Exception as exc:  # FlashInfer missing: its rows say so
            log(f"{name}: not built ({exc!r})")
            continue
        if first is None:
            model.cache.fill_random(torch.Generator(device).manual_seed(options.seed))
        if name == "torch_compile":
            model.compile(mode=options.compile_mode, dynamic=False)  # a graph per shape
        models[name] = model
    return models


def _tuning(name: str, options: E2EOptions) -> Any:
    """flashtune tunes its ops on their first call (as max-autotune does torch's)."""
    if name == "flashtune" and options.tune:
        return autotune(True, cache=options.tune_cache, budget_s=options.tune_budget_s)
    return contextlib.nullcontext()


def time_ms(fn: Callable[[], Any], device: torch.device, repetitions: int) -> float:
    """Median ms of fn() by the project's timer (CUDA events on a GPU, wall clock on CPU);
    fn's inputs live in static buffers, and its weights and KV are far more bytes than the
    L2 holds: every call reads them cold without input copies to rotate."""
    probe = torch.empty(1, device=device)
    return measure(
        lambda _: fn(), [probe], warmup=3, repetitions=repetitions, cold_l2=False
    ).median_ms


def _use_cuda_graph(name: str, options: E2EOptions) -> bool:
    if torch.device(options.device).type != "cuda":
        return False
    return not (name == "torch_compile" and options.compile_mode == "reduce-overhead")


def _decode_once(
    name: str, model: Decoder, tokens: torch.Tensor, step: StepBatch, options: E2EOptions
) -> tuple[torch.Tensor, float, dict[str, Any]]:
    """Capture one backend's decode step, time it; (logits, latency_ms, row extras)."""
    extra: dict[str, Any] = {"cuda_graph": _use_cuda_graph(name, options)}
    started = time.perf_counter()
    if name == "flashtune" and options.tune:
        with _tuning(name, options):  # tune on an eager step: never inside a graph capture
            model.forward(tokens, step)
    decode = model.decode_graph(step.batch_size, max(step.kv_lens), extra["cuda_graph"])
    logits = decode.step(tokens, step).clone()  # the first step captures the graph
    extra["setup_s"] = round(time.perf_counter() - started, 2)
    device = torch.device(options.device)
    latency = time_ms(lambda: decode.step(tokens, step), device, options.repetitions)
    if decode.graph is not None:
        extra["graph_ms"] = time_ms(decode.graph.replay, device, options.repetitions)
    return logits, latency, extra


def _prefill_once(
    name: str, model: Decoder, tokens: torch.Tensor, step: StepBatch, options: E2EOptions
) -> tuple[torch.Tensor, float, dict[str, Any]]:
    """One backend's prefill (plan + layers, eager), timed; (logits, latency_ms, extras)."""
    started = time.perf_counter()
    with _tuning(name, options):
        logits = model.forward(tokens, step).clone()
    extra: dict[str, Any] = {"setup_s": round(time.perf_counter() - started, 2)}
    latency = time_ms(
        lambda: model.forward(tokens, step), torch.device(options.device), options.repetitions
    )
    extra["tokens_per_s"] = step.num_tokens / (latency * 1e-3)
    return logits, latency, extra


def run_grid(
    op: str,
    models: dict[str, Decoder],
    points: Sequence[tuple[int, int]],
    options: E2EOptions,
    rows: RowSink,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every backend at every point of `op` ("e2e_decode": (batch, kv_len); "e2e_prefill":
    (prompts, prompt_len)); a row per backend and point, failures included."""
    written = []
    first = next(iter(models.values()))
    config, device = first.config, torch.device(options.device)
    once = _decode_once if op == "e2e_decode" else _prefill_once
    for batch_size, length in points:
        table = PageTable(first.cache.num_pages, PAGE_SIZE, device)
        if op == "e2e_decode":  # requests of length - 1 random tokens; the step appends one
            requests = [table.add_request(length - 1) for _ in range(batch_size)]
            step = table.step(requests, [1] * batch_size)
            shape: dict[str, Any] = dict(batch=batch_size, kv_len=length)
        else:
            requests = [table.add_request() for _ in range(batch_size)]
            step = table.step(requests, [length] * batch_size)
            shape = dict(batch=batch_size, prompt_len=length)
        shape.update(model=config.name, layers=config.num_layers, page_size=PAGE_SIZE)
        shape["dtype"] = options.dtype
        gen = torch.Generator().manual_seed(options.seed + 7919 * batch_size + length)
        tokens = torch.randint(0, config.vocab_size, (step.num_tokens,), generator=gen)
        tokens = tokens.to(device)
        reference = None
        for name, model in models.items():
            try:
                logits, latency, extra = once(name, model, tokens, step, options)
            except Exception as exc:
                traceback.print_exc()
                written.append(rows.write(op, shape, name, None, error=repr(exc)))
                continue
            if reference is None:  # torch eager when it runs: it comes first
                reference = logits
            extra.update(compare(logits, reference))
            if name == "torch_compile":
                extra["compile_mode"] = options.compile_mode
            log(
                f"{op} {batch_size:4d} x {length:6d} {name:14s} {latency:9.3f} ms  "
                f"rel_err={extra['rel_err']:.1e}  greedy={extra['greedy_match']:.2f}"
            )
            written.append(rows.write(op, shape, name, latency, **extra))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return written


def run_e2e(
    options: E2EOptions, rows: RowSink, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """The decode grid and the prefill runs on every backend, then one summary row per op
    (flashtune's geomean speedup over each other backend); every row written, in order."""
    torch._dynamo.config.cache_size_limit = 256  # one graph per grid point, not 8
    points, prefill = options.decode_points(), options.prefill_points()
    needed = max(
        pages_for(points, PAGE_SIZE) if points else 1,
        pages_for(prefill, PAGE_SIZE) if prefill else 1,
    )
    models = build_models(options, needed, log)
    if not models:
        raise RuntimeError(f"none of the backends {list(options.backends)} could be built")
    written: list[dict[str, Any]] = []
    if points:
        written += run_grid("e2e_decode", models, points, options, rows, log)
    if prefill:
        written += run_grid("e2e_prefill", models, prefill, options, rows, log)
    for op in ("e2e_decode", "e2e_prefill"):
        summary = speedups(written, op)
        if not summary:
            continue
        shape = {"model": options.config, "layers": options.layers}
        written.append(rows.write(f"{op}_summary", shape, "flashtune", None, vs=summary))
        for other, s in summary.items():
            g = s["geomean_speedup"]
            log(
                f"{op}: flashtune vs {other}: "
                + (f"{g:.3f}x" if g else "-")
                + f" geomean over {s['shapes']} shapes"
            )
    return written

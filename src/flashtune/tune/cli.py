"""`flashtune tune`: tune ops ahead of time at a model's shapes, and merge config files.

    flashtune tune --ops gemm,rmsnorm --model llama-3.1-8b --cache cfg.json
    flashtune tune merge rank0.json rank1.json -o cfg.json

Mounted by flashtune's CLI as ``app.add_typer(tune_app, name="tune")``; the tuning itself is
the group's callback (``invoke_without_command=True``), so `merge` is a subcommand beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import typer

from flashtune.models import MODELS, ModelConfig, get_model
from flashtune.tune.cache_file import (
    CacheKey,
    Entry,
    metadata_mismatch,
    read_cache_file,
    write_cache_file,
)
from flashtune.tune.runner import pow2_buckets

__all__ = ["app", "TUNE_TARGETS", "merge_files"]

app = typer.Typer(
    help="Tune ops at a model's shapes over the token buckets, and merge autotune config files.",
    no_args_is_help=False,
)

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _gemm(model: ModelConfig, m: int, dtype: torch.dtype, device: str) -> None:
    from flashtune.ops.gemm import mm

    for n, k in model.gemm_nk():
        mm(
            torch.randn(m, k, dtype=dtype, device=device),
            torch.randn(n, k, dtype=dtype, device=device),
        )


def _norm(name: str) -> Callable[[ModelConfig, int, torch.dtype, str], None]:
    def run(model: ModelConfig, m: int, dtype: torch.dtype, device: str) -> None:
        from flashtune.ops import norm

        fn = getattr(norm, name)
        h = model.hidden_size
        x = torch.randn(m, h, dtype=dtype, device=device)
        w = torch.randn(h, dtype=dtype, device=device)
        if "fused_add" in name:
            fn(x, torch.randn_like(x), w)
        else:
            fn(x, w)

    return run


# op name -> call the public op once at (model, tokens): the op asks the tuner, which
# profiles the bucket. Every op tunes its token dimension in power-of-two buckets.
TUNE_TARGETS: dict[str, Callable[[ModelConfig, int, torch.dtype, str], None]] = {
    "gemm": _gemm,
    "rmsnorm": _norm("rmsnorm"),
    "fused_add_rmsnorm": _norm("fused_add_rmsnorm"),
    "gemma_rmsnorm": _norm("gemma_rmsnorm"),
    "gemma_fused_add_rmsnorm": _norm("gemma_fused_add_rmsnorm"),
}


def _token_buckets(max_tokens: int) -> list[int]:
    out, m = [], 1
    while m <= max_tokens:
        out.append(pow2_buckets(m, max_value=max_tokens))
        m *= 2
    return out


@app.callback(invoke_without_command=True)
def tune(
    ctx: typer.Context,
    ops: str = typer.Option(
        "gemm", "--ops", help=f"Comma-separated ops to tune: {', '.join(TUNE_TARGETS)}."
    ),
    model: str = typer.Option(
        "llama-3.1-8b", "--model", help=f"Model whose shapes to tune: {', '.join(MODELS)}."
    ),
    cache: Path | None = typer.Option(
        None,
        "--cache",
        help="Config file: loaded first (tuned shapes are skipped), merged into on exit.",
    ),
    max_tokens: int = typer.Option(8192, "--max-tokens", help="Largest token bucket to tune."),
    dtype: str = typer.Option("bfloat16", "--dtype", help=f"One of {', '.join(_DTYPES)}."),
    device: str = typer.Option("cuda", "--device", help="Device to tune on."),
) -> None:
    """Tune OPS at MODEL's shapes for every token bucket up to --max-tokens."""
    if ctx.invoked_subcommand is not None:
        return
    from flashtune.tune.tuner import autotune

    names = [o.strip() for o in ops.split(",") if o.strip()]
    unknown = [o for o in names if o not in TUNE_TARGETS]
    if unknown:
        raise typer.BadParameter(
            f"unknown op(s) {unknown}; known: {', '.join(TUNE_TARGETS)}", param_hint="--ops"
        )
    if dtype not in _DTYPES:
        raise typer.BadParameter(f"expected one of {', '.join(_DTYPES)}", param_hint="--dtype")
    try:
        cfg = get_model(model)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        typer.echo(
            "error: --device cuda but no GPU is visible; ops would not reach the tuner", err=True
        )
        raise typer.Exit(2)

    buckets = _token_buckets(max_tokens)
    with autotune(True, cache=str(cache) if cache else None) as tuner:
        before = tuner.stats.shapes_tuned
        for name in names:
            for m in buckets:
                typer.echo(f"tuning {name} {cfg.name} tokens={m}", err=True)
                TUNE_TARGETS[name](cfg, m, _DTYPES[dtype], device)
        tuned = tuner.stats.shapes_tuned - before
        seconds = tuner.stats.seconds
        failures = len(tuner.failures)
    typer.echo(
        f"tuned {tuned} new shape buckets for {', '.join(names)} ({cfg.name}, {len(buckets)} token "
        f"buckets) in {seconds:.1f} s of profiling; {failures} tactics excluded"
        + (f"; saved to {cache}" if cache else "")
    )


def merge_files(paths: list[Path]) -> tuple[dict[CacheKey, Entry], dict[str, Any], int]:
    """Merge config files (later files win on conflicts). Returns (entries, metadata,
    conflicts); ValueError naming the file and field when they are not all from one
    environment, or when a file is missing or corrupt."""
    entries: dict[CacheKey, Entry] = {}
    metadata: dict[str, Any] | None = None
    conflicts = 0
    for path in paths:
        # Each file must parse; agreement is checked between the files below, not against
        # this machine (merging happens anywhere).
        found = read_cache_file(path, expected={})
        if found.status == "absent":
            raise ValueError(f"{path}: no such file")
        if found.status == "corrupt":
            raise ValueError(f"{path}: corrupt ({found.reason})")
        meta = found.metadata or {}
        if metadata is None:
            metadata = dict(meta)
        else:
            bad = metadata_mismatch(meta, metadata)
            if bad is not None:
                name, have, want = bad
                raise ValueError(
                    f"{path}: _metadata.{name} is {have!r} but {paths[0]} has {want!r}; files "
                    "from different environments cannot be merged"
                )
            # Keep the concrete value where the first file had a wildcard.
            for k, v in meta.items():
                if metadata.get(k) == "*" and v != "*":
                    metadata[k] = v
        for key, entry in found.entries.items():
            if key in entries and entries[key] != entry:
                conflicts += 1
            entries[key] = entry
    return entries, metadata or {}, conflicts


@app.command()
def merge(
    files: list[Path] = typer.Argument(..., help="Config files to merge (later ones win)."),
    output: Path = typer.Option(..., "-o", "--output", help="Merged config file to write."),
) -> None:
    """Merge per-rank autotune config files into one (their _metadata must agree)."""
    try:
        entries, metadata, conflicts = merge_files(files)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    write_cache_file(output, entries, metadata)
    typer.echo(
        f"merged {len(files)} files into {output}: {len(entries)} configs"
        + (f", {conflicts} conflicting keys (later files won)" if conflicts else "")
    )

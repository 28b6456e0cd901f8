"""`flashtune tune`: tune ops ahead of time at a model's shapes, and merge config files.

    flashtune tune --ops gemm,rmsnorm --model llama-3.1-8b --cache cfg.json
    flashtune tune merge rank0.json rank1.json -o cfg.json

What an op name means comes from the op schemas (flashtune.tune.targets): each op's example
calls at the model's shapes, re-made at every power-of-two token count up to --max-tokens.
The tuning itself is the group's callback (``invoke_without_command=True``), so `merge` is a
subcommand beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import typer

from flashtune.model_shapes import MODELS, get_model
from flashtune.tune.cache_file import merge_files, write_cache_file
from flashtune.tune.runner import pow2_buckets

if TYPE_CHECKING:
    from flashtune.tune.targets import TuneCall

__all__ = ["app", "register", "tune_targets_for"]

app = typer.Typer(
    help="Tune ops at a model's shapes over the token buckets, and merge autotune config files.",
    no_args_is_help=False,
)

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def tune_targets_for(model: str) -> dict[str, list[TuneCall]]:
    """The tune targets at `model`'s shapes, by op name (every op module imported)."""
    from flashtune.ops import load_all
    from flashtune.schema.dump import model_examples
    from flashtune.tune.targets import tune_targets

    load_all()  # the op modules register their example calls
    return tune_targets(model_examples(get_model(model)))


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
        "gemm",
        "--ops",
        help="Comma-separated op names: the start of their Definitions' names (gemm, rmsnorm, "
        "silu_and_mul, ...); an unknown name lists the known ones.",
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

    if dtype not in _DTYPES:
        raise typer.BadParameter(f"expected one of {', '.join(_DTYPES)}", param_hint="--dtype")
    try:
        cfg = get_model(model)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    targets = tune_targets_for(cfg.name)
    names = [o.strip() for o in ops.split(",") if o.strip()]
    unknown = [o for o in names if o not in targets]
    if unknown:
        raise typer.BadParameter(
            f"unknown op(s) {unknown}; known: {', '.join(sorted(targets))}", param_hint="--ops"
        )
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
                for call in targets[name]:
                    call.run(m, _DTYPES[dtype], device)
        tuned = tuner.stats.shapes_tuned - before
        seconds = tuner.stats.seconds
        failures = len(tuner.failures)
    typer.echo(
        f"tuned {tuned} new shape buckets for {', '.join(names)} ({cfg.name}, {len(buckets)} token "
        f"buckets) in {seconds:.1f} s of profiling; {failures} tactics excluded"
        + (f"; saved to {cache}" if cache else "")
    )


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


def register(root: typer.Typer) -> None:
    """Mount `tune` on the flashtune command."""
    root.add_typer(app, name="tune")

"""`flashtune tune`: tune ops ahead of time at a model's shapes, and merge config files.

    flashtune tune --ops gemm,rmsnorm --model llama-3.1-8b --cache cfg.json
    flashtune tune --ops gemm --model llama-3.1-8b --cache cfg.json --ray auto
    flashtune tune merge rank0.json rank1.json -o cfg.json

With --ray, the (op, token bucket) jobs are dealt over a Ray cluster's GPUs of one model,
each GPU tuning into a cache file of its own; those are merged into --cache with `merge`'s
merge (docs/ray.md).

What an op name means comes from the op schemas (flashtune.tune.targets): each op's example
calls at the model's shapes, re-made at every power-of-two token count up to --max-tokens.
The tuning itself is the group's callback (``invoke_without_command=True``), so `merge` is a
subcommand beside it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import typer

from flashtune.model_shapes import MODELS, get_model
from flashtune.tune.cache_file import merge_files, write_cache_file
from flashtune.tune.runner import pow2_buckets
from flashtune.tune.store import merge_decisions

if TYPE_CHECKING:
    from flashtune.tune.targets import TuneCall

__all__ = ["app", "register", "tune_jobs", "tune_on_cluster", "tune_targets_for"]

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
    budget: float | None = typer.Option(
        None,
        "--budget",
        metavar="SECONDS",
        help="Time budget per tuned bucket (one op at one shape): the search stops there and "
        "keeps the best found so far, never worse than the default.",
    ),
    session_budget: float | None = typer.Option(
        None,
        "--session-budget",
        metavar="SECONDS",
        help="Time budget for the whole run: buckets left when it is spent are not tuned "
        "(a later run tunes them).",
    ),
    ray: str | None = typer.Option(
        None,
        "--ray",
        metavar="ADDRESS",
        help="Spread the jobs over a Ray cluster's GPUs (one model): 'auto', 'host:port' or "
        "'local'; needs --cache, which gets the merged result.",
    ),
) -> None:
    """Tune OPS at MODEL's shapes for every token bucket up to --max-tokens."""
    if ctx.invoked_subcommand is not None:
        return
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
    for hint, value in (("--budget", budget), ("--session-budget", session_budget)):
        if value is not None and not value > 0:
            raise typer.BadParameter("expected a positive number of seconds", param_hint=hint)
    buckets = _token_buckets(max_tokens)
    jobs = [(name, m, cfg.name, dtype) for name in names for m in buckets]
    if ray is not None:
        if cache is None:
            raise typer.BadParameter("--ray needs --cache (the merged result)", param_hint="--ray")
        job_function = functools.partial(
            tune_jobs, budget_s=budget, session_budget_s=session_budget
        )
        summary = tune_on_cluster(ray, jobs, cache, job_function)
        where = f" on the cluster ({ray})"
    else:
        if device.startswith("cuda") and not torch.cuda.is_available():
            typer.echo(
                "error: --device cuda but no GPU is visible; ops would not reach the tuner",
                err=True,
            )
            raise typer.Exit(2)
        summary = tune_jobs(jobs, device, cache, budget_s=budget, session_budget_s=session_budget)
        where = ""
    typer.echo(
        f"tuned {summary['tuned']} new shape buckets for {', '.join(names)} ({cfg.name}, "
        f"{len(buckets)} token buckets){where} in {summary['seconds']:.1f} s of profiling; "
        f"{summary['failures']} tactics excluded" + (f"; saved to {cache}" if cache else "")
    )
    if summary.get("lost"):  # what the other GPUs tuned is saved; the lost jobs are not
        raise typer.Exit(1)


def tune_jobs(
    jobs: list[tuple[str, int, str, str]],
    device: str,
    cache: Path | None,
    budget_s: float | None = None,
    session_budget_s: float | None = None,
) -> dict:
    """Tune each (op name, token bucket, model, dtype) job on `device` inside
    `autotune(cache=..., budget_s=..., session_budget_s=...)`; -> {tuned, seconds,
    failures}. A cluster slot runs it too."""
    from flashtune.tune.tuner import autotune

    targets: dict[str, dict[str, list[TuneCall]]] = {}
    with autotune(
        True,
        cache=str(cache) if cache else None,
        budget_s=budget_s,
        session_budget_s=session_budget_s,
    ) as tuner:
        before = tuner.stats.shapes_tuned
        for name, m, model, dtype in jobs:
            if model not in targets:
                targets[model] = tune_targets_for(model)
            typer.echo(f"tuning {name} {model} tokens={m}", err=True)
            for call in targets[model][name]:
                call.run(m, _DTYPES[dtype], device)
        tuned = tuner.stats.shapes_tuned - before
        return {"tuned": tuned, "seconds": tuner.stats.seconds, "failures": len(tuner.failures)}


def tune_on_cluster(
    address: str, jobs: list[Any], cache: Path, job_function: Callable[..., dict] = tune_jobs
) -> dict:
    """`job_function` (`tune_jobs`) spread over the cluster's GPUs; their caches merged into
    `cache` (the existing file first, so what it holds stays unless a GPU tuned it again).
    -> the summed {tuned, seconds, failures} and `lost`: how many slots were lost."""
    import tempfile

    from flashtune.bench.ray import ClusterError
    from flashtune.bench.ray.spread import spread_jobs

    existing = cache.read_text() if cache.exists() else None
    try:
        outcomes = spread_jobs(address, job_function, jobs, text=existing)
    except ClusterError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    lost = [o for o in outcomes if o.error is not None]
    for o in lost:
        typer.echo(f"warning: {len(o.jobs)} job(s) not tuned: {o.error}", err=True)
    with tempfile.TemporaryDirectory() as folder:
        files = [cache] if existing is not None else []
        for i, o in enumerate(outcomes):
            if o.text:
                files.append(Path(folder) / f"slot{i}.json")
                files[-1].write_text(o.text)
        if files:
            try:
                entries, metadata, _ = merge_files(files)
            except ValueError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from None
            write_cache_file(cache, entries, metadata)
    done = [o.summary for o in outcomes if o.summary is not None]
    return {k: sum(d[k] for d in done) for k in ("tuned", "seconds", "failures")} | {
        "lost": len(lost)
    }


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
    merge_decisions(files, output)
    typer.echo(
        f"merged {len(files)} files into {output}: {len(entries)} configs"
        + (f", {conflicts} conflicting keys (later files won)" if conflicts else "")
    )


def register(root: typer.Typer) -> None:
    """Mount `tune` on the flashtune command."""
    root.add_typer(app, name="tune")

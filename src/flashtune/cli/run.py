"""`flashtune run`: benchmark a dataset (default: the bundled one) on the devices present."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from flashtune.cli.common import bundled_dataset

__all__ = ["register", "run_command"]

# Piped output (CI logs, README transcripts) gets a table wide enough to stay readable.
console = Console(width=None if Console().is_terminal else 150)
err_console = Console(stderr=True, soft_wrap=True)  # paths stay on one line


def run_command(
    dataset: Optional[list[Path]] = typer.Option(
        None, "--dataset", "-d", help="dataset root (repeatable); default: the bundled dataset"
    ),
    definitions: Optional[str] = typer.Option(
        None, "--definitions", help="definition name glob, e.g. 'rmsnorm_*'"
    ),
    solutions: Optional[str] = typer.Option(None, "--solutions", help="solution name glob"),
    op_type: Optional[str] = typer.Option(
        None, "--op-type", help="only definitions of this op_type"
    ),
    devices: Optional[str] = typer.Option(
        None, "--devices", help="GPU indices '0,1' or 'cpu'; default: every GPU, else the CPU"
    ),
    timeout: float = typer.Option(300.0, "--timeout", help="seconds per solution and workload"),
    warmup: Optional[int] = typer.Option(
        None, "--warmup", help="minimum warm-up calls (GPU 10 and >= 25 ms, CPU 1)"
    ),
    iterations: Optional[int] = typer.Option(
        None, "--iterations", help="minimum timed samples per trial (GPU 10 and >= 100 ms, CPU 5)"
    ),
    trials: Optional[int] = typer.Option(
        None, "--trials", help="timing trials, median reported (GPU 3, CPU 1)"
    ),
    timing: str = typer.Option(
        "auto",
        "--timing",
        help="GPU timing: auto (a CUDA graph when capturable, else samples between "
        "device-wide synchronizations), cuda_graph, or cuda_events (never a graph)",
    ),
    rtol: Optional[float] = typer.Option(None, "--rtol", help="override every relative tolerance"),
    atol: Optional[float] = typer.Option(None, "--atol", help="override every absolute tolerance"),
    max_rel_norm: Optional[float] = typer.Option(
        None, "--max-rel-norm", help="override every bound on ||out - ref|| / ||ref||"
    ),
    max_abs: Optional[float] = typer.Option(
        None, "--max-abs", help="override every bound on the largest absolute error"
    ),
    max_workloads: Optional[int] = typer.Option(
        None,
        "--max-workloads",
        help="at most this many workloads per definition, smallest first (CPU default: 2)",
    ),
    baseline: str = typer.Option(
        "torch*", "--baseline", help="glob of the baseline solution names speedups refer to"
    ),
    resume: bool = typer.Option(
        False, "--resume", help="skip triples already traced for this solution and environment"
    ),
    out: Path = typer.Option(
        Path("flashtune-results"), "--out", "-o", help="dataset root whose traces/ get the results"
    ),
    autotune: bool = typer.Option(
        False, "--autotune", help="run the solutions inside flashtune.autotune()"
    ),
    autotune_cache: Optional[Path] = typer.Option(
        None, "--autotune-cache", help="autotune cache file to load and save"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no live progress display"),
) -> None:
    """Check and time every (definition, solution, workload) triple; append Traces to --out."""
    from flashtune.bench.evaluate import BenchConfig
    from flashtune.bench.runner import RunOptions, run_benchmark
    from flashtune.bench.worker import WorkerError, parse_devices
    from flashtune.report.render import summary_table
    from flashtune.report.tables import summarize

    if timing not in ("auto", "cuda_graph", "cuda_events"):
        err_console.print(
            f"[red]error[/red]: --timing {timing}: expected auto, cuda_graph or cuda_events"
        )
        raise typer.Exit(2)
    roots = list(dataset) if dataset else [bundled_dataset()]
    for root in roots:
        if not (root / "definitions").is_dir():
            err_console.print(f"[red]error[/red]: {root}: not a dataset (no definitions/ folder)")
            raise typer.Exit(2)
    out_resolved = out.expanduser().resolve()
    package_dir = bundled_dataset().parent
    if out_resolved.is_relative_to(package_dir):
        err_console.print(
            f"[red]error[/red]: --out {out} is inside the installed package ({package_dir}); "
            "results go to a folder of yours"
        )
        raise typer.Exit(2)
    try:
        device_list = parse_devices(devices)
    except ValueError as exc:
        err_console.print(f"[red]error[/red]: {exc}")
        raise typer.Exit(2) from None
    opts = RunOptions(
        datasets=roots,
        out=out_resolved,
        definitions=definitions,
        solutions=solutions,
        op_type=op_type,
        devices=device_list,
        timeout=timeout,
        config=BenchConfig(
            warmup=warmup,
            iterations=iterations,
            trials=trials,
            timing_method=timing,
            atol=atol,
            rtol=rtol,
            max_rel_norm=max_rel_norm,
            max_abs=max_abs,
        ),
        resume=resume,
        baseline=baseline,
        max_workloads=max_workloads,
        autotune=autotune,
        autotune_cache=autotune_cache,
    )
    try:
        result = run_benchmark(opts, console=console, progress=not quiet)
    except WorkerError as exc:
        err_console.print(f"[red]error[/red]: {exc}")
        raise typer.Exit(1) from None
    for error in result.load_errors:
        err_console.print(
            f"[yellow]warning[/yellow]: {error} (skipped)", markup=True, highlight=False
        )
    env = result.environment
    console.print(
        summary_table(summarize(result.traces), title=f"flashtune run on {env.get('hardware')}")
    )
    counts: dict[str, int] = {}
    for t in result.traces:
        status = t.evaluation.status.value if t.evaluation else "?"
        counts[status] = counts.get(status, 0) + 1
    breakdown = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
    resumed = f", {result.resumed} already traced (--resume)" if result.resumed else ""
    console.print(
        f"{len(result.traces)} triples in {result.seconds:.0f} s ({breakdown or 'nothing to do'})"
        f"{resumed}; torch {env.get('torch')}, triton {env.get('triton')}"
    )
    if result.workload_cap is not None and opts.max_workloads is None:
        console.print(
            f"CPU run: at most {result.workload_cap} workloads per definition (the smallest); "
            "--max-workloads N to change"
        )
    console.print(f"traces: {result.out / 'traces'}  (see `flashtune report summary -d {out}`)")


def register(app: typer.Typer) -> None:
    """Mount `run` on the flashtune command."""
    app.command("run")(run_command)

"""`flashtune run`: benchmark a dataset (default: the bundled one) on the devices present."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from flashtune.cli import stopping
from flashtune.cli.common import (
    bundled_dataset,
    dataset_roots,
    err_console,
    fail,
    missing_blobs,
    not_a_dataset,
    open_dataset,
    warn,
)
from flashtune.cli.output import result_console
from flashtune.cli.run_checks import (
    FAIL_ON,
    Counted,
    Selection,
    check_devices,
    check_selection,
    closing_traces,
    failing_triples,
    print_closing,
)
from flashtune.cli.run_sources import say_attachments, solution_sources

__all__ = ["register", "run_command"]

# Piped output (CI logs, README transcripts): tables as wide as they need, nothing cut.
console = result_console()


def run_command(
    dataset: Optional[list[Path]] = typer.Option(
        None,
        "--dataset",
        "-d",
        help="dataset root (repeatable); default: $FLASHTUNE_DATASET, else the bundled dataset",
    ),
    definitions: Optional[str] = typer.Option(
        None, "--definitions", help="definition name glob, e.g. 'rmsnorm_*'"
    ),
    solutions: Optional[str] = typer.Option(None, "--solutions", help="solution name glob"),
    solutions_from: Optional[list[Path]] = typer.Option(
        None,
        "--solutions-from",
        help="a dataset read for its solutions only (repeatable): they run on the definitions "
        "of --dataset whose contract they were written for; its workloads do not run",
    ),
    bundled_solutions: bool = typer.Option(
        True,
        "--bundled-solutions/--no-bundled-solutions",
        help="attach the bundled dataset's solutions the same way (a dataset written by "
        "capture has none of its own)",
    ),
    op_type: Optional[str] = typer.Option(
        None, "--op-type", help="only definitions of this op_type"
    ),
    devices: Optional[str] = typer.Option(
        None, "--devices", help="GPU indices '0,1' or 'cpu'; default: every GPU, else the CPU"
    ),
    timeout: float = typer.Option(
        300.0,
        "--timeout",
        help="seconds per solution and workload, counted from the end of its first call",
    ),
    first_call_timeout: float = typer.Option(
        900.0,
        "--first-call-timeout",
        help="seconds for a solution's import, setup and first call (JIT compilation), while "
        "they make progress: a compiler runs as its child process, or it uses CPU; one that "
        "does neither for --hang-timeout seconds in a row is killed then as hanging",
    ),
    hang_timeout: float = typer.Option(
        60.0,
        "--hang-timeout",
        help="seconds a solution's import, setup and first call may go without compiling "
        "(no child process) or using CPU before it is killed as hanging (0: never)",
    ),
    warmup: Optional[int] = typer.Option(
        None, "--warmup", help="minimum warm-up calls (GPU 10 and >= 25 ms, CPU 1)"
    ),
    iterations: Optional[int] = typer.Option(
        None,
        "--iterations",
        help="minimum timed samples per trial (GPU 10 and >= 100 ms; CPU 10, then more until "
        "the median's 95% interval is within 5% or 1 s is spent)",
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
    seed: Optional[int] = typer.Option(
        None,
        "--seed",
        help="the seed every input derives from (default: drawn from the operating system "
        "per run; each trace records it as environment.input_seed, so a run can be repeated)",
    ),
    max_workloads: Optional[int] = typer.Option(
        None,
        "--max-workloads",
        help="at most this many workloads per definition, smallest first (default, a quick "
        "run: CPU the 2 smallest, GPU the smallest and the largest)",
    ),
    all_workloads: bool = typer.Option(
        False, "--all", help="every workload of every definition (no quick-run cap)"
    ),
    fail_on: str = typer.Option(
        "none",
        "--fail-on",
        help="exit 1 when a triple did not pass, for CI: 'incorrect' (a wrong answer: shape, "
        "dtype, numerical), 'failed' (also runtime/compile errors and timeouts), 'any' "
        "(also skipped), 'none' (default: exit 0 whatever the statuses)",
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
    ray: Optional[str] = typer.Option(
        None,
        "--ray",
        metavar="ADDRESS",
        help="run on a Ray cluster, one worker per GPU: 'auto' (the cluster `ray start` runs "
        "here), 'host:port' of its head, or 'local' (start one on this machine); docs/ray.md",
    ),
) -> None:
    """Check and time every (definition, solution, workload) triple; append Traces to --out."""
    from flashtune.bench.evaluate import BenchConfig
    from flashtune.bench.ray import ClusterError, RayPool
    from flashtune.bench.runner import RunOptions, run_benchmark
    from flashtune.bench.worker import WorkerError, parse_devices
    from flashtune.data.io import UnsafePathError

    if fail_on not in FAIL_ON:
        fail(f"--fail-on {fail_on}: expected {', '.join(FAIL_ON)}", code=2)
    if all_workloads and max_workloads is not None:
        fail("--all and --max-workloads: pick one", code=2)
    if timing not in ("auto", "cuda_graph", "cuda_events"):
        fail(f"--timing {timing}: expected auto, cuda_graph or cuda_events", code=2)
    roots = dataset_roots(dataset, with_results=False)
    for root in roots:
        problem = not_a_dataset(root)
        if problem is None and not (root / "definitions").is_dir():
            problem = f"{root}: not a dataset to run (no definitions/ folder)"
        if problem is not None:
            fail(problem, code=2)
    out_resolved = out.expanduser().resolve()
    package_dir = bundled_dataset().parent
    if out_resolved.is_relative_to(package_dir):
        fail(
            f"--out {out} is inside the installed package ({package_dir}); "
            "results go to a folder of yours",
            code=2,
        )
    selection = Selection(definitions, solutions, op_type)
    sources = solution_sources(solutions_from, bundled_solutions)
    source = open_dataset(roots, solutions_from=sources)
    check_selection(source, roots, selection)  # says why when nothing attaches
    say_attachments(source, roots, selection)
    blobs = missing_blobs(source, source.find_definitions(op_type, definitions))
    if blobs:
        err_console.print(
            f"note: {len(blobs)} safetensors input(s) of {len({b.workload for b in blobs})} "
            "workload(s) have no blob file: they are synthesized (seeded random data that "
            "satisfies the definition's constraints); `flashtune validate` lists them",
            highlight=False,
        )
    if ray is not None and devices is not None:
        fail("--devices and --ray: a cluster run uses every GPU of the cluster; pick one", code=2)
    try:
        device_list = parse_devices(devices) if ray is None else ["cpu"]
    except ValueError as exc:
        fail(str(exc), code=2)
    problem, visible = check_devices(device_list)
    if problem is not None:
        fail(f"{problem}; visible: {visible}", code=2)
    opts = RunOptions(
        datasets=roots,
        out=out_resolved,
        definitions=definitions,
        solutions=solutions,
        op_type=op_type,
        solutions_from=sources,
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
            first_call_timeout=first_call_timeout,
            hang_timeout=hang_timeout,
            seed=seed,
        ),
        resume=resume,
        baseline=baseline,
        max_workloads=max_workloads,
        all_workloads=all_workloads,
        autotune=autotune,
        autotune_cache=autotune_cache,
    )
    count = Counted()
    # A stop signal at any moment from here on (bench/runner.py aborts the workers; then
    # flashtune/cli/stopping.py prints this and exits with 128 + its number).
    stopping.set_last_words(lambda signal: count.interrupted_message(out, signal))
    pool = None if ray is None else RayPool(ray, autotune_cache=autotune_cache)
    try:
        result = run_benchmark(
            opts,
            console=console,
            progress=not quiet,
            on_trace=count.trace,
            on_start=count.start,
            pool=pool,
        )
    except (WorkerError, ClusterError) as exc:
        fail(str(exc))
    except UnsafePathError as exc:  # --out holds a link leading outside it: nothing ran
        fail(str(exc), code=2)
    except KeyboardInterrupt:  # a program that runs this command without flashtune's handlers
        err_console.print(count.interrupted_message(out, "SIGINT"), highlight=False)
        raise typer.Exit(130) from None
    for error in result.load_errors:
        warn(f"{error} (skipped)")
    for note in result.pool_notes:  # a cluster's triples per node, its lost workers
        err_console.print(f"cluster: {escape(note)}", highlight=False)
    if result.unsigned is not None:
        warn(result.unsigned)
    print_closing(result, opts, out, console)
    for unwritten in result.write_errors:
        err_console.print(f"[red]error[/red]: not written: {escape(unwritten)}", highlight=False)
    if result.write_errors:
        raise typer.Exit(1)
    failing = failing_triples(closing_traces(result, opts)[0], fail_on)
    if failing:
        err_console.print(f"[red]--fail-on {fail_on}[/red]: {failing}", highlight=False)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Mount `run` on the flashtune command."""
    app.command("run")(run_command)

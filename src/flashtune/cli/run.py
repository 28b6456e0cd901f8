"""`flashtune run`: benchmark a dataset (default: the bundled one) on the devices present."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

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
from flashtune.cli.options import command_of
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
from flashtune.cli.solutions import parse_kinds, say_supplied, write_supplied

__all__ = ["RunCommandOptions", "register", "run_command"]

# Piped output (CI logs, README transcripts): tables as wide as they need, nothing cut.
console = result_console()


@dataclass(frozen=True)
class RunCommandOptions:
    """The options of `flashtune run`, one field each (cli/options.py)."""

    dataset: Annotated[
        Optional[list[Path]],
        typer.Option(
            "--dataset",
            "-d",
            help="dataset root (repeatable); default: $FLASHTUNE_DATASET, else the bundled dataset",
        ),
    ] = None
    definitions: Annotated[
        Optional[str], typer.Option("--definitions", help="definition name glob, e.g. 'rmsnorm_*'")
    ] = None
    solutions: Annotated[Optional[str], typer.Option("--solutions", help="solution name glob")] = (
        None
    )
    solutions_from: Annotated[
        Optional[list[Path]],
        typer.Option(
            "--solutions-from",
            help="a dataset read for its solutions only (repeatable): they run on the definitions "
            "of --dataset whose contract they were written for; its workloads do not run",
        ),
    ] = None
    bundled_solutions: Annotated[
        bool,
        typer.Option(
            "--bundled-solutions/--no-bundled-solutions",
            help="attach the bundled dataset's solutions the same way (a dataset written by "
            "capture has none of its own)",
        ),
    ] = True
    with_kinds: Annotated[
        Optional[str],
        typer.Option(
            "--with",
            help="also run solutions made from flashtune's op schemas for every selected "
            "definition whose contract one has: a comma-separated list of flashtune, "
            "flashinfer, torch (written with their definitions into --out, which is read for "
            "its solutions; `flashtune solutions add` writes them into a dataset)",
        ),
    ] = None
    reference_only: Annotated[
        bool,
        typer.Option(
            "--reference-only",
            help="run each definition's reference as its one solution (checked against "
            "itself: it runs on every workload with outputs of the declared shapes and "
            "dtypes; timed): for a dataset with no solutions",
        ),
    ] = False
    op_type: Annotated[
        Optional[str], typer.Option("--op-type", help="only definitions of this op_type")
    ] = None
    devices: Annotated[
        Optional[str],
        typer.Option(
            "--devices", help="GPU indices '0,1' or 'cpu'; default: every GPU, else the CPU"
        ),
    ] = None
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            help="seconds per solution and workload, counted from the end of its first call",
        ),
    ] = 300.0
    first_call_timeout: Annotated[
        float,
        typer.Option(
            "--first-call-timeout",
            help="seconds for a solution's import, setup and first call (JIT compilation), while "
            "they make progress: a compiler runs as its child process, or it uses CPU; one that "
            "does neither for --hang-timeout seconds in a row is killed then as hanging",
        ),
    ] = 900.0
    hang_timeout: Annotated[
        float,
        typer.Option(
            "--hang-timeout",
            help="seconds a solution's import, setup and first call may go without compiling "
            "(no child process) or using CPU before it is killed as hanging (0: never)",
        ),
    ] = 60.0
    warmup: Annotated[
        Optional[int],
        typer.Option("--warmup", help="minimum warm-up calls (GPU 10 and >= 25 ms, CPU 1)"),
    ] = None
    iterations: Annotated[
        Optional[int],
        typer.Option(
            "--iterations",
            help="minimum timed samples per trial (GPU 10 and >= 100 ms; CPU 10, then more until "
            "the median's 95% interval is within 5% or 1 s is spent)",
        ),
    ] = None
    trials: Annotated[
        Optional[int],
        typer.Option("--trials", help="timing trials, median reported (GPU 3, CPU 1)"),
    ] = None
    timing: Annotated[
        str,
        typer.Option(
            "--timing",
            help="GPU timing: auto (a CUDA graph when capturable, else samples between "
            "device-wide synchronizations), cuda_graph, or cuda_events (never a graph)",
        ),
    ] = "auto"
    rtol: Annotated[
        Optional[float], typer.Option("--rtol", help="override every relative tolerance")
    ] = None
    atol: Annotated[
        Optional[float], typer.Option("--atol", help="override every absolute tolerance")
    ] = None
    max_rel_norm: Annotated[
        Optional[float],
        typer.Option("--max-rel-norm", help="override every bound on ||out - ref|| / ||ref||"),
    ] = None
    max_abs: Annotated[
        Optional[float],
        typer.Option("--max-abs", help="override every bound on the largest absolute error"),
    ] = None
    seed: Annotated[
        Optional[int],
        typer.Option(
            "--seed",
            help="the seed every input derives from (default: drawn from the operating system "
            "per run; each trace records it as environment.input_seed, so a run can be repeated)",
        ),
    ] = None
    max_workloads: Annotated[
        Optional[int],
        typer.Option(
            "--max-workloads",
            help="at most this many workloads per definition, smallest first (default, a quick "
            "run: CPU the 2 smallest, GPU the smallest and the largest)",
        ),
    ] = None
    all_workloads: Annotated[
        bool, typer.Option("--all", help="every workload of every definition (no quick-run cap)")
    ] = False
    fail_on: Annotated[
        str,
        typer.Option(
            "--fail-on",
            help="exit 1 when a triple did not pass, for CI: 'incorrect' (a wrong answer: shape, "
            "dtype, numerical), 'failed' (also runtime/compile errors and timeouts), 'any' "
            "(also skipped), 'none' (default: exit 0 whatever the statuses)",
        ),
    ] = "none"
    baseline: Annotated[
        str,
        typer.Option("--baseline", help="glob of the baseline solution names speedups refer to"),
    ] = "torch*"
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="skip triples already traced for this solution and environment"
        ),
    ] = False
    out: Annotated[
        Path, typer.Option("--out", "-o", help="dataset root whose traces/ get the results")
    ] = Path("flashtune-results")
    autotune: Annotated[
        bool, typer.Option("--autotune", help="run the solutions inside flashtune.autotune()")
    ] = False
    autotune_cache: Annotated[
        Optional[Path],
        typer.Option("--autotune-cache", help="autotune cache file to load and save"),
    ] = None
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no live progress display")] = False
    sanitize: Annotated[
        bool,
        typer.Option(
            "--sanitize",
            help="compute-sanitizer memcheck on one call of each solution and workload before "
            "it is timed: an out-of-bounds or misaligned access fails it (RUNTIME_ERROR); "
            "needs a GPU and compute-sanitizer (docs/serve.md)",
        ),
    ] = False
    ray: Annotated[
        Optional[str],
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="run on a Ray cluster, one worker per GPU: 'auto' (the cluster `ray start` runs "
            "here), 'host:port' of its head, or 'local' (start one on this machine); docs/ray.md",
        ),
    ] = None


def run_command(cli: RunCommandOptions) -> None:
    """Check and time every (definition, solution, workload) triple; append Traces to --out."""
    from flashtune.bench.evaluate import BenchConfig
    from flashtune.bench.ray import ClusterError, RayPool
    from flashtune.bench.runner import RunOptions, run_benchmark
    from flashtune.bench.worker import WorkerError, parse_devices
    from flashtune.data.io import UnsafePathError

    if cli.fail_on not in FAIL_ON:
        fail(f"--fail-on {cli.fail_on}: expected {', '.join(FAIL_ON)}", code=2)
    if cli.all_workloads and cli.max_workloads is not None:
        fail("--all and --max-workloads: pick one", code=2)
    if cli.timing not in ("auto", "cuda_graph", "cuda_events"):
        fail(f"--timing {cli.timing}: expected auto, cuda_graph or cuda_events", code=2)
    roots = dataset_roots(cli.dataset, with_results=False)
    for root in roots:
        problem = not_a_dataset(root)
        if problem is None and not (root / "definitions").is_dir():
            problem = f"{root}: not a dataset to run (no definitions/ folder)"
        if problem is not None:
            fail(problem, code=2)
    out_resolved = cli.out.expanduser().resolve()
    package_dir = bundled_dataset().parent
    if out_resolved.is_relative_to(package_dir):
        fail(
            f"--out {cli.out} is inside the installed package ({package_dir}); "
            "results go to a folder of yours",
            code=2,
        )
    solutions_glob, baseline = cli.solutions, cli.baseline
    sources = solution_sources(cli.solutions_from, cli.bundled_solutions)
    if cli.reference_only or cli.with_kinds is not None:
        # Written into --out, read as a solution source: the results folder is then a dataset
        # FlashInfer-Bench reads whole (definitions, solutions, traces).
        if cli.reference_only and (cli.with_kinds is not None or cli.solutions is not None):
            fail("--reference-only runs the references alone: no --with, no --solutions", code=2)
        kinds = parse_kinds(cli.with_kinds) if cli.with_kinds is not None else []
        selected = open_dataset(roots).find_definitions(cli.op_type, cli.definitions)
        found = write_supplied(selected, out_resolved, kinds, cli.reference_only)
        say_supplied(found, f"made from the op schemas into {cli.out}")
        sources = [out_resolved, *sources]
        if cli.reference_only:
            solutions_glob = baseline = "reference@*"
    selection = Selection(cli.definitions, solutions_glob, cli.op_type)
    source = open_dataset(roots, solutions_from=sources)
    check_selection(source, roots, selection)  # says why when nothing attaches
    say_attachments(source, roots, selection)
    blobs = missing_blobs(source, source.find_definitions(cli.op_type, cli.definitions))
    if blobs:
        err_console.print(
            f"note: {len(blobs)} safetensors input(s) of {len({b.workload for b in blobs})} "
            "workload(s) have no blob file: they are synthesized (seeded random data that "
            "satisfies the definition's constraints); `flashtune validate` lists them",
            highlight=False,
        )
    if cli.ray is not None and cli.devices is not None:
        fail("--devices and --ray: a cluster run uses every GPU of the cluster; pick one", code=2)
    try:
        device_list = parse_devices(cli.devices) if cli.ray is None else ["cpu"]
    except ValueError as exc:
        fail(str(exc), code=2)
    problem, visible = check_devices(device_list)
    if problem is not None:
        fail(f"{problem}; visible: {visible}", code=2)
    if cli.sanitize:  # never a silent pass: no sanitizer, no run
        from flashtune.bench.sanitizer import find_compute_sanitizer, unavailable_reason

        why = "a Ray cluster run" if cli.ray is not None else None
        why = why or unavailable_reason(device_list[0], find_compute_sanitizer())
        if why is not None:
            fail(f"--sanitize: compute-sanitizer is not available here ({why})", code=2)
    opts = RunOptions(
        datasets=roots,
        out=out_resolved,
        definitions=cli.definitions,
        solutions=solutions_glob,
        op_type=cli.op_type,
        solutions_from=sources,
        devices=device_list,
        timeout=cli.timeout,
        config=BenchConfig(
            warmup=cli.warmup,
            iterations=cli.iterations,
            trials=cli.trials,
            timing_method=cli.timing,
            atol=cli.atol,
            rtol=cli.rtol,
            max_rel_norm=cli.max_rel_norm,
            max_abs=cli.max_abs,
            first_call_timeout=cli.first_call_timeout,
            hang_timeout=cli.hang_timeout,
            seed=cli.seed,
        ),
        resume=cli.resume,
        baseline=baseline,
        max_workloads=cli.max_workloads,
        all_workloads=cli.all_workloads,
        autotune=cli.autotune,
        autotune_cache=cli.autotune_cache,
        sanitize=cli.sanitize,
    )
    count = Counted()
    # A stop signal at any moment from here on (bench/runner.py aborts the workers; then
    # flashtune/cli/stopping.py prints this and exits with 128 + its number).
    stopping.set_last_words(lambda signal: count.interrupted_message(cli.out, signal))
    pool = None if cli.ray is None else RayPool(cli.ray, autotune_cache=cli.autotune_cache)
    try:
        result = run_benchmark(
            opts,
            console=console,
            progress=not cli.quiet,
            on_trace=count.trace,
            on_start=count.start,
            pool=pool,
        )
    except (WorkerError, ClusterError) as exc:
        fail(str(exc))
    except UnsafePathError as exc:  # --out holds a link leading outside it: nothing ran
        fail(str(exc), code=2)
    except KeyboardInterrupt:  # a program that runs this command without flashtune's handlers
        err_console.print(count.interrupted_message(cli.out, "SIGINT"), highlight=False)
        raise typer.Exit(130) from None
    for error in result.load_errors:
        warn(f"{error} (skipped)")
    for note in result.pool_notes:  # a cluster's triples per node, its lost workers
        err_console.print(f"cluster: {escape(note)}", highlight=False)
    if result.unsigned is not None:
        warn(result.unsigned)
    print_closing(result, opts, cli.out, console)
    for unwritten in result.write_errors:
        err_console.print(f"[red]error[/red]: not written: {escape(unwritten)}", highlight=False)
    if result.write_errors:
        raise typer.Exit(1)
    failing = failing_triples(closing_traces(result, opts)[0], cli.fail_on)
    if failing:
        err_console.print(f"[red]--fail-on {cli.fail_on}[/red]: {failing}", highlight=False)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Mount `run` on the flashtune command."""
    app.command("run")(command_of(RunCommandOptions, run_command))

"""`flashtune serve` (the evaluation service) and `flashtune tool` (the agent tools:
compute-sanitizer and Nsight Compute on one solution). docs/serve.md."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from flashtune.cli.common import dataset_roots, err_console, fail, not_a_dataset
from flashtune.cli.options import command_of

__all__ = ["ServeCommandOptions", "register", "serve_command"]

# `flashtune tool sanitize`'s exit codes: a gate passes on 0 alone.
SANITIZE_EXIT = {"pass": 0, "fail": 1, "unavailable": 3, "error": 4}


@dataclass(frozen=True)
class ServeCommandOptions:
    """The options of `flashtune serve`, one field each (cli/options.py)."""

    dataset: Annotated[
        Optional[list[Path]],
        typer.Option(
            "--dataset",
            "-d",
            help="dataset root (repeatable) whose definitions and workloads the service "
            "evaluates on; default: $FLASHTUNE_DATASET, else the bundled dataset",
        ),
    ] = None
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="dataset root whose traces/ get every evaluation's"),
    ] = Path("flashtune-serve-results")
    host: Annotated[
        str, typer.Option("--host", help="address to listen on (default: this machine only)")
    ] = "127.0.0.1"
    port: Annotated[int, typer.Option("--port", help="TCP port")] = 8000
    token_file: Annotated[
        Optional[Path],
        typer.Option(
            "--token-file",
            help="file holding the bearer token of the write endpoints (mode 600); default: "
            "FLASHTUNE_CACHE_DIR/serve/token, made on first start",
        ),
    ] = None
    devices: Annotated[
        Optional[str],
        typer.Option("--devices", help="GPU indices '0,1' or 'cpu'; default: every GPU, else CPU"),
    ] = None
    ray: Annotated[
        Optional[str],
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="evaluate on a Ray cluster, one worker per GPU: 'auto', 'host:port' of its "
            "head, or 'local' (start one here); docs/ray.md",
        ),
    ] = None
    max_queue: Annotated[
        int, typer.Option("--max-queue", help="queued submissions beyond which POST gets 429")
    ] = 64
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="queued submissions evaluated in one run")
    ] = 64
    max_request_kb: Annotated[
        int, typer.Option("--max-request-kb", help="request body limit (413 above it), KiB")
    ] = 1024
    max_workloads: Annotated[
        Optional[int],
        typer.Option(
            "--max-workloads",
            help="workloads per submission, smallest first (default: `flashtune run`'s quick "
            "cap: CPU the 2 smallest, GPU the smallest and the largest)",
        ),
    ] = None
    all_workloads: Annotated[
        bool, typer.Option("--all", help="every workload of the definition per submission")
    ] = False
    timeout: Annotated[
        float,
        typer.Option("--timeout", help="seconds per solution and workload after its first call"),
    ] = 300.0
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn's log level")] = "info"
    print_openapi: Annotated[
        bool,
        typer.Option("--print-openapi", help="print the service's OpenAPI schema (JSON) and exit"),
    ] = False


def serve_command(cli: ServeCommandOptions) -> None:
    """Serve the benchmark evaluator over HTTP: agents submit solutions, get traces."""
    try:
        from flashtune.serve.app import create_app
        from flashtune.serve.server import serve_forever
    except ImportError as exc:
        fail(f'{exc.name} is not installed; install the extra: pip install "flashtune[serve]"')
    if cli.print_openapi:
        from flashtune.serve.app import openapi_document

        typer.echo(json.dumps(openapi_document(), indent=2, sort_keys=True))
        return
    from flashtune.bench.evaluate import BenchConfig
    from flashtune.bench.worker import parse_devices
    from flashtune.serve.auth import TokenError, load_token
    from flashtune.serve.tasks import EvaluationSettings, Evaluator

    if cli.all_workloads and cli.max_workloads is not None:
        fail("--all and --max-workloads: pick one", code=2)
    roots = dataset_roots(cli.dataset, with_results=False)
    for root in roots:
        problem = not_a_dataset(root)
        if problem is not None:
            fail(problem, code=2)
    if cli.ray is not None and cli.devices is not None:
        fail("--devices and --ray: a cluster evaluates on every GPU of the cluster; pick one", 2)
    if cli.ray is not None:
        try:
            import ray  # noqa: F401
        except ImportError:
            fail('--ray needs the ray extra: pip install "flashtune[ray]"', code=2)
    try:
        devices = ["cpu"] if cli.ray is not None else parse_devices(cli.devices)
        token, token_path, made = load_token(cli.token_file)
    except (ValueError, TokenError, OSError) as exc:
        fail(str(exc), code=2)
    settings = EvaluationSettings(
        datasets=roots,
        out=cli.out.expanduser().resolve(),
        devices=devices,
        timeout=cli.timeout,
        config=BenchConfig(),
        max_workloads=cli.max_workloads,
        all_workloads=cli.all_workloads,
        ray=cli.ray,
    )
    evaluator = Evaluator(settings, max_queue=cli.max_queue, batch_size=cli.batch_size)
    app = create_app(evaluator, token, max_request_bytes=cli.max_request_kb * 1024)
    err_console.print(
        f"flashtune serve on http://{cli.host}:{cli.port} "
        f"({f'Ray cluster {cli.ray}' if cli.ray else ', '.join(devices)}); token "
        f"{'made and written to' if made else 'read from'} {token_path}; traces go to "
        f"{settings.out / 'traces'}",
        highlight=False,
    )
    serve_forever(app, cli.host, cli.port, log_level=cli.log_level)


# The arguments both `flashtune tool` commands take.
_SolutionFile = Annotated[Path, typer.Argument(help="a Solution JSON file")]
_Dataset = Annotated[
    Optional[list[Path]], typer.Option("--dataset", "-d", help="dataset root (repeatable)")
]
_Workload = Annotated[
    Optional[str], typer.Option("--workload", help="workload uuid (default: the smallest)")
]
_Device = Annotated[str, typer.Option("--device", help="the GPU, e.g. cuda:0")]


def _load_target(solution_file: Path, dataset: Optional[list[Path]]) -> tuple:
    from flashtune.data.dataset import Dataset
    from flashtune.data.models import Solution

    try:
        solution = Solution.model_validate_json(solution_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(f"{solution_file}: not a readable Solution: {exc}", code=2)
    roots = dataset_roots(dataset, with_results=False)
    ds = Dataset(roots)
    definition = ds.definitions.get(solution.definition)
    if definition is None:
        fail(f"definition {solution.definition!r} is not in {', '.join(map(str, roots))}", code=2)
    return solution, definition, ds, roots


def sanitize_command(
    solution_file: _SolutionFile,
    dataset: _Dataset = None,
    workload: _Workload = None,
    tools: Annotated[
        str, typer.Option("--tools", help="comma-separated: memcheck, racecheck, initcheck")
    ] = "memcheck,racecheck,initcheck",
    device: _Device = "cuda:0",
    as_json: Annotated[bool, typer.Option("--json", help="the whole report as JSON")] = False,
) -> None:
    """compute-sanitizer on one sandboxed call of a solution; exit 0 only on "pass" (1 fail,
    3 unavailable, 4 error)."""
    from flashtune.bench.sanitizer import sanitize
    from flashtune.serve.tasks import SubmissionError
    from flashtune.serve.tools import pick_workload

    solution, definition, ds, roots = _load_target(solution_file, dataset)
    try:
        chosen = pick_workload(ds, definition, workload)
        result = sanitize(
            definition,
            chosen,
            solution,
            device,
            roots=[str(r) for r in roots],
            tools=[t.strip() for t in tools.split(",") if t.strip()],
        )
    except (SubmissionError, ValueError) as exc:
        fail(str(exc), code=2)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        typer.echo(f"{result.verdict}: {solution.name} on {definition.name} [{chosen.uuid}]")
        if result.detail:
            typer.echo(f"  {result.detail}")
        for report in result.reports:
            typer.echo(f"  {report.tool}: {report.verdict} ({report.errors} errors)")
    raise typer.Exit(SANITIZE_EXIT[result.verdict])


def ncu_command(
    solution_file: _SolutionFile,
    dataset: _Dataset = None,
    workload: _Workload = None,
    kernel_regex: Annotated[
        Optional[str], typer.Option("--kernel", help="only kernels whose name matches (regex)")
    ] = None,
    device: _Device = "cuda:0",
    as_json: Annotated[bool, typer.Option("--json", help="the whole summary as JSON")] = False,
) -> None:
    """Nsight Compute summary of a solution's kernels on one sandboxed call: time, achieved
    DRAM bandwidth and FLOP/s against the device's peaks (exit 0 ok, 3 unavailable, 4 error)."""
    from flashtune.bench.nsight import ncu_summary
    from flashtune.serve.tasks import SubmissionError
    from flashtune.serve.tools import pick_workload

    solution, definition, ds, roots = _load_target(solution_file, dataset)
    try:
        chosen = pick_workload(ds, definition, workload)
    except SubmissionError as exc:
        fail(str(exc), code=2)
    result = ncu_summary(
        definition,
        chosen,
        solution,
        device,
        roots=[str(r) for r in roots],
        kernel_regex=kernel_regex,
    )
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        typer.echo(f"{result.status}: {solution.name} on {definition.name} [{chosen.uuid}]")
        for kernel in result.kernels:
            typer.echo(f"  {kernel.line()}")
        if result.status != "ok":
            typer.echo(f"  {result.detail}")
    raise typer.Exit({"ok": 0, "unavailable": 3}.get(result.status, 4))


def register(app: typer.Typer) -> None:
    """Mount `serve` and the `tool` group on the flashtune command."""
    app.command("serve")(command_of(ServeCommandOptions, serve_command))
    tool = typer.Typer(help="Agent tools on one solution: compute-sanitizer, Nsight Compute.")
    tool.command("sanitize")(sanitize_command)
    tool.command("ncu")(ncu_command)
    app.add_typer(tool, name="tool")

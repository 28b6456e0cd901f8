"""`flashtune e2e`: the Llama decoder end to end (issue 19), and the capture -> run -> apply
loop on it.

    flashtune e2e --layers 4 --quick                  # decode grid + prefill, four backends
    flashtune e2e --loop --dataset /tmp/e2e-loop      # capture, benchmark, apply, run again
    flashtune e2e --config tiny --device cpu --backends torch,flashtune   # the CPU check
    flashtune e2e --config deepseek-v3-tp8 --layers 4 --quick   # the DeepSeek-V3 MLA decoder

The benchmark is flashtune.models.bench; the loop's model side flashtune.models.loop. The
loop's orchestration lives here, in the layer that drives capture, the benchmark runner and
apply (benchmarks/bench_e2e.py runs the same functions).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from flashtune.cli.common import fail
from flashtune.cli.options import command_of

if TYPE_CHECKING:  # the models import torch: `flashtune --help` should not wait for it
    from flashtune.bench.runner import RunResult
    from flashtune.data import Definition, Solution
    from flashtune.models.bench import Decoder, E2EOptions, RowSink
    from flashtune.models.loop import LoopReport

__all__ = [
    "DEFAULT_OUT",
    "E2ECommandOptions",
    "SolutionsFor",
    "register",
    "e2e",
    "bundled_solutions_for",
    "candidates_for",
    "add_solutions",
    "benchmark",
    "winners",
    "run_loop",
    "loop_row",
    "run_loop_command",
]

# Where the rows go by default (benchmarks/results/ of the checkout it runs in).
DEFAULT_OUT = Path("benchmarks") / "results" / "e2e.jsonl"
# The candidates come from the bundled dataset's builder: in a source checkout only.

SolutionsFor = Callable[["Definition"], list["Solution"]]


def _csv_ints(text: Optional[str], flag: str) -> Optional[tuple[int, ...]]:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(",") if part)
    except ValueError:
        fail(f"{flag} takes comma-separated integers, got {text!r}", 2)


@dataclass(frozen=True)
class E2ECommandOptions:
    """The options of `flashtune e2e`, one field each (cli/options.py)."""

    config: Annotated[
        str,
        typer.Option(
            "--config",
            help="the model, which names its architecture: Llama (llama-3.1-8b, qwen3-8b, tiny) "
            "or DeepSeek-V3 MLA (deepseek-v3-tp8, deepseek-v3, kimi-k2-tp8, deepseek-tiny; with "
            "MoE layers: deepseek-v3-moe-tp8, deepseek-tiny-moe); "
            "tiny and deepseek-tiny are the CPU checks",
        ),
    ] = "llama-3.1-8b"
    layers: Annotated[int, typer.Option("--layers", help="keep this many layers (0: all)")] = 0
    quick: Annotated[bool, typer.Option("--quick", help="the small grid")] = False
    backends: Annotated[
        Optional[str],
        typer.Option(
            "--backends", help="comma-separated, of torch,torch_compile,flashinfer,flashtune"
        ),
    ] = None
    batches: Annotated[Optional[str], typer.Option("--batches", help="decode batch sizes")] = None
    kv_lens: Annotated[Optional[str], typer.Option("--kv-lens", help="decode KV lengths")] = None
    max_kv_tokens: Annotated[
        Optional[int],
        typer.Option(
            "--max-kv-tokens", help="skip grid points holding more KV tokens (default 2^21)"
        ),
    ] = None
    skip_decode: Annotated[bool, typer.Option("--skip-decode")] = False
    skip_prefill: Annotated[bool, typer.Option("--skip-prefill")] = False
    compile_mode: Annotated[
        Optional[str],
        typer.Option(
            "--compile-mode",
            help="torch.compile mode of torch_compile (default max-autotune-no-cudagraphs)",
        ),
    ] = None
    tune: Annotated[
        bool, typer.Option("--tune/--no-tune", help="flashtune: autotune on first use")
    ] = True
    tune_cache: Annotated[
        Optional[Path],
        typer.Option("--tune-cache", help="flashtune autotuner cache file (load and save)"),
    ] = None
    tune_budget: Annotated[
        Optional[float],
        typer.Option(
            "--tune-budget",
            help="flashtune: seconds per tuned bucket; the search keeps the best found so far",
        ),
    ] = None
    device: Annotated[
        str,
        typer.Option(
            "--device", help="cuda; cpu checks the code path (Triton interpreter), no rows"
        ),
    ] = "cuda"
    dtype: Annotated[str, typer.Option("--dtype", help="bfloat16 or float16")] = "bfloat16"
    repetitions: Annotated[int, typer.Option("--repetitions")] = 30
    seed: Annotated[int, typer.Option("--seed")] = 0
    loop: Annotated[
        bool,
        typer.Option(
            "--loop",
            help="the loop instead of the grid: capture into --dataset, benchmark the captured "
            "workloads, enable_apply, run again",
        ),
    ] = False
    dataset: Annotated[
        Optional[Path], typer.Option("--dataset", "-d", help="the loop's dataset folder (created)")
    ] = None
    decode_steps: Annotated[int, typer.Option("--decode-steps", help="the loop's decode steps")] = 8
    out: Annotated[Path, typer.Option("--out", help="rows file (JSONL, appended)")] = DEFAULT_OUT


def e2e(cli: E2ECommandOptions) -> None:
    """Decode latency (batch x KV length, CUDA graphs) and prefill throughput of a Llama
    decoder on torch, torch.compile, FlashInfer and flashtune; or, with --loop, capture ->
    `flashtune run` -> enable_apply -> run again on the flashtune model."""
    from flashtune.models.bench import E2EOptions, JsonlRows, NoRows, device_problem, run_e2e

    if cli.loop and cli.dataset is None:
        fail("--loop needs --dataset DIR (the captured workloads and traces go there)", 2)
    problem = device_problem(cli.device, cli.loop)
    if problem is not None:
        fail(problem)
    given: dict[str, Any] = {
        "backends": tuple(b for b in cli.backends.split(",") if b) if cli.backends else None,
        "batches": _csv_ints(cli.batches, "--batches"),
        "kv_lens": _csv_ints(cli.kv_lens, "--kv-lens"),
        "max_kv_tokens": cli.max_kv_tokens,
        "compile_mode": cli.compile_mode,
        "tune_cache": str(cli.tune_cache) if cli.tune_cache else None,
        "tune_budget_s": cli.tune_budget,
    }
    try:
        options = E2EOptions(
            config=cli.config,
            layers=cli.layers,
            quick=cli.quick,
            skip_decode=cli.skip_decode,
            skip_prefill=cli.skip_prefill,
            tune=cli.tune,
            device=cli.device,
            dtype=cli.dtype,
            repetitions=cli.repetitions,
            seed=cli.seed,
            **{k: v for k, v in given.items() if v is not None},
        )
    except ValueError as exc:
        fail(str(exc), 2)
    on_gpu = options.device.startswith("cuda")
    # On a lent GPU machine ($OUT comes back), the rows are copied there as they are written.
    copies = [Path(os.environ["OUT"]) / cli.out.name] if os.environ.get("OUT") else []
    rows: RowSink = JsonlRows(cli.out, options.device, copies) if on_gpu else NoRows()
    if not on_gpu:
        typer.echo(f"{options.device}: checks the code path; no rows are written", err=True)
    if cli.loop:
        assert cli.dataset is not None  # checked first
        report = run_loop_command(options, cli.dataset, cli.decode_steps, rows)
        raise typer.Exit(0 if report.outputs_match else 1)
    run_e2e(options, rows, typer.echo)
    if on_gpu:
        typer.echo(f"rows appended to {cli.out}")


def register(root: typer.Typer) -> None:
    """Mount `e2e` on the flashtune command."""
    root.command("e2e")(command_of(E2ECommandOptions, e2e))


# ----------------------------------------------------------------------- the loop


def bundled_solutions_for() -> SolutionsFor:
    """The bundled dataset's `solutions_for` (flashtune, torch, FlashInfer: the entries each
    op family declares in its `bundle.py`, served by flashtune.bench.entry_points)."""
    from flashtune.ops.bundle import solutions_for

    return solutions_for


def _entry_point_constants() -> dict[str, dict[str, Any]]:
    """Per op_type, the constants the candidates' entry points hard-code: a definition that
    fixes another value (a model's eps=1e-6) is a different function, which they do not
    compute, however close the numbers come."""
    from flashtune.bench.entry_points import RMS_EPS

    return {"rmsnorm": {"eps": RMS_EPS}}


def candidates_for(
    definition: Definition, solutions_for: SolutionsFor
) -> tuple[list[Solution], str | None]:
    """The candidates of a captured definition, or none and why (their constants differ)."""
    from flashtune.schema import constant_mismatches, reference_constants

    fixed = _entry_point_constants().get(definition.op_type, {})
    ours = reference_constants(definition.reference, list(fixed))
    wrong = constant_mismatches(ours, fixed)
    if wrong:
        said = ", ".join(f"{n}={d!r}, the model's {n}={v!r}" for n, (v, d) in wrong.items())
        return [], f"the candidates hard-code {said}"
    try:
        return solutions_for(definition), None
    except ValueError as exc:  # an op no family bundles (say GPT-J-style RoPE): no candidates
        return [], str(exc)


def add_solutions(dataset: Path, solutions_for: SolutionsFor) -> dict[str, str]:
    """Add the candidates of every captured definition that has none yet; the definitions
    left without any, and why."""
    from flashtune.data import Dataset

    ds = Dataset(dataset)
    skipped = {}
    for name, definition in sorted(ds.definitions.items()):
        if ds.solutions_for(name):
            continue
        solutions, why = candidates_for(definition, solutions_for)
        if why is not None:
            skipped[name] = why
        for solution in solutions:
            ds.add_solution(solution)
    return skipped


def benchmark(dataset: Path, devices: Sequence[str], max_workloads: int | None = None) -> RunResult:
    """`flashtune run -d DATASET --devices ... --all` over the captured workloads (every one:
    no quick-run cap unless `max_workloads`): traces written into the dataset, where
    `enable_apply` reads them."""
    from flashtune.bench.runner import RunOptions, run_benchmark

    options = RunOptions(
        datasets=[dataset],
        out=dataset,
        devices=list(devices),
        max_workloads=max_workloads,
        all_workloads=max_workloads is None,
    )
    return run_benchmark(options, progress=False)


def winners(dataset: Path) -> dict[str, str | None]:
    """Per captured definition, the solution apply dispatches to by default (None: no
    solution passed, the op's own path runs)."""
    from flashtune.apply.table import ApplyTable
    from flashtune.data import Dataset

    table = ApplyTable.build(Dataset(dataset))
    names = sorted(Dataset(dataset).definitions)
    return {
        name: (table.definitions[name].default if name in table.definitions else None)
        for name in names
    }


def own_path_winners(dataset: Path, chosen: dict[str, str | None]) -> list[str]:
    """The definitions whose winner is flashtune's own op, as apply decides it
    (ApplyRuntime.winner_runs_the_op_itself: the content its traces measured): the model's
    calls of those ops run themselves under apply."""
    from flashtune.apply import ApplyRuntime
    from flashtune.data import Dataset

    runtime = ApplyRuntime(Dataset(dataset))
    return sorted(
        name
        for name, winner in chosen.items()
        if winner is not None and runtime.winner_runs_the_op_itself(name, winner)
    )


def run_loop(
    model: Decoder,
    dataset: Path,
    devices: Sequence[str],
    *,
    solutions_for: SolutionsFor | None = None,
    prompt_lens: Sequence[int] = (5, 9, 3),
    decode_steps: int = 3,
    seed: int = 0,
    max_workloads: int | None = None,
    rounds: int = 3,
) -> LoopReport:
    """Capture -> benchmark -> apply -> run again: generate with capture on (index tensors
    dumped: the attention workloads need the real page tables; one workload per distinct
    shape), give every captured definition its candidates (default: the bundled builder's
    flashtune / torch / FlashInfer solutions) and benchmark them. Then the comparison, like
    for like: the same prompt, fed the captured run's tokens (teacher forcing), without
    capture, generated `rounds` times without apply and with it in turns (drift falls on
    both); on a GPU, the decode step captured in a CUDA graph without apply and with it,
    replays timed in turns."""
    import torch

    from flashtune.apply import enable_apply
    from flashtune.capture import CaptureConfig, capture
    from flashtune.data import Dataset
    from flashtune.models.loop import LoopReport, capture_step, generate, interleaved_ms

    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (sum(prompt_lens),), generator=gen)
    prompt = prompt.to(model.device)
    with capture(dataset=str(dataset), default=CaptureConfig("dump_int", "shape_only")):
        captured = generate(model, prompt, prompt_lens, decode_steps)
    skipped = add_solutions(dataset, solutions_for or bundled_solutions_for())
    result = benchmark(dataset, devices, max_workloads)
    statuses: dict[str, int] = {}
    for trace in result.traces:
        status = trace.evaluation.status.value if trace.evaluation is not None else "NONE"
        statuses[status] = statuses.get(status, 0) + 1
    befores, afters = [], []
    for _ in range(max(rounds, 1)):
        befores.append(generate(model, prompt, prompt_lens, decode_steps, follow=captured))
        with enable_apply(dataset=str(dataset)):
            afters.append(generate(model, prompt, prompt_lens, decode_steps, follow=captured))
    before, after = befores[0], afters[0]
    replay_before, why_before = capture_step(model, prompt_lens)
    with enable_apply(dataset=str(dataset)):
        replay_after, why_after = capture_step(model, prompt_lens)
    graph_ms: list[float | None] = [None, None]
    if replay_before is not None and replay_after is not None:
        graph_ms = list(interleaved_ms([replay_before, replay_after], model.device))
    chosen = winners(dataset)
    return LoopReport(
        dataset=dataset,
        captured=sorted(Dataset(dataset).definitions),
        traces=len(result.traces),
        statuses=statuses,
        winners=chosen,
        own_path=own_path_winners(dataset, chosen),
        no_candidates=skipped,
        before_ms=statistics.median([g.decode_step_ms for g in befores]),
        after_ms=statistics.median([g.decode_step_ms for g in afters]),
        same_tokens=after.same_tokens(before),
        logits_max_abs_err=after.logits_max_abs_err(before),
        greedy_agreement=after.greedy_agreement(before),
        logits_max_rel_err=after.logits_max_rel_err(before),
        before_graph_ms=graph_ms[0],
        after_graph_ms=graph_ms[1],
        graph_note=why_before or why_after,
    )


def loop_row(report: LoopReport, options: E2EOptions, decode_steps: int) -> dict[str, Any]:
    """The loop's row (op "e2e_loop"): the decode step after apply as its latency, before
    it, the winner of every captured definition and whether the outputs stayed the same."""
    return {
        "op": "e2e_loop",
        "shape": {
            "model": options.config,
            "layers": options.layers,
            "decode_steps": decode_steps,
            "dtype": options.dtype,
        },
        "solution": "flashtune+apply",
        "latency_ms": report.after_ms,
        "before_ms": report.before_ms,
        "winners": report.winners,
        "own_path": report.own_path,
        "statuses": report.statuses,
        "same_tokens": report.same_tokens,
        "logits_max_abs_err": report.logits_max_abs_err,
        "logits_max_rel_err": report.logits_max_rel_err,
        "greedy_agreement": report.greedy_agreement,
        "outputs_match": report.outputs_match,
        "before_graph_ms": report.before_graph_ms,
        "after_graph_ms": report.after_graph_ms,
        "graph_note": report.graph_note,
        "timer": "host clock, eager decode step",
    }


def run_loop_command(
    options: E2EOptions,
    dataset: Path,
    decode_steps: int,
    rows: RowSink,
    log: Callable[[str], None] = typer.echo,
) -> LoopReport:
    """--loop: the flashtune model of `options`, the loop into `dataset`, its report printed
    and written as one row."""
    import torch

    from flashtune.models.loop import format_report, loop_model

    model, prompt_lens = loop_model(
        options.config,
        options.layers,
        device=options.device,
        dtype=options.dtype,
        seed=options.seed,
    )
    where = torch.device(options.device)
    devices = ["cpu"] if where.type == "cpu" else [f"{where.type}:{where.index or 0}"]
    report = run_loop(
        model,
        dataset,
        devices,
        prompt_lens=prompt_lens,
        decode_steps=decode_steps,
        seed=options.seed,
    )
    log(format_report(report))
    row = loop_row(report, options, decode_steps)
    rows.write(row.pop("op"), row.pop("shape"), row.pop("solution"), row.pop("latency_ms"), **row)
    return report

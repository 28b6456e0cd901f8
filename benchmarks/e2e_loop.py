"""Issue 19's loop on the model: capture what it runs, benchmark candidates, apply the best.

    report = run_loop(model, dataset, devices=["cuda:0"])

1. `generate` runs the model (a ragged prefill, then greedy decode steps) under
   `flashtune.capture`: every schema'd op call (GEMM, norms, RoPE, SiLU-and-mul, paged
   attention) writes its Definition and a Workload into `dataset`;
2. `add_solutions` gives every captured definition the candidates `solutions_for` builds
   (the bundled dataset's builder: flashtune, torch and FlashInfer solutions), then
   `benchmark` runs them over the captured workloads (what `flashtune run` does);
3. `enable_apply` on the traces, and the same generation again;
4. the report: the winner each definition got, the decode-step latency before and after,
   and whether the outputs stayed the same (greedy tokens equal, logits close).

The candidates come from the bundled dataset's builder (scripts/build_bundled_dataset.py,
`solutions_for`), loaded from its file: the same flashtune / torch / FlashInfer entry points
as the bundled solutions, for the captured (model-specific) definitions. This orchestration
sits in benchmarks/, above every layer it drives (models, capture, bench, apply).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import flashtune
from flashtune.apply.table import ApplyTable
from flashtune.bench.runner import RunOptions, RunResult, run_benchmark
from flashtune.capture import CaptureConfig
from flashtune.data import Dataset, Definition, Solution
from flashtune.models.llama import Llama

__all__ = [
    "bundled_solutions_for",
    "Generation",
    "LoopReport",
    "generate",
    "capture_generation",
    "add_solutions",
    "benchmark",
    "winners",
    "run_loop",
]

SolutionsFor = Callable[[Definition], list[Solution]]
BUILDER = Path(__file__).resolve().parents[1] / "scripts" / "build_bundled_dataset.py"


def bundled_solutions_for() -> SolutionsFor:
    """The bundled dataset builder's `solutions_for` (flashtune, torch, FlashInfer)."""
    spec = importlib.util.spec_from_file_location("build_bundled_dataset", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    solutions_for: SolutionsFor = module.solutions_for
    return solutions_for


@dataclass
class Generation:
    """What one generation produced: the logits of the prefill and of each decode step, the
    greedy tokens fed back, and the median wall time of a decode step (host clock)."""

    logits: list[torch.Tensor]
    tokens: list[torch.Tensor]
    decode_step_ms: float


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate(
    model: Llama, prompt: torch.Tensor, prompt_lens: Sequence[int], decode_steps: int
) -> Generation:
    """A ragged prefill of `prompt` (the requests' tokens, one after another), then
    `decode_steps` greedy steps through eager forwards (every op call goes through the
    schema hooks, which capture and apply sit on). The model's page table gets new
    requests each call (never released): its cache needs room for every call's."""
    table = model.page_table
    requests = [table.add_request() for _ in prompt_lens]
    logits = model.forward(prompt, table.step(requests, list(prompt_lens)))
    outputs, tokens, times = [logits.clone()], [], []
    for _ in range(decode_steps):
        next_tokens = model.sample(logits)
        tokens.append(next_tokens.clone())
        batch = table.step(requests, [1] * len(prompt_lens))
        _synchronize(model.device)
        start = time.perf_counter()
        logits = model.forward(next_tokens, batch)
        _synchronize(model.device)
        times.append((time.perf_counter() - start) * 1e3)
        outputs.append(logits.clone())
    tokens.append(model.sample(logits).clone())
    return Generation(outputs, tokens, sorted(times)[len(times) // 2] if times else 0.0)


def capture_generation(
    model: Llama,
    dataset: Path,
    prompt: torch.Tensor,
    prompt_lens: Sequence[int],
    decode_steps: int,
) -> Generation:
    """`generate` with capture on into `dataset`: index tensors dumped (the attention
    workloads need the real page tables), one workload per distinct shape."""
    with flashtune.capture(dataset=str(dataset), default=CaptureConfig("dump_int", "shape_only")):
        return generate(model, prompt, prompt_lens, decode_steps)


def add_solutions(dataset: Path, solutions_for: SolutionsFor) -> list[str]:
    """Add the candidates of every captured definition that has none yet; their names."""
    ds = Dataset(dataset)
    added = []
    for name, definition in sorted(ds.definitions.items()):
        if ds.solutions_for(name):
            continue
        for solution in solutions_for(definition):
            ds.add_solution(solution)
            added.append(solution.name)
    return added


def benchmark(dataset: Path, devices: Sequence[str], max_workloads: int | None = None) -> RunResult:
    """`flashtune run -d DATASET --device ...` over the captured workloads: traces written
    into the dataset, where `enable_apply` reads them."""
    options = RunOptions(
        datasets=[dataset], out=dataset, devices=list(devices), max_workloads=max_workloads
    )
    return run_benchmark(options, progress=False)


def winners(dataset: Path) -> dict[str, str | None]:
    """Per captured definition, the solution apply dispatches to by default (None: no
    solution passed, the op's own path runs)."""
    table = ApplyTable.build(Dataset(dataset))
    names = sorted(Dataset(dataset).definitions)
    return {
        name: (table.definitions[name].default if name in table.definitions else None)
        for name in names
    }


@dataclass
class LoopReport:
    """The loop's outcome. `logits_max_abs_err`: over the prefill and every decode step."""

    dataset: Path
    captured: list[str]
    traces: int
    statuses: dict[str, int]
    winners: dict[str, str | None]
    before_ms: float
    after_ms: float
    same_tokens: bool
    logits_max_abs_err: float


def run_loop(
    model: Llama,
    dataset: Path,
    devices: Sequence[str],
    *,
    solutions_for: SolutionsFor | None = None,
    prompt_lens: Sequence[int] = (5, 9, 3),
    decode_steps: int = 3,
    seed: int = 0,
    max_workloads: int | None = None,
) -> LoopReport:
    """Capture -> benchmark -> apply -> run again, on the same prompt both times."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (sum(prompt_lens),), generator=gen)
    prompt = prompt.to(model.device)
    before = capture_generation(model, dataset, prompt, prompt_lens, decode_steps)
    add_solutions(dataset, solutions_for or bundled_solutions_for())
    result = benchmark(dataset, devices, max_workloads)
    statuses: dict[str, int] = {}
    for trace in result.traces:
        status = trace.evaluation.status.value if trace.evaluation is not None else "NONE"
        statuses[status] = statuses.get(status, 0) + 1
    with flashtune.enable_apply(dataset=str(dataset)):
        after = generate(model, prompt, prompt_lens, decode_steps)
    err = max(
        (a.float() - b.float()).abs().max().item()
        for a, b in zip(after.logits, before.logits, strict=True)
    )
    same = all(torch.equal(a, b) for a, b in zip(after.tokens, before.tokens, strict=True))
    return LoopReport(
        dataset=dataset,
        captured=sorted(Dataset(dataset).definitions),
        traces=len(result.traces),
        statuses=statuses,
        winners=winners(dataset),
        before_ms=before.decode_step_ms,
        after_ms=after.decode_step_ms,
        same_tokens=same,
        logits_max_abs_err=err,
    )


def format_report(report: LoopReport) -> str:
    """The report as lines: the winner per definition, latency before/after, outputs."""
    lines = [f"captured {len(report.captured)} definitions into {report.dataset}"]
    lines.append(f"traces: {report.traces} {report.statuses}")
    for name, winner in report.winners.items():
        lines.append(f"  {name}: {winner or '(no passing solution: the op runs itself)'}")
    lines.append(
        f"decode step (median, host clock): {report.before_ms:.3f} ms before apply, "
        f"{report.after_ms:.3f} ms after"
    )
    lines.append(
        f"outputs: greedy tokens {'equal' if report.same_tokens else 'DIFFER'}, "
        f"logits max |diff| {report.logits_max_abs_err:.3g}"
    )
    return "\n".join(lines)

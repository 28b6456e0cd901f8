"""The model's side of issue 19's loop (capture -> benchmark -> apply -> run again): the
generation it runs before and after apply, and the report it ends with. The orchestration,
which drives capture, the benchmark runner and apply (layers above this one), is
`flashtune e2e --loop` (flashtune.cli.e2e.run_loop)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from flashtune.models.bench import (
    PAGE_SIZE,
    REL_TOLERANCE,
    TINY_CONFIGS,
    Decoder,
    build_model,
    compare,
    model_config,
)

__all__ = [
    "Generation",
    "LoopReport",
    "capture_step",
    "generate",
    "interleaved_ms",
    "loop_model",
    "format_report",
]


@dataclass
class Generation:
    """What one generation produced: the logits of the prefill and of each decode step, the
    greedy tokens fed back, and the median wall time of a decode step (host clock)."""

    logits: list[torch.Tensor]
    tokens: list[torch.Tensor]
    decode_step_ms: float

    def same_tokens(self, other: Generation) -> bool:
        return all(torch.equal(a, b) for a, b in zip(self.tokens, other.tokens, strict=True))

    def greedy_agreement(self, other: Generation) -> float:
        """The fraction of (step, request) greedy tokens the two generations agree on."""
        same = sum(int((a == b).sum()) for a, b in zip(self.tokens, other.tokens, strict=True))
        return same / max(sum(t.numel() for t in self.tokens), 1)

    def logits_max_rel_err(self, other: Generation) -> float:
        """The largest relative L2 difference of the two generations' logits over the
        prefill and every step (models.bench.compare's measure, REL_TOLERANCE its bound)."""
        return max(compare(a, b)["rel_err"] for a, b in zip(self.logits, other.logits, strict=True))

    def logits_max_abs_err(self, other: Generation) -> float:
        """The largest |difference| of the two generations' logits, every step included."""
        return max(
            (a.float() - b.float()).abs().max().item()
            for a, b in zip(self.logits, other.logits, strict=True)
        )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate(
    model: Decoder,
    prompt: torch.Tensor,
    prompt_lens: Sequence[int],
    decode_steps: int,
    follow: Generation | None = None,
) -> Generation:
    """A ragged prefill of `prompt` (the requests' tokens, one after another), then
    `decode_steps` greedy steps through eager forwards (every op call goes through the
    schema hooks, which capture and apply sit on). The requests are new each call and
    released at its end (their pages go back to the model's page table).

    follow: feed that generation's tokens instead of this one's greedy picks (teacher
    forcing), so both see the same inputs at every step and their logits compare step by
    step: with random weights the logits are nearly flat, and one near-tie picked the
    other way would make every later step incomparable. `tokens` still records this
    generation's own greedy picks."""
    table = model.page_table
    requests = [table.add_request() for _ in prompt_lens]
    logits = model.forward(prompt, table.step(requests, list(prompt_lens)))
    outputs, tokens, times = [logits.clone()], [], []
    for step in range(decode_steps):
        next_tokens = model.sample(logits)
        tokens.append(next_tokens.clone())
        if follow is not None:
            next_tokens = follow.tokens[step]
        batch = table.step(requests, [1] * len(prompt_lens))
        _synchronize(model.device)
        start = time.perf_counter()
        logits = model.forward(next_tokens, batch)
        _synchronize(model.device)
        times.append((time.perf_counter() - start) * 1e3)
        outputs.append(logits.clone())
    tokens.append(model.sample(logits).clone())
    table.release(requests)
    return Generation(outputs, tokens, statistics.median(times) if times else 0.0)


def capture_step(
    model: Decoder, kv_lens: Sequence[int]
) -> tuple[Callable[[], object] | None, str | None]:
    """(replay, None): one decode step for fresh requests at these KV lengths captured in a
    CUDA graph, as serving runs a step (whatever apply routes is decided here, at capture),
    and the call that replays it; (None, why) off a GPU or where it cannot be captured."""
    if model.device.type != "cuda":
        return None, "no CUDA graphs off a GPU"
    table = model.page_table
    requests = [table.add_request(n - 1) for n in kv_lens]
    step = table.step(requests, [1] * len(kv_lens))
    tokens = torch.zeros(len(kv_lens), dtype=torch.long, device=model.device)
    try:
        decode = model.decode_graph(len(kv_lens), max(kv_lens))
        decode.step(tokens, step)  # warm-up and capture
    except Exception as exc:  # noqa: BLE001 - reported, the eager timings still stand
        return None, f"capture failed: {exc!r:.200}"
    if decode.graph is None:
        return None, "not captured"
    return decode.graph.replay, None


def interleaved_ms(
    runs: Sequence[Callable[[], object]],
    device: torch.device,
    rounds: int = 5,
    repetitions: int = 30,
) -> list[float]:
    """The median ms of each of `runs`, timed in turns (a, b, a, b, ...) so that a drift of
    clocks or temperature during the measurement falls on all of them alike."""
    from flashtune.models.bench import time_ms

    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for fn, samples in zip(runs, times, strict=True):
            samples.append(time_ms(fn, device, repetitions))
    return [statistics.median(samples) for samples in times]


def loop_model(
    config: str, layers: int = 0, *, device: str = "cuda", dtype: str = "bfloat16", seed: int = 0
) -> tuple[Decoder, tuple[int, ...]]:
    """The flashtune model the loop runs (either architecture), and its requests' prompt
    lengths: the tiny configs (the CPU checks) get small pages and prompts, the others a
    realistic ragged batch."""
    tiny = config in TINY_CONFIGS
    model = build_model(
        model_config(config, layers),
        "flashtune",
        device=device,
        dtype=getattr(torch, dtype),
        page_size=4 if tiny else PAGE_SIZE,
        num_pages=64 if tiny else 1024,
        seed=seed,
    )
    return model, (5, 9, 3) if tiny else (512, 100, 37)


@dataclass
class LoopReport:
    """The loop's outcome. `logits_max_abs_err`: over the prefill and every decode step.
    `winners`: per captured definition, the solution apply dispatches to (None: the op runs
    itself); `own_path`: those whose winner is flashtune's own op (the model's call runs the
    op itself); `no_candidates`: definitions given no candidate, and why."""

    dataset: Path
    captured: list[str]
    traces: int
    statuses: dict[str, int]
    winners: dict[str, str | None]
    no_candidates: dict[str, str]
    before_ms: float
    after_ms: float
    same_tokens: bool
    logits_max_abs_err: float
    # The run after apply follows the first run's tokens (generate's `follow`): these
    # compare the two step by step.
    greedy_agreement: float = 1.0
    logits_max_rel_err: float = 0.0
    # The decode step as a CUDA-graph replay before and after apply (capture_step, timed
    # in turns by interleaved_ms; None off a GPU, with the reason in graph_note).
    before_graph_ms: float | None = None
    after_graph_ms: float | None = None
    graph_note: str | None = None
    own_path: list[str] = field(default_factory=list)

    @property
    def outputs_match(self) -> bool:
        """The logits after apply within models.bench.REL_TOLERANCE of those before, at
        every step (the tolerance the e2e grid checks each backend with)."""
        return self.logits_max_rel_err <= REL_TOLERANCE


def format_report(report: LoopReport) -> str:
    """The report as lines: the winner per definition, latency before/after, outputs."""
    lines = [f"captured {len(report.captured)} definitions into {report.dataset}"]
    lines.append(f"traces: {report.traces} {report.statuses}")
    for name, winner in report.winners.items():
        why = report.no_candidates.get(name, "no passing solution")
        if winner is None:
            lines.append(f"  {name}: ({why}: the op runs itself)")
        elif name in report.own_path:
            lines.append(f"  {name}: {winner} (flashtune's own op: it runs itself)")
        else:
            lines.append(f"  {name}: {winner}")
    lines.append(
        f"decode step (median, host clock): {report.before_ms:.3f} ms before apply, "
        f"{report.after_ms:.3f} ms after"
    )
    if report.before_graph_ms is not None and report.after_graph_ms is not None:
        lines.append(
            f"decode step (CUDA-graph replay, median): {report.before_graph_ms:.3f} ms before "
            f"apply, {report.after_graph_ms:.3f} ms after"
        )
    elif report.graph_note:
        lines.append(f"decode step (CUDA-graph replay): not timed ({report.graph_note})")
    verdict = "match" if report.outputs_match else "DIFFER"
    lines.append(
        f"outputs (same tokens fed to both runs): {verdict}, logits relative L2 error at most "
        f"{report.logits_max_rel_err:.2g} (bound {REL_TOLERANCE:g}), max |diff| "
        f"{report.logits_max_abs_err:.3g}; greedy picks agree on "
        f"{report.greedy_agreement:.1%}"
    )
    return "\n".join(lines)

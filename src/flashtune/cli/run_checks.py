"""`flashtune run`'s checks before any worker starts (a selection that selects nothing, a
device that is not there) and its closing words (the table, an interruption)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from flashtune.cli.common import bundled_dataset, fail

if TYPE_CHECKING:
    from flashtune.bench.runner import RunOptions, RunResult
    from flashtune.data import Dataset, Trace

__all__ = [
    "Selection",
    "check_selection",
    "check_devices",
    "visible_devices",
    "Counted",
    "print_closing",
    "closing_traces",
    "FAIL_ON",
    "failing_triples",
]

_EXAMPLES = 5  # names quoted in a message, so it stays one readable line


@dataclass(frozen=True)
class Selection:
    """The --definitions / --solutions globs and the --op-type of a run."""

    definitions: Optional[str] = None
    solutions: Optional[str] = None
    op_type: Optional[str] = None

    def describe(self) -> str:
        given = [
            f"{flag} {value!r}"
            for flag, value in (
                ("--definitions", self.definitions),
                ("--op-type", self.op_type),
                ("--solutions", self.solutions),
            )
            if value is not None
        ]
        return " ".join(given) or "the whole dataset"


def _some(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_EXAMPLES])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _EXAMPLES else "")


def check_selection(ds: Dataset, roots: Sequence[Path], selection: Selection) -> None:
    """Exit 1, saying why, when the selection holds no (definition, solution, workload)."""
    where = ", ".join(map(str, roots))
    every = ds.find_definitions()
    defs = ds.find_definitions(selection.op_type, selection.definitions)
    if not every:
        fail(f"no definitions in {where}")
    if not defs:
        op_types = sorted({d.op_type for d in every})
        fail(
            f"{selection.describe()} selects none of the {len(every)} definitions in {where} "
            f"(op types: {', '.join(op_types)}; names such as {_some([d.name for d in every])}); "
            "`flashtune list definitions` lists them"
        )
    with_any = [d for d in defs if ds.solutions_for(d.name)]
    if not with_any:
        fail(_no_solutions(ds, roots, defs))
    chosen = [d for d in with_any if ds.solutions_for(d.name, selection.solutions)]
    if not chosen:
        names = sorted({s.name for d in with_any for s in ds.solutions_for(d.name)})
        fail(
            f"--solutions {selection.solutions!r} matches none of the solutions of the "
            f"{len(with_any)} selected definitions ({_some(names)})"
        )
    if not any(ds.workloads_for(d.name) for d in chosen):
        fail(
            f"the {len(chosen)} selected definitions with solutions have no workloads in {where} "
            f"({_some([d.name for d in chosen])})"
        )


def _no_solutions(ds: Dataset, roots: Sequence[Path], defs: Sequence[Any]) -> str:
    """Why nothing can run: no solution in the roots, none attached from the sources of
    solutions (`Dataset.solution_sources`); and why, or where some could come from."""
    from flashtune.data import Dataset

    where = ", ".join(map(str, roots))
    sources = ", ".join(map(str, ds.solution_sources))
    also = f" or attached from {sources}" if sources else ""
    message = (
        f"no solutions for the {len(defs)} selected definitions in {where}{also}: nothing to run"
    )
    names = {d.name for d in defs}
    unattached = [u for u in ds.unattached if u.definition in names]
    if unattached:  # the likeliest surprise: a captured definition of another dtype or eps
        shown = "; ".join(u.message() for u in unattached[:_EXAMPLES])
        more = f"; and {len(unattached) - _EXAMPLES} more" if len(unattached) > _EXAMPLES else ""
        return (
            f"{message}; {shown}{more}. Add solutions for these definitions under "
            "<dataset>/solutions/, or capture calls of the dtypes and constants the "
            "solutions were written for"
        )
    bundled = bundled_dataset()
    resolved = [r.expanduser().resolve() for r in [*roots, *ds.solution_sources]]
    if bundled not in resolved:  # --no-bundled-solutions: would the bundled ones attach?
        probe = Dataset(ds.roots, solution_sources=[bundled])
        usable = sorted({s.name for d in defs for s in probe.solutions_for(d.name)})
        if usable:
            return (
                f"{message}; the bundled dataset has solutions for these definitions "
                f"({_some(usable)}): leave out --no-bundled-solutions"
            )
    return (
        f"{message}; the bundled dataset has no solution for these definitions either: add "
        "solutions under <dataset>/solutions/, or name a dataset that has some with "
        "--solutions-from"
    )


def visible_devices() -> str:
    """One line naming the devices this process can see."""
    import torch

    if not torch.cuda.is_available():
        why = "torch built without CUDA" if torch.version.cuda is None else "no CUDA GPU found"
        return f"cpu only ({why}; torch {torch.__version__})"
    gpus = [f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count())]
    return ", ".join([*gpus, "cpu"])


def check_devices(devices: Sequence[str]) -> tuple[Optional[str], str]:
    """(what is wrong with `devices`, or None; the visible devices), checked before any
    worker starts: a worker on a missing GPU dies with a traceback, not a sentence."""
    import torch

    cuda = [d for d in devices if d != "cpu"]
    if not cuda:
        return None, "cpu"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = []
    for device in cuda:
        index = device.partition(":")[2]
        if device.partition(":")[0] != "cuda" or (index and not index.isdigit()):
            missing.append(device)
        elif int(index or 0) >= count:
            missing.append(device)
    visible = visible_devices()
    if missing:
        return f"--devices: {', '.join(missing)} not visible", visible
    return None, visible


class Counted:
    """Counts the triples of a run as they finish, for the message of an interruption."""

    def __init__(self) -> None:
        self.total: Optional[int] = None
        self.done = 0

    def start(self, total: int) -> None:
        self.total = total

    def trace(self, trace: Trace) -> None:
        self.done += 1

    def interrupted_message(self, out: Path, signal: str) -> str:
        of = f" of {self.total}" if self.total is not None else ""
        return (
            f"interrupted by {signal} after {self.done}{of} triples; traces so far in {out}; "
            "`flashtune run --resume` continues"
        )


def closing_traces(result: RunResult, opts: RunOptions) -> tuple[list[Trace], int]:
    """The traces the closing table covers, and how many of the results folder it leaves out.

    After --resume, every trace of the selection in the results folder that was measured in
    this run's environment (what ran before and what ran now), so the table covers the whole
    selection; other environments' traces are left out (counted), never mixed in."""
    from flashtune.bench.runner import environment_key
    from flashtune.data import Dataset

    if not opts.resume:
        return list(result.traces), 0
    sink = Dataset(result.out)
    names = sorted({t.definition for t in result.traces} | _selected(opts))
    key = environment_key(result.environment)
    kept, other = [], 0
    for name in names:
        for t in sink.traces_for(name):
            if opts.solutions is not None and not _matches(t.solution, opts.solutions):
                continue
            if t.evaluation is not None and environment_key(t.evaluation.environment) != key:
                other += 1
                continue
            kept.append(t)
    return kept, other


def _matches(name: Optional[str], pattern: str) -> bool:
    from fnmatch import fnmatchcase

    return name is not None and fnmatchcase(name, pattern)


def _selected(opts: RunOptions) -> set[str]:
    from flashtune.data import Dataset

    ds = Dataset(opts.datasets)
    return {d.name for d in ds.find_definitions(opts.op_type, opts.definitions)}


def print_closing(result: RunResult, opts: RunOptions, out: Path, console: Any) -> None:
    """The table per definition and solution, the counts, and where the traces are."""
    from flashtune.bench import isolation
    from flashtune.data import correct_not_timed
    from flashtune.report.render import summary_table
    from flashtune.report.tables import latest, summarize

    env = result.environment
    traces, other = closing_traces(result, opts)
    title = f"flashtune run on {env.get('hardware')}"
    if opts.resume:
        title += f" (all of {out} for this selection)"
    console.print(summary_table(summarize(traces), title=title))
    counts: dict[str, int] = {}
    for t in latest(traces):
        status = t.evaluation.status.value if t.evaluation else "?"
        if correct_not_timed(t.evaluation):  # a Triton solution checked in the interpreter
            status = "correct, not timed"
        counts[status] = counts.get(status, 0) + 1
    breakdown = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
    if opts.resume:
        summary = (
            f"{len(result.traces)} triples in {result.seconds:.0f} s, {result.resumed} already "
            f"traced (--resume); the table: {breakdown or 'nothing traced'}"
        )
    else:
        summary = f"{len(result.traces)} triples in {result.seconds:.0f} s ({breakdown})"
    console.print(f"{summary}; torch {env.get('torch')}, triton {env.get('triton')}")
    # How the solutions were isolated from the harness, loud where they were not (the
    # worker's probe, as every trace's environment records it).
    sandbox = env.get("sandbox")
    style = "" if isolation.isolated(sandbox) else "bold red"
    console.print(
        isolation.describe(sandbox), style=style, highlight=False, markup=False, soft_wrap=True
    )
    if other:
        console.print(f"{other} traces in {out} from other environments are not in the table")
    if result.workload_cap is not None and opts.max_workloads is None:
        console.print(
            f"quick run: at most {result.workload_cap} workloads per definition "
            f"({result.workload_pick}); --all runs every workload, --max-workloads N the N "
            "smallest"
        )
    console.print(f"traces: {result.out / 'traces'}  (see `flashtune report summary -d {out}`)")


# --fail-on: which statuses fail a run (exit 1), from the narrowest to the widest.
_WRONG = ("INCORRECT_SHAPE", "INCORRECT_DTYPE", "INCORRECT_NUMERICAL")
_BROKEN = (*_WRONG, "RUNTIME_ERROR", "COMPILE_ERROR", "TIMEOUT")
FAIL_ON: dict[str, tuple[str, ...]] = {
    "none": (),
    "incorrect": _WRONG,
    "failed": _BROKEN,
    "any": (*_BROKEN, "SKIPPED"),
}


def failing_triples(traces: Sequence[Trace], fail_on: str) -> str:
    """'' when no trace has a status `fail_on` counts, else what failed ("3 of 40 triples:
    2 timeout, 1 incorrect_numerical (gemm_n4096_k4096 flashtune@...)")."""
    from flashtune.report.tables import latest

    statuses = FAIL_ON[fail_on]
    from flashtune.data.models import correct_not_timed

    # A solution checked correct but not timed (a Triton kernel in the CPU's interpreter) is
    # recorded SKIPPED; it failed nothing, so no level counts it.
    bad = [
        t
        for t in latest(traces)
        if t.evaluation is not None
        and t.evaluation.status.value in statuses
        and not correct_not_timed(t.evaluation)
    ]
    if not bad:
        return ""
    counts: dict[str, int] = {}
    for t in bad:
        assert t.evaluation is not None
        status = t.evaluation.status.value.lower()
        counts[status] = counts.get(status, 0) + 1
    breakdown = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    first = ", ".join(f"{t.definition} {t.solution}" for t in bad[:3])
    more = f", and {len(bad) - 3} more" if len(bad) > 3 else ""
    return f"{len(bad)} of {len(latest(traces))} triples: {breakdown} ({first}{more})"

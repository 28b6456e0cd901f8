"""`flashtune traces trust PATH...`: import traces measured elsewhere, deliberately.

apply uses only traces signed with this user's key (`flashtune.data.signing`): those
`flashtune run` wrote here. Traces from anywhere else (a colleague's run, a published
dataset, FlashInfer-Bench) are used only once the user has looked at them and trusted them:
this command lists what each file holds (traces, statuses, solutions, why each is not
trusted yet), asks, and signs them with this user's key. apply still checks everything
else about them (the solution's content hash, the environment, the tolerances, the time).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from flashtune.cli.common import DATASET_PARTS, fail, warn

__all__ = ["register", "trace_files"]

app = typer.Typer(help="Trust traces measured elsewhere (see docs/capture-and-apply.md).")
console = Console(soft_wrap=True)

# The folders of a dataset root that hold traces (FlashInfer-Bench's, and flashtune's skips).
_TRACE_FOLDERS = ("traces", "skipped")
_SHOWN = 5


def trace_files(path: Path) -> tuple[Path, list[Path], list[Path]]:
    """(the root writes are confined to, the trace files PATH names, the symbolic links
    skipped): a .jsonl file; a dataset root (every .jsonl under its traces/ and skipped/);
    any other folder (every .jsonl under it). Links are never followed: trusting a file
    rewrites it, and a link could lead anywhere."""
    if path.is_symlink():
        fail(f"{path} is a symbolic link: name the file or folder it points to", code=2)
    if path.is_file():
        if path.suffix != ".jsonl":
            fail(f"{path}: not a trace file (.jsonl) nor a folder", code=2)
        return path.parent.resolve(), [path.resolve()], []
    if not path.is_dir():
        fail(f"{path}: no such file or folder", code=2)
    root = path.resolve()
    is_dataset = any((root / part).is_dir() for part in DATASET_PARTS)
    tops = [root / f for f in _TRACE_FOLDERS] if is_dataset else [root]
    files: list[Path] = []
    links: list[Path] = []
    for top in tops:
        if top.is_symlink():
            links.append(top)
            continue
        if not top.is_dir():
            continue
        for found in sorted(top.rglob("*.jsonl")):
            if any(p.is_symlink() for p in [found, *found.parents] if p.is_relative_to(root)):
                links.append(found)
            elif found.is_file():
                files.append(found)
    return root, files, links


def _describe(traces: list) -> str:
    statuses = Counter(
        t.evaluation.status.value.lower() if t.evaluation else "workload" for t in traces
    )
    solutions = sorted({t.solution for t in traces if t.solution})
    names = ", ".join(solutions[:_SHOWN]) + (", ..." if len(solutions) > _SHOWN else "")
    counts = ", ".join(f"{n} {s}" for s, n in statuses.most_common())
    return f"{len(traces)} traces ({counts}) of {len(solutions)} solutions: {names}"


@app.command("trust")
def trust(
    paths: list[Path] = typer.Argument(
        ...,
        help="trace files (.jsonl), dataset roots (their traces/ and skipped/) or folders "
        "of trace files",
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="sign without asking"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="list what would be trusted; sign nothing"
    ),
) -> None:
    """Sign traces measured elsewhere with this user's key, so that apply uses them, after
    listing what each file holds. apply still checks each trace's solution hash,
    environment, tolerances and time."""
    from flashtune.data.signing import (
        TRACES,
        ChangedFileError,
        SigningKeyError,
        TrustedFile,
        key_id,
        trust_trace_file,
        user_key,
    )

    try:
        key = user_key(TRACES)
    except SigningKeyError as exc:
        fail(f"no key to sign with: {exc}")
    plans: list[tuple[Path, TrustedFile]] = []
    for path in paths:
        root, files, links = trace_files(path)
        for link in links:
            warn(f"{link}: a symbolic link, not followed (nothing signed through it)")
        if not files:
            warn(f"{path}: no trace files (.jsonl) found")
        for file in files:
            try:
                plans.append((root, trust_trace_file(file, root, key, write=False)))
            except OSError as exc:
                warn(f"{file}: cannot read: {exc.strerror or exc}")
    to_sign = [(root, plan) for root, plan in plans if plan.signed]
    total = sum(len(plan.signed) for _, plan in to_sign)
    for _, plan in plans:
        where = escape(str(plan.path))
        if plan.signed:
            why = ", ".join(f"{n} {reason}" for reason, n in sorted(plan.previously.items()))
            console.print(f"{where}: {escape(_describe(plan.signed))}; now: {escape(why)}")
        if plan.already:
            console.print(f"{where}: {plan.already} already signed with your key (unchanged)")
        for problem in plan.unreadable[:_SHOWN]:
            warn(f"{plan.path} {problem} (left as it is, not trusted)")
        if len(plan.unreadable) > _SHOWN:
            warn(f"{plan.path}: ... and {len(plan.unreadable) - _SHOWN} more unreadable lines")
    if not total:
        console.print("nothing to trust: every readable trace already carries your signature")
        return
    console.print(
        f"{total} traces in {len(to_sign)} files will be signed with your key "
        f"(key id {key_id(key)}): apply will use them as if `flashtune run` had measured "
        "them here (it still checks their solution hashes, environment, tolerances and time)."
    )
    if dry_run:
        console.print("--dry-run: nothing signed")
        return
    if not yes and not typer.confirm(f"Trust these {total} traces?", default=False):
        fail("nothing signed (--yes signs without asking)")
    signed = 0
    for root, plan in to_sign:
        try:
            done = trust_trace_file(plan.path, root, key, expect_digest=plan.digest)
        except (ChangedFileError, OSError) as exc:
            warn(str(exc))
            continue
        signed += len(done.signed)
    console.print(f"signed {signed} traces")
    if signed < total:
        raise typer.Exit(1)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="traces")

"""`flashtune capture run script.py [args]`: run a Python program with capture on."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Optional

import typer

__all__ = ["register"]

app = typer.Typer(help="Record the workloads a program runs.", no_args_is_help=True)


@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    script: Path = typer.Argument(..., help="the Python program to run"),
    dataset: Optional[Path] = typer.Option(
        None, "--dataset", "-d", help="dataset root (default FLASHTUNE_DATASET)"
    ),
    dump: str = typer.Option(
        "dump_int", "--dump", help="dump_none, dump_int, dump_all or input names (a,b)"
    ),
    filter_policy: str = typer.Option(
        "shape_only",
        "--filter",
        help="keep_all, keep_first, keep_first_k, keep_first_k_by_axes, shape_only, keep_none",
    ),
) -> None:
    """Run SCRIPT (remaining arguments are its own) with every schema'd op call captured."""
    from flashtune.capture.api import Capturer, as_dataset, env_config
    from flashtune.schema import add_hook, remove_hook

    os.environ["FLASHTUNE_CAPTURE_DUMP_POLICY"] = dump
    os.environ["FLASHTUNE_CAPTURE_FILTER_POLICY"] = filter_policy
    capturer = Capturer(as_dataset(dataset), {}, env_config()).start()
    add_hook(capturer)
    sys.argv = [str(script), *ctx.args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        remove_hook(capturer)
        capturer.close()
        stats = capturer.stats
        typer.echo(
            f"captured {stats['written']} workloads into {capturer.dataset.root} "
            f"({stats['dropped']} dropped)",
            err=True,
        )


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="capture")

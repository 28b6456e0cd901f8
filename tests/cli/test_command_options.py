"""cli/options.command_of: a command's options declared once, as dataclass fields, reach
typer as if they were the function's parameters, and the function gets one object."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.main import get_command
from typer.testing import CliRunner

from flashtune.cli import app
from flashtune.cli.e2e import E2ECommandOptions, e2e
from flashtune.cli.options import command_of
from flashtune.cli.run import RunCommandOptions, run_command


@dataclass(frozen=True)
class Args:
    name: Annotated[str, typer.Option("--name", "-n", help="who to greet")] = "world"
    times: Annotated[int, typer.Option("--times", help="how often")] = 1
    loud: Annotated[bool, typer.Option("--loud/--quiet", help="shout")] = False
    out: Annotated[Optional[Path], typer.Option("--out")] = None


def test_fields_become_options_and_the_body_gets_one_object() -> None:
    seen: list[Args] = []

    def greet(args: Args) -> None:
        """Say hello."""
        seen.append(args)

    toy = typer.Typer()
    toy.command("greet")(command_of(Args, greet))
    toy.command("other")(lambda: None)  # two commands: "greet" stays a sub-command
    runner = CliRunner()
    result = runner.invoke(toy, ["greet", "-n", "you", "--times", "3", "--loud"])
    assert result.exit_code == 0, result.output
    assert seen == [Args(name="you", times=3, loud=True, out=None)]
    assert runner.invoke(toy, ["greet"]).exit_code == 0 and seen[-1] == Args()
    shown = runner.invoke(toy, ["greet", "--help"], env={"COLUMNS": "200"}).output
    assert "Say hello." in shown and "who to greet" in shown and "--loud" in shown
    assert "[default: world]" in shown


def test_run_and_e2e_take_one_object_and_keep_every_option() -> None:
    commands = get_command(app).commands
    for name, options, body in (
        ("run", RunCommandOptions, run_command),
        ("e2e", E2ECommandOptions, e2e),
    ):
        assert len(inspect.signature(body).parameters) == 1
        params = {p.name: p for p in commands[name].params if p.name != "help"}
        fields = {f.name: f for f in dataclasses.fields(options)}
        assert list(params) == list(fields)
        assert all(params[n].default == fields[n].default for n in fields)
        assert commands[name].help == inspect.getdoc(body)

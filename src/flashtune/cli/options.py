"""Commands whose options are the fields of one frozen dataclass.

A command with many options (`flashtune run`, `flashtune e2e`) declares each option once,
as a field annotated the way typer reads a parameter::

    @dataclass(frozen=True)
    class Args:
        quick: Annotated[bool, typer.Option("--quick", help="the small grid")] = False

    def e2e(args: Args) -> None:
        \"\"\"The command's help text.\"\"\"

    app.command("e2e")(command_of(Args, e2e))

`command_of` gives typer a function whose signature lists the fields as keyword parameters
(typer builds the command line from it), and whose body calls `e2e` with one `Args`: the
options, defaults and help texts are exactly those of a function with the fields as its
parameters, while the Python function takes one object.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["command_of"]

T = TypeVar("T")


def command_of(options: type[T], body: Callable[[T], None]) -> Callable[..., None]:
    """A typer command: one keyword parameter per field of the dataclass `options` (name,
    annotation, default), calling `body(options(**values))`; its name and docstring (the
    command's help) are `body`'s."""
    hints = typing.get_type_hints(options, include_extras=True)
    parameters = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=field.default,
            annotation=hints[field.name],
        )
        for field in dataclasses.fields(options)  # type: ignore[arg-type]
    ]

    def command(**values: Any) -> None:
        body(options(**values))

    command.__name__ = body.__name__
    command.__qualname__ = body.__qualname__
    command.__doc__ = body.__doc__
    command.__module__ = body.__module__
    command.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
    return command

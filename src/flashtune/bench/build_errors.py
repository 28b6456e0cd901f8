"""The two ways building a solution stops short (bench/build.py and the builders it calls):
a build that fails (COMPILE_ERROR, with the compiler's log) and an environment that cannot run
the solution at all (SKIPPED, with the reason)."""

from __future__ import annotations

__all__ = ["BuildError", "MissingRequirement"]

_LOG_LIMIT = 8000


class BuildError(Exception):
    """The solution did not build or import; `log` holds the compiler/import output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log[-_LOG_LIMIT:]


class MissingRequirement(Exception):
    """The solution cannot run in this environment (SKIPPED, not an error)."""

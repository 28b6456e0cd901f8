"""The service's write token: read from a file, or made once and kept in the cache folder.

Never taken from an environment variable: the benchmark's workers start with a copy of the
service's environment (bench/worker.py passes it down, and a sandbox inherits its worker's),
so a token there would be readable by every solution the service evaluates. The default file,
`FLASHTUNE_CACHE_DIR/serve/token`, lies in a folder the sandbox's Landlock rules never allow
(docs/evaluation.md: a root containing FLASHTUNE_CACHE_DIR is left out of the reads).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from flashtune import env

__all__ = ["default_token_file", "load_token", "TokenError"]

_MIN_LENGTH = 16


class TokenError(ValueError):
    """The token file is unusable (empty, too short, readable by others)."""


def default_token_file() -> Path:
    """Where `flashtune serve` keeps the token it made: FLASHTUNE_CACHE_DIR/serve/token."""
    return env.CACHE_DIR.get() / "serve" / "token"


def load_token(path: Path | None = None, create: bool = True) -> tuple[str, Path, bool]:
    """-> (token, its file, whether it was made now). `path`: the file to read (default:
    `default_token_file()`); when it does not exist and `create`, a new random token is
    written there with mode 0600 (atomically: a temporary file, then a rename)."""
    file = (path or default_token_file()).expanduser()
    if file.exists():
        if file.stat().st_mode & 0o077:
            raise TokenError(
                f"{file}: readable by other users (mode {oct(file.stat().st_mode & 0o777)}); "
                "chmod 600 it"
            )
        token = file.read_text(encoding="utf-8").strip()
        if len(token) < _MIN_LENGTH:
            raise TokenError(f"{file}: a token needs at least {_MIN_LENGTH} characters")
        return token, file, False
    if not create:
        raise TokenError(f"{file}: no such token file")
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    temporary = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    os.replace(temporary, file)
    return token, file, True

"""What the tuner tells its user once: a warning or a log line per key (a stale file entry,
an unusable cache path, a shape met during CUDA graph capture), shared by lookup, profiling
and the config store and forgotten by `AutoTuner.clear()`."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

__all__ = ["AutotuneWarning", "Notices"]

logger = logging.getLogger("flashtune.tune")


class AutotuneWarning(UserWarning):
    """A config file that could not be used, or tuning that could not happen."""


class Notices:
    """The keys already said. `warn_once` points its warning about four frames up, past
    the tuner's own frames to the op that called `choose_one`."""

    def __init__(self) -> None:
        self.said: set[Any] = set()

    def warn_once(self, key: Any, message: str) -> None:
        if key in self.said:
            return
        self.said.add(key)
        warnings.warn(message, AutotuneWarning, stacklevel=5)

    def warn_path_once(self, path: Path, message: str, stacklevel: int) -> None:
        # One warning per unusable cache path: loading on entry and saving on exit of the
        # same `autotune()` block fail for the same reason, which is worth saying once.
        key = ("cache-path", str(path.absolute()))
        if key in self.said:
            logger.debug("%s", message)
            return
        self.said.add(key)
        warnings.warn(message, AutotuneWarning, stacklevel=stacklevel + 1)

    def log_once(self, key: Any, message: str, *args: Any) -> None:
        if key in self.said:
            return
        self.said.add(key)
        logger.info(message, *args)

    def clear(self) -> None:
        self.said.clear()

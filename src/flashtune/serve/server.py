"""Running the application under uvicorn: in the foreground (`flashtune serve`) or in a
thread of this process (tests, notebooks, the example script)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

__all__ = ["ServerThread", "free_port", "serve_forever"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _config(app: Any, host: str, port: int, log_level: str) -> uvicorn.Config:
    # One process: the evaluator's queue and tasks live in it (no uvicorn workers), and
    # uvicorn's own signal handling stops it (the lifespan then stops the evaluator, which
    # kills every worker and sandbox it started).
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, workers=1)


def serve_forever(
    app: Any, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"
) -> None:
    """Serve `app` until SIGINT/SIGTERM."""
    uvicorn.Server(_config(app, host, port, log_level)).run()


class ServerThread:
    """`app` served by uvicorn in a daemon thread of this process, on `host:port` (a free
    port by default); `with ServerThread(app) as server: server.url`."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning"
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.server = uvicorn.Server(_config(app, self.host, self.port, log_level))
        # uvicorn leaves signals alone outside the main thread: they stay the program's.
        self.thread = threading.Thread(target=self.server.run, name="flashtune-serve", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"the server on {self.url} stopped while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start in {timeout:g} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

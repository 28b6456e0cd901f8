"""`ServeClient`: the endpoints of `flashtune serve` from Python, over httpx.

    from flashtune.serve.client import ServeClient

    with ServeClient("http://127.0.0.1:8000", token=open(token_file).read().strip()) as client:
        task = client.submit(solution)  # a Solution, or its FlashInfer-Trace JSON as a dict
        done = client.wait(task["task_id"], timeout=600)
        print(done["verdict"], [t["evaluation"]["status"] for t in done["traces"]])

Every method returns the service's JSON; an HTTP error raises `ServeError` with the status
code and the service's `detail`. Importing this module imports httpx alone (not torch).
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:  # the data layer imports torch: a client needs only httpx
    from flashtune.data.models import Solution

__all__ = ["ServeClient", "ServeError", "TERMINAL_STATES"]

TERMINAL_STATES = frozenset({"done", "failed", "cancelled"})


class ServeError(RuntimeError):
    """The service answered with an error status."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


def _solution_json(solution: Solution | dict[str, Any]) -> dict[str, Any]:
    if isinstance(solution, dict):
        return dict(solution)
    return solution.model_dump(mode="json", exclude_none=True)


class ServeClient:
    """A client of one service. `token`: its bearer token (needed for everything but health,
    definitions and workloads); `timeout`: seconds per HTTP request."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )

    # ------------------------------------------------------------------ plumbing
    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ServeError(response.status_code, detail)
        return response.json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServeClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ endpoints
    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def definitions(self, op_type: str | None = None) -> list[dict[str, Any]]:
        params = {"op_type": op_type} if op_type else None
        return self._call("GET", "/definitions", params=params)

    def definition(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/definitions/{name}")

    def workloads(self, definition: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/definitions/{definition}/workloads")

    def submit(self, solution: Solution | dict[str, Any]) -> dict[str, Any]:
        """Queue `solution`; -> its task (state "queued", `task_id`)."""
        return self._call("POST", "/evaluate", json={"solution": _solution_json(solution)})

    def task(self, task_id: str, wait: float = 0.0) -> dict[str, Any]:
        """The task (its traces once done); `wait`: seconds the service may hold the request
        for it to finish (at most 300)."""
        return self._call(
            "GET",
            f"/tasks/{task_id}",
            params={"wait": wait} if wait else None,
            timeout=self._http.timeout.read + wait if self._http.timeout.read else None,
        )

    def tasks(self, state: str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/tasks", params={"state": state} if state else None)

    def cancel(self, task_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/tasks/{task_id}")

    def wait(self, task_id: str, timeout: float = 3600.0, poll: float = 30.0) -> dict[str, Any]:
        """Poll (long polls of `poll` seconds) until the task is finished; -> the task.
        TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            task = self.task(task_id, wait=max(0.0, min(poll, remaining)))
            if task["state"] in TERMINAL_STATES:
                return task
            if time.monotonic() >= deadline:
                raise TimeoutError(f"task {task_id} still {task['state']} after {timeout:g} s")

    def evaluate(
        self, solution: Solution | dict[str, Any], timeout: float = 3600.0
    ) -> dict[str, Any]:
        """Submit and wait: -> the finished task (verdict, traces)."""
        return self.wait(self.submit(solution)["task_id"], timeout=timeout)

    def sanitize(
        self,
        solution: Solution | dict[str, Any],
        workload: str | None = None,
        tools: list[str] | None = None,
    ) -> dict[str, Any]:
        """compute-sanitizer's verdict on one call: "pass", "fail", "unavailable", "error"."""
        body: dict[str, Any] = {"solution": _solution_json(solution), "workload": workload}
        if tools:
            body["tools"] = tools
        return self._call("POST", "/tools/sanitize", json=body, timeout=None)

    def ncu(
        self, solution: Solution | dict[str, Any], workload: str | None = None
    ) -> dict[str, Any]:
        """Nsight Compute's summary of the solution's kernels on one call."""
        body = {"solution": _solution_json(solution), "workload": workload}
        return self._call("POST", "/tools/ncu", json=body, timeout=None)

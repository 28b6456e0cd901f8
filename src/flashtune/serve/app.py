"""The HTTP application of `flashtune serve` (FastAPI): endpoints, the token, the limits.

Read endpoints (health, definitions, workloads) are open: they show what the dataset
already shows to anyone who has it. Everything that submits, reads a submission's results,
cancels or runs a tool needs `Authorization: Bearer <token>` (auth.py): submissions carry an
agent's code and its results. Request bodies above `max_request_bytes` are refused with 413
before they are parsed, a full queue with 429. docs/serve.md lists every endpoint;
docs/serve-openapi.json is the committed copy of `GET /openapi.json`.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from flashtune.data.models import Solution
from flashtune.serve.tasks import Evaluator, ServeTask, SubmissionError, TaskState
from flashtune.serve.tools import ToolRunner

__all__ = ["create_app", "openapi_document", "API_VERSION"]

API_VERSION = "1"
# Long polls are capped so a client cannot hold a server thread for ever.
MAX_WAIT_S = 300.0


class Health(BaseModel):
    status: Literal["ok", "stopped"]
    api_version: str
    devices: list[str]
    tasks: dict[str, int]
    queue_limit: int
    max_request_bytes: int
    batches_run: int


class DefinitionInfo(BaseModel):
    name: str
    op_type: str
    description: str | None = None
    workloads: int
    tags: list[str] = Field(default_factory=list)


class EvaluateRequest(BaseModel):
    solution: Solution = Field(
        description="a Solution in the FlashInfer-Trace format (name, definition, author, "
        "spec, sources)"
    )


class TaskInfo(BaseModel):
    task_id: str
    state: TaskState
    definition: str
    solution: str
    verdict: str | None = Field(
        None, description="PASSED when every trace passed, else the first other status"
    )
    submitted: float
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    traces: list[dict[str, Any]] | None = Field(
        None, description="Traces in the FlashInfer-Trace format (finished tasks)"
    )


class ToolRequest(BaseModel):
    solution: Solution = Field(description="a Solution in the FlashInfer-Trace format")
    workload: str | None = Field(
        None, description="a workload uuid of the solution's definition; default: the smallest"
    )
    tools: list[Literal["memcheck", "racecheck", "initcheck"]] | None = Field(
        None, description="compute-sanitizer tools (sanitize only); default: all three"
    )


def _task_info(task: ServeTask, with_traces: bool) -> TaskInfo:
    return TaskInfo.model_validate(task.summary(with_traces=with_traces))


class _BodyLimit:
    """ASGI middleware: a request body over `limit` bytes gets 413 before any endpoint sees
    it (Content-Length checked first; a chunked body is counted as it arrives)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any) -> None:
        payload = json.dumps(
            {"detail": f"request body over the service's limit of {self.limit} bytes"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def create_app(
    evaluator: Evaluator,
    token: str,
    tools: ToolRunner | None = None,
    max_request_bytes: int = 1 << 20,
    start: bool = True,
) -> FastAPI:
    """The application over `evaluator` (started with the app when `start`, stopped with
    it); `token`: the bearer token of the write endpoints; `tools`: the agent tools
    (default: on the evaluator's first device, sharing its device lock)."""
    from contextlib import asynccontextmanager

    if len(token) < 16:
        raise ValueError("the service's token needs at least 16 characters")
    tools = tools or ToolRunner(evaluator)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        if start:
            evaluator.start()
        yield
        if start:
            evaluator.stop()

    app = FastAPI(
        title="flashtune serve",
        version=API_VERSION,
        description="Evaluate kernel solutions (FlashInfer-Trace JSON) with flashtune's "
        "sandboxed benchmark harness; docs/serve.md.",
        lifespan=lifespan,
    )
    app.add_middleware(_BodyLimit, limit=max_request_bytes)
    bearer = HTTPBearer(auto_error=False, description="the service's token (docs/serve.md)")

    def writer(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        given = credentials.credentials if credentials is not None else ""
        # compare_digest: the comparison takes the same time wherever the strings differ.
        if not secrets.compare_digest(given.encode(), token.encode()):
            raise HTTPException(
                status_code=401,
                detail="a valid bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def refuse(exc: SubmissionError) -> HTTPException:
        return HTTPException(status_code=exc.status, detail=str(exc))

    def known_definition(name: str) -> Any:
        definition = evaluator.definitions().get(name)
        if definition is None:
            raise HTTPException(status_code=404, detail=f"no definition named {name!r}")
        return definition

    @app.get("/health", response_model=Health, tags=["service"])
    def health() -> Health:
        return Health(
            status="ok" if evaluator.alive or not start else "stopped",
            api_version=API_VERSION,
            devices=list(evaluator.settings.devices),
            tasks=evaluator.counts(),
            queue_limit=evaluator.max_queue,
            max_request_bytes=max_request_bytes,
            batches_run=evaluator.batches,
        )

    @app.get("/definitions", response_model=list[DefinitionInfo], tags=["dataset"])
    def list_definitions(
        op_type: str | None = Query(None, description="only definitions of this op_type"),
    ) -> list[DefinitionInfo]:
        out = []
        for name, d in sorted(evaluator.definitions().items()):
            if op_type is not None and d.op_type != op_type:
                continue
            out.append(
                DefinitionInfo(
                    name=name,
                    op_type=d.op_type,
                    description=d.description,
                    workloads=len(evaluator.dataset.workloads_for(name)),
                    tags=list(d.tags or []),
                )
            )
        return out

    @app.get("/definitions/{name}", tags=["dataset"])
    def get_definition(name: str) -> dict[str, Any]:
        """The Definition (FlashInfer-Trace JSON), reference code included."""
        return known_definition(name).model_dump(mode="json", exclude_none=True)

    @app.get("/definitions/{name}/workloads", tags=["dataset"])
    def list_workloads(name: str) -> list[dict[str, Any]]:
        """The definition's workloads (FlashInfer-Trace Workload JSON)."""
        known_definition(name)
        return [
            record.workload.model_dump(mode="json", exclude_none=True)
            for record in evaluator.dataset.workloads_for(name)
        ]

    @app.post(
        "/evaluate",
        status_code=202,
        response_model=TaskInfo,
        response_model_exclude_none=True,
        dependencies=[Depends(writer)],
        tags=["tasks"],
        responses={
            401: {"description": "no or a wrong token"},
            404: {"description": "unknown definition"},
            409: {"description": "the dataset's own solution has this name"},
            413: {"description": "request body over the limit"},
            429: {"description": "the queue is full"},
        },
    )
    def evaluate(request: EvaluateRequest) -> Any:
        """Queue a solution for evaluation; poll GET /tasks/{task_id} for its traces."""
        try:
            task = evaluator.submit(request.solution)
        except SubmissionError as exc:
            raise refuse(exc) from None
        return _task_info(task, with_traces=False)

    @app.get(
        "/tasks",
        response_model=list[TaskInfo],
        response_model_exclude_none=True,
        dependencies=[Depends(writer)],
        tags=["tasks"],
    )
    def list_tasks(
        state: TaskState | None = Query(None, description="only tasks in this state"),
    ) -> Any:
        return [_task_info(t, False) for t in evaluator.tasks_in(state)]

    @app.get(
        "/tasks/{task_id}",
        response_model=TaskInfo,
        response_model_exclude_none=True,
        dependencies=[Depends(writer)],
        tags=["tasks"],
    )
    def get_task(
        task_id: str,
        wait: float = Query(
            0.0, ge=0.0, le=MAX_WAIT_S, description="seconds to wait for the task to finish"
        ),
    ) -> Any:
        """The task, with its traces once it is done (waits up to `wait` seconds for it)."""
        task = evaluator.wait(task_id, wait) if wait > 0 else evaluator.get(task_id)
        if task is None:
            raise HTTPException(status_code=404, detail=f"no task {task_id!r}")
        return _task_info(task, with_traces=task.state == TaskState.DONE)

    @app.delete(
        "/tasks/{task_id}",
        response_model=TaskInfo,
        response_model_exclude_none=True,
        dependencies=[Depends(writer)],
        tags=["tasks"],
    )
    def cancel_task(task_id: str) -> Any:
        """Cancel a queued or running task (a finished one is returned unchanged)."""
        task = evaluator.cancel(task_id)
        if task is None:
            raise HTTPException(status_code=404, detail=f"no task {task_id!r}")
        return _task_info(task, with_traces=False)

    @app.post("/tools/sanitize", dependencies=[Depends(writer)], tags=["tools"])
    def sanitize(request: ToolRequest) -> dict[str, Any]:
        """compute-sanitizer (memcheck, racecheck, initcheck) on one call of the solution,
        in the sandbox: a verdict of "pass", "fail", "unavailable" or "error"."""
        solution = request.solution
        known_definition(solution.definition)
        try:
            report = tools.sanitize(solution, request.workload, request.tools)
        except SubmissionError as exc:
            raise refuse(exc) from None
        return report.to_json()

    @app.post("/tools/ncu", dependencies=[Depends(writer)], tags=["tools"])
    def ncu(request: ToolRequest) -> dict[str, Any]:
        """Nsight Compute summary of the solution's kernels on one call: time, achieved
        DRAM bandwidth and FLOP/s, each against the device's peak."""
        solution = request.solution
        known_definition(solution.definition)
        try:
            report = tools.ncu(solution, request.workload)
        except SubmissionError as exc:
            raise refuse(exc) from None
        return report.to_json()

    @app.exception_handler(SubmissionError)
    async def _submission_error(_: Request, exc: SubmissionError) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content={"detail": str(exc)})

    return app


def openapi_document() -> dict[str, Any]:
    """The service's OpenAPI schema, as `GET /openapi.json` serves it (nothing is started:
    the evaluator is made over the bundled dataset and never runs). docs/serve-openapi.json
    is this, written by `flashtune serve --print-openapi`; tests/serve keeps them equal."""
    import tempfile
    from pathlib import Path

    from flashtune.data.dataset import bundled_root
    from flashtune.serve.tasks import EvaluationSettings

    settings = EvaluationSettings(datasets=[bundled_root()], out=Path(tempfile.gettempdir()))
    app = create_app(Evaluator(settings), token="x" * 16, start=False)
    return app.openapi()

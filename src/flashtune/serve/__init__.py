"""`flashtune serve`: the benchmark evaluator as an HTTP service for kernel-writing agents.

An agent lists a dataset's definitions and workloads, submits a Solution (FlashInfer-Trace
JSON), polls its task and reads back the Traces that `flashtune run`'s own runner and
sandbox produced (docs/serve.md). Modules:

- `queue`: the bounded queue of submissions and the thread that evaluates them in batches
  through `flashtune.bench.runner.run_benchmark` (no web stack needed);
- `app`: the FastAPI application (endpoints, bearer token, request-size limit);
- `server`: running it under uvicorn, in the foreground or in a thread;
- `client`: `ServeClient`, an httpx client of the endpoints;
- `auth`: the write token (a file, never an environment variable a solution could read).

Importing this package imports no web framework: `flashtune.serve.queue` and the agent
tools work without the `serve` extra.
"""

from __future__ import annotations

__all__: list[str] = []

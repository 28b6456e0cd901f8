"""docs/serve-openapi.json is the service's OpenAPI schema as it is now: regenerate it with
`flashtune serve --print-openapi > docs/serve-openapi.json` after changing an endpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from flashtune.serve.app import openapi_document  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "serve-openapi.json"


def test_committed_openapi_schema_is_current() -> None:
    committed = json.loads(DOC.read_text(encoding="utf-8"))
    assert committed == json.loads(json.dumps(openapi_document())), (
        "docs/serve-openapi.json is stale: flashtune serve --print-openapi > "
        "docs/serve-openapi.json"
    )


def test_schema_lists_every_endpoint_and_the_bearer_token() -> None:
    document = openapi_document()
    assert sorted(document["paths"]) == [
        "/definitions",
        "/definitions/{name}",
        "/definitions/{name}/workloads",
        "/evaluate",
        "/health",
        "/tasks",
        "/tasks/{task_id}",
        "/tools/ncu",
        "/tools/sanitize",
    ]
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    evaluate = document["paths"]["/evaluate"]["post"]
    assert {"401", "413", "429"} <= set(evaluate["responses"])
    assert evaluate["security"] == [{"HTTPBearer": []}]
    assert "security" not in document["paths"]["/definitions"]["get"]

"""`flashtune serve` end to end: a real uvicorn server on a free localhost port, the package's
httpx client, honest / wrong / broken / hostile solutions, and the verdicts `flashtune run`
gives on the same dataset. CPU only (the bundled rmsnorm_h4096 at batch 1)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from _serve_helpers import (  # noqa: E402
    BROKEN,
    DEFINITION,
    HONEST,
    WRONG,
    hostile,
    report_of,
    small_dataset,
    solution,
)

from flashtune.bench import isolation  # noqa: E402
from flashtune.cli import app as cli_app  # noqa: E402
from flashtune.data import Dataset  # noqa: E402
from flashtune.serve.app import create_app  # noqa: E402
from flashtune.serve.auth import load_token  # noqa: E402
from flashtune.serve.client import ServeClient, ServeError  # noqa: E402
from flashtune.serve.server import ServerThread  # noqa: E402
from flashtune.serve.tasks import EvaluationSettings, Evaluator  # noqa: E402

REQUEST_LIMIT = 64 * 1024


@dataclass
class Service:
    url: str
    port: int
    token: str
    token_file: Path
    dataset: Path
    out: Path
    evaluator: Evaluator

    def client(self, token: str | None = "") -> ServeClient:
        return ServeClient(self.url, token=self.token if token == "" else token, timeout=120)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("serve")
    dataset = small_dataset(root / "dataset")
    out = root / "out"
    patch = pytest.MonkeyPatch()
    # The token where `flashtune serve` keeps it by default: FLASHTUNE_CACHE_DIR/serve/token.
    patch.setenv("FLASHTUNE_CACHE_DIR", str(root / "cache"))
    token, token_file, made = load_token()
    assert made and token_file.stat().st_mode & 0o777 == 0o600
    settings = EvaluationSettings(datasets=[dataset], out=out, devices=["cpu"], max_workloads=1)
    evaluator = Evaluator(settings, max_queue=100, batch_size=64)
    server = ServerThread(create_app(evaluator, token, max_request_bytes=REQUEST_LIMIT))
    with server:
        yield Service(server.url, server.port, token, token_file, dataset, out, evaluator)
    patch.undo()


def _statuses(traces: list[dict]) -> set[str]:
    return {t["evaluation"]["status"] for t in traces}


def test_health_and_dataset_are_open(service: Service) -> None:
    with service.client(token=None) as client:
        health = client.health()
        assert health["status"] == "ok" and health["devices"] == ["cpu"]
        assert health["max_request_bytes"] == REQUEST_LIMIT
        names = [d["name"] for d in client.definitions()]
        assert names == [DEFINITION]
        assert client.definition(DEFINITION)["op_type"] == "rmsnorm"
        workloads = client.workloads(DEFINITION)
        assert len(workloads) == 1 and workloads[0]["axes"] == {"batch_size": 1}
        with pytest.raises(ServeError) as missing:
            client.workloads("no_such_definition")
        assert missing.value.status == 404


def test_served_openapi_is_the_published_one(service: Service) -> None:
    from flashtune.serve.app import openapi_document

    served = httpx.get(f"{service.url}/openapi.json").json()
    assert served == json.loads(json.dumps(openapi_document()))


def test_writes_and_results_need_the_token(service: Service) -> None:
    honest = solution("agent-auth", HONEST)
    for token in (None, "x" * 43):
        with service.client(token=token) as client:
            with pytest.raises(ServeError) as refused:
                client.submit(honest)
            assert refused.value.status == 401
            with pytest.raises(ServeError) as listing:
                client.tasks()
            assert listing.value.status == 401
    assert service.evaluator.counts()["queued"] == 0


def test_bad_submissions_are_refused(service: Service) -> None:
    with service.client() as client:
        with pytest.raises(ServeError) as unknown:
            client.submit(solution("agent-x", HONEST, definition="gemm_n1_k1"))
        assert (
            unknown.value.status == 404 and "not in the service's dataset" in unknown.value.detail
        )
        with pytest.raises(ServeError) as invalid:
            client.submit({"name": "x"})
        assert invalid.value.status == 422
        # A body over the limit: 413 before it is parsed (the source alone is over it).
        big = solution("agent-big", HONEST + "#" * REQUEST_LIMIT)
        with pytest.raises(ServeError) as too_big:
            client.submit(big)
        assert too_big.value.status == 413

    # Chunked (no Content-Length): counted as it arrives.
    def chunks() -> Iterator[bytes]:
        for _ in range(REQUEST_LIMIT // 1024 + 2):
            yield b" " * 1024

    response = httpx.post(
        f"{service.url}/evaluate",
        content=chunks(),
        headers={"Authorization": f"Bearer {service.token}", "Content-Type": "application/json"},
    )
    assert response.status_code == 413


@pytest.mark.slow
def test_verdicts_match_flashtune_run_and_hostile_gets_nothing(
    service: Service, tmp_path: Path
) -> None:
    submissions = {
        "agent-honest": HONEST,
        "agent-wrong": WRONG,
        "agent-broken": BROKEN,
        "agent-hostile": hostile(
            service.token, service.token_file, service.port, service.dataset, service.out
        ),
    }
    expected = {
        "agent-honest": "PASSED",
        "agent-wrong": "INCORRECT_NUMERICAL",
        "agent-broken": "COMPILE_ERROR",
        "agent-hostile": "RUNTIME_ERROR",
    }
    with service.client() as client:
        ids = {
            name: client.submit(solution(name, body))["task_id"]
            for name, body in submissions.items()
        }
        done = {name: client.wait(task, timeout=300, poll=5) for name, task in ids.items()}
    for name, task in done.items():
        assert task["state"] == "done", (name, task)
        assert task["verdict"] == expected[name], (name, task["traces"])
        assert len(task["traces"]) == 1 and task["traces"][0]["solution"] == name
        assert task["traces"][0]["evaluation"]["environment"]["input_seed"] is not None
    # Every trace is also in the service's out folder, signed as `flashtune run` signs them.
    written = [t for t in Dataset(service.out).traces_for(DEFINITION) if t.solution in expected]
    assert {t.solution for t in written} == set(expected)

    # The same solutions through `flashtune run` on the same dataset: the same verdicts.
    source = Dataset(tmp_path / "solutions")
    source.add_definition(Dataset(service.dataset).definition(DEFINITION))
    for name, body in submissions.items():
        source.add_solution(solution(name, body))
    cli_out = tmp_path / "cli-out"
    result = CliRunner().invoke(
        cli_app,
        [
            "run",
            "-d",
            str(service.dataset),
            "--solutions-from",
            str(tmp_path / "solutions"),
            "--no-bundled-solutions",
            "--devices",
            "cpu",
            "--max-workloads",
            "1",
            "--quiet",
            "--out",
            str(cli_out),
        ],
    )
    assert result.exit_code == 0, result.output
    by_cli = {
        t.solution: t.evaluation.status.value for t in Dataset(cli_out).traces_for(DEFINITION)
    }
    assert by_cli == {name: task["verdict"] for name, task in done.items()}

    # The hostile solution found nothing of the service's.
    trace = done["agent-hostile"]["traces"][0]["evaluation"]
    report = report_of(trace["log"])
    assert report["token_in_environ"] == [], report
    assert report["token_file"].startswith("blocked"), report["token_file"]
    assert service.token not in json.dumps(done["agent-hostile"])
    sandbox = trace["environment"]["sandbox"]
    if not isolation.isolated(sandbox):
        pytest.skip(f"this machine's sandbox lacks layers: {isolation.describe(sandbox)}")
    assert report["connect"].startswith("blocked"), report["connect"]
    assert report["write_dataset"].startswith("blocked"), report["write_dataset"]
    assert report["write_traces"].startswith("blocked"), report["write_traces"]
    assert not (service.dataset / "definitions" / "pwned.json").exists()
    assert not (service.out / "pwned.jsonl").exists()


def test_tools_answer_unavailable_on_the_cpu(service: Service) -> None:
    with service.client() as client:
        sanitized = client.sanitize(solution("agent-tool", HONEST))
        assert sanitized["verdict"] == "unavailable"
        assert "cpu" in sanitized["detail"]
        profiled = client.ncu(solution("agent-tool", HONEST))
        assert profiled["status"] == "unavailable" and profiled["kernels"] == []


@pytest.fixture
def idle_service(tmp_path: Path) -> Iterator[Service]:
    """A service whose evaluator never starts: submissions stay queued."""
    dataset = small_dataset(tmp_path / "dataset")
    settings = EvaluationSettings(datasets=[dataset], out=tmp_path / "out", devices=["cpu"])
    evaluator = Evaluator(settings, max_queue=2)
    token = "t" * 32
    server = ServerThread(create_app(evaluator, token, start=False))
    with server:
        yield Service(server.url, server.port, token, Path(), dataset, tmp_path / "out", evaluator)


def test_full_queue_is_429_and_queued_tasks_cancel(idle_service: Service) -> None:
    with idle_service.client() as client:
        first = client.submit(solution("agent-a", HONEST))
        client.submit(solution("agent-b", HONEST))
        with pytest.raises(ServeError) as full:
            client.submit(solution("agent-c", HONEST))
        assert full.value.status == 429
        assert client.task(first["task_id"])["state"] == "queued"
        cancelled = client.cancel(first["task_id"])
        assert cancelled["state"] == "cancelled"
        assert [t["solution"] for t in client.tasks(state="queued")] == ["agent-b"]
        client.submit(solution("agent-c", HONEST))  # room again
        with pytest.raises(ServeError) as missing:
            client.task("no-such-task")
        assert missing.value.status == 404


def test_run_sanitize_is_refused_without_a_sanitizer(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path / "dataset")
    result = CliRunner().invoke(
        cli_app,
        ["run", "-d", str(dataset), "--devices", "cpu", "--sanitize", "--out", str(tmp_path / "o")],
    )
    assert result.exit_code == 2
    assert "compute-sanitizer is not available" in result.output


def test_tool_sanitize_cli_says_unavailable(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path / "dataset")
    file = tmp_path / "solution.json"
    file.write_text(solution("agent-cli", HONEST).model_dump_json())
    result = CliRunner().invoke(
        cli_app, ["tool", "sanitize", str(file), "-d", str(dataset), "--device", "cpu"]
    )
    assert result.exit_code == 3, result.output
    assert result.output.startswith("unavailable")


@pytest.mark.slow
def test_fifty_concurrent_submissions_none_lost(service: Service) -> None:
    """50 submissions at once from 50 threads (localhost): every one is accepted, reaches a
    terminal state and gets its verdict. A hang is bounded by the client's wait (240 s a
    task), not asserted as a speed: timing claims belong in benchmarks/."""
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            body = HONEST if i % 5 else WRONG
            with service.client() as client:
                task = client.submit(solution(f"agent-load-{i}", body))
                results[i] = client.wait(task["task_id"], timeout=240, poll=10)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(260)
    assert not errors, errors[:3]
    assert sorted(results) == list(range(50))
    for i, task in results.items():
        assert task["state"] == "done", task
        assert task["verdict"] == ("PASSED" if i % 5 else "INCORRECT_NUMERICAL"), task
        assert [t["solution"] for t in task["traces"]] == [f"agent-load-{i}"]

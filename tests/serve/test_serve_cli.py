"""`flashtune serve` as a user starts it: a subprocess on a free port, its token file made on
first start, the open and the guarded endpoints, and a clean stop on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from _serve_helpers import small_dataset
from typer.testing import CliRunner

pytest.importorskip("uvicorn")

from flashtune.cli import app as cli_app  # noqa: E402
from flashtune.serve.server import free_port  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "serve-openapi.json"


def test_flashtune_serve_starts_guards_and_stops(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path / "dataset")
    port = free_port()
    env = {**os.environ, "FLASHTUNE_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "flashtune.cli", "serve", "--devices", "cpu"]
    command += ["--port", str(port), "-d", str(dataset), "--out", str(tmp_path / "out")]
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.communicate()
            try:
                health = httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the service did not answer in 120 s"
                time.sleep(0.3)
        assert health.json()["status"] == "ok"
        token_file = tmp_path / "cache" / "serve" / "token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        assert httpx.get(f"{url}/tasks").status_code == 401
        guarded = httpx.get(f"{url}/tasks", headers={"Authorization": f"Bearer {token}"})
        assert (guarded.status_code, guarded.json()) == (200, [])
        assert [d["name"] for d in httpx.get(f"{url}/definitions").json()] == ["rmsnorm_h4096"]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            _, stderr = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    assert server.returncode in (0, 128 + signal.SIGTERM), stderr
    assert f"token made and written to {token_file}" in stderr.replace("\n", " ")
    assert token not in stderr


def test_print_openapi_is_the_committed_schema() -> None:
    result = CliRunner().invoke(cli_app, ["serve", "--print-openapi"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == json.loads(DOC.read_text(encoding="utf-8"))


def test_the_client_imports_without_torch() -> None:
    # An agent's process talks HTTP: the client must not pull in torch (4 s, gigabytes).
    code = "import sys, flashtune.serve.client; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr

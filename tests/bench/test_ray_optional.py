"""Ray is an optional extra: flashtune imports without it, and `--ray` says how to get it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _bench_helpers import make_dataset
from typer.testing import CliRunner

from flashtune.cli import app


def test_importing_flashtune_and_its_cluster_code_does_not_import_ray():
    code = (
        "import sys, flashtune, flashtune.cli, flashtune.cli.run, flashtune.bench.ray\n"
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_ray_options_without_ray_say_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    root = tmp_path / "ds"
    make_dataset(root, {"a": "def run(x, w):\n    return x * w\n"})
    run = CliRunner().invoke(app, ["run", "--ray", "auto", "-d", str(root), "-o", str(tmp_path)])
    assert run.exit_code == 1
    assert 'pip install "flashtune[ray]"' in run.output
    cache = tmp_path / "cfg.json"
    tune = CliRunner().invoke(
        app, ["tune", "--ops", "rmsnorm", "--ray", "auto", "--cache", str(cache)]
    )
    assert tune.exit_code == 1
    assert 'pip install "flashtune[ray]"' in tune.output
    assert not cache.exists()


def test_a_ray_address_that_does_not_answer_is_an_error_at_once(tmp_path):
    pytest.importorskip("ray", reason='needs the ray extra: pip install "flashtune[ray]"')
    root = tmp_path / "ds"
    make_dataset(root, {"a": "def run(x, w):\n    return x * w\n"})
    for address, why in (("127.0.0.1:1", "no Ray head node answers"), ("nonsense", "host:port")):
        run = CliRunner().invoke(
            app, ["run", "--ray", address, "-d", str(root), "-o", str(tmp_path / "out")]
        )
        assert run.exit_code == 1 and why in run.output, run.output

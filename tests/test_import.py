"""`import flashtune` (and its op modules) works without a GPU and never initializes CUDA."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from flashtune.cli import app


def _run_fresh(code: str) -> str:
    """`code`'s stripped stdout, run in a fresh interpreter (nothing imported yet), which must
    succeed."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_does_not_initialize_cuda() -> None:
    code = (
        "import pkgutil, importlib, torch, flashtune, flashtune.ops as ops\n"
        "for m in pkgutil.walk_packages(ops.__path__, 'flashtune.ops.'):\n"
        "    importlib.import_module(m.name)\n"
        "import flashtune.cli, flashtune.data, flashtune.schema\n"
        "assert not torch.cuda.is_initialized(), 'CUDA was initialized at import'\n"
        "print('ok')\n"
    )
    assert _run_fresh(code).endswith("ok")


def test_import_is_cheap_and_flashinfer_names_load_on_use() -> None:
    """`import flashtune` loads neither torch nor an op; FlashInfer's names and submodules
    load on first use, and `import flashtune as flashinfer` then serves FlashInfer's code."""
    code = (
        "import sys\n"
        "import flashtune as flashinfer\n"
        "heavy = ('torch', 'triton', 'flashtune.ops', 'flashtune.tune', 'flashtune.schema')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(heavy))\n"
        "assert not loaded, loaded\n"
        "assert 'rmsnorm' in dir(flashinfer) and 'decode' in dir(flashinfer)\n"
        "from flashtune.norm import rmsnorm\n"
        "assert flashinfer.rmsnorm is rmsnorm is flashinfer.norm.rmsnorm\n"
        "assert 'flashtune.ops.attention' not in sys.modules\n"
        "w = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper\n"
        "assert w is flashinfer.BatchDecodeWithPagedKVCacheWrapper\n"
        "import torch\n"
        "assert not torch.cuda.is_initialized()\n"
        "print('ok')\n"
    )
    assert _run_fresh(code).endswith("ok")


def test_env_command_lists_every_setting() -> None:
    from flashtune import env

    result = CliRunner().invoke(app, ["env"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in env.SETTINGS:
        assert name in result.output
    assert "torch" in result.output


def test_env_json_reports_source(monkeypatch) -> None:
    import json

    monkeypatch.setenv("FLASHTUNE_LOG_LEVEL", "INFO")
    result = CliRunner().invoke(app, ["env", "--json"])
    payload = json.loads(result.output)
    assert payload["settings"]["FLASHTUNE_LOG_LEVEL"] == {"value": "INFO", "source": "environment"}
    assert payload["settings"]["FLASHTUNE_DATASET"]["source"] == "default"
    assert payload["platform"]["hardware"] in ("cpu",) or payload["platform"]["sm_count"]


def test_invalid_setting_is_reported_not_crashing(monkeypatch) -> None:
    from flashtune import env

    monkeypatch.setenv("FLASHTUNE_CAPTURE", "maybe")
    row = {name: value for name, value, _, _ in env.describe()}
    assert row["FLASHTUNE_CAPTURE"].startswith("<invalid")

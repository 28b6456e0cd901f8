"""The interop tests against FlashInfer-Bench's current source, at the commit
scripts/fetch_flashinfer_bench.py pins: test_flashinfer_bench.py and
test_validation_agreement.py run again in a child process that imports that source before the
installed 0.1.2 (tests/_fib.py: PYTHONPATH, and a stand-in for FlashInfer's GPU-only timer
where FlashInfer is not installed). There the tests of its new validate and baseline-scored
summary run too. Skipped saying why where the source is absent; failed under
FLASHTUNE_REQUIRE_INTEROP=1 (CI places it first: .ci/run)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from _fib import REPO_ROOT, head_environment, head_source, python

_SCRIPT = REPO_ROOT / "scripts" / "fetch_flashinfer_bench.py"
_FILES = ["tests/interop/test_flashinfer_bench.py", "tests/interop/test_validation_agreement.py"]


def _pinned() -> tuple[str, str, str]:
    """(commit, source digest, marker file name) the fetch script pins."""
    spec = importlib.util.spec_from_file_location("fetch_flashinfer_bench", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.COMMIT, module.SOURCE_SHA256, module.MARKER


def test_the_source_is_the_pinned_commit() -> None:
    """A folder left by an older pin would test another FlashInfer-Bench than CI's."""
    root = head_source()
    commit, _, marker = _pinned()
    assert (root / marker).read_text().strip() == commit, (
        f"{root} holds another commit than {commit[:12]}: "
        "python scripts/fetch_flashinfer_bench.py replaces it"
    )


@pytest.mark.slow
def test_interop_tests_pass_on_flashinfer_bench_head() -> None:
    env = {**head_environment(), "FLASHTUNE_REQUIRE_INTEROP": "1"}
    probe = subprocess.run(
        [python(), "-c", "import flashinfer_bench.data as d; print(d.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert Path(probe.stdout.strip()).is_relative_to(head_source())  # not the installed 0.1.2
    run = subprocess.run(
        [python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *_FILES],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=900,
    )
    tail = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert "skipped" not in run.stdout.splitlines()[-1], tail  # its own tests ran, not skipped

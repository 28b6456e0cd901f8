"""FlashInfer-Bench for the interop tests: the installed release (0.1.2) in this process, and
its pinned current source (scripts/fetch_flashinfer_bench.py) in a child process.

Where the package is missing a test skips, saying why, except under
FLASHTUNE_REQUIRE_INTEROP=1 (CI, .ci/run), where it fails: a CI run that silently skipped
every interop test would prove nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Stand-ins for what FlashInfer-Bench's source imports from FlashInfer and needs a GPU for.
STUBS = Path(__file__).resolve().parent / "interop" / "stubs"


def _missing(message: str) -> None:
    from flashtune import env

    if env.REQUIRE_INTEROP.get():
        pytest.fail(f"{message} (FLASHTUNE_REQUIRE_INTEROP is on: CI needs it)", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def import_fib() -> ModuleType:
    """`flashinfer_bench.data` of whichever FlashInfer-Bench is importable here."""
    try:
        return importlib.import_module("flashinfer_bench.data")
    except ImportError as exc:
        _missing(
            f"flashinfer-bench does not import ({exc}); pip install --no-deps "
            "flashinfer-bench==0.1.2 docstring-parser"
        )
        raise  # not reached: _missing skips or fails


def fib_is_head() -> bool:
    """Whether the FlashInfer-Bench imported here is the pinned source (it has `validate`)."""
    return importlib.util.find_spec("flashinfer_bench.data.validate") is not None


def head_source() -> Path:
    """The pinned FlashInfer-Bench source (FLASHTUNE_FIB_HEAD), or skip/fail saying how."""
    from flashtune import env

    path = env.FIB_HEAD.get()
    path = path if path.is_absolute() else (REPO_ROOT / path).resolve()
    if not (path / "flashinfer_bench" / "__init__.py").is_file():
        # A skip even in CI: the source comes from GitHub (or the team's shared folder), which
        # a CI machine may not reach; the released package (PyPI) is what CI must have.
        pytest.skip(
            f"FlashInfer-Bench's pinned source is not at {path} (FLASHTUNE_FIB_HEAD): "
            "python scripts/fetch_flashinfer_bench.py places it (it needs GitHub, or "
            "--from-git CLONE)",
            allow_module_level=True,
        )
    return path


def head_environment() -> dict[str, str]:
    """The environment of a child process that imports FlashInfer-Bench's pinned source
    before the installed release, with FlashInfer's GPU-only timer stood in for where
    FlashInfer itself is not installed."""
    paths = [str(head_source())]
    if importlib.util.find_spec("flashinfer") is None:
        paths.append(str(STUBS))
    inherited = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*paths, *([inherited] if inherited else [])]),
        "PYTHONDONTWRITEBYTECODE": "1",  # nothing written into the pinned source folder
    }


def python() -> str:
    return sys.executable

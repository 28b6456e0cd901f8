"""Rules about what the repository itself may contain."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Packages are fetched by name through pip's configuration, never from a written address.
# (Spelled in pieces so that this file does not match itself.)
REGISTRY_HOSTS = tuple(
    ".".join(parts)
    for parts in (("pypi", "org"), ("files", "pythonhosted", "org"), ("download", "pytorch", "org"))
)


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / line for line in out.splitlines() if line]


def test_no_package_registry_address_in_the_repository():
    offenders = []
    for path in _tracked_files():
        if path.suffix not in (".py", ".sh", ".md", ".toml", ".txt", ".cfg", ".yml", ".yaml"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        offenders += [f"{path.relative_to(ROOT)}: {h}" for h in REGISTRY_HOSTS if h in text]
    assert offenders == []

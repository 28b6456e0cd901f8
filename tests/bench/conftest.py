"""Bench tests build solutions: keep their caches out of the user's ~/.cache."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    # Set in os.environ (not monkeypatch): module-scoped fixtures and spawned workers see it.
    old = os.environ.get("FLASHTUNE_CACHE_DIR")
    os.environ["FLASHTUNE_CACHE_DIR"] = str(tmp_path_factory.mktemp("flashtune-cache"))
    yield
    if old is None:
        os.environ.pop("FLASHTUNE_CACHE_DIR", None)
    else:
        os.environ["FLASHTUNE_CACHE_DIR"] = old

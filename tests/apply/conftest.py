"""Keep solution sources written by apply out of the user's cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _solution_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> None:
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ft-cache"))

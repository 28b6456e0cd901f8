"""What the sub-commands share: where the bundled dataset is."""

from __future__ import annotations

from pathlib import Path

__all__ = ["bundled_dataset"]


def bundled_dataset() -> Path:
    """The dataset shipped inside the package (the default benchmark)."""
    return Path(__file__).resolve().parents[1] / "dataset"
